package httpapi

import (
	"bytes"
	"fmt"
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
		pid, err := pidParam(r, false)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if !s.heavy.acquire(w, r) {
			return
		}
		defer s.heavy.release()
		// Relative: the page works behind a proxy that serves the agent
		// under a path of its own.
		refresh := "ui/data"
		if pid != 0 {
			refresh += fmt.Sprintf("?pid=%d", pid)
		}
		var buf bytes.Buffer
		if err := s.a.Page(r.Context(), &buf, pid, agent.PageOptions{Data: data, RefreshURL: refresh,
			RefreshSeconds: uiRefreshSeconds}); err != nil {
			fail(w, err)
			return
		}
		if data {
			w.Header().Set("Content-Type", "application/json")
		} else {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Content-Security-Policy", uiPolicy)
		}
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Write(buf.Bytes())
	}
}
