package httpapi

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/cudatrace/cudatrace/agent"
)

// uiRefreshSeconds is how often /ui fetches its data again.
var uiRefreshSeconds = 5

// uiPolicy is what the page may do: run its own inline script and style,
// and fetch its data from the agent; nothing else, anywhere.
const uiPolicy = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"

// ui serves /ui and /ui/data (data): the memory page of the node, or of
// ?pid=N, and its data, which the page fetches again every
// uiRefreshSeconds. It is built in memory, as the profiles are.
func (s *server) ui(data bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		build := func(ctx context.Context, w io.Writer, pid uint32) error {
			// Relative: the page works behind a proxy that serves the
			// agent under a path of its own.
			refresh := "ui/data"
			if pid != 0 {
				refresh += fmt.Sprintf("?pid=%d", pid)
			}
			return s.a.Page(ctx, w, pid, agent.PageOptions{Data: data, RefreshURL: refresh, RefreshSeconds: uiRefreshSeconds})
		}
		s.serveBuilt(w, r, false, build, func(h http.Header, _ uint32) {
			if data {
				h.Set("Content-Type", "application/json")
			} else {
				h.Set("Content-Type", "text/html; charset=utf-8")
				h.Set("Content-Security-Policy", uiPolicy)
			}
			h.Set("Cache-Control", "no-store")
			h.Set("X-Content-Type-Options", "nosniff")
		})
	}
}
