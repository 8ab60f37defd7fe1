package agent

import (
	"os"
	"reflect"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
)

// Each process's live GPU memory by device and owner, to the byte, as
// allocations come and go: NCCL's VMM memory, PyTorch's segments, the
// application's own; pinned host memory is none of them.
func TestStatsOwners(t *testing.T) {
	s := newSession(t, Options{})
	pid := uint32(os.Getpid())
	s.run(func() {
		s.a.Process(&procmodel.Capture{PID: pid, Comm: "job", Maps: []proc.Mapping{
			{Start: 0x1000, End: 0x2000, Path: "/opt/job"},
			{Start: 0x10000, End: 0x11000, Path: "/venv/torch/lib/libc10_cuda.so"},
			{Start: 0x20000, End: 0x21000, Path: "/venv/nvidia/nccl/lib/libnccl.so.2"},
			{Start: 0x30000, End: 0x31000, Path: "/usr/lib/libcudart.so.12"}}})
	})
	ev := func(api events.API, addr, size uint64, dev int32, stack ...uint64) events.Event {
		return events.Event{PID: pid, TID: pid, Comm: "job", API: api, Addr: addr, Size: size, Device: dev, Stack: stack}
	}
	s.event(ev(events.CudaMalloc, 0xa000, 2<<20, 0, 0x30010, 0x10010, 0x1010))
	s.event(ev(events.CudaMalloc, 0xb000, 2<<20, 1, 0x30010, 0x10010, 0x1010))
	s.event(ev(events.CuMemCreate, 0x77, 4<<20, 0, 0x20010, 0x1020))
	s.event(ev(events.CudaMalloc, 0xc000, 300, 0, 0x30020, 0x1030))
	s.event(ev(events.CudaMalloc, 0xd000, 500, 0, 0x30020, 0x1030))
	s.event(ev(events.CudaMallocHost, 0xe000, 64, 0, 0x30030, 0x1040))
	s.event(events.Event{PID: pid, TID: pid, Comm: "job", API: events.CudaFree, Addr: 0xd000, Flags: events.FlagEntryOnly})
	st, err := s.a.Stats(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []OwnerLive{{0, "nccl", 4 << 20}, {0, "pytorch", 2 << 20}, {0, "application", 300}, {1, "pytorch", 2 << 20}}
	if len(st.Processes) != 1 || !reflect.DeepEqual(st.Processes[0].Owners, want) {
		t.Errorf("owners %+v, want %+v", st.Processes, want)
	}
}
