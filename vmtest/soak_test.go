package vmtest

// The soak: a node daemon must stay right for months (issue 37). The agent
// runs as the DaemonSet runs it (root with only CAP_BPF, CAP_PERFMON and
// CAP_SYS_PTRACE) in a QEMU guest whose pid_max is set low, so that PIDs
// wrap every 212 processes, through a churn of 712 processes of another
// user (each costs 0.1 to 1 s of the guest under TCG with today's agent
// beside it, more as PIDs go round: tens of thousands would take hours): dynamically linked programs that never
// touch CUDA (the loader's notification probe sees every one), Python
// programs that never touch CUDA, native CUDA jobs that exit holding
// memory, jobs that exit in the middle of an allocation, workers that
// rename themselves and fork. Then a Python CUDA job starts at the PID of
// a dead native job and a native one at a dead Python program's: their
// ledgers exact, the Python lines named, their identities their own, no
// figure of a dead process under a live PID. Every BPF map keyed by
// process, thread or file holds at most what is alive and a stated bound,
// read with bpftool in the guest and from the agent's own gauges; the
// agent's memory, threads, goroutines and open files stay flat through
// the churn. The figures are in docs/benchmarks.md ("The soak").

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// soakPlan is what the churn runs: so many processes of each kind, conc
// at a time, the agent read samples times on the way.
type soakPlan struct {
	nop, cuda, mid, renamed, py int
	conc, samples               int
}

// The default plan, sized for QEMU's TCG (docs/benchmarks.md has what it
// costs). VMTEST_SOAK=NOP,CUDA,MID,RENAMED,PY replaces the counts.
var defaultSoak = soakPlan{nop: 640, cuda: 24, mid: 24, renamed: 16, py: 8, conc: 4, samples: 12}

// soakChurnLimit bounds the churn in the guest, in seconds: past it the
// churn is killed and the test fails with what was read.
const soakChurnLimit = 600

// soakPidMax is the guest's kernel.pid_max: the floor is 301 (RESERVED_PIDS
// + 1; 8 per CPU is less), and after the first wrap PIDs are handed out
// from 300 up. 512 makes 212 PIDs go round every half minute, while
// leaving a map that keeps the dead's entries room to show it (near the
// floor every PID would be alive or nearly, and no map could hold more
// than the bound).
const soakPidMax = 512

// soakSlack is the bound stated for the BPF maps: a map keyed by process
// holds at most the processes alive and this many more (processes whose
// end is being processed, entries the sweep has not reached yet); one
// keyed by thread, the threads alive and this many more; one keyed by
// file, this many.
const soakSlack = 64

// soakMaps are the BPF maps keyed by process, thread or file, by what
// keys them. A map named here that the guest does not have is skipped (a
// later BPF may merge or rename them); the agent's gauges must cover every
// one it has.
var soakMaps = map[string]string{
	"pids": "process", "seen": "process", "noted": "process", "dl_last": "process", "py_procs": "process",
	"primaries": "process", "py_seen": "process",
	"threads": "thread", "ctx_stacks": "thread",
	"ctx_inflight": "thread", "py_threads": "thread",
	"py_files": "file",
}

func soakPlanFromEnv(t *testing.T) soakPlan {
	p := defaultSoak
	v := os.Getenv("VMTEST_SOAK")
	if v == "" {
		return p
	}
	var n [5]int
	f := strings.Split(v, ",")
	if len(f) != len(n) {
		t.Fatalf("VMTEST_SOAK=%q: want NOP,CUDA,MID,RENAMED,PY", v)
	}
	for i := range f {
		x, err := strconv.Atoi(f[i])
		if err != nil || x < 1 {
			t.Fatalf("VMTEST_SOAK=%q: %q is not a count", v, f[i])
		}
		n[i] = x
	}
	p.nop, p.cuda, p.mid, p.renamed, p.py = n[0], n[1], n[2], n[3], n[4]
	return p
}

// TestSoak boots x86-64's 6.12 with the soak (guest.sh's ct_mode=soak) and
// checks what the guest sent back.
func TestSoak(t *testing.T) {
	needStandIns(t)
	needTracer(t)
	for _, tool := range []string{"qemu-system-x86_64", "busybox", "cpio", "bpftool", "setpriv", "gcc"} {
		requireTool(t, tool)
	}
	k := filepath.Join(kernelDir("amd64", "6.12"), "vmlinuz")
	if _, err := os.Stat(k); err != nil {
		skipOrFail(t, "no x86-64 Linux 6.12 kernel (%v): scripts/deps.sh fetches it", err)
	}
	plan := soakPlanFromEnv(t)
	caps := shippedCaps(t)
	python := pyenvPython(t, guestPython)
	work := t.TempDir()
	if os.Getenv("VMTEST_KEEP") != "" {
		work = filepath.Join(buildDir, "soak") // what the guest sent, kept with the build
	}

	// The churn's programs, at paths the guest has too.
	bin := filepath.Join(buildDir, "soakbin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	src := func(name string) string { return filepath.Join("testdata", name) }
	for _, b := range [][]string{
		{"-O2", "-Wall", "-o", filepath.Join(bin, "soaknop"), src("soaknop.c")},
		{"-O2", "-Wall", "-o", filepath.Join(bin, "soakchurn"), src("soakchurn.c")},
		{"-O0", "-g", "-fno-omit-frame-pointer", "-pthread", "-Wall", "-o", filepath.Join(bin, "soakjob"), src("soakjob.c"),
			"-L" + fakeLibDir, "-lcudart", "-Wl,-rpath," + fakeLibDir},
	} {
		if err := gcc(b...); err != nil {
			t.Fatal(err)
		}
	}
	pyagent, _ := filepath.Abs(src("pyagent.py"))
	soakpy, _ := filepath.Abs(src("soakpy.py"))
	setpriv, _ := exec.LookPath("setpriv")
	initrd, err := buildInitramfs(filepath.Join(work, "initramfs"), python,
		[]string{filepath.Join(bin, "soaknop"), filepath.Join(bin, "soakchurn"), filepath.Join(bin, "soakjob"), pyagent, soakpy, setpriv},
		map[string]string{"SOAKBIN": bin, "PYAGENT": pyagent, "SOAKPY": soakpy, "SETPRIV": setpriv})
	if err != nil {
		t.Fatal(err)
	}
	capSet := "-all"
	for _, c := range caps {
		capSet += ",+" + c
	}
	// mitigations=off: the guest's syscalls and switches without the
	// speculation barriers -cpu max makes it take, which TCG emulates
	// slowly; nothing here is about them.
	cmdline := fmt.Sprintf("mitigations=off ct_mode=soak ct_soak=%d,%d,%d,%d,%d,%d,%d,%d ct_pidmax=%d ct_caps=%s",
		plan.nop, plan.cuda, plan.mid, plan.renamed, plan.py, plan.conc, plan.samples, soakChurnLimit, soakPidMax, capSet)
	out := filepath.Join(work, "guest")
	start := time.Now()
	err = bootKernel("amd64", k, initrd, cmdline, out)
	if err != nil && strings.Contains(tail(filepath.Join(out, "console.log"), 64<<10), "Oops: int3") {
		// The stale-int3 oops of a static branch patched under TCG (see
		// bootKernel and TestKernels): booted once more.
		t.Logf("the guest oopsed on an int3, booting it again: %v", err)
		if rerr := os.RemoveAll(out); rerr != nil {
			t.Fatal(rerr)
		}
		err = bootKernel("amd64", k, initrd, cmdline, out)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the soak's guest ran in %v:\n%s", time.Since(start).Round(time.Second), guestLines(filepath.Join(out, "console.log")))
	checkSoak(t, filepath.Join(out, "results", "soak"), plan, caps, python)
}

// checkSoak checks what the soak's guest wrote in dir.
func checkSoak(t *testing.T, dir string, plan soakPlan, caps []string, python string) {
	read := func(name string) string { return readTrim(t, filepath.Join(dir, name)) }
	if _, err := os.Stat(filepath.Join(dir, "agent.caps")); err != nil {
		t.Fatalf("the agent did not attach in the guest:\n%s", read("agent.stderr"))
	}
	t.Run("capabilities", func(t *testing.T) {
		var want uint64
		for _, c := range caps {
			want |= 1 << capBits[c]
		}
		status := read("agent.caps")
		for _, key := range []string{"CapEff", "CapPrm", "CapBnd"} {
			m := regexp.MustCompile(`(?m)^` + key + `:\s*([0-9a-f]+)$`).FindStringSubmatch(status)
			if m == nil {
				t.Fatalf("no %s in the agent's status:\n%s", key, status)
			}
			if got, _ := strconv.ParseUint(m[1], 16, 64); got != want {
				t.Errorf("the agent's %s is %#x, want %#x (%v)", key, got, want, caps)
			}
		}
	})

	pidMax, _ := strconv.Atoi(read("pid_max"))
	summary := soakSummary(t, read("churn/summary.txt"))
	t.Run("churn", func(t *testing.T) {
		if pidMax != soakPidMax {
			t.Errorf("kernel.pid_max %d, want %d", pidMax, soakPidMax)
		}
		if rc := read("churn.rc"); rc != "0" {
			t.Errorf("the churn exited %s (a job failed):\n%s", rc, read("churn.stderr"))
		}
		for k, n := range map[string]int{"nop": plan.nop, "cuda": plan.cuda, "mid": plan.mid, "renamed": plan.renamed, "py": plan.py} {
			if summary.started[k] != n {
				t.Errorf("%d %s jobs started, want %d", summary.started[k], k, n)
			}
		}
		// Every PID went round several times.
		total := plan.nop + plan.cuda + plan.mid + plan.renamed + plan.py
		if min := total / (2 * (soakPidMax - 300)); summary.wraps < min {
			t.Errorf("PIDs wrapped %d times, want at least %d", summary.wraps, min)
		}
	})

	pids := map[int]string{} // the churn's jobs but the NOP ones, by PID: their last kind
	for _, l := range strings.Split(read("churn/pids.txt"), "\n") {
		if k, p, ok := strings.Cut(l, " "); ok {
			n, _ := strconv.Atoi(p)
			pids[n] = k
		}
	}
	// reused: the job's PID, which the guest asked to be a dead churn
	// job's of kind.
	reused := func(t *testing.T, name, kind string) int {
		f := strings.Fields(read("jobs/" + name + ".pid"))
		if len(f) != 2 {
			t.Fatalf("jobs/%s.pid: %q", name, f)
		}
		want, _ := strconv.Atoi(f[0])
		got, _ := strconv.Atoi(f[1])
		if got != want || pids[got] != kind {
			t.Errorf("the %s job has PID %d, want %d, the last %s job's (the kernel gave another)", name, got, want, kind)
		}
		return got
	}
	pyPID, holdPID := reused(t, "py", "mid"), reused(t, "hold", "py")
	metricsText, err := os.ReadFile(filepath.Join(dir, "metrics.txt"))
	if err != nil {
		t.Fatalf("no /metrics read after the churn: %v", err)
	}
	m := parseMetrics(t, metricsText)
	alive := soakAlive(t, dir)

	t.Run("final jobs", func(t *testing.T) {
		for _, j := range []struct {
			name, comm, rank, marker string
			pid                      int
		}{
			{"py", pyComm(python), "3", "", pyPID},
			{"hold", "hold", "5", "HOLD", holdPID},
		} {
			t.Run(j.name, func(t *testing.T) {
				if rc := read("jobs/" + j.name + ".rc"); rc != "0" {
					t.Errorf("the %s job exited %s:\n%s", j.name, rc, read("jobs/"+j.name+".err"))
				}
				tr := onlyTruth(t, filepath.Join(dir, "jobs", j.name+".held.log"), j.marker)
				if tr.PID != j.pid {
					t.Fatalf("ground truth of PID %d, the job was %d", tr.PID, j.pid)
				}
				pid := strconv.Itoa(j.pid)
				id := []string{"pid", pid, "comm", j.comm, "job_id", "torchrun:soak-final", "rank", j.rank}
				for d, dt := range tr.Devices {
					wantMetric(t, m, dt.Live, "cudatrace_live_bytes", append(id, "gpu", strconv.Itoa(d), "level", "segment")...)
				}
				if got := samplesOf(m, "cudatrace_live_bytes", "pid", pid, "level", "segment"); len(got) != len(tr.Devices) {
					t.Errorf("cudatrace_live_bytes of pid %s on %d devices, want %d: %v", pid, len(got), len(tr.Devices), got)
				}
				wantMetric(t, m, tr.Allocs, "cudatrace_allocations_total", append(id, "level", "segment")...)
				wantMetric(t, m, tr.Frees, "cudatrace_frees_total", append(id, "level", "segment")...)
				wantMetric(t, m, tr.AllocBytes, "cudatrace_allocated_bytes_total", id...)
				wantMetric(t, m, tr.HostLive, "cudatrace_host_live_bytes", id...)
				wantMetric(t, m, tr.Failed, "cudatrace_allocation_failures_total", id...)
			})
		}
		// No series of a process that is not running, under its PID or
		// under one that another process has now.
		wantMetric(t, m, 2, "cudatrace_processes")
		for _, s := range m {
			if p, ok := s.labels["pid"]; ok && p != strconv.Itoa(pyPID) && p != strconv.Itoa(holdPID) {
				t.Errorf("a series of pid %s, neither job's (alive in the guest: %v): %s%v", p, alive.pids[atoi(p)], s.name, s.labels)
			}
		}
		wantMetric(t, m, 0, "cudatrace_lost_events_total")
	})

	t.Run("python lines", func(t *testing.T) {
		script, _ := filepath.Abs(filepath.Join("testdata", "pyagent.py"))
		frame := func(fn, tag string) string {
			return fmt.Sprintf("%s:%d:%s", script, pyLine(t, "pyagent.py", tag), fn)
		}
		const wBytes, aBytes = 3 << 20, 5 << 20
		weights := []string{frame("cuda_malloc", "malloc"), frame("load_weights", "weights"), frame("<module>", "loop")}
		acts := []string{frame("cuda_malloc", "malloc"), frame("alloc_activations", "activations"), frame("<module>", "loop")}
		warmup := []string{frame("cuda_malloc", "malloc"), frame("<module>", "warmup")}
		want := map[string][]int64{ // allocations and bytes live
			strings.Join(weights, "\n"): {2, 2 * wBytes},
			strings.Join(acts, "\n"):    {1, aBytes},
			strings.Join(warmup, "\n"):  {1, 1 << 20},
		}
		p := soakProfile(t, filepath.Join(dir, "py.pb.gz"))
		got := map[string][]int64{}
		for _, s := range p.Sample {
			k := strings.Join(pythonLocations(s, script), "\n")
			got[k] = append(got[k], s.Value[0], s.Value[1])
		}
		for k, w := range want {
			if !slices.Equal(got[k], w) {
				t.Errorf("the Python job's sample with Python frames\n%s\n= %v, want %v (all: %v)", k, got[k], w, got)
			}
		}
		if len(got) != len(want) {
			t.Errorf("the Python job's profile has %d samples, want %d: %v", len(got), len(want), got)
		}
	})
	t.Run("native job's stacks", func(t *testing.T) {
		// At a dead Python program's PID: native frames, none of Python.
		p := soakProfile(t, filepath.Join(dir, "hold.pb.gz"))
		if len(p.Sample) == 0 {
			t.Fatalf("the native job's profile has no sample")
		}
		for _, s := range p.Sample {
			var fns []string
			for _, loc := range s.Location {
				for _, l := range loc.Line {
					fns = append(fns, l.Function.Name)
					if strings.HasSuffix(l.Function.Filename, ".py") {
						t.Errorf("the native job's stack has a Python frame %s:%d:%s", l.Function.Filename, l.Line, l.Function.Name)
					}
				}
			}
			// hold_alloc makes its cudaMalloc calls; main the others.
			if !slices.Contains(fns, "main") || slices.Equal(s.Label["api"], []string{"cudaMalloc"}) && !slices.Contains(fns, "hold_alloc") {
				t.Errorf("the native job's %v stack: %v", s.Label["api"], fns)
			}
		}
	})

	bpfMaps := soakBPFMaps(t, dir)
	bound := func(kind string) int {
		switch kind {
		case "process":
			return alive.procs + soakSlack
		case "file":
			return soakSlack
		}
		return alive.tasks + soakSlack
	}
	t.Run("bpf maps", func(t *testing.T) {
		var lines []string
		for _, name := range slices.Sorted(maps.Keys(bpfMaps)) {
			mp := bpfMaps[name]
			kind, ok := soakMaps[name]
			if !ok {
				continue
			}
			lines = append(lines, fmt.Sprintf("%-12s %-7s %6d of %6d, %d keyed by a PID not alive", name, kind, mp.entries, mp.capacity, mp.dead(alive)))
			if mp.entries > bound(kind) {
				t.Errorf("BPF map %s (keyed by %s) holds %d entries with %d processes and %d threads alive: more than the %d allowed",
					name, kind, mp.entries, alive.procs, alive.tasks, bound(kind))
			}
			if d := mp.dead(alive); d > soakSlack {
				t.Errorf("BPF map %s holds %d entries keyed by PIDs not alive, more than %d", name, d, soakSlack)
			}
		}
		t.Logf("after the churn, %d processes and %d threads alive; bpftool map dump:\n%s", alive.procs, alive.tasks, strings.Join(lines, "\n"))
	})
	t.Run("map gauges", func(t *testing.T) {
		entries := samplesOf(m, "cudatrace_bpf_map_entries")
		if len(entries) == 0 {
			t.Errorf("/metrics has no cudatrace_bpf_map_entries")
		}
		for name, mp := range bpfMaps {
			kind, ok := soakMaps[name]
			if !ok {
				continue
			}
			v, ok := metric(t, m, "cudatrace_bpf_map_entries", "map", name)
			if !ok {
				t.Errorf("cudatrace_bpf_map_entries{map=%q}: missing", name)
			} else if int(v) > bound(kind) {
				t.Errorf("cudatrace_bpf_map_entries{map=%q} = %v, more than the %d allowed", name, v, bound(kind))
			}
			wantMetric(t, m, uint64(mp.capacity), "cudatrace_bpf_map_capacity", "map", name)
		}
		for _, s := range entries {
			if kind, ok := soakMaps[s.labels["map"]]; !ok && int(s.value) > bound("thread") {
				t.Errorf("cudatrace_bpf_map_entries%v = %v, more than the %d allowed", s.labels, s.value, bound("thread"))
			} else if ok && int(s.value) > bound(kind) {
				t.Errorf("cudatrace_bpf_map_entries%v = %v, more than the %d allowed", s.labels, s.value, bound(kind))
			}
		}
		if _, ok := metric(t, m, "cudatrace_process_exits_swept_total"); !ok {
			t.Errorf("cudatrace_process_exits_swept_total: missing")
		}
	})

	t.Run("flat", func(t *testing.T) { checkSoakFlat(t, dir) })
	t.Logf("churn (kind, started, failed, mean ms):\n%s", summary.text)
	if b, err := os.ReadFile(filepath.Join(dir, "base", "summary.txt")); err == nil {
		t.Logf("the same without the agent:\n%s", b)
	}
}

// soakSummary is the churn's summary.txt.
type soakSum struct {
	started map[string]int
	wraps   int
	text    string
}

func soakSummary(t *testing.T, text string) soakSum {
	s := soakSum{started: map[string]int{}, text: text}
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 4:
			s.started[f[0]] = atoi(f[1])
		case len(f) == 2 && f[0] == "wraps":
			s.wraps = atoi(f[1])
		}
	}
	return s
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// soakLiving is what was alive in the guest when its maps were read: the
// user-space processes and threads (the more of the counts before and
// after the read), and every PID.
type soakLiving struct {
	procs, tasks int
	pids         map[int]bool
}

func soakAlive(t *testing.T, dir string) soakLiving {
	a := soakLiving{pids: map[int]bool{}}
	for _, l := range strings.Split(readTrim(t, filepath.Join(dir, "alive.txt")), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 {
			a.procs, a.tasks = max(a.procs, atoi(f[0])), max(a.tasks, atoi(f[1]))
		}
	}
	for _, l := range strings.Fields(readTrim(t, filepath.Join(dir, "alive_pids.txt"))) {
		a.pids[atoi(l)] = true
	}
	if a.procs == 0 || len(a.pids) == 0 {
		t.Fatalf("the guest's alive.txt and alive_pids.txt say nothing is alive")
	}
	return a
}

// soakMap is one BPF map as bpftool showed it in the guest.
type soakMap struct {
	id, capacity, entries int
	keys                  []int // the PIDs its entries are keyed by, where bpftool named them
}

// dead is how many of its entries are keyed by a PID not alive.
func (mp soakMap) dead(a soakLiving) int {
	n := 0
	for _, k := range mp.keys {
		if !a.pids[k] {
			n++
		}
	}
	return n
}

var mapShowRE = regexp.MustCompile(`(?m)^(\d+): (\w+)\s+name (\S+)\s.*\n\s+key \d+B\s+value \d+B\s+max_entries (\d+)`)

// soakBPFMaps reads bpftool's map show and the guest's counts of each
// hash map's entries, by map name.
func soakBPFMaps(t *testing.T, dir string) map[string]soakMap {
	show := readTrim(t, filepath.Join(dir, "maps.txt"))
	counts := map[int]int{}
	for _, l := range strings.Split(readTrim(t, filepath.Join(dir, "map_counts.txt")), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 {
			counts[atoi(f[0])] = atoi(f[1])
		}
	}
	out := map[string]soakMap{}
	for _, mm := range mapShowRE.FindAllStringSubmatch(show, -1) {
		id := atoi(mm[1])
		n, ok := counts[id]
		if !ok {
			continue // not a hash map
		}
		mp := soakMap{id: id, capacity: atoi(mm[4]), entries: n}
		if f, err := os.Open(filepath.Join(dir, "keys", mm[1])); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if k, err := strconv.Atoi(sc.Text()); err == nil {
					mp.keys = append(mp.keys, k)
				}
			}
			f.Close()
		}
		if _, dup := out[mm[3]]; dup {
			t.Errorf("two BPF maps named %s in the guest", mm[3])
		}
		out[mm[3]] = mp
	}
	if len(out) == 0 {
		t.Fatalf("no hash map in the guest's bpftool map show:\n%s", show)
	}
	return out
}

func soakProfile(t *testing.T, path string) *profile.Profile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := profile.ParseData(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return p
}

// pyComm is the comm of a process running python: its file's name, cut
// at 15 bytes as the kernel cuts it.
func pyComm(python string) string {
	c := filepath.Base(python)
	if len(c) > 15 {
		c = c[:15]
	}
	return c
}

// soakSample is the agent read at one point of the churn.
type soakSample struct {
	n, started, ms            int
	rssKB, threads, fds       int
	goroutines, heapKB, procs int
	cpuMS                     int // the agent's CPU time so far
}

// checkSoakFlat: after a warm-up (the first quarter of the samples), the
// agent's resident memory grows by at most a quarter and 16 MiB, its
// threads by at most 4, its goroutines by at most 10 and its open files
// by at most 4, over the rest of the churn.
func checkSoakFlat(t *testing.T, dir string) {
	var samples []soakSample
	for _, l := range strings.Split(readTrim(t, filepath.Join(dir, "churn", "samples.txt")), "\n") {
		f := strings.Fields(l)
		if len(f) < 9 {
			continue
		}
		s := soakSample{n: atoi(f[0]), started: atoi(f[1]), ms: atoi(f[2]), rssKB: atoi(f[3]), threads: atoi(f[4]), fds: atoi(f[5]),
			goroutines: -1, heapKB: -1, procs: atoi(f[6]), cpuMS: atoi(f[8])}
		if b, err := os.ReadFile(filepath.Join(dir, "churn", fmt.Sprintf("metrics-%02d.txt", s.n))); err == nil {
			m := parseMetrics(t, b)
			if v, ok := metric(t, m, "go_goroutines"); ok {
				s.goroutines = int(v)
			}
			if v, ok := metric(t, m, "go_memstats_heap_inuse_bytes"); ok {
				s.heapKB = int(v) >> 10
			}
		}
		samples = append(samples, s)
	}
	if len(samples) < 4 {
		t.Fatalf("%d samples of the agent during the churn, want at least 4", len(samples))
	}
	var table []string
	for _, s := range samples {
		table = append(table, fmt.Sprintf("%3d %6d %7.1fs %6d KiB %3d %5d %5d KiB %3d %7.1fs", s.n, s.started, float64(s.ms)/1000,
			s.rssKB, s.threads, s.goroutines, s.heapKB, s.fds, float64(s.cpuMS)/1000))
	}
	t.Logf("the agent during the churn (sample, jobs started, time, VmRSS, threads, goroutines, heap in use, open files, CPU):\n%s",
		strings.Join(table, "\n"))
	base := samples[len(samples)/4]
	for _, s := range samples[len(samples)/4:] {
		if s.rssKB > base.rssKB*5/4+16<<10 {
			t.Errorf("sample %d: VmRSS %d KiB, more than a quarter and 16 MiB over the %d KiB after the warm-up", s.n, s.rssKB, base.rssKB)
		}
		if s.threads > base.threads+4 {
			t.Errorf("sample %d: %d threads, over the %d after the warm-up and 4", s.n, s.threads, base.threads)
		}
		if s.goroutines < 0 {
			t.Errorf("sample %d: no go_goroutines in /metrics", s.n)
		} else if s.goroutines > base.goroutines+10 {
			t.Errorf("sample %d: %d goroutines, over the %d after the warm-up and 10", s.n, s.goroutines, base.goroutines)
		}
		if s.fds > base.fds+4 {
			t.Errorf("sample %d: %d open files, over the %d after the warm-up and 4", s.n, s.fds, base.fds)
		}
	}
}
