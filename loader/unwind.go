package loader

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/bpf"
)

// Unwinding in BPF (bpf/unwind.h): the loader holds the maps, the reader
// (record) decides what goes in them: each file's rows (UnwindRows, a
// range of uw_rows each), each process's mappings with rows
// (SetUnwindMaps), dropped at its end (Forget, and BPF's own at the exit).

// UnwindMode says where allocation stacks are unwound.
type UnwindMode uint8

const (
	// UnwindDefault: UnwindOff here; record chooses UnwindBPF unless
	// CUDATRACE_UNWIND=window.
	UnwindDefault UnwindMode = iota
	// UnwindBPF unwinds in BPF; a record whose unwind falls back carries
	// the frame-pointer walk and the window for user space.
	UnwindBPF
	// UnwindBoth unwinds in BPF and copies the window too, for user
	// space to unwind as the reference (--keep-stack-windows).
	UnwindBoth
	// UnwindOff copies the window into every record (the way before).
	UnwindOff
)

// uwModes maps a mode to bpf/unwind.h's uw_mode.
var uwModes = map[UnwindMode]uint8{UnwindBPF: 1, UnwindBoth: 2, UnwindOff: 0}

// DefaultUnwindRows is how many rows uw_rows holds (16 bytes each, and
// 4 bytes each of uw_index, the rows' index, its room the rows'): the
// rows of libcudart, libc, ld.so and CPython take some 60000 between them;
// a file whose rows do not fit is unwound from the window, counted.
const DefaultUnwindRows = 1 << 20

// MaxUnwindMaps is CT_UW_MAPS: the executable mappings with rows a
// process may have; past it, the rest fall back.
const MaxUnwindMaps = 512

// UnwindRow, UnwindBucket and UnwindMap are struct ct_uw_row, struct
// ct_uw_bucket and struct ct_uw_map.
type (
	UnwindRow    = bpf.CudatraceCtUwRow
	UnwindBucket = bpf.CudatraceCtUwBucket
	UnwindMap    = bpf.CudatraceCtUwMap
)

// Unwinds says whether the tracer unwinds stacks in BPF, and so wants
// rows and mappings.
func (t *Tracer) Unwinds() bool { return t.uwMode == UnwindBPF || t.uwMode == UnwindBoth }

// UnwindRowCap is how many rows uw_rows holds.
func (t *Tracer) UnwindRowCap() uint32 { return t.objs.UwRows.MaxEntries() }

// mapUnwind maps uw_rows and uw_index into memory as tracing starts, when
// it unwinds in BPF, for WriteUnwindRows; Close unmaps them. The kernel
// inserts all of an array's pages at the mmap (remap_vmalloc_range), and
// they count in the process's resident memory (VmRSS, RssFile) from then
// on: mapped at the first write, as they were, the tracer's resident
// memory jumped by their size (24 MiB with the default rows) whenever
// some file's rows were first loaded, minutes into a run, and a watcher
// of the agent's memory saw a leak where the kernel's memory had been the
// same from the start. The mapping is the tracer's own (not the library's
// ebpf.Memory, which is unmapped only when the garbage collector finds it
// unused, after the maps are closed).
func (t *Tracer) mapUnwind() error {
	if !t.Unwinds() {
		return nil
	}
	for _, m := range []struct {
		mem *[]byte
		m   *ebpf.Map
	}{{&t.uwRowsMem, t.objs.UwRows}, {&t.uwIndexMem, t.objs.UwIndex}} {
		size := int(m.m.MaxEntries()) * int(m.m.ValueSize())
		b, err := unix.Mmap(m.m.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return fmt.Errorf("map %s into memory (to write unwind rows): %w", m.m, err)
		}
		*m.mem = b
	}
	return nil
}

// unmapUnwind undoes mapUnwind.
func (t *Tracer) unmapUnwind() error {
	var errs []error
	for _, m := range []*[]byte{&t.uwRowsMem, &t.uwIndexMem} {
		if *m != nil {
			errs = append(errs, unix.Munmap(*m))
			*m = nil
		}
	}
	return errors.Join(errs...)
}

// WriteUnwindRows writes rows at index first of uw_rows, and the rows'
// index (unwind.RowIndex's buckets, at most len(rows) + 1) at index first
// of uw_index, through their memory mappings (one copy, no system call
// per row). The caller owns the range: no mapping of a process
// points at it until SetUnwindMaps says.
func (t *Tracer) WriteUnwindRows(first uint32, rows []UnwindRow, index []UnwindBucket) error {
	if uint64(first)+uint64(max(len(rows), len(index))) > uint64(t.UnwindRowCap()) {
		return fmt.Errorf("unwind rows %d to %d: beyond the %d uw_rows holds", first, int(first)+max(len(rows), len(index)), t.UnwindRowCap())
	}
	if len(rows) == 0 {
		return nil
	}
	if err := writeMem(t.uwRowsMem, int64(first), rows); err != nil {
		return fmt.Errorf("map uw_rows: %w", err)
	}
	if len(index) == 0 {
		return nil
	}
	if err := writeMem(t.uwIndexMem, int64(first), index); err != nil {
		return fmt.Errorf("map uw_index: %w", err)
	}
	return nil
}

// writeMem writes vs at element at of an array map mapped at mem. T's
// size is a multiple of 8: the kernel lays an array's elements out 8
// bytes apart at least.
func writeMem[T any](mem []byte, at int64, vs []T) error {
	size := int64(unsafe.Sizeof(vs[0]))
	if mem == nil {
		return errors.New("not mapped: the tracer does not unwind in BPF, or is closed")
	}
	if at < 0 || (at+int64(len(vs)))*size > int64(len(mem)) {
		return fmt.Errorf("elements %d to %d: beyond the map's %d bytes", at, at+int64(len(vs)), len(mem))
	}
	copy(mem[at*size:], unsafe.Slice((*byte)(unsafe.Pointer(&vs[0])), int64(len(vs))*size))
	return nil
}

// SetUnwindMaps gives process pid its executable mappings with rows,
// sorted by start (at most MaxUnwindMaps; none: its entry goes).
func (t *Tracer) SetUnwindMaps(pid uint32, maps []UnwindMap) error {
	if len(maps) == 0 {
		if err := t.objs.UwProcs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
		return nil
	}
	if len(maps) > MaxUnwindMaps {
		maps = maps[:MaxUnwindMaps]
	}
	v := t.uwProc
	if v == nil {
		v = new(bpf.CudatraceCtUwProc)
		t.uwProc = v
	}
	v.N = uint32(len(maps))
	t.uwGen++ // never 0: a number no earlier write took (bpf/unwind.h uw_memo)
	v.Gen = t.uwGen
	copy(v.Maps[:], maps)
	clear(v.Maps[len(maps):])
	if err := t.objs.UwProcs.Put(pid, v); err != nil {
		return mapErr(fmt.Errorf("set pid %d's unwind mappings: %w", pid, err))
	}
	return nil
}
