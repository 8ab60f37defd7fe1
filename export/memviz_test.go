package export

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/internal/pickle"
	"github.com/cudatrace/cudatrace/internal/testenv"
)

const (
	memvizMiB = 1 << 20
	memvizS0  = 0x7f3a_0000_0000 // device 0, large segment
	memvizS1  = 0x7f3a_1000_0000 // device 0, small segment
	memvizS2  = 0x7e00_0000_0000 // device 1, expandable segment
	memvizStr = 0x5581_2a3b_4c00 // a cudaStream_t
)

// memvizTestSnapshot is two devices, three segments, every block state and
// every trace action, frames with non-ASCII names.
func memvizTestSnapshot() *Snapshot {
	fwd := []MemvizFrame{
		{Filename: "/work/model.py", Line: 42, Name: "forward"},
		{Filename: "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", Line: 1518, Name: "_call_impl"},
		{Filename: "données/entraîner.py", Line: 7, Name: "训练"},
	}
	cpp := []MemvizFrame{{Filename: "??", Line: 0, Name: "cudaMalloc"}}
	return &Snapshot{
		Segments: []MemvizSegment{
			{
				Device: 0, Address: memvizS0, TotalSize: 20 * memvizMiB,
				AllocatedSize: 8 * memvizMiB, ActiveSize: 12 * memvizMiB, RequestedSize: 8*memvizMiB - 100 + 4*memvizMiB,
				Stream: 0, SegmentType: MemvizLarge, Frames: cpp,
				Blocks: []MemvizBlock{
					{Address: memvizS0, Size: 8 * memvizMiB, RequestedSize: 8*memvizMiB - 100, State: MemvizActiveAllocated, Frames: fwd},
					{Address: memvizS0 + 8*memvizMiB, Size: 4 * memvizMiB, RequestedSize: 4 * memvizMiB, State: MemvizActivePendingFree, Frames: fwd[:1]},
					{Address: memvizS0 + 12*memvizMiB, Size: 8 * memvizMiB, RequestedSize: 0, State: MemvizInactive},
				},
			},
			{
				Device: 0, Address: memvizS1, TotalSize: 2 * memvizMiB,
				AllocatedSize: 1024, ActiveSize: 1024, RequestedSize: 1000,
				Stream: memvizStr, SegmentType: MemvizSmall,
				Blocks: []MemvizBlock{
					{Address: memvizS1, Size: 512, RequestedSize: 500, State: MemvizActiveAllocated},
					{Address: memvizS1 + 512, Size: 512, RequestedSize: 500, State: MemvizActiveAllocated, Frames: fwd[1:]},
					{Address: memvizS1 + 1024, Size: 2*memvizMiB - 1024, State: MemvizInactive},
				},
			},
			{
				Device: 1, Address: memvizS2, TotalSize: 40 * memvizMiB,
				SegmentType: MemvizLarge, PoolID: [2]int64{1, 3}, IsExpandable: true,
				Blocks: []MemvizBlock{{Address: memvizS2, Size: 40 * memvizMiB, State: MemvizInactive}},
			},
		},
		DeviceTraces: [][]MemvizTraceEntry{
			{
				{Action: MemvizSegmentAlloc, Addr: memvizS0, Size: 20 * memvizMiB, Frames: cpp, TimeUS: 1_700_000_000_000_001},
				{Action: MemvizAlloc, Addr: memvizS0, Size: 8 * memvizMiB, Frames: fwd, TimeUS: 1_700_000_000_000_002},
				{Action: MemvizAlloc, Addr: memvizS0 + 8*memvizMiB, Size: 4 * memvizMiB, TimeUS: 1_700_000_000_000_003},
				{Action: MemvizFreeRequested, Addr: memvizS0 + 8*memvizMiB, Size: 4 * memvizMiB, TimeUS: 1_700_000_000_000_004},
				{Action: MemvizSegmentAlloc, Addr: memvizS1, Size: 2 * memvizMiB, Stream: memvizStr, TimeUS: 1_700_000_000_000_005},
				{Action: MemvizAlloc, Addr: memvizS1, Size: 512, Stream: memvizStr, TimeUS: 1_700_000_000_000_006},
				{Action: MemvizAlloc, Addr: memvizS1 + 512, Size: 512, Stream: memvizStr, TimeUS: 1_700_000_000_000_007},
				{Action: MemvizAlloc, Addr: memvizS1 + 1024, Size: 4096, Stream: memvizStr, TimeUS: 1_700_000_000_000_008},
				{Action: MemvizFreeRequested, Addr: memvizS1 + 1024, Size: 4096, Stream: memvizStr, TimeUS: 1_700_000_000_000_009},
				{Action: MemvizFreeCompleted, Addr: memvizS1 + 1024, Size: 4096, Stream: memvizStr, TimeUS: 1_700_000_000_000_010},
				{Action: MemvizOOM, Size: 80 << 30, DeviceFree: 1 << 30, Frames: fwd, TimeUS: 1_700_000_000_000_011},
				{Action: MemvizSnapshotTaken, TimeUS: 1_700_000_000_000_012},
			},
			{
				{Action: MemvizSegmentMap, Addr: memvizS2, Size: 60 * memvizMiB},
				{Action: MemvizAlloc, Addr: memvizS2 + 40*memvizMiB, Size: 20 * memvizMiB},
				{Action: MemvizFreeRequested, Addr: memvizS2 + 40*memvizMiB, Size: 20 * memvizMiB},
				{Action: MemvizFreeCompleted, Addr: memvizS2 + 40*memvizMiB, Size: 20 * memvizMiB},
				{Action: MemvizSegmentUnmap, Addr: memvizS2 + 40*memvizMiB, Size: 20 * memvizMiB},
				{Action: MemvizSegmentAlloc, Addr: memvizS2 + 100*memvizMiB, Size: 2 * memvizMiB},
				{Action: MemvizSegmentFree, Addr: memvizS2 + 100*memvizMiB, Size: 2 * memvizMiB},
			},
		},
	}
}

// memvizCheckScript loads the snapshot, checks every field against the Go
// value (sent as JSON, Go field names), the key names and order PyTorch
// writes, the value types, and the invariants the readers rely on.
const memvizCheckScript = `
import json, pickle, sys
snap = pickle.load(open(sys.argv[1], "rb"))
exp = json.load(open(sys.argv[2]))

def eq(got, want, what):
    assert type(got) is type(want) and got == want, "%s: got %r (%s), want %r" % (what, got, type(got).__name__, want)

def frames(got, want, what):
    want = want or []
    eq(len(got), len(want), what + " frames")
    for i, (f, w) in enumerate(zip(got, want)):
        eq(list(f), ["name", "filename", "line"], "%s frame %d keys" % (what, i))
        eq(f["filename"], w["Filename"], what + " filename")
        eq(f["line"], w["Line"], what + " line")
        eq(f["name"], w["Name"], what + " name")

eq(list(snap), ["segments", "device_traces"], "top-level keys")
eq(len(snap["segments"]), len(exp["Segments"]), "segments")
SEG = ["device", "address", "total_size", "allocated_size", "active_size", "requested_size",
       "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"]
BLOCK = ["address", "size", "requested_size", "state", "frames"]
for i, (seg, w) in enumerate(zip(snap["segments"], exp["Segments"])):
    what = "segment %d" % i
    eq(list(seg), SEG, what + " keys")
    for key, field in [("device", "Device"), ("address", "Address"), ("total_size", "TotalSize"),
                       ("allocated_size", "AllocatedSize"), ("active_size", "ActiveSize"),
                       ("requested_size", "RequestedSize"), ("stream", "Stream"),
                       ("segment_type", "SegmentType"), ("is_expandable", "IsExpandable")]:
        eq(seg[key], w[field], "%s %s" % (what, key))
    eq(seg["segment_pool_id"], tuple(w["PoolID"]), what + " segment_pool_id")
    frames(seg["frames"], w["Frames"], what)
    eq(len(seg["blocks"]), len(w["Blocks"]), what + " blocks")
    for j, (b, wb) in enumerate(zip(seg["blocks"], w["Blocks"])):
        bwhat = "%s block %d" % (what, j)
        eq(list(b), BLOCK, bwhat + " keys")
        for key, field in [("address", "Address"), ("size", "Size"), ("requested_size", "RequestedSize"), ("state", "State")]:
            eq(b[key], wb[field], "%s %s" % (bwhat, key))
        frames(b["frames"], wb["Frames"], bwhat)

    # Invariants: blocks tile the segment (MemoryViz.js recomputes block
    # addresses from the sizes; _memory_viz stats asserts the sum) and the
    # per-segment sums are CUDACachingAllocator's.
    addr = seg["address"]
    for b in seg["blocks"]:
        assert b["address"] == addr, "%s: block at %#x, want %#x" % (what, b["address"], addr)
        assert 0 < b["size"] and b["requested_size"] <= b["size"], what
        addr += b["size"]
    assert addr == seg["address"] + seg["total_size"], "%s: blocks end at %#x" % (what, addr)
    active = [b for b in seg["blocks"] if b["state"] in ("active_allocated", "active_pending_free")]
    eq(seg["allocated_size"], sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated"), what + " allocated sum")
    eq(seg["active_size"], sum(b["size"] for b in active), what + " active sum")
    eq(seg["requested_size"], sum(b["requested_size"] for b in active), what + " requested sum")
    assert seg["segment_type"] in ("large", "small"), what

# One trace list per device, indexed by device.
eq(len(snap["device_traces"]), len(exp["DeviceTraces"]), "device_traces")
assert len(snap["device_traces"]) == max(s["device"] for s in snap["segments"]) + 1, "one trace list per device"
actions = set()
for d, (trace, wt) in enumerate(zip(snap["device_traces"], exp["DeviceTraces"])):
    eq(len(trace), len(wt), "device %d trace" % d)
    for j, (e, w) in enumerate(zip(trace, wt)):
        what = "device_traces[%d][%d]" % (d, j)
        oom = w["Action"] == "oom"
        keys = ["action", "device_free" if oom else "addr", "size", "stream"]
        if w["TimeUS"]:
            keys.append("time_us")
        keys.append("frames")
        eq(list(e), keys, what + " keys")
        eq(e["action"], w["Action"], what)
        if oom:
            eq(e["device_free"], w["DeviceFree"], what + " device_free")
        else:
            eq(e["addr"], w["Addr"], what + " addr")
        eq(e["size"], w["Size"], what + " size")
        eq(e["stream"], w["Stream"], what + " stream")
        if w["TimeUS"]:
            eq(e["time_us"], w["TimeUS"], what + " time_us")
        frames(e["frames"], w["Frames"], what)
        actions.add(e["action"])
print(json.dumps(sorted(actions)))
`

func TestMemvizPython(t *testing.T) {
	py := testenv.Python3(t, "pickle", "pickletools")
	s := memvizTestSnapshot()
	dir := t.TempDir()
	snapPath := filepath.Join(dir, "snapshot.pickle")
	f, err := os.Create(snapPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteMemviz(f, s); err != nil {
		t.Fatalf("WriteMemviz: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	wantPath := filepath.Join(dir, "want.json")
	if err := os.WriteFile(wantPath, want, 0o644); err != nil {
		t.Fatal(err)
	}
	out := testenv.RunPython(t, py, memvizCheckScript, snapPath, wantPath)
	var actions []string
	if err := json.Unmarshal(out, &actions); err != nil {
		t.Fatalf("python output %q: %v", out, err)
	}
	if len(actions) != len(memvizActions) {
		t.Errorf("trace covers actions %v, want all of %v", actions, memvizActions)
	}

	// PyTorch's own reader, where torch is installed.
	if exec.Command(py, "-c", "import torch.cuda._memory_viz").Run() != nil {
		t.Log("torch not importable: python -m torch.cuda._memory_viz not run")
		return
	}
	for _, args := range [][]string{
		{"-m", "torch.cuda._memory_viz", "stats", snapPath},
		{"-m", "torch.cuda._memory_viz", "trace", snapPath},
		// `segments` renders through flamegraph.pl, which it downloads when
		// missing; run its data walk with an identity renderer so the test
		// needs no network.
		{"-c", `import pickle, sys, torch.cuda._memory_viz as m
print(m.segments(pickle.load(open(sys.argv[1], "rb")), format_flamegraph=lambda lines: lines))`, snapPath},
		{"-c", `import pickle, sys, torch.cuda._memory_viz as m
print(m.memory(pickle.load(open(sys.argv[1], "rb")), format_flamegraph=lambda lines: lines))`, snapPath},
	} {
		out, err := exec.Command(py, args...).CombinedOutput()
		if err != nil {
			t.Errorf("python3 %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if fg := fmt.Sprintf("/tmp/%d_flamegraph.pl", os.Getuid()); memvizFileExists(fg) {
		svg := filepath.Join(dir, "segments.svg")
		if out, err := exec.Command(py, "-m", "torch.cuda._memory_viz", "segments", snapPath, "-o", svg).CombinedOutput(); err != nil {
			t.Errorf("_memory_viz segments: %v\n%s", err, out)
		}
	}
}

func memvizFileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func TestMemvizInvalid(t *testing.T) {
	for _, c := range []struct {
		name   string
		break_ func(s *Snapshot)
		msg    string
		is     error
	}{
		{"block size 2^53", func(s *Snapshot) {
			b := &s.Segments[2].Blocks[0]
			b.Size = 1 << 53
		}, "segment 2 at 0x7e0000000000 on device 1: block 0 at 0x7e0000000000: size 9007199254740992", pickle.ErrUnsafeInt},
		{"address 2^53", func(s *Snapshot) { s.DeviceTraces[1][0].Addr = 1 << 53 }, "device_traces[1][0] (segment_map): addr", pickle.ErrUnsafeInt},
		{"time_us", func(s *Snapshot) { s.DeviceTraces[0][0].TimeUS = -(1 << 53) }, "time_us", pickle.ErrUnsafeInt},
		{"frame line", func(s *Snapshot) { s.Segments[0].Frames = []MemvizFrame{{Line: 1 << 60}} }, "frames[0].line", pickle.ErrUnsafeInt},
		{"pool id", func(s *Snapshot) { s.Segments[0].PoolID[1] = -1 << 62 }, "segment_pool_id[1]", pickle.ErrUnsafeInt},
		{"segment end past 2^53", func(s *Snapshot) {
			seg := &s.Segments[2]
			seg.Address = pickle.MaxSafeInt - 10
			seg.Blocks[0].Address = seg.Address
		}, "past 2^53", pickle.ErrUnsafeInt},
		{"blocks short", func(s *Snapshot) { s.Segments[0].TotalSize = 24 * memvizMiB }, "segment 0 at 0x7f3a00000000 on device 0: blocks cover 20971520 of 25165824 bytes", nil},
		{"blocks long", func(s *Snapshot) { s.Segments[0].TotalSize = 16 * memvizMiB }, "blocks 0..2 cover 20971520 bytes, more than total_size 16777216", nil},
		{"gap", func(s *Snapshot) { s.Segments[0].Blocks[1].Address += 4096 }, "block 1 starts at 0x7f3a00801000, want 0x7f3a00800000", nil},
		{"unsorted", func(s *Snapshot) {
			b := s.Segments[0].Blocks
			b[0], b[1] = b[1], b[0]
		}, "block 0 starts at 0x7f3a00800000, want 0x7f3a00000000", nil},
		{"no blocks", func(s *Snapshot) { s.Segments[1].Blocks = nil }, "blocks cover 0 of 2097152 bytes", nil},
		{"empty block", func(s *Snapshot) {
			s.Segments[2].Blocks = append(s.Segments[2].Blocks, MemvizBlock{Address: memvizS2 + 40*memvizMiB, State: MemvizInactive})
		}, "size is 0", nil},
		{"empty segment", func(s *Snapshot) { s.Segments[2].TotalSize = 0; s.Segments[2].Blocks = nil }, "total_size is 0", nil},
		{"allocated_size", func(s *Snapshot) { s.Segments[0].AllocatedSize = 12 * memvizMiB }, "allocated_size is 12582912, but its active_allocated blocks add up to 8388608", nil},
		{"active_size", func(s *Snapshot) { s.Segments[0].ActiveSize = 8 * memvizMiB }, "active_size is 8388608, but its active blocks add up to 12582912", nil},
		{"requested_size", func(s *Snapshot) { s.Segments[1].RequestedSize = 1024 }, "requested_size is 1024, but its active blocks' requested_size add up to 1000", nil},
		{"requested > size", func(s *Snapshot) {
			s.Segments[1].Blocks[0].RequestedSize = 513
			s.Segments[1].RequestedSize = 1013
		}, "block 0 at 0x7f3a10000000: requested_size 513 exceeds size 512", nil},
		{"missing device trace", func(s *Snapshot) { s.DeviceTraces = s.DeviceTraces[:1] }, "device_traces has 1 lists, but needs one per device 0..1", nil},
		{"negative device", func(s *Snapshot) { s.Segments[0].Device = -1 }, "on device -1: device is negative", nil},
		{"overlap", func(s *Snapshot) {
			seg := &s.Segments[1]
			seg.Address = memvizS0 + 20*memvizMiB - 512
			for i := range seg.Blocks {
				seg.Blocks[i].Address -= memvizS1 - seg.Address
			}
		}, "device 0: segments 0x7f3a00000000-0x7f3a01400000 and 0x7f3a013ffe00-0x7f3a015ffe00 overlap", nil},
		{"segment type", func(s *Snapshot) { s.Segments[0].SegmentType = "" }, `segment_type "" is neither "large" nor "small"`, nil},
		{"block state", func(s *Snapshot) { s.Segments[0].Blocks[2].State = "free" }, `state "free" is not one of`, nil},
		{"action", func(s *Snapshot) { s.DeviceTraces[0][3].Action = "malloc" }, `device_traces[0][3] (malloc): action "malloc" is not one of`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := memvizTestSnapshot()
			c.break_(s)
			var buf bytes.Buffer
			err := WriteMemviz(&buf, s)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalidSnapshot) {
				t.Errorf("%v: not ErrInvalidSnapshot", err)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("%v: not %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %q\ndoes not contain %q", err, c.msg)
			}
			if buf.Len() != 0 {
				t.Errorf("%d bytes written for an invalid snapshot", buf.Len())
			}
		})
	}

	if err := WriteMemviz(&bytes.Buffer{}, nil); !errors.Is(err, ErrInvalidSnapshot) {
		t.Errorf("nil snapshot: %v", err)
	}
}

func TestMemvizValidEdges(t *testing.T) {
	// No segments, no devices: an empty but loadable snapshot.
	var buf bytes.Buffer
	if err := WriteMemviz(&buf, &Snapshot{}); err != nil {
		t.Fatal(err)
	}
	// Traces for a device without segments, and an empty trace list.
	s := memvizTestSnapshot()
	s.DeviceTraces = append(s.DeviceTraces, nil, []MemvizTraceEntry{{Action: MemvizOOM, Size: 1 << 30, DeviceFree: 0}})
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	// A segment ending exactly at 2^53 is still exact in JS.
	s = memvizTestSnapshot()
	seg := &s.Segments[2]
	seg.Address = 1<<53 - seg.TotalSize
	seg.Blocks[0].Address = seg.Address
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestMemvizInvalidUTF8Frames: frame text is shown, not parsed, so bad bytes
// become U+FFFD rather than failing the export.
func TestMemvizInvalidUTF8Frames(t *testing.T) {
	py := testenv.Python3(t, "pickle", "pickletools")
	s := memvizTestSnapshot()
	s.Segments[0].Blocks[0].Frames = []MemvizFrame{{Filename: "lib\xff.so", Line: 1, Name: "fn\xc3"}}
	var buf bytes.Buffer
	if err := WriteMemviz(&buf, s); err != nil {
		t.Fatal(err)
	}
	out := testenv.RunPython(t, py, `import pickle, sys, json
f = pickle.load(open(sys.argv[1], "rb"))["segments"][0]["blocks"][0]["frames"][0]
print(json.dumps([f["filename"], f["name"]]))`, testenv.TempFile(t, "v.pickle", buf.Bytes()))
	var got []string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if got[0] != "lib\uFFFD.so" || got[1] != "fn\uFFFD" {
		t.Errorf("got %q", got)
	}
}

// TestMemvizLarge writes a snapshot of 3000 segments and 30000 events and
// loads it back, for the batching and the memo at scale.
func TestMemvizLarge(t *testing.T) {
	py := testenv.Python3(t, "pickle", "pickletools")
	s := &Snapshot{DeviceTraces: make([][]MemvizTraceEntry, 1)}
	for i := range 3000 {
		addr := uint64(0x7f00_0000_0000 + i*4*memvizMiB)
		fr := []MemvizFrame{{Filename: fmt.Sprintf("file%d.py", i%500), Line: int64(i), Name: "f"}}
		s.Segments = append(s.Segments, MemvizSegment{
			Address: addr, TotalSize: 4 * memvizMiB, AllocatedSize: memvizMiB, ActiveSize: memvizMiB, RequestedSize: memvizMiB - 1,
			SegmentType: MemvizLarge,
			Blocks: []MemvizBlock{
				{Address: addr, Size: memvizMiB, RequestedSize: memvizMiB - 1, State: MemvizActiveAllocated, Frames: fr},
				{Address: addr + memvizMiB, Size: 3 * memvizMiB, State: MemvizInactive},
			},
		})
		for k := range 10 {
			s.DeviceTraces[0] = append(s.DeviceTraces[0], MemvizTraceEntry{Action: MemvizAlloc, Addr: addr, Size: uint64(k + 1), Frames: fr, TimeUS: int64(i*10 + k + 1)})
		}
	}
	var buf bytes.Buffer
	if err := WriteMemviz(&buf, s); err != nil {
		t.Fatal(err)
	}
	out := testenv.RunPython(t, py, `import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
segs, trace = s["segments"], s["device_traces"][0]
assert len(segs) == 3000 and len(trace) == 30000
assert all(seg["blocks"][0]["frames"][0]["filename"] == "file%d.py" % (i % 500) for i, seg in enumerate(segs))
assert [e["time_us"] for e in trace] == list(range(1, 30001))
print(len(open(sys.argv[1], "rb").read()))`, testenv.TempFile(t, "v.pickle", buf.Bytes()))
	t.Logf("3000 segments, 30000 events: %s bytes", strings.TrimSpace(string(out)))
}

// TestMemvizOpcodes holds the snapshot writer's own output to the opcodes
// package pickle lists (all MemoryViz.js reads), none newer than protocol 2.
func TestMemvizOpcodes(t *testing.T) {
	py := testenv.Python3(t, "pickle", "pickletools")
	var snap bytes.Buffer
	if err := WriteMemviz(&snap, memvizTestSnapshot()); err != nil {
		t.Fatal(err)
	}
	path := testenv.TempFile(t, "snap.pickle", snap.Bytes())
	if res := testenv.PickleOpcodes(t, py, pickle.Opcodes(), path); len(res.Extra) > 0 {
		t.Errorf("encoder emitted opcodes outside the MemoryViz.js set: %v", res.Extra)
	}
}
