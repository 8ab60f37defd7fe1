package export

import (
	"fmt"
	"io"
	"strconv"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/owner"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/symbolize"
)

// Sample types: first those of the Go heap profile, in its order and with
// its names, so `go tool pprof`, Pyroscope and Parca show GPU memory as they
// show Go memory (inuse_space by default); then the same four for tensors
// and for pinned host memory, chosen with -sample_index (see Values).
var pprofSampleTypes = sampleTypes("", "tensor_", "host_")

func sampleTypes(classes ...string) []*profile.ValueType {
	var out []*profile.ValueType
	for _, c := range classes {
		out = append(out,
			&profile.ValueType{Type: c + "alloc_objects", Unit: "count"},
			&profile.ValueType{Type: c + "alloc_space", Unit: "bytes"},
			&profile.ValueType{Type: c + "inuse_objects", Unit: "count"},
			&profile.ValueType{Type: c + "inuse_space", Unit: "bytes"})
	}
	return out
}

// WritePprof writes the trace at path as a gzipped pprof profile of the
// Go heap profile's shape. inuse_* is the live set at opts.At; alloc_*
// counts the successful allocations from the start up to the same moment,
// as a Go heap profile taken then would.
func WritePprof(w io.Writer, path string, opts Options) error {
	p, err := tracePprof(path, opts)
	if err != nil {
		return err
	}
	return writeGzipped(w, p)
}

// tracePprof builds WritePprof's profile (the OTLP export's too).
func tracePprof(path string, opts Options) (*profile.Profile, error) {
	end, err := until(path, opts.At, &opts)
	if err != nil {
		return nil, err
	}
	samples := Samples{}
	t, err := replay.Read(path, replay.Options{Until: end, OnEvent: func(ev *events.Event, ch ledger.Change) error {
		if a := ch.Alloc; a != nil && opts.selected(ch.Process.PID) {
			samples.AddAlloc(KeyOf(a), 1, int64(a.Size))
		}
		return nil
	}})
	if err != nil {
		return nil, err
	}
	if err := opts.checkReplay(t, end); err != nil {
		return nil, err
	}
	for _, p := range t.Ledger.Processes() {
		if opts.selected(p.PID) {
			samples.AddLive(p.AtEnd()) // an ended process: what it held at exit
		}
	}

	syms := t.Symbols(!opts.NoSymbolize)
	defer syms.Close()
	comm := map[uint32]string{}
	labels := map[uint32]map[string]string{}
	for _, p := range t.Ledger.Processes() {
		comm[p.PID] = p.Comm
		if c := t.First(p.PID); c != nil {
			labels[p.PID] = JobLabels(map[string]string{"container": c.Container, "pod": c.Pod}, c)
		}
	}
	b := newPprofBuilder(replayStacks{t, syms}, comm, labels)
	p := b.build(samples)
	p.TimeNanos = t.Meta.WallTime(t.Meta.StartBoot).UnixNano()
	if end != 0 {
		p.DurationNanos = int64(end - t.Meta.StartBoot)
	} else {
		p.DurationNanos = int64(t.DurationNS())
	}
	p.Comments = []string{fmt.Sprintf("cudatrace: GPU memory allocations of %s; inuse_* is the live set at %s", path, opts.At)}
	opts.warnGone(syms)
	return p, nil
}

// writeGzipped checks p and writes it gzipped.
func writeGzipped(w io.Writer, p *profile.Profile) error {
	if err := p.CheckValid(); err != nil {
		return fmt.Errorf("pprof: the profile built is invalid: %w", err)
	}
	if err := p.Write(w); err != nil {
		return fmt.Errorf("pprof: write: %w", err)
	}
	return nil
}

// Stacks is what the exports need of a stack beyond its addresses: the
// mappings they are read against and the symbolized frames. A replayed
// trace gives them (replay.Trace.Maps, replay.Symbols.Frames), and so does
// a live session (the agent's, from the mappings it captured).
type Stacks interface {
	Maps(st *ledger.Stack) []proc.Mapping
	Frames(st *ledger.Stack) []symbolize.Frame
}

// replayStacks is a replayed trace's Stacks.
type replayStacks struct {
	t    *replay.Trace
	syms *replay.Symbols
}

func (r replayStacks) Maps(st *ledger.Stack) []proc.Mapping      { return r.t.Maps(st) }
func (r replayStacks) Frames(st *ledger.Stack) []symbolize.Frame { return r.syms.Frames(st) }

// pprofBuilder gives each mapping, location and function one entry.
type pprofBuilder struct {
	p         *profile.Profile
	src       Stacks
	comm      map[uint32]string
	labels    map[uint32]map[string]string // extra string labels per process
	mappings  map[proc.Mapping]*profile.Mapping
	locations map[locKey]*profile.Location
	functions map[[2]string]*profile.Function
	stacks    map[*ledger.Stack][]*profile.Location
	owners    map[*ledger.Stack]string // each stack's owner (package owner), its label
}

// locKey: one location per address in one mapping, or per address and
// process where no mapping is known.
type locKey struct {
	m    *profile.Mapping
	pid  uint32
	addr uint64
}

func newPprofBuilder(src Stacks, comm map[uint32]string, labels map[uint32]map[string]string) *pprofBuilder {
	b := &pprofBuilder{
		p: &profile.Profile{
			SampleType:        pprofSampleTypes,
			DefaultSampleType: "inuse_space",
			PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
			Period:            1,
		},
		src: src, comm: comm, labels: labels,
		mappings:  map[proc.Mapping]*profile.Mapping{},
		locations: map[locKey]*profile.Location{},
		functions: map[[2]string]*profile.Function{},
		stacks:    map[*ledger.Stack][]*profile.Location{},
		owners:    map[*ledger.Stack]string{},
	}
	return b
}

// build adds samples to the profile, in a stable order, and returns it.
// The first mapping is a program's: pprof names the profile ("File:") after
// it, and a process's lowest executable mapping is its program's (the
// libraries are mapped above it).
func (b *pprofBuilder) build(samples Samples) *profile.Profile {
	keys := samples.sorted()
	for _, k := range keys {
		if maps := b.src.Maps(k.Stack); len(maps) > 0 {
			b.mapping(maps, maps[0].Start)
			break
		}
	}
	for _, k := range keys {
		b.sample(k, samples[k])
	}
	return b.p
}

func (b *pprofBuilder) sample(k SampleKey, v *Values) {
	info := k.API.Info()
	// Segments are what the runtime and the driver hand out; tensors, the
	// blocks a framework's allocator cuts from them. Both are in the
	// profile: filter with -tagfocus level=tensor (or segment).
	level := "segment"
	if info.Layer == events.LayerTensor {
		level = "tensor"
	}
	labels := map[string][]string{
		"comm":  {b.comm[k.Stack.PID]},
		"api":   {k.API.String()},
		"kind":  {info.Kind.String()},
		"level": {level},
		// A string: pprof's encoding reads a numeric label of 0 back
		// as an empty string label, and device 0 is the common one.
		"device": {events.DeviceName(k.Device)},
	}
	for name, v := range b.labels[k.Stack.PID] {
		if v != "" {
			labels[name] = []string{v}
		}
	}
	// Who asked for it (package owner): -tagfocus owner=nccl. b.stack
	// names it.
	locs := b.stack(k.Stack)
	labels["owner"] = []string{b.owners[k.Stack]}
	num := map[string][]int64{"pid": {int64(k.Stack.PID)}}
	var numUnit map[string][]string
	// The rank is also a number: pprof reads -tagfocus rank=3 as a
	// numeric range, which matches numeric labels only (the string label
	// is for Pyroscope and Parca, and -tagfocus 'rank=^3$'). Its unit
	// keeps rank 0, which pprof's decoder drops from a unitless numeric
	// label of 0, and matches a filter without one.
	if rl := labels["rank"]; len(rl) == 1 {
		if r, err := strconv.Atoi(rl[0]); err == nil {
			num["rank"] = []int64{int64(r)}
			numUnit = map[string][]string{"pid": {""}, "rank": {"rank"}}
		}
	}
	b.p.Sample = append(b.p.Sample, &profile.Sample{
		Location: locs,
		Value:    v[:],
		Label:    labels,
		NumLabel: num,
		NumUnit:  numUnit,
	})
}

// stack returns st's locations, innermost first, as pprof wants them.
func (b *pprofBuilder) stack(st *ledger.Stack) []*profile.Location {
	if locs, ok := b.stacks[st]; ok {
		return locs
	}
	maps := b.src.Maps(st)
	frames := b.src.Frames(st)
	locs := make([]*profile.Location, 0, len(frames))
	for _, f := range frames {
		locs = append(locs, b.location(st.PID, maps, f))
	}
	b.stacks[st] = locs
	b.owners[st] = owner.OfMapped(maps, frames).Name
	return locs
}

func (b *pprofBuilder) location(pid uint32, maps []proc.Mapping, f symbolize.Frame) *profile.Location {
	m := b.mapping(maps, f.Addr)
	key := locKey{m: m, addr: f.Addr}
	if m == nil {
		key.pid = pid
	}
	if loc := b.locations[key]; loc != nil {
		return loc
	}
	loc := &profile.Location{ID: uint64(len(b.p.Location) + 1), Mapping: m, Address: f.Addr}
	if f.Function != "" {
		fn := b.function(f.Function, f.File, f.Module == pystack.Module)
		loc.Line = []profile.Line{{Function: fn, Line: int64(f.Line)}}
		if m != nil {
			m.HasFunctions = true
			m.HasFilenames = m.HasFilenames || f.File != ""
			m.HasLineNumbers = m.HasLineNumbers || f.Line != 0
		}
	}
	b.p.Location = append(b.p.Location, loc)
	b.locations[key] = loc
	return loc
}

// mapping returns the pprof mapping of the file mapping holding addr, or
// nil when none does (a process never captured).
func (b *pprofBuilder) mapping(maps []proc.Mapping, addr uint64) *profile.Mapping {
	for _, pm := range maps {
		if addr < pm.Start || addr >= pm.End {
			continue
		}
		if m := b.mappings[pm]; m != nil {
			return m
		}
		m := &profile.Mapping{ID: uint64(len(b.p.Mapping) + 1), Start: pm.Start, Limit: pm.End, Offset: pm.Offset,
			File: pm.Path, BuildID: pm.BuildID}
		b.p.Mapping = append(b.p.Mapping, m)
		b.mappings[pm] = m
		return m
	}
	return nil
}

// function returns the pprof function of name in file. A Python frame's
// SystemName is its file:name, not its name: pprof demangles (and, by
// default, simplifies, dropping what stands between < and >) the names
// of functions whose SystemName is their Name, and <module>, <listcomp>
// and <lambda> came out as <unknown>.
func (b *pprofBuilder) function(name, file string, python bool) *profile.Function {
	key := [2]string{name, file}
	if fn := b.functions[key]; fn != nil {
		return fn
	}
	sys := name
	if python {
		sys = file + ":" + name
	}
	fn := &profile.Function{ID: uint64(len(b.p.Function) + 1), Name: name, SystemName: sys, Filename: file}
	b.p.Function = append(b.p.Function, fn)
	b.functions[key] = fn
	return fn
}
