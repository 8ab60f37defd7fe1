package export

import (
	"os"
	"testing"

	"github.com/cudatrace/cudatrace/internal/browsertest"
)

// TestMain ends the Chromium the page's tests share.
func TestMain(m *testing.M) {
	code := m.Run()
	browsertest.Close()
	os.Exit(code)
}
