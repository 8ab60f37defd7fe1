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

	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cudatrace/cudatrace/kube/kubetest"
)

// criCgroup makes a cgroup at path (below the hierarchy's root), as a
// container runtime and the kubelet name one, and removes it and its new
// parents when the test ends.
func criCgroup(t *testing.T, path string) string {
	t.Helper()
	base := cgroupBase(t)
	dir := filepath.Join(base, path)
	var made []string
	for d := dir; d != base; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		made = append(made, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		skipOrFail(t, "cannot make cgroup %s: %v", dir, err)
	}
	t.Cleanup(func() { removeCgroups(made...) })
	return dir
}

// TestAgentCRINames: processes in pods' containers, their cgroups named as
// containerd, CRI-O and Docker (cri-dockerd) name them under both cgroup
// drivers, are each named by their own container, over the CRI of a
// stand-in container runtime (k8s.io/cri-api's service on a unix socket),
// whatever their GPU: two pods on one time-sliced GPU, an MPS client (the
// driver lists only the MPS server), a MIG instance and a GPU the device
// plugin names by index, where the kubelet's pod-resources cannot tell
// them apart. A host process on a pod's GPU stays unnamed. Before the
// runtime answers, and for a container started while it does not, the
// processes carry no names (one line says why), never wrong ones.
func TestAgentCRINames(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx := testContext(t)
	dir := t.TempDir()
	uid := func(n int) string { return fmt.Sprintf("%08x-1111-4222-8333-%012x", 0xc0de0000+n, n) }
	id := func(n int) string { return fmt.Sprintf("%064x", 0xfeed0000+n) }
	us := func(u string) string { return strings.ReplaceAll(u, "-", "_") }
	type pod struct {
		ns, name, ctr string
		cgroup        string
		nvml          string // the driver's line: "<device> <bytes>", "" for none (an MPS client)
		sandboxOnly   bool
		devices       []string // the kubelet's device IDs
	}
	pods := []pod{
		// containerd, systemd driver: time-sliced GPU 0, one share of two
		{"ml", "train-a", "trainer", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + us(uid(1)) + ".slice/cri-containerd-" + id(1) + ".scope",
			"0", false, []string{"GPU-fake-0::0"}},
		// CRI-O, systemd driver: the other share of GPU 0
		{"ml", "train-b", "trainer", "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + us(uid(2)) + ".slice/crio-" + id(2) + ".scope",
			"0", false, []string{"GPU-fake-0::1"}},
		// Docker (cri-dockerd), cgroupfs driver: an MPS client
		{"serving", "infer-0", "server", "kubepods/burstable/pod" + uid(3) + "/" + id(3), "", false, []string{"GPU-fake-1"}},
		// containerd, cgroupfs driver: a MIG instance, its pod's names on
		// the sandbox alone
		{"serving", "infer-1", "server", "kubepods/pod" + uid(4) + "/" + id(4), "1", true, []string{"MIG-1b2c3d4e-0000-5555-6666-777777777777"}},
		// Docker, systemd driver: the device plugin's index names
		{"dev", "nb-0", "jupyter", "kubepods.slice/kubepods-pod" + us(uid(5)) + ".slice/docker-" + id(5) + ".scope", "1", false, []string{"1"}},
	}
	for i := range pods {
		pods[i].cgroup = criCgroup(t, pods[i].cgroup)
	}
	t.Cleanup(func() {
		removeCgroups(filepath.Join(cgroupBase(t), "kubepods.slice", "kubepods-burstable.slice"),
			filepath.Join(cgroupBase(t), "kubepods.slice", "kubepods-besteffort.slice"),
			filepath.Join(cgroupBase(t), "kubepods.slice"), filepath.Join(cgroupBase(t), "kubepods", "burstable"),
			filepath.Join(cgroupBase(t), "kubepods"))
	})
	sock := filepath.Join(dir, "containerd.sock")
	kubelet := filepath.Join(dir, "kubelet.sock")
	procs := filepath.Join(dir, "nvml-procs")
	ag := startAgentEnv(t, ctx, []string{"LD_LIBRARY_PATH=" + fakeNVMLDir, "FAKENVML_PROCS=" + procs},
		"--lib", fakeLib, "--dump-dir", "", "--pod-resources-socket", kubelet, "--cri-socket", sock)

	// The kubelet's allocations, and the driver's view, from the start.
	const gpu = "nvidia.com/gpu"
	var kpods []*podresources.PodResources
	for _, p := range pods {
		kpods = append(kpods, kubetest.Pod(p.ns, p.name, kubetest.Container(p.ctr, gpu, p.devices...)))
	}
	kl, err := kubetest.Serve(kubelet, kpods...)
	if err != nil {
		t.Fatal(err)
	}
	defer kl.Stop()

	jobs := make([]*job, len(pods))
	var nvml []string
	for i, p := range pods {
		jobs[i] = startJob(t, ctx, filepath.Join(dir, fmt.Sprintf("%d.log", i)))
		moveTo(t, p.cgroup, jobs[i].pid)
		jobs[i].do(t, "ok", "weights %d 0", 4096*(i+1))
		if p.nvml != "" {
			nvml = append(nvml, fmt.Sprintf("%d %s %d", jobs[i].pid, p.nvml, 300<<20))
		}
	}
	// The MPS server, which the driver lists for its clients; a host job
	// on GPU 0.
	host := startJob(t, ctx, filepath.Join(dir, "host.log"))
	host.do(t, "ok", "weights %d 0", 2048)
	nvml = append(nvml, fmt.Sprintf("%d 1 %d", os.Getpid(), 500<<20), fmt.Sprintf("%d 0 %d", host.pid, 300<<20))
	if err := os.WriteFile(procs, []byte(strings.Join(nvml, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostLabels := kubeLabels("", "", "", "", "")
	unnamed := func(i int) map[string]string { return kubeLabels(id(i+1), uid(i+1), "", "", "") }

	// No runtime yet: IDs from the cgroups, no names (the kubelet alone
	// cannot tell these pods apart by GPU), one line.
	time.Sleep(2 * time.Second)
	m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
	for i, j := range jobs {
		if i == 2 || i == 4 {
			continue // alone on their GPUs, or the index names: the join by GPU may name them, rightly or not at all
		}
		wantLabels(t, m, "cudatrace_live_bytes", []string{"pid", strconv.Itoa(j.pid), "gpu", "0", "level", "segment"}, unnamed(i))
	}
	absent := "cudatrace agent: no container runtime (CRI) socket at " + sock
	if n := strings.Count(ag.stderr.String(), absent); n != 1 {
		t.Errorf("without the runtime the agent said %d times %q, want once:\n%s", n, absent, ag.stderr.String())
	}

	// The runtime answers: every pod's process is named by its container.
	var ctrs []kubetest.RuntimeContainer
	for i, p := range pods {
		ctrs = append(ctrs, kubetest.RuntimeContainer{ID: id(i + 1), Name: p.ctr, Namespace: p.ns, Pod: p.name, PodUID: uid(i + 1), SandboxOnly: p.sandboxOnly})
	}
	rt, err := kubetest.ServeRuntime(sock, ctrs...)
	if err != nil {
		t.Fatal(err)
	}
	for i, j := range jobs {
		waitMetrics(t, ag, "cudatrace_live_bytes", "pid", strconv.Itoa(j.pid), "pod", pods[i].name)
	}
	m = parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
	for i, j := range jobs {
		p := pods[i]
		want := kubeLabels(id(i+1), uid(i+1), p.ns, p.name, p.ctr)
		wantLabels(t, m, "cudatrace_live_bytes", []string{"pid", strconv.Itoa(j.pid), "gpu", "0", "level", "segment"}, want)
		wantMetric(t, m, uint64(4096*(i+1)), "cudatrace_live_bytes", "pid", strconv.Itoa(j.pid), "gpu", "0", "level", "segment", "pod", p.name)
	}
	wantLabels(t, m, "cudatrace_live_bytes", []string{"pid", strconv.Itoa(host.pid), "gpu", "0", "level", "segment"}, hostLabels)
	// The profile carries them too.
	prof := fetchProfile(t, ctx, fmt.Sprintf("%s/debug/pprof/cuda_memory?pid=%d", ag.url, jobs[3].pid))
	if len(prof.Sample) != 1 || prof.Sample[0].Label["pod"][0] != "infer-1" || prof.Sample[0].Label["namespace"][0] != "serving" {
		t.Errorf("profile of the MIG job: %v", prof.Sample)
	}

	// The runtime goes: a socket that does not answer. A process of a new
	// container stays unnamed; those named keep their names.
	rt.Stop()
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	late := criCgroup(t, "kubepods/burstable/pod"+uid(6)+"/"+id(6))
	jl := startJob(t, ctx, filepath.Join(dir, "late.log"))
	moveTo(t, late, jl.pid)
	jl.do(t, "ok", "weights %d 0", 512)
	time.Sleep(2 * time.Second)
	m = parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
	wantLabels(t, m, "cudatrace_live_bytes", []string{"pid", strconv.Itoa(jl.pid), "gpu", "0", "level", "segment"},
		kubeLabels(id(6), uid(6), "", "", ""))
	wantLabels(t, m, "cudatrace_live_bytes", []string{"pid", strconv.Itoa(jobs[0].pid), "gpu", "0", "level", "segment"},
		kubeLabels(id(1), uid(1), "ml", "train-a", "trainer"))
	var said []string
	for _, l := range strings.Split(ag.stderr.String(), "\n") {
		if strings.Contains(l, "container runtime (CRI)") {
			said = append(said, l)
		}
	}
	if len(said) != 2 {
		t.Errorf("the agent's lines on the runtime: %q, want two: absent, then failing", said)
	}
	for _, j := range append(jobs, host, jl) {
		j.end(t)
	}
	ag.stop(t)
}
