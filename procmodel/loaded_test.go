package procmodel

import (
	"debug/elf"
	"os"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
)

// TestFillLoaded: a capture read as its process exited that lacks a
// library's code gets it from what the process's loader reported (its
// file's executable segments moved by its load bias), and nothing where
// the read has that file or something at those addresses.
func TestFillLoaded(t *testing.T) {
	exe, err := os.Executable() // an ELF file this test can open: the test binary
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	entry := f.Entry
	f.Close()
	const bias = 0x7f0000000000
	at := bias + entry // an address in the object's code
	other := proc.Mapping{Start: 0x1000, End: 0x2000, Perms: "r-xp", Path: "/usr/bin/python3", Inode: 1}
	var ids BuildIDs

	c := &Capture{PID: 7, Maps: []proc.Mapping{other}}
	c.FillLoaded([]events.LoadedObject{{Path: exe, Bias: bias}}, "", &ids)
	i := proc.Find(c.Maps, at)
	if i < 0 || c.Maps[i].Path != exe || c.Maps[i].Perms != "r-xp" || c.Maps[i].Inode == 0 {
		t.Fatalf("after FillLoaded, %#x is in no r-xp mapping of %s: %+v", at, exe, c.Maps)
	}
	if c.Maps[0] != other {
		t.Errorf("the mapping read was changed: %+v", c.Maps[0])
	}

	// The program's own entry (no path) is exe.
	c = &Capture{PID: 7, Maps: []proc.Mapping{other}}
	c.FillLoaded([]events.LoadedObject{{Bias: bias}}, exe, &ids)
	if i := proc.Find(c.Maps, at); i < 0 || c.Maps[i].Path != exe {
		t.Errorf("the program's own object: %#x not mapped to %s: %+v", at, exe, c.Maps)
	}

	// Nothing added where the read has the file, where another file's
	// mapping read overlaps, or to a capture that failed.
	for name, c := range map[string]*Capture{
		"file read":      {PID: 7, Maps: []proc.Mapping{{Start: 0x5000, End: 0x6000, Perms: "r-xp", Path: exe, Inode: 2}}},
		"overlapped":     {PID: 7, Maps: []proc.Mapping{{Start: at &^ 0xfff, End: at&^0xfff + 0x1000, Perms: "r-xp", Path: "/lib/libz.so.1", Inode: 3}}},
		"capture failed": {PID: 7, Error: "exited"},
	} {
		n := len(c.Maps)
		c.FillLoaded([]events.LoadedObject{{Path: exe, Bias: bias}}, "", &ids)
		if len(c.Maps) != n {
			t.Errorf("%s: FillLoaded added %d mappings: %+v", name, len(c.Maps)-n, c.Maps)
		}
	}
}
