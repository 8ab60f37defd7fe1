package export

// html_data.go: the page's data, as the page's script reads it (JSON in
// the page, or /ui/data from the agent). Long columns of numbers are
// written as differences from the number before (delta), which keeps
// flat memory and sorted columns short; the script adds them back up.
// Times are ns since the page's time 0; every byte count is below 2^53.

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/owner"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/report"
	"github.com/cudatrace/cudatrace/symbolize"
)

// pageVersion changes when the data's shape does: a live page reloads on
// data of another version.
const pageVersion = 1

// pageData is everything a page shows.
type pageData struct {
	Version   int    `json:"version"`
	Title     string `json:"title"`
	Source    string `json:"source"`    // what the page is of: a trace file, or the agent's node or process
	Generated string `json:"generated"` // RFC 3339
	// Live: the agent's page, which fetches its data again from URL every
	// EverySeconds.
	Live *pageLive `json:"live,omitempty"`
	// Header and Notes: what was traced, and what the figures miss
	// (losses, damage, frames not named, late libraries, unknown
	// devices): the text report's header, then the page's own.
	Header string   `json:"header"`
	Notes  []string `json:"notes"`
	// StartWall is time 0 as wall time (RFC 3339), "" where unknown.
	StartWall  string                 `json:"start_wall"`
	DurationNS uint64                 `json:"duration_ns"`
	Events     uint64                 `json:"events"` // steps read: events that changed memory or failed
	Agg        pageAgg                `json:"aggregation"`
	Processes  []report.Process       `json:"processes"`
	Owners     []report.ProcessOwners `json:"owners,omitempty"`
	NVMLSum    *report.NVMLSummary    `json:"nvml_summary,omitempty"`
	OwnerNames []string               `json:"owner_names"`
	Strings    []string               `json:"strings"`
	Frames     pageFrames             `json:"frames"`
	Stacks     pageStacks             `json:"stacks"`
	Series     []pageSeries           `json:"series"`
	Spans      pageSpans              `json:"spans"`
	Moves      pageMoves              `json:"moves"`
	Snapshots  []pageSnapshot         `json:"snapshots"`
	Failures   []pageFailure          `json:"failures"`
	FailedAll  uint64                 `json:"failed_all"` // failures in all, listed or not
	// Exits are the processes that ended, and the GPU memory they held
	// then (released as they ended).
	Exits []pageExit `json:"exits"`
	NVML  *pageNVML  `json:"nvml,omitempty"`
	// FailHist counts every failure, listed or not, per bucket: the chart
	// draws them all.
	FailHist pageFailHist `json:"fail_hist"`
	// Events are every allocation and free one by one, for zooming in
	// time; nil where the source had more than the page keeps.
	Steps *pageEvents `json:"steps"`
}

// pageFailHist: N failures (OOM of them out of memory) of process PID on
// device Dev in bucket B.
type pageFailHist struct {
	PID deltas `json:"pid"`
	Dev deltas `json:"dev"`
	B   deltas `json:"b"`
	N   deltas `json:"n"`
	OOM deltas `json:"oom"`
}

// pageEvents: at T (ns since the page's time 0, the order they took
// effect in), stack Stack's allocation of Bytes on device Dev, or its free
// (Bytes negative).
type pageEvents struct {
	T     deltas `json:"t"`
	Stack deltas `json:"stack"`
	Dev   deltas `json:"dev"`
	Bytes deltas `json:"bytes"`
}

// pageLive is how a live page refreshes.
type pageLive struct {
	URL          string `json:"url"`
	EverySeconds int    `json:"every_seconds"`
}

// pageAgg says what was aggregated, and how finely.
type pageAgg struct {
	BucketNS     uint64 `json:"bucket_ns"` // the width of a time bucket
	Buckets      int    `json:"buckets"`
	SpanBuckets  int    `json:"span_buckets"`  // the moments kept: every Nth bucket's edge
	MoveBuckets  int    `json:"move_buckets"`  // the range views' unit: N buckets
	SpanRows     int    `json:"span_rows"`     // rows of live sets kept
	MoveRows     int    `json:"move_rows"`     // rows of allocations and frees per bucket kept
	TopPaths     int    `json:"top_paths"`     // call paths a series splits into by path
	MaxFailures  int    `json:"max_failures"`  // failures listed at most
	FailureSnaps int    `json:"failure_snaps"` // of each process, those with their live set
}

// pageFrames: one row per distinct frame.
type pageFrames struct {
	Label  []int `json:"label"`  // "function (file:line)", in Strings
	Name   []int `json:"name"`   // the function, or the address where it is unknown
	File   []int `json:"file"`   // "" unknown
	Line   []int `json:"line"`   // 0 unknown
	Module []int `json:"module"` // the mapping's path; "[python]" for a Python frame
	// Kind: 0 native, 1 Python, 2 CUDA's own libraries (native).
	Kind []int `json:"kind"`
	// Owner is the frame's own owner (its file, by the owner rules), an
	// index in OwnerNames; -1 where no rule names it.
	Owner []int `json:"owner"`
}

// pageStacks: one row per stack (a process's call path at one level).
type pageStacks struct {
	PID   []int64 `json:"pid"`
	Level []int   `json:"level"` // 0 GPU memory (segments), 1 tensors
	Owner []int   `json:"owner"` // who asked for it (report's owners), in OwnerNames
	// Label: a short name, distinct for distinct paths (html_labels.go);
	// UserLine: the innermost line of the user's own code, past a shared
	// helper (the Range tab's "line"); API: the call it made.
	Label    []int `json:"label"`
	UserLine []int `json:"user_line"`
	API      []int `json:"api"`
	// Frames, innermost first: FrameIDs[FrameAt[i]:FrameAt[i+1]].
	FrameAt  []int  `json:"frame_at"`
	FrameIDs deltas `json:"frame_ids"`
	LineAt   []int  `json:"line_at"` // its rows in the view by line: LineKeys[LineAt[i]:LineAt[i+1]], in Strings
	LineKeys []int  `json:"line_keys"`
	FuncAt   []int  `json:"func_at"` // and by function
	FuncKeys []int  `json:"func_keys"`
}

// pageSeries is memory over time of one process (or all) on one device
// (or all) at one level.
type pageSeries struct {
	Keys  []pageSeriesKey `json:"keys"`  // the selections it answers (several when they are the same memory)
	Level int             `json:"level"` // 0 GPU memory, 1 tensors
	Max   deltas          `json:"max"`   // per bucket, the highest live bytes in it (its start included)
	End   deltas          `json:"end"`   // live bytes at its end
	// Owners and Paths split Max: the bytes, at the bucket's highest
	// moment, of each owner, and of each top path (a stack; -1: the rest).
	Owners []pageCat `json:"owners"`
	Paths  []pageCat `json:"paths"`
	Peak   uint64    `json:"peak"`
	PeakT  uint64    `json:"peak_t"`
	// Snapshot is the live set at the peak, an index in Snapshots; -1
	// without one.
	Snapshot int `json:"snapshot"`
}

// pageSeriesKey: PID 0 is every process; Dev nil every device.
type pageSeriesKey struct {
	PID uint32 `json:"pid"`
	Dev *int32 `json:"dev"`
}

// pageCat is one category's bytes per bucket: an owner (an index in
// OwnerNames) or a stack.
type pageCat struct {
	ID int    `json:"id"`
	V  deltas `json:"v"`
}

// pageSpans: stack Stack's allocations on device Dev, Count of them
// holding Bytes, live at the moments SB to EB-1, in units of
// Agg.SpanBuckets buckets (moment k is the edge after bucket k-1; 0 is
// the start). Flags: 1 live when the source began, 2 released when its
// process ended.
type pageSpans struct {
	Stack deltas `json:"stack"`
	Dev   deltas `json:"dev"`
	SB    deltas `json:"sb"`
	EB    deltas `json:"eb"`
	Bytes deltas `json:"bytes"`
	Count deltas `json:"count"`
	Flags deltas `json:"flags"`
}

// pageMoves: what stack Stack allocated (Added bytes, NAdded calls) and
// freed on device Dev in bucket B (in Agg.MoveBuckets units). Memory live
// before the source began is not added; what a process held when it
// ended is not removed.
type pageMoves struct {
	Stack    deltas `json:"stack"`
	Dev      deltas `json:"dev"`
	B        deltas `json:"b"`
	Added    deltas `json:"added"`
	Removed  deltas `json:"removed"`
	NAdded   deltas `json:"n_added"`
	NRemoved deltas `json:"n_removed"`
}

// pageSnapshot is an exact live set: a series' at its peak, or a
// process's when one of its allocations failed.
type pageSnapshot struct {
	Kind   string `json:"kind"` // peak, failure
	T      uint64 `json:"t"`
	PID    uint32 `json:"pid"`
	Dev    *int32 `json:"dev"`
	Level  int    `json:"level"`
	Total  uint64 `json:"total"`
	Series int    `json:"series"` // the series whose peak it is; -1
	Stack  deltas `json:"stack"`
	DevCol deltas `json:"devs"`
	Bytes  deltas `json:"bytes"`
	Count  deltas `json:"count"`
}

// pageFailure is one failed allocation call.
type pageFailure struct {
	T          uint64 `json:"t"`
	PID        uint32 `json:"pid"`
	TID        uint32 `json:"tid"`
	API        string `json:"api"`
	Size       uint64 `json:"size"`
	Dev        int32  `json:"dev"`
	Result     int32  `json:"result"`
	Error      string `json:"error"`
	OOM        bool   `json:"oom"`
	Stack      int32  `json:"stack"`
	Live       uint64 `json:"live"`        // the process's GPU memory then
	DeviceLive uint64 `json:"device_live"` // on the call's device
	Snapshot   int    `json:"snapshot"`    // its live set, an index in Snapshots; -1 none
}

// pageExit is a process's end.
type pageExit struct {
	T     uint64 `json:"t"`
	PID   uint32 `json:"pid"`
	Bytes uint64 `json:"bytes"` // GPU memory (segments) it held then
}

// pageNVML is the driver's view per bucket: the most it charged in it
// (-1: no sample in the bucket).
type pageNVML struct {
	Samples   int               `json:"samples"`
	Failed    int               `json:"failed"`
	Error     string            `json:"error,omitempty"`
	Devices   []pageNVMLDevice  `json:"devices"`
	Processes []pageNVMLProcess `json:"processes"`
}

type pageNVMLDevice struct {
	Index int    `json:"index"` // NVML's, which CUDA's ordinals need not match
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	Total uint64 `json:"total"`
	Used  deltas `json:"used"`
}

type pageNVMLProcess struct {
	PID    uint32 `json:"pid"`
	Used   deltas `json:"used"`   // over all its devices
	Traced deltas `json:"traced"` // the traced GPU bytes at the same sample
}

// deltas is a column of integers written as differences.
type deltas []int64

func (d deltas) MarshalJSON() ([]byte, error) {
	out := make([]byte, 0, 2+3*len(d))
	out = append(out, '[')
	var prev int64
	for i, v := range d {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendInt(out, v-prev, 10)
		prev = v
	}
	return append(out, ']'), nil
}

func u64s(v []uint64) deltas {
	out := make(deltas, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

// pageStrings interns the page's strings.
type pageStrings struct {
	list  []string
	index map[string]int
}

func (s *pageStrings) id(v string) int {
	if i, ok := s.index[v]; ok {
		return i
	}
	if s.index == nil {
		s.index = map[string]int{}
	}
	s.index[v] = len(s.list)
	s.list = append(s.list, v)
	return len(s.list) - 1
}

// data makes the page's data once pass 2 is done: src names the stacks.
func (b *pageBuilder) data(src Stacks) *pageData {
	d := &pageData{Version: pageVersion, DurationNS: b.last - b.start, Events: b.steps, Notes: []string{},
		Processes: []report.Process{}, Snapshots: b.snaps, Failures: b.failures, FailedAll: b.failCount, Exits: b.exits,
		Generated: time.Now().UTC().Format(time.RFC3339)}
	if d.Snapshots == nil {
		d.Snapshots = []pageSnapshot{}
	}
	if d.Failures == nil {
		d.Failures = []pageFailure{}
	}
	if d.Exits == nil {
		d.Exits = []pageExit{}
	}
	d.Agg = pageAgg{BucketNS: b.width, Buckets: b.nb, SpanBuckets: b.spanF, MoveBuckets: b.moveF,
		SpanRows: len(b.spans), MoveRows: len(b.moveRow), TopPaths: pageTopPaths, MaxFailures: maxPageFailures,
		FailureSnaps: pageFailureSnaps}
	var strs pageStrings
	strs.id("")
	d.OwnerNames = slices.Clone(b.owners)
	ownerIndex := map[string]int{}
	for i, n := range d.OwnerNames {
		ownerIndex[n] = i
	}
	frameOwner := func(name string) int {
		i, ok := ownerIndex[name]
		if !ok {
			i = len(d.OwnerNames)
			ownerIndex[name] = i
			d.OwnerNames = append(d.OwnerNames, name)
		}
		return i
	}
	// A frame is one by what it shows: an unnamed one by its offset in its
	// module (the same in every process mapping it), or its address where
	// no module is known; never by its module alone, which made every
	// unnamed frame of a module the first one seen.
	type frameKey struct {
		function, file string
		line           int
		module, addr   string
	}
	frameIDs := map[frameKey]int{}
	addFrame := func(f symbolize.Frame, rf report.Frame) int {
		key := frameKey{rf.Function, rf.File, rf.Line, rf.Module, ""}
		switch {
		case rf.Function != "":
		case rf.Module != "" && rf.Offset != 0:
			key.addr = strconv.FormatUint(rf.Offset, 16)
		default:
			key.addr = rf.Address
		}
		if id, ok := frameIDs[key]; ok {
			return id
		}
		id := len(d.Frames.Label)
		frameIDs[key] = id
		label := rf.Short()
		name := rf.Function
		if name == "" {
			name = rf.Address
		}
		if label == "" {
			label = name
		}
		kind, own := 0, -1
		switch {
		case rf.Module == pystack.Module:
			kind = 1
		case owner.IsCUDA(rf.Module):
			kind = 2
		}
		if w := owner.OfSymbolized([]symbolize.Frame{f}); w.Name != owner.Application {
			own = frameOwner(w.Name)
		}
		d.Frames.Label = append(d.Frames.Label, strs.id(label))
		d.Frames.Name = append(d.Frames.Name, strs.id(name))
		d.Frames.File = append(d.Frames.File, strs.id(rf.File))
		d.Frames.Line = append(d.Frames.Line, rf.Line)
		d.Frames.Module = append(d.Frames.Module, strs.id(rf.Module))
		d.Frames.Kind = append(d.Frames.Kind, kind)
		d.Frames.Owner = append(d.Frames.Owner, own)
		return id
	}
	// Every column a list, never null, however empty.
	d.Frames = pageFrames{Label: []int{}, Name: []int{}, File: []int{}, Line: []int{}, Module: []int{}, Kind: []int{}, Owner: []int{}}
	d.Stacks = pageStacks{PID: []int64{}, Level: []int{}, Owner: []int{}, Label: []int{}, UserLine: []int{}, API: []int{}, FrameIDs: deltas{},
		LineKeys: []int{}, FuncKeys: []int{}}
	st := &d.Stacks
	// One page stack per call path as report has it (per level and call):
	// two calls of one line, or from one native function, are one path
	// there and here. canon maps the builder's stacks to the page's.
	type pathID struct {
		key   string
		level int
		api   events.API
	}
	canon := make([]int32, len(b.stacks))
	seen := map[pathID]int32{}
	var paths []pathInfo
	for i, ps := range b.stacks {
		fs := src.Frames(ps.st)
		rfs := report.Frames(fs)
		k := pathID{report.PathKey(ps.pid, rfs), ps.level, ps.api}
		if id, ok := seen[k]; ok {
			canon[i] = id
			continue
		}
		id := int32(len(paths))
		seen[k], canon[i] = id, id
		paths = append(paths, pathInfo{frames: rfs, api: ps.api.String(), level: ps.level})
		st.PID = append(st.PID, int64(ps.pid))
		st.Level = append(st.Level, ps.level)
		st.Owner = append(st.Owner, ps.owner)
		st.API = append(st.API, strs.id(ps.api.String()))
		st.FrameAt = append(st.FrameAt, len(st.FrameIDs))
		for i, f := range fs {
			st.FrameIDs = append(st.FrameIDs, int64(addFrame(f, rfs[i])))
		}
		st.LineAt = append(st.LineAt, len(st.LineKeys))
		for _, k := range report.ViewKeys(rfs, report.ByLine) {
			st.LineKeys = append(st.LineKeys, strs.id(k))
		}
		st.FuncAt = append(st.FuncAt, len(st.FuncKeys))
		for _, k := range report.ViewKeys(rfs, report.ByFunction) {
			st.FuncKeys = append(st.FuncKeys, strs.id(k))
		}
	}
	labels, lines := pathLabels(paths)
	for i := range paths {
		st.Label = append(st.Label, strs.id(labels[i]))
		st.UserLine = append(st.UserLine, strs.id(lines[i]))
	}
	b.recanon(canon)
	st.FrameAt = append(st.FrameAt, len(st.FrameIDs))
	st.LineAt = append(st.LineAt, len(st.LineKeys))
	st.FuncAt = append(st.FuncAt, len(st.FuncKeys))
	for i, bs := range b.series {
		ps := pageSeries{Level: bs.level, Max: u64s(bs.max), End: u64s(bs.end), Peak: bs.peak, PeakT: bs.peakT,
			Snapshot: bs.snap, Owners: []pageCat{}, Paths: []pageCat{}}
		for _, k := range bs.keys {
			key := pageSeriesKey{PID: k.pid}
			if k.dev != allDevices {
				dev := k.dev
				key.Dev = &dev
			}
			ps.Keys = append(ps.Keys, key)
		}
		for slot, ow := range bs.ownerOf {
			ps.Owners = append(ps.Owners, pageCat{ID: ow, V: u64s(bs.vals[slot])})
		}
		for j, id := range bs.paths {
			ps.Paths = append(ps.Paths, pageCat{ID: int(id), V: u64s(bs.vals[bs.nOwn+j])})
		}
		other := bs.vals[bs.nOwn+len(bs.paths)]
		if slices.ContainsFunc(other, func(v uint64) bool { return v != 0 }) {
			ps.Paths = append(ps.Paths, pageCat{ID: -1, V: u64s(other)})
		}
		if bs.snap >= 0 {
			d.Snapshots[bs.snap].Series = i
		}
		d.Series = append(d.Series, ps)
	}
	if d.Series == nil {
		d.Series = []pageSeries{}
	}
	d.Spans = b.spanColumns()
	d.FailHist = b.failColumns()
	d.Steps = b.events
	d.Moves = b.moveColumns()
	if nv := b.nvml; nv != nil && nv.samples+nv.failed > 0 {
		d.NVML = &pageNVML{Samples: nv.samples, Failed: nv.failed, Error: nv.err, Devices: []pageNVMLDevice{},
			Processes: []pageNVMLProcess{}}
		for _, dv := range nv.devices {
			d.NVML.Devices = append(d.NVML.Devices, *dv)
		}
		slices.SortFunc(d.NVML.Devices, func(x, y pageNVMLDevice) int { return cmp.Compare(x.Index, y.Index) })
		for _, pv := range nv.procs {
			d.NVML.Processes = append(d.NVML.Processes, *pv)
		}
		slices.SortFunc(d.NVML.Processes, func(x, y pageNVMLProcess) int { return cmp.Compare(x.PID, y.PID) })
	}
	d.Strings = strs.list
	return d
}

// startup reports whether f is the C library's start of a program
// (_start, __libc_start_main and the like): in every stack, naming none.
func startup(f report.Frame) bool {
	base := path.Base(f.Module)
	return f.Function == "_start" || strings.HasPrefix(f.Function, "__libc_start") ||
		strings.HasPrefix(base, "libc.so") || strings.HasPrefix(base, "ld-linux")
}

// spanColumns are the spans, by stack, device and moment.
func (b *pageBuilder) spanColumns() pageSpans {
	keys := make([]spanKey, 0, len(b.spans))
	for k := range b.spans {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y spanKey) int {
		// Not cmp.Or: it would compare every field of every pair.
		switch {
		case x.stack != y.stack:
			return cmp.Compare(x.stack, y.stack)
		case x.dev != y.dev:
			return cmp.Compare(x.dev, y.dev)
		case x.sb != y.sb:
			return cmp.Compare(x.sb, y.sb)
		case x.eb != y.eb:
			return cmp.Compare(x.eb, y.eb)
		}
		return cmp.Compare(x.flags, y.flags)
	})
	n := len(keys)
	c := pageSpans{Stack: make(deltas, 0, n), Dev: make(deltas, 0, n), SB: make(deltas, 0, n), EB: make(deltas, 0, n),
		Bytes: make(deltas, 0, n), Count: make(deltas, 0, n), Flags: make(deltas, 0, n)}
	for _, k := range keys {
		v := b.spans[k]
		c.Stack = append(c.Stack, int64(k.stack))
		c.Dev = append(c.Dev, int64(k.dev))
		c.SB = append(c.SB, int64(k.sb))
		c.EB = append(c.EB, int64(k.eb))
		c.Bytes = append(c.Bytes, int64(v.bytes))
		c.Count = append(c.Count, int64(v.count))
		c.Flags = append(c.Flags, int64(k.flags))
	}
	return c
}

// moveColumns are the moves, by stack, device and bucket (finish merged
// them in that order).
func (b *pageBuilder) moveColumns() pageMoves {
	n := len(b.moveRow)
	c := pageMoves{Stack: make(deltas, 0, n), Dev: make(deltas, 0, n), B: make(deltas, 0, n), Added: make(deltas, 0, n),
		Removed: make(deltas, 0, n), NAdded: make(deltas, 0, n), NRemoved: make(deltas, 0, n)}
	for _, r := range b.moveRow {
		c.Stack = append(c.Stack, int64(r.stack))
		c.Dev = append(c.Dev, int64(r.dev))
		c.B = append(c.B, int64(r.b))
		c.Added = append(c.Added, int64(r.added))
		c.Removed = append(c.Removed, int64(r.removed))
		c.NAdded = append(c.NAdded, int64(r.nAdded))
		c.NRemoved = append(c.NRemoved, int64(r.nRemoved))
	}
	return c
}

// unknownDeviceNote says how much memory the page's processes held on the
// unknown device: threads that chose their device before tracing began.
func unknownDeviceNote(procs []report.Process) []string {
	var out []string
	for _, p := range procs {
		for _, d := range p.Devices {
			if d.Unknown && d.PeakBytes > 0 {
				out = append(out, fmt.Sprintf("pid %d (%s) held up to %s on an unknown device: its threads chose their device before tracing began and did not say which; shown as device \"unknown\", never guessed",
					p.PID, p.Comm, units.Bytes(d.PeakBytes)))
			}
		}
	}
	return out
}
