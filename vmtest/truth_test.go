package vmtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// The stand-in's ground truth. Every call appends one line to FAKECUDA_LOG:
//
//	<api> pid=<pid> tid=<tid> ret=<int> ptr=0x<hex> size=<bytes> dev=<dev> kind=<kind> req=<bytes>
//
// (see testdata/fakecudart.c for what each field holds). A marker line from
// fakecuda_log_marker has the marker's name in place of <api>. The order of
// the lines is the order in which the calls took effect.

// logCall is one line of the log.
type logCall struct {
	Line int // 1-based, in the file
	API  string
	PID  int
	TID  int
	Ret  int
	Ptr  uint64
	Size uint64
	Dev  int
	Kind string
	Req  uint64
}

type apiClass int

const (
	classOther apiClass = iota
	classAlloc
	classFree
)

// What the report's "kind" of memory each allocating API makes; written
// here apart from the tracer's own table, on purpose.
var allocKinds = map[string]string{
	"cudaMalloc":              "device",
	"cudaMallocAsync":         "device",
	"cudaMallocFromPoolAsync": "device",
	"cudaMallocPitch":         "device",
	"cudaMalloc3D":            "device",
	"cudaMallocManaged":       "managed",
	"cudaMallocHost":          "host",
	"cudaHostAlloc":           "host",
	"cuMemAlloc_v2":           "device",
	"cuMemAllocPitch_v2":      "device",
	"cuMemAllocManaged":       "managed",
	"cuMemAllocHost_v2":       "host",
	"cuMemHostAlloc":          "host",
	"cuMemAllocAsync":         "device",
	"cuMemAllocFromPoolAsync": "device",
	"cuMemCreate":             "device",
}

var freeAPIs = map[string]bool{"cudaFree": true, "cudaFreeAsync": true, "cudaFreeHost": true,
	"cuMemFree_v2": true, "cuMemFreeAsync": true, "cuMemFreeHost": true, "cuMemRelease": true}

// directSizeAPIs take the allocation's size as an argument, so a tracer
// knows the size asked for even when the call fails.
var directSizeAPIs = map[string]bool{
	"cudaMalloc": true, "cudaMallocAsync": true, "cudaMallocFromPoolAsync": true,
	"cudaMallocManaged": true, "cudaMallocHost": true, "cudaHostAlloc": true,
	"cuMemAlloc_v2": true, "cuMemAllocManaged": true, "cuMemAllocHost_v2": true, "cuMemHostAlloc": true,
	"cuMemAllocAsync": true, "cuMemAllocFromPoolAsync": true, "cuMemCreate": true,
}

// cudaErrorNames names the codes the tests meet, written apart from the
// tracer's table on purpose.
var cudaErrorNames = map[int]string{
	0:   "cudaSuccess",
	1:   "cudaErrorInvalidValue",
	2:   "cudaErrorMemoryAllocation",
	3:   "cudaErrorInitializationError",
	35:  "cudaErrorInsufficientDriver",
	100: "cudaErrorNoDevice",
	101: "cudaErrorInvalidDevice",
}

// cuErrorNames are the driver's names for the codes the tests meet.
var cuErrorNames = map[int]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	101: "CUDA_ERROR_INVALID_DEVICE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
}

// errorName is the name a report should give code returned by api.
func errorName(api string, code int) (string, bool) {
	if strings.HasPrefix(api, "cu") && !strings.HasPrefix(api, "cuda") {
		n, ok := cuErrorNames[code]
		return n, ok
	}
	n, ok := cudaErrorNames[code]
	return n, ok
}

func classOf(api string) apiClass {
	if _, ok := allocKinds[api]; ok {
		return classAlloc
	}
	if freeAPIs[api] {
		return classFree
	}
	return classOther
}

// parseLogFile reads a FAKECUDA_LOG.
func parseLogFile(path string) ([]logCall, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseLog(f)
}

func parseLog(r io.Reader) ([]logCall, error) {
	var calls []logCall
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		text := sc.Text()
		if strings.TrimSpace(text) == "" {
			continue
		}
		c, err := parseLine(text)
		if err != nil {
			return nil, fmt.Errorf("line %d %q: %v", n, text, err)
		}
		c.Line = n
		calls = append(calls, c)
	}
	return calls, sc.Err()
}

func parseLine(text string) (logCall, error) {
	var c logCall
	fields := strings.Fields(text)
	if len(fields) < 2 {
		return c, fmt.Errorf("too few fields")
	}
	c.API = fields[0]
	seen := map[string]bool{}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return c, fmt.Errorf("field %q is not key=value", f)
		}
		seen[k] = true
		var err error
		switch k {
		case "pid":
			c.PID, err = strconv.Atoi(v)
		case "tid":
			c.TID, err = strconv.Atoi(v)
		case "ret":
			c.Ret, err = strconv.Atoi(v)
		case "ptr":
			h, ok := strings.CutPrefix(v, "0x")
			if !ok {
				return c, fmt.Errorf("ptr %q lacks 0x", v)
			}
			c.Ptr, err = strconv.ParseUint(h, 16, 64)
		case "size":
			c.Size, err = strconv.ParseUint(v, 10, 64)
		case "dev":
			c.Dev, err = strconv.Atoi(v)
		case "kind":
			c.Kind = v
		case "req":
			c.Req, err = strconv.ParseUint(v, 10, 64)
		}
		if err != nil {
			return c, fmt.Errorf("field %s: %v", k, err)
		}
	}
	for _, k := range []string{"pid", "tid", "ret", "ptr", "size", "dev", "kind"} {
		if !seen[k] {
			return c, fmt.Errorf("no %s=", k)
		}
	}
	return c, nil
}

// devTruth is one device's GPU memory in one process.
type devTruth struct {
	Live, Peak                       uint64
	ImplicitFrees, ImplicitFreeBytes uint64 // GPU memory freed with its context
}

// liveAlloc is an allocation live in the ground truth.
type liveAlloc struct {
	Size uint64
	Dev  int
	Kind string
	API  string

	mapped   int  // VMM: live mappings of it
	released bool // VMM: released while mapped
}

// vmmMapping is a live cuMemMap in the ground truth.
type vmmMapping struct {
	Size  uint64
	Alloc *liveAlloc // the cuMemCreate mapped
}

// procTruth is what a report must say about one process.
type procTruth struct {
	PID        int
	Allocs     uint64 // successful allocation calls, any kind
	Frees      uint64 // successful frees of allocations seen (counted)
	Failed     uint64 // failed allocation calls
	AllocBytes uint64
	Live, Peak uint64 // GPU memory: every kind but pinned host
	HostLive   uint64
	HostPeak   uint64
	Devices    map[int]*devTruth // devices that ever held GPU memory
	Failures   []logCall         // the failed allocation calls, in order
	MaxAlloc   uint64            // the largest successful GPU allocation
	// MaxStep is, per thread, the most GPU memory one of its calls
	// changed: an allocation, or a cuMemUnmap freeing several released
	// handles at once.
	MaxStep map[int]uint64
	// Allocations freed with their context (implicit_free lines), host
	// memory included, and their bytes; not in Frees.
	ImplicitFrees, ImplicitFreeBytes uint64
	FreedBytes                       uint64         // bytes released by counted frees
	UnknownFrees                     uint64         // successful frees of allocations not seen (before the marker)
	FailedFrees                      uint64         // frees that returned an error
	NullFrees                        uint64         // cudaFree(NULL) and friends
	Threads                          map[int]bool   // tids that made counted calls
	APICalls                         map[string]int // counted calls per API, failed ones included
	// VMM virtual ranges: bytes mapped (now and at most), successful maps,
	// mappings removed, bytes of address space reserved.
	Mapped, MappedPeak, Maps, Unmaps, Reserved uint64
	live                                       map[uint64]*liveAlloc
	mappings                                   map[uint64]vmmMapping
	reserves                                   map[uint64]uint64
}

// LiveCount is the number of allocations live at the end.
func (p *procTruth) LiveCount() int { return len(p.live) }

// DeviceList returns the device ordinals by number.
func (p *procTruth) DeviceList() []int {
	var ds []int
	for d := range p.Devices {
		ds = append(ds, d)
	}
	sort.Ints(ds)
	return ds
}

// failureKey identifies a failed call for comparison with a report: the API,
// the error, the device, and the size where a tracer can know it.
func failureKey(api string, result int, device int, size uint64) string {
	if directSizeAPIs[api] {
		return fmt.Sprintf("%s ret=%d dev=%d size=%d", api, result, device, size)
	}
	return fmt.Sprintf("%s ret=%d dev=%d", api, result, device)
}

// FailureKeys counts the failures by failureKey.
func (p *procTruth) FailureKeys() map[string]int {
	m := map[string]int{}
	for _, f := range p.Failures {
		m[failureKey(f.API, f.Ret, f.Dev, f.Req)]++
	}
	return m
}

// groundTruth computes, per pid, what a report must say. With a marker,
// only each process's calls after its marker line count (a process without
// the marker counts nothing): what was allocated before is unknown, and a
// later free of it is not a free of a known allocation. It returns an error
// where the log contradicts itself (the stand-in misbehaved).
func groundTruth(calls []logCall, marker string) (map[int]*procTruth, error) {
	procs := map[int]*procTruth{}
	started := map[int]bool{}
	get := func(pid int) *procTruth {
		p := procs[pid]
		if p == nil {
			p = &procTruth{PID: pid, Devices: map[int]*devTruth{}, Threads: map[int]bool{}, MaxStep: map[int]uint64{},
				APICalls: map[string]int{}, live: map[uint64]*liveAlloc{}, mappings: map[uint64]vmmMapping{},
				reserves: map[uint64]uint64{}}
			procs[pid] = p
		}
		return p
	}
	for _, c := range calls {
		if marker != "" && !started[c.PID] {
			if c.API == marker {
				started[c.PID] = true
			}
			continue
		}
		if c.API == marker {
			continue
		}
		p := get(c.PID)
		p.APICalls[c.API]++
		p.Threads[c.TID] = true
		if c.API == "implicit_free" {
			if err := p.implicitFree(c); err != nil {
				return nil, err
			}
			continue
		}
		if vmmRanges[c.API] {
			if err := p.vmmRange(c); err != nil {
				return nil, err
			}
			continue
		}
		switch classOf(c.API) {
		case classAlloc:
			kind := allocKinds[c.API]
			if c.Kind != kind {
				return nil, fmt.Errorf("line %d: %s logged kind=%s, want %s", c.Line, c.API, c.Kind, kind)
			}
			if c.Ret != 0 {
				if c.Ptr != 0 || c.Size != 0 {
					return nil, fmt.Errorf("line %d: failed %s logged ptr=%#x size=%d", c.Line, c.API, c.Ptr, c.Size)
				}
				p.Failed++
				p.Failures = append(p.Failures, c)
				continue
			}
			if c.Ptr == 0 || c.Size == 0 {
				return nil, fmt.Errorf("line %d: successful %s logged ptr=%#x size=%d", c.Line, c.API, c.Ptr, c.Size)
			}
			if old := p.live[c.Ptr]; old != nil {
				return nil, fmt.Errorf("line %d: %s returned %#x, still live (%s of %d bytes)", c.Line, c.API, c.Ptr, old.API, old.Size)
			}
			p.live[c.Ptr] = &liveAlloc{Size: c.Size, Dev: c.Dev, Kind: kind, API: c.API}
			p.Allocs++
			p.AllocBytes += c.Size
			if kind == "host" {
				p.HostLive += c.Size
				p.HostPeak = max(p.HostPeak, p.HostLive)
				continue
			}
			p.MaxAlloc = max(p.MaxAlloc, c.Size)
			p.MaxStep[c.TID] = max(p.MaxStep[c.TID], c.Size)
			p.Live += c.Size
			p.Peak = max(p.Peak, p.Live)
			d := p.Devices[c.Dev]
			if d == nil {
				d = &devTruth{}
				p.Devices[c.Dev] = d
			}
			d.Live += c.Size
			d.Peak = max(d.Peak, d.Live)
		case classFree:
			switch {
			case c.Ptr == 0:
				p.NullFrees++
				continue
			case c.Ret != 0:
				p.FailedFrees++
				continue
			}
			a := p.live[c.Ptr]
			if a != nil && a.mapped > 0 && c.API == "cuMemRelease" {
				if c.Size != 0 {
					return nil, fmt.Errorf("line %d: cuMemRelease of mapped %#x freed %d bytes", c.Line, c.Ptr, c.Size)
				}
				// Held until its last mapping goes; the handle may be reused.
				a.released = true
				delete(p.live, c.Ptr)
				p.Frees++
				continue
			}
			if a == nil {
				if marker == "" {
					return nil, fmt.Errorf("line %d: %s of %#x succeeded but it was never allocated", c.Line, c.API, c.Ptr)
				}
				p.UnknownFrees++
				continue
			}
			if a.Size != c.Size || a.Dev != c.Dev || a.Kind != c.Kind {
				return nil, fmt.Errorf("line %d: %s of %#x logged size=%d dev=%d kind=%s, allocated as %d bytes on %d (%s)",
					c.Line, c.API, c.Ptr, c.Size, c.Dev, c.Kind, a.Size, a.Dev, a.Kind)
			}
			if (a.Kind == "host") != (c.API == "cudaFreeHost" || c.API == "cuMemFreeHost") {
				return nil, fmt.Errorf("line %d: %s freed %s memory", c.Line, c.API, a.Kind)
			}
			delete(p.live, c.Ptr)
			p.Frees++
			p.FreedBytes += a.Size
			if a.Kind == "host" {
				p.HostLive -= a.Size
				continue
			}
			p.Live -= a.Size
			p.Devices[a.Dev].Live -= a.Size
		}
	}
	return procs, nil
}

// implicitFree applies the stand-in's implicit_free line: an allocation
// freed because its context died (req= is the context).
func (p *procTruth) implicitFree(c logCall) error {
	a := p.live[c.Ptr]
	if a == nil {
		return fmt.Errorf("line %d: implicit_free of %#x, which is not live", c.Line, c.Ptr)
	}
	if a.Size != c.Size || a.Dev != c.Dev || a.Kind != c.Kind {
		return fmt.Errorf("line %d: implicit_free of %#x logged size=%d dev=%d kind=%s, allocated as %d bytes on %d (%s)",
			c.Line, c.Ptr, c.Size, c.Dev, c.Kind, a.Size, a.Dev, a.Kind)
	}
	delete(p.live, c.Ptr)
	p.ImplicitFrees++
	p.ImplicitFreeBytes += a.Size
	if a.Kind == "host" {
		p.HostLive -= a.Size
		return nil
	}
	p.Live -= a.Size
	d := p.Devices[a.Dev]
	d.Live -= a.Size
	d.ImplicitFrees++
	d.ImplicitFreeBytes += a.Size
	return nil
}

// vmmRanges are the VMM calls on virtual ranges, which hold no memory.
var vmmRanges = map[string]bool{"cuMemMap": true, "cuMemUnmap": true, "cuMemAddressReserve": true,
	"cuMemAddressFree": true}

// vmmRange applies a VMM range call: a mapping holds its handle's physical
// memory past cuMemRelease, until the cuMemUnmap that removes the last one.
func (p *procTruth) vmmRange(c logCall) error {
	if c.Ret != 0 {
		return nil
	}
	switch c.API {
	case "cuMemAddressReserve":
		p.reserves[c.Ptr] = c.Size
		p.Reserved += c.Size
	case "cuMemAddressFree":
		if p.reserves[c.Ptr] != c.Size {
			return fmt.Errorf("line %d: cuMemAddressFree of %#x, %d bytes: reserved %d", c.Line, c.Ptr, c.Size, p.reserves[c.Ptr])
		}
		delete(p.reserves, c.Ptr)
		p.Reserved -= c.Size
	case "cuMemMap":
		a := p.live[c.Req]
		if a == nil || a.API != "cuMemCreate" || a.Dev != c.Dev {
			return fmt.Errorf("line %d: cuMemMap of handle %#x on device %d: not a live cuMemCreate there", c.Line, c.Req, c.Dev)
		}
		a.mapped++
		p.mappings[c.Ptr] = vmmMapping{Size: c.Size, Alloc: a}
		p.Maps++
		p.Mapped += c.Size
		p.MappedPeak = max(p.MappedPeak, p.Mapped)
	case "cuMemUnmap":
		var freed uint64
		for va, m := range p.mappings {
			if va < c.Ptr || va-c.Ptr >= c.Req {
				continue
			}
			a := m.Alloc
			delete(p.mappings, va)
			p.Unmaps++
			p.Mapped -= m.Size
			if a.mapped--; a.mapped == 0 && a.released { // its free counted at cuMemRelease
				freed += a.Size
				p.FreedBytes += a.Size
				p.Live -= a.Size
				p.Devices[a.Dev].Live -= a.Size
			}
		}
		if freed != c.Size {
			return fmt.Errorf("line %d: cuMemUnmap freed %d bytes, the log says %d", c.Line, freed, c.Size)
		}
		p.MaxStep[c.TID] = max(p.MaxStep[c.TID], freed)
	}
	return nil
}

// groundTruthFile parses a log and computes its ground truth.
func groundTruthFile(path, marker string) (map[int]*procTruth, error) {
	calls, err := parseLogFile(path)
	if err != nil {
		return nil, err
	}
	return groundTruth(calls, marker)
}

// String summarizes a process's truth for logs.
func (p *procTruth) String() string {
	var devs []string
	for _, d := range p.DeviceList() {
		devs = append(devs, fmt.Sprintf("%d:live=%d,peak=%d", d, p.Devices[d].Live, p.Devices[d].Peak))
	}
	return fmt.Sprintf("pid=%d allocs=%d frees=%d failed=%d alloc_bytes=%d live=%d peak=%d host_live=%d devices=[%s] max_alloc=%d threads=%d",
		p.PID, p.Allocs, p.Frees, p.Failed, p.AllocBytes, p.Live, p.Peak, p.HostLive, strings.Join(devs, " "), p.MaxAlloc, len(p.Threads))
}
