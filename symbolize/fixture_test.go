package symbolize

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/proc"
)

// fixtures are the binaries built from testdata once per test run: gcc is
// the slow part of these tests.
type fixtures struct {
	dir        string // where sources were copied and compiled
	lib        string // libdemo.so, -O2 -g -fPIC -shared, build ID sha1
	libStrip   string // lib stripped to .dynsym
	libMini    string // lib stripped, with MiniDebugInfo (.gnu_debugdata) as Fedora builds it
	libLinked  string // lib stripped, with a .gnu_debuglink to libdemo.debug beside it
	exe        string // PIE, -O0 -g, linked with lib
	exeNoPIE   string // ET_EXEC, -O0 -g, linked with lib
	widget     string // libwidget.so, C++
	noBuildID  string // lib relinked with --build-id=none
	libSrc     string // full path of lib.c as compiled
	exeSrc     string
	widgetSrc  string
	buildError error
}

var (
	fixOnce sync.Once
	fix     fixtures
	fixRoot string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fixRoot != "" {
		os.RemoveAll(fixRoot)
	}
	os.Exit(code)
}

func needTool(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			testenv.SkipOrFail(t, "%s not installed: these tests compile real ELF fixtures with it", n)
		}
	}
}

// getFixtures builds (once) and returns the compiled fixtures.
func getFixtures(t testing.TB) *fixtures {
	t.Helper()
	needTool(t, "gcc", "g++", "strip", "objcopy", "nm", "xz")
	fixOnce.Do(func() { fix.buildError = fix.build() })
	if fix.buildError != nil {
		t.Fatalf("build fixtures: %v", fix.buildError)
	}
	return &fix
}

func (f *fixtures) build() error {
	dir, err := os.MkdirTemp("", "symbolize-test-")
	if err != nil {
		return err
	}
	fixRoot = dir
	// The compiler records the physical working directory in DWARF.
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return err
	}
	f.dir = dir
	for _, name := range []string{"lib.c", "lib.map", "main.c", "widget.cpp"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	f.lib = filepath.Join(dir, "libdemo.so")
	f.libStrip = filepath.Join(dir, "libdemo-stripped.so")
	f.libMini = filepath.Join(dir, "libdemo-mini.so")
	f.libLinked = filepath.Join(dir, "libdemo-linked.so")
	f.exe = filepath.Join(dir, "main")
	f.exeNoPIE = filepath.Join(dir, "main-nopie")
	f.widget = filepath.Join(dir, "libwidget.so")
	f.noBuildID = filepath.Join(dir, "libnobuildid.so")
	f.libSrc = filepath.Join(dir, "lib.c")
	f.exeSrc = filepath.Join(dir, "main.c")
	f.widgetSrc = filepath.Join(dir, "widget.cpp")

	// Relative source names, compiled from dir: the line table then holds
	// "lib.c" and a directory, which the symbolizer must join.
	cmds := [][]string{
		{"gcc", "-O2", "-g", "-fPIC", "-shared", "-Wl,--build-id=sha1", "-Wl,--version-script=lib.map", "-o", f.lib, "lib.c"},
		{"gcc", "-O2", "-g", "-fPIC", "-shared", "-Wl,--build-id=none", "-Wl,--version-script=lib.map", "-o", f.noBuildID, "lib.c"},
		{"strip", "--strip-all", "-o", f.libStrip, f.lib},
		// MiniDebugInfo, Fedora's recipe (find-debuginfo): the functions
		// .dynsym lacks, in an xz-compressed ELF in .gnu_debugdata.
		{"objcopy", "--only-keep-debug", f.lib, "libdemo.debug"},
		{"sh", "-c", "nm -D --defined-only --format=posix " + f.lib + " | awk '{print $1}' | sort > dynsyms && " +
			"nm --defined-only --format=posix " + f.lib + " | awk '$2 ~ /^[Tt]$/ {print $1}' | sort > funcsyms && " +
			"comm -13 dynsyms funcsyms > keep_symbols"},
		{"objcopy", "-S", "--remove-section", ".gdb_index", "--remove-section", ".comment",
			"--keep-symbols=keep_symbols", "libdemo.debug", "mini_debuginfo"},
		{"xz", "-f", "mini_debuginfo"},
		{"strip", "--strip-all", "-o", f.libMini, f.lib},
		{"objcopy", "--add-section", ".gnu_debugdata=mini_debuginfo.xz", f.libMini},
		{"strip", "--strip-all", "-o", f.libLinked, f.lib},
		{"objcopy", "--add-gnu-debuglink=libdemo.debug", f.libLinked},
		{"gcc", "-O0", "-g", "-fPIE", "-pie", "-o", f.exe, "main.c", "-L.", "-ldemo", "-Wl,-rpath," + dir, "-ldl"},
		{"gcc", "-O0", "-g", "-fno-pie", "-no-pie", "-o", f.exeNoPIE, "main.c", "-L.", "-ldemo", "-Wl,-rpath," + dir, "-ldl"},
		{"g++", "-O2", "-g", "-fPIC", "-shared", "-o", f.widget, "widget.cpp"},
	}
	for _, c := range cmds {
		cmd := exec.Command(c[0], c[1:]...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	return nil
}

// run starts exe with args, reads the addresses it prints and its maps while
// it blocks, then lets it exit: symbolization happens after the process is
// gone, as in the tracer.
func run(t *testing.T, exe string, args ...string) ([]uint64, []proc.Mapping) {
	t.Helper()
	cmd := exec.Command(exe, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := false
	defer func() {
		if !done {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()

	lineCh := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		lineCh <- l
	}()
	var line string
	select {
	case line = <-lineCh:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s printed nothing in 30s; stderr: %s", exe, stderr.String())
	}
	var addrs []uint64
	for _, w := range strings.Fields(line) {
		a, err := strconv.ParseUint(strings.TrimPrefix(w, "0x"), 16, 64)
		if err != nil {
			t.Fatalf("%s printed %q: %v; stderr: %s", exe, line, err, stderr.String())
		}
		addrs = append(addrs, a)
	}
	maps, err := proc.ReadMaps(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	cmd.Process.Kill()
	cmd.Wait()
	done = true
	return addrs, maps
}

// funcLines returns the first and last line of C function name's definition
// in the source file: from the line naming it (not a prototype) to the
// first line that is a lone closing brace.
func funcLines(t *testing.T, src, name string) (int, int) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	def := regexp.MustCompile(`^\S.*\b` + regexp.QuoteMeta(name) + `\(.*[^;]$`)
	first := 0
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case first == 0 && def.MatchString(l):
			first = i + 1
		case first != 0 && l == "}":
			return first, i + 1
		}
	}
	t.Fatalf("no definition of %s in %s", name, src)
	return 0, 0
}

// nmAddr returns the symbol table value of sym in file, as nm prints it: an
// oracle independent of debug/elf.
func nmAddr(t *testing.T, file, sym string, dynamic bool) uint64 {
	t.Helper()
	needTool(t, "nm")
	args := []string{file}
	if dynamic {
		args = []string{"-D", file}
	}
	out, err := exec.Command("nm", args...).Output()
	if err != nil {
		t.Fatalf("nm %s: %v", file, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && strings.SplitN(f[2], "@", 2)[0] == sym {
			v, err := strconv.ParseUint(f[0], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("nm %s: no symbol %s", file, sym)
	return 0
}

// addr2line returns binutils' answer for vaddr in file, as "path:line".
func addr2line(t *testing.T, file string, vaddr uint64) string {
	t.Helper()
	out, err := exec.Command("addr2line", "-e", file, fmt.Sprintf("%#x", vaddr)).Output()
	if err != nil {
		t.Fatalf("addr2line: %v", err)
	}
	s := strings.TrimSpace(string(out))
	if i := strings.Index(s, " (discriminator"); i >= 0 {
		s = s[:i]
	}
	return s
}

func readelfBuildID(t *testing.T, file string) string {
	t.Helper()
	needTool(t, "readelf")
	out, err := exec.Command("readelf", "-n", file).Output()
	if err != nil {
		t.Fatalf("readelf -n %s: %v", file, err)
	}
	m := regexp.MustCompile(`Build ID: ([0-9a-f]+)`).FindSubmatch(out)
	if m == nil {
		return ""
	}
	return string(m[1])
}
