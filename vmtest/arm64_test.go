package vmtest

// The arm64 half of the kernel matrix (kernels_test.go): cudatrace built
// for linux/arm64, the stand-ins cross-compiled with Debian's
// gcc-aarch64-linux-gnu, and Debian's arm64 userland (busybox, glibc,
// CPython 3.11, bpftool) that scripts/deps.sh unpacks, booted on Debian's
// arm64 kernels under qemu-system-aarch64 with pointer authentication.

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
)

// arm64Root is Debian's arm64 userland as scripts/deps.sh unpacked it.
func arm64Root() string { return filepath.Join(kernelCache(), "arm64", "root") }

// arm64Guest is the arm64 guest's paths: the cross-compiled workloads
// under the build directory, Debian's arm64 CPython 3.11 where deps.sh
// unpacked it (the guest has it at the same path, so that a trace names
// the same files here). Built without DWARF, as distributions ship it,
// its native frames are named from .dynsym alone: on arm64 libffi's
// ffi_call is a tail call into its static ffi_call_int, and _ctypes'
// calls are static too, so the nearest named frame below the Python ones
// is the interpreter's call of the ctypes function object
// (_PyObject_MakeTpCall).
func arm64Guest(t *testing.T) guest {
	t.Helper()
	for _, tool := range []string{"qemu-system-aarch64", "aarch64-linux-gnu-gcc", "cpio"} {
		requireTool(t, tool)
	}
	py := filepath.Join(arm64Root(), "usr", "bin", "python"+guestPython)
	for _, f := range []string{py, filepath.Join(arm64Root(), "bin", "busybox"), filepath.Join(arm64Root(), "usr", "sbin", "bpftool")} {
		if _, err := os.Stat(f); err != nil {
			skipOrFail(t, "Debian's arm64 userland is missing (%v): scripts/deps.sh unpacks it", err)
		}
	}
	return guest{arch: "arm64", bin: filepath.Join(buildDir, "arm64", "bin"), python: py, pyCall: "_PyObject_MakeTpCall"}
}

// arm64Dumps adds ct_dumps=1 to the arm64 kernels' command line when
// VMTEST_ARM64_DUMPS names a directory: the guest then runs the unwind
// package's arm64 chain (unwind/testdata/arm64) and sends its stack, which
// checkARM64Cases writes there as dump-<series>, the unwinder's test data.
func arm64Dumps() string {
	if os.Getenv("VMTEST_ARM64_DUMPS") != "" {
		return " ct_dumps=1"
	}
	return ""
}

// arm64Build is where the cross-compiled stand-ins are.
type arm64Build struct {
	dir, lib, libDir, driver, c10, threads, omitfp, tracer string
}

// buildARM64 cross-compiles the stand-ins for arm64 into buildDir/arm64,
// as buildStandIns builds them here, all with pointer authentication
// (-mbranch-protection=standard, as Debian's and Ubuntu's arm64 userlands
// are built): the runtime and driver stand-ins without frame pointers,
// the workloads with them; the omitfp chain without (testdata/omitfp_*.c:
// lib2, in the middle, without pointer authentication: signed and
// unsigned return addresses on one stack). And cudatrace for linux/arm64,
// unless VMTEST_CUDATRACE_ARM64 names one (make release's
// bin/cudatrace-linux-arm64).
func buildARM64() (arm64Build, error) {
	dir := filepath.Join(buildDir, "arm64")
	b := arm64Build{dir: dir, libDir: filepath.Join(dir, "lib")}
	b.lib = filepath.Join(b.libDir, "libcudart.so.12")
	b.driver = filepath.Join(b.libDir, "libcuda.so.1")
	b.c10 = filepath.Join(b.libDir, "libc10_cuda.so")
	b.threads = filepath.Join(dir, "pythread.so")
	bin := filepath.Join(dir, "bin")
	b.omitfp = filepath.Join(bin, "omitfp")
	td, err := filepath.Abs("testdata")
	if err != nil {
		return b, err
	}
	src := func(name string) string { return filepath.Join(td, name) }
	inc := filepath.Join(dir, "include")
	for _, d := range []string{b.libDir, bin, filepath.Join(inc, "sys")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return b, err
		}
	}
	// sys/sdt.h (c10stub's probes) is the same for every architecture;
	// Debian installs it for the host's only.
	sdt, _ := filepath.Glob("/usr/include/*-linux-gnu/sys/sdt.h")
	if len(sdt) == 0 {
		return b, errors.New("no sys/sdt.h (systemtap-sdt-dev) for c10stub's probes")
	}
	for _, h := range []string{"sdt.h", "sdt-config.h"} {
		if err := os.Symlink(filepath.Join(filepath.Dir(sdt[0]), h), filepath.Join(inc, "sys", h)); err != nil {
			return b, err
		}
	}
	pac := "-mbranch-protection=standard"
	rpath := "-Wl,-rpath," + b.libDir
	steps := [][]string{
		{"-shared", "-fPIC", "-O2", "-fomit-frame-pointer", pac, "-pthread", "-Wall", "-Wl,-soname,libcudart.so.12",
			"-Wl,--version-script=" + src("fakecudart.map"), "-o", b.lib, src("fakecudart.c")},
		{"-shared", "-fPIC", "-O2", "-fomit-frame-pointer", pac, "-pthread", "-Wall", "-Wl,-soname,libcuda.so.1",
			"-Wl,--version-script=" + src("fakecuda.map"), "-o", b.driver, src("fakecudart.c")},
		{"-O0", "-g", "-fno-omit-frame-pointer", pac, "-pthread", "-Wall", "-o", filepath.Join(bin, "driver"),
			src("driver.c"), b.driver, rpath},
		{"-shared", "-fPIC", "-O2", "-fno-omit-frame-pointer", pac, "-Wall", "-I" + inc, "-o", b.c10, src("c10stub.c"), b.lib, rpath},
		{"-O0", "-g", "-fno-omit-frame-pointer", pac, "-Wall", "-o", filepath.Join(bin, "tensors"), src("tensors.c"), b.c10, rpath},
		{"-shared", "-fPIC", "-O2", "-Wall", "-o", b.threads, src("pythread.c"), b.lib},
		{"-shared", "-fPIC", "-O2", "-fomit-frame-pointer", "-g", "-Wall", "-Wl,-soname,libomit2.so",
			"-o", filepath.Join(b.libDir, "libomit2.so"), src("omitfp_lib2.c")},
		{"-shared", "-fPIC", "-O2", "-fomit-frame-pointer", "-g", pac, "-Wall", "-Wl,-soname,libomit1.so",
			"-o", filepath.Join(b.libDir, "libomit1.so"), src("omitfp_lib1.c"), filepath.Join(b.libDir, "libomit2.so"), b.lib, rpath},
		{"-O2", "-fomit-frame-pointer", "-g", pac, "-Wall", "-o", b.omitfp, src("omitfp_main.c"),
			filepath.Join(b.libDir, "libomit1.so"), filepath.Join(b.libDir, "libomit2.so"), rpath},
	}
	// uwmemo (the uwbpf case: stacks unwound in BPF) without frame
	// pointers, its return addresses signed.
	steps = append(steps, []string{"-O2", "-fomit-frame-pointer", "-g", pac, "-Wall", "-o", filepath.Join(bin, "uwmemo"),
		src("uwmemo.c"), b.lib, rpath})
	for _, prog := range []string{"mix", "attach_later", "hold"} {
		steps = append(steps, []string{"-O0", "-g", "-fno-omit-frame-pointer", pac, "-pthread", "-Wall",
			"-o", filepath.Join(bin, prog), src(prog + ".c"), b.lib, rpath})
	}
	for _, args := range steps {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		out, err := exec.CommandContext(ctx, "aarch64-linux-gnu-gcc", args...).CombinedOutput()
		cancel()
		if err != nil {
			return b, fmt.Errorf("aarch64-linux-gnu-gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if err := os.Symlink("libcudart.so.12", filepath.Join(b.libDir, "libcudart.so")); err != nil {
		return b, err
	}
	if b.tracer = os.Getenv("VMTEST_CUDATRACE_ARM64"); b.tracer != "" {
		_, err := os.Stat(b.tracer)
		return b, err
	}
	b.tracer = filepath.Join(dir, "cudatrace")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(), "build", "-ldflags", "-extldflags=-Wl,-z,lazy", "-o", b.tracer,
		"github.com/cudatrace/cudatrace/cmd/cudatrace")
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=1", "CC=aarch64-linux-gnu-gcc",
		"CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		return b, fmt.Errorf("%s: %v\n%s", cmd, err, out)
	}
	return b, nil
}

// buildInitramfsARM64 makes the arm64 guest's root: Debian's arm64
// busybox, glibc and the libraries bpftool and CPython link, cudatrace for
// arm64, the cross-compiled stand-ins and Debian's CPython at their paths
// here, and the unwind package's arm64 chain (for VMTEST_ARM64_DUMPS). The
// libraries too are at their paths here, /lib and /usr/lib/aarch64-linux-gnu
// links to them: a process's mappings name the files by those paths, so
// that this host, where no arm64 libc or libffi is installed, names their
// frames.
func buildInitramfsARM64(work string, g guest) (string, error) {
	b, err := buildARM64()
	if err != nil {
		return "", err
	}
	root := arm64Root()
	chain, err := filepath.Abs(filepath.Join("..", "unwind", "testdata", "arm64"))
	if err != nil {
		return "", err
	}
	return writeInitramfs(work, guestRoot{
		files: map[string]string{
			filepath.Join(root, "bin", "busybox"): "/bin/busybox",
			b.tracer:                              "/usr/bin/cudatrace",
			filepath.Join(root, "usr", "sbin", "bpftool"): "/usr/sbin/bpftool",
			g.python: g.python,
		},
		trees: map[string]string{
			filepath.Join(root, "lib"):                             filepath.Join(root, "lib"),
			filepath.Join(root, "usr", "lib", "aarch64-linux-gnu"): filepath.Join(root, "usr", "lib", "aarch64-linux-gnu"),
			b.dir: b.dir,
			chain: "/unwind",
		},
		links: map[string]string{
			"/lib":                       filepath.Join(root, "lib"),
			"/usr/lib/aarch64-linux-gnu": filepath.Join(root, "usr", "lib", "aarch64-linux-gnu"),
		},
		stdlib: filepath.Join(root, "usr", "lib", "python"+guestPython),
		env: map[string]string{"ARCH": "arm64", "LIB": b.lib, "DRV": b.driver, "C10": b.c10, "BIN": g.bin,
			"PY": g.python, "THREADS": b.threads, "OMITFP": b.omitfp,
			"LIBPATH": "/lib/aarch64-linux-gnu:/usr/lib/aarch64-linux-gnu", "RESULTS": "/dev/ttyAMA0"},
	})
}

// checkARM64Cases checks what only the arm64 guest runs: the omitfp chain
// (no frame pointers, return addresses signed) unwound exact to function
// and line, in the guest, and here from the windows the trace kept (an
// arm64 trace read on x86-64), where frame pointers alone do not reach;
// the USDT tensor probes exact against the workload's tally; and that the
// CPU signed return addresses at all.
func checkARM64Cases(t *testing.T, ctx context.Context, out string, g guest) {
	t.Run("pac", func(t *testing.T) {
		// The guest's CPU authenticates pointers, and the chain's own
		// functions sign their return address first thing (paciasp).
		if !strings.Contains(readTrim(t, filepath.Join(out, "cpuinfo")), " paca ") {
			t.Errorf("the guest's CPU has no pointer authentication (paca):\n%s", readTrim(t, filepath.Join(out, "cpuinfo")))
		}
		for file, fn := range map[string]string{g.workload("omitfp"): "main", filepath.Join(filepath.Dir(g.bin), "lib", "libomit1.so"): "lib1_inner"} {
			if !startsWithPACIASP(t, file, fn) {
				t.Errorf("%s's %s does not begin with paciasp: its return address is not signed", file, fn)
			}
		}
	})
	want := omitFPFrames(t)
	for _, c := range []struct {
		name string
		keep bool
	}{{"omitfp", false}, {"keep", true}} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(out, c.name)
			if rc := readTrim(t, filepath.Join(dir, "rc")); rc != "0" {
				t.Fatalf("case %s: cudatrace exited %s:\n%s", c.name, rc, readTrim(t, filepath.Join(dir, "stderr")))
			}
			got := oneStack(t, ctx, filepath.Join(dir, "fake.log"), filepath.Join(dir, "trace"))
			if len(got) < len(want) || strings.Join(got[:len(want)], "\n") != strings.Join(want, "\n") {
				t.Fatalf("stack, innermost first:\n  got  %q\n  want %q (then libc's start code)", got, want)
			}
			if len(got) > len(want)+3 {
				t.Errorf("%d frames below main: %q", len(got)-len(want), got[len(want):])
			}
			lr := 0
			eachEvent(t, filepath.Join(dir, "trace"), func(ev *events.Event) {
				if ev.Flags&events.FlagWindow != 0 && ev.Flags&events.FlagLR != 0 {
					lr++
				}
			})
			if n := windowsInTrace(t, filepath.Join(dir, "trace")); n != map[bool]int{true: 1}[c.keep] || lr != n {
				t.Errorf("%d records carry a window, %d of them arm64's link register; want %d", n, lr, map[bool]int{true: 1}[c.keep])
			}
		})
	}
	t.Run("omitfp0", func(t *testing.T) {
		// Without the window the frame-pointer walk cannot climb the chain:
		// the cases above prove the unwinder, not luck.
		dir := filepath.Join(out, "omitfp0")
		got := oneStack(t, ctx, filepath.Join(dir, "fake.log"), filepath.Join(dir, "trace"))
		if len(got) >= len(want) && strings.Join(got[:len(want)], "\n") == strings.Join(want, "\n") {
			t.Fatalf("the frame-pointer walk alone found the whole chain: %q", got)
		}
	})
	t.Run("tensors", func(t *testing.T) {
		dir := filepath.Join(out, "tensors")
		if rc := readTrim(t, filepath.Join(dir, "rc")); rc != "0" {
			t.Fatalf("case tensors: cudatrace exited %s:\n%s", rc, readTrim(t, filepath.Join(dir, "stderr")))
		}
		stdout := readTrim(t, filepath.Join(dir, "stdout"))
		trace := filepath.Join(dir, "trace")
		checkTensorTally(t, ctx, trace, stdout, onlyTruth(t, filepath.Join(dir, "fake.log"), ""))
		checkByViews(t, ctx, trace, stdout)
	})
	if d := os.Getenv("VMTEST_ARM64_DUMPS"); d != "" {
		t.Run("dumps", func(t *testing.T) {
			dumps, err := filepath.Glob(filepath.Join(out, "dumps", "dump-*"))
			if err != nil || len(dumps) != 1 {
				t.Fatalf("the guest sent dumps %q (%v), want one", dumps, err)
			}
			if err := copyFile(dumps[0], filepath.Join(d, filepath.Base(dumps[0]))); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s", filepath.Join(d, filepath.Base(dumps[0])))
		})
	}
}

// startsWithPACIASP reports whether function fn of the arm64 ELF file
// begins with paciasp, which signs the return address in x30.
func startsWithPACIASP(t *testing.T, file, fn string) bool {
	t.Helper()
	f, err := elf.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name != fn || elf.ST_TYPE(s.Info) != elf.STT_FUNC {
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && s.Value >= p.Vaddr && s.Value+4 <= p.Vaddr+p.Filesz {
				var insn [4]byte
				if _, err := p.ReadAt(insn[:], int64(s.Value-p.Vaddr)); err != nil {
					t.Fatal(err)
				}
				return insn == [4]byte{0x3f, 0x23, 0x03, 0xd5} // paciasp, 0xd503233f
			}
		}
	}
	t.Fatal(errors.New(fn + " not found in " + file))
	return false
}
