package agent

// oom_node.go: the node at the moment of an out-of-memory failure. A GPU is
// shared (time-slicing, MPS, MIG's parent, a job's ranks side by side), so
// the black box of one process says, beside its own live set, what every
// other traced process on the node held then, by device, with its job and
// rank and pod; and, for the failed process's own job, each of its ranks'
// live set on the node by stack.

import (
	"slices"

	"github.com/cudatrace/cudatrace/kube"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/report"
)

// OOMNode is what the node's other traced processes held when the call
// failed.
type OOMNode struct {
	// Devices sums the node's traced GPU memory per device then, the
	// failed process's included.
	Devices []OOMNodeDevice `json:"devices"`
	// Processes are the other traced processes running then, most GPU
	// memory on the failed call's device first.
	Processes []OOMNodeProcess `json:"processes"`
}

// OOMNodeDevice is one device's traced GPU memory on the node.
type OOMNodeDevice struct {
	Device     int32  `json:"device"`
	LiveBytes  uint64 `json:"live_bytes"`          // segments: what the runtime and the driver handed out
	TensorLive uint64 `json:"tensor_live"`         // PyTorch's blocks in them
	Processes  int    `json:"processes,omitempty"` // holding some of it (the node's sums)
}

// OOMNodeProcess is one other process: what it held, by device.
type OOMNodeProcess struct {
	PID           uint32   `json:"pid"`
	Comm          string   `json:"comm"`
	Cmdline       []string `json:"cmdline,omitempty"`
	JobID         string   `json:"job_id,omitempty"`
	Rank          *int     `json:"rank,omitempty"`
	Container     string   `json:"container,omitempty"`
	PodUID        string   `json:"pod_uid,omitempty"`
	Namespace     string   `json:"namespace,omitempty"`
	Pod           string   `json:"pod,omitempty"`
	ContainerName string   `json:"container_name,omitempty"`
	LiveBytes     uint64   `json:"live_bytes"` // GPU memory, every device
	HostLive      uint64   `json:"host_live"`
	// Devices is its GPU memory by device.
	Devices []OOMNodeDevice `json:"devices"`
	// SameJob: a rank of the failed process's job; its live set is in
	// LiveStacks (the failed call's device first, most bytes first).
	SameJob    bool                `json:"same_job,omitempty"`
	LiveStacks []OOMNodeStackShare `json:"live_stacks,omitempty"`
}

// OOMNodeStackShare is one stack's share of a rank's live set on a device.
type OOMNodeStackShare struct {
	Device int32 `json:"device"`
	report.StackShare
}

// nodeProc is a copy, made at the failure on the reader goroutine, of one
// other process.
type nodeProc struct {
	out    OOMNodeProcess
	stacks []nodeStack
}

type nodeStack struct {
	device int32
	share  report.LiveShare
}

// oomNode copies what every other running traced process holds now (the
// failed process is pid), adding the stacks it names to d.src.
func (a *Agent) oomNode(pid uint32, first *procmodel.Capture, device int32, names map[uint32]kube.Names, d *oomDump) {
	job := ""
	if first != nil {
		job = first.JobID()
	}
	sum := map[int32]*OOMNodeDevice{}
	add := func(p *ledger.Process) {
		for _, dv := range p.DeviceList() {
			if dv.Live == 0 && dv.TensorLive == 0 {
				continue
			}
			s := sum[dv.Device]
			if s == nil {
				s = &OOMNodeDevice{Device: dv.Device}
				sum[dv.Device] = s
			}
			s.LiveBytes += dv.Live
			s.TensorLive += dv.TensorLive
			s.Processes++
		}
	}
	for _, other := range a.pids() {
		// Its account as the last event left it (procState.acct): the
		// failure may come before the first Tick hands the agent the
		// session's ledger.
		ps := a.procs[other]
		var p *ledger.Process
		if ps != nil {
			p = ps.acct
		}
		if ps == nil || p == nil || !ps.exitedAt.IsZero() {
			continue
		}
		add(p)
		if other == pid {
			continue
		}
		np := nodeProc{out: OOMNodeProcess{PID: other, Comm: p.Comm, LiveBytes: p.Live, HostLive: p.HostLive,
			Container: ps.container.ID, PodUID: ps.container.PodUID}}
		n := names[other]
		np.out.Namespace, np.out.Pod, np.out.ContainerName = n.Namespace, n.Pod, n.Container
		if c := a.model.Get(other); c != nil && c.First != nil {
			np.out.Cmdline = c.First.Cmdline
			np.out.JobID = c.First.JobID()
			if c.First.Ranked() {
				r := c.First.Rank()
				np.out.Rank = &r
			}
		}
		for _, dv := range p.DeviceList() {
			if dv.Live == 0 && dv.TensorLive == 0 {
				continue
			}
			np.out.Devices = append(np.out.Devices, OOMNodeDevice{Device: dv.Device, LiveBytes: dv.Live, TensorLive: dv.TensorLive})
		}
		if job != "" && np.out.JobID == job {
			np.out.SameJob = true
			devs := make([]int32, 0, len(np.out.Devices))
			for _, dv := range np.out.Devices {
				devs = append(devs, dv.Device)
			}
			// The failed call's device first.
			slices.SortStableFunc(devs, func(x, y int32) int {
				if (x == device) != (y == device) {
					if x == device {
						return -1
					}
					return 1
				}
				return 0
			})
			for _, dev := range devs {
				for _, s := range report.ContextOf(p, dev, oomStacks).Stacks {
					np.stacks = append(np.stacks, nodeStack{device: dev, share: s})
					d.src.add(a, s.Stack)
				}
			}
		}
		d.node = append(d.node, np)
	}
	for _, s := range sum {
		d.nodeDevs = append(d.nodeDevs, *s)
	}
	slices.SortFunc(d.nodeDevs, func(x, y OOMNodeDevice) int { return int(x.Device) - int(y.Device) })
	on := func(np *nodeProc) uint64 {
		for _, dv := range np.out.Devices {
			if dv.Device == device {
				return dv.LiveBytes
			}
		}
		return 0
	}
	slices.SortStableFunc(d.node, func(x, y nodeProc) int {
		ox, oy := on(&x), on(&y)
		switch {
		case ox != oy && ox > oy:
			return -1
		case ox != oy:
			return 1
		}
		return int(x.out.PID) - int(y.out.PID)
	})
}

// nodeReport is the dump's OOMNode, its stacks named.
func (d *oomDump) nodeReport() *OOMNode {
	out := &OOMNode{Devices: d.nodeDevs, Processes: []OOMNodeProcess{}}
	if out.Devices == nil {
		out.Devices = []OOMNodeDevice{}
	}
	for _, np := range d.node {
		p := np.out
		for _, s := range np.stacks {
			p.LiveStacks = append(p.LiveStacks, OOMNodeStackShare{Device: s.device,
				StackShare: report.StackShare{LiveBytes: s.share.Bytes, LiveCount: s.share.Count, Frames: report.Frames(d.src.Frames(s.share.Stack))}})
		}
		out.Processes = append(out.Processes, p)
	}
	return out
}
