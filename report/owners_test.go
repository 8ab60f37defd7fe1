package report

import (
	"reflect"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/tracefile"
)

// A process whose stacks run through files named as PyTorch's allocator,
// NCCL and cuBLAS, and its own: each allocation is charged to the owner
// whose file is innermost, past CUDA's own libraries.
func TestOwners(t *testing.T) {
	const (
		app   = 0x1000
		c10   = 0x10000
		nccl  = 0x20000
		blas  = 0x30000
		rt    = 0x40000
		drv   = 0x50000
		pid   = 300
		gpu1  = 1
		c10MB = 1 << 20
	)
	ev := func(t uint64, api events.API, addr, size uint64, dev int32, stack ...uint64) events.Event {
		return events.Event{Time: base + t, Duration: 10, PID: pid, TID: pid, Comm: "owners", API: api,
			Addr: addr, Size: size, Device: dev, Stack: stack}
	}
	free := func(t uint64, addr uint64) events.Event {
		return events.Event{Time: base + t, PID: pid, TID: pid, Comm: "owners", API: events.CudaFree, Addr: addr,
			Flags: events.FlagEntryOnly}
	}
	m := func(start uint64, path string) tracefile.Mapping {
		return tracefile.Mapping{Start: start, End: start + 0x1000, Perms: "r-xp", Path: path}
	}
	path, _ := tracetest.Write(t, testMeta(),
		&tracefile.Process{PID: pid, Comm: "owners", Time: base + 1, Maps: []tracefile.Mapping{
			m(app, "/opt/app/owners"), m(c10, "/venv/torch/lib/libc10_cuda.so"), m(nccl, "/venv/nvidia/nccl/lib/libnccl.so.2"),
			m(blas, "/venv/nvidia/cublas/lib/libcublas.so.12"), m(rt, "/usr/lib/libcudart.so.12"), m(drv, "/usr/lib/libcuda.so.1")}},
		ev(100, events.CudaMalloc, 0xa000, 2*c10MB, 0, c10+0x10, app+0x10),
		ev(200, events.CuMemAlloc, 0xb000, 3000, 0, rt+0x10, drv+0x10, nccl+0x10, app+0x20),
		ev(300, events.CudaMalloc, 0xc000, 500, gpu1, blas+0x10, c10+0x20, app+0x30),
		ev(400, events.CudaMalloc, 0xd000, 70, 0, rt+0x20, app+0x40),
		ev(500, events.CudaMalloc, 0xe000, 4*c10MB, 0, c10+0x10, app+0x10), // the peak
		free(600, 0xe000),
		&tracefile.End{Time: base + 1000, Events: 6, Reason: "command exited"},
	)
	rep, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []ProcessOwners{{PID: pid,
		End: []OwnerShare{
			{Device: 0, Owner: "pytorch", LiveBytes: 2 * c10MB, LiveCount: 1},
			{Device: 0, Owner: "nccl", LiveBytes: 3000, LiveCount: 1},
			{Device: 0, Owner: "application", Module: "owners", LiveBytes: 70, LiveCount: 1},
			{Device: 1, Owner: "cublas", LiveBytes: 500, LiveCount: 1}},
		Peak: []OwnerShare{
			{Device: 0, Owner: "pytorch", LiveBytes: 6 * c10MB, LiveCount: 2},
			{Device: 0, Owner: "nccl", LiveBytes: 3000, LiveCount: 1},
			{Device: 0, Owner: "application", Module: "owners", LiveBytes: 70, LiveCount: 1},
			{Device: 1, Owner: "cublas", LiveBytes: 500, LiveCount: 1}}}}
	if !reflect.DeepEqual(rep.Owners, want) {
		t.Errorf("owners:\n got %+v\nwant %+v", rep.Owners, want)
	}
	if got := OwnerBytes(rep.Owners[0].Peak); !reflect.DeepEqual(got, map[string]uint64{"pytorch": 6 * c10MB, "nccl": 3000, "application": 70, "cublas": 500}) {
		t.Errorf("OwnerBytes at the peak = %v", got)
	}
}
