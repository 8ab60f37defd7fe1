package report

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/tracefile"
)

// diffTrace: one process, its program mapped at load (ASLR: each run's
// differs), weights from one stack (kept), a scratch buffer from another
// (freed: only at the peak), a NCCL buffer from a third.
func diffTrace(t *testing.T, dir string, pid uint32, load, weights, scratch uint64) string {
	t.Helper()
	ev := func(tm uint64, api events.API, addr, size uint64, stack ...uint64) events.Event {
		return events.Event{Time: base + tm, PID: pid, TID: pid, Comm: "job", API: api, Addr: addr, Size: size, Stack: stack}
	}
	path, _ := tracetest.Write(t, testMeta(),
		&tracefile.Process{PID: pid, Comm: "job", Time: base + 1, Maps: []tracefile.Mapping{
			{Start: load, End: load + 0x1000, Perms: "r-xp", Path: dir + "/job"},
			{Start: load + 0x10000, End: load + 0x11000, Perms: "r-xp", Path: dir + "/libnccl.so.2"}}},
		ev(10, events.CudaMalloc, 0xa000, weights, load+0x10, load+0x20),
		ev(20, events.CudaMalloc, 0xb000, 4096, load+0x10010, load+0x30),
		ev(30, events.CudaMalloc, 0xc000, scratch, load+0x40),
		events.Event{Time: base + 40, PID: pid, TID: pid, Comm: "job", API: events.CudaFree, Addr: 0xc000, Flags: events.FlagEntryOnly},
		&tracefile.End{Time: base + 100, Events: 4},
	)
	return path
}

func TestDiff(t *testing.T) {
	// Real ELF files, so that frames have offsets in them: the same in
	// both runs, wherever the files were mapped.
	dir := t.TempDir()
	for _, name := range []string{"job", "libnccl.so.2"} {
		if err := os.Symlink("/bin/true", filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	a := diffTrace(t, dir, 100, 0x400000, 1000, 300)
	b := diffTrace(t, dir, 200, 0x7f0000, 1500, 200)
	d, err := LoadDiff(a, b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d.PeakBytes != (Delta{A: 1000 + 4096 + 300, B: 1500 + 4096 + 200, Delta: 400}) {
		t.Errorf("peak %+v", d.PeakBytes)
	}
	if d.LiveBytes != (Delta{A: 5096, B: 5596, Delta: 500}) {
		t.Errorf("live %+v", d.LiveBytes)
	}
	wantOwners := []OwnerDelta{
		{Owner: "application", Live: Delta{1000, 1500, 500}, Peak: Delta{1300, 1700, 400}},
		{Owner: "nccl", Live: Delta{4096, 4096, 0}, Peak: Delta{4096, 4096, 0}},
	}
	if !reflect.DeepEqual(d.Owners, wantOwners) {
		t.Errorf("owners %+v, want %+v", d.Owners, wantOwners)
	}
	// Matched across the runs' addresses: the weights' stack, then the
	// scratch buffer's; NCCL's is the same in both.
	if len(d.Stacks) != 2 || d.Unchanged != 1 {
		t.Fatalf("%d stacks changed, %d unchanged: %+v", len(d.Stacks), d.Unchanged, d.Stacks)
	}
	if s := d.Stacks[0]; s.Live != (Delta{1000, 1500, 500}) || s.Peak != (Delta{1000, 1500, 500}) ||
		s.Alloc != (Delta{1000, 1500, 500}) || len(s.Frames) != 2 || s.Frames[0].Address != "0x7f0010" {
		t.Errorf("weights' stack %+v", s)
	}
	if s := d.Stacks[1]; s.Live != (Delta{0, 0, 0}) || s.Peak != (Delta{300, 200, -100}) || s.Alloc != (Delta{300, 200, -100}) {
		t.Errorf("scratch stack %+v", s)
	}
	var buf bytes.Buffer
	if err := d.WriteText(&buf, 10); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"peak         5.3 KiB  5.7 KiB  +400 B", "application  1.3 KiB  1.7 KiB  +400 B",
		"[2] at the peak -100 B (300 B -> 200 B); live at end 0 B (0 B -> 0 B); allocated -100 B"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, buf.String())
		}
	}
	buf.Reset()
	if err := d.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if p := m["peak_bytes"].(map[string]any); p["delta"] != 400.0 {
		t.Errorf("JSON peak_bytes %v", p)
	}
}
