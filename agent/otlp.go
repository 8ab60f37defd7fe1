package agent

// otlp.go: the agent's push of its profiles to an OpenTelemetry Collector.
// Every Options.OTLPInterval the reader goroutine copies the live set and
// the allocations since the last push (a baseline of its own: the pprof
// endpoint's scrapers and the push do not split the allocations between
// them), as for /debug/pprof/cuda_memory; the profile is built and encoded
// here, off it, and queued on the exporter (package otlp), which never
// waits: a Collector down or slow costs pushes (counted), not the tracing.

import (
	"context"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/export"
)

// DefaultOTLPInterval is how often the agent pushes its profiles.
const DefaultOTLPInterval = 15 * time.Second

func (a *Agent) pushLoop() {
	defer close(a.pusher)
	every := a.opts.OTLPInterval
	if every <= 0 {
		every = DefaultOTLPInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-a.stopped:
			return
		case <-t.C:
		}
		// No deadline: a copy given up on after the reader goroutine made
		// it would lose its allocations (the baseline moved). A slow
		// reader delays the next push (the ticker drops what it missed).
		if err := a.Push(context.Background()); err != nil && err != ErrStopped {
			a.warn("OTLP push: %v", err)
		}
	}
}

// Push queues one push of every process's profile on the OTLP exporter.
func (a *Agent) Push(ctx context.Context) error {
	var (
		lp   *export.LiveProfile
		src  *liveStacks
		cmds map[uint32][]string
		gpus map[string]string
		err  error
	)
	rerr := a.do(ctx, func() {
		lp, src, err = a.profile(0, a.pushed, &a.lastPush)
		if err != nil {
			return
		}
		cmds = map[uint32][]string{}
		for pid := range lp.Comm {
			if c := a.model.Get(pid); c != nil && c.First != nil {
				cmds[pid] = c.First.Cmdline
			}
		}
		gpus = gpuUUIDs(a)
	})
	if rerr != nil {
		return rerr
	}
	if err != nil {
		return err
	}
	pd, err := export.LiveOTLP(lp, src, export.OTLPOptions{
		Resource: a.opts.OTLPResource, Version: a.opts.Version,
		Process: func(pid uint32, attrs pcommon.Map) {
			if c := cmds[pid]; len(c) > 0 {
				s := attrs.PutEmptySlice("process.command_args")
				for _, arg := range c {
					s.AppendEmpty().SetStr(arg)
				}
			}
		},
		GPU: func(dev string) string { return gpus[dev] },
	})
	if err != nil {
		return err
	}
	if pd.SampleCount() == 0 {
		return nil
	}
	return a.opts.OTLP.Enqueue(pd)
}

// gpuUUIDs names each device's label by its UUID, where the driver's
// latest sample has it (NVML's index taken as the CUDA ordinal, as the
// metrics' UUID label does).
func gpuUUIDs(a *Agent) map[string]string {
	out := map[string]string{}
	if s := a.res.NVML; s != nil {
		for _, d := range s.Devices {
			out[events.DeviceName(int32(d.Index))] = d.UUID
		}
	}
	return out
}
