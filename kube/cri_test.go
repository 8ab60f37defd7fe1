package kube

import (
	"bytes"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/kube/kubetest"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// waitNames asks until the resolver names id (or 5 s pass).
func waitNames(c *CRI, id string) (Pod, bool) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if p, ok := c.Names(id); ok {
			return p, true
		}
	}
	return Pod{}, false
}

func TestCRI(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "crio.sock")
	var log syncBuf
	c := StartCRI(CRIOptions{Socket: sock, Stderr: &log, Retry: 50 * time.Millisecond})
	defer c.Close()
	// No runtime: nothing named, one line.
	if _, ok := c.Names("c1"); ok {
		t.Fatal("named without a runtime")
	}
	time.Sleep(200 * time.Millisecond)
	c.Names("c1")
	time.Sleep(200 * time.Millisecond)
	if n := strings.Count(log.String(), "no container runtime (CRI) socket"); n != 1 {
		t.Errorf("said %d times that the runtime is absent: %q", n, log.String())
	}

	rt, err := kubetest.ServeRuntime(sock,
		kubetest.RuntimeContainer{ID: "c1", Name: "trainer", Namespace: "ml", Pod: "train-0", PodUID: "u1"},
		kubetest.RuntimeContainer{ID: "c2", Name: "server", Namespace: "serving", Pod: "infer-7", PodUID: "u2", SandboxOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Stop()
	if p, ok := waitNames(c, "c1"); !ok || p != (Pod{Names{"ml", "train-0", "trainer"}, "u1"}) {
		t.Errorf("c1: %+v %v", p, ok)
	}
	// The pod's names on its sandbox alone.
	if p, ok := waitNames(c, "c2"); !ok || p != (Pod{Names{"serving", "infer-7", "server"}, "u2"}) {
		t.Errorf("c2: %+v %v", p, ok)
	}
	// A container the runtime does not know (docker without the CRI):
	// unnamed, and nothing said.
	if p, ok := waitNames(c, "c3"); ok {
		t.Errorf("c3 named %+v", p)
	}
	// Named once, asked no more.
	calls := rt.Calls()
	for range 100 {
		c.Names("c1")
	}
	if rt.Calls() != calls {
		t.Errorf("%d calls for names already known", rt.Calls()-calls)
	}
	if strings.Contains(log.String(), "warning") {
		t.Errorf("said: %q", log.String())
	}
}
