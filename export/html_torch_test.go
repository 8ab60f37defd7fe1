package export

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/tracefile"
)

// torchTrace is a synthetic trace shaped like two ranks of a PyTorch
// training job (pids 7 and 8, on GPUs 0 and 1), every frame named by the
// trace's own symbols and Python tables, so that no file of this machine
// is read: NCCL's buffers, the model's weights in PyTorch's segments (and
// its tensors), a cuBLAS workspace, activations made in forward and freed
// in backward, a leak (train.py:66 keeps 2 MiB of each step), the
// driver's samples, and, on rank 0, an out-of-memory failure at step 150
// (evaluate, train.py:90). The figures the tests check are torch* below.
type torchFacts struct {
	steps        int
	leakPerStep  uint64 // tensor bytes kept by train.py:66 per step
	leakLine     string
	stepNS       uint64
	oomStep      int
	oomSize      uint64
	leakSegment  uint64 // a segment the leak's tensors fill, every leakSegEvery steps
	leakSegEvery int
}

var torch = torchFacts{steps: 200, leakPerStep: 2 << 20, leakLine: "/home/user/train.py:66", stepNS: 20 * ms,
	oomStep: 150, oomSize: 8 << 30, leakSegment: 20 << 20, leakSegEvery: 10}

// Where things are in the processes (the same in both).
const (
	tPython = 0x10000     // /usr/bin/python3.12
	tEval   = tPython     // _PyEval_EvalFrameDefault: [0x10000, 0x11000)
	tCall   = 0x20100     // PyObject_Call
	tMain   = 0x30100     // Py_RunMain
	tCudart = 0x7f00_0000 // libcudart.so.12: cudaMalloc at +0x100
	tC10    = 0x7f10_0000 // libc10_cuda.so: malloc at +0x100, alloc_block at +0x200
	tTorch  = 0x7f20_0000 // libtorch_cuda.so: empty_cuda at +0x100
	tCublas = 0x7f30_0000 // libcublasLt.so.12: cublasLtCtxInit at +0x100
	tNCCL   = 0x7f40_0000 // libnccl.so.2: ncclCommInitRank at +0x100
	tSize   = 0x10_0000
)

// Python code objects: (code, units) -> file, function, line.
var torchCodes = []tracefile.PyCode{
	{Code: 0xc001, Units: 10, File: "/home/user/train.py", Function: "Model.forward", Line: 42},
	{Code: 0xc001, Units: 20, File: "/home/user/train.py", Function: "Model.forward", Line: 44},
	{Code: 0xc002, Units: 5, File: "/home/user/train.py", Function: "train_step", Line: 61},
	{Code: 0xc002, Units: 9, File: "/home/user/train.py", Function: "train_step", Line: 63},
	{Code: 0xc002, Units: 12, File: "/home/user/train.py", Function: "train_step", Line: 66},
	{Code: 0xc003, Units: 3, File: "/home/user/train.py", Function: "main", Line: 80},
	{Code: 0xc003, Units: 5, File: "/home/user/train.py", Function: "main", Line: 82},
	{Code: 0xc003, Units: 7, File: "/home/user/train.py", Function: "main", Line: 85},
	{Code: 0xc003, Units: 11, File: "/home/user/train.py", Function: "main", Line: 90},
	{Code: 0xc004, Units: 4, File: "/opt/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", Function: "Linear.forward", Line: 125},
	{Code: 0xc005, Units: 2, File: "/home/user/train.py", Function: "evaluate", Line: 71},
}

// py is a run of Python frames, innermost first: (code, units) pairs; the
// last of each run is its entry.
func py(runs ...[]events.PyFrame) []events.PyFrame {
	var out []events.PyFrame
	for _, r := range runs {
		r[len(r)-1].Flags = events.PyEntry
		out = append(out, r...)
	}
	return out
}

func pf(code uint64, units int32) events.PyFrame { return events.PyFrame{Code: code, Units: units} }

// torchTrace writes the trace and returns its path.
func torchTrace(t testing.TB) string {
	const base = htmlBase
	lib := func(start uint64, path, id string) proc.Mapping {
		return proc.Mapping{Start: start, End: start + tSize, Perms: "r-xp", Path: path, BuildID: id}
	}
	maps := []proc.Mapping{
		lib(tPython, "/usr/bin/python3.12", "py12"),
		lib(tCudart, "/opt/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12", "cudart"),
		lib(tC10, "/opt/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so", "c10"),
		lib(tTorch, "/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so", "torch"),
		lib(tCublas, "/opt/venv/lib/python3.12/site-packages/nvidia/cublas/lib/libcublasLt.so.12", "cublas"),
		lib(tNCCL, "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2", "nccl"),
	}
	type fn struct {
		start    uint64 // its address
		id, name string // its file's build ID, its name
	}
	mapStart := map[string]uint64{}
	for _, m := range maps {
		mapStart[m.BuildID] = m.Start
	}
	var syms []tracefile.Symbol
	for _, f := range []fn{
		{tEval, "py12", "_PyEval_EvalFrameDefault"}, {tCall - 0x100, "py12", "PyObject_Call"}, {tMain - 0x100, "py12", "Py_RunMain"},
		{tCudart, "cudart", "cudaMalloc"}, {tC10, "c10", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"},
		{tC10 + 0x200, "c10", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block"},
		{tTorch, "torch", "at::native::empty_cuda"}, {tCublas, "cublas", "cublasLtCtxInit"}, {tNCCL, "nccl", "ncclCommInitRank"},
	} {
		for off := f.start - mapStart[f.id]; off < f.start-mapStart[f.id]+0x200; off++ {
			syms = append(syms, tracefile.Symbol{BuildID: f.id, Offset: off, Function: f.name})
		}
	}
	var items []any
	for _, pid := range []uint32{7, 8} {
		items = append(items, (&procmodel.Capture{PID: pid, Comm: "python3", Time: base, Maps: maps,
			Cmdline: []string{"python3", "train.py", "--rank", string(rune('0' + pid - 7))}}).File(),
			&tracefile.Python{PID: pid, Minor: 12, Eval: [][2]uint64{{tEval, tEval + 0x1000}}, Codes: torchCodes})
	}
	items = append(items, &tracefile.Symbols{Frames: syms})

	// Native stacks, innermost first, with one interpreter loop's frame
	// for each run of Python frames (where they go).
	pyStack := func(frames []events.PyFrame, innermost ...uint64) []uint64 {
		out := slices.Clone(innermost)
		for i, f := range frames {
			if f.Flags&events.PyEntry != 0 {
				out = append(out, tCall, tEval+0x100+uint64(i)*0x10)
			}
		}
		return append(out, tMain)
	}
	segStack := []uint64{tCudart + 0x100, tC10 + 0x200 + 0x10, tC10 + 0x100 + 0x10, tTorch + 0x100}
	tensorStack := []uint64{tC10 + 0x100 + 0x20, tTorch + 0x100}
	var evs []events.Event
	at := uint64(base)
	add := func(pid uint32, dt uint64, ev events.Event) {
		at += dt
		ev.Time, ev.PID, ev.TID, ev.Comm = at, pid, pid, "python3"
		if ev.Device == 0 && pid == 8 {
			ev.Device = 1
		}
		if ev.API.Info().Op == events.OpFree {
			ev.Flags |= events.FlagEntryOnly
		} else {
			ev.Duration = 1000
		}
		evs = append(evs, ev)
	}
	withPy := func(ev events.Event, frames []events.PyFrame) events.Event {
		ev.Flags |= events.FlagPython
		ev.Py = frames
		ev.Stack = pyStack(frames, ev.Stack...)
		return ev
	}
	mainRun := func(units int32) []events.PyFrame { return []events.PyFrame{pf(0xc003, units)} }
	stepRun := func(units int32) []events.PyFrame { return []events.PyFrame{pf(0xc002, units), pf(0xc003, 7)} }
	forwardRun := func(units int32) []events.PyFrame { return []events.PyFrame{pf(0xc004, 4), pf(0xc001, units)} }
	seg := func(addr, size uint64, frames []events.PyFrame) events.Event {
		return withPy(events.Event{API: events.CudaMalloc, Addr: addr, Size: size, Stack: segStack}, frames)
	}
	tensor := func(addr, size uint64, frames []events.PyFrame) events.Event {
		return withPy(events.Event{API: events.TorchMalloc, Addr: addr, Size: size, Stack: tensorStack}, frames)
	}
	tfree := func(addr uint64) events.Event { return events.Event{API: events.TorchFree, Addr: addr} }

	for _, pid := range []uint32{7, 8} {
		at = base + uint64(pid-7)*ms/2
		seg0 := uint64(0x7000_0000_0000) + uint64(pid)<<36
		// NCCL's buffers, the weights, the workspace.
		add(pid, ms, withPy(events.Event{API: events.CudaMalloc, Addr: seg0, Size: 64 << 20,
			Stack: []uint64{tCudart + 0x100, tNCCL + 0x100}}, py(mainRun(5))))
		add(pid, ms, seg(seg0+1<<30, 512<<20, py(mainRun(3))))
		add(pid, 0, tensor(seg0+1<<30, 480<<20, py(mainRun(3))))
		add(pid, ms, withPy(events.Event{API: events.CudaMalloc, Addr: seg0 + 2<<30, Size: 32 << 20,
			Stack: []uint64{tCudart + 0x100, tCublas + 0x100, tC10 + 0x100 + 0x30}}, py(forwardRun(10), stepRun(5))))
		act := seg0 + 3<<30
		leakSeg := seg0 + 8<<30
		var leakUsed uint64
		for step := range torch.steps {
			start := base + 10*ms + uint64(step)*torch.stepNS + uint64(pid-7)*ms/2
			at = max(at, start)
			if step == 0 { // the caching allocator grows its pool once
				add(pid, ms/10, seg(act, 256<<20, py(forwardRun(10), stepRun(5))))
				add(pid, ms/10, seg(act+256<<20, 256<<20, py(forwardRun(20), stepRun(5))))
			}
			for i := range uint64(4) {
				units := int32(10)
				if i >= 2 {
					units = 20
				}
				add(pid, ms/2, tensor(act+i*(96<<20), 96<<20, py(forwardRun(units), stepRun(5))))
			}
			for i := range uint64(4) {
				add(pid, ms, withPy(tfree(act+i*(96<<20)), py(stepRun(9))))
			}
			if step%torch.leakSegEvery == 0 {
				add(pid, ms/10, seg(leakSeg+uint64(step/torch.leakSegEvery)*torch.leakSegment, torch.leakSegment, py(stepRun(12))))
			}
			add(pid, ms/10, tensor(leakSeg+leakUsed, torch.leakPerStep, py(stepRun(12))))
			leakUsed += torch.leakPerStep
			if step == torch.oomStep && pid == 7 {
				ev := seg(0, torch.oomSize, py([]events.PyFrame{pf(0xc005, 2), pf(0xc003, 11)}))
				ev.Result = 2 // cudaErrorMemoryAllocation
				add(pid, ms, ev)
			}
		}
	}
	// In time order, as the ring buffer gives them (nearly).
	slices.SortStableFunc(evs, func(a, b events.Event) int { return cmp.Compare(a.Time, b.Time) })
	// The driver's samples: each process's traced GPU memory and its
	// context's 518 MiB; each device's, 600 MiB.
	var nvml []uint64
	for tm := uint64(base + 50*ms); tm < base+uint64(torch.steps)*torch.stepNS; tm += 250 * ms {
		nvml = append(nvml, tm)
	}
	ni := 0
	led := map[uint32]uint64{}
	for _, ev := range evs {
		for ni < len(nvml) && nvml[ni] < ev.Time {
			tm := nvml[ni]
			ni++
			items = append(items, &tracefile.NVML{Time: tm, Devices: []tracefile.NVMLDevice{
				{Index: 0, UUID: "GPU-0", Name: "NVIDIA H100 80GB HBM3", Total: 80 << 30, Used: led[7] + 600<<20, Free: 80<<30 - led[7] - 600<<20},
				{Index: 1, UUID: "GPU-1", Name: "NVIDIA H100 80GB HBM3", Total: 80 << 30, Used: led[8] + 600<<20, Free: 80<<30 - led[8] - 600<<20}},
				Processes: []tracefile.NVMLProcess{{PID: 7, Device: 0, UUID: "GPU-0", Used: led[7] + 518<<20},
					{PID: 8, Device: 1, UUID: "GPU-1", Used: led[8] + 518<<20}}})
		}
		if ev.API == events.CudaMalloc && ev.Result == 0 {
			led[ev.PID] += ev.Size // no segment is freed
		}
		items = append(items, ev)
	}
	items = append(items, &tracefile.End{Time: at + ms})
	path, _ := tracetest.Write(t, tracefile.Meta{Tool: "tracetest", StartBoot: base, StartWall: time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC),
		Host: "gpu-node-3", Command: []string{"torchrun", "--nproc-per-node", "2", "train.py"}}, items...)
	return path
}
