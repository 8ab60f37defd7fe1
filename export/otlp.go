package export

// otlp.go: the heap profiles (a trace's, the agent's live one) as
// OpenTelemetry profiles (OTLP's profiles signal, pdata's pprofile), for an
// OpenTelemetry Collector. They are built from the very pprof profile the
// pprof export writes (pprofBuilder), so the two carry the same samples,
// stacks and labels: the OTLP form only moves each label where OpenTelemetry
// expects it. One ResourceProfiles per process, its labels there under
// OpenTelemetry's resource conventions (process, container, k8s, host, and
// cudatrace's job and rank); one profile per sample type the process has
// values of (OTLP's profiles carry one sample type each: inuse_space,
// alloc_space, ...), each sample with the labels that differ between its
// samples (api, kind, level, device, owner, and the device's GPU UUID).

import (
	"fmt"
	"io"
	"sort"
	"strconv"

	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
)

// OTLPResourceAttrs maps the pprof export's per-process labels to the
// OpenTelemetry resource attributes an OTLP profile carries them as
// (docs/otlp.md has the table). A label missing here is a sample's.
var OTLPResourceAttrs = map[string]string{
	"comm":         "process.executable.name",
	"container_id": "container.id",
	"pod_uid":      "k8s.pod.uid",
	"namespace":    "k8s.namespace.name",
	"pod":          "k8s.pod.name",
	"container":    "k8s.container.name",
	"job_id":       "cudatrace.job.id",
	"rank":         "cudatrace.job.rank",
	"node":         "host.name", // a merged trace's node
}

// OTLPGPUAttr is the sample attribute naming the GPU (its UUID, where the
// driver's view gives one): OpenTelemetry's hardware conventions' hw.id.
const OTLPGPUAttr = "hw.id"

// OTLPScope is the instrumentation scope of cudatrace's profiles.
const OTLPScope = "cudatrace"

// OTLPOptions say what an OTLP profile carries beside the pprof profile.
type OTLPOptions struct {
	// Resource attributes of every process (host.name, k8s.node.name,
	// service.name, ...); a process's own win.
	Resource map[string]string
	// Process adds attributes to one process's resource (its command
	// line); nil: none.
	Process func(pid uint32, attrs pcommon.Map)
	// GPU names a device (its label, "0") by UUID; nil or "": no hw.id.
	GPU     func(device string) string
	Version string // the scope's version
}

// OTLPFromPprof converts p, a profile the pprof export built (its samples
// labelled by pid), into OTLP profiles: one resource per process.
func OTLPFromPprof(p *profile.Profile, opts OTLPOptions) (pprofile.Profiles, error) {
	c := newOTLPConv(p, opts)
	if err := c.run(); err != nil {
		return pprofile.Profiles{}, err
	}
	return c.out, nil
}

// otlpConv fills one Profiles' dictionary once per string, function,
// mapping, location, stack and attribute.
type otlpConv struct {
	p      *profile.Profile
	opts   OTLPOptions
	out    pprofile.Profiles
	dict   pprofile.ProfilesDictionary
	strs   map[string]int32
	funcs  map[uint64]int32 // pprof function ID
	maps   map[uint64]int32 // pprof mapping ID
	locs   map[uint64]int32 // pprof location ID
	stacks map[string]int32 // location indices, as bytes
	attrs  map[[2]string]int32
}

func newOTLPConv(p *profile.Profile, opts OTLPOptions) *otlpConv {
	c := &otlpConv{p: p, opts: opts, out: pprofile.NewProfiles(), strs: map[string]int32{}, funcs: map[uint64]int32{},
		maps: map[uint64]int32{}, locs: map[uint64]int32{}, stacks: map[string]int32{}, attrs: map[[2]string]int32{}}
	c.dict = c.out.Dictionary()
	// Index 0 of every table is the empty entry (OTLP's profiles: "no
	// mapping", "no function", ...).
	c.str("")
	c.dict.MappingTable().AppendEmpty()
	c.dict.LocationTable().AppendEmpty()
	c.dict.FunctionTable().AppendEmpty()
	c.dict.StackTable().AppendEmpty()
	c.dict.AttributeTable().AppendEmpty()
	c.dict.LinkTable().AppendEmpty()
	return c
}

func (c *otlpConv) str(s string) int32 {
	if i, ok := c.strs[s]; ok {
		return i
	}
	t := c.dict.StringTable()
	i := int32(t.Len())
	t.Append(s)
	c.strs[s] = i
	return i
}

func (c *otlpConv) attr(k, v string) int32 {
	key := [2]string{k, v}
	if i, ok := c.attrs[key]; ok {
		return i
	}
	t := c.dict.AttributeTable()
	i := int32(t.Len())
	a := t.AppendEmpty()
	a.SetKeyStrindex(c.str(k))
	a.Value().SetStr(v)
	c.attrs[key] = i
	return i
}

func (c *otlpConv) function(f *profile.Function) int32 {
	if i, ok := c.funcs[f.ID]; ok {
		return i
	}
	t := c.dict.FunctionTable()
	i := int32(t.Len())
	fn := t.AppendEmpty()
	fn.SetNameStrindex(c.str(f.Name))
	fn.SetSystemNameStrindex(c.str(f.SystemName))
	fn.SetFilenameStrindex(c.str(f.Filename))
	fn.SetStartLine(f.StartLine)
	c.funcs[f.ID] = i
	return i
}

func (c *otlpConv) mapping(m *profile.Mapping) int32 {
	if m == nil {
		return 0
	}
	if i, ok := c.maps[m.ID]; ok {
		return i
	}
	t := c.dict.MappingTable()
	i := int32(t.Len())
	om := t.AppendEmpty()
	om.SetMemoryStart(m.Start)
	om.SetMemoryLimit(m.Limit)
	om.SetFileOffset(m.Offset)
	om.SetFilenameStrindex(c.str(m.File))
	if m.BuildID != "" {
		// The OpenTelemetry eBPF profiler's attribute for an ELF file's
		// GNU build ID.
		om.AttributeIndices().Append(c.attr("process.executable.build_id.gnu", m.BuildID))
	}
	c.maps[m.ID] = i
	return i
}

func (c *otlpConv) location(l *profile.Location) int32 {
	if i, ok := c.locs[l.ID]; ok {
		return i
	}
	mi := c.mapping(l.Mapping)
	t := c.dict.LocationTable()
	i := int32(t.Len())
	ol := t.AppendEmpty()
	ol.SetMappingIndex(mi)
	ol.SetAddress(l.Address)
	for _, ln := range l.Line {
		fi := c.function(ln.Function)
		// The dictionary is re-read: function() appended to another table.
		ol = c.dict.LocationTable().At(int(i))
		x := ol.Lines().AppendEmpty()
		x.SetFunctionIndex(fi)
		x.SetLine(ln.Line)
		x.SetColumn(ln.Column)
	}
	c.locs[l.ID] = i
	return i
}

func (c *otlpConv) stack(locs []*profile.Location) int32 {
	idx := make([]int32, len(locs))
	key := make([]byte, 0, 4*len(locs))
	for j, l := range locs {
		idx[j] = c.location(l)
		key = strconv.AppendInt(key, int64(idx[j]), 36)
		key = append(key, ',')
	}
	if i, ok := c.stacks[string(key)]; ok {
		return i
	}
	t := c.dict.StackTable()
	i := int32(t.Len())
	t.AppendEmpty().LocationIndices().FromRaw(idx)
	c.stacks[string(key)] = i
	return i
}

// otlpSampleLabels are the labels a sample keeps as its own attributes, in
// this order.
var otlpSampleLabels = []string{"api", "kind", "level", "device", "owner"}

func (c *otlpConv) run() error {
	byPID := map[int64][]*profile.Sample{}
	var pids []int64
	for _, s := range c.p.Sample {
		pid := int64(-1)
		if v := s.NumLabel["pid"]; len(v) == 1 {
			pid = v[0]
		}
		if _, ok := byPID[pid]; !ok {
			pids = append(pids, pid)
		}
		byPID[pid] = append(byPID[pid], s)
	}
	sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
	for _, pid := range pids {
		if err := c.process(pid, byPID[pid]); err != nil {
			return err
		}
	}
	return nil
}

func (c *otlpConv) process(pid int64, samples []*profile.Sample) error {
	rp := c.out.ResourceProfiles().AppendEmpty()
	res := rp.Resource().Attributes()
	for k, v := range c.opts.Resource {
		if v != "" {
			res.PutStr(k, v)
		}
	}
	if pid >= 0 {
		res.PutInt("process.pid", pid)
	}
	// A process's labels are the same on each of its samples.
	for label, vals := range samples[0].Label {
		name, ok := OTLPResourceAttrs[label]
		if !ok || len(vals) != 1 || vals[0] == "" {
			continue
		}
		if label == "rank" {
			if n, err := strconv.ParseInt(vals[0], 10, 64); err == nil {
				res.PutInt(name, n)
				continue
			}
		}
		res.PutStr(name, vals[0])
	}
	if c.opts.Process != nil && pid >= 0 {
		c.opts.Process(uint32(pid), res)
	}
	sp := rp.ScopeProfiles().AppendEmpty()
	sp.Scope().SetName(OTLPScope)
	sp.Scope().SetVersion(c.opts.Version)

	stacks := make([]int32, len(samples))
	attrs := make([][]int32, len(samples))
	for j, s := range samples {
		stacks[j] = c.stack(s.Location)
		for _, l := range otlpSampleLabels {
			if v := s.Label[l]; len(v) == 1 && v[0] != "" {
				attrs[j] = append(attrs[j], c.attr(l, v[0]))
			}
		}
		if c.opts.GPU != nil {
			if v := s.Label["device"]; len(v) == 1 {
				if u := c.opts.GPU(v[0]); u != "" {
					attrs[j] = append(attrs[j], c.attr(OTLPGPUAttr, u))
				}
			}
		}
	}
	for t, st := range c.p.SampleType {
		var prof pprofile.Profile
		made := false
		for j, s := range samples {
			if t >= len(s.Value) || s.Value[t] == 0 {
				continue
			}
			if !made {
				prof = sp.Profiles().AppendEmpty()
				prof.SampleType().SetTypeStrindex(c.str(st.Type))
				prof.SampleType().SetUnitStrindex(c.str(st.Unit))
				if pt := c.p.PeriodType; pt != nil {
					prof.PeriodType().SetTypeStrindex(c.str(pt.Type))
					prof.PeriodType().SetUnitStrindex(c.str(pt.Unit))
				}
				prof.SetPeriod(c.p.Period)
				prof.SetTime(pcommon.Timestamp(c.p.TimeNanos))
				prof.SetDurationNano(uint64(max(c.p.DurationNanos, 0)))
				prof.SetOriginalPayloadFormat("")
				made = true
			}
			os := prof.Samples().AppendEmpty()
			os.SetStackIndex(stacks[j])
			os.AttributeIndices().FromRaw(attrs[j])
			os.Values().Append(s.Value[t])
		}
	}
	return nil
}

// WriteOTLP writes the trace at path as an OTLP profiles export request,
// protobuf-encoded (what a Collector's OTLP receiver takes at
// /v1development/profiles): the same samples as WritePprof's.
func WriteOTLP(w io.Writer, path string, opts Options, oopts OTLPOptions) error {
	pd, err := TraceOTLP(path, opts, oopts)
	if err != nil {
		return err
	}
	b, err := pprofileotlp.NewExportRequestFromProfiles(pd).MarshalProto()
	if err != nil {
		return fmt.Errorf("otlp: encode: %w", err)
	}
	_, err = w.Write(b)
	return err
}

// TraceOTLP is the trace at path as OTLP profiles (WritePprof's profile).
func TraceOTLP(path string, opts Options, oopts OTLPOptions) (pprofile.Profiles, error) {
	p, err := tracePprof(path, opts)
	if err != nil {
		return pprofile.Profiles{}, err
	}
	return OTLPFromPprof(p, oopts)
}

// LiveOTLP is the live profile lp as OTLP profiles: what WriteLivePprof
// writes of it, converted.
func LiveOTLP(lp *LiveProfile, src Stacks, oopts OTLPOptions) (pprofile.Profiles, error) {
	return OTLPFromPprof(livePprof(lp, src), oopts)
}
