package export

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/memviztest"
	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/owner"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Real traces, from cudatrace's first run on a GPU (an H100, driver 580,
// CUDA 13, PyTorch 2.11+cu130, JAX 0.11.2: vmtest/gpu/suite.py), written
// by `cudatrace record` as it was then, gzipped. The figures the tests
// assert are the frameworks' own, from the run's truth files (each
// checkpoint's wall clock, and what the framework said it held then).

// realTrace decompresses testdata/name.trace.gz to a file of its own.
func realTrace(t *testing.T, name string) string {
	t.Helper()
	in, err := os.Open(filepath.Join("testdata", name+".trace.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	zr, err := gzip.NewReader(in)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".trace")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, zr); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// realCheckpoint is one of a truth file's checkpoints.
type realCheckpoint struct {
	label     string
	wallNS    int64  // when the workload took it (Unix ns)
	reserved  uint64 // what the framework reserved then (memory_reserved, pool_bytes)
	allocated uint64 // what it handed out (memory_allocated); 0: not asserted
}

// realAt is the checkpoint's moment as --at takes it: its wall clock less
// the trace's start, as the GPU suite computes it (memviz_at).
func realAt(t *testing.T, path string, cp realCheckpoint) Moment {
	t.Helper()
	r, err := tracefile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	return Moment{At: time.Unix(0, cp.wallNS).Sub(r.Meta().StartWall)}
}

// realSegmentsScript prints a snapshot's segments as JSON.
const realSegmentsScript = `
import json, pickle, sys
json.dump({"segments": pickle.load(open(sys.argv[1], "rb"))["segments"]}, sys.stdout)
`

// realExport exports the trace at path as memviz and returns its segments
// (as "segments" of a snapshot's JSON). With walk, the whole file is
// checked as memory_viz reads it (memviztest.Check); without, each
// device's trace is cut to its latest entry: a real trace's thousands of
// entries, each with its stack, make files of megabytes that the checks
// at every checkpoint need not read.
func realExport(t *testing.T, path string, opts Options, walk bool) map[string]any {
	t.Helper()
	py := testenv.Python3(t, "pickle", "json")
	if !walk {
		opts.MemvizEntries = 1
	}
	var buf bytes.Buffer
	if err := WriteMemvizTrace(&buf, path, opts); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "snap.pickle")
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if walk {
		memviztest.Check(t, out, memviztest.Want{})
	}
	var snap map[string]any
	if err := json.Unmarshal(testenv.RunPython(t, py, realSegmentsScript, out), &snap); err != nil {
		t.Fatal(err)
	}
	return snap
}

// realSums adds up a snapshot's segments, those that are expandable
// (VMM), and its active blocks.
func realSums(snap map[string]any) (segs, expandable, blocks uint64) {
	for _, s := range snap["segments"].([]any) {
		seg := s.(map[string]any)
		size := uint64(seg["total_size"].(float64))
		segs += size
		if seg["is_expandable"] == true {
			expandable += size
		}
		for _, b := range memvizBlocks(seg) {
			if b.State == "active_allocated" {
				blocks += uint64(b.Size)
			}
		}
	}
	return segs, expandable, blocks
}

// PyTorch with expandable_segments:True maps its memory through the VMM
// API; the real driver's handles are heap addresses, and the export
// failed on their overlap. Now the snapshot's expandable segments are
// PyTorch's mapped ranges, at its addresses, totalling memory_reserved,
// and the tensors inside them memory_allocated. cuBLAS's and cuDNN's own
// cudaMalloc segments are the others: PyTorch does not list them.
func TestMemvizRealTorchExpandable(t *testing.T) {
	path := realTrace(t, "torch-expandable")
	const pid = 1509
	cps := []realCheckpoint{ // torch-expandable.truth.json
		{"start", 1795726775594877211, 85983232, 84212224},
		{"step 100", 1795726776374754807, 339738624, 188150784},
		{"step 200", 1795726776682937643, 339738624, 188150784},
		{"snapshot", 1795726776784225395, 339738624, 188150784},
	}
	for _, cp := range cps {
		snap := realExport(t, path, Options{NoSymbolize: true, PIDs: []uint32{pid}, At: realAt(t, path, cp)}, cp.label == "snapshot")
		_, expandable, blocks := realSums(snap)
		if expandable != cp.reserved || blocks != cp.allocated {
			t.Errorf("%s: expandable segments %d, blocks %d; PyTorch reserved %d, allocated %d",
				cp.label, expandable, blocks, cp.reserved, cp.allocated)
		}
		if cp.label != "snapshot" {
			continue
		}
		// PyTorch's segments then (the truth's), the small pool's and
		// the large pool's expandable segments.
		type seg struct {
			addr, size float64
			kind       string
		}
		var got []seg
		for _, s := range snap["segments"].([]any) {
			m := s.(map[string]any)
			if m["is_expandable"] == true {
				got = append(got, seg{m["address"].(float64), m["total_size"].(float64), m["segment_type"].(string)})
			} else if m["allocated_size"] != 0.0 {
				t.Errorf("segment %#x (cudaMalloc, not PyTorch's) holds tensors", uint64(m["address"].(float64)))
			}
		}
		want := []seg{{12918456320, 4194304, "small"}, {108582141952, 335544320, "large"}}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("expandable segments %v, want PyTorch's %v", got, want)
		}
	}
	// At the end: what the report's vmm_mapped_bytes says was mapped.
	snap := realExport(t, path, Options{NoSymbolize: true}, false)
	if _, expandable, _ := realSums(snap); expandable != 339738624 {
		t.Errorf("expandable segments at the end %d, want vmm_mapped_bytes 339738624", expandable)
	}
}

// XLA's BFC allocator maps its pool through the VMM API: the expandable
// segments are its pool (memory_stats' pool_bytes) at each round.
func TestMemvizRealJaxBFC(t *testing.T) {
	path := realTrace(t, "jax-bfc")
	cps := []realCheckpoint{ // jax-bfc.truth.json
		{"round 0", 1795726872420865251, 31457280, 0},
		{"round 1", 1795726873819617768, 31457280, 0},
		{"round 2", 1795726875192171415, 65011712, 0},
		{"round 3", 1795726876663354178, 65011712, 0},
	}
	for _, cp := range cps {
		snap := realExport(t, path, Options{NoSymbolize: true, PIDs: []uint32{2667}, At: realAt(t, path, cp)}, false)
		if _, expandable, _ := realSums(snap); expandable != cp.reserved {
			t.Errorf("%s: expandable segments %d, XLA's pool_bytes %d", cp.label, expandable, cp.reserved)
		}
	}
	// All unmapped by the end: the whole trace's maps and unmaps walk back.
	realExport(t, path, Options{NoSymbolize: true}, true)
}

// PyTorch's caching allocator gives a tensor the whole block where at most
// 1 MiB would remain: memory_allocated counts it. nvml-train is
// torch-native's workload: at each checkpoint the snapshot's blocks are
// memory_allocated (they were 1 MiB short), with the 2.5 MiB block for a
// 1.5 MiB tensor where PyTorch's snapshot has it in torch-native, and the
// segments PyTorch's allocator made (owner pytorch) memory_reserved.
func TestMemvizRealUnsplit(t *testing.T) {
	path := realTrace(t, "nvml-train")
	const pid = 1909
	cps := []realCheckpoint{ // nvml-train.truth.json
		{"start", 1795726835915870123, 85983232, 84212224},
		{"step 100", 1795726836852545282, 385875968, 189199360},
		{"step 200", 1795726837434280431, 385875968, 189199360},
		{"snapshot", 1795726837557120959, 385875968, 189199360},
	}
	for _, cp := range cps {
		at := realAt(t, path, cp)
		opts := Options{NoSymbolize: true, PIDs: []uint32{pid}, At: at}
		snap := realExport(t, path, opts, cp.label == "snapshot")
		_, _, blocks := realSums(snap)
		// PyTorch's segments: those its allocator's stacks made.
		end, err := until(path, at, &opts)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := replay.Read(path, replay.Options{Until: end})
		if err != nil {
			t.Fatal(err)
		}
		torchSegs := map[float64]bool{}
		for _, a := range tr.Ledger.Process(pid).LiveAllocations() {
			if a.API.Segment() && owner.OfStack(tr.Procs.CaptureOf(a.Stack), tr.Procs.Python(pid), a.Stack.Frames).Name == owner.PyTorch {
				torchSegs[float64(a.Addr)] = true
			}
		}
		var reserved uint64
		for _, s := range snap["segments"].([]any) {
			m := s.(map[string]any)
			if torchSegs[m["address"].(float64)] {
				reserved += uint64(m["total_size"].(float64))
			}
		}
		if blocks != cp.allocated || reserved != cp.reserved {
			t.Errorf("%s: blocks %d, PyTorch's segments %d; PyTorch allocated %d, reserved %d",
				cp.label, blocks, reserved, cp.allocated, cp.reserved)
		}
		if cp.label != "snapshot" {
			continue
		}
		var found bool
		for _, s := range snap["segments"].([]any) {
			m := s.(map[string]any)
			for _, b := range memvizBlocks(m) {
				if b.Addr == 0x7fc763180000 {
					found = true
					want := memvizBlk{0x7fc763180000, 2621440, 1572864, "active_allocated"}
					if b != want || m["address"] != float64(0x7fc762000000) || m["segment_type"] != "large" {
						t.Errorf("block %+v in segment %#x (%v), want %+v in the large segment 0x7fc762000000",
							b, uint64(m["address"].(float64)), m["segment_type"], want)
					}
				}
			}
		}
		if !found {
			t.Errorf("no block at 0x7fc763180000")
		}
	}
}
