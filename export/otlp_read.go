package export

import (
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/pprofile"
)

// OTLPProcess is what OTLP profiles say of one process, for tests and
// checks: its resource, its totals per sample type, and its samples.
type OTLPProcess struct {
	Resource map[string]string
	Values   map[string]int64        // sample type -> sum of its samples
	Stacks   map[string][]OTLPSample // sample type -> samples
}

// OTLPSample is one sample read back: its frames, innermost first, each
// "function[:line]" (or 0xADDR), joined by ';'.
type OTLPSample struct {
	Frames string
	Attrs  map[string]string
	Value  int64
}

// OTLPTotals reads pd back by process (process.pid; -1 without one),
// adding up what several pushes hold.
func OTLPTotals(pd pprofile.Profiles, into ...map[int64]*OTLPProcess) map[int64]*OTLPProcess {
	out := map[int64]*OTLPProcess{}
	if len(into) > 0 {
		out = into[0]
	}
	d := pd.Dictionary()
	str := func(i int32) string {
		if int(i) < d.StringTable().Len() {
			return d.StringTable().At(int(i))
		}
		return ""
	}
	for _, rp := range pd.ResourceProfiles().All() {
		res := map[string]string{}
		for k, v := range rp.Resource().Attributes().All() {
			res[k] = v.AsString()
		}
		pid := int64(-1)
		if v, ok := rp.Resource().Attributes().Get("process.pid"); ok {
			pid = v.Int()
		}
		op := out[pid]
		if op == nil {
			op = &OTLPProcess{Values: map[string]int64{}, Stacks: map[string][]OTLPSample{}}
			out[pid] = op
		}
		op.Resource = res
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				typ := str(p.SampleType().TypeStrindex())
				for _, s := range p.Samples().All() {
					var v int64
					for _, x := range s.Values().All() {
						v += x
					}
					op.Values[typ] += v
					var frames []string
					st := d.StackTable().At(int(s.StackIndex()))
					for _, li := range st.LocationIndices().All() {
						loc := d.LocationTable().At(int(li))
						if loc.Lines().Len() == 0 {
							frames = append(frames, "0x"+strconv.FormatUint(loc.Address(), 16))
							continue
						}
						for _, ln := range loc.Lines().All() {
							f := str(d.FunctionTable().At(int(ln.FunctionIndex())).NameStrindex())
							if ln.Line() != 0 {
								f += ":" + strconv.FormatInt(ln.Line(), 10)
							}
							frames = append(frames, f)
						}
					}
					attrs := map[string]string{}
					for _, ai := range s.AttributeIndices().All() {
						a := d.AttributeTable().At(int(ai))
						attrs[str(a.KeyStrindex())] = a.Value().AsString()
					}
					op.Stacks[typ] = append(op.Stacks[typ], OTLPSample{Frames: strings.Join(frames, ";"), Attrs: attrs, Value: v})
				}
			}
		}
	}
	return out
}
