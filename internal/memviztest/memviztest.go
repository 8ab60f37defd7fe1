// Package memviztest checks a memory snapshot file as PyTorch's memory_viz
// reads it: every test that exports one runs Check on it. The check is a
// Python script that loads the pickle and walks each device's trace from
// the snapshot backwards, as MemoryViz.js's Allocator State History does
// (undoing each entry), so an entry that points into memory the snapshot
// never lists fails here as it blanks the viewer's pane there. VMM
// mappings are undone as MemoryViz.js undoes them: segment_map takes its
// range out of the segment it lies in, segment_unmap puts it back merged
// with the segments it touches.
//
// It also reads the trace forwards as the timelines do
// (process_alloc_data.js, 2026): memory live before the trace began is an
// active_allocated block with no alloc entry left unfreed (a "ghost
// block"), or a free_completed entry with no alloc before it (a block
// that existed at the start and was freed); a segment with no
// segment_alloc left unfreed existed at the start too.
package memviztest

import (
	"encoding/json"
	"testing"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// Want is what Check asserts beyond the rules every snapshot keeps.
type Want struct {
	// DeviceKnown: the trace has the driver's view (NVML), so every oom
	// entry must carry a non-zero device_free.
	DeviceKnown bool
}

// Summary is what Check read, for the test's own assertions.
type Summary struct {
	Segments int            `json:"segments"`
	Entries  map[string]int `json:"entries"` // by action, all devices
	// Live is the bytes of active_allocated blocks per device (by the
	// device's number as a string, as JSON keys are).
	Live       map[string]uint64 `json:"live"`
	Settings   map[string]any    `json:"settings"`
	DeviceFree []int64           `json:"device_free"` // of every oom entry; -1 where it is left out (unknown)
	// Ghosts are, per device, the addresses and sizes of the
	// active_allocated blocks the trace never allocated (or freed after
	// allocating): memory_viz's ghost blocks, live before it began.
	Ghosts map[string][][2]uint64 `json:"ghosts"`
	// FreedBefore are, per device, the addresses of the free_completed
	// entries with no alloc before them: blocks live at the start, freed
	// in the trace.
	FreedBefore map[string][]uint64 `json:"freed_before"`
	// SegmentsBefore are, per device, the addresses of the segments with
	// no segment_alloc left standing: the segment timeline's initially
	// allocated ones.
	SegmentsBefore map[string][]uint64 `json:"segments_before"`
}

// script checks the snapshot at argv[1]; argv[2] is "1" when device_free
// must be non-zero. It prints a Summary.
const script = `
import json, pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
device_known = sys.argv[2] == "1"
segs = {}   # device -> {address: size}
live = {}
for seg in s["segments"]:
    end = seg["address"]
    for b in seg["blocks"]:
        assert b["address"] == end, "segment %#x: blocks do not tile" % seg["address"]
        end += b["size"]
        if b["state"] == "active_allocated":
            live[seg["device"]] = live.get(seg["device"], 0) + b["size"]
    assert end == seg["address"] + seg["total_size"], "segment %#x: blocks do not cover it" % seg["address"]
    segs.setdefault(seg["device"], {})[seg["address"]] = seg["total_size"]

def segment_of(dev, addr):
    for a, size in segs.get(dev, {}).items():
        if a <= addr < a + size:
            return a
    return None

entries, device_free = {}, []
for dev, trace in enumerate(s["device_traces"]):
    for i in range(len(trace) - 1, -1, -1):   # newest first, as MemoryViz.js undoes them
        e = trace[i]
        what = "device_traces[%d][%d] %s" % (dev, i, e["action"])
        act = e["action"]
        entries[act] = entries.get(act, 0) + 1
        assert isinstance(e.get("time_us"), int) and e["time_us"] > 0, what + ": no time_us"
        if act == "oom":
            if device_known:
                assert e.get("device_free", 0) > 0, what + ": device_free is 0 where the device is known"
            device_free.append(e.get("device_free", -1))
            continue
        if act == "snapshot":
            continue
        addr, size = e["addr"], e["size"]
        if act in ("segment_free", "segment_unmap"):
            assert segment_of(dev, addr) is None, what + ": %#x freed, but a listed segment is there" % addr
            m = segs.setdefault(dev, {})
            if act == "segment_unmap":
                # Mapped back: MemoryViz.js merges it with the segments it
                # touches (map_segment).
                nxt = addr + size
                assert segment_of(dev, nxt - 1) is None, what + ": %#x+%d overlaps a listed segment" % (addr, size)
                if nxt in m:
                    size += m.pop(nxt)
                prev = [a for a, n in m.items() if a + n == addr]
                if prev:
                    m[prev[0]] += size
                    continue
            m[addr] = size
            continue
        a = segment_of(dev, addr)
        assert a is not None, what + ": %#x lies in no segment listed at that point" % addr
        end = a + segs[dev][a]
        if act == "segment_alloc":
            assert a == addr, what + ": %#x is not a segment's start" % addr
            del segs[dev][addr]
        elif act == "segment_map":
            # A piece of an expandable segment's mapped range goes
            # (MemoryViz.js's unmap_segment): its start, end or middle.
            assert addr + size <= end, what + ": %#x+%d runs past its segment" % (addr, size)
            del segs[dev][a]
            if a < addr:
                segs[dev][a] = addr - a
            if addr + size < end:
                segs[dev][addr + size] = end - addr - size
        else:
            assert addr + size <= end, what + ": %#x+%d runs past its segment" % (addr, size)
# Forwards, as process_alloc_data.js pairs entries: alloc with the
# free_completed at its address (free, in older traces); a free with no
# alloc open at its address stands for a block live at the start; an
# active_allocated block of the snapshot with no alloc open at its
# address is a ghost. Segments likewise, by segment_alloc and segment_free.
ghosts, freed_before, segments_before = {}, {}, {}
for dev, trace in enumerate(s["device_traces"]):
    blocks, segs_open = set(), set()
    for e in trace:
        act = e["action"]
        if act == "alloc":
            blocks.add(e["addr"])
        elif act in ("free", "free_completed"):
            if e["addr"] in blocks:
                blocks.discard(e["addr"])
            else:
                freed_before.setdefault(str(dev), []).append(e["addr"])
        elif act == "segment_alloc":
            segs_open.add(e["addr"])
        elif act == "segment_free":
            segs_open.discard(e["addr"])
    for seg in s["segments"]:
        if seg["device"] != dev:
            continue
        if seg["address"] not in segs_open:
            segments_before.setdefault(str(dev), []).append(seg["address"])
        for b in seg["blocks"]:
            if b["state"] == "active_allocated" and b["address"] not in blocks:
                ghosts.setdefault(str(dev), []).append([b["address"], b["requested_size"]])
print(json.dumps({"segments": len(s["segments"]), "entries": entries,
    "live": {str(d): v for d, v in live.items()}, "settings": s.get("allocator_settings"),
    "device_free": device_free, "ghosts": ghosts, "freed_before": freed_before,
    "segments_before": segments_before}))
`

// Check loads the snapshot pickle at path with python3 and checks it:
// blocks tile their segments; walking each device's trace back from the
// snapshot, every entry's address lies in a segment listed at that point;
// every entry has time_us; with want.DeviceKnown, every oom entry has a
// non-zero device_free. It fails t on the first broken rule.
func Check(t testing.TB, path string, want Want) Summary {
	t.Helper()
	py := testenv.Python3(t, "pickle", "json")
	known := "0"
	if want.DeviceKnown {
		known = "1"
	}
	out := testenv.RunPython(t, py, script, path, known)
	var s Summary
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("memviz check: %v: %s", err, out)
	}
	return s
}
