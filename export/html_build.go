package export

// html_build.go: what the HTML page (html.go) draws, aggregated from a
// stream of the ledger's changes read twice: a trace replayed (WriteHTML),
// or the agent's flight recorder (PageFromHistory). The page's size
// follows what it draws, not the number of events:
//
//   - memory over time: per series (a process or all of them, a device or
//     all, GPU memory or tensors) and time bucket, the highest live bytes
//     in the bucket, split by owner and by the series' top call paths at
//     that highest moment, and the live bytes at the bucket's end;
//   - the live set at each bucket's edge (a moment), as spans: the bytes
//     of each stack and device live from one moment to another, summed
//     over the allocations that share them; an allocation made and freed
//     within one bucket is in no moment's live set, as it is live at no
//     edge (it is in the series' highest figures);
//   - what each stack and device allocated and freed per bucket (moves),
//     for the views of a range;
//   - the exact live set, by stack and device, at each series' peak and
//     at the first failures of each process (snapshots).
//
// Spans and moves are kept at most maxPageSpans and maxPageMoves rows:
// past it they go to every other moment (bucket), as often as needed;
// the page says how finely each is kept.

import (
	"cmp"
	"maps"
	"math"
	"slices"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Bounds on what a page holds.
const (
	// pageBuckets is how many time buckets the memory-over-time chart
	// aims for: about two pixels each on a screen.
	pageBuckets = 720
	// pageSeriesBudget bounds the numbers of all series together
	// (buckets × (2 + categories) each): with many processes, buckets
	// widen before the page grows.
	pageSeriesBudget = 1_500_000
	// pageTopPaths is how many call paths a series splits its memory into
	// by path (the rest is "other").
	pageTopPaths = 10
	// maxPageFailures bounds the failures the page lists; the first
	// pageFailureSnaps of each process get their live set.
	maxPageFailures  = 2000
	pageFailureSnaps = 20
)

// maxPageSpans, maxPageMoves bound the rows of the live sets and of the
// per-bucket allocations and frees (variables for the tests).
// maxPageEvents bounds the allocations and frees the page keeps one by
// one, for zooming in time: a source with more keeps none (its chart, its
// buckets).
var (
	maxPageSpans  = 250_000
	maxPageMoves  = 250_000
	maxPageEvents = 100_000
)

// Levels of memory, as the page shows them.
const (
	levelGPU    = 0 // segments: GPU memory as the driver holds it (a process's live bytes)
	levelTensor = 1 // tensors a framework's allocator handed out of them
)

// levelOf is a's level; -1 for pinned host memory, which the page leaves
// out.
func levelOf(a *ledger.Allocation) int {
	switch {
	case a.API.Segment():
		return levelGPU
	case a.API.Info().Layer == events.LayerTensor:
		return levelTensor
	}
	return -1
}

// allDevices is the device of a series over every device.
const allDevices = math.MinInt32

// pageStep is one event as the builder reads it.
type pageStep struct {
	t   uint64 // when it took effect, boot ns
	pid uint32
	ch  *ledger.Change
	// before: ch.Alloc was live when the source began, made before it (a
	// trace's events.FlagBefore, the agent's history's start).
	before bool
	// A failed allocation call (ch.Stack set, ch.Alloc nil): what it was.
	api    events.API
	result int32
	size   uint64
	device int32
	tid    uint32
}

// failed reports whether s is a failed allocation call.
func (s *pageStep) failed() bool {
	return s.ch.Stack != nil && s.ch.Alloc == nil && s.api.Info().Op == events.OpAlloc
}

type serKey struct {
	pid   uint32 // 0: every process
	dev   int32  // allDevices: every device
	level int
}

// route is what one allocation counts in: its process, device and level.
type route struct {
	pid   uint32
	dev   int32
	level int
}

// pageBuilder aggregates the steps of a source. scan reads them once
// (pass 1), plan decides the buckets and categories, build reads them again
// (pass 2), and data makes the page's model.
type pageBuilder struct {
	start        uint64 // boot ns of the page's time 0
	last, clamp  uint64 // the latest time seen; steps' times made monotonic
	seq          uint64 // steps read in this pass
	steps        uint64 // steps of pass 1
	width        uint64 // bucket width, ns
	nb           int    // buckets
	buckets      int    // the current bucket (pass 2)
	spanF, moveF int    // moments (buckets) per span (move) row's unit

	// Stacks, numbered on first sight in pass 1: canon maps pass 2's to
	// pass 1's (a replay's are its own ledger's).
	canon  func(*ledger.Stack) *ledger.Stack
	ids    map[*ledger.Stack]int32
	stacks []*pageStack

	// Pass 1: each series' running total and peak, each stack's; the four
	// series of each route.
	scanSer   map[serKey]*scanSeries
	scanRoute map[route]*[4]*scanSeries
	// Pass 2: the series, one per distinct set of routes (a process on
	// one device is the same series as the process on all of them).
	series []*buildSeries
	routes map[route][]*buildSeries
	owners []string // the owners seen, by index

	alive map[*ledger.Allocation]int32 // live allocations: the bucket each was made in (-1: before)
	cells map[cellKey]*cell            // live bytes by stack and device
	spans map[spanKey]*spanVal
	// Moves: those of the (moveF) bucket under way by stack and device,
	// and the rows of the buckets before (a key may repeat: rows merge
	// when they pass their bound, and at the end).
	moving    map[cellKey]*moveVal
	moveAt    int
	moveRow   []moveRow
	snapAt    map[uint64][]*buildSeries // pass 1's peak step -> the series whose peak it is
	snaps     []pageSnapshot
	failures  []pageFailure
	failSnaps map[uint32]int
	failCount uint64
	exits     []pageExit
	nvml      *pageNVMLBuild
	// Every allocation and free, while there are at most maxPageEvents
	// (events nil past it): time, stack, device, bytes (negative: freed).
	events   *pageEvents
	failHist map[failHistKey]*[2]uint64 // failures per process, device and bucket: all, out of memory
}

type failHistKey struct {
	pid uint32
	dev int32
	b   int32
}

type pageStack struct {
	routes  []route       // pass 1: the routes its allocations counted in
	st      *ledger.Stack // pass 1's
	pid     uint32
	level   int
	live    uint64     // pass 1: now
	maxLive uint64     // pass 1: the most it held
	api     events.API // the call its allocations (or failures) made: one call site, one API
	owner   int        // index in pageBuilder.owners
	topProc int        // its slot in its process's series by path; pageTopPaths: other
	topAll  int        // in the series of every process
}

type scanSeries struct {
	routes      map[route]bool
	total, peak uint64
	peakSeq     uint64
	stacks      []int32 // the stacks that count in it
	stackSeen   map[int32]bool
}

// buildSeries is one series in pass 2.
type buildSeries struct {
	keys      []serKey
	routes    map[route]bool
	pid       uint32 // 0: every process
	dev       int32
	level     int
	total     uint64
	ownerSlot []int // by owner index: its slot, -1 none
	ownerOf   []int // by slot: the owner index
	paths     []int32
	comp      []uint64 // current bytes by slot: owners, then paths, then other
	nOwn      int
	bmax      uint64
	atMax     bool
	max, end  []uint64
	vals      [][]uint64 // [slot][bucket]: composition at the bucket's highest moment
	peak      uint64
	peakSeq   uint64
	peakT     uint64
	snap      int // index in snaps; -1 none
}

type cellKey struct {
	stack int32
	dev   int32
}

type cell struct{ bytes, count uint64 }

// Span flags.
const (
	spanBefore = 1 // live when the source began
	spanExit   = 2 // released when its process ended (not freed by it)
)

type spanKey struct {
	stack, dev int32
	sb, eb     int32 // live at moments sb..eb-1 (spanF units)
	flags      uint8
}

type spanVal struct{ bytes, count uint64 }

type moveKey struct {
	stack, dev int32
	b          int32 // bucket, moveF units
}

type moveVal struct{ added, removed, nAdded, nRemoved uint64 }

type moveRow struct {
	moveKey
	moveVal
}

// newPageBuilder starts a builder whose time 0 is start (boot ns; 0: the
// first step's).
func newPageBuilder(start uint64) *pageBuilder {
	return &pageBuilder{start: start, canon: func(st *ledger.Stack) *ledger.Stack { return st },
		ids: map[*ledger.Stack]int32{}, scanSer: map[serKey]*scanSeries{}, scanRoute: map[route]*[4]*scanSeries{},
		events: &pageEvents{T: deltas{}, Stack: deltas{}, Dev: deltas{}, Bytes: deltas{}}}
}

// time returns s's time made monotonic: events reach a trace in
// ring-buffer order, nearly but not strictly by time, and a step must not
// land in a bucket before one already closed.
func (b *pageBuilder) time(t uint64) uint64 {
	if b.start == 0 {
		b.start = t
	}
	b.clamp = max(b.clamp, t, b.start)
	return b.clamp
}

// stackID numbers st (pass 1's) on first sight.
func (b *pageBuilder) stackID(st *ledger.Stack, pid uint32) int32 {
	if id, ok := b.ids[st]; ok {
		return id
	}
	id := int32(len(b.stacks))
	b.ids[st] = id
	level := levelGPU
	if st.Tensor {
		level = levelTensor
	}
	b.stacks = append(b.stacks, &pageStack{st: st, pid: pid, level: level, topProc: pageTopPaths, topAll: pageTopPaths})
	return id
}

// seriesKeys are the four series a route counts in.
func seriesKeys(r route) [4]serKey {
	return [4]serKey{{r.pid, r.dev, r.level}, {r.pid, allDevices, r.level}, {0, r.dev, r.level}, {0, allDevices, r.level}}
}

// scan reads one step of pass 1.
func (b *pageBuilder) scan(s *pageStep) {
	b.seq++
	b.last = b.time(s.t)
	ch := s.ch
	if s.failed() {
		if ps := b.stacks[b.stackID(ch.Stack, s.pid)]; ps.api == 0 {
			ps.api = s.api
		}
	}
	for a := range ch.AllFreed() {
		b.scanAlloc(s.pid, a, -1)
	}
	if a := ch.Alloc; a != nil {
		b.scanAlloc(s.pid, a, 1)
	}
}

func (b *pageBuilder) scanAlloc(pid uint32, a *ledger.Allocation, sign int) {
	level := levelOf(a)
	if level < 0 || a.Stack == nil {
		return
	}
	id := b.stackID(a.Stack, pid)
	ps := b.stacks[id]
	if ps.api == 0 {
		ps.api = a.API
	}
	r := route{pid, a.Device, level}
	if sign > 0 {
		ps.live += a.Size
		ps.maxLive = max(ps.maxLive, ps.live)
	} else {
		ps.live -= min(ps.live, a.Size)
	}
	sers := b.scanRoute[r]
	if sers == nil {
		sers = new([4]*scanSeries)
		for i, k := range seriesKeys(r) {
			ss := b.scanSer[k]
			if ss == nil {
				ss = &scanSeries{routes: map[route]bool{}, stackSeen: map[int32]bool{}}
				b.scanSer[k] = ss
			}
			ss.routes[r] = true
			sers[i] = ss
		}
		b.scanRoute[r] = sers
	}
	if !slices.Contains(ps.routes, r) {
		ps.routes = append(ps.routes, r)
		for _, ss := range sers {
			if !ss.stackSeen[id] {
				ss.stackSeen[id] = true
				ss.stacks = append(ss.stacks, id)
			}
		}
	}
	for _, ss := range sers {
		if sign > 0 {
			ss.total += a.Size
			if ss.total > ss.peak {
				ss.peak, ss.peakSeq = ss.total, b.seq
			}
		} else {
			ss.total -= min(ss.total, a.Size)
		}
	}
}

// niceWidths are the bucket widths, in ns, the page picks from: 1, 2, 5
// times a power of ten, from 1 µs.
func niceWidth(atLeast uint64) uint64 {
	for w := uint64(1000); ; w *= 10 {
		for _, m := range []uint64{1, 2, 5} {
			if w*m >= atLeast {
				return w * m
			}
		}
	}
}

// plan decides, after pass 1, the buckets, the series, and each series'
// categories: the owners of its stacks (owner gives a stack's owner's
// index in names), and its pageTopPaths stacks that held the most.
func (b *pageBuilder) plan(owner func(st *ledger.Stack) string) {
	index := map[string]int{}
	for _, ps := range b.stacks {
		name := owner(ps.st)
		i, ok := index[name]
		if !ok {
			i = len(b.owners)
			index[name] = i
			b.owners = append(b.owners, name)
		}
		ps.owner = i
	}
	// One series per distinct set of routes.
	type group struct {
		keys []serKey
		ss   *scanSeries
	}
	byRoutes := map[string]*group{}
	var groups []*group
	keys := make([]serKey, 0, len(b.scanSer))
	for k := range b.scanSer {
		keys = append(keys, k)
	}
	// A series' first key names it: a process's rather than every
	// process's where they are the same memory (one process), so that it
	// splits by that process's top paths.
	slices.SortFunc(keys, func(x, y serKey) int {
		return cmp.Or(cmp.Compare(x.level, y.level), cmp.Compare(b2i(x.pid == 0), b2i(y.pid == 0)), cmp.Compare(x.pid, y.pid),
			cmp.Compare(x.dev, y.dev))
	})
	for _, k := range keys {
		ss := b.scanSer[k]
		rs := make([]route, 0, len(ss.routes))
		for r := range ss.routes {
			rs = append(rs, r)
		}
		slices.SortFunc(rs, func(x, y route) int {
			return cmp.Or(cmp.Compare(x.pid, y.pid), cmp.Compare(x.dev, y.dev), cmp.Compare(x.level, y.level))
		})
		name := fmtRoutes(rs)
		g := byRoutes[name]
		if g == nil {
			g = &group{ss: ss}
			byRoutes[name] = g
			groups = append(groups, g)
		}
		g.keys = append(g.keys, k)
	}
	// Each process's (and every process's) top paths, per level.
	for _, ps := range b.stacks {
		ps.topProc, ps.topAll = pageTopPaths, pageTopPaths
	}
	rank := func(ids []int32) []int32 {
		out := slices.Clone(ids)
		slices.SortFunc(out, func(x, y int32) int {
			return cmp.Or(cmp.Compare(b.stacks[y].maxLive, b.stacks[x].maxLive), cmp.Compare(x, y))
		})
		for len(out) > 0 && b.stacks[out[len(out)-1]].maxLive == 0 {
			out = out[:len(out)-1]
		}
		return out[:min(len(out), pageTopPaths)]
	}
	topOf := map[serKey][]int32{} // (pid or 0, level) -> top
	for k, ss := range b.scanSer {
		if k.dev != allDevices {
			continue
		}
		top := rank(ss.stacks)
		topOf[serKey{k.pid, allDevices, k.level}] = top
		for i, id := range top {
			if k.pid == 0 {
				b.stacks[id].topAll = i
			} else {
				b.stacks[id].topProc = i
			}
		}
	}
	nCats := 0
	for _, g := range groups {
		k := g.keys[0]
		bs := &buildSeries{keys: g.keys, routes: g.ss.routes, pid: k.pid, dev: k.dev, level: k.level, snap: -1,
			peak: g.ss.peak, peakSeq: g.ss.peakSeq, ownerSlot: make([]int, len(b.owners))}
		for i := range bs.ownerSlot {
			bs.ownerSlot[i] = -1
		}
		for _, id := range g.ss.stacks {
			ow := b.stacks[id].owner
			if bs.ownerSlot[ow] < 0 {
				bs.ownerSlot[ow] = len(bs.ownerOf)
				bs.ownerOf = append(bs.ownerOf, ow)
			}
		}
		bs.nOwn = len(bs.ownerOf)
		bs.paths = topOf[serKey{k.pid, allDevices, k.level}]
		bs.comp = make([]uint64, bs.nOwn+len(bs.paths)+1)
		b.series = append(b.series, bs)
		nCats += 2 + len(bs.comp)
	}
	b.routes = map[route][]*buildSeries{}
	for _, bs := range b.series {
		for r := range bs.routes {
			b.routes[r] = append(b.routes[r], bs)
		}
	}
	// The buckets: pageBuckets over the duration, fewer where the series'
	// numbers would pass their budget.
	dur := b.last - b.start
	want := uint64(pageBuckets)
	if nCats > 0 {
		want = min(want, max(uint64(pageSeriesBudget/nCats), 60))
	}
	b.width = niceWidth(max(dur/want, 1))
	b.nb = int(dur/b.width) + 1
	for _, bs := range b.series {
		bs.max = make([]uint64, b.nb)
		bs.end = make([]uint64, b.nb)
		bs.vals = make([][]uint64, len(bs.comp))
		for i := range bs.vals {
			bs.vals[i] = make([]uint64, b.nb)
		}
		bs.atMax = true
	}
	b.snapAt = map[uint64][]*buildSeries{}
	for _, bs := range b.series {
		if bs.peak > 0 {
			b.snapAt[bs.peakSeq] = append(b.snapAt[bs.peakSeq], bs)
		}
	}
	b.steps = b.seq
	b.seq, b.clamp = 0, 0
	b.spanF, b.moveF = 1, 1
	b.alive = map[*ledger.Allocation]int32{}
	b.cells = map[cellKey]*cell{}
	b.spans = map[spanKey]*spanVal{}
	b.moving = map[cellKey]*moveVal{}
	b.failSnaps = map[uint32]int{}
	b.nvml = newPageNVML(b.nb)
}

func fmtRoutes(rs []route) string {
	out := make([]byte, 0, 16*len(rs))
	for _, r := range rs {
		out = append(out, byte(r.pid), byte(r.pid>>8), byte(r.pid>>16), byte(r.pid>>24),
			byte(r.dev), byte(r.dev>>8), byte(r.dev>>16), byte(r.dev>>24), byte(r.level))
	}
	return string(out)
}

// bucket is the bucket of time t (monotonic), within the page.
func (b *pageBuilder) bucket(t uint64) int {
	k := int((t - b.start) / b.width)
	return min(k, b.nb-1)
}

// advance closes the buckets before k.
func (b *pageBuilder) advance(k int) {
	for b.buckets < k {
		for _, bs := range b.series {
			bs.close(b.buckets)
		}
		b.buckets++
		for _, bs := range b.series {
			bs.bmax, bs.atMax = bs.total, true
		}
	}
}

// close ends bucket k: its end value, and its composition if the highest
// moment is now.
func (bs *buildSeries) close(k int) {
	if bs.atMax {
		bs.save(k)
	}
	bs.end[k] = bs.total
	bs.atMax = false
}

func (bs *buildSeries) save(k int) {
	bs.max[k] = bs.bmax
	for i, v := range bs.comp {
		bs.vals[i][k] = v
	}
	bs.atMax = false
}

// add counts delta bytes of a stack's allocation in bs.
func (bs *buildSeries) add(k int, ps *pageStack, size uint64, sign int) {
	own := bs.ownerSlot[ps.owner]
	path := ps.topAll
	if bs.pid != 0 {
		path = ps.topProc
	}
	slot := bs.nOwn + min(path, len(bs.paths))
	if sign < 0 {
		if bs.atMax {
			bs.save(k) // the composition at the highest moment, before it goes down
		}
		bs.total -= min(bs.total, size)
		bs.comp[own] -= min(bs.comp[own], size)
		bs.comp[slot] -= min(bs.comp[slot], size)
		return
	}
	bs.total += size
	bs.comp[own] += size
	bs.comp[slot] += size
	if bs.total > bs.bmax {
		bs.bmax, bs.atMax = bs.total, true
	}
}

// build reads one step of pass 2.
func (b *pageBuilder) build(s *pageStep) {
	b.seq++
	t := b.time(s.t)
	k := b.bucket(t)
	b.advance(k)
	ch := s.ch
	exit := ch.Exit
	var held uint64
	for a := range ch.AllFreed() {
		b.free(k, s.pid, a, exit)
		if exit && levelOf(a) == levelGPU {
			held += a.Size
		}
	}
	if exit {
		b.exits = append(b.exits, pageExit{T: t - b.start, PID: s.pid, Bytes: held})
	}
	if a := ch.Alloc; a != nil {
		b.alloc(k, s.pid, a, s.before)
	}
	for _, bs := range b.snapAt[b.seq] {
		bs.snap = len(b.snaps)
		bs.peakT = t - b.start
		b.snaps = append(b.snaps, b.snapshot("peak", t, s.pid, bs))
	}
	if s.failed() {
		b.failure(s, t)
	}
}

func (b *pageBuilder) id(st *ledger.Stack, pid uint32) (int32, *pageStack) {
	id := b.stackID(b.canon(st), pid)
	return id, b.stacks[id]
}

func (b *pageBuilder) alloc(k int, pid uint32, a *ledger.Allocation, before bool) {
	level := levelOf(a)
	if level < 0 || a.Stack == nil {
		return
	}
	id, ps := b.id(a.Stack, pid)
	for _, bs := range b.routes[route{pid, a.Device, level}] {
		bs.add(k, ps, a.Size, 1)
	}
	c := b.cells[cellKey{id, a.Device}]
	if c == nil {
		c = &cell{}
		b.cells[cellKey{id, a.Device}] = c
	}
	c.bytes += a.Size
	c.count++
	b.event(id, a.Device, int64(a.Size))
	if before {
		b.alive[a] = -1
		return
	}
	b.alive[a] = int32(k)
	m := b.move(id, a.Device, k)
	m.added += a.Size
	m.nAdded++
}

func (b *pageBuilder) free(k int, pid uint32, a *ledger.Allocation, exit bool) {
	level := levelOf(a)
	if level < 0 || a.Stack == nil {
		return
	}
	made, ok := b.alive[a]
	if !ok {
		return // made before pass 2 saw it: cannot happen with a ledger's changes
	}
	delete(b.alive, a)
	id, ps := b.id(a.Stack, pid)
	for _, bs := range b.routes[route{pid, a.Device, level}] {
		bs.add(k, ps, a.Size, -1)
	}
	if c := b.cells[cellKey{id, a.Device}]; c != nil {
		c.bytes -= min(c.bytes, a.Size)
		c.count--
		if c.count == 0 {
			delete(b.cells, cellKey{id, a.Device})
		}
	}
	b.event(id, a.Device, -int64(a.Size))
	var flags uint8
	if exit {
		flags |= spanExit
	} else {
		m := b.move(id, a.Device, k)
		m.removed += a.Size
		m.nRemoved++
	}
	b.span(id, a.Device, made, k+1, flags, a.Size)
}

// Moments: moment k (0..nb) is the edge before bucket k, moment nb the
// end. Spans keep every spanF-th of them, and the end: span moment j is
// moment min(j*spanF, nb), the last one endMoment().
func (b *pageBuilder) endMoment() int32 {
	f := int32(b.spanF)
	return (int32(b.nb) + f - 1) / f
}

// span adds an allocation live from the moment after bucket made (or from
// the start: -1, before) to moment end (exclusive; nb+1: live at the end).
func (b *pageBuilder) span(id, dev, made int32, end int, flags uint8, size uint64) {
	sb := made + 1
	if made < 0 {
		sb, flags = 0, flags|spanBefore
	}
	f := int32(b.spanF)
	key := spanKey{id, dev, (sb + f - 1) / f, (int32(end) + f - 1) / f, flags}
	if end > b.nb {
		key.eb = b.endMoment() + 1
	}
	if key.sb >= key.eb {
		if flags&spanExit == 0 {
			return // live at no moment kept
		}
		// Held when its process ended: in no moment's live set, but the
		// range views count it as left live.
		key.eb = key.sb
	}
	v := b.spans[key]
	if v == nil {
		if len(b.spans) >= maxPageSpans {
			b.coarsenSpans()
			b.span(id, dev, made, end, flags, size)
			return
		}
		v = &spanVal{}
		b.spans[key] = v
	}
	v.bytes += size
	v.count++
}

// coarsenSpans keeps every other moment of the spans (and the end).
func (b *pageBuilder) coarsenSpans() {
	old := b.spans
	oldEnd := b.endMoment()
	b.spans = make(map[spanKey]*spanVal, len(old)/2)
	b.spanF *= 2
	for k, v := range old {
		atEnd := k.eb == oldEnd+1
		k.sb, k.eb = (k.sb+1)/2, (k.eb+1)/2
		if atEnd {
			k.eb = b.endMoment() + 1
		}
		if k.sb >= k.eb {
			if k.flags&spanExit == 0 {
				continue
			}
			k.eb = k.sb
		}
		if w := b.spans[k]; w != nil {
			w.bytes += v.bytes
			w.count += v.count
		} else {
			b.spans[k] = v
		}
	}
}

// move returns stack id's moves on dev in bucket k. Steps come in time
// order, so a bucket's moves are complete once a step of a later one
// comes: they become rows then, and only the bucket under way is looked
// up by key.
func (b *pageBuilder) move(id, dev int32, k int) *moveVal {
	if c := k / b.moveF; c != b.moveAt {
		b.closeMoves()
		b.moveAt = k / b.moveF // closeMoves may have coarsened
	}
	m := b.moving[cellKey{id, dev}]
	if m == nil {
		m = &moveVal{}
		b.moving[cellKey{id, dev}] = m
	}
	return m
}

// closeMoves makes rows of the moves of the bucket under way.
func (b *pageBuilder) closeMoves() {
	if b.moveRow == nil {
		b.moveRow = make([]moveRow, 0, 1024)
	}
	for k, v := range b.moving {
		b.moveRow = append(b.moveRow, moveRow{moveKey{k.stack, k.dev, int32(b.moveAt)}, *v})
	}
	clear(b.moving)
	if len(b.moveRow) > maxPageMoves {
		b.mergeMoves()
	}
	for len(b.moveRow) > maxPageMoves {
		b.moveF *= 2
		for i := range b.moveRow {
			b.moveRow[i].b /= 2
		}
		b.mergeMoves()
	}
}

// mergeMoves sorts the rows and sums those of one key.
func (b *pageBuilder) mergeMoves() {
	slices.SortFunc(b.moveRow, func(x, y moveRow) int {
		switch {
		case x.stack != y.stack:
			return cmp.Compare(x.stack, y.stack)
		case x.dev != y.dev:
			return cmp.Compare(x.dev, y.dev)
		}
		return cmp.Compare(x.b, y.b)
	})
	b.moveRow = sumMoveRows(b.moveRow)
}

// snapshot is the live set of series bs (or, nil, of process pid) now.
func (b *pageBuilder) snapshot(kind string, t uint64, pid uint32, bs *buildSeries) pageSnapshot {
	sn := pageSnapshot{Kind: kind, T: t - b.start, Series: -1}
	if bs != nil {
		sn.PID, sn.Level, sn.Total = bs.pid, bs.level, bs.total
		if bs.dev != allDevices {
			d := bs.dev
			sn.Dev = &d
		}
	} else {
		sn.PID = pid
	}
	type row struct {
		cellKey
		cell
	}
	var rows []row
	for k, c := range b.cells {
		ps := b.stacks[k.stack]
		if bs != nil && !bs.routes[route{ps.pid, k.dev, ps.level}] || bs == nil && ps.pid != pid {
			continue
		}
		rows = append(rows, row{k, *c})
	}
	slices.SortFunc(rows, func(x, y row) int {
		return cmp.Or(cmp.Compare(y.bytes, x.bytes), cmp.Compare(x.stack, y.stack), cmp.Compare(x.dev, y.dev))
	})
	for _, r := range rows {
		sn.Stack = append(sn.Stack, int64(r.stack))
		sn.DevCol = append(sn.DevCol, int64(r.dev))
		sn.Bytes = append(sn.Bytes, int64(r.bytes))
		sn.Count = append(sn.Count, int64(r.count))
	}
	return sn
}

func (b *pageBuilder) failure(s *pageStep, t uint64) {
	b.failCount++
	if b.failHist == nil {
		b.failHist = map[failHistKey]*[2]uint64{}
	}
	fk := failHistKey{s.pid, s.device, int32(b.bucket(t))}
	fh := b.failHist[fk]
	if fh == nil {
		fh = new([2]uint64)
		b.failHist[fk] = fh
	}
	fh[0]++
	if events.IsOOM(s.result) {
		fh[1]++
	}
	if len(b.failures) >= maxPageFailures {
		return
	}
	id, _ := b.id(s.ch.Stack, s.pid)
	f := pageFailure{T: t - b.start, PID: s.pid, TID: s.tid, API: s.api.String(), Size: s.size, Dev: s.device,
		Result: s.result, Error: s.api.ResultName(s.result), OOM: events.IsOOM(s.result), Stack: id, Snapshot: -1}
	f.DeviceLive = b.seriesTotal(serKey{s.pid, s.device, levelGPU})
	f.Live = b.seriesTotal(serKey{s.pid, allDevices, levelGPU})
	if b.failSnaps[s.pid] < pageFailureSnaps {
		b.failSnaps[s.pid]++
		f.Snapshot = len(b.snaps)
		b.snaps = append(b.snaps, b.snapshot("failure", t, s.pid, nil))
	}
	b.failures = append(b.failures, f)
}

// finish closes the last bucket, and ends the spans of what is live at
// the end.
func (b *pageBuilder) finish() {
	b.advance(b.nb - 1)
	for _, bs := range b.series {
		bs.close(b.nb - 1)
	}
	type live struct {
		a    *ledger.Allocation
		made int32
	}
	left := make([]live, 0, len(b.alive))
	for a, made := range b.alive {
		left = append(left, live{a, made})
	}
	// In a fixed order: where the spans pass their bound decides which
	// moments they keep.
	slices.SortFunc(left, func(x, y live) int {
		return cmp.Or(cmp.Compare(x.made, y.made), cmp.Compare(x.a.Time, y.a.Time), cmp.Compare(x.a.Addr, y.a.Addr))
	})
	for _, l := range left {
		id, _ := b.id(l.a.Stack, l.a.Stack.PID)
		b.span(id, l.a.Device, l.made, b.nb+1, 0, l.a.Size)
	}
	b.alive = nil
	b.closeMoves()
	b.mergeMoves()
	b.moving = nil
}

// pageNVMLBuild gathers the driver's samples per bucket: the most each
// device and each process was charged in it.
type pageNVMLBuild struct {
	nb      int
	samples int
	failed  int
	err     string
	devices map[int]*pageNVMLDevice
	procs   map[uint32]*pageNVMLProcess
}

func newPageNVML(nb int) *pageNVMLBuild {
	return &pageNVMLBuild{nb: nb, devices: map[int]*pageNVMLDevice{}, procs: map[uint32]*pageNVMLProcess{}}
}

// nvml takes a sample of the driver's view; traced gives a process's
// traced GPU bytes then.
func (b *pageBuilder) nvmlSample(n *tracefile.NVML, traced func(pid uint32) (uint64, bool)) {
	nv := b.nvml
	if n.Error != "" {
		nv.failed++
		if nv.err == "" {
			nv.err = n.Error
		}
		return
	}
	nv.samples++
	t := max(n.Time, b.start)
	k := min(int((t-b.start)/b.width), b.nb-1)
	for _, d := range n.Devices {
		dv := nv.devices[d.Index]
		if dv == nil {
			dv = &pageNVMLDevice{Index: d.Index, UUID: d.UUID, Name: d.Name, Used: filled(nv.nb)}
			nv.devices[d.Index] = dv
		}
		dv.Total = d.Total
		dv.Used[k] = max(dv.Used[k], int64(d.Used))
	}
	used := map[uint32]uint64{}
	for _, p := range n.Processes {
		used[p.PID] += p.Used
	}
	for pid, u := range used {
		tr, ok := traced(pid)
		if !ok {
			continue
		}
		pv := nv.procs[pid]
		if pv == nil {
			pv = &pageNVMLProcess{PID: pid, Used: filled(nv.nb), Traced: filled(nv.nb)}
			nv.procs[pid] = pv
		}
		if int64(u) > pv.Used[k] {
			pv.Used[k], pv.Traced[k] = int64(u), int64(tr)
		}
	}
}

// filled is n -1s: no sample.
func filled(n int) deltas {
	out := make(deltas, n)
	for i := range out {
		out[i] = -1
	}
	return out
}

// seriesTotal is series k's bytes now (pass 2); 0 for a series nothing
// counts in.
func (b *pageBuilder) seriesTotal(k serKey) uint64 {
	for _, bs := range b.series {
		if bs.level == k.level && slices.Contains(bs.keys, k) {
			return bs.total
		}
	}
	return 0
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// recanon renumbers every stack the page's rows name by canon (the
// builder's stacks to the page's, html_data.go): rows that come to name
// the same stack merge.
func (b *pageBuilder) recanon(canon []int32) {
	for i := range b.failures {
		b.failures[i].Stack = canon[b.failures[i].Stack]
	}
	if e := b.events; e != nil {
		for i, id := range e.Stack {
			e.Stack[i] = int64(canon[id])
		}
	}
	for i := range b.snaps {
		for j, id := range b.snaps[i].Stack {
			b.snaps[i].Stack[j] = int64(canon[id])
		}
	}
	spans := make(map[spanKey]*spanVal, len(b.spans))
	for k, v := range b.spans {
		k.stack = canon[k.stack]
		if o := spans[k]; o != nil {
			o.bytes += v.bytes
			o.count += v.count
		} else {
			spans[k] = v
		}
	}
	b.spans = spans
	for i := range b.moveRow {
		b.moveRow[i].stack = canon[b.moveRow[i].stack]
	}
	slices.SortStableFunc(b.moveRow, func(x, y moveRow) int {
		return cmp.Or(cmp.Compare(x.stack, y.stack), cmp.Compare(x.dev, y.dev), cmp.Compare(x.b, y.b))
	})
	b.moveRow = sumMoveRows(b.moveRow)
	for _, bs := range b.series {
		var paths []int32
		vals := bs.vals[:bs.nOwn:bs.nOwn]
		for j, id := range bs.paths {
			c := canon[id]
			if at := slices.Index(paths, c); at >= 0 {
				for k, v := range bs.vals[bs.nOwn+j] {
					vals[bs.nOwn+at][k] += v
				}
				continue
			}
			paths = append(paths, c)
			vals = append(vals, bs.vals[bs.nOwn+j])
		}
		bs.vals = append(vals, bs.vals[bs.nOwn+len(bs.paths)])
		bs.paths = paths
	}
}

// event keeps one allocation (bytes > 0) or free, at the step's time,
// while there are at most maxPageEvents.
func (b *pageBuilder) event(id, dev int32, bytes int64) {
	e := b.events
	if e == nil {
		return
	}
	if len(e.T) >= maxPageEvents {
		b.events = nil
		return
	}
	e.T = append(e.T, int64(b.clamp-b.start))
	e.Stack = append(e.Stack, int64(id))
	e.Dev = append(e.Dev, int64(dev))
	e.Bytes = append(e.Bytes, bytes)
}

// failColumns are the failures per process, device and bucket.
func (b *pageBuilder) failColumns() pageFailHist {
	keys := slices.SortedFunc(maps.Keys(b.failHist), func(x, y failHistKey) int {
		return cmp.Or(cmp.Compare(x.pid, y.pid), cmp.Compare(x.dev, y.dev), cmp.Compare(x.b, y.b))
	})
	c := pageFailHist{PID: deltas{}, Dev: deltas{}, B: deltas{}, N: deltas{}, OOM: deltas{}}
	for _, k := range keys {
		v := b.failHist[k]
		c.PID = append(c.PID, int64(k.pid))
		c.Dev = append(c.Dev, int64(k.dev))
		c.B = append(c.B, int64(k.b))
		c.N = append(c.N, int64(v[0]))
		c.OOM = append(c.OOM, int64(v[1]))
	}
	return c
}

// sumMoveRows adds up, in place, the rows of rows (sorted) that share a
// moveKey: one row per stack, device and bucket.
func sumMoveRows(rows []moveRow) []moveRow {
	out := rows[:0]
	for _, r := range rows {
		if n := len(out); n > 0 && out[n-1].moveKey == r.moveKey {
			o := &out[n-1]
			o.added += r.added
			o.removed += r.removed
			o.nAdded += r.nAdded
			o.nRemoved += r.nRemoved
			continue
		}
		out = append(out, r)
	}
	return out
}
