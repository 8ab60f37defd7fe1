package symbolize

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cudatrace/cudatrace/proc"
)

// FuzzFrames feeds arbitrary bytes as a mapped ELF file. Nothing may panic,
// and the Frame must still say which module the address was in. The seeds
// (real fixtures, cut and corrupted) keep it quick as a unit test.
func FuzzFrames(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x7fELF"))
	f.Add([]byte("\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00\x3e\x00\x01\x00\x00\x00"))
	if _, err := os.Stat("/proc/self/exe"); err == nil {
		// Our own binary's start: real headers, sections beyond the cut.
		if b, err := readPrefix("/proc/self/exe", 64<<10); err == nil {
			f.Add(b)
		}
	}
	if fx := tryFixtures(); fx != nil {
		for _, p := range []string{fx.libStrip, fx.lib} {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
			f.Add(b[:len(b)/3])
			for _, at := range []int{0x20, 0x28, 0x3c, 0x40, 0x60, len(b) - 0x40, len(b) - 0x100} {
				c := bytes.Clone(b)
				if at > 0 && at < len(c) {
					c[at] ^= 0xff
					c[at+1] ^= 0x7f
				}
				f.Add(c)
			}
		}
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "fuzz.so")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		const start = 0x7f0000000000
		maps := []proc.Mapping{
			{Start: start, End: start + 0x1000, Offset: 0, Perms: "r--p", Inode: 1, Path: path},
			{Start: start + 0x1000, End: start + 0x100000, Offset: 0x1000, Perms: "r-xp", Inode: 1, Path: path},
		}
		addrs := []uint64{start, start + 1, start + 0x1000, start + 0x1181, start + 0x11b1, start + 0x5000, start + 0xfffff}
		// Frames recovers from panics; here they must not happen at all.
		panicHook = func(r any) { t.Fatalf("recovered panic: %v", r) }
		defer func() { panicHook = nil }()
		s := New()
		s.DebugDir = ""
		defer s.Close()
		got := s.Frames(maps, addrs)
		if len(got) != len(addrs) {
			t.Fatalf("%d frames for %d addresses", len(got), len(addrs))
		}
		for i, fr := range got {
			if fr.Addr != addrs[i] || fr.Module != path {
				t.Fatalf("frame %d: %+v", i, fr)
			}
		}
		BuildID(path)

		// The same bytes straight through the parser, with no file.
		if ef, err := elf.NewFile(bytes.NewReader(data)); err == nil {
			buildIDOf(ef)
			if mod, _ := parseModule(ef, "fuzz"); mod != nil {
				for _, a := range addrs {
					mod.function(a - start)
					mod.line(a - start)
				}
			}
		}
	})
}

// tryFixtures returns the compiled fixtures, or nil without the tools.
func tryFixtures() *fixtures {
	for _, tool := range []string{"gcc", "g++", "strip"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil
		}
	}
	fixOnce.Do(func() { fix.buildError = fix.build() })
	if fix.buildError != nil {
		return nil
	}
	return &fix
}

func readPrefix(path string, n int) ([]byte, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	b := make([]byte, n)
	m, _ := fd.Read(b)
	return b[:m], nil
}
