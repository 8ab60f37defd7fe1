package kube_test

import (
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/kube"
	"github.com/cudatrace/cudatrace/kube/kubetest"
)

const gpu = "nvidia.com/gpu"

// lockedBuffer is an io.Writer the lister's goroutine writes while the
// test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// waitDevices waits for the lister's answer to satisfy ok.
func waitDevices(t *testing.T, l *kube.Lister, ok func(*kube.Devices) bool) *kube.Devices {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if d := l.Devices(); ok(d) {
			return d
		}
	}
	t.Fatalf("the lister's answer never came; last: %v", l.Devices())
	return nil
}

// TestOwner: the fake kubelet lists three pods; a process's GPUs name it
// only when they all belong to one container and to no other.
func TestOwner(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	srv, err := kubetest.Serve(sock,
		kubetest.Pod("ml", "train-0", kubetest.Container("trainer", gpu, "GPU-a", "GPU-b"), kubetest.Container("sidecar", "")),
		kubetest.Pod("serving", "infer-7", kubetest.Container("server", gpu, "GPU-c::0")),
		// Two time-sliced shares of GPU-d in two pods.
		kubetest.Pod("dev", "nb-1", kubetest.Container("jupyter", gpu, "GPU-d::0")),
		kubetest.Pod("dev", "nb-2", kubetest.Container("jupyter", gpu, "GPU-d::1")),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	var log lockedBuffer
	l := kube.Start(kube.Options{Socket: sock, Stderr: &log})
	defer l.Close()
	before := time.Now()
	d := waitDevices(t, l, func(d *kube.Devices) bool { return d != nil })
	if d.Taken.Before(before.Add(-time.Second)) || d.Len() != 4 {
		t.Errorf("answer taken %v (started %v), %d devices, want 4: %v", d.Taken, before, d.Len(), d)
	}
	trainer := kube.Names{Namespace: "ml", Pod: "train-0", Container: "trainer"}
	for _, c := range []struct {
		uuids []string
		want  kube.Names
		ok    bool
	}{
		{[]string{"GPU-a"}, trainer, true},
		{[]string{"GPU-b", "GPU-a"}, trainer, true},
		{[]string{"GPU-c"}, kube.Names{Namespace: "serving", Pod: "infer-7", Container: "server"}, true},
		{[]string{"GPU-a", "GPU-c"}, kube.Names{}, false}, // two containers
		{[]string{"GPU-d"}, kube.Names{}, false},          // shared
		{[]string{"GPU-e"}, kube.Names{}, false},          // allocated to none
		{nil, kube.Names{}, false},
	} {
		got, ok := d.Owner(c.uuids)
		if got != c.want || ok != c.ok {
			t.Errorf("Owner(%q) = %+v, %v; want %+v, %v", c.uuids, got, ok, c.want, c.ok)
		}
	}
	// A change is read at the next Refresh.
	srv.Set(kubetest.Pod("ml", "train-1", kubetest.Container("trainer", gpu, "GPU-a")))
	l.Refresh()
	d = waitDevices(t, l, func(d *kube.Devices) bool { _, ok := d.Owner([]string{"GPU-c"}); return !ok })
	if got, ok := d.Owner([]string{"GPU-a"}); !ok || got.Pod != "train-1" {
		t.Errorf("after the change: Owner(GPU-a) = %+v, %v; want pod train-1", got, ok)
	}
	if log.String() != "" {
		t.Errorf("the lister said %q, want nothing", log.String())
	}
}

// TestAbsent: without a socket, no answer and one line, however many
// reads; a socket that appears later is read.
func TestAbsent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	var log lockedBuffer
	l := kube.Start(kube.Options{Socket: sock, Stderr: &log, Interval: 10 * time.Millisecond})
	defer l.Close()
	time.Sleep(2500 * time.Millisecond) // three reads at least (one a second)
	if d := l.Devices(); d != nil {
		t.Errorf("no socket: devices %v, want none", d)
	}
	want := "cudatrace agent: no kubelet pod-resources socket at " + sock + ": no pod, namespace or container names"
	if n := strings.Count(log.String(), "\n"); n != 1 || !strings.HasPrefix(log.String(), want) {
		t.Errorf("no socket: the lister said %q (%d lines), want one line starting %q", log.String(), n, want)
	}
	srv, err := kubetest.Serve(sock, kubetest.Pod("ml", "train-0", kubetest.Container("trainer", gpu, "GPU-a")))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	l.Refresh()
	d := waitDevices(t, l, func(d *kube.Devices) bool { return d != nil })
	if got, ok := d.Owner([]string{"GPU-a"}); !ok || got.Container != "trainer" {
		t.Errorf("once the socket is there: Owner(GPU-a) = %+v, %v", got, ok)
	}
	if n := strings.Count(log.String(), "\n"); n != 1 {
		t.Errorf("the lister said %q, want its one line only", log.String())
	}
}

// TestNil: a lister that was never started answers nothing and never
// blocks.
func TestNil(t *testing.T) {
	var l *kube.Lister
	l.Refresh()
	l.Close()
	if l.Devices() != nil {
		t.Error("nil lister has devices")
	}
	var d *kube.Devices
	if _, ok := d.Owner([]string{"GPU-a"}); ok {
		t.Error("nil devices name an owner")
	}
}
