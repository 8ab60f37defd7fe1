package export

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/report"
	"github.com/cudatrace/cudatrace/tracefile"
)

const (
	htmlBase = 1_000_000_000 // the recording's start, boot ns
	ms       = 1_000_000
)

// htmlEv is an event of pid 7 at tm ms after the start, from a stack whose
// innermost frame is frame.
func htmlEv(tm float64, api events.API, addr, size uint64, dev int32, frame uint64) events.Event {
	ev := events.Event{Time: htmlBase + uint64(tm*ms), PID: 7, TID: 7, Comm: "train", API: api, Addr: addr, Size: size,
		Device: dev, Duration: 1}
	if api.Info().Op == events.OpFree {
		ev.Duration, ev.Flags = 0, events.FlagEntryOnly
	} else {
		ev.Stack = []uint64{frame, 0x400100, 0x400200}
	}
	return ev
}

// The stacks of htmlTrace, by their innermost frame.
const (
	frameWeights = 0xa100
	frameOptim   = 0xa200
	frameTensor  = 0xa300
	frameSpike   = 0xa400
	frameLeak    = 0xa500
	frameStep    = 0xa600
	frameOOM     = 0xa700
)

// htmlTrace is a small trace whose figures are known: weights and an
// optimizer state live throughout, a tensor cut from the weights, a spike
// that makes the peak (350 MiB at 5 ms), an 8 MiB leak made at 10.5 ms,
// short steps, and an out-of-memory failure at 15 ms.
func htmlTrace(t *testing.T) string {
	path, _ := tracetest.Write(t, tracefile.Meta{Tool: "test", StartBoot: htmlBase, Host: "h"},
		&tracefile.Process{PID: 7, Comm: "train", Time: htmlBase},
		htmlEv(1, events.CudaMalloc, 0x1000_0000, 100*mib, 0, frameWeights),
		htmlEv(2, events.CudaMalloc, 0x2000_0000, 50*mib, 1, frameOptim),
		htmlEv(3, events.TorchMalloc, 0x1000_0000, 30*mib, 0, frameTensor),
		htmlEv(5, events.CudaMalloc, 0x3000_0000, 200*mib, 0, frameSpike),
		htmlEv(6, events.CudaFree, 0x3000_0000, 0, 0, 0),
		htmlEv(10.5, events.CudaMalloc, 0x4000_0000, 8*mib, 0, frameLeak),
		htmlEv(12, events.CudaMalloc, 0x5000_0000, 20*mib, 0, frameStep),
		htmlEv(13, events.CudaFree, 0x5000_0000, 0, 0, 0),
		func() events.Event {
			ev := htmlEv(15, events.CudaMalloc, 0, 1<<40, 0, frameOOM)
			ev.Result = 2 // cudaErrorMemoryAllocation
			return ev
		}(),
		&tracefile.End{Time: htmlBase + 20*ms})
	return path
}

// pageOf builds the page of the trace at path and reads its data back from
// the HTML, as the page's script does.
func pageOf(t *testing.T, path string, opts Options) (*pageData, []byte) {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteHTML(&buf, path, opts); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)<script id="data" type="application/json">(.*?)</script>`).FindSubmatch(buf.Bytes())
	if m == nil {
		t.Fatal("no data in the page")
	}
	var raw struct {
		pageData
		Spans  map[string][]int64 `json:"spans"`
		Stacks struct {
			PID      []int64 `json:"pid"`
			Level    []int   `json:"level"`
			FrameAt  []int   `json:"frame_at"`
			FrameIDs []int64 `json:"frame_ids"`
			Label    []int   `json:"label"`
			UserLine []int   `json:"user_line"`
			API      []int   `json:"api"`
		} `json:"stacks"`
	}
	if err := json.Unmarshal(m[1], &raw); err != nil {
		t.Fatal(err)
	}
	d := raw.pageData
	d.Spans = pageSpans{Stack: undelta(raw.Spans["stack"]), Dev: undelta(raw.Spans["dev"]), SB: undelta(raw.Spans["sb"]),
		EB: undelta(raw.Spans["eb"]), Bytes: undelta(raw.Spans["bytes"]), Count: undelta(raw.Spans["count"]),
		Flags: undelta(raw.Spans["flags"])}
	d.Stacks.PID, d.Stacks.Level, d.Stacks.FrameAt = raw.Stacks.PID, raw.Stacks.Level, raw.Stacks.FrameAt
	d.Stacks.FrameIDs = undelta(raw.Stacks.FrameIDs)
	d.Stacks.Label, d.Stacks.UserLine, d.Stacks.API = raw.Stacks.Label, raw.Stacks.UserLine, raw.Stacks.API
	for i := range d.Snapshots {
		sn := &d.Snapshots[i]
		sn.Stack, sn.DevCol, sn.Bytes, sn.Count = undelta(sn.Stack), undelta(sn.DevCol), undelta(sn.Bytes), undelta(sn.Count)
	}
	for i := range d.Series {
		s := &d.Series[i]
		s.Max, s.End = undelta(s.Max), undelta(s.End)
		for j := range s.Owners {
			s.Owners[j].V = undelta(s.Owners[j].V)
		}
		for j := range s.Paths {
			s.Paths[j].V = undelta(s.Paths[j].V)
		}
	}
	return &d, m[1]
}

func undelta(d []int64) deltas {
	out := make(deltas, len(d))
	var s int64
	for i, v := range d {
		s += v
		out[i] = s
	}
	return out
}

// innermost is stack i's innermost frame's address, as the page names it.
func (d *pageData) innermost(i int) string {
	fid := d.Stacks.FrameIDs[d.Stacks.FrameAt[i]]
	return d.Strings[d.Frames.Name[fid]]
}

// seriesOf returns the series answering pid (0 all) and dev (nil all) at
// level.
func (d *pageData) seriesOf(t *testing.T, pid uint32, dev *int32, level int) *pageSeries {
	t.Helper()
	for i := range d.Series {
		s := &d.Series[i]
		for _, k := range s.Keys {
			if s.Level == level && k.PID == pid && (k.Dev == nil) == (dev == nil) && (dev == nil || *k.Dev == *dev) {
				return s
			}
		}
	}
	t.Fatalf("no series for pid %d dev %v level %d", pid, dev, level)
	return nil
}

// liveAt sums the spans live at kept moment j, by innermost frame, of the
// GPU level (dev nil: every device).
func (d *pageData) liveAt(j int64, dev *int32) map[string]uint64 {
	out := map[string]uint64{}
	for i := range d.Spans.Stack {
		s := int(d.Spans.Stack[i])
		if d.Stacks.Level[s] != levelGPU || dev != nil && d.Spans.Dev[i] != int64(*dev) {
			continue
		}
		if d.Spans.SB[i] <= j && j < d.Spans.EB[i] {
			out[d.innermost(s)] += uint64(d.Spans.Bytes[i])
		}
	}
	return out
}

// The page's peak is report's: the same call paths and bytes, from a live
// set the page keeps itself (the peak's snapshot), beside the series'
// highest figures.
func TestHTMLPeakIsReports(t *testing.T) {
	path := htmlTrace(t)
	d, _ := pageOf(t, path, Options{NoSymbolize: true})
	rep, err := report.Load(path, report.Options{NoSymbolize: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{}
	for _, ps := range rep.PeakStacks {
		want[ps.Frames[0].Address] += ps.LiveBytes
	}
	if w := map[string]uint64{"0xa100": 100 * mib, "0xa200": 50 * mib, "0xa400": 200 * mib}; fmt.Sprint(want) != fmt.Sprint(w) {
		t.Fatalf("report's peak stacks %v, want %v", want, w)
	}
	s := d.seriesOf(t, 7, nil, levelGPU)
	if s.Peak != 350*mib || s.Snapshot < 0 {
		t.Fatalf("series peak %d (snapshot %d), want %d", s.Peak, s.Snapshot, 350*mib)
	}
	sn := d.Snapshots[s.Snapshot]
	got := map[string]uint64{}
	var total uint64
	for i := range sn.Stack {
		got[d.innermost(int(sn.Stack[i]))] += uint64(sn.Bytes[i])
		total += uint64(sn.Bytes[i])
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || total != s.Peak {
		t.Errorf("page's peak %v (%d bytes), report's %v (%d)", got, total, want, s.Peak)
	}
	// The peak, 5 ms in, is the highest of its bucket; the bucket's
	// split by owner and by path add up to it.
	k := int(s.PeakT / d.Agg.BucketNS)
	if s.PeakT != 5*ms+1 || uint64(s.Max[k]) != s.Peak {
		t.Errorf("peak at %d ns in bucket %d holding %d, want 5 ms+1 and %d", s.PeakT, k, s.Max[k], s.Peak)
	}
	var byOwner, byPath int64
	for _, c := range s.Owners {
		byOwner += c.V[k]
	}
	for _, c := range s.Paths {
		byPath += c.V[k]
	}
	if byOwner != s.Max[k] || byPath != s.Max[k] {
		t.Errorf("bucket %d: owners sum to %d, paths to %d, want %d", k, byOwner, byPath, s.Max[k])
	}
	// Tensors are a series of their own.
	if ts := d.seriesOf(t, 7, nil, levelTensor); ts.Peak != 30*mib {
		t.Errorf("tensor peak %d, want %d", ts.Peak, 30*mib)
	}
}

// The live set at a bucket's edge is what the events say was live then;
// the leak is in the live set at the end, and in no live set before it
// was made.
func TestHTMLMoments(t *testing.T) {
	d, _ := pageOf(t, htmlTrace(t), Options{NoSymbolize: true})
	if d.Agg.SpanBuckets != 1 {
		t.Fatalf("spans kept every %d buckets, want every one", d.Agg.SpanBuckets)
	}
	w := d.Agg.BucketNS
	at := func(tm uint64) int64 { return int64((tm + w - 1) / w) } // the first moment at or after tm
	for _, c := range []struct {
		tm   uint64
		want string
	}{
		{0, "map[]"},
		{2*ms + 2, "map[0xa100:104857600 0xa200:52428800]"},
		{7 * ms, "map[0xa100:104857600 0xa200:52428800]"},
		{11 * ms, "map[0xa100:104857600 0xa200:52428800 0xa500:8388608]"},
	} {
		if got := fmt.Sprint(d.liveAt(at(c.tm), nil)); got != c.want {
			t.Errorf("live at the edge after %d ns: %s, want %s", c.tm, got, c.want)
		}
	}
	end := int64((d.Agg.Buckets + d.Agg.SpanBuckets - 1) / d.Agg.SpanBuckets)
	if got, want := fmt.Sprint(d.liveAt(end, nil)), "map[0xa100:104857600 0xa200:52428800 0xa500:8388608]"; got != want {
		t.Errorf("live at the end: %s, want %s", got, want)
	}
	dev1 := int32(1)
	if got, want := fmt.Sprint(d.liveAt(end, &dev1)), "map[0xa200:52428800]"; got != want {
		t.Errorf("live at the end on GPU 1: %s, want %s", got, want)
	}
	// The failure: what was live when it failed, exactly.
	if len(d.Failures) != 1 || d.FailedAll != 1 {
		t.Fatalf("failures %+v (%d in all)", d.Failures, d.FailedAll)
	}
	f := d.Failures[0]
	if !f.OOM || f.Size != 1<<40 || f.Live != 158*mib || f.DeviceLive != 108*mib || f.Snapshot < 0 || f.T != 15*ms+1 {
		t.Errorf("failure %+v", f)
	}
	sn := d.Snapshots[f.Snapshot]
	var gpu uint64
	for i := range sn.Stack {
		if d.Stacks.Level[sn.Stack[i]] == levelGPU {
			gpu += uint64(sn.Bytes[i])
		}
	}
	if gpu != f.Live {
		t.Errorf("the failure's live set holds %d bytes of GPU memory, want %d", gpu, f.Live)
	}
}

// Each bucket's bar is the highest its memory reached inside it, though
// no edge sees it: a spike of 1 GiB freed within a bucket.
func TestHTMLSpikeInBucket(t *testing.T) {
	var items []any
	items = append(items, &tracefile.Process{PID: 7, Comm: "train", Time: htmlBase})
	for i := range 100 {
		items = append(items, htmlEv(float64(i), events.CudaMalloc, 0x1000_0000+uint64(i)<<20, mib, 0, frameStep))
		if i == 50 {
			items = append(items, htmlEv(50.25, events.CudaMalloc, 0x9000_0000, 1<<30, 0, frameSpike),
				htmlEv(50.26, events.CudaFree, 0x9000_0000, 0, 0, 0))
		}
	}
	items = append(items, &tracefile.End{Time: htmlBase + 100*ms})
	path, _ := tracetest.Write(t, tracefile.Meta{Tool: "test", StartBoot: htmlBase}, items...)
	d, _ := pageOf(t, path, Options{NoSymbolize: true})
	s := d.seriesOf(t, 0, nil, levelGPU)
	k := int((50*ms + ms/4) / d.Agg.BucketNS)
	if want := int64(51*mib + 1<<30); s.Max[k] != want || s.Peak != uint64(want) {
		t.Errorf("bucket %d's highest %d, series peak %d: want %d", k, s.Max[k], s.Peak, want)
	}
	if k+1 < len(s.Max) && s.Max[k+1] >= 1<<30 {
		t.Errorf("the spike also in bucket %d: %d", k+1, s.Max[k+1])
	}
	for j := range int64(d.Agg.Buckets + 1) {
		if live := d.liveAt(j, nil)["0xa400"]; live != 0 {
			t.Errorf("the spike is in the live set of moment %d: %d bytes", j, live)
		}
	}
}

// Past their bounds, the live sets keep every other moment (and the end),
// exact at each kept; the moves sum per two buckets; the page says so.
func TestHTMLBounds(t *testing.T) {
	defer func(s, m int) { maxPageSpans, maxPageMoves = s, m }(maxPageSpans, maxPageMoves)
	maxPageSpans, maxPageMoves = 300, 300
	path := filepath.Join(t.TempDir(), "big.trace")
	const n = 60_000
	tracetest.WriteBig(t, path, tracetest.Big{Events: n, Stacks: 40, Depth: 4, Window: 300, LeakEvery: 7000, StepNS: 1000})
	d, _ := pageOf(t, path, Options{NoSymbolize: true})
	if d.Agg.SpanRows > maxPageSpans || d.Agg.MoveRows > maxPageMoves || d.Agg.SpanBuckets < 2 || d.Agg.MoveBuckets < 2 {
		t.Fatalf("aggregation %+v: rows past their bounds, or no coarser moments", d.Agg)
	}
	// The truth: replay the allocations (WriteBig's plan) to each kept
	// moment's time. Event i is at BigStart + (i+1)*StepNS.
	var allocs []bigAlloc
	var tm uint64 = tracetest.BigStart
	next := func() uint64 { tm += 1000; return tm }
	for i := 0; i < n/2+300; i++ {
		if i < n/2 {
			allocs = append(allocs, bigAlloc{from: next() + 1}) // an allocation takes effect at its return
			if i == n/4 {
				next() // the failed call
			}
		}
		if j := i - 300; j >= 0 && j%7000 != 6999 {
			allocs[j].to = next()
		}
	}
	end := uint64(d.Agg.Buckets)
	f := uint64(d.Agg.SpanBuckets)
	for j := uint64(0); j <= (end+f-1)/f; j++ {
		edge := tracetest.BigStart + min(j*f, end)*d.Agg.BucketNS
		var want uint64
		for _, a := range allocs {
			if a.from < edge && (a.to == 0 || a.to >= edge) {
				want++
			}
		}
		var got uint64
		for _, b := range d.liveAt(int64(j), nil) {
			got += b
		}
		if wantBytes := liveBytes(allocs, edge); got != wantBytes {
			t.Errorf("moment %d (%d ns): %d bytes live on the page, %d by the events (%d allocations)", j, edge, got, wantBytes, want)
		}
	}
}

// bigAlloc is when one of WriteBig's allocations took effect and was
// freed (0: never).
type bigAlloc struct{ from, to uint64 }

// liveBytes sums the sizes WriteBig gives the allocations live at edge.
func liveBytes(allocs []bigAlloc, edge uint64) uint64 {
	var sum uint64
	for i, a := range allocs {
		if a.from < edge && (a.to == 0 || a.to >= edge) {
			if i%7000 == 6999 {
				sum += tracetest.BigLeakSize
			} else {
				sum += tracetest.BigSize
			}
		}
	}
	return sum
}

// A page's data is its own: nothing in it can close the script element
// it is in, whatever the frames' names.
func TestHTMLScriptSafe(t *testing.T) {
	d := &pageData{Title: `</script><script>alert(1)</script>`, Strings: []string{"</script>&<!--"}, Notes: []string{}}
	var buf bytes.Buffer
	if err := (&Page{d}).WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	_, data, _ := strings.Cut(page, `<script id="data" type="application/json">`)
	data, _, _ = strings.Cut(data, "</script>")
	var back pageData
	if err := json.Unmarshal([]byte(data), &back); err != nil || back.Title != d.Title || !slices.Equal(back.Strings, d.Strings) {
		t.Errorf("the data did not survive the page: %v, %q", err, back.Title)
	}
	if strings.Count(page, "</script>") != 2 {
		t.Errorf("%d </script> in the page, want the two that close its scripts", strings.Count(page, "</script>"))
	}
	if !strings.Contains(page, "<title>&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;</title>") {
		t.Error("the title is not escaped")
	}
}

// Coarsened, the live sets keep the end as a moment of its own: an
// allocation live at the end of 7 buckets stays live at the last moment
// when every other moment goes (7 buckets: moments 0, 2, 4, 6 and the
// end), and one freed in the last bucket does not.
func TestHTMLCoarsenKeepsEnd(t *testing.T) {
	b := &pageBuilder{nb: 7, spanF: 1, spans: map[spanKey]*spanVal{}}
	b.span(0, 0, 2, b.nb+1, 0, 100) // made in bucket 2, live at the end
	b.span(1, 0, 2, b.nb, 0, 10)    // made in bucket 2, freed in the last one
	b.coarsenSpans()
	if b.spanF != 2 || b.endMoment() != 4 {
		t.Fatalf("coarsened to every %d buckets, the end at moment %d; want 2 and 4", b.spanF, b.endMoment())
	}
	live := func(j int32) (n uint64) {
		for k, v := range b.spans {
			if k.sb <= j && j < k.eb {
				n += v.bytes
			}
		}
		return n
	}
	// Moments 2 (bucket 4's edge) and 3 (bucket 6's) have both; the end,
	// the live one alone.
	for j, want := range map[int32]uint64{1: 0, 2: 110, 3: 110, 4: 100} {
		if got := live(j); got != want {
			t.Errorf("moment %d: %d bytes live, want %d", j, got, want)
		}
	}
}
