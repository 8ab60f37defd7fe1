package hint

import (
	"errors"
	"fmt"
	"testing"
)

func TestWrapSurvivesWrapping(t *testing.T) {
	base := errors.New("boom")
	err := fmt.Errorf("record: %w", Wrap(base, "run as root"))
	if Of(err) != "run as root" || !errors.Is(err, base) || err.Error() != "record: boom" {
		t.Fatalf("hint %q err %q", Of(err), err)
	}
	if Wrap(nil, "x") != nil || Of(base) != "" {
		t.Fatal("nil or plain error")
	}
}
