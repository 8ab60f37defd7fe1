package agent

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/kube"
	"github.com/cudatrace/cudatrace/kube/kubetest"
	"github.com/cudatrace/cudatrace/procmodel"
)

// TestPodNames: the join of processes to the kubelet's containers by GPU,
// on the agent's own state (called as the reader goroutine would).
func TestPodNames(t *testing.T) {
	const gpu = "nvidia.com/gpu"
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	srv, err := kubetest.Serve(sock,
		kubetest.Pod("ml", "train-0", kubetest.Container("trainer", gpu, "GPU-a")),
		kubetest.Pod("serving", "infer-7", kubetest.Container("server", gpu, "GPU-b")),
		kubetest.Pod("dev", "nb-1", kubetest.Container("jupyter", gpu, "GPU-c::0")),
		kubetest.Pod("dev", "nb-2", kubetest.Container("jupyter", gpu, "GPU-c::1")),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	l := kube.Start(kube.Options{Socket: sock})
	defer l.Close()
	a := New(Options{Pods: l})
	defer a.Close()
	capture := func(pid uint32, ctr, pod string) {
		a.Process(&procmodel.Capture{PID: pid, Comm: "job", Container: ctr, Pod: pod})
	}
	// The driver's view: which GPUs each process uses.
	uses := map[uint32][]string{}
	sample := func() {
		s := &gpustat.Sample{}
		for pid, uuids := range uses {
			for _, u := range uuids {
				s.Processes = append(s.Processes, gpustat.ProcessUsage{PID: pid, UUID: u, Used: 1})
			}
		}
		a.res.NVML = s
	}
	// A list taken after every process so far was seen.
	fresh := func() {
		t.Helper()
		since := time.Now()
		l.Refresh()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if d := l.Devices(); d != nil && d.Taken.After(since) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no list from the fake kubelet in 10s")
			}
		}
	}
	check := func(when string, want map[uint32]kube.Names) {
		t.Helper()
		got := a.podNames(a.pids())
		for pid := range a.procs {
			if got[pid] != want[pid] {
				t.Errorf("%s: pid %d named %+v, want %+v", when, pid, got[pid], want[pid])
			}
		}
	}
	trainer := kube.Names{Namespace: "ml", Pod: "train-0", Container: "trainer"}
	server := kube.Names{Namespace: "serving", Pod: "infer-7", Container: "server"}

	// The lister's first list, taken at its start, must come before the
	// processes are seen: on a loaded machine it could come after them,
	// and the first check would then see names.
	fresh()
	capture(1, "c1", "uid-1") // trainer's, on its GPU
	capture(2, "c1", "uid-1") // the same container, on no GPU
	capture(3, "c3", "uid-3") // server's
	capture(5, "c5", "uid-5") // a notebook's, on a time-sliced GPU
	capture(6, "", "")        // the host's, on trainer's GPU
	uses[1], uses[3], uses[5], uses[6] = []string{"GPU-a"}, []string{"GPU-b"}, []string{"GPU-c"}, []string{"GPU-a"}
	sample()
	check("before any list taken after they were seen", nil)
	// Process 2 asks nothing of the GPUs: it takes its container's names
	// once process 1 has them.
	fresh()
	check("named", map[uint32]kube.Names{1: trainer, 2: trainer, 3: server})

	// Another pod's process on server's GPU (one that sees every GPU):
	// the two pods would carry one name, so neither does, while both run.
	capture(4, "c4", "uid-4")
	uses[4] = []string{"GPU-b"}
	sample()
	fresh()
	check("two pods on one pod's GPU", map[uint32]kube.Names{1: trainer, 2: trainer})
	a.procs[4].exitedAt = time.Now()
	check("once the other pod's process exited", map[uint32]kube.Names{1: trainer, 2: trainer, 3: server})
}
