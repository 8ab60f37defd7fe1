package loader

import (
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/bpf"
)

// TestCheckPyOffsets: the layouts the BPF walk takes, and those it
// refuses (a frame field past what it reads of a frame, an 8-byte field
// it would take with a misaligned load, a code object field its capture
// would not find in what it reads).
func TestCheckPyOffsets(t *testing.T) {
	// CPython 3.12's (pystack's table for x86-64)
	ok := bpf.CudatraceCtPyoffsets{TsNativeId: 144, TsThreadId: 136, TsFrame: -1, TsCframe: 56, CfCurrent: 0,
		FrPrevious: 8, FrCode: 0, FrInstr: 56, FrOwner: 70, FrEntry: -1, Minor: 12,
		CoFilename: 112, CoName: 128, CoLinetable: 136, CoFirstlineno: 68}
	if err := checkPyOffsets(&ok); err != nil {
		t.Errorf("3.12's layout: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(o *bpf.CudatraceCtPyoffsets)
		want string
	}{
		{"owner past the read", func(o *bpf.CudatraceCtPyoffsets) { o.FrOwner = PyFrameRead }, "lies past"},
		{"previous absent", func(o *bpf.CudatraceCtPyoffsets) { o.FrPrevious = -1 }, "lies past"},
		{"misaligned instruction", func(o *bpf.CudatraceCtPyoffsets) { o.FrInstr = 60 }, "not 8-byte aligned"},
		{"misaligned thread id", func(o *bpf.CudatraceCtPyoffsets) { o.TsNativeId = 146 }, "not 8-byte aligned"},
		{"file name past the capture's read", func(o *bpf.CudatraceCtPyoffsets) { o.CoFilename = PyCodeHead - 4 }, "past the bytes its capture reads"},
		{"identity spread wider than one read", func(o *bpf.CudatraceCtPyoffsets) { o.CoFirstlineno = 4 }, "past the bytes its capture reads"},
		{"misaligned line table", func(o *bpf.CudatraceCtPyoffsets) { o.CoLinetable = 140 }, "not aligned"},
	} {
		o := ok
		c.edit(&o)
		if err := checkPyOffsets(&o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}
