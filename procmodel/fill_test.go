package procmodel

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cudatrace/cudatrace/jobid"
	"github.com/cudatrace/cudatrace/proc"
)

// A capture read as its process exits may hold part of its mappings: the
// capture a note read at its last load fills in the rest, but never a
// mapping overlapping one read now, nor from another process or a
// capture that failed.
func TestFill(t *testing.T) {
	lib := func(start uint64, path string) proc.Mapping {
		return proc.Mapping{Start: start, End: start + 0x1000, Perms: "r-xp", Path: path, Inode: start}
	}
	pending := &Capture{PID: 7, Start: 100, Maps: []proc.Mapping{
		lib(0x1000, "/usr/bin/python3"), lib(0x7000, "/lib/libffi.so.8"), lib(0x9000, "/lib/libpython3.12.so"),
		lib(0xb000, "/lib/libc.so.6")}}
	partial := func() *Capture {
		// libffi was dlclosed and another library mapped at its place.
		return &Capture{PID: 7, Start: 100, Maps: []proc.Mapping{lib(0x1000, "/usr/bin/python3"), lib(0x7800, "/lib/libz.so.1")}}
	}
	c := partial()
	c.Fill(pending)
	if got, want := paths(c.Maps), "[0x1000 /usr/bin/python3 0x7800 /lib/libz.so.1 0x9000 /lib/libpython3.12.so 0xb000 /lib/libc.so.6]"; got != want {
		t.Errorf("filled: %s\nwant    %s", got, want)
	}
	for name, from := range map[string]*Capture{
		"another process":           {PID: 8, Start: 100, Maps: pending.Maps},
		"another process, same PID": {PID: 7, Start: 200, Maps: pending.Maps},
		"none":                      nil,
	} {
		c := partial()
		c.Fill(from)
		if len(c.Maps) != 2 {
			t.Errorf("filled from %s: %s", name, paths(c.Maps))
		}
	}
	failed := &Capture{PID: 7, Error: "exited before its mappings could be read"}
	failed.Fill(pending)
	if len(failed.Maps) != 0 {
		t.Errorf("a failed capture filled: %s (the caller takes the note's capture whole)", paths(failed.Maps))
	}
	// Read could not tell when the process started (it is gone): the
	// same process.
	gone := partial()
	gone.Start = 0
	gone.Fill(pending)
	if len(gone.Maps) != 4 {
		t.Errorf("a capture without its start filled: %s", paths(gone.Maps))
	}
}

func paths(maps []proc.Mapping) string {
	var out []string
	for _, m := range maps {
		out = append(out, fmt.Sprintf("%#x %s", m.Start, m.Path))
	}
	return fmt.Sprint(out)
}

// TestReadStartFromPrev: a process reaped between the reads of one capture
// (its mappings read, its stat no longer) is the process prev captured:
// it keeps prev's start, by which the report tells whether it ran before
// the trace began, and prev's job. A /proc of its own holds only the
// mappings.
func TestReadStartFromPrev(t *testing.T) {
	root := t.TempDir()
	const pid = 4242
	if err := os.MkdirAll(filepath.Join(root, "4242"), 0o755); err != nil {
		t.Fatal(err)
	}
	line := "7f0000000000-7f0000001000 r-xp 00001000 08:01 1234 /usr/lib/libcuda.so.1\n"
	if err := os.WriteFile(filepath.Join(root, "4242", "maps"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	old := proc.Root
	proc.Root = root
	t.Cleanup(func() { proc.Root = old })

	var ids BuildIDs
	prev := &Capture{PID: pid, Start: 123_450_000_000, Job: &jobid.Identity{Job: "torchrun:job-7", Rank: 3}}
	c, _ := Read(pid, "python3", 9, &ids, prev)
	if c.Error != "" || len(c.Maps) != 1 || c.Maps[0].Path != "/usr/lib/libcuda.so.1" {
		t.Fatalf("capture: error %q, maps %+v; want the one mapping", c.Error, c.Maps)
	}
	if c.Start != prev.Start || c.Job != prev.Job {
		t.Errorf("start %d, job %+v; want prev's %d, %+v", c.Start, c.Job, prev.Start, prev.Job)
	}
	// Another PID's capture is no prev of this one.
	other := &Capture{PID: pid + 1, Start: prev.Start}
	if c, _ := Read(pid, "python3", 9, &ids, other); c.Start != 0 {
		t.Errorf("start %d from another process's capture, want 0 (unknown)", c.Start)
	}
}
