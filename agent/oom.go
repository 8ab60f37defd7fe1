package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/export"
	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/kube"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/report"
	"golang.org/x/sys/unix"
)

// oomStacks is how many of the live set's stacks an OOM report lists.
const oomStacks = 10

// oomDump is what the OOM black box writes of one failure, copied on the
// reader goroutine at the moment the allocation failed.
type oomDump struct {
	time    time.Time
	pid     uint32
	proc    report.Process // its account at the failure
	failure ledger.Failure
	ctx     report.FailureContext
	segs    []*ledger.Allocation
	maps    []*ledger.Mapping // VMM: where its cuMemCreate memory is
	tensors []*ledger.Allocation
	level   bool // tensor events
	src     *liveStacks
	// free is the device's free memory at the driver's latest sample
	// before the failure (NVML, at most a second old); nil without one.
	free *uint64
	// history is the process's latest events, the failure the last
	// (the flight recorder's; empty when it is off).
	history []export.HistoryItem
	// names are the kubelet's names of its container, when known.
	names kube.Names
	first *procmodel.Capture // its first capture (its job and rank); nil if none
	// The node then: every other running traced process (oom_node.go),
	// and the node's traced memory by device.
	node     []nodeProc
	nodeDevs []OOMNodeDevice
}

// OOMReport is the JSON file of the OOM black box: the failed call and
// what its process held when it failed.
type OOMReport struct {
	Time      string   `json:"time"` // RFC 3339, when the call failed
	PID       uint32   `json:"pid"`
	Comm      string   `json:"comm"`
	Cmdline   []string `json:"cmdline,omitempty"`
	Container string   `json:"container,omitempty"`
	PodUID    string   `json:"pod_uid,omitempty"`
	// The kubelet's names of its container, when the agent had them.
	Namespace     string         `json:"namespace,omitempty"`
	Pod           string         `json:"pod,omitempty"`
	ContainerName string         `json:"container_name,omitempty"`
	Failure       report.Failure `json:"failure"` // live_stacks: the device's live set by stack, most bytes first
	Process       report.Process `json:"process"` // its account at the failure
	// History says what of the process's latest events the memviz file's
	// device_traces hold (the flight recorder's), the failure the last.
	History OOMHistory `json:"history"`
	// Node is what every other traced process on the node held at that
	// moment, by device, with its job and rank, and the live sets of the
	// same job's ranks.
	Node  *OOMNode `json:"node"`
	Files OOMFiles `json:"files"`
}

// OOMHistory is the span of events an OOM dump carries.
type OOMHistory struct {
	Events int    `json:"events"`          // the process's latest events, up to the failure
	Since  string `json:"since,omitempty"` // RFC 3339, when the first of them returned
}

// OOMFiles names the dump's files, in the same directory.
type OOMFiles struct {
	Memviz string `json:"memviz"` // PyTorch memory snapshot (pickle)
	Pprof  string `json:"pprof"`  // heap profile of the live set (inuse_*)
	Report string `json:"report"` // this file
}

// oom queues the black box of a failed allocation, rate-limited per process.
func (a *Agent) oom(ev *events.Event, ch ledger.Change, ps *procState) {
	if a.opts.DumpDir == "" {
		return
	}
	now := time.Now()
	if !ps.lastDump.IsZero() && now.Sub(ps.lastDump) < a.opts.DumpEvery {
		a.totals.DumpsSkipped++
		return
	}
	ps.lastDump = now
	p := ch.Process
	d := &oomDump{time: a.wall(ev.End()), pid: p.PID, proc: report.NewProcess(p, a.wall),
		failure: ledger.Failure{Time: ev.End(), TID: ev.TID, API: ev.API, Size: ev.Size, Device: ev.Device,
			Result: ev.Result, Stack: ch.Stack},
		ctx:  report.ContextOf(p, ev.Device, oomStacks),
		segs: p.LiveAllocations(), maps: p.Mappings(), tensors: p.LiveTensors(), level: p.TensorAllocs > 0}
	d.proc.Container, d.proc.PodUID = ps.container.ID, ps.container.PodUID
	names := a.podNames(a.pids())
	d.names = names[p.PID]
	d.free = nvmlFree(a.res.NVML, ev.Device)
	if c := a.model.Get(p.PID); c != nil && c.First != nil {
		d.proc.Cmdline = c.First.Cmdline
		d.proc.Identify(c.First)
		d.first = c.First
	}
	d.history = a.hist.list(p.PID)
	d.src = a.stacksFor(ch.Stack)
	for _, al := range d.segs {
		d.src.add(a, al.Stack)
	}
	for _, al := range d.tensors {
		d.src.add(a, al.Stack)
	}
	d.src.addHistory(a, d.history)
	a.oomNode(p.PID, d.first, ev.Device, names, d)
	select {
	case a.dumps <- d:
	default:
		a.totals.DumpsSkipped++ // the writer is behind: never block the reader
	}
}

// dumpLoop writes the queued dumps; it ends when Close closes the queue.
func (a *Agent) dumpLoop() {
	defer close(a.dumper)
	for d := range a.dumps {
		err := a.writeDump(d)
		// The counters belong to the reader goroutine.
		a.post(func() {
			if err != nil {
				a.totals.DumpErrors++
			} else {
				a.totals.Dumps++
			}
		})
		if err != nil {
			a.warn("OOM dump of pid %d: %v", d.pid, err)
		}
	}
}

// post queues f for the reader goroutine without waiting; it is dropped
// once the agent stopped.
func (a *Agent) post(f func()) {
	select {
	case a.reqs <- request{f: f, done: make(chan struct{}), at: time.Now()}:
	case <-a.stopped:
	}
}

// writeDump writes the three files of one OOM, each 0600: they hold stacks
// and command lines.
func (a *Agent) writeDump(d *oomDump) error {
	if err := os.MkdirAll(a.opts.DumpDir, 0o700); err != nil {
		return fmt.Errorf("create --dump-dir: %w", err)
	}
	base := d.base()
	files := OOMFiles{Memviz: base + ".pickle", Pprof: base + ".pb.gz", Report: base + ".json"}

	var snapBuf bytes.Buffer
	trace := export.HistoryEntries(d.history, d.segs, d.maps, d.tensors, d.level, a.wall)
	if len(d.history) == 0 && d.failure.Device >= 0 { // the flight recorder is off
		trace = []export.LiveEntry{{Action: export.MemvizOOM, Size: d.failure.Size, Device: d.failure.Device,
			Stack: d.failure.Stack, TimeUS: d.time.UnixMicro(), DeviceFree: d.free}}
	}
	snap, err := export.LiveSnapshot(d.segs, d.maps, d.tensors, d.level, trace, d.src)
	if err == nil {
		err = export.WriteMemviz(&snapBuf, snap)
	}
	if err != nil {
		return fmt.Errorf("memviz: %w", err)
	}

	lp := &export.LiveProfile{Samples: export.Samples{}, Comm: map[uint32]string{d.pid: d.proc.Comm},
		Labels: map[uint32]map[string]string{d.pid: d.labels()},
		Time:   d.time,
		Comment: fmt.Sprintf("cudatrace agent: GPU memory of pid %d live when %s of %d bytes failed (%s)",
			d.pid, d.failure.API, d.failure.Size, d.failure.API.ResultName(d.failure.Result))}
	lp.Samples.AddLive(d.segs, d.tensors)
	var profBuf bytes.Buffer
	if err := export.WriteLivePprof(&profBuf, lp, d.src); err != nil {
		return err
	}

	rep := a.oomReport(d, files)
	repBuf, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{files.Memviz, snapBuf.Bytes()}, {files.Pprof, profBuf.Bytes()}, {files.Report, append(repBuf, '\n')}} {
		if err := writeFile0600(filepath.Join(a.opts.DumpDir, f.name), f.data); err != nil {
			return err
		}
	}
	fmt.Fprintf(a.opts.Stderr, "cudatrace agent: pid %d (%s): %s of %d bytes failed with %s; dumped %s\n",
		d.pid, d.who(), d.failure.API, d.failure.Size, d.failure.API.ResultName(d.failure.Result),
		filepath.Join(a.opts.DumpDir, files.Report))
	return nil
}

func (a *Agent) oomReport(d *oomDump, files OOMFiles) *OOMReport {
	frames := func(st *ledger.Stack) []report.Frame { return report.Frames(d.src.Frames(st)) }
	p := &d.proc
	r := &OOMReport{Time: d.time.Format(time.RFC3339Nano), PID: d.pid, Comm: p.Comm, Cmdline: p.Cmdline,
		Container: p.Container, PodUID: p.PodUID, Files: files,
		Namespace: d.names.Namespace, Pod: d.names.Pod, ContainerName: d.names.Container,
		Failure: report.NewFailure(d.pid, &d.failure, &d.ctx, a.wall, frames), Process: *p,
		History: OOMHistory{Events: len(d.history)}, Node: d.nodeReport()}
	if len(d.history) > 0 {
		r.History.Since = a.wall(d.history[0].End).Format(time.RFC3339Nano)
	}
	return r
}

// writeFile0600 creates path with mode 0600 whatever the umask, whole:
// the data goes to a hidden file of its own in the same directory first
// and is then linked in under path in one step, so that whoever watches
// the dump directory (a sidecar shipping dumps, a test) never reads a
// dump cut short. It never follows or overwrites an existing file: the
// temporary is created with O_EXCL, and the final name is taken with
// renameat2(RENAME_NOREPLACE), or where the file system has no such
// rename, a hard link; either fails where path exists.
func writeFile0600(path string, data []byte) error {
	dir, name := filepath.Split(path)
	tmp := filepath.Join(dir, "."+name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = publishNoReplace(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// publishNoReplace gives file tmp the name path, which must not exist.
func publishNoReplace(tmp, path string) error {
	err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	return os.Remove(tmp)
}

// nvmlFree is dev's free memory in the driver's sample s (NVML's index
// taken as the CUDA ordinal; with one GPU they agree); nil without it:
// nothing else the agent sees says how large the device is.
func nvmlFree(s *gpustat.Sample, dev int32) *uint64 {
	if s == nil {
		return nil
	}
	for _, d := range s.Devices {
		if len(s.Devices) == 1 || d.Index == int(dev) {
			free := d.Free
			return &free
		}
	}
	return nil
}
