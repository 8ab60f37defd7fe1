package pystack

import (
	"cmp"
	"fmt"
	"math"

	"github.com/cudatrace/cudatrace/bpf"
)

// What BPF is told. The walk of a thread's frames at each allocation
// (bpf/python.h) and the capture of each code object it shows
// (bpf/pycode.h) take an interpreter's layout as struct ct_pyoffsets
// (bpf/cudatrace.h): BPF gives it for a process, BPFFile for every
// process that maps the interpreter's file. Both check it first: the
// loader puts what it is given.

// The bytes BPF reads at once, which every field it takes must lie in
// (checkBPF). TestBPFReads checks each against its #define in bpf/.
const (
	// bpfFrameRead is CT_PY_FRAME_READ (bpf/cudatrace.h): the bytes of an
	// interpreter frame the walk reads at once.
	bpfFrameRead = 128
	// bpfCodeHead is CT_PYCODE_HEAD (bpf/cudatrace.h): the bytes of a code
	// object its capture reads.
	bpfCodeHead = 256
	// bpfIdentRead is CT_PY_IDENT_READ (bpf/pycode.h): the bytes a code
	// object's identity's fields lie in, read at once.
	bpfIdentRead = 128
)

// BPF is the interpreter's layout as BPF takes it for the process it was
// found in (struct ct_pyoffsets): the address of the interpreter list's
// head there and the structure offsets, -1 where the version has no such
// field. It fails for a layout the walk cannot take (checkBPF).
func (in *Interp) BPF() (bpf.CudatraceCtPyoffsets, error) {
	o := &in.off
	l := bpf.CudatraceCtPyoffsets{InterpHead: in.runtime + uint64(o.interpHead), InterpThreads: o.interpThreads,
		TsNext: o.tsNext, TsNativeId: o.tsNativeID, TsThreadId: o.tsThreadID, TsFrame: o.tsFrame,
		TsCframe: o.tsCFrame, CfCurrent: o.cfCurrent, FrPrevious: o.frPrevious, FrCode: o.frCode,
		FrInstr: o.frInstr, FrOwner: o.frOwner, FrEntry: o.frEntry, CoCodeAdaptive: o.coCodeAdaptive,
		Minor: uint16(in.Minor),
		// What names a code object, for its capture: co_filename,
		// co_qualname (co_name before 3.11), co_linetable, co_firstlineno.
		CoFilename: o.coFilename, CoName: cmp.Or(max(o.coQualname, 0), o.coName), CoLinetable: o.coLinetable,
		CoFirstlineno: o.coFirstLine, TsInterp: -1, InterpCodeGen: -1}
	if o.interpCodeGen > 0 && o.tsInterp > 0 && o.tsInterp <= math.MaxInt16 && o.interpCodeGen <= math.MaxInt32 {
		l.TsInterp, l.InterpCodeGen = int16(o.tsInterp), int32(o.interpCodeGen)
	}
	return l, checkBPF(&l)
}

// BPFFile is BPF's layout with the interpreter list's head relative to
// the load bias of the interpreter's file (0 for one from DetectFile):
// what it holds in every process that maps the file, which BPF gives each as its dynamic loader
// maps it (bpf/notify.h py_files, py_learn).
func (in *Interp) BPFFile() (bpf.CudatraceCtPyoffsets, error) {
	l, err := in.BPF()
	l.InterpHead -= in.base
	return l, err
}

// checkBPF refuses a layout the BPF walk cannot take: a frame field past
// the bytes it reads of a frame, or an 8-byte field (a pointer, the
// thread's id, 3.10's f_lasti) at an offset that is not a multiple of 8,
// which the walk takes with one aligned load (bpf/python.h, buf_u64).
func checkBPF(o *bpf.CudatraceCtPyoffsets) error {
	for _, f := range []struct {
		name      string
		off, size int64
	}{{"previous", o.FrPrevious, 8}, {"code", o.FrCode, 8}, {"instruction", o.FrInstr, 8}, {"owner", o.FrOwner, 1}, {"is_entry", o.FrEntry, 1}} {
		if f.off >= 0 && f.off+f.size > bpfFrameRead || f.off < -1 || f.off == -1 && f.size == 8 {
			return fmt.Errorf("frame field %s at %d lies past the %d bytes the walk reads of a frame", f.name, f.off, bpfFrameRead)
		}
	}
	// The code object's fields its capture takes (bpf/pycode.h): in the
	// bytes it reads of the object, and those of its identity within the
	// bytes it reads of them at once. A layout without them is walked,
	// its code objects read from the process instead (ct_py_capture
	// captures none).
	if o.CoFilename >= 0 && o.CoName >= 0 && o.CoLinetable >= 0 && o.CoFirstlineno >= 0 {
		lo := min(o.CoFilename, o.CoName, o.CoLinetable, o.CoFirstlineno) &^ 7
		for _, f := range []struct {
			name      string
			off, size int64
		}{{"co_filename", o.CoFilename, 8}, {"co_name", o.CoName, 8}, {"co_linetable", o.CoLinetable, 8}, {"co_firstlineno", o.CoFirstlineno, 4}} {
			if f.off+f.size > bpfCodeHead || f.off-lo+f.size > bpfIdentRead || f.off%f.size != 0 {
				return fmt.Errorf("code object field %s at %d lies past the bytes its capture reads, or is not aligned", f.name, f.off)
			}
		}
	}
	for _, f := range []struct {
		name string
		off  int64
	}{{"frame previous", o.FrPrevious}, {"frame code", o.FrCode}, {"frame instruction", o.FrInstr},
		{"thread state native_thread_id", o.TsNativeId}, {"thread state thread_id", o.TsThreadId},
		{"thread state frame", o.TsFrame}, {"thread state cframe", o.TsCframe}, {"cframe current_frame", o.CfCurrent},
		{"thread state interp", int64(o.TsInterp)}, {"interpreter _code_object_generation", int64(o.InterpCodeGen)}} {
		if f.off >= 0 && f.off%8 != 0 {
			return fmt.Errorf("%s at %d is not 8-byte aligned", f.name, f.off)
		}
	}
	return nil
}
