package loader

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

func TestParseUSDTArgs(t *testing.T) {
	got, err := parseUSDTArgs("8@%rax -1@%bpl 8@-24(%rbp) -4@$-7 4@(%rsi) 8@0x10(%r12)")
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
		if _, err := parseUSDTArgs(bad); err == nil {
			t.Errorf("parseUSDTArgs(%q) accepted", bad)
		}
	}
}

// The notes of a library built with sys/sdt.h, semaphores included, as
// readelf -n shows them.
func TestReadUSDT(t *testing.T) {
	gcc := testenv.LookPath(t, "gcc")
	if _, err := os.Stat("/usr/include/x86_64-linux-gnu/sys/sdt.h"); err != nil {
		testenv.SkipOrFail(t, "sys/sdt.h (systemtap-sdt-dev): %v", err)
	}
	dir := t.TempDir()
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
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O2", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
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
