package symbolize

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/proc"
	"golang.org/x/sys/unix"
)

// fakeContainer makes a /proc under a temporary directory in which pid
// runs, started at tick start, with root as its own root directory, and
// points proc.Root at it for the test.
func fakeContainer(t *testing.T, procDir string, pid int, start uint64) (root string) {
	t.Helper()
	dir := filepath.Join(procDir, fmt.Sprint(pid))
	root = filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	// Field 22 of stat is the start time in clock ticks.
	fields := append([]string{"S"}, strings.Split(strings.Repeat("0 ", 18), " ")[:18]...)
	fields = append(fields, fmt.Sprint(start), "0", "0")
	stat := fmt.Sprintf("%d (demo) %s\n", pid, strings.Join(fields, " "))
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestFramesOfContainer: a container's library sits at a path where the
// host has another file (or none). While the process lives its own file
// names the frame; once it is gone only a file with its build ID does
// (the host's, a parse cached while it lived, a debug file installed by
// build ID), and the frames nothing names are counted.
func TestFramesOfContainer(t *testing.T) {
	fx := getFixtures(t)
	addrs, maps := run(t, fx.exe)
	libID := readelfBuildID(t, fx.lib)
	hostDir := t.TempDir()
	path := filepath.Join(hostDir, "app", "libdemo.so") // the path inside the container
	var ctrMaps []proc.Mapping
	for _, m := range maps {
		if m.Path == fx.lib {
			m.Path, m.BuildID = path, libID
			ctrMaps = append(ctrMaps, m)
		}
	}
	if len(ctrMaps) == 0 {
		t.Fatalf("no mapping of %s in %+v", fx.lib, maps)
	}
	procDir := t.TempDir()
	old := proc.Root
	proc.Root = procDir
	t.Cleanup(func() { proc.Root = old })
	const pid, ticks = 4242, 777
	// Each container's maps show its own copy's device and inode: the
	// file a live one's mapping is read from must be that very file.
	own := map[int][]proc.Mapping{}
	for _, p := range []int{pid, pid + 1} {
		root := fakeContainer(t, procDir, p, ticks)
		install(t, fx.lib, filepath.Join(root, path))
		own[p] = asFile(t, ctrMaps, filepath.Join(root, path))
	}
	start := uint64(ticks) * 1e7 // 100 ticks a second
	if st, err := proc.StartTime(pid); err != nil || st != start {
		t.Fatalf("fake stat reads start %d, %v; want %d", st, err, start)
	}
	in := []uint64{addrs[iLibAlloc] + 1}
	live := Proc{PID: pid, Start: start, OwnRoot: true}
	gone := Proc{PID: pid, Start: start + 1e7, OwnRoot: true} // the PID names another process now
	named := func(f Frame) bool {
		return f.Function == "lib_alloc" && f.Module == path && f.File == fx.libSrc && f.BuildID == libID
	}

	// The host has no file at the path.
	s := New()
	s.DebugDir = ""
	if f := s.FramesOf(Proc{}, ctrMaps, in)[0]; f.Function != "" {
		t.Errorf("the mappings read as the host's: %+v, want no function (no such host file)", f)
	}
	if f := s.FramesOf(live, own[pid], in)[0]; !named(f) {
		t.Errorf("live container process: %+v, want lib_alloc from its own root", f)
	}
	// Another file at the path than the one mapped is not read.
	if f := New().FramesOf(live, own[pid+1], in)[0]; f.Function != "" {
		t.Errorf("live container process, another file at its path than it maps: %+v, want no function", f)
	}
	// Another container with the same binary shares the parse.
	s.FramesOf(Proc{PID: pid + 1, Start: start, OwnRoot: true}, own[pid+1], in)
	if n := len(s.byBuildID); n != 1 {
		t.Errorf("%d parses cached by build ID for one binary in two containers, want 1", n)
	}
	// Gone, after it was seen alive: the parse cached by build ID serves.
	if f := s.FramesOf(gone, ctrMaps, in)[0]; !named(f) || s.Gone() != 0 {
		t.Errorf("gone, parsed while alive: %+v (gone count %d), want lib_alloc and 0", f, s.Gone())
	}

	// Gone, never seen alive, and the host holds another binary there.
	install(t, fx.widget, path)
	s = New()
	s.DebugDir = ""
	f := s.FramesOf(gone, ctrMaps, in)[0]
	if want := (Frame{Addr: in[0], Module: path, BuildID: libID}); f != want {
		t.Errorf("gone, host file differs:\n got %+v\nwant %+v", f, want)
	}
	if s.Gone() != 1 {
		t.Errorf("Gone() = %d, want 1", s.Gone())
	}
	// Without a build ID nothing tells the host's file from the
	// container's: not even an identical one names the frame once it is gone.
	copyFile(t, fx.lib, path)
	noID := append([]proc.Mapping(nil), own[pid]...)
	for i := range noID {
		noID[i].BuildID = ""
	}
	s = New()
	if f := s.FramesOf(gone, asFile(t, noID, path), in)[0]; f.Function != "" || s.Gone() != 1 {
		t.Errorf("gone, no build ID: %+v (gone count %d), want no function and 1", f, s.Gone())
	}
	if f := s.FramesOf(live, noID, in)[0]; f.Function != "lib_alloc" {
		t.Errorf("live, no build ID: %+v, want lib_alloc from its own root", f)
	}
	// The host file with the same build ID serves.
	if f := s.FramesOf(gone, ctrMaps, in)[0]; !named(f) {
		t.Errorf("gone, host file with its build ID: %+v, want lib_alloc", f)
	}

	// Gone; the host's file differs; a debug file installed by build ID.
	copyFile(t, fx.widget, path)
	debug := t.TempDir()
	install(t, filepath.Join(fx.dir, "libdemo.debug"), filepath.Join(debug, ".build-id", libID[:2], libID[2:]+".debug"))
	s = New()
	s.DebugDir = debug
	if f := s.FramesOf(gone, ctrMaps, in)[0]; !named(f) || s.Gone() != 0 {
		t.Errorf("gone, debug file by build ID: %+v (gone count %d), want lib_alloc and 0", f, s.Gone())
	}

	// Gone; the host's file differs; the recorder named the address while
	// it ran (by build ID and file offset).
	var m proc.Mapping
	for _, c := range ctrMaps {
		if in[0] >= c.Start && in[0] < c.End {
			m = c
		}
	}
	s = New()
	s.DebugDir = ""
	rec := Frame{Function: "lib_alloc", File: fx.libSrc, Line: 14, Offset: 0x1181}
	s.Known(strings.ToUpper(libID), in[0]-m.Start+m.Offset, rec)
	s.Known(libID, in[0]-m.Start+m.Offset+1, Frame{Function: "elsewhere"})
	want := Frame{Addr: in[0], Function: "lib_alloc", File: fx.libSrc, Line: 14, Module: path, Offset: 0x1181, BuildID: libID}
	if f := s.FramesOf(gone, ctrMaps, in)[0]; f != want || s.Gone() != 0 {
		t.Errorf("gone, named at record time:\n got %+v\nwant %+v (gone count %d, want 0)", f, want, s.Gone())
	}
	// A file with the build ID, when there is one, is read instead.
	install(t, fx.lib, path)
	if f := s.FramesOf(gone, ctrMaps, in)[0]; !named(f) {
		t.Errorf("gone, host file with its build ID and a recorded name: %+v", f)
	}
}

// asFile returns maps as they would read were their file the one at
// path: its device and inode.
func asFile(t *testing.T, maps []proc.Mapping, path string) []proc.Mapping {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	out := append([]proc.Mapping(nil), maps...)
	for i := range out {
		out[i].Dev = fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev))
		out[i].Inode = st.Ino
	}
	return out
}

// install copies from to to, making to's directory.
func install(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, from, to)
}
