package httpapi

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cudatrace/cudatrace/agent"
	"github.com/cudatrace/cudatrace/events"
)

// collectTimeout bounds one scrape's wait for the agent's copy.
const collectTimeout = 10 * time.Second

// collector turns the agent's Stats into Prometheus metrics at each
// scrape. Names follow Prometheus practice (base units, _total on
// counters); device metrics carry `gpu` (the device index) and `UUID`,
// the DCGM exporter's label names, so the two join.
type collector struct {
	a             *agent.Agent
	version       string
	processLabels bool

	buildInfo, live, peak, hostLive, allocs, allocBytes, frees, failures, ooms                        *prometheus.Desc
	implicitFrees, implicitFreeBytes                                                                  *prometheus.Desc
	events, lost, dumps, dumpErrors, dumpsSkipped, processes, exited, dropped                         *prometheus.Desc
	stacks, nvmlUsed, nvmlTotal, nvmlProc, up                                                         *prometheus.Desc
	historyEvents, historyBytes                                                                       *prometheus.Desc
	ownerLive                                                                                         *prometheus.Desc // owner.go's label set: bounded by owner.Names()
	stackLive                                                                                         *prometheus.Desc
	mapEntries, mapCapacity, mapFull, exitsSwept                                                      *prometheus.Desc
	otlpSent, otlpSentSamples, otlpDropped, otlpDroppedSamples, otlpRejected, otlpFailures, otlpQueue *prometheus.Desc
}

// processLabelNames label a process's series: the cgroup's IDs, then the
// kubelet's names (package kube) spelled as DCGM exporter spells them,
// then its distributed job and rank (package jobid; not "job", which
// Prometheus gives every target). A process has one of each, so they add
// no series.
var processLabelNames = []string{"pid", "comm", "container_id", "pod_uid", "namespace", "pod", "container", "job_id", "rank"}

func newCollector(a *agent.Agent, version string, processLabels bool) *collector {
	var pl []string
	if processLabels {
		pl = processLabelNames
	}
	dev := append(append([]string{}, pl...), "gpu", "UUID", "level")
	lvl := append(append([]string{}, pl...), "level")
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("cudatrace_"+name, help, labels, nil)
	}
	return &collector{
		a: a, version: version, processLabels: processLabels,
		buildInfo: d("build_info", "cudatrace's version and Go version; always 1.", "version", "goversion"),
		live: d("live_bytes", "GPU memory live now (device and managed), per running traced process and device; "+
			"level=segment is what the CUDA runtime and driver handed out (PyTorch's memory_reserved is the pytorch owner's share), level=tensor the bytes PyTorch's tensors asked for (requested_bytes).", dev...),
		peak:     d("peak_bytes", "The highest live_bytes reached since the process was first seen (without process labels: the highest the node's sum reached since the agent started).", dev...),
		hostLive: d("host_live_bytes", "Pinned host memory (cudaMallocHost, cudaHostAlloc, cuMemAllocHost) live now.", pl...),
		allocs:   d("allocations_total", "Successful allocation calls.", lvl...),
		allocBytes: d("allocated_bytes_total", "Bytes of successful allocation calls (segments, pinned host memory included).",
			pl...),
		frees: d("frees_total", "Frees of allocations the tracer saw made.", lvl...),
		implicitFrees: d("implicit_frees_total", "Allocations the driver freed with their context (cuCtxDestroy, cuCtxDetach to 0, "+
			"a primary context's last release or reset, cudaDeviceReset); not in frees_total.", pl...),
		implicitFreeBytes: d("implicit_freed_bytes_total", "Bytes of the allocations implicit_frees_total counts.", pl...),
		failures:          d("allocation_failures_total", "Failed allocation calls, whatever the CUDA error.", pl...),
		ooms:              d("oom_total", "Allocation calls that failed with out of memory (cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY).", pl...),
		events:            d("events_total", "Events read from the BPF ring buffer."),
		lost:              d("lost_events_total", "Events lost before reaching the agent (ring buffer full, in-flight table full): raise --ring-size."),
		dumps:             d("oom_dumps_total", "OOM black boxes written to --dump-dir."),
		dumpErrors:        d("oom_dump_errors_total", "OOM black boxes that could not be written (see the agent's log)."),
		dumpsSkipped:      d("oom_dumps_skipped_total", "OOMs not dumped: the process was dumped less than --dump-every ago, or the writer was behind."),
		processes:         d("processes", "Traced processes running now."),
		exited:            d("processes_exited_total", "Traced processes that have exited."),
		dropped:           d("trace_dropped_events_total", "Events a /trace client was too slow to take."),
		stacks:            d("stacks", "Distinct allocation stacks held in memory."),
		nvmlUsed:          d("nvml_used_bytes", "GPU memory used, as the driver (NVML) reports it.", "gpu", "UUID"),
		nvmlTotal:         d("nvml_total_bytes", "GPU memory in all, as the driver (NVML) reports it.", "gpu", "UUID"),
		nvmlProc: d("nvml_process_used_bytes", "A process's GPU memory, as the driver (NVML) reports it.",
			append([]string{"gpu", "UUID"}, processLabelNames...)...),
		up:            d("nvml_up", "1 when the last read of the driver (NVML) succeeded."),
		historyEvents: d("history_events", "Events the flight recorder holds (every process's latest, for /snapshot and the OOM black box)."),
		historyBytes:  d("history_bytes", "Bytes the flight recorder's histories account for (at most --history-budget)."),
		mapEntries: d("bpf_map_entries", "Entries of a BPF map keyed by process, thread or file at the latest count (every 5 s): "+
			"bounded by what is alive, since a process's end removes its entries (map_full_total counts what a full one left out).", "map"),
		mapCapacity: d("bpf_map_capacity", "The most entries a BPF map keyed by process, thread or file holds.", "map"),
		mapFull: d("bpf_map_full_total", "Updates of a BPF map keyed by process that found it full of living processes' entries: "+
			"a child left untraced, a process's Python frames left out."),
		exitsSwept: d("process_exits_swept_total", "Process ends found by the periodic sweep (gone, or their PID another process's) "+
			"rather than by the kernel's exit record, and BPF map entries of processes gone that it removed."),
		otlpSent:        d("otlp_sent_total", "OTLP profile pushes the Collector took (--otlp-endpoint)."),
		otlpSentSamples: d("otlp_sent_samples_total", "Samples of the OTLP pushes the Collector took."),
		otlpDropped: d("otlp_dropped_total", "OTLP profile pushes given up on: the queue (--otlp-queue-size) was full while the Collector was "+
			"down or slow, the retries ran out, or the Collector refused them."),
		otlpDroppedSamples: d("otlp_dropped_samples_total", "Samples of the OTLP pushes otlp_dropped_total counts."),
		otlpRejected:       d("otlp_rejected_samples_total", "Samples the Collector said it rejected (OTLP partial success)."),
		otlpFailures:       d("otlp_failures_total", "OTLP push attempts that failed (each retried while it may be)."),
		otlpQueue:          d("otlp_queue_bytes", "Encoded OTLP pushes waiting to be sent (at most --otlp-queue-size)."),
		ownerLive: d("owner_live_bytes", "GPU memory live now (segments, as live_bytes{level=\"segment\"}) by owner: the component whose frame is innermost "+
			"in the allocating stack (pytorch, nccl, cublas, cudnn, xla, cupy, numba, tensorflow, tensorrt, else application); per running traced process (summed per GPU with --process-labels=false).",
			append(append(append([]string{}, pl...), "gpu", "UUID"), "owner")...),
		stackLive: d("stack_live_bytes", fmt.Sprintf("GPU memory (segments) live now per allocation stack, for each running process's %d stacks holding the most; "+
			"stack is the innermost %d frames, innermost first.", agent.TopStacks, agent.StackFrames), append(append([]string{}, dev[:len(dev)-1]...), "stack")...),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.buildInfo, c.live, c.peak, c.hostLive, c.allocs, c.allocBytes, c.frees,
		c.implicitFrees, c.implicitFreeBytes, c.failures, c.ooms, c.events, c.lost, c.dumps, c.dumpErrors, c.dumpsSkipped, c.processes, c.exited, c.dropped,
		c.stacks, c.nvmlUsed, c.nvmlTotal, c.nvmlProc, c.up, c.historyEvents, c.historyBytes, c.ownerLive, c.stackLive,
		c.mapEntries, c.mapCapacity, c.mapFull, c.exitsSwept, c.otlpSent, c.otlpSentSamples, c.otlpDropped, c.otlpDroppedSamples,
		c.otlpRejected, c.otlpFailures, c.otlpQueue} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	ch <- prometheus.MustNewConstMetric(c.buildInfo, prometheus.GaugeValue, 1, c.version, runtime.Version())
	s, err := c.a.Stats(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.events, err)
		return
	}
	// The driver's view, when the agent has one. Its devices are NVML's
	// indexes; the probes' are CUDA ordinals, the same unless a process
	// reorders its devices (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER).
	uuid := map[int32]string{}
	if s.NVML != nil || s.NVMLError != "" {
		up := 0.0
		if s.NVML != nil && s.NVMLError == "" {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
	}
	if s.NVML != nil {
		for _, d := range s.NVML.Devices {
			uuid[int32(d.Index)] = d.UUID
		}
	}
	gauge := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	var running int
	procLabels := map[uint32][]string{}
	for i := range s.Processes {
		p := &s.Processes[i]
		if p.Exited {
			continue
		}
		running++
		pl := []string{strconv.FormatUint(uint64(p.PID), 10), p.Comm, p.Container, p.PodUID, p.Namespace, p.Pod, p.ContainerName,
			p.Job, rankLabel(p.Rank)}
		procLabels[p.PID] = pl
		if !c.processLabels {
			continue
		}
		for _, d := range p.Devices {
			gpu := []string{events.DeviceName(d.Device), uuid[d.Device]}
			gauge(c.live, d.Live, with(pl, gpu, "segment")...)
			gauge(c.peak, d.Peak, with(pl, gpu, "segment")...)
			if p.TensorAllocs > 0 {
				gauge(c.live, d.TensorLive, with(pl, gpu, "tensor")...)
				gauge(c.peak, d.TensorPeak, with(pl, gpu, "tensor")...)
			}
		}
		gauge(c.hostLive, p.HostLive, pl...)
		for _, o := range p.Owners {
			gauge(c.ownerLive, o.Live, with(pl, []string{events.DeviceName(o.Device), uuid[o.Device]}, o.Owner)...)
		}
		counter(c.allocs, p.Allocs, with(pl, nil, "segment")...)
		counter(c.frees, p.Frees, with(pl, nil, "segment")...)
		if p.TensorAllocs > 0 {
			counter(c.allocs, p.TensorAllocs, with(pl, nil, "tensor")...)
			counter(c.frees, p.TensorFrees, with(pl, nil, "tensor")...)
		}
		counter(c.allocBytes, p.AllocBytes, pl...)
		counter(c.implicitFrees, p.ImplicitFrees, pl...)
		counter(c.implicitFreeBytes, p.ImplicitFreeBytes, pl...)
		counter(c.failures, p.Failed, pl...)
		counter(c.ooms, p.OOMs, pl...)
	}
	if c.processLabels { // a series per process and stack: the flag turns them off
		for _, st := range s.TopStacks {
			if pl := procLabels[st.PID]; pl != nil {
				gauge(c.stackLive, st.Live, with(pl, []string{events.DeviceName(st.Device), uuid[st.Device]}, st.Stack)...)
			}
		}
	}
	if !c.processLabels {
		c.ownersOfNode(s, uuid, gauge)
		var host uint64
		for i := range s.Processes {
			if !s.Processes[i].Exited {
				host += s.Processes[i].HostLive
			}
		}
		for _, n := range s.Node {
			level := "segment"
			if n.Tensor {
				level = "tensor"
			}
			gpu := []string{events.DeviceName(n.Device), uuid[n.Device], level}
			gauge(c.live, n.Live, gpu...)
			gauge(c.peak, n.Peak, gpu...)
		}
		t := &s.Totals
		gauge(c.hostLive, host)
		counter(c.allocs, t.Allocs, "segment")
		counter(c.frees, t.Frees, "segment")
		if t.TensorAllocs > 0 {
			counter(c.allocs, t.TensorAllocs, "tensor")
			counter(c.frees, t.TensorFrees, "tensor")
		}
		counter(c.allocBytes, t.AllocBytes)
		counter(c.implicitFrees, t.ImplicitFrees)
		counter(c.implicitFreeBytes, t.ImplicitFreeBytes)
		counter(c.failures, t.Failed)
		counter(c.ooms, t.OOMs)
	}
	counter(c.events, s.Events)
	counter(c.lost, s.Lost)
	counter(c.dumps, s.Totals.Dumps)
	counter(c.dumpErrors, s.Totals.DumpErrors)
	counter(c.dumpsSkipped, s.Totals.DumpsSkipped)
	gauge(c.processes, uint64(running))
	counter(c.exited, s.Totals.ProcessesExited)
	counter(c.dropped, s.Totals.TraceDropped)
	gauge(c.stacks, uint64(s.Stacks))
	gauge(c.historyEvents, uint64(s.HistoryEvents))
	gauge(c.historyBytes, uint64(s.HistoryBytes))
	for _, m := range s.Maps {
		gauge(c.mapEntries, uint64(m.Entries), m.Name)
		gauge(c.mapCapacity, uint64(m.Capacity), m.Name)
	}
	counter(c.mapFull, s.Counters["map_full"]+s.MapsFull)
	counter(c.exitsSwept, s.ExitsSwept)
	if o := s.OTLP; o != nil {
		counter(c.otlpSent, o.Sent)
		counter(c.otlpSentSamples, o.SentSamples)
		counter(c.otlpDropped, o.Dropped)
		counter(c.otlpDroppedSamples, o.DroppedSamples)
		counter(c.otlpRejected, o.Rejected)
		counter(c.otlpFailures, o.Failures)
		gauge(c.otlpQueue, uint64(o.QueueBytes))
	}
	if s.NVML != nil {
		for _, d := range s.NVML.Devices {
			gpu := []string{strconv.Itoa(d.Index), d.UUID}
			gauge(c.nvmlUsed, d.Used, gpu...)
			gauge(c.nvmlTotal, d.Total, gpu...)
		}
		if c.processLabels { // a series per process is what the flag turns off
			for _, p := range s.NVML.Processes {
				pl := procLabels[p.PID]
				if pl == nil { // a process that made no traced call
					pl = make([]string, len(processLabelNames))
					pl[0] = strconv.FormatUint(uint64(p.PID), 10)
				}
				gauge(c.nvmlProc, p.Used, with([]string{strconv.Itoa(p.Device), p.UUID}, pl[:1], pl[1:]...)...)
			}
		}
	}
}

// ownersOfNode is owner_live_bytes without process labels: the running
// processes' summed per device and owner.
func (c *collector) ownersOfNode(s *agent.Stats, uuid map[int32]string, gauge func(*prometheus.Desc, uint64, ...string)) {
	type key struct {
		dev   int32
		owner string
	}
	sum := map[key]uint64{}
	var keys []key
	for i := range s.Processes {
		if s.Processes[i].Exited {
			continue
		}
		for _, o := range s.Processes[i].Owners {
			k := key{o.Device, o.Owner}
			if _, ok := sum[k]; !ok {
				keys = append(keys, k)
			}
			sum[k] += o.Live
		}
	}
	for _, k := range keys {
		gauge(c.ownerLive, sum[k], events.DeviceName(k.dev), uuid[k.dev], k.owner)
	}
}

// with joins label values.
func with(a, b []string, rest ...string) []string {
	out := make([]string, 0, len(a)+len(b)+len(rest))
	return append(append(append(out, a...), b...), rest...)
}

// rankLabel is a rank as a label: "" where there is none.
func rankLabel(r int) string {
	if r < 0 {
		return ""
	}
	return strconv.Itoa(r)
}
