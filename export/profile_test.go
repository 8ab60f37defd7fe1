package export

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// A C program that prints the return addresses a call from caller into
// leaf would leave, then its own mappings: stacks to symbolize against a
// real ELF file.
const profileFixtureSrc = `#include <stdio.h>
__attribute__((noinline)) int leaf(int x) { return x + 1; }
__attribute__((noinline)) int caller(int x) { return leaf(x) * 2; }
int main(void) {
	printf("%lu %lu\n", (unsigned long)&leaf + 1, (unsigned long)&caller + 1);
	FILE *f = fopen("/proc/self/maps", "r");
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		fwrite(buf, 1, n, stdout);
	return 0;
}
`

type profileFixture struct {
	exe      string
	leaf, cl uint64
	maps     []proc.Mapping
}

func buildProfileFixture(t *testing.T) profileFixture {
	t.Helper()
	gcc := testenv.LookPath(t, "gcc")
	dir := t.TempDir()
	src, exe := filepath.Join(dir, "prog.c"), filepath.Join(dir, "prog")
	if err := os.WriteFile(src, []byte(profileFixtureSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-g", "-O0", "-Wl,--build-id", "-o", exe, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(exe).Output()
	if err != nil {
		t.Fatal(err)
	}
	first, rest, _ := strings.Cut(string(out), "\n")
	var fx profileFixture
	if _, err := fmt.Sscanf(first, "%d %d", &fx.leaf, &fx.cl); err != nil {
		t.Fatalf("fixture printed %q: %v", first, err)
	}
	all, err := proc.ParseMaps(strings.NewReader(rest))
	if err != nil {
		t.Fatal(err)
	}
	id, err := symbolize.BuildID(exe)
	if err != nil || id == "" {
		t.Fatalf("build ID of %s: %q, %v", exe, id, err)
	}
	for _, m := range all {
		if m.Path == exe {
			m.BuildID = id // as the recorder captures it
			fx.maps = append(fx.maps, m)
		}
	}
	fx.exe = exe
	return fx
}

// profileItems: pid 10 allocates on two devices from two stacks, frees one
// allocation, pins host memory and fails once; pid 11 is never captured.
func profileItems(fx profileFixture) []any {
	ev := func(tm uint64, pid uint32, api events.API, addr, size uint64, dev int32, stack ...uint64) events.Event {
		return events.Event{Time: memvizBase + tm, Duration: 10, PID: pid, TID: pid, Comm: "prog", API: api,
			Addr: addr, Size: size, Device: dev, Stack: stack}
	}
	fail := ev(2500, 10, events.CudaMalloc, 0, 1<<40, 0, fx.leaf)
	fail.Result = 2
	return []any{
		(&procmodel.Capture{PID: 10, Comm: "prog", Time: memvizBase, Maps: fx.maps}).File(),
		ev(1000, 10, events.CudaMalloc, 0x1000, 1000, 0, fx.leaf, fx.cl),
		ev(1100, 10, events.CudaMalloc, 0x2000, 3000, 0, fx.leaf, fx.cl),
		ev(1200, 10, events.CudaMalloc, 0x3000, 500, 1, fx.cl),
		ev(1300, 10, events.CudaMallocHost, 0x4000, 64, 0, fx.cl),
		events.Event{Time: memvizBase + 2000, PID: 10, TID: 10, Comm: "prog", API: events.CudaFree, Addr: 0x2000,
			Flags: events.FlagEntryOnly},
		fail,
		ev(3000, 11, events.CudaMallocManaged, 0x5000, 7, 2, 0xdead),
		&tracefile.End{Time: memvizBase + 4000},
	}
}

type sampleRow struct {
	pid               int64
	device, api, kind string
	values            [4]int64
	funcs             string
}

func sampleRows(p *profile.Profile) []sampleRow {
	var rows []sampleRow
	for _, s := range p.Sample {
		var funcs []string
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				funcs = append(funcs, l.Function.Name)
			}
			if len(loc.Line) == 0 {
				funcs = append(funcs, fmt.Sprintf("%#x", loc.Address))
			}
		}
		if s.Label["level"][0] != "segment" || s.Label["comm"][0] != "prog" {
			panic(fmt.Sprintf("labels %v", s.Label))
		}
		// Each sample fills its class's group of four (Values): GPU
		// memory, tensors or pinned host memory; the others stay 0.
		group := 0
		switch {
		case s.Label["level"][0] == "tensor":
			group = 1
		case s.Label["kind"][0] == "host":
			group = 2
		}
		for i, v := range s.Value {
			if i/4 != group && v != 0 {
				panic(fmt.Sprintf("sample %v: value %d (%s) outside its group %d", s.Label, i, p.SampleType[i].Type, group))
			}
		}
		rows = append(rows, sampleRow{s.NumLabel["pid"][0], s.Label["device"][0], s.Label["api"][0], s.Label["kind"][0],
			[4]int64(s.Value[4*group:]), strings.Join(funcs, "<")})
	}
	return rows
}

func writeProfile(t *testing.T, path string, opts Options) (*profile.Profile, string) {
	t.Helper()
	var buf bytes.Buffer
	if err := WritePprof(&buf, path, opts); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "p.pb.gz")
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return p, out
}

func TestPprof(t *testing.T) {
	fx := buildProfileFixture(t)
	path, _ := tracetest.Write(t, memvizMeta(), profileItems(fx)...)
	p, file := writeProfile(t, path, Options{})

	var types []string
	for _, st := range p.SampleType {
		types = append(types, st.Type+"/"+st.Unit)
	}
	if want := []string{"alloc_objects/count", "alloc_space/bytes", "inuse_objects/count", "inuse_space/bytes",
		"tensor_alloc_objects/count", "tensor_alloc_space/bytes", "tensor_inuse_objects/count", "tensor_inuse_space/bytes",
		"host_alloc_objects/count", "host_alloc_space/bytes", "host_inuse_objects/count", "host_inuse_space/bytes",
	}; !slices.Equal(types, want) || p.DefaultSampleType != "inuse_space" {
		t.Errorf("sample types %v (default %q), want %v (inuse_space)", types, p.DefaultSampleType, want)
	}
	if p.TimeNanos != memvizMeta().StartWall.UnixNano() || p.DurationNanos != 4000 {
		t.Errorf("time %d duration %d", p.TimeNanos, p.DurationNanos)
	}
	// Values: alloc_objects, alloc_space, inuse_objects, inuse_space of
	// the sample's group (the host one's are host_*).
	want := []sampleRow{
		{10, "0", "cudaMalloc", "device", [4]int64{2, 4000, 1, 1000}, "leaf<caller"},
		{10, "0", "cudaMallocHost", "host", [4]int64{1, 64, 1, 64}, "caller"},
		{10, "1", "cudaMalloc", "device", [4]int64{1, 500, 1, 500}, "caller"},
		{11, "2", "cudaMallocManaged", "managed", [4]int64{1, 7, 1, 7}, "0xdead"},
	}
	if got := sampleRows(p); !reflect.DeepEqual(got, want) {
		t.Errorf("samples\n got %+v\nwant %+v", got, want)
	}

	// The fixture's mapping, with its build ID and flags; the file and lines
	// of the functions.
	var m *profile.Mapping
	for _, pm := range p.Mapping {
		if pm.File == fx.exe {
			m = pm
		}
	}
	if m == nil || m.BuildID == "" || !m.HasFunctions || !m.HasFilenames || !m.HasLineNumbers {
		t.Fatalf("mapping of %s: %+v", fx.exe, m)
	}
	for _, fn := range p.Function {
		if !strings.HasSuffix(fn.Filename, "prog.c") {
			t.Errorf("function %s in %q, want prog.c", fn.Name, fn.Filename)
		}
	}
	for _, loc := range p.Location {
		if len(loc.Line) > 0 && (loc.Mapping != m || loc.Line[0].Line == 0) {
			t.Errorf("location %#x: mapping %v line %d", loc.Address, loc.Mapping, loc.Line[0].Line)
		}
	}

	// go tool pprof reads it. By default the total is the GPU memory live
	// at the end, as the report says it: 1000 + 500 + 7 bytes, without the
	// 64 bytes of pinned host memory, which host_inuse_space selects.
	goTool := testenv.LookPath(t, "go")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"File: " + filepath.Base(fx.exe), "Type: inuse_space", "Total samples = 1507B", "1000B", "leaf"}},
		{[]string{"-sample_index=host_inuse_space"}, []string{"Type: host_inuse_space", "Total samples = 64B"}},
	} {
		out, err := exec.Command(goTool, append(append([]string{"tool", "pprof", "-top"}, c.args...), file)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go tool pprof: %v\n%s", err, out)
		}
		for _, w := range c.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("go tool pprof -top %v lacks %q:\n%s", c.args, w, out)
			}
		}
	}
}

// --at peak and --at TIME: inuse_* is the live set then, alloc_* counts up
// to then; --pid keeps one process.
func TestPprofAt(t *testing.T) {
	fx := buildProfileFixture(t)
	path, _ := tracetest.Write(t, memvizMeta(), profileItems(fx)...)

	// The summed GPU peak: 4500 bytes, when the third allocation returned.
	p, _ := writeProfile(t, path, Options{At: Moment{Peak: true}, NoSymbolize: true})
	var inuse, alloc int64
	for _, s := range p.Sample {
		alloc += s.Value[1]
		inuse += s.Value[3]
	}
	if inuse != 4500 || alloc != 4500 || p.DurationNanos != 1210 {
		t.Errorf("at the peak: inuse %d alloc %d duration %d, want 4500, 4500, 1210", inuse, alloc, p.DurationNanos)
	}
	for _, loc := range p.Location {
		if len(loc.Line) != 0 {
			t.Errorf("NoSymbolize, yet %#x has lines %v", loc.Address, loc.Line)
		}
	}

	p, _ = writeProfile(t, path, Options{At: Moment{At: 1150 * time.Nanosecond}, PIDs: []uint32{10}})
	inuse = 0
	for _, s := range p.Sample {
		inuse += s.Value[3]
		if s.NumLabel["pid"][0] != 10 {
			t.Errorf("pid %v with --pid 10", s.NumLabel["pid"])
		}
	}
	if inuse != 4000 {
		t.Errorf("at 1.15µs: inuse %d, want 4000", inuse)
	}

	empty, _ := tracetest.Write(t, memvizMeta(), &tracefile.End{Time: memvizBase + 1})
	if err := WritePprof(&bytes.Buffer{}, empty, Options{At: Moment{Peak: true}}); err == nil ||
		!strings.Contains(err.Error(), "no GPU memory was allocated") {
		t.Errorf("peak of an empty trace: %v", err)
	}
}

// pprof names a profile ("File:") after its first mapping: the program's,
// not that of the library the first sample's innermost frame is in.
func TestPprofFileNamesProgram(t *testing.T) {
	maps := []proc.Mapping{
		{Start: 0x1000, End: 0x2000, Perms: "r-xp", Path: "/opt/train"},
		{Start: 0x7f00_0000_0000, End: 0x7f00_0001_0000, Perms: "r-xp", Path: "/usr/lib/libc10_cuda.so"},
	}
	ev := func(tm uint64, addr uint64, stack ...uint64) events.Event {
		return events.Event{Time: memvizBase + tm, Duration: 10, PID: 10, TID: 10, Comm: "train", API: events.CudaMalloc,
			Addr: addr, Size: 100, Stack: stack}
	}
	path, _ := tracetest.Write(t, memvizMeta(),
		(&procmodel.Capture{PID: 10, Comm: "train", Time: memvizBase, Maps: maps}).File(),
		ev(1000, 0x10000, 0x7f00_0000_0100),
		ev(2000, 0x20000, 0x7f00_0000_0100, 0x1100),
		&tracefile.End{Time: memvizBase + 4000})
	p, _ := writeProfile(t, path, Options{NoSymbolize: true})
	if len(p.Mapping) != 2 || p.Mapping[0].File != "/opt/train" {
		var files []string
		for _, m := range p.Mapping {
			files = append(files, m.File)
		}
		t.Errorf("mappings %v, want /opt/train first", files)
	}
}
