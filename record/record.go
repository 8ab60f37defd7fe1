// Package record runs one tracing session: it finds the libraries, attaches
// the probes, launches or follows the targets, and writes every event to the
// trace file and the ledger until the session ends. docs/architecture.md
// follows an event through it.
package record

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
)

// Options describe a session.
type Options struct {
	Libs     []string      // library files to probe; empty means find them
	PIDs     []int         // running processes to trace
	All      bool          // every process on the host
	Command  []string      // a command to launch and trace
	Duration time.Duration // stop after this long; 0 means until the targets exit or a signal
	Output   string        // trace file; "" keeps only the in-memory ledger
	Tracer   loader.Options
	Version  string
	Stderr   io.Writer // progress and warnings
	// LaunchHelper is argv[0..] of a command that waits for one byte on fd
	// 3, then execs the rest of its arguments: it lets the tracer add the
	// child to the PID filter before the target runs its first instruction.
	LaunchHelper []string
	// Observer, when set, watches the session live (top, agent).
	Observer Observer
	// NVML, when set, opens the driver's view of GPU memory (gpustat.Open),
	// sampled every NVMLEvery (DefaultNVMLEvery when 0) into the trace and
	// Result.NVML, on a goroutine of its own. When it fails, one line on
	// Stderr says why and tracing goes on.
	NVML      func() (gpustat.Source, error)
	NVMLEvery time.Duration
	// KeepStackWindows writes each allocation record's stack window to the
	// trace as captured, for replay to unwind, instead of unwinding it as
	// it comes and keeping only the frames (Tracer.StackWindow sets the
	// window's size).
	KeepStackWindows bool
	// NoPythonFrames leaves CPython processes' Python frames out of their
	// stacks: no interpreter walk at each allocation (docs/benchmarks.md
	// says what it costs).
	NoPythonFrames bool
	// Portable names every process's native frames into the trace while
	// it runs (symbols frames, once per file and address), as is always
	// done for processes in containers, so that report and export name
	// them on a machine without the same files.
	Portable bool
	// NoSymbolize names no frame into the trace, not even a container
	// process's: the trace keeps the addresses and the mappings (with
	// their build IDs), and whoever reads it names them from the files it
	// finds, or shows addresses.
	NoSymbolize bool
	// ReaderStats times the reader's work on each event, by stage, into
	// Result.Reader (record -v): a few clock reads an event.
	ReaderStats bool
	// GCHeadroom lets the garbage collector use up to this many bytes more
	// than Go's default target while recording, to collect less often
	// (gc.go); 0 leaves Go's settings, as do GOGC and GOMEMLIMIT.
	GCHeadroom uint64

	// waiting are the --pid processes with no CUDA library loaded when
	// tracing began (findLibraries): the scan of their mappings attaches
	// what they load later.
	waiting []int
	// searched are the libraries found where a --pid process would look
	// for one it has not loaded (loader.SearchPath): one that is no
	// CUDA library cudatrace understands is left out, not an error.
	searched map[string]bool
}

// Observer watches a session as it happens. Its methods run on the
// reader's goroutine, between records, so they may read the ledger there
// and nowhere else; they must not block, or the ring buffer fills and
// events are lost (counted). An observer that serves another goroutine
// copies what it needs under its own lock.
type Observer interface {
	// Process is called when a traced process is first seen, and again
	// when its mappings are re-read (a library dlopen'ed late): what
	// symbolizing its stacks needs, captured while it is alive.
	Process(c *procmodel.Capture)
	// Python is called when pid is found to run CPython, before its
	// first event with Python facts (events.FlagPython or FlagNoPython),
	// and again with a new table when another process takes the PID.
	// The ledger's stacks of the process (ch.Stack in Event) have its
	// Python frames merged in as synthetic addresses (pystack.IsPython)
	// that t names. The session adds to t on the reader's goroutine, as
	// the events come: read it there (pystack.Table.Names copies).
	Python(pid uint32, t *pystack.Table)
	// Event is called for every event, after the ledger applied it. ev
	// is the record as captured, its Stack native only; ch.Stack is the
	// ledger's, Python frames merged in. ev is valid during the call
	// only: the session reuses it, and its Window (with
	// KeepStackWindows) is the ring buffer's memory. Copy what is kept.
	Event(ev *events.Event, ch ledger.Change)
	// Tick is called at least every Tracer.PollInterval with the session
	// so far: the ledger, and the BPF counters (losses included) as last
	// read, at most once a second.
	Tick(res *Result)
}

// Result is what a finished session holds.
type Result struct {
	Ledger   *ledger.Ledger
	Counters map[string]uint64
	// Lost counts every event the BPF side lost; LostStopping those of
	// them lost after the stop began (probes firing while they were being
	// removed). Lost - LostStopping were lost while tracing: the figures
	// up to the stop miss only those.
	Lost, LostStopping uint64
	// CountersAtStop are the counters as the stop began (nil if they
	// could not be read): the causes of the losses while tracing.
	CountersAtStop map[string]uint64
	// Attached are the libraries attached as tracing started; those
	// attached after (and again, once forgotten: probed.go) are in the
	// trace's attach records, not here, which an agent's months would
	// fill.
	Attached   []loader.AttachResult
	ExitCode   int    // of the launched command: 128 + the signal's number when one killed it
	Signal     string // the signal that killed the launched command ("SIGKILL"), if one did
	Events     uint64
	Output     string
	StopReason string
	// NVML is the latest sample of the driver's view, taken at NVMLTime
	// (boot ns); nil before the first or without Options.NVML. NVMLError
	// says why NVML could not be opened.
	NVML      *gpustat.Sample
	NVMLTime  uint64
	NVMLError string
	// StacksCut counts allocations whose stack was unwound to the end of
	// its stack window and no further: a larger --stack-window reaches
	// deeper.
	StacksCut uint64
	// PythonFrames counts the distinct Python frames (code object and
	// instruction) read in CPython processes; UnresolvedPython those
	// whose code object could not be read (freed before it was): their
	// stacks show "[unresolved Python frame: why]" there.
	PythonFrames, UnresolvedPython uint64
	// PythonNoInterp counts the allocation records whose Python frames
	// were left out: BPF walked them, but their process ended before the
	// reader could read its interpreter, without which they have no names.
	PythonNoInterp uint64
	// PythonUnwalked counts the allocation records of CPython processes
	// without Python frames because BPF did not have the interpreter's
	// layout when they were made: the process allocated before the
	// reader read its interpreter, or ran and ended, in a root of its
	// own gone with it, while the reader was behind.
	PythonUnwalked uint64
	// PythonCaptured counts the code objects BPF captured at their first
	// sight (bpf/pycode.h); PythonRead the frames named from the process's
	// memory instead (a capture that lacked a part, or none).
	PythonCaptured, PythonRead uint64
	// Uncaptured counts the processes gone before their mappings could be
	// read at their first record: their stacks stay addresses.
	Uncaptured uint64
	// ExitsSwept counts the processes whose end came without an exit
	// record (lost to a full ring buffer, or none made: BPF had no room
	// to note them), found by the sweep (life.go), and the BPF map entries
	// of processes gone that the sweep removed.
	ExitsSwept uint64
	// MapsFull counts the reader's own updates of BPF maps kept per
	// process that found them full (loader.ErrMapFull: a Python layout, a
	// --pid target); BPF's own are the map_full counter.
	MapsFull uint64
	// Captured is a process's latest capture (its command line, job,
	// rank, container), nil where none is kept (a process never read, or
	// one --all forgot at its end); for the summary, once Run returned.
	Captured func(pid uint32) *procmodel.Capture `json:"-"`
	// Maps are the BPF maps keyed by process, thread or file, with how
	// many entries each held at the latest count (every few seconds, with
	// an Observer; nil before the first).
	Maps []MapUse
	// Reader is what reading the events cost, with Options.ReaderStats.
	Reader *ReaderStats
	// ReaderRaised: the reader ran ahead of busy threads
	// (loader.Tracer.ReaderRaised); the loss warning's remedy depends on it.
	ReaderRaised bool
}

// Run traces until the session ends. ctx cancellation (SIGINT, SIGTERM)
// ends it cleanly.
func Run(ctx context.Context, opts Options) (*Result, error) {
	if opts.Stderr == nil {
		opts.Stderr = io.Discard
	}
	if err := validate(&opts); err != nil {
		return nil, err
	}
	warning, err := loader.Preflight()
	if err != nil {
		return nil, err
	}
	if warning != "" {
		fmt.Fprintf(opts.Stderr, "cudatrace: warning: %s\n", warning)
	}
	libs, err := findLibraries(&opts)
	if err != nil {
		return nil, err
	}

	sys := findSystem(opts.NoPythonFrames) // while the tracer loads
	topts := opts.Tracer
	topts.FilterPIDs = !opts.All
	topts.FollowForks = true
	// Processes already running may have chosen their devices unseen:
	// learn them from their own calls (see loader.LearnProbes).
	topts.TraceStart = BootNow()
	topts.Learn = len(opts.PIDs) > 0 || opts.All
	topts.Unwind = unwindMode(os.Getenv("CUDATRACE_UNWIND"), unwindCheck, opts.KeepStackWindows, opts.Stderr)
	tr, err := loader.New(topts)
	if err != nil {
		if hint.Of(err) != "" { // the loader's own (a verifier's rejection, memlock)
			return nil, err
		}
		return nil, hint.Wrap(err, "check `dmesg` and that the kernel has BTF and uprobes (CONFIG_UPROBE_EVENTS)")
	}
	defer tr.Close()
	// The interpreters installed here, found while the tracer loaded, are
	// learned while the probes attach (the goroutine, and those putting in
	// their code_dealloc probes, are over before tr closes: defers run
	// last first).
	pyFiles := &pyFileSet{tr: tr}
	learned := pyFiles.learnSystem(sys)
	defer func() {
		<-learned
		pyFiles.later.Wait()
	}()
	res := &Result{Ledger: ledger.New(), Output: opts.Output}
	for _, lib := range libs {
		ar, err := tr.Attach(lib)
		if err != nil && opts.searched[lib.Path] {
			// One a --pid process might load: not what it runs.
			fmt.Fprintf(opts.Stderr, "cudatrace: warning: %v\n", err)
			continue
		}
		if err != nil {
			return nil, hint.Wrap(err, "name the CUDA runtime library with --lib PATH (e.g. .../libcudart.so.12)")
		}
		res.Attached = append(res.Attached, ar)
	}
	targets, err := addTargets(tr, opts.PIDs, opts.waiting)
	if err != nil {
		return nil, err
	}

	s, err := newSession(opts, res, tr)
	if err != nil {
		return nil, err
	}
	defer s.close()
	s.gc = tuneGC(opts.GCHeadroom)
	defer s.gc.stop()
	s.pyFiles = pyFiles
	s.targets = targets
	for _, ar := range res.Attached {
		s.writeAttach(ar, nil)
	}
	s.attachLoaders(opts.PIDs)
	s.learnCommandPython(opts.Command)
	select {
	case <-learned:
	case <-time.After(learnWait):
	}
	var probes int
	for _, ar := range res.Attached {
		probes += ar.Programs
		if len(ar.Missing) > 0 {
			fmt.Fprintf(opts.Stderr, "cudatrace: %s lacks %s (older CUDA): not traced\n",
				ar.Library.Path, strings.Join(ar.Missing, ", "))
		}
	}
	if len(libs) > 0 {
		fmt.Fprintf(opts.Stderr, "cudatrace: attached %d probes to %d librar%s (%s)\n", probes, len(libs),
			plural(len(libs), "y", "ies"), libPaths(libs))
	}
	for _, pid := range opts.waiting {
		fmt.Fprintf(opts.Stderr, "cudatrace: pid %d has not loaded CUDA yet (no libcudart or libcuda in /proc/%d/maps): waiting for it to (a library linked in statically: name it with --lib PATH)\n", pid, pid)
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	if opts.Duration > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(runCtx, opts.Duration)
		defer cancel()
	}
	s.stop = stop
	// The losses counted when the stop begins are those of tracing; the
	// rest are the stop's own (stoplosses.go).
	s.mark.read = tr.Counters
	context.AfterFunc(runCtx, s.mark.mark)
	if opts.Observer != nil {
		s.maps = startMapCounter(tr, mapCountEvery)
		defer s.maps.close()
	}
	if opts.NVML != nil {
		s.sampler = startSampler(opts.NVML, opts.NVMLEvery)
		defer s.sampler.close()
	}
	// Libraries loaded after this point: the PID filter's processes are
	// searched every 500 ms, with --all every process every 2 s. A uprobe
	// on a file covers every process that maps it, so a library needs
	// finding once, in whichever process maps it first.
	if opts.All {
		s.scanner = startScanner(allPIDs, lateScanAllEvery, libs)
	} else {
		s.scanner = startScanner(tr.TracedPIDs, lateScanEvery, libs)
	}
	defer s.scanner.close()
	if len(opts.Command) > 0 {
		child, err := launch(opts, tr)
		if err != nil {
			return nil, err
		}
		s.child = child
	}
	if err := tr.Run(runCtx, s, s.warn); err != nil {
		return nil, err
	}
	res.ReaderRaised = tr.ReaderRaised()
	switch {
	case s.reason != "":
		res.StopReason = s.reason
	case ctx.Err() != nil:
		res.StopReason = "interrupted"
	case opts.Duration > 0:
		res.StopReason = "duration elapsed"
	}
	if s.child != nil {
		res.ExitCode = s.child.end(opts.Stderr)
		res.Signal = s.child.signal
	}
	res.Counters, err = tr.Counters()
	if err != nil {
		s.warn(err)
	}
	res.Lost = loader.Lost(res.Counters)
	s.mark.mark() // waits for the AfterFunc's read; makes it if the ring buffer closed first
	res.LostStopping, res.CountersAtStop = s.mark.stopping(res.Counters), s.mark.counters
	res.Events = s.events
	res.StacksCut = s.en.Stats.Cut
	if unwindCheck {
		st := s.en.Stats
		fmt.Fprintf(opts.Stderr, "cudatrace: unwind check: %d stacks unwound in BPF, %d the same as the window's, %d differ, %d not checked; fell back: %d without rules, %d by a rule; %s\n",
			st.BPF, st.BPFSame, st.BPFDiffer, st.BPFUnchecked, res.Counters["unwind_fallback_no_rules"], res.Counters["unwind_fallback_rule"], st.FirstDiffer)
	}
	res.PythonFrames, res.UnresolvedPython, res.PythonNoInterp = s.pyFrames, s.pyUnresolved, s.pyNoInterp
	res.PythonUnwalked = s.pyUnwalked
	res.PythonCaptured, res.PythonRead, res.Uncaptured = s.pyCaptured, s.pyRead, s.uncaptured
	res.Captured = func(pid uint32) *procmodel.Capture {
		if p := s.procs.Get(pid); p != nil {
			return p.Current()
		}
		return nil
	}
	if s.opts.Observer != nil {
		// The final figures, the split of the losses with them: what the
		// agent serves until it shuts down agrees with its exit line.
		s.opts.Observer.Tick(res)
	}
	res.Reader = s.stats
	if err := s.finish(res); err != nil {
		return res, err
	}
	return res, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func libPaths(libs []loader.Library) string {
	var p []string
	for _, l := range libs {
		p = append(p, l.Path)
	}
	return strings.Join(p, ", ")
}

func validate(opts *Options) error {
	modes := 0
	if len(opts.PIDs) > 0 {
		modes++
	}
	if opts.All {
		modes++
	}
	if len(opts.Command) > 0 {
		modes++
	}
	if modes != 1 {
		return hint.Wrap(errors.New("say what to trace: a command after --, --pid PID, or --all (one of them)"),
			"e.g. cudatrace record -- python train.py")
	}
	for _, pid := range opts.PIDs {
		if pid <= 0 || !proc.Alive(pid) {
			return hint.Wrap(fmt.Errorf("pid %d: %w", pid, proc.ErrNoProcess),
				"check the PID with `ps` or `nvidia-smi`; the process may have exited")
		}
	}
	return nil
}

func findLibraries(opts *Options) ([]loader.Library, error) {
	var ls loader.Libraries
	if len(opts.Libs) > 0 {
		for _, p := range opts.Libs {
			if _, err := ls.Add(p); err != nil {
				return nil, hint.Wrap(err, "--lib takes the path of a CUDA library file, e.g. /usr/local/cuda/lib64/libcudart.so.12")
			}
		}
		// A --pid process that maps none of them yet chooses its
		// device under the tracer's eyes, as below.
		for _, pid := range opts.PIDs {
			if maps, err := proc.ReadMaps(pid); err == nil && !mapsAny(maps, ls) {
				opts.waiting = append(opts.waiting, pid)
			}
		}
		return ls.List(), nil
	}
	var searched []string
	// A program with the runtime linked in: its own executable is probed.
	if len(opts.Command) > 0 {
		if exe, err := exec.LookPath(opts.Command[0]); err == nil && loader.ExportsCUDA(exe) {
			if _, err := ls.Add(exe); err != nil {
				return nil, err
			}
		}
	}
	for _, pid := range opts.PIDs {
		paths, err := loader.FromProcess(pid)
		if err != nil {
			return nil, err
		}
		// /proc/PID/exe opens the executable itself, in a container too.
		if exe := filepath.Join(proc.Root, strconv.Itoa(pid), "exe"); loader.ExportsCUDA(exe) {
			paths = append(paths, exe)
		}
		searched = append(searched, fmt.Sprintf("/proc/%d/maps", pid))
		if len(paths) == 0 {
			// Not loaded yet (a Python job imports torch later): what it
			// would load by name is attached now, so its first calls are
			// traced; anything else, when its loader says it mapped it
			// (notes.go), or the scan of its mappings finds it.
			opts.waiting = append(opts.waiting, pid)
		}
		for _, p := range paths {
			if _, err := ls.Add(p); err != nil {
				return nil, err
			}
		}
		for _, p := range loader.SearchPath(pid) {
			if isNew, err := ls.Add(p); err == nil && isNew {
				if opts.searched == nil {
					opts.searched = map[string]bool{}
				}
				opts.searched[p] = true
			}
		}
	}
	if opts.All || len(opts.Command) > 0 {
		found, dirs := loader.FromSystem()
		searched = append(searched, dirs...)
		for _, p := range found {
			if _, err := ls.Add(p); err != nil {
				return nil, err
			}
		}
	}
	if len(ls.List()) == 0 && !(len(opts.PIDs) > 0 && len(opts.waiting) == len(opts.PIDs)) {
		return nil, hint.Wrap(fmt.Errorf("no CUDA library found (searched: %s)", strings.Join(searched, ", ")),
			"name the library with --lib PATH, e.g. --lib /usr/local/cuda/lib64/libcudart.so.12 or a wheel's site-packages/nvidia/cuda_runtime/lib/libcudart.so.12")
	}
	return ls.List(), nil
}

// mapsAny says whether maps hold one of the libraries of ls.
func mapsAny(maps []proc.Mapping, ls loader.Libraries) bool {
	for _, m := range maps {
		if m.File() && ls.HasInode(m.Inode) {
			return true
		}
	}
	return false
}

// child is a launched command.
type child struct {
	cmd  *exec.Cmd
	name string
	done chan struct{}
	code int
	// signal names the signal that killed the command, if one did: code
	// is then 128 + its number, as a shell says.
	signal string
	// execd: the reader took its exec note (session.exec). Before it, the
	// process is the launch helper, cudatrace's own image.
	execd bool
}

// helper says whether pid is the launch helper before its exec of the
// command: what its loader reports (its libraries loaded while it was
// put in the PID filter) is cudatrace's own, and never calls CUDA. Read
// as a traced process's, its files' unwind rows were made: cudatrace's
// own 30 MB binary, ~150 ms of a CPU, waited for at a short run's end.
func (c *child) helper(pid uint32) bool {
	return c.is(pid) && !c.execd
}

// is says whether pid is the launched command's process (nil: none).
func (c *child) is(pid uint32) bool {
	return c != nil && c.cmd.Process.Pid == int(pid)
}

// end waits for the command after tracing stopped. A command still running
// (the session hit --duration, or only the tracer got SIGTERM) gets a grace
// period, then SIGTERM, then is left alone: a tracer must not hang on it.
func (c *child) end(stderr io.Writer) int {
	select {
	case <-c.done:
		return c.code
	case <-time.After(2 * time.Second):
	}
	fmt.Fprintf(stderr, "cudatrace: stopping %s (pid %d) with SIGTERM\n", c.name, c.cmd.Process.Pid)
	c.cmd.Process.Signal(unix.SIGTERM)
	select {
	case <-c.done:
		return c.code
	case <-time.After(5 * time.Second):
		fmt.Fprintf(stderr, "cudatrace: pid %d still running; left to run untraced\n", c.cmd.Process.Pid)
		return -1
	}
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// exitStatus is the shell's figure for how a command ended (Wait's
// error): its exit code, or 128 + the number of the signal that killed it,
// and that signal's name.
func exitStatus(err error) (int, string) {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, ""
	case errors.As(err, &ee):
		// os/exec gives syscall's WaitStatus (x/sys/unix's is another
		// type).
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), unix.SignalName(ws.Signal())
		}
		return ee.ExitCode(), ""
	default:
		return 127, ""
	}
}

// launch starts the command through the launch helper, adds it to the PID
// filter while it waits, then lets it exec the target.
func launch(opts Options, tr *loader.Tracer) (*child, error) {
	if _, err := exec.LookPath(opts.Command[0]); err != nil {
		return nil, hint.Wrap(fmt.Errorf("command %q: %w", opts.Command[0], err), "check the command's name and PATH")
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	defer r.Close()
	args := append(append(append([]string{}, opts.LaunchHelper[1:]...), "--"), opts.Command...)
	cmd := exec.Command(opts.LaunchHelper[0], args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{r}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("launch %s: %w", opts.Command[0], err)
	}
	c := &child{cmd: cmd, name: opts.Command[0], done: make(chan struct{})}
	go func() {
		c.code, c.signal = exitStatus(cmd.Wait())
		close(c.done)
	}()
	if err := tr.AddPID(uint32(cmd.Process.Pid), false); err != nil {
		w.Close() // the helper sees EOF and exits without running the command
		return nil, err
	}
	if _, err := w.Write([]byte{1}); err != nil {
		w.Close()
		return nil, fmt.Errorf("start %s: %w", opts.Command[0], err)
	}
	w.Close()
	return c, nil
}

// LaunchMain is the launch helper's body: wait for the go byte on fd 3, then
// become the command. It only returns on error.
func LaunchMain(argv []string) error {
	f := os.NewFile(3, "go")
	var b [1]byte
	n, _ := f.Read(b[:])
	f.Close()
	if n != 1 {
		return errors.New("tracer went away before the command could start")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("command %q: %w", argv[0], err)
	}
	return unix.Exec(path, argv, os.Environ())
}

// addTargets puts the --pid processes in the PID filter, each known by its
// start time as well: one that ended as it was added leaves the filter
// again (BPF took it out at its exit, maybe before it went in), so that a
// later process given its PID is not traced, and the session ends when
// every target has ended, whoever has their PIDs since (targetAlive).
func addTargets(tr *loader.Tracer, pids, waiting []int) (map[int]uint64, error) {
	starts := make(map[int]uint64, len(pids))
	for _, pid := range pids {
		st, err := proc.StartTime(pid)
		if err := tr.AddPID(uint32(pid), slices.Contains(waiting, pid)); err != nil {
			return nil, err
		}
		if now, err2 := proc.StartTime(pid); err != nil || err2 != nil || now != st {
			tr.Forget(uint32(pid))
			continue
		}
		starts[pid] = st
	}
	return starts, nil
}

// targetAlive says whether --pid process pid is still the one traced: a
// PID taken by another process since is not.
func (s *session) targetAlive(pid int) bool {
	st, ok := s.targets[pid]
	if !ok {
		return false
	}
	return proc.Running(pid, st)
}
