package export

import (
	"bytes"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Each sample carries the owner of its stack (package owner) as a label:
// pprof -tagfocus owner=nccl keeps NCCL's memory.
func TestPprofOwnerLabel(t *testing.T) {
	const base = 1_000_000_000
	ev := func(tm uint64, api events.API, addr, size uint64, stack ...uint64) events.Event {
		return events.Event{Time: base + tm, PID: 9, TID: 9, Comm: "own", API: api, Addr: addr, Size: size, Stack: stack}
	}
	m := func(start uint64, path string) tracefile.Mapping {
		return tracefile.Mapping{Start: start, End: start + 0x1000, Perms: "r-xp", Path: path}
	}
	path, _ := tracetest.Write(t, tracefile.Meta{Tool: "test", StartBoot: base},
		&tracefile.Process{PID: 9, Comm: "own", Time: base + 1, Maps: []tracefile.Mapping{
			m(0x1000, "/nonexistent/own"), m(0x10000, "/nonexistent/libc10_cuda.so"),
			m(0x20000, "/nonexistent/libnccl.so.2"), m(0x30000, "/nonexistent/libcudart.so.12")}},
		ev(10, events.CudaMalloc, 0xa000, 4096, 0x10010, 0x1010),
		ev(20, events.CuMemAlloc, 0xb000, 512, 0x30010, 0x20010, 0x1020),
		ev(30, events.CudaMalloc, 0xc000, 64, 0x30020, 0x1030),
		&tracefile.End{Time: base + 100, Events: 3},
	)
	var buf bytes.Buffer
	if err := WritePprof(&buf, path, Options{NoSymbolize: true}); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, s := range p.Sample {
		if o := s.Label["owner"]; len(o) == 1 {
			got[o[0]] += s.Value[3] // inuse_space
		} else {
			t.Errorf("sample with owner labels %v", o)
		}
	}
	want := map[string]int64{"pytorch": 4096, "nccl": 512, "application": 64}
	if len(got) != len(want) {
		t.Errorf("inuse_space by owner %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("inuse_space by owner %v, want %v", got, want)
			break
		}
	}
}
