package export

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Where labelsTrace's code is: a program with debug information (app.c),
// one without (/opt/nodebug), libffi unnamed, the C library's thread
// start, and libcudart.
const (
	lApp    = 0x40_0000 // /opt/app: cuda_malloc +0x100, worker_a +0x200, worker_b +0x300, worker +0x400, main +0x500
	lNoDbg  = 0x50_0000 // /opt/nodebug (no files): leaky +0x100, run +0x200
	lFFI    = 0x7e00_0000
	lLibc   = 0x7e10_0000 // libc.so.6: start_thread (pthread_create.c:442) +0x100
	lCudart = 0x7e20_0000 // libcudart.so.12: cudaMalloc +0x100
	lSize   = 0x10_0000
)

// labelsTrace is a trace whose call paths read alike: two paths through
// one allocation helper (cuda_malloc), three calls of one function with
// three APIs, the same paths in two processes, two unnamed frames of
// libffi, and a program without debug information whose innermost frame
// with a file is the C library's thread start.
func labelsTrace(t testing.TB) string {
	lib := func(start uint64, path, id string) proc.Mapping {
		return proc.Mapping{Start: start, End: start + lSize, Perms: "r-xp", Path: path, BuildID: id}
	}
	maps := []proc.Mapping{lib(lApp, "/opt/app", "app"), lib(lNoDbg, "/opt/nodebug", "nodebug"),
		lib(lFFI, "/usr/lib/x86_64-linux-gnu/libffi.so.8", "ffi"), lib(lLibc, "/usr/lib/x86_64-linux-gnu/libc.so.6", "libc"),
		lib(lCudart, "/opt/cuda/lib64/libcudart.so.12", "cudart")}
	var syms []tracefile.Symbol
	fn := func(id string, off uint64, name, file string, line int) {
		for o := off; o < off+0x100; o++ {
			syms = append(syms, tracefile.Symbol{BuildID: id, Offset: o, Function: name, File: file, Line: line})
		}
	}
	fn("app", 0x100, "cuda_malloc", "/src/app.c", 5)
	fn("app", 0x200, "worker_a", "/src/app.c", 20)
	fn("app", 0x300, "worker_b", "/src/app.c", 30)
	fn("app", 0x400, "worker", "", 0)
	fn("app", 0x500, "main", "/src/app.c", 50)
	fn("nodebug", 0x100, "leaky", "", 0)
	fn("nodebug", 0x200, "run", "", 0)
	fn("libc", 0x100, "start_thread", "./nptl/pthread_create.c", 442)
	fn("cudart", 0x100, "cudaMalloc", "", 0)
	// libffi's frames have no name, but their offsets are known.
	for _, o := range []uint64{0x640e, 0x6f7a} {
		syms = append(syms, tracefile.Symbol{BuildID: "ffi", Offset: o, VAddr: o}, tracefile.Symbol{BuildID: "ffi", Offset: o - 1, VAddr: o - 1})
	}
	var items []any
	for _, pid := range []uint32{7, 8} {
		items = append(items, (&procmodel.Capture{PID: pid, Comm: "app", Time: htmlBase, Maps: maps,
			Cmdline: []string{"/opt/app"}}).File())
	}
	items = append(items, &tracefile.Symbols{Frames: syms})
	cud := uint64(lCudart + 0x110)
	main := uint64(lApp + 0x510)
	stacks := []struct {
		api   events.API
		stack []uint64
	}{
		{events.CudaMalloc, []uint64{cud, lApp + 0x110, lApp + 0x210, main}},              // worker_a via cuda_malloc
		{events.CudaMalloc, []uint64{cud, lApp + 0x110, lApp + 0x310, main}},              // worker_b via cuda_malloc
		{events.CudaMalloc, []uint64{lApp + 0x410, main}},                                 // worker: three APIs
		{events.CudaMallocAsync, []uint64{lApp + 0x420, main}},                            //
		{events.CudaMallocManaged, []uint64{lApp + 0x430, main}},                          //
		{events.CudaMalloc, []uint64{cud, lFFI + 0x640e, lApp + 0x210, main}},             // libffi, two unnamed frames
		{events.CudaMalloc, []uint64{cud, lFFI + 0x6f7a, lApp + 0x210, main}},             //
		{events.CudaMalloc, []uint64{cud, lNoDbg + 0x110, lNoDbg + 0x210, lLibc + 0x110}}, // no debug information
	}
	tm := uint64(htmlBase)
	addr := uint64(0x7000_0000_0000)
	for _, pid := range []uint32{7, 8} {
		for i, s := range stacks {
			tm += ms
			addr += 1 << 30
			items = append(items, events.Event{Time: tm, PID: pid, TID: pid, Comm: "app", API: s.api, Addr: addr,
				Size: uint64(i+1) << 20, Duration: 1, Stack: s.stack})
		}
	}
	items = append(items, &tracefile.End{Time: tm + ms})
	path, _ := tracetest.Write(t, tracefile.Meta{Tool: "test", StartBoot: htmlBase, Host: "h"}, items...)
	return path
}

// Every distinct path of a process has its own label, the part that
// differs first (not the shared helper), the API where only it differs;
// unnamed frames keep their own offsets; a path's line is the user's.
func TestHTMLLabelsDistinct(t *testing.T) {
	d, _ := pageOf(t, labelsTrace(t), Options{})
	byPID := map[int64][]string{}
	lines := map[string]string{}
	for i := range d.Stacks.PID {
		l := d.Strings[d.Stacks.Label[i]]
		byPID[d.Stacks.PID[i]] = append(byPID[d.Stacks.PID[i]], l)
		lines[l] = d.Strings[d.Stacks.UserLine[i]]
	}
	for pid, ls := range byPID {
		if len(ls) != 8 {
			t.Errorf("pid %d: %d paths, want 8: %q", pid, len(ls), ls)
		}
		seen := map[string]bool{}
		for _, l := range ls {
			if seen[l] {
				t.Errorf("pid %d: two paths labelled %q: %q", pid, l, ls)
			}
			seen[l] = true
			if strings.HasPrefix(l, "cuda_malloc") {
				t.Errorf("label %q begins with the shared helper", l)
			}
		}
		for _, api := range []string{"cudaMalloc", "cudaMallocAsync", "cudaMallocManaged"} {
			if !slices.Contains(ls, "worker ← main (app.c:50) · "+api) {
				t.Errorf("pid %d: no label for worker's %s: %q", pid, api, ls)
			}
		}
	}
	for l, want := range map[string]string{"worker_b (app.c:30) ← main (app.c:50) · via cuda_malloc": "/src/app.c:30",
		"leaky ← run": "leaky"} {
		if got, ok := lines[l]; !ok || got != want {
			t.Errorf("path %q: line %q, want %q (labels %q)", l, got, want, byPID[7])
		}
	}
	var ffi []string
	for i := range d.Frames.Name {
		if strings.Contains(d.Strings[d.Frames.Module[i]], "libffi") {
			ffi = append(ffi, d.Strings[d.Frames.Label[i]])
		}
	}
	slices.Sort(ffi)
	if want := []string{fmt.Sprintf("libffi.so.8+%#x", 0x640e), fmt.Sprintf("libffi.so.8+%#x", 0x6f7a)}; !slices.Equal(ffi, want) {
		t.Errorf("libffi's frames %q, want %q", ffi, want)
	}
}
