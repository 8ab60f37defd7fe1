package loader

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/proc"
)

func TestParseUSDTArgs(t *testing.T) {
	got, err := parseUSDTArgs(elf.EM_X86_64, "8@%rax -1@%bpl 8@-24(%rbp) -4@$-7 4@(%rsi) 8@0x10(%r12)")
	if err != nil {
		t.Fatal(err)
	}
	want := []USDTArg{
		{Kind: USDTReg, Size: 8, RegOff: 80},
		{Kind: USDTReg, Size: -1, RegOff: 32},
		{Kind: USDTMem, Size: 8, RegOff: 32, Value: -24},
		{Kind: USDTConst, Size: -4, Value: -7},
		{Kind: USDTMem, Size: 4, RegOff: 104},
		{Kind: USDTMem, Size: 8, RegOff: 24, Value: 16},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	for _, bad := range []string{"8%rax", "3@%rax", "8@%xmm0", "8@(%rax,%rbx,8)", "8@rax", "x@%rax", "8@$zz"} {
		if _, err := parseUSDTArgs(elf.EM_X86_64, bad); err == nil {
			t.Errorf("parseUSDTArgs(%q) accepted", bad)
		}
	}
}

// arm64's operands, as GCC writes them for PyTorch's aarch64 wheels'
// probes (and as TestReadUSDTARM64 finds in a library it builds): a
// register, a constant without '$', memory at a register plus an offset,
// and offsets into struct user_pt_regs (x0-x30 at 8 bytes each, then sp).
func TestParseUSDTArgsARM64(t *testing.T) {
	got, err := parseUSDTArgs(elf.EM_AARCH64, "8@x0 -1@x20 -4@-7 8@[sp, 24] -8@[x22, 24] 8@[x19] -4@[x29, -12] -4@w3 8@x30 4@0x10 8@[x1, #8]")
	if err != nil {
		t.Fatal(err)
	}
	want := []USDTArg{
		{Kind: USDTReg, Size: 8, RegOff: 0},
		{Kind: USDTReg, Size: -1, RegOff: 160},
		{Kind: USDTConst, Size: -4, Value: -7},
		{Kind: USDTMem, Size: 8, RegOff: 248, Value: 24},
		{Kind: USDTMem, Size: -8, RegOff: 176, Value: 24},
		{Kind: USDTMem, Size: 8, RegOff: 152},
		{Kind: USDTMem, Size: -4, RegOff: 232, Value: -12},
		{Kind: USDTReg, Size: -4, RegOff: 24},
		{Kind: USDTReg, Size: 8, RegOff: 240},
		{Kind: USDTConst, Size: 4, Value: 16},
		{Kind: USDTMem, Size: 8, RegOff: 8, Value: 8},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	for _, bad := range []string{"8@x31", "8@pc", "8@%rax", "8@-24(%rbp)", "8@[x0, y]", "8@[q1]", "3@x0", "8@v0", "8@"} {
		if _, err := parseUSDTArgs(elf.EM_AARCH64, bad); err == nil {
			t.Errorf("parseUSDTArgs(arm64, %q) accepted", bad)
		}
	}
	if _, err := parseUSDTArgs(elf.EM_RISCV, "8@a0"); err == nil {
		t.Error("parseUSDTArgs accepted a RISC-V note")
	}
}

// The notes of a library built with sys/sdt.h, semaphores included, as
// readelf -n shows them: built for x86-64, and for arm64 with Debian's
// cross compiler (gcc-aarch64-linux-gnu), whose notes are in arm64's
// operand syntax.
func TestReadUSDT(t *testing.T) {
	sdt := "/usr/include/x86_64-linux-gnu/sys/sdt.h"
	if _, err := os.Stat(sdt); err != nil {
		testenv.SkipOrFail(t, "sys/sdt.h (systemtap-sdt-dev): %v", err)
	}
	for _, cc := range []string{"gcc", "aarch64-linux-gnu-gcc"} {
		t.Run(cc, func(t *testing.T) {
			gcc := testenv.LookPath(t, cc)
			dir := t.TempDir()
			// sys/sdt.h is the same for every architecture; Debian installs
			// it for the host's only.
			inc := filepath.Join(dir, "include")
			if err := os.MkdirAll(filepath.Join(inc, "sys"), 0o755); err != nil {
				t.Fatal(err)
			}
			for _, h := range []string{"sdt.h", "sdt-config.h"} {
				if err := os.Symlink(filepath.Join(filepath.Dir(sdt), h), filepath.Join(inc, "sys", h)); err != nil {
					t.Fatal(err)
				}
			}
			checkReadUSDT(t, gcc, "-I"+inc, dir)
		})
	}
}

func checkReadUSDT(t *testing.T, gcc, inc, dir string) {
	lib := buildSDTLib(t, gcc, inc, dir)
	probes, err := ReadUSDT(lib)
	if err != nil {
		t.Fatal(err)
	}
	if len(probes) != 2 {
		t.Fatalf("probes %+v, want malloc and free", probes)
	}
	m, f := probes[0], probes[1]
	if m.Provider != "pytorch" || m.Name != "malloc" || len(m.Args) != 4 || m.Semaphore == 0 || m.Offset == 0 {
		t.Errorf("malloc: %+v", m)
	}
	if m.Args[1] != (USDTArg{Kind: USDTConst, Size: -4, Value: 1}) || m.Args[3].Value != 7 {
		t.Errorf("malloc's constant arguments: %+v", m.Args)
	}
	// p and n arrive in the first two argument registers (rdi, rsi; x0, x1).
	e, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	first, second := ptRegsAMD64["rdi"], ptRegsAMD64["rsi"]
	if e.Machine == elf.EM_AARCH64 {
		first, second = ptRegsARM64["x0"], ptRegsARM64["x1"]
	}
	e.Close()
	if m.Args[0] != (USDTArg{Kind: USDTReg, Size: 8, RegOff: first}) || m.Args[2] != (USDTArg{Kind: USDTReg, Size: -8, RegOff: second}) {
		t.Errorf("malloc's register arguments: %+v, want p in the first argument register (%d), n in the second (%d)", m.Args, first, second)
	}
	if f.Name != "free" || f.Semaphore == 0 || f.Semaphore == m.Semaphore || len(f.Args) != 1 || f.Args[0].Kind != USDTReg {
		t.Errorf("free: %+v", f)
	}
	// The semaphore's file offset holds its initial 0 in .probes.
	data, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	if m.Semaphore+2 > uint64(len(data)) || data[m.Semaphore] != 0 || data[m.Semaphore+1] != 0 {
		t.Errorf("semaphore offset %#x is not a zeroed u16 in the file", m.Semaphore)
	}
	if none, err := ReadUSDT("/proc/self/exe"); err != nil || len(none) != 0 {
		t.Errorf("a file without notes: %v, %v", none, err)
	}
}

// buildSDTLib builds, in dir, a library with PyTorch's two USDT probes
// (sys/sdt.h at inc), pytorch:malloc behind its semaphore, and returns its
// path.
func buildSDTLib(t *testing.T, gcc, inc, dir string) string {
	t.Helper()
	src, lib := filepath.Join(dir, "p.c"), filepath.Join(dir, "libp.so")
	code := `#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
__extension__ unsigned short pytorch_malloc_semaphore __attribute__((unused, section(".probes")));
__extension__ unsigned short pytorch_free_semaphore __attribute__((unused, section(".probes")));
void hit(void *p, long n) { if (pytorch_malloc_semaphore) STAP_PROBE4(pytorch, malloc, p, 1, n, 7); }
void plain(void *p) { STAP_PROBE1(pytorch, free, p); }
`
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O2", inc, "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return lib
}

// The same library in many files (one PyTorch build in every container
// image and virtual environment of a node) takes its sites' USDT specs
// once: 150 copies of a library with two sites attach, in a map of 256
// specs that a spec each would have filled at the 129th.
func TestUSDTSpecsShared(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	if _, err := os.Stat("/usr/include/x86_64-linux-gnu/sys/sdt.h"); err != nil {
		testenv.SkipOrFail(t, "sys/sdt.h (systemtap-sdt-dev): %v", err)
	}
	dir := t.TempDir()
	lib := buildSDTLib(t, testenv.LookPath(t, "gcc"), "-I/usr/include", dir)
	b, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := New(Options{StackWindow: -1})
	if err != nil {
		testenv.SkipOrFail(t, "load BPF: %v", err)
	}
	defer tr.Close()
	const copies = 150
	for i := range copies {
		c := filepath.Join(dir, fmt.Sprintf("libtorch%d.so", i))
		if err := os.WriteFile(c, b, 0o755); err != nil {
			t.Fatal(err)
		}
		var libs Libraries
		if _, err := libs.Add(c); err != nil {
			t.Fatal(err)
		}
		res, err := tr.Attach(libs.List()[0])
		if err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
		if len(res.Symbols) != 2 {
			t.Fatalf("copy %d: attached %v, want pytorch:malloc and pytorch:free", i, res.Symbols)
		}
	}
	if tr.specs != 2 {
		t.Errorf("%d USDT specs written for %d copies of one library of 2 sites, want 2", tr.specs, copies)
	}
}

// A library forgotten (no process maps it) loses its probes and its open
// file when its end is called, and can be attached again, once they are
// gone.
func TestForgetLibrary(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	if _, err := os.Stat("/usr/include/x86_64-linux-gnu/sys/sdt.h"); err != nil {
		testenv.SkipOrFail(t, "sys/sdt.h (systemtap-sdt-dev): %v", err)
	}
	lib := buildSDTLib(t, testenv.LookPath(t, "gcc"), "-I/usr/include", t.TempDir())
	tr, err := New(Options{StackWindow: -1})
	if err != nil {
		testenv.SkipOrFail(t, "load BPF: %v", err)
	}
	defer tr.Close()
	var libs Libraries
	if _, err := libs.Add(lib); err != nil {
		t.Fatal(err)
	}
	l := libs.List()[0]
	id := proc.FileID{Dev: l.Dev, Ino: l.Inode}
	if _, err := tr.Attach(l); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Attach(l); err == nil {
		t.Error("a second Attach of one file: no error")
	}
	a := tr.libs[id]
	if a == nil || len(a.links) == 0 || tr.AttachedLibraries() != 1 {
		t.Fatalf("attached: %+v, %d libraries", a, tr.AttachedLibraries())
	}
	tr.Learn(true)
	end := tr.ForgetLibrary(id)
	if tr.AttachedLibraries() != 0 {
		t.Errorf("%d libraries after ForgetLibrary, want 0", tr.AttachedLibraries())
	}
	// Attached again before the old probes are gone, it waits for them:
	// beside them, each call would be recorded twice.
	attached := make(chan error, 1)
	go func() {
		_, err := tr.Attach(l)
		attached <- err
	}()
	select {
	case err := <-attached:
		t.Fatalf("Attach while the forgotten probes close came back (%v) before their end", err)
	case <-time.After(200 * time.Millisecond):
	}
	end()
	if _, err := a.f.Stat(); err == nil {
		t.Error("the forgotten library's file still open after its end")
	}
	if err := <-attached; err != nil || tr.AttachedLibraries() != 1 {
		t.Errorf("Attach after ForgetLibrary's end: %v, %d libraries", err, tr.AttachedLibraries())
	}
}

// Once detached, the tracer attaches nothing: Run hands over what is left
// in the ring after Detach, and a record read then (an allocation on a
// device not yet known, a library loaded) asks for probes that Close
// would only take out again, each close waiting out a grace period (an
// 85 ms longer stop, under load).
func TestNothingAttachedAfterDetach(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	gcc := testenv.LookPath(t, "gcc")
	dir := t.TempDir()
	build := func(name string) Library {
		src, lib := filepath.Join(dir, name+".c"), filepath.Join(dir, name+".so")
		code := `int cudaMalloc(void **p, unsigned long n) { *p = (void *)n; return 0; }
int cudaFree(void *p) { return 0; }
int cudaGetDevice(int *d) { *d = 0; return 0; }
`
		if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O2", "-o", lib, src).CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
		var libs Libraries
		if _, err := libs.Add(lib); err != nil {
			t.Fatal(err)
		}
		return libs.List()[0]
	}
	first, second := build("liba"), build("libb")
	tr, err := New(Options{StackWindow: -1})
	if err != nil {
		testenv.SkipOrFail(t, "load BPF: %v", err)
	}
	defer tr.Close()
	if _, err := tr.Attach(first); err != nil {
		t.Fatal(err)
	}
	tr.Learn(true)
	a := tr.libs[proc.FileID{Dev: first.Dev, Ino: first.Inode}]
	if !tr.Learning() || a == nil || len(a.learn) != 2 {
		t.Fatalf("learning %v, %d learning probes on the library; want on, 2 (cudaGetDevice's entry and return)", tr.Learning(), len(a.learn))
	}
	if err := tr.Detach(); err != nil {
		t.Fatal(err)
	}
	tr.Learn(true)
	if tr.Learning() || len(a.learn) != 0 || len(a.links) != 0 {
		t.Errorf("Learn(true) after Detach: learning %v, %d learning probes, %d probes; want off, 0, 0", tr.Learning(), len(a.learn), len(a.links))
	}
	if _, err := tr.Attach(second); !errors.Is(err, ErrDetached) {
		t.Errorf("Attach after Detach: %v, want ErrDetached", err)
	}
	if n := tr.AttachedLibraries(); n != 1 {
		t.Errorf("%d libraries after an Attach past Detach, want the 1 from before", n)
	}
}
