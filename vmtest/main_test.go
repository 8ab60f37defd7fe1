package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// realLibcudart is NVIDIA's libcudart from Debian's non-free libcudart11.0.
const realLibcudart = "/usr/lib/x86_64-linux-gnu/libcudart.so.11.0"

// Environment defaults for the stand-in, set explicitly for every workload.
const (
	fakeDevices  = 2
	fakeMemLimit = 1 << 30
)

// The build, made once by TestMain.
var (
	buildDir string

	tracerBin      string // the cudatrace binary
	tracerBuildErr error  // with the go build output

	fakeLib      string // .../lib/libcudart.so.12 (the real file)
	fakeLibDir   string // holds libcudart.so.12 and libcudart.so -> libcudart.so.12
	fakeDriver   string // .../lib/libcuda.so.1, the driver stand-in
	nestRuntime  string // .../lib/libnestrt.so, a runtime calling the driver stand-in
	c10Lib       string // .../lib/libc10_cuda.so, a caching allocator with PyTorch's USDT probes
	fakeNVMLDir  string // holds libnvidia-ml.so.1, NVML's stand-in (testdata/fakenvml.c)
	binDir       string
	cBuildErr    error // nil, errNoGCC, or the failed compiler run
	realBuildErr error // realcuda: errNoRealLib, or the failed compiler run
)

var (
	errNoGCC     = errors.New("gcc not found in PATH")
	errNoRealLib = errors.New(realLibcudart + " is missing (install Debian non-free libcudart11.0 and libcuda1)")
)

// workload returns the path of a built C workload.
func workload(name string) string { return filepath.Join(binDir, name) }

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "cudatrace-vmtest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "vmtest:", err)
		return 2
	}
	// The mix binary's path appears in reports as a module: no symlinks in it.
	if d, err := filepath.EvalSymlinks(dir); err == nil {
		dir = d
	}
	buildDir = dir
	if os.Getenv("VMTEST_KEEP") != "" {
		fmt.Fprintln(os.Stderr, "vmtest: keeping build directory", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); buildTracer(dir) }()
	go func() { defer wg.Done(); buildStandIns(dir) }()
	wg.Wait()
	return m.Run()
}

func buildTracer(dir string) {
	if bin := os.Getenv("VMTEST_CUDATRACE"); bin != "" {
		// A binary built elsewhere (a CI artifact, or a stand-in tracer).
		tracerBin = bin
		if _, err := os.Stat(bin); err != nil {
			tracerBuildErr = fmt.Errorf("VMTEST_CUDATRACE: %v", err)
		}
		return
	}
	tracerBin = filepath.Join(dir, "cudatrace")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(), "build", "-o", tracerBin, "github.com/cudatrace/cudatrace/cmd/cudatrace")
	if out, err := cmd.CombinedOutput(); err != nil {
		tracerBuildErr = fmt.Errorf("go build -o %s github.com/cudatrace/cudatrace/cmd/cudatrace: %v\n%s", tracerBin, err, out)
	}
}

// goTool is the go command: the one in PATH, else GOROOT's.
func goTool() string {
	if g, err := exec.LookPath("go"); err == nil {
		return g
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}

func buildStandIns(dir string) {
	fakeLibDir = filepath.Join(dir, "lib")
	binDir = filepath.Join(dir, "bin")
	fakeLib = filepath.Join(fakeLibDir, "libcudart.so.12")
	fakeDriver = filepath.Join(fakeLibDir, "libcuda.so.1")
	nestRuntime = filepath.Join(fakeLibDir, "libnestrt.so")
	c10Lib = filepath.Join(fakeLibDir, "libc10_cuda.so")
	fakeNVMLDir = filepath.Join(dir, "nvml")
	realBuildErr = errNoRealLib
	if _, err := exec.LookPath("gcc"); err != nil {
		cBuildErr = errNoGCC
		realBuildErr = errNoGCC
		return
	}
	td, err := filepath.Abs("testdata")
	if err != nil {
		cBuildErr = err
		return
	}
	for _, d := range []string{fakeLibDir, binDir, fakeNVMLDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			cBuildErr = err
			return
		}
	}
	src := func(name string) string { return filepath.Join(td, name) }

	// The stand-in: no frame pointers, like NVIDIA's libcudart; symbols
	// versioned libcudart.so.12 like NVIDIA's.
	if cBuildErr = gcc("-shared", "-fPIC", "-O2", "-fomit-frame-pointer", "-pthread", "-Wall",
		"-Wl,-soname,libcudart.so.12", "-Wl,--version-script="+src("fakecudart.map"),
		"-o", fakeLib, src("fakecudart.c")); cBuildErr != nil {
		return
	}
	// -lcudart must find the stand-in before anything else: the directory
	// comes first with a libcudart.so link, and the rpath makes the loader
	// pick it over the ld.so cache (where NVIDIA's libcudart may be).
	if cBuildErr = os.Symlink("libcudart.so.12", filepath.Join(fakeLibDir, "libcudart.so")); cBuildErr != nil {
		return
	}
	// The driver stand-in: the same source, exporting the driver API.
	if cBuildErr = gcc("-shared", "-fPIC", "-O2", "-fomit-frame-pointer", "-pthread", "-Wall",
		"-Wl,-soname,libcuda.so.1", "-Wl,--version-script="+src("fakecuda.map"),
		"-o", fakeDriver, src("fakecudart.c")); cBuildErr != nil {
		return
	}
	// uwmemo: without frame pointers, as TestUnwindMemo and the kernel
	// matrix's uwbpf case unwind it in BPF.
	if cBuildErr = gcc("-O2", "-fomit-frame-pointer", "-g", "-Wall", "-o", workload("uwmemo"), src("uwmemo.c"),
		fakeLib, "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	// uwwide: a stack wider than BPF's memo spans, one with a page not
	// present among its words (TestUnwindMemoWide).
	if cBuildErr = gcc("-O2", "-fomit-frame-pointer", "-g", "-Wall", "-o", workload("uwwide"), src("uwwide.c"),
		fakeLib, "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	if cBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-pthread", "-Wall", "-o", workload("driver"),
		src("driver.c"), fakeDriver, "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	// The driver's context stack and implicit frees (ctxstack.c).
	if cBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-Wall", "-o", workload("ctxstack"),
		src("ctxstack.c"), fakeDriver, "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	// Two processes holding the same context handle (ctxshare.c).
	if cBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-Wall", "-o", workload("ctxshare"),
		src("ctxshare.c"), fakeDriver, "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	// Threads that chose their devices before a tracer attached
	// (attach_ctx.c): each process uses one of the two libraries.
	if cBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-pthread", "-Wall", "-o", workload("attach_ctx"),
		src("attach_ctx.c"), fakeLib, fakeDriver, "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	// A runtime over the driver, and a program using both.
	if cBuildErr = gcc("-shared", "-fPIC", "-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-Wall",
		"-Wl,-soname,libnestrt.so", "-o", nestRuntime, src("nestrt.c"), fakeDriver); cBuildErr != nil {
		return
	}
	if cBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-Wall", "-o", workload("nested"), src("nested.c"),
		nestRuntime, fakeDriver, "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	// PyTorch's caching allocator, with its USDT probes, over the runtime
	// stand-in; and a program making tensors with it. With frame pointers,
	// unlike PyTorch's build: the probe site's callers are found by the
	// frame-pointer walk; without them only DWARF unwinding would (issue 4).
	if cBuildErr = gcc("-shared", "-fPIC", "-O2", "-fno-omit-frame-pointer", "-Wall", "-o", c10Lib, src("c10stub.c"),
		"-L"+fakeLibDir, "-lcudart", "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	if cBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-Wall", "-o", workload("tensors"), src("tensors.c"),
		c10Lib, "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	// The owners' stand-ins (owner rules, issue 22): NCCL's VMM user over
	// the driver, cuBLAS's workspace over the runtime, named as the real
	// libraries are; and a program using them with PyTorch's allocator.
	ncclLib, cublasLib := filepath.Join(fakeLibDir, "libnccl.so.2"), filepath.Join(fakeLibDir, "libcublas.so.12")
	if cBuildErr = gcc("-shared", "-fPIC", "-O2", "-fno-omit-frame-pointer", "-Wall", "-Wl,-soname,libnccl.so.2",
		"-o", ncclLib, src("ncclstub.c"), fakeDriver, "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	if cBuildErr = gcc("-shared", "-fPIC", "-O2", "-fno-omit-frame-pointer", "-Wall", "-Wl,-soname,libcublas.so.12",
		"-o", cublasLib, src("cublasstub.c"), "-L"+fakeLibDir, "-lcudart", "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	if cBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-Wall", "-o", workload("owners"), src("owners.c"),
		c10Lib, ncclLib, cublasLib, "-L"+fakeLibDir, "-lcudart", "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	// make demo's workload (demo/workload.c), built as make demo builds it.
	if cBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-pthread", "-Wall", "-I", td, "-o", workload("train"),
		filepath.Join(td, "..", "..", "demo", "workload.c"), "-L"+fakeLibDir, "-lcudart", "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	// NVML's stand-in, in a directory of its own: LD_LIBRARY_PATH=fakeNVMLDir
	// makes go-nvml's dlopen("libnvidia-ml.so.1") find it first.
	if cBuildErr = gcc("-shared", "-fPIC", "-O2", "-Wall", "-Wl,-soname,libnvidia-ml.so.1",
		"-o", filepath.Join(fakeNVMLDir, "libnvidia-ml.so.1"), src("fakenvml.c")); cBuildErr != nil {
		return
	}
	// cuRAND's stand-in, which PyCUDA's _driver links (pycuda_test.go).
	if cBuildErr = gcc("-shared", "-fPIC", "-O2", "-Wall", "-Wl,-soname,libcurand.so.10",
		"-Wl,--version-script="+src("fakecurand.map"), "-o", filepath.Join(fakeLibDir, "libcurand.so.10"),
		src("fakecurand.c")); cBuildErr != nil {
		return
	}
	if cBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-Wall", "-o", workload("dlopen_late"),
		src("dlopen_late.c"), "-ldl"); cBuildErr != nil {
		return
	}
	// mix with the runtime stand-in linked into the executable, as a
	// program built with cudart_static is.
	rtObj := filepath.Join(dir, "fakecudart.o")
	if cBuildErr = gcc("-c", "-O2", "-fomit-frame-pointer", "-pthread", "-Wall", "-o", rtObj, src("fakecudart.c")); cBuildErr != nil {
		return
	}
	if cBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-pthread", "-Wall", "-o", workload("mix_static"),
		src("mix.c"), rtObj); cBuildErr != nil {
		return
	}
	for _, prog := range []string{"mix", "attach_later", "shortlived", "faketest", "hold", "burst", "agentload", "exitleak", "rankjob"} {
		if cBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-pthread", "-Wall",
			"-o", workload(prog), src(prog+".c"),
			"-L"+fakeLibDir, "-lcudart", "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
			return
		}
	}
	// pidat puts a command at a PID another process had (life_test.go).
	if cBuildErr = gcc("-O1", "-Wall", "-o", workload("pidat"), src("pidat.c")); cBuildErr != nil {
		return
	}
	// stackend without frame pointers: only the stack window unwinds it.
	if cBuildErr = gcc("-O1", "-g", "-fomit-frame-pointer", "-pthread", "-Wall", "-o", workload("stackend"),
		src("stackend.c"), "-L"+fakeLibDir, "-lcudart", "-Wl,-rpath,"+fakeLibDir); cBuildErr != nil {
		return
	}
	if _, err := os.Stat(realLibcudart); err == nil {
		realBuildErr = gcc("-O0", "-g", "-fno-omit-frame-pointer", "-o", workload("realcuda"),
			src("realcuda.c"), realLibcudart)
	}
}

func gcc(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "gcc", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// skipOrFail skips the test, or fails it in CI, where a skip is a failure.
var skipOrFail = testenv.SkipOrFail

// Capability numbers from linux/capability.h.
const (
	capSysAdmin = 21
	capPerfmon  = 38
	capBPF      = 39
)

func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("no CapEff in /proc/self/status")
}

// requirePrivileged skips (fails in CI) unless the tests run as root with
// CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN, which implies them).
func requirePrivileged(t testing.TB) {
	t.Helper()
	caps, err := effectiveCaps()
	has := func(c uint) bool { return caps&(1<<c) != 0 }
	ok := err == nil && os.Geteuid() == 0 && (has(capBPF) && has(capPerfmon) || has(capSysAdmin))
	if !ok {
		skipOrFail(t, "needs root (CAP_BPF, CAP_PERFMON): run as root (euid %d, CapEff %#x, %v)", os.Geteuid(), caps, err)
	}
}

// requireTool skips (fails in CI) when a program is not in PATH.
func requireTool(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		skipOrFail(t, "needs %s in PATH: %v", name, err)
	}
}

// needStandIns fails the test when the C stand-ins could not be built (or
// skips it, outside CI, when there is no gcc).
func needStandIns(t testing.TB) {
	t.Helper()
	if errors.Is(cBuildErr, errNoGCC) {
		skipOrFail(t, "needs gcc in PATH to build the stand-in libcudart")
	}
	if cBuildErr != nil {
		t.Fatalf("building the C stand-ins failed: %v", cBuildErr)
	}
}

// needTracer fails the test when cudatrace did not build.
func needTracer(t testing.TB) {
	t.Helper()
	if tracerBuildErr != nil {
		t.Fatalf("building cudatrace failed:\n%v", tracerBuildErr)
	}
}

// needRealCuda skips (fails in CI) without NVIDIA's libcudart.
func needRealCuda(t testing.TB) {
	t.Helper()
	if errors.Is(realBuildErr, errNoRealLib) || errors.Is(realBuildErr, errNoGCC) {
		skipOrFail(t, "%v", realBuildErr)
	}
	if realBuildErr != nil {
		t.Fatalf("building realcuda failed: %v", realBuildErr)
	}
}

// fakeEnv is the environment for a workload on the stand-in: this
// process's, less any FAKECUDA_* setting, plus the defaults and the log.
func fakeEnv(logPath string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FAKECUDA_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		fmt.Sprintf("FAKECUDA_DEVICES=%d", fakeDevices),
		fmt.Sprintf("FAKECUDA_MEM_LIMIT=%d", fakeMemLimit))
	if logPath != "" {
		env = append(env, "FAKECUDA_LOG="+logPath)
	}
	return append(env, extra...)
}

// testContext bounds a whole test: no test may hang for more than 60 s.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// lockedBuffer is a bytes.Buffer safe for a writer goroutine and readers.
// When watch is set, the first line that starts with it closes seen.
type lockedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	watch string
	seen  chan struct{}
	found bool
}

func newLockedBuffer(watch string) *lockedBuffer {
	return &lockedBuffer{watch: watch, seen: make(chan struct{})}
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if b.watch != "" && !b.found {
		s := b.buf.String()
		if strings.HasPrefix(s, b.watch) || strings.Contains(s, "\n"+b.watch) {
			b.found = true
			close(b.seen)
		}
	}
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// truncate keeps the head and the tail of a long text for a log.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n/2] + fmt.Sprintf("\n... (%d bytes left out) ...\n", len(s)-n) + s[len(s)-n/2:]
}
