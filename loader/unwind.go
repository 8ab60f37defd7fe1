package loader

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"

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
	if err := writeMem(&t.uwMem, t.objs.UwRows, int64(first), rows); err != nil {
		return fmt.Errorf("map uw_rows: %w", err)
	}
	if len(index) == 0 {
		return nil
	}
	if err := writeMem(&t.uwIndexMem, t.objs.UwIndex, int64(first), index); err != nil {
		return fmt.Errorf("map uw_index: %w", err)
	}
	return nil
}

// writeMem writes vs at element at of array map m through its memory
// mapping, *mem, mapped at the first write. T's size is a multiple of 8:
// the kernel lays an array's elements out 8 bytes apart at least.
func writeMem[T any](mem **ebpf.Memory, m *ebpf.Map, at int64, vs []T) error {
	if *mem == nil {
		mm, err := m.Memory()
		if err != nil {
			return err
		}
		*mem = mm
	}
	size := int(unsafe.Sizeof(vs[0]))
	b := unsafe.Slice((*byte)(unsafe.Pointer(&vs[0])), len(vs)*size)
	_, err := (*mem).WriteAt(b, at*int64(size))
	return err
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
