package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/jobid"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/tracefile"
)

const base = 1_000_000_000 // boot ns at the start of the test traces

func testMeta() tracefile.Meta {
	return tracefile.Meta{Tool: "cudatrace test", Host: "gpu-box", Kernel: "6.8.0",
		StartWall: time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC), StartBoot: base,
		Command: []string{"./mix", "--big"}}
}

// mixItems is a trace of two processes: pid 100 uses two devices, pinned
// host memory, frees, fails twice and frees an unknown address; pid 200
// makes two allocations of the same size from two stacks.
func mixItems() []any {
	ok := func(t, d uint64, pid, tid uint32, comm string, api events.API, addr, size uint64, dev int32, stack ...uint64) events.Event {
		return events.Event{Time: base + t, Duration: d, PID: pid, TID: tid, Comm: comm, API: api,
			Addr: addr, Size: size, Device: dev, Stack: stack}
	}
	free := func(t uint64, pid uint32, comm string, addr uint64, dev int32) events.Event {
		return events.Event{Time: base + t, PID: pid, TID: pid, Comm: comm, API: events.CudaFree, Addr: addr,
			Device: dev, Flags: events.FlagEntryOnly}
	}
	fail := ok(6000, 100, 100, 101, "mix", events.CudaMalloc, 0, 99999999999, 0, 0xa1, 0xa2)
	fail.Result = 2
	pitchFail := ok(7000, 100, 100, 101, "mix", events.CudaMallocPitch, 0, 0, 0, 0xd1)
	pitchFail.Result = 1
	return []any{
		&tracefile.Attach{Library: "/usr/lib/libcudart.so.12", Symbols: []string{"cudaMalloc", "cudaFree"},
			Missing: []string{"cudaMallocAsync"}},
		&tracefile.Process{PID: 100, Comm: "mix", Cmdline: []string{"./mix", "--big"}, Time: base + 500,
			Maps: []tracefile.Mapping{{Start: 0, End: 0x1000, Perms: "r-xp", Path: "/nonexistent/mix"}}},
		ok(1000, 100, 100, 100, "mix", events.CudaMalloc, 0x1000, 300, 0, 0xa1, 0xa2),
		ok(2000, 100, 100, 100, "mix", events.CudaMalloc, 0x2000, 1000, 1, 0xb1),
		free(3000, 100, "mix", 0x2000, 1),
		ok(4000, 100, 100, 100, "mix", events.CudaMalloc, 0x3000, 512, 1, 0xb1),
		ok(5000, 100, 100, 100, "mix", events.CudaMallocHost, 0x4000, 64, 0, 0xc1),
		&tracefile.Counters{Time: base + 5500, Counters: map[string]uint64{"events": 5}, Lost: 1},
		fail,
		pitchFail,
		free(8000, 100, "mix", 0xdead, 0),
		&tracefile.Process{PID: 200, Comm: "other", Time: base + 8500, Error: "exited before its mappings could be read"},
		ok(9000, 100, 200, 200, "other", events.CudaMalloc, 0x7e00, 7, 0, 0x50),
		ok(10000, 100, 200, 200, "other", events.CudaMalloc, 0x7f00, 7, 0, 0x40),
		&tracefile.Counters{Time: base + 10500, Counters: map[string]uint64{"events": 10, "ringbuf_full": 2}, Lost: 2},
		&tracefile.End{Time: base + 11000, Events: 10, Reason: "command exited"},
	}
}

// The whole JSON document, every key and number.
const mixJSON = `{
 "lost_events": 2,
 "lost_while_stopping": 0,
 "events": 10,
 "trace": {"path": "TRACE", "tool": "cudatrace test", "host": "gpu-box", "kernel": "6.8.0",
  "start": "2025-03-14T15:09:26Z", "duration_ns": 11000, "command": ["./mix", "--big"],
  "complete": true, "stop_reason": "command exited"},
 "processes": [
  {"pid": 100, "comm": "mix", "cmdline": ["./mix", "--big"], "allocs": 4, "frees": 1, "failed": 2,
   "alloc_bytes": 1876, "live_bytes": 812, "peak_bytes": 1300, "peak_time": "2025-03-14T15:09:26.0000021Z",
   "host_live_bytes": 64, "host_peak_bytes": 64, "live_allocations": 3, "unknown_frees": 1, "replaced": 0, "implicit_frees": 0, "implicit_free_bytes": 0,
   "tensor_allocs": 0, "tensor_frees": 0, "tensor_alloc_bytes": 0, "tensor_live_bytes": 0,
   "tensor_peak_bytes": 0, "unknown_tensor_frees": 0,
   "vmm_mapped_bytes": 0, "vmm_mapped_peak_bytes": 0, "vmm_maps": 0, "vmm_unmaps": 0, "vmm_failed_maps": 0,
   "vmm_unknown_unmaps": 0, "va_reserved_bytes": 0,
   "devices": [{"device": 0, "live_bytes": 300, "peak_bytes": 300, "tensor_live_bytes": 0, "tensor_peak_bytes": 0, "implicit_frees": 0, "implicit_free_bytes": 0}, {"device": 1, "live_bytes": 512, "peak_bytes": 1000, "tensor_live_bytes": 0, "tensor_peak_bytes": 0, "implicit_frees": 0, "implicit_free_bytes": 0}]},
  {"pid": 200, "comm": "other", "allocs": 2, "frees": 0, "failed": 0,
   "alloc_bytes": 14, "live_bytes": 14, "peak_bytes": 14, "peak_time": "2025-03-14T15:09:26.0000101Z",
   "host_live_bytes": 0, "host_peak_bytes": 0, "live_allocations": 2, "unknown_frees": 0, "replaced": 0, "implicit_frees": 0, "implicit_free_bytes": 0,
   "tensor_allocs": 0, "tensor_frees": 0, "tensor_alloc_bytes": 0, "tensor_live_bytes": 0,
   "tensor_peak_bytes": 0, "unknown_tensor_frees": 0,
   "vmm_mapped_bytes": 0, "vmm_mapped_peak_bytes": 0, "vmm_maps": 0, "vmm_unmaps": 0, "vmm_failed_maps": 0,
   "vmm_unknown_unmaps": 0, "va_reserved_bytes": 0,
   "devices": [{"device": 0, "live_bytes": 14, "peak_bytes": 14, "tensor_live_bytes": 0, "tensor_peak_bytes": 0, "implicit_frees": 0, "implicit_free_bytes": 0}],
   "capture_error": "exited before its mappings could be read"}
 ],
 "stacks": [
  {"pid": 100, "allocs": 2, "alloc_bytes": 1512, "live_bytes": 512, "live_count": 1, "tensor_allocs": 0, "tensor_alloc_bytes": 0, "tensor_live_bytes": 0, "tensor_live_count": 0, "calls": 2, "frames": [
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xb1", "offset": 0}]},
  {"pid": 100, "allocs": 1, "alloc_bytes": 300, "live_bytes": 300, "live_count": 1, "tensor_allocs": 0, "tensor_alloc_bytes": 0, "tensor_live_bytes": 0, "tensor_live_count": 0, "calls": 1, "frames": [
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xa1", "offset": 0},
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xa2", "offset": 0}]},
  {"pid": 100, "allocs": 1, "alloc_bytes": 64, "live_bytes": 64, "live_count": 1, "tensor_allocs": 0, "tensor_alloc_bytes": 0, "tensor_live_bytes": 0, "tensor_live_count": 0, "calls": 1, "frames": [
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xc1", "offset": 0}]},
  {"pid": 200, "allocs": 1, "alloc_bytes": 7, "live_bytes": 7, "live_count": 1, "tensor_allocs": 0, "tensor_alloc_bytes": 0, "tensor_live_bytes": 0, "tensor_live_count": 0, "calls": 1, "frames": [
   {"function": "", "file": "", "line": 0, "module": "", "address": "0x40", "offset": 0}]},
  {"pid": 200, "allocs": 1, "alloc_bytes": 7, "live_bytes": 7, "live_count": 1, "tensor_allocs": 0, "tensor_alloc_bytes": 0, "tensor_live_bytes": 0, "tensor_live_count": 0, "calls": 1, "frames": [
   {"function": "", "file": "", "line": 0, "module": "", "address": "0x50", "offset": 0}]}
 ],
 "failures": [
  {"pid": 100, "tid": 101, "api": "cudaMalloc", "size": 99999999999, "device": 0, "result": 2,
   "error": "cudaErrorMemoryAllocation", "time": "2025-03-14T15:09:26.0000061Z", "frames": [
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xa1", "offset": 0},
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xa2", "offset": 0}],
   "live_bytes": 812, "device_live_bytes": 300, "live_stacks": [{"live_bytes": 300, "live_count": 1, "frames": [
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xa1", "offset": 0},
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xa2", "offset": 0}]}]},
  {"pid": 100, "tid": 101, "api": "cudaMallocPitch", "size": 0, "device": 0, "result": 1,
   "error": "cudaErrorInvalidValue", "time": "2025-03-14T15:09:26.0000071Z", "frames": [
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xd1", "offset": 0}],
   "live_bytes": 812, "device_live_bytes": 300, "live_stacks": [{"live_bytes": 300, "live_count": 1, "frames": [
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xa1", "offset": 0},
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xa2", "offset": 0}]}]}
 ],
 "peak_stacks": [
  {"pid": 100, "live_bytes": 1000, "live_count": 1, "frames": [
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xb1", "offset": 0}]},
  {"pid": 100, "live_bytes": 300, "live_count": 1, "frames": [
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xa1", "offset": 0},
   {"function": "", "file": "", "line": 0, "module": "/nonexistent/mix", "address": "0xa2", "offset": 0}]},
  {"pid": 200, "live_bytes": 7, "live_count": 1, "frames": [
   {"function": "", "file": "", "line": 0, "module": "", "address": "0x40", "offset": 0}]},
  {"pid": 200, "live_bytes": 7, "live_count": 1, "frames": [
   {"function": "", "file": "", "line": 0, "module": "", "address": "0x50", "offset": 0}]}
 ],
 "owners": [
  {"pid": 100, "end": [
    {"device": 0, "owner": "application", "module": "mix", "live_bytes": 300, "live_count": 1},
    {"device": 1, "owner": "application", "module": "mix", "live_bytes": 512, "live_count": 1}],
   "peak": [
    {"device": 0, "owner": "application", "module": "mix", "live_bytes": 300, "live_count": 1},
    {"device": 1, "owner": "application", "module": "mix", "live_bytes": 1000, "live_count": 1}]},
  {"pid": 200, "end": [{"device": 0, "owner": "application", "live_bytes": 14, "live_count": 2}],
   "peak": [{"device": 0, "owner": "application", "live_bytes": 14, "live_count": 2}]}
 ],
 "libraries": [{"library": "/usr/lib/libcudart.so.12", "symbols": ["cudaMalloc", "cudaFree"], "missing": ["cudaMallocAsync"]}],
 "counters": {"events": 10, "ringbuf_full": 2}
}`

func decodeJSON(t *testing.T, data []byte) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // every number compared exactly, not as a float64
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("%v in\n%s", err, data)
	}
	return m
}

func TestJSON(t *testing.T) {
	path, _ := tracetest.Write(t, testMeta(), mixItems()...)
	rep, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Warning != "" {
		t.Errorf("warning %q on a complete trace", rep.Warning)
	}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	got := decodeJSON(t, buf.Bytes())
	if p := got["trace"].(map[string]any)["path"]; p != path {
		t.Errorf("trace.path %v, want %s", p, path)
	}
	got["trace"].(map[string]any)["path"] = "TRACE"
	want := decodeJSON(t, []byte(mixJSON))
	for k := range want {
		if !reflect.DeepEqual(got[k], want[k]) {
			g, _ := json.Marshal(got[k])
			w, _ := json.Marshal(want[k])
			t.Errorf("%s:\n got %s\nwant %s", k, g, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected key %q", k)
		}
	}
	if !strings.HasPrefix(buf.String(), "{\n  \"lost_events\": 2,\n") {
		t.Errorf("not indented, or lost_events not first:\n%.80s", buf.String())
	}
}

func TestNoSymbolize(t *testing.T) {
	path, _ := tracetest.Write(t, testMeta(), mixItems()...)
	rep, err := Load(path, Options{NoSymbolize: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []Frame{{Address: "0xa1"}, {Address: "0xa2"}}
	if got := rep.Stacks[1].Frames; !reflect.DeepEqual(got, want) {
		t.Errorf("frames %+v, want %+v", got, want)
	}
}

// Empty lists are [] in the JSON, never null: scripts iterate them.
func TestJSONEmptyLists(t *testing.T) {
	path, _ := tracetest.Write(t, tracefile.Meta{Tool: "t", StartBoot: base}, &tracefile.End{Time: base + 1})
	rep, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"processes", "stacks", "failures", "libraries"} {
		if s := string(m[k]); s != "[]" {
			t.Errorf("%s = %s, want []", k, s)
		}
	}
	if s := string(m["counters"]); s != "{}" {
		t.Errorf("counters = %s, want {}", s)
	}
	if s := string(m["lost_events"]); s != "0" {
		t.Errorf("lost_events = %s, want 0", s)
	}
	if _, ok := m["warning"]; ok {
		t.Errorf("warning present on a complete trace: %s", m["warning"])
	}

	// A process that made only failed calls, with no stack: its lists are
	// still lists.
	path, _ = tracetest.Write(t, testMeta(),
		events.Event{Time: base + 1, PID: 1, Comm: "f", API: events.CudaMalloc, Size: 1, Result: 2, StackErr: -14},
		&tracefile.End{Time: base + 2})
	if rep, err = Load(path, Options{}); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	got := decodeJSON(t, buf.Bytes())
	p := got["processes"].([]any)[0].(map[string]any)
	f := got["failures"].([]any)[0].(map[string]any)
	if d, ok := p["devices"].([]any); !ok || len(d) != 0 {
		t.Errorf("devices = %#v, want []", p["devices"])
	}
	if fr, ok := f["frames"].([]any); !ok || len(fr) != 0 {
		t.Errorf("failure frames = %#v, want []", f["frames"])
	}
	if s := got["stacks"].([]any); len(s) != 0 {
		t.Errorf("a failed-only stack is listed under stacks: %v", s)
	}
	if _, ok := p["peak_time"]; ok {
		t.Errorf("peak_time %v for a process that never held memory", p["peak_time"])
	}
}

// The symbolization fixture: a Go program that prints the return
// addresses a call into target and other would leave, what the Go runtime
// says of the first (function, file, line), then its own mappings.
const fixtureSrc = `package main

import (
	"fmt"
	"os"
	"reflect"
	"runtime"
)

//go:noinline
func target() int { return 1 }

//go:noinline
func other() int { return 2 }

func main() {
	pc := reflect.ValueOf(target).Pointer() + 1
	pc2 := reflect.ValueOf(other).Pointer() + 1
	fn := runtime.FuncForPC(pc - 1)
	file, line := fn.FileLine(pc - 1)
	fmt.Printf("%d %d %s %s %d\n", pc, pc2, fn.Name(), file, line)
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		panic(err)
	}
	os.Stdout.Write(maps)
}
`

type fixture struct {
	exe        string
	pc, pc2    uint64
	name, file string
	line       int
	maps       []proc.Mapping
}

// buildFixture builds and runs the fixture. The test binary itself will
// not do: ` + "`go test`" + ` links it without symbols or DWARF.
func buildFixture(t *testing.T) fixture {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		testenv.SkipOrFail(t, "no go tool in PATH to build the fixture: %v", err)
	}
	dir := t.TempDir()
	for name, text := range map[string]string{
		"main.go": fixtureSrc,
		"go.mod":  "module fixture\n\ngo 1.22\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	exe := filepath.Join(dir, "fixture")
	build := exec.Command(goTool, "build", "-o", exe, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOFLAGS=", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build fixture: %v\n%s", err, out)
	}
	out, err := exec.Command(exe).Output()
	if err != nil {
		t.Fatalf("run fixture: %v", err)
	}
	first, rest, _ := strings.Cut(string(out), "\n")
	var fx fixture
	if _, err := fmt.Sscanf(first, "%d %d %s %s %d", &fx.pc, &fx.pc2, &fx.name, &fx.file, &fx.line); err != nil {
		t.Fatalf("fixture printed %q: %v", first, err)
	}
	if fx.maps, err = proc.ParseMaps(strings.NewReader(rest)); err != nil {
		t.Fatal(err)
	}
	fx.exe = exe
	return fx
}

// Stacks are symbolized against a real ELF file with the mappings of their
// process as they were when the stack was first seen.
func TestSymbolize(t *testing.T) {
	fx := buildFixture(t)
	if fx.name != "main.target" {
		t.Fatalf("fixture's function is %q", fx.name)
	}
	alloc := func(tm uint64, pid uint32, addr uint64, stack ...uint64) events.Event {
		return events.Event{Time: base + tm, PID: pid, TID: pid, Comm: "fixture", API: events.CudaMalloc,
			Addr: addr, Size: 100, Stack: stack}
	}
	path, _ := tracetest.Write(t, testMeta(),
		// pid 1: captured, then a stack, then a capture that no longer
		// covers the addresses (the mapping went away).
		(&procmodel.Capture{PID: 1, Comm: "fixture", Maps: fx.maps}).File(),
		alloc(1, 1, 0x1000, fx.pc),
		&tracefile.Process{PID: 1, Comm: "fixture", Maps: []tracefile.Mapping{}},
		alloc(2, 1, 0x2000, fx.pc),  // the same stack: still symbolized with the first maps
		alloc(3, 1, 0x3000, fx.pc2), // a new stack: the new maps do not cover it
		// pid 2: its first event comes before its capture.
		alloc(4, 2, 0x1000, fx.pc, fx.pc2),
		(&procmodel.Capture{PID: 2, Comm: "fixture", Maps: fx.maps}).File(),
		&tracefile.End{Time: base + 5},
	)
	rep, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Stacks) != 3 {
		t.Fatalf("%d stacks, want 3: %+v", len(rep.Stacks), rep.Stacks)
	}
	var first, second, early *Stack
	for i := range rep.Stacks {
		s := &rep.Stacks[i]
		switch {
		case s.PID == 1 && s.Allocs == 2:
			first = s
		case s.PID == 1:
			second = s
		case s.PID == 2:
			early = s
		}
	}
	if first == nil || second == nil || early == nil {
		t.Fatalf("stacks %+v", rep.Stacks)
	}
	want := Frame{Function: "main.target", File: fx.file, Line: fx.line, Module: fx.exe, Address: hex(fx.pc)}
	check := func(what string, got, want Frame) {
		t.Helper()
		if got.Offset == 0 {
			t.Errorf("%s: no offset in %+v", what, got)
		}
		got.Offset = 0
		if got != want {
			t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
		}
	}
	check("first stack", first.Frames[0], want)
	check("stack seen before its capture, frame 0", early.Frames[0], want)
	if f := early.Frames[1]; f.Function != "main.other" || f.Module != fx.exe {
		t.Errorf("stack seen before its capture, frame 1: %+v, want main.other", f)
	}
	if f := second.Frames[0]; f != (Frame{Address: hex(fx.pc2)}) {
		t.Errorf("stack first seen after the mapping went: %+v, want it unsymbolized", f)
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("  #0 main.target (%s:%d) fixture\n", fx.file, fx.line),
		"  #0 " + hex(fx.pc2) + "\n",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
}

func hex(v uint64) string { return fmt.Sprintf("%#x", v) }

// A trace cut inside a frame is reported up to the cut, with a warning;
// one cut between frames lacks only the end record.
func TestTruncated(t *testing.T) {
	items := mixItems()
	path, ends := tracetest.Write(t, testMeta(), items...)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Cut inside pid 200's first allocation (item 12): pid 100 is whole,
	// pid 200 exists only through its Process frame, so is absent.
	const cutItem = 12
	cut := filepath.Join(t.TempDir(), "cut.trace")
	if err := os.WriteFile(cut, data[:ends[cutItem]-3], 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Load(cut, Options{})
	if err != nil {
		t.Fatalf("Load of a truncated trace: %v", err)
	}
	if !strings.Contains(rep.Warning, "truncated") || !strings.Contains(rep.Warning, fmt.Sprintf("offset %d", ends[cutItem-1])) {
		t.Errorf("warning %q, want it to say truncated at offset %d", rep.Warning, ends[cutItem-1])
	}
	if rep.Trace.Complete {
		t.Error("a truncated trace reported complete")
	}
	if rep.Events != 8 || len(rep.Processes) != 1 || rep.LostEvents != 1 {
		t.Fatalf("events %d, processes %+v, lost %d; want 8 events of pid 100, lost 1", rep.Events, rep.Processes, rep.LostEvents)
	}
	p := rep.Processes[0]
	if p.Allocs != 4 || p.Frees != 1 || p.Failed != 2 || p.LiveBytes != 812 || p.PeakBytes != 1300 || p.UnknownFrees != 1 {
		t.Errorf("pid 100 up to the cut: %+v", p)
	}
	if rep.Trace.DurationNS != 8500 { // the last thing read: pid 200's Process frame
		t.Errorf("duration %d, want 8500", rep.Trace.DurationNS)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "Warning: trace truncated") {
		t.Errorf("text report lacks the warning:\n%s", text.String())
	}

	// Cut cleanly between frames, before the end record.
	if err := os.WriteFile(cut, data[:ends[len(ends)-2]], 0o644); err != nil {
		t.Fatal(err)
	}
	if rep, err = Load(cut, Options{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rep.Warning, "no end record") || rep.Trace.Complete || rep.Events != 10 {
		t.Errorf("no end record: warning %q, complete %v, %d events", rep.Warning, rep.Trace.Complete, rep.Events)
	}

	// A damaged frame: the same, with a warning that says so.
	bad := append([]byte(nil), data...)
	bad[ends[cutItem]-6] ^= 0xff
	if err := os.WriteFile(cut, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if rep, err = Load(cut, Options{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rep.Warning, "damaged") || rep.Events != 8 {
		t.Errorf("damaged trace: warning %q, %d events", rep.Warning, rep.Events)
	}
}

func TestNotATrace(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(text, []byte("hello, this is not a trace\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Load(text, Options{})
	if rep != nil || !errors.Is(err, tracefile.ErrNotTrace) || !strings.Contains(err.Error(), text) {
		t.Errorf("Load of a text file: %v, %v; want ErrNotTrace naming the path", rep, err)
	}

	// A later format version.
	path, _ := tracetest.Write(t, testMeta())
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(tracefile.Magic)] = 99
	newer := filepath.Join(dir, "newer.trace")
	if err := os.WriteFile(newer, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(newer, Options{}); !errors.Is(err, tracefile.ErrVersion) || !strings.Contains(err.Error(), newer) {
		t.Errorf("Load of a newer version: %v, want ErrVersion naming the path", err)
	}

	if _, err := Load(filepath.Join(dir, "missing.trace"), Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file: %v, want ErrNotExist", err)
	}
}

var update = flag.Bool("update", false, "rewrite the golden files of the text report")

// The text report, whole, against golden files in testdata/ (rewrite them
// with go test ./report -update, and read the diff).
func TestText(t *testing.T) {
	for _, tc := range []struct {
		golden string
		opts   Options
		items  []any
		meta   tracefile.Meta
	}{
		{"mix_top2.golden", Options{Top: 2}, mixItems(), testMeta()},
		{"mix_leaks_intervals.golden", Options{MinAge: 5 * time.Microsecond, Interval: 3 * time.Microsecond},
			mixItems(), testMeta()},
		{"mix_pid200.golden", Options{PIDs: []uint32{200}, MinAge: time.Nanosecond}, mixItems(), testMeta()},
		{"nvml_interval.golden", Options{Interval: 5 * time.Microsecond, Top: 1}, nvmlItems(), allMeta()},
		{"nvml_unavailable.golden", Options{Top: 1}, append([]any{&tracefile.NVML{Time: base + 10, Error: "NVML unavailable: library not found (libnvidia-ml.so.1)"}}, mixItems()...), testMeta()},
		{"empty.golden", Options{Interval: time.Second}, []any{&tracefile.End{Time: base + 2*uint64(time.Second)}},
			tracefile.Meta{StartBoot: base}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			path, _ := tracetest.Write(t, tc.meta, tc.items...)
			rep, err := Load(path, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := rep.WriteText(&buf); err != nil {
				t.Fatal(err)
			}
			got := strings.ReplaceAll(buf.String(), path, "TRACE")
			golden := filepath.Join("testdata", tc.golden)
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./report -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("text differs from %s (go test ./report -update rewrites it):\n--- got\n%s\n--- want\n%s", golden, got, want)
			}
		})
	}
}

func TestWriteSummary(t *testing.T) {
	l := ledger.New()
	l.Apply(&events.Event{Time: 1, PID: 42, Comm: "python3", API: events.CudaMalloc, Addr: 1, Size: 3 << 29, Device: 0})
	l.Apply(&events.Event{Time: 2, PID: 42, Comm: "python3", API: events.CudaMallocHost, Addr: 2, Size: 1 << 20})
	l.Apply(&events.Event{Time: 3, PID: 42, Comm: "python3", API: events.CudaFree, Addr: 1})
	var buf bytes.Buffer
	none := func(uint32) *procmodel.Capture { return nil }
	if err := WriteSummary(&buf, l, 7, none); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"PID  COMM     ALLOCS  FREES  FAILED  ALLOCATED  LIVE     PEAK  HOST-LIVE\n" +
		" 42  python3       2      1       0    1.5 GiB   0 B  1.5 GiB    1.0 MiB\n" +
		"WARNING: 7 events were lost: the figures above miss them\n"
	if buf.String() != want {
		t.Errorf("summary\n%s\nwant\n%s", buf.String(), want)
	}
	// A rank of a job: record's summary names it as report does.
	buf.Reset()
	ranked := func(pid uint32) *procmodel.Capture {
		return &procmodel.Capture{PID: pid, Job: &jobid.Identity{Job: "torchrun:abc", Launcher: "torchrun", Rank: 3, WorldSize: 4,
			LocalRank: -1, NodeRank: -1}}
	}
	if err := WriteSummary(&buf, l, 0, ranked); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); !strings.Contains(got, "JOB") || !strings.Contains(got, "RANK") || !strings.Contains(got, "torchrun:abc") ||
		!regexp.MustCompile(`(?m)^ *42 +python3 +\S*torchrun:abc\S* +3 `).MatchString(got) {
		t.Errorf("summary of rank 3 of torchrun:abc:\n%s", got)
	}
	buf.Reset()
	if err := WriteSummary(&buf, ledger.New(), 0, none); err != nil {
		t.Fatal(err)
	}
	if buf.String() != "No CUDA allocation traced.\n" {
		t.Errorf("empty summary %q", buf.String())
	}
}

// VMM: physical memory released while mapped stays live until unmapped;
// the report lists the mappings live at the end and a VMM-MAPPED column.
func TestVMM(t *testing.T) {
	ev := func(t uint64, api events.API, addr, size uint64, dev int32) events.Event {
		e := events.Event{Time: base + t, Duration: 10, PID: 7, TID: 7, Comm: "nccl", API: api, Addr: addr, Size: size,
			Device: dev, Stack: []uint64{0xa1}}
		if api.Info().Op == events.OpFree || api.Info().Op == events.OpUnmap || api.Info().Op == events.OpUnreserve {
			e.Duration, e.Flags, e.Stack = 0, events.FlagEntryOnly, nil
		}
		return e
	}
	mapAt := func(t, va, size, handle uint64) events.Event {
		e := ev(t, events.CuMemMap, va, size, 0)
		e.Aux, e.Flags = handle, events.FlagAux
		return e
	}
	path, _ := tracetest.Write(t, testMeta(),
		ev(1000, events.CuMemAddressReserve, 0x7000_0000, 8<<20, 0),
		ev(2000, events.CuMemCreate, 0x11, 2<<20, 1),
		ev(3000, events.CuMemCreate, 0x22, 2<<20, 1),
		mapAt(4000, 0x7000_0000, 2<<20, 0x11),
		mapAt(5000, 0x7020_0000, 2<<20, 0x22),
		ev(6000, events.CuMemRelease, 0x11, 0, 0), // mapped: still held
		ev(7000, events.CuMemUnmap, 0x7020_0000, 2<<20, 0),
		ev(8000, events.CuMemRelease, 0x22, 0, 0), // unmapped: freed
		&tracefile.End{Time: base + 9000, Events: 8, Reason: "command exited"},
	)
	rep, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Processes) != 1 {
		t.Fatalf("processes %+v", rep.Processes)
	}
	p := rep.Processes[0]
	want := Process{PID: 7, Comm: "nccl", Allocs: 2, Frees: 2, AllocBytes: 4 << 20, LiveBytes: 2 << 20, PeakBytes: 4 << 20,
		LiveAllocations: 1, VMMMappedBytes: 2 << 20, VMMMappedPeakBytes: 4 << 20, VMMMaps: 2, VMMUnmaps: 1,
		VAReservedBytes: 8 << 20, VMMMappings: []Mapping{{Addr: 0x7000_0000, Size: 2 << 20, Handle: 0x11, Device: 1, Released: true}}}
	p.PeakTime, p.Devices = "", nil
	if !reflect.DeepEqual(p, want) {
		t.Errorf("process\n got %+v\nwant %+v", p, want)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "VMM-MAPPED") || !strings.Contains(text.String(), "2.0 MiB") {
		t.Errorf("text has no VMM-MAPPED column of 2.0 MiB:\n%s", text.String())
	}
}

// TestLostWhileStopping: losses counted after the recording's stop began
// are reported apart from those while tracing, in the text and the JSON;
// only the latter make every figure suspect.
func TestLostWhileStopping(t *testing.T) {
	items := mixItems()
	items[len(items)-2] = &tracefile.Counters{Time: base + 10500, Counters: map[string]uint64{"events": 10, "ringbuf_full": 9},
		Lost: 9, LostStopping: 4}
	path, _ := tracetest.Write(t, testMeta(), items...)
	rep, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.LostEvents != 9 || rep.LostStopping != 4 {
		t.Errorf("lost_events %d, lost_while_stopping %d; want 9 and 4", rep.LostEvents, rep.LostStopping)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		", 10 events, 5 lost while tracing, 4 while stopping\n",
		"WARNING: 5 EVENTS WERE LOST (ringbuf_full 9): every figure below may be off",
		"Note: 4 events were lost while the recording stopped (probes firing as they were removed): the figures up to the stop miss none of them\n",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
	// Every loss while stopping: no warning that the figures are off.
	items[len(items)-2] = &tracefile.Counters{Time: base + 10500, Counters: map[string]uint64{"ringbuf_full": 4}, Lost: 4, LostStopping: 4}
	path, _ = tracetest.Write(t, testMeta(), items...)
	if rep, err = Load(path, Options{}); err != nil {
		t.Fatal(err)
	}
	text.Reset()
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if s := text.String(); strings.Contains(s, "WARNING") || !strings.Contains(s, ", 10 events, 0 lost while tracing, 4 while stopping\n") {
		t.Errorf("all 4 lost while stopping:\n%s", s)
	}
}
