package loader

import (
	"os"
	"testing"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/internal/testenv"
)

// The maps keyed by process: an entry the reader put in for a process
// already gone (the filter, a Python layout), or one BPF left (a context's
// device and usage count: BPF cannot list a process's handles at its
// exit), is counted by MapUses and removed by Sweep, and a living
// process's stays, even for the same context handle.
func TestSweepForgetsTheDead(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	tr, err := New(Options{FilterPIDs: true, StackWindow: -1})
	if err != nil {
		testenv.SkipOrFail(t, "load BPF: %v", err)
	}
	defer tr.Close()
	self := uint32(os.Getpid())
	const dead = 1<<22 + 7 // above pid_max's largest: never a process
	for _, pid := range []uint32{self, dead} {
		if err := tr.AddPID(pid, false); err != nil {
			t.Fatal(err)
		}
	}
	var o bpf.CudatraceCtPyoffsets
	o.FrPrevious, o.FrCode, o.FrInstr, o.FrOwner, o.FrEntry = 8, 16, 24, -1, -1
	o.CoFilename, o.CoName, o.CoLinetable, o.CoFirstlineno = -1, -1, -1, -1
	if err := tr.SetPython(dead, &o); err != nil {
		t.Fatal(err)
	}
	const handle = 0xc7c1000 // the stand-in driver's first created context
	for _, pid := range []uint32{self, dead} {
		k := bpf.CudatraceCtxKey{Tgid: pid, Handle: handle}
		if err := tr.objs.CtxDev.Put(k, int32(pid&1)); err != nil {
			t.Fatal(err)
		}
		if err := tr.objs.CtxRefs.Put(k, int32(1)); err != nil {
			t.Fatal(err)
		}
	}
	count := func() map[string]uint32 {
		uses, err := tr.MapUses()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint32{}
		for _, u := range uses {
			if u.Capacity == 0 {
				t.Errorf("map %s: capacity 0", u.Name)
			}
			out[u.Name] = u.Entries
		}
		if len(out) != len(KeyedMaps) {
			t.Errorf("MapUses counted %d maps, want %d", len(out), len(KeyedMaps))
		}
		return out
	}
	if c := count(); c["pids"] != 2 || c["py_procs"] != 1 || c["ctx_dev"] != 2 || c["ctx_refs"] != 2 {
		t.Errorf("before the sweep: %v, want 2 in pids, 1 in py_procs, 2 in ctx_dev and ctx_refs", c)
	}
	if n := tr.Sweep(func(pid uint32) bool { return pid == self }); n != 1 {
		t.Errorf("Sweep forgot %d processes, want 1", n)
	}
	if c := count(); c["pids"] != 1 || c["py_procs"] != 0 || c["ctx_dev"] != 1 || c["ctx_refs"] != 1 {
		t.Errorf("after the sweep: %v, want 1 in pids, ctx_dev and ctx_refs (this process), 0 in py_procs", c)
	}
	var dev int32
	if err := tr.objs.CtxDev.Lookup(bpf.CudatraceCtxKey{Tgid: self, Handle: handle}, &dev); err != nil || dev != int32(self&1) {
		t.Errorf("this process's context after the sweep: device %d (%v), want %d", dev, err, self&1)
	}
	if got := tr.TracedPIDs(); len(got) != 1 || got[0] != self {
		t.Errorf("traced after the sweep: %v, want [%d]", got, self)
	}
}
