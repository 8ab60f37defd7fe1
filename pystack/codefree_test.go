package pystack

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// codeDeallocOffset is the file offset of code_dealloc in the file at
// path, from its full symbol table.
func codeDeallocOffset(t *testing.T, path string) uint64 {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, s := range syms {
		if s.Name != "code_dealloc" || elf.ST_TYPE(s.Info) != elf.STT_FUNC {
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && p.Vaddr <= s.Value && s.Value < p.Vaddr+p.Filesz {
				return s.Value - p.Vaddr + p.Off
			}
		}
	}
	t.Fatalf("%s: no code_dealloc in its symbol table", path)
	return 0
}

// TestCodeFreeSite: where a probe counts the code objects a CPython 3.10
// to 3.13 frees, found from PyCode_Type's tp_dealloc. pyenv's libpython,
// stripped of every symbol but the dynamic ones, gives it through its
// relocation: the offset its unstripped copy's symbol table names
// code_dealloc at. Debian sid's python3.13, an executable at a fixed
// address without a symbol table, through the word in its data: a place
// in its code. 3.14 and 3.15 count their frees themselves: none.
func TestCodeFreeSite(t *testing.T) {
	for _, v := range []string{"3.10", "3.11", "3.12", "3.13"} {
		t.Run(v, func(t *testing.T) {
			lib := pyenvLib(t, v)
			want := codeDeallocOffset(t, lib)
			stripped := filepath.Join(t.TempDir(), filepath.Base(lib))
			if b, err := exec.Command("strip", "--strip-all", "-o", stripped, lib).CombinedOutput(); err != nil {
				t.Fatalf("strip: %v: %s", err, b)
			}
			if f, err := elf.Open(stripped); err != nil {
				t.Fatal(err)
			} else {
				if s := f.Section(".symtab"); s != nil {
					t.Fatalf("%s still has a symbol table", stripped)
				}
				f.Close()
			}
			in, err := DetectFile(stripped)
			if err != nil || in == nil {
				t.Fatalf("DetectFile(%s) = %v, %v", stripped, in, err)
			}
			if off, ok := in.CodeFreeSite(); !ok || off != want {
				t.Errorf("CodeFreeSite() = %#x, %v; want %#x, code_dealloc's", off, ok, want)
			}
		})
	}
	for _, v := range []string{"3.13", "3.14", "3.15"} {
		t.Run("sid-"+v, func(t *testing.T) {
			root, python := testenv.SidPython(t, v)
			path := filepath.Join(root, python)
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Type != elf.ET_EXEC || f.Section(".symtab") != nil {
				t.Fatalf("%s: want an executable at a fixed address without a symbol table", path)
			}
			in, err := DetectFile(path)
			if err != nil || in == nil {
				t.Fatalf("DetectFile(%s) = %v, %v", path, in, err)
			}
			off, ok := in.CodeFreeSite()
			if v != "3.13" {
				if ok {
					t.Errorf("CodeFreeSite() = %#x for CPython %s, which counts its own", off, v)
				}
				return
			}
			text := f.Section(".text")
			if !ok || text == nil || off < text.Offset || off >= text.Offset+text.Size {
				t.Fatalf("CodeFreeSite() = %#x, %v; want a place in .text", off, ok)
			}
		})
	}
}
