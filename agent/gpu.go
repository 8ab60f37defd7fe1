package agent

import "context"

// GPUs is the seam for what the driver itself reports (NVML, issue 6): the
// agent's metrics put it beside what the probes counted, so a query can
// tell memory the tracer did not see (another allocator, a context's own
// overhead) from what it did. The agent works without it (nil): the
// cudatrace_nvml_* metrics are then absent.
//
// Metrics fed by it (docs/agent.md):
//
//	cudatrace_nvml_used_bytes{gpu, UUID}                  memory used on the device
//	cudatrace_nvml_total_bytes{gpu, UUID}                 the device's memory
//	cudatrace_nvml_process_used_bytes{gpu, UUID, pid, …}  a process's use of it
//
// gpu is the NVML index as a string and UUID the device's UUID, as the
// DCGM exporter labels its metrics, so queries join on them.
type GPUs interface {
	// Devices reads every GPU now. It is called on each scrape of
	// /metrics, outside the tracer's reader goroutine; ctx ends with the
	// scrape.
	Devices(ctx context.Context) ([]GPU, error)
}

// GPU is one device as the driver reports it.
type GPU struct {
	Index      int    // NVML index: the `gpu` label
	UUID       string // "GPU-…": the `UUID` label
	UsedBytes  uint64
	TotalBytes uint64
	Processes  []GPUProcess
}

// GPUProcess is one process's use of a device, as the driver reports it.
type GPUProcess struct {
	PID       uint32
	UsedBytes uint64
}

// GPUs returns the seam the agent was given, or nil.
func (a *Agent) GPUs() GPUs { return a.opts.GPUs }
