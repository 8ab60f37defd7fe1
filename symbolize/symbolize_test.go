package symbolize

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/cudatrace/cudatrace/proc"
)

// The fixture executable prints, in order: exe_work, lib_alloc,
// static_helper (a static function of the library), lib_versioned, then
// whatever it was asked to dlsym.
const (
	iExeWork = iota
	iLibAlloc
	iStatic
	iVersioned
	iDlsym
)

// checkFrame asserts what a user reads off a frame for a return address
// just past the start of function fn (addr+1).
func checkFrame(t *testing.T, got Frame, want Frame, src, fn string) {
	t.Helper()
	if got.Addr != want.Addr || got.Function != want.Function || got.Module != want.Module ||
		got.Offset != want.Offset || got.BuildID != want.BuildID {
		t.Errorf("frame for %s:\n got %+v\nwant %+v (File, Line aside)", fn, got, want)
	}
	if got.File != want.File {
		t.Errorf("%s: File = %q, want %q", fn, got.File, want.File)
	}
	if src != "" {
		lo, hi := funcLines(t, src, fn)
		if got.Line < lo || got.Line > hi {
			t.Errorf("%s: Line = %d, want within %s's lines %d-%d", fn, got.Line, fn, lo, hi)
		}
	}
}

func TestFramesPIEAndSharedLibrary(t *testing.T) {
	fx := getFixtures(t)
	addrs, maps := run(t, fx.exe)
	if len(addrs) != 4 {
		t.Fatalf("fixture printed %d addresses, want 4", len(addrs))
	}
	s := New()
	defer s.Close()

	in := []uint64{addrs[iExeWork] + 1, addrs[iLibAlloc] + 1, addrs[iStatic] + 1, addrs[iVersioned] + 1}
	got := s.Frames(maps, in)
	if len(got) != len(in) {
		t.Fatalf("got %d frames for %d addresses", len(got), len(in))
	}
	exeID, libID := readelfBuildID(t, fx.exe), readelfBuildID(t, fx.lib)

	checkFrame(t, got[0], Frame{
		Addr: in[0], Function: "exe_work", File: fx.exeSrc, Module: fx.exe,
		Offset: nmAddr(t, fx.exe, "exe_work", false) + 1, BuildID: exeID,
	}, fx.exeSrc, "exe_work")
	checkFrame(t, got[1], Frame{
		Addr: in[1], Function: "lib_alloc", File: fx.libSrc, Module: fx.lib,
		Offset: nmAddr(t, fx.lib, "lib_alloc", true) + 1, BuildID: libID,
	}, fx.libSrc, "lib_alloc")
	checkFrame(t, got[2], Frame{
		Addr: in[2], Function: "static_helper", File: fx.libSrc, Module: fx.lib,
		Offset: nmAddr(t, fx.lib, "static_helper", false) + 1, BuildID: libID,
	}, fx.libSrc, "static_helper")
	// Its .symtab name is "lib_versioned@@LIBDEMO_1.0".
	checkFrame(t, got[3], Frame{
		Addr: in[3], Function: "lib_versioned", File: fx.libSrc, Module: fx.lib,
		Offset: nmAddr(t, fx.lib, "lib_versioned", true) + 1, BuildID: libID,
	}, fx.libSrc, "lib_versioned_impl")

	// Lines must match binutils exactly, at function entries and inside
	// function bodies (where the -1 for return addresses matters).
	if _, err := exec.LookPath("addr2line"); err == nil {
		for _, c := range []struct {
			module string
			addr   uint64
		}{
			{fx.exe, addrs[iExeWork] + 1}, {fx.exe, addrs[iExeWork] + 9}, {fx.exe, addrs[iExeWork] + 20},
			{fx.lib, addrs[iLibAlloc] + 1}, {fx.lib, addrs[iLibAlloc] + 10},
			{fx.lib, addrs[iStatic] + 12}, {fx.lib, addrs[iStatic] + 30},
		} {
			f := s.Frames(maps, []uint64{c.addr})[0]
			want := addr2line(t, c.module, f.Offset-1)
			if got := fmt.Sprintf("%s:%d", f.File, f.Line); got != want {
				t.Errorf("%s+%#x: got %s, addr2line says %s", filepath.Base(c.module), f.Offset, got, want)
			}
		}
	}

	// Build IDs captured by the recorder, as it does, change nothing.
	withIDs := append([]proc.Mapping(nil), maps...)
	for i := range withIDs {
		if withIDs[i].Path == fx.lib || withIDs[i].Path == fx.exe {
			id, err := BuildID(withIDs[i].Path)
			if err != nil {
				t.Fatal(err)
			}
			withIDs[i].BuildID = id
		}
	}
	if again := s.Frames(withIDs, in); fmt.Sprint(again) != fmt.Sprint(got) {
		t.Errorf("with build IDs in mappings:\n got %+v\nwant %+v", again, got)
	}
}

func TestFramesNonPIEExecutable(t *testing.T) {
	fx := getFixtures(t)
	addrs, maps := run(t, fx.exeNoPIE)
	if len(addrs) != 4 {
		t.Fatalf("fixture printed %d addresses, want 4", len(addrs))
	}
	// ET_EXEC: the run-time address is the ELF address.
	if want := nmAddr(t, fx.exeNoPIE, "exe_work", false); addrs[iExeWork] != want {
		t.Fatalf("exe_work at %#x, nm says %#x: not a non-PIE executable?", addrs[iExeWork], want)
	}
	s := New()
	defer s.Close()
	// &lib_alloc in an ET_EXEC is its PLT stub in the executable, so the
	// library is checked through the address it hands out itself.
	got := s.Frames(maps, []uint64{addrs[iExeWork] + 1, addrs[iStatic] + 1})
	checkFrame(t, got[0], Frame{
		Addr: addrs[iExeWork] + 1, Function: "exe_work", File: fx.exeSrc, Module: fx.exeNoPIE,
		Offset: addrs[iExeWork] + 1, BuildID: readelfBuildID(t, fx.exeNoPIE),
	}, fx.exeSrc, "exe_work")
	checkFrame(t, got[1], Frame{
		Addr: addrs[iStatic] + 1, Function: "static_helper", File: fx.libSrc, Module: fx.lib,
		Offset: nmAddr(t, fx.lib, "static_helper", false) + 1, BuildID: readelfBuildID(t, fx.lib),
	}, fx.libSrc, "static_helper")
}

func TestFramesStrippedLibrary(t *testing.T) {
	fx := getFixtures(t)
	if out, _ := exec.Command("readelf", "-S", fx.libStrip).Output(); strings.Contains(string(out), ".symtab") {
		t.Fatalf("%s still has .symtab", fx.libStrip)
	}
	addrs, maps := run(t, fx.exe)
	// The process ran the unstripped library; strip keeps layout and build
	// ID, so the stripped copy stands for it.
	for i := range maps {
		if maps[i].Path == fx.lib {
			maps[i].Path = fx.libStrip
		}
	}
	s := New()
	s.DebugDir = ""
	defer s.Close()
	in := []uint64{addrs[iLibAlloc] + 1, addrs[iVersioned] + 1, addrs[iStatic] + 1}
	got := s.Frames(maps, in)
	id := readelfBuildID(t, fx.lib)
	want := []Frame{
		{Addr: in[0], Function: "lib_alloc", Module: fx.libStrip, Offset: nmAddr(t, fx.lib, "lib_alloc", true) + 1, BuildID: id},
		{Addr: in[1], Function: "lib_versioned", Module: fx.libStrip, Offset: nmAddr(t, fx.lib, "lib_versioned", true) + 1, BuildID: id},
		// Not exported, so not in .dynsym; and no exported function spans it.
		{Addr: in[2], Function: "", Module: fx.libStrip, Offset: nmAddr(t, fx.lib, "static_helper", false) + 1, BuildID: id},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("frame %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}

// A library stripped to .dynsym but carrying MiniDebugInfo names its
// static functions too; with a .gnu_debuglink to a debug file beside it,
// it has file:line as well.
func TestFramesMiniDebugInfoAndDebugLink(t *testing.T) {
	fx := getFixtures(t)
	addrs, maps := run(t, fx.exe)
	in := []uint64{addrs[iLibAlloc] + 1, addrs[iVersioned] + 1, addrs[iStatic] + 1}
	full := New()
	defer full.Close()
	ref := full.Frames(maps, in)
	if ref[2].Function != "static_helper" || ref[2].Line == 0 {
		t.Fatalf("unstripped: %+v", ref[2])
	}
	for _, c := range []struct {
		lib   string
		lines bool
	}{{fx.libMini, false}, {fx.libLinked, true}} {
		if out, _ := exec.Command("readelf", "-S", c.lib).Output(); strings.Contains(string(out), ".symtab") {
			t.Fatalf("%s still has .symtab", c.lib)
		}
		m := append([]proc.Mapping(nil), maps...)
		for i := range m {
			if m[i].Path == fx.lib {
				m[i].Path = c.lib
			}
		}
		s := New()
		s.DebugDir = "" // only the debug link may find libdemo.debug
		got := s.Frames(m, in)
		s.Close()
		for i := range ref {
			want := ref[i]
			want.Module = c.lib
			if !c.lines {
				want.File, want.Line = "", 0
			}
			if got[i] != want {
				t.Errorf("%s frame %d:\n got %+v\nwant %+v", filepath.Base(c.lib), i, got[i], want)
			}
		}
	}
}

func TestFramesCPlusPlus(t *testing.T) {
	fx := getFixtures(t)
	const mangled = "_ZN4demo6Widget8allocateEm"
	addrs, maps := run(t, fx.exe, fx.widget, mangled)
	if len(addrs) != 5 || addrs[iDlsym] == 0 {
		t.Fatalf("dlsym(%s) failed: %x", mangled, addrs)
	}
	s := New()
	defer s.Close()
	got := s.Frames(maps, []uint64{addrs[iDlsym] + 1})[0]
	checkFrame(t, got, Frame{
		Addr: addrs[iDlsym] + 1, Function: "demo::Widget::allocate(unsigned long)", File: fx.widgetSrc,
		Module: fx.widget, Offset: nmAddr(t, fx.widget, mangled, true) + 1, BuildID: readelfBuildID(t, fx.widget),
	}, fx.widgetSrc, "allocate")
}

func TestBuildID(t *testing.T) {
	fx := getFixtures(t)
	id, err := BuildID(fx.lib)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(id) {
		t.Errorf("BuildID(%s) = %q, want 40 hex digits (sha1)", fx.lib, id)
	}
	if want := readelfBuildID(t, fx.lib); id != want {
		t.Errorf("BuildID(%s) = %q, readelf says %q", fx.lib, id, want)
	}
	if stripped, err := BuildID(fx.libStrip); err != nil || stripped != id {
		t.Errorf("BuildID(stripped) = %q, %v; want %q", stripped, err, id)
	}

	id, err = BuildID(fx.noBuildID)
	if id != "" || err != nil {
		t.Errorf("BuildID(--build-id=none) = %q, %v; want \"\", nil", id, err)
	}

	notELF := filepath.Join(t.TempDir(), "text")
	os.WriteFile(notELF, []byte("hello, not an ELF file\n"), 0o644)
	for _, p := range []string{notELF, filepath.Join(t.TempDir(), "missing"), t.TempDir()} {
		if id, err := BuildID(p); err == nil || id != "" {
			t.Errorf("BuildID(%s) = %q, %v; want an error", p, id, err)
		} else if !strings.Contains(err.Error(), p) {
			t.Errorf("BuildID(%s) error %q does not name the file", p, err)
		}
	}
}

func TestFramesBuildIDMismatch(t *testing.T) {
	fx := getFixtures(t)
	addrs, maps := run(t, fx.exe)
	const stale = "0123456789abcdef0123456789abcdef01234567"
	for i := range maps {
		if maps[i].Path == fx.lib {
			maps[i].BuildID = stale
		}
	}
	s := New()
	defer s.Close()
	got := s.Frames(maps, []uint64{addrs[iLibAlloc] + 1, addrs[iExeWork] + 1})
	if want := (Frame{Addr: addrs[iLibAlloc] + 1, Module: fx.lib, BuildID: stale}); got[0] != want {
		t.Errorf("library replaced on disk:\n got %+v\nwant %+v", got[0], want)
	}
	if got[1].Function != "exe_work" {
		t.Errorf("executable frame = %+v, want exe_work: only the replaced file is distrusted", got[1])
	}
}

// TestFramesFileReplacedInPlace: the cache must notice a file rewritten
// under the same path between two calls.
func TestFramesFileReplacedInPlace(t *testing.T) {
	fx := getFixtures(t)
	addrs, maps := run(t, fx.exe)
	dir := t.TempDir()
	copyPath := filepath.Join(dir, "libdemo.so")
	copyFile(t, fx.lib, copyPath)
	id, err := BuildID(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	for i := range maps {
		if maps[i].Path == fx.lib {
			maps[i].Path, maps[i].BuildID = copyPath, id
		}
	}
	s := New()
	defer s.Close()
	in := []uint64{addrs[iLibAlloc] + 1}
	if got := s.Frames(maps, in)[0].Function; got != "lib_alloc" {
		t.Fatalf("before replacement: Function = %q, want lib_alloc", got)
	}
	copyFile(t, fx.widget, copyPath)
	if got := s.Frames(maps, in)[0]; got.Function != "lib_alloc" || got.BuildID != id {
		t.Errorf("after replacement: %+v, want lib_alloc from the parse of the build ID it ran, cached", got)
	}
	if got := New().Frames(maps, in)[0]; got.Function != "" || got.File != "" || got.BuildID != id {
		t.Errorf("after replacement, nothing cached: %+v, want no function and the recorded build ID", got)
	}
	noID := append([]proc.Mapping(nil), maps...)
	for i := range noID {
		noID[i].BuildID = ""
	}
	if got := s.Frames(noID, in)[0]; got.Function == "lib_alloc" {
		t.Errorf("after replacement, no build ID recorded: %+v; the cache kept the old file", got)
	}
}

func TestFramesSharesParseByBuildID(t *testing.T) {
	fx := getFixtures(t)
	addrs, maps := run(t, fx.exe)
	other := filepath.Join(t.TempDir(), "copy.so")
	copyFile(t, fx.lib, other)
	moved := append([]proc.Mapping(nil), maps...)
	for i := range moved {
		if moved[i].Path == fx.lib {
			moved[i].Path = other
		}
	}
	s := New()
	defer s.Close()
	a := s.Frames(maps, []uint64{addrs[iLibAlloc] + 1})[0]
	b := s.Frames(moved, []uint64{addrs[iLibAlloc] + 1})[0]
	if a.Function != "lib_alloc" || b.Function != "lib_alloc" || b.Module != other {
		t.Errorf("frames %+v, %+v", a, b)
	}
	s.mu.Lock()
	n := len(s.byBuildID)
	s.mu.Unlock()
	if n != 1 {
		t.Errorf("%d modules cached by build ID, want 1: the copy should reuse the library's", n)
	}
	s.Close()
	if s.byFile == nil || len(s.byFile) != 0 || len(s.byBuildID) != 0 {
		t.Errorf("Close left caches: %d by file, %d by build ID", len(s.byFile), len(s.byBuildID))
	}
	if c := s.Frames(maps, []uint64{addrs[iLibAlloc] + 1})[0]; c != a {
		t.Errorf("after Close: %+v, want %+v", c, a)
	}
}

func TestFramesKeepsNoFiles(t *testing.T) {
	fx := getFixtures(t)
	addrs, maps := run(t, fx.exe)
	before := openFDs(t)
	s := New()
	for i := 0; i < 3; i++ {
		s.Frames(maps, addrs)
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after symbolizing, %d before", after, before)
	}
	s.Close()
}

func TestFramesConcurrent(t *testing.T) {
	fx := getFixtures(t)
	addrs, maps := run(t, fx.exe)
	s := New()
	defer s.Close()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if f := s.Frames(maps, []uint64{addrs[iLibAlloc] + 1})[0]; f.Function != "lib_alloc" {
				t.Errorf("concurrent Frames: %+v", f)
			}
		}()
	}
	wg.Wait()
}

func TestFramesGarbage(t *testing.T) {
	fx := getFixtures(t)
	dir := t.TempDir()
	text := filepath.Join(dir, "text.so")
	os.WriteFile(text, []byte(strings.Repeat("not an ELF file\n", 1000)), 0o644)
	lib, err := os.ReadFile(fx.lib)
	if err != nil {
		t.Fatal(err)
	}
	truncHeaders := filepath.Join(dir, "trunc-headers.so")
	os.WriteFile(truncHeaders, lib[:100], 0o644)
	truncHalf := filepath.Join(dir, "trunc-half.so")
	os.WriteFile(truncHalf, lib[:len(lib)/2], 0o644)
	missing := filepath.Join(dir, "missing.so")

	const base = 0x7f0000000000
	mapping := func(start uint64, path string) proc.Mapping {
		return proc.Mapping{Start: start, End: start + 0x10000, Offset: 0x1000, Perms: "r-xp", Inode: 1, Path: path}
	}
	maps := []proc.Mapping{
		mapping(base+0x100000, missing),
		mapping(base+0x200000, text),
		mapping(base+0x300000, truncHeaders),
		mapping(base+0x400000, truncHalf),
		mapping(base+0x500000, dir),         // a directory
		mapping(base+0x600000, "/dev/zero"), // a device: must not even be read
		{Start: base + 0x700000, End: base + 0x710000, Perms: "rw-p"},
		{Start: base + 0x800000, End: base + 0x802000, Perms: "r-xp", Path: "[vdso]"},
	}
	cases := []struct {
		addr   uint64
		module string
	}{
		{0, ""},
		{1, ""},
		{base, ""},            // before every mapping
		{base + 0x110000, ""}, // one past the end of the first
		{^uint64(0), ""},      // after every mapping
		{base + 0x100010, missing},
		{base + 0x200010, text},
		{base + 0x300010, truncHeaders},
		{base + 0x400180, truncHalf},
		{base + 0x500010, dir},
		{base + 0x600010, "/dev/zero"},
		{base + 0x700010, "[anon]"},
		{base + 0x800010, "[vdso]"},
	}
	var addrs []uint64
	for _, c := range cases {
		addrs = append(addrs, c.addr)
	}
	s := New()
	defer s.Close()
	got := s.Frames(maps, addrs)
	for i, c := range cases {
		f := got[i]
		if f != (Frame{Addr: c.addr, Module: c.module}) {
			t.Errorf("%#x: %+v, want module %q and nothing else", c.addr, f, c.module)
		}
	}
	if got := s.Frames(nil, addrs); len(got) != len(addrs) || got[0] != (Frame{}) {
		t.Errorf("no mappings: %+v", got)
	}
	if got := s.Frames(maps, nil); len(got) != 0 {
		t.Errorf("no addresses: %+v", got)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	// Through a new file, as an installer replaces a library.
	tmp := to + ".tmp"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors: %v", err)
	}
	return len(ents)
}
