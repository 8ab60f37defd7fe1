package vmtest

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/kube/kubetest"
)

// kubepods makes name, a cgroup for pods' cgroups (podCgroup), and
// removes it when the test ends, after them.
func kubepods(t *testing.T, name string) string {
	t.Helper()
	parent := filepath.Join(cgroupBase(t), name)
	t.Cleanup(func() { removeCgroups(filepath.Join(parent, "burstable"), parent) })
	return parent
}

// podCgroup makes the cgroup of container id in pod uid under parent, as
// the kubelet (cgroupfs driver) and containerd name them, and removes it
// when the test ends (leaf first; a cgroup goes once its processes have
// exited). The caller removes parent.
func podCgroup(t *testing.T, parent, uid, id string) string {
	t.Helper()
	podDir := filepath.Join(parent, "burstable", "pod"+uid)
	dir := filepath.Join(podDir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		skipOrFail(t, "cannot make a cgroup under %s: %v", parent, err)
	}
	t.Cleanup(func() { removeCgroups(dir, podDir) })
	return dir
}

// removeCgroups removes the cgroups dirs, in order, waiting for each to
// empty.
func removeCgroups(dirs ...string) {
	for _, d := range dirs {
		for i := 0; i < 50 && os.Remove(d) != nil; i++ {
			if _, err := os.Stat(d); os.IsNotExist(err) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// moveTo puts pid into the cgroup dir.
func moveTo(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("move pid %d into %s: %v", pid, dir, err)
	}
}

// wantLabels checks the one sample of name with the labels sel, and that
// it carries exactly want's values for want's label names.
func wantLabels(t *testing.T, samples []sample, name string, sel []string, want map[string]string) {
	t.Helper()
	found := samplesOf(samples, name, sel...)
	if len(found) != 1 {
		t.Errorf("%s%v: %d samples, want one", name, sel, len(found))
		return
	}
	for k, v := range want {
		if got := found[0].labels[k]; got != v {
			t.Errorf("%s%v: label %s=%q, want %q (all: %v)", name, sel, k, got, v, found[0].labels)
		}
	}
}

// kubeLabels are a process's container labels: the cgroup's IDs and the
// kubelet's names.
func kubeLabels(id, uid, namespace, pod, ctr string) map[string]string {
	return map[string]string{"container_id": id, "pod_uid": uid, "namespace": namespace, "pod": pod, "container": ctr}
}

// TestAgentKubeNames: jobs in two pods' container cgroups, and one on the
// host, on GPUs the fake kubelet (the real pod-resources API, served on a
// unix socket) allocated: pod train-0's container trainer has GPU 0, pod
// infer-7's server a time-sliced share of GPU 1 (its only one). Before the
// socket exists the jobs carry their cgroup's IDs and no names, and the
// agent says so once; once the kubelet answers, each pod's job carries
// its namespace, pod and container name, exactly, on the traced and the
// driver's metrics and in the profile; the host's job, on pod train-0's
// GPU, carries none.
func TestAgentKubeNames(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx := testContext(t)
	dir := t.TempDir()
	const (
		uidA = "0a5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"
		idA  = "aaaa1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
		uidB = "0b5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"
		idB  = "bbbb1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
	)
	parent := kubepods(t, "kubepods-cudatrace-kube")
	cgA, cgB := podCgroup(t, parent, uidA, idA), podCgroup(t, parent, uidB, idB)

	sock := filepath.Join(dir, "pod-resources", "kubelet.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	procs := filepath.Join(dir, "nvml-procs")
	ag := startAgentEnv(t, ctx, []string{"LD_LIBRARY_PATH=" + fakeNVMLDir, "FAKENVML_PROCS=" + procs},
		"--lib", fakeLib, "--dump-dir", "", "--pod-resources-socket", sock)
	nvmlSays := func(lines ...string) {
		t.Helper()
		if err := os.WriteFile(procs, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// No kubelet yet.
	jA := startJob(t, ctx, filepath.Join(dir, "a.log"))
	moveTo(t, cgA, jA.pid)
	jA.do(t, "ok", "weights %d 0", 4096)
	nvmlSays(fmt.Sprintf("%d 0 %d", jA.pid, 4096+(300<<20)))
	a := strconv.Itoa(jA.pid)
	m := waitMetrics(t, ag, "cudatrace_nvml_process_used_bytes", "pid", a)
	wantLabels(t, m, "cudatrace_live_bytes", []string{"pid", a, "gpu", "0", "level", "segment"}, kubeLabels(idA, uidA, "", "", ""))
	absent := "cudatrace agent: no kubelet pod-resources socket at " + sock + ": no pod, namespace or container names"
	if n := strings.Count(ag.stderr.String(), absent); n != 1 {
		t.Errorf("without the socket the agent said %d times %q, want once", n, absent)
	}

	// The kubelet answers.
	const gpu = "nvidia.com/gpu"
	srv, err := kubetest.Serve(sock,
		kubetest.Pod("ml", "train-0", kubetest.Container("trainer", gpu, "GPU-fake-0"), kubetest.Container("logger", "")),
		kubetest.Pod("serving", "infer-7", kubetest.Container("server", gpu, "GPU-fake-1::0")),
		kubetest.Pod("kube-system", "dns-1", kubetest.Container("coredns", "")),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	jB := startJob(t, ctx, filepath.Join(dir, "b.log"))
	moveTo(t, cgB, jB.pid)
	jB.do(t, "ok", "weights %d 1", 8192)
	jH := startJob(t, ctx, filepath.Join(dir, "h.log"))
	jH.do(t, "ok", "weights %d 0", 2048)
	b, h := strconv.Itoa(jB.pid), strconv.Itoa(jH.pid)
	nvmlSays(fmt.Sprintf("%d 0 %d", jA.pid, 4096+(300<<20)), fmt.Sprintf("%d 1 %d", jB.pid, 8192+(300<<20)),
		fmt.Sprintf("%d 0 %d", jH.pid, 2048+(300<<20)))
	waitMetrics(t, ag, "cudatrace_live_bytes", "pid", b, "pod", "infer-7")
	waitMetrics(t, ag, "cudatrace_live_bytes", "pid", a, "pod", "train-0")
	waitMetrics(t, ag, "cudatrace_nvml_process_used_bytes", "pid", h)
	// A list the kubelet answered after the agent saw the host's job (on
	// its timer: the host's job asks for none), so that the host's job
	// could have been named from it.
	lists := srv.Lists()
	for deadline := time.Now().Add(15 * time.Second); srv.Lists() == lists; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent asked the kubelet nothing in 15s after %d lists", lists)
		}
	}
	time.Sleep(500 * time.Millisecond)
	m = parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))

	trainer := kubeLabels(idA, uidA, "ml", "train-0", "trainer")
	server := kubeLabels(idB, uidB, "serving", "infer-7", "server")
	host := kubeLabels("", "", "", "", "")
	wantLabels(t, m, "cudatrace_live_bytes", []string{"pid", a, "gpu", "0", "level", "segment"}, trainer)
	wantLabels(t, m, "cudatrace_allocations_total", []string{"pid", a, "level", "segment"}, trainer)
	wantLabels(t, m, "cudatrace_nvml_process_used_bytes", []string{"pid", a}, trainer)
	wantLabels(t, m, "cudatrace_live_bytes", []string{"pid", b, "gpu", "1", "level", "segment"}, server)
	wantLabels(t, m, "cudatrace_nvml_process_used_bytes", []string{"pid", b}, server)
	wantLabels(t, m, "cudatrace_live_bytes", []string{"pid", h, "gpu", "0", "level", "segment"}, host)
	wantLabels(t, m, "cudatrace_nvml_process_used_bytes", []string{"pid", h}, host)
	wantMetric(t, m, 4096, "cudatrace_live_bytes", "pid", a, "gpu", "0", "level", "segment", "pod", "train-0")
	wantMetric(t, m, 8192, "cudatrace_live_bytes", "pid", b, "gpu", "1", "level", "segment", "pod", "infer-7")

	p := fetchProfile(t, ctx, fmt.Sprintf("%s/debug/pprof/cuda_memory?pid=%d", ag.url, jB.pid))
	for k, v := range server {
		if len(p.Sample) != 1 || strings.Join(p.Sample[0].Label[k], ",") != v {
			t.Errorf("profile of pid %d: label %s=%v, want %q (samples %v)", jB.pid, k, p.Sample[0].Label[k], v, p.Sample)
		}
	}
	var said []string
	for _, l := range strings.Split(ag.stderr.String(), "\n") {
		if strings.Contains(l, "pod-resources") {
			said = append(said, l)
		}
	}
	if len(said) != 1 || !strings.HasPrefix(said[0], absent) {
		t.Errorf("the agent's lines on pod-resources: %q, want one: the socket's absence", said)
	}
	for _, j := range []*job{jA, jB, jH} {
		j.end(t)
	}
	ag.stop(t)
}

// waitMetrics scrapes the agent until a sample of name with labels is
// there (within 20 s), and returns that scrape.
func waitMetrics(t *testing.T, ag *runningAgent, name string, labels ...string) []sample {
	t.Helper()
	ctx := testContext(t)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
		if _, ok := metric(t, m, name, labels...); ok {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s%v within 20s", name, labels)
		}
	}
}
