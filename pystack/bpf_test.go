package pystack

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/bpf"
)

// TestCheckBPF: the layouts the BPF walk takes, and those it refuses (a
// frame field past what it reads of a frame, an 8-byte field it would
// take with a misaligned load, a code object field its capture would not
// find in what it reads).
func TestCheckBPF(t *testing.T) {
	// CPython 3.12's (the table for x86-64)
	ok := bpf.CudatraceCtPyoffsets{TsNativeId: 144, TsThreadId: 136, TsFrame: -1, TsCframe: 56, CfCurrent: 0,
		FrPrevious: 8, FrCode: 0, FrInstr: 56, FrOwner: 70, FrEntry: -1, Minor: 12,
		CoFilename: 112, CoName: 128, CoLinetable: 136, CoFirstlineno: 68}
	if err := checkBPF(&ok); err != nil {
		t.Errorf("3.12's layout: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(o *bpf.CudatraceCtPyoffsets)
		want string
	}{
		{"owner past the read", func(o *bpf.CudatraceCtPyoffsets) { o.FrOwner = bpfFrameRead }, "lies past"},
		{"previous absent", func(o *bpf.CudatraceCtPyoffsets) { o.FrPrevious = -1 }, "lies past"},
		{"misaligned instruction", func(o *bpf.CudatraceCtPyoffsets) { o.FrInstr = 60 }, "not 8-byte aligned"},
		{"misaligned thread id", func(o *bpf.CudatraceCtPyoffsets) { o.TsNativeId = 146 }, "not 8-byte aligned"},
		{"file name past the capture's read", func(o *bpf.CudatraceCtPyoffsets) { o.CoFilename = bpfCodeHead - 4 }, "past the bytes its capture reads"},
		{"identity spread wider than one read", func(o *bpf.CudatraceCtPyoffsets) { o.CoFirstlineno = 4 }, "past the bytes its capture reads"},
		{"misaligned line table", func(o *bpf.CudatraceCtPyoffsets) { o.CoLinetable = 140 }, "not aligned"},
	} {
		o := ok
		c.edit(&o)
		if err := checkBPF(&o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	// Every built-in table is one BPF takes, as a process's layout and as
	// a file's.
	for minor, v := range versions {
		if v.table == nil {
			continue
		}
		off := *v.table
		in := &Interp{Minor: minor, off: off, runtime: 0x7f0000001000, base: 0x7f0000000000}
		l, err := in.BPF()
		if err != nil {
			t.Errorf("3.%d's table: %v", minor, err)
		}
		lf, err := in.BPFFile()
		if err != nil || lf.InterpHead != l.InterpHead-in.base || l.InterpHead != in.runtime+uint64(off.interpHead) {
			t.Errorf("3.%d's table: head %#x in the process, %#x in the file: %v", minor, l.InterpHead, lf.InterpHead, err)
		}
	}
}

// TestBPFReads: the bytes checkBPF holds a layout to are those BPF reads,
// each constant the #define it stands for in bpf/, so that a change to one
// fails here until the other follows.
func TestBPFReads(t *testing.T) {
	for _, c := range []struct {
		file, name string
		got        int
	}{
		{"cudatrace.h", "CT_PY_FRAME_READ", bpfFrameRead},
		{"cudatrace.h", "CT_PYCODE_HEAD", bpfCodeHead},
		{"pycode.h", "CT_PY_IDENT_READ", bpfIdentRead},
		{"cudatrace.h", "CT_PY_GEN_FREES", GenFrees},
	} {
		src, err := os.ReadFile("../bpf/" + c.file)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^#define\s+` + c.name + `\s+\(?(-?\d+)\)?`).FindSubmatch(src)
		if m == nil {
			t.Errorf("bpf/%s defines no %s", c.file, c.name)
			continue
		}
		if want, _ := strconv.Atoi(string(m[1])); c.got != want {
			t.Errorf("%s is %d here, %d in bpf/%s", c.name, c.got, want, c.file)
		}
	}
}
