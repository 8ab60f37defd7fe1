package report

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/tracefile"
)

func nvmlDevices(used0, used1 uint64) []tracefile.NVMLDevice {
	return []tracefile.NVMLDevice{
		{Index: 0, UUID: "GPU-0", Name: "Fake GPU", Total: 16 << 30, Used: used0, Free: 16<<30 - used0},
		{Index: 1, UUID: "GPU-1", Name: "Fake GPU", Total: 16 << 30, Used: used1, Free: 16<<30 - used1},
	}
}

// nvmlItems is mixItems with NVML samples between its events. Traced live
// of pid 100 (GPU memory, host memory excluded) is 1300 at 2500 ns, 812 at
// 4500 and after; pid 200's is 14 at 10200. pid 300 is on the GPU and
// never traced.
func nvmlItems() []any {
	mix := mixItems()
	var out []any
	for i, it := range mix {
		out = append(out, it)
		switch i {
		case 3: // after the allocation at 2000: pid 100 has 1300 live
			out = append(out, &tracefile.NVML{Time: base + 2500, Devices: nvmlDevices(5<<30, 1<<30),
				Processes: []tracefile.NVMLProcess{
					{PID: 100, Device: 0, UUID: "GPU-0", Used: 1500},
					{PID: 100, Device: 1, UUID: "GPU-1", Used: 300},
					{PID: 300, Device: 0, UUID: "GPU-0", Used: 4096},
				}})
		case 5: // after the free at 3000 and the allocation at 4000: 812 live
			out = append(out, &tracefile.NVML{Time: base + 4500, Devices: nvmlDevices(6<<30, 1<<30),
				Processes: []tracefile.NVMLProcess{{PID: 100, Device: 0, UUID: "GPU-0", Used: 1400}}})
		case 7:
			out = append(out, &tracefile.NVML{Time: base + 5200, Error: "device 0: nvmlDeviceGetMemoryInfo_v2: GPU is lost (15)"})
		case 13: // after pid 200's allocations: pid 100 still 812, pid 200 14
			out = append(out, &tracefile.NVML{Time: base + 10200, Devices: nvmlDevices(4<<30, 2<<30),
				Processes: []tracefile.NVMLProcess{
					{PID: 100, Device: 0, UUID: "GPU-0", Used: 1412},
					{PID: 200, Device: 1, UUID: "GPU-1", Used: 2062},
				}})
		}
	}
	return out
}

// The cross-check, every number: NVML's figure at each sample beside the
// ledger's live bytes at that point of the trace.
func TestNVMLCrossCheck(t *testing.T) {
	meta := testMeta()
	meta.All = true
	path, _ := tracetest.Write(t, meta, nvmlItems()...)
	rep, err := Load(path, Options{Interval: 5 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	want100 := &ProcessNVML{Samples: 3, UsedBytes: 1412, TracedBytes: 812, RemainderBytes: 600, LastNS: 10200,
		FirstRemainderBytes: 500, FirstNS: 2500, MinRemainderBytes: 500, MaxRemainderBytes: 600, DriftBytes: 100,
		MaxUsedBytes: 1800, Devices: []NVMLUse{{PID: 100, Device: 0, UUID: "GPU-0", UsedBytes: 1412}}}
	want200 := &ProcessNVML{Samples: 1, UsedBytes: 2062, TracedBytes: 14, RemainderBytes: 2048, LastNS: 10200,
		FirstRemainderBytes: 2048, FirstNS: 10200, MinRemainderBytes: 2048, MaxRemainderBytes: 2048,
		MaxUsedBytes: 2062, Devices: []NVMLUse{{PID: 200, Device: 1, UUID: "GPU-1", UsedBytes: 2062}}}
	if len(rep.Processes) != 2 {
		t.Fatalf("processes %+v", rep.Processes)
	}
	if got := rep.Processes[0].NVML; !reflect.DeepEqual(got, want100) {
		t.Errorf("pid 100:\n got %+v\nwant %+v", got, want100)
	}
	if got := rep.Processes[1].NVML; !reflect.DeepEqual(got, want200) {
		t.Errorf("pid 200:\n got %+v\nwant %+v", got, want200)
	}
	wantSummary := &NVMLSummary{Samples: 3, Failed: 1, Error: "device 0: nvmlDeviceGetMemoryInfo_v2: GPU is lost (15)",
		Devices: []GPU{
			{Index: 0, UUID: "GPU-0", Name: "Fake GPU", TotalBytes: 16 << 30, UsedBytes: 4 << 30, FreeBytes: 12 << 30, MaxUsedBytes: 6 << 30},
			{Index: 1, UUID: "GPU-1", Name: "Fake GPU", TotalBytes: 16 << 30, UsedBytes: 2 << 30, FreeBytes: 14 << 30, MaxUsedBytes: 2 << 30},
		},
		Untraced: []NVMLUse{{PID: 300, UsedBytes: 4096}},
		Intervals: []NVMLInterval{
			{PID: 100, StartNS: 0, EndNS: 5000, Samples: 2, UsedBytes: 1400, TracedBytes: 812, RemainderBytes: 588,
				MinRemainderBytes: 500, MaxRemainderBytes: 588},
			{PID: 100, StartNS: 10000, EndNS: 15000, Samples: 1, UsedBytes: 1412, TracedBytes: 812, RemainderBytes: 600,
				MinRemainderBytes: 600, MaxRemainderBytes: 600},
			{PID: 200, StartNS: 10000, EndNS: 15000, Samples: 1, UsedBytes: 2062, TracedBytes: 14, RemainderBytes: 2048,
				MinRemainderBytes: 2048, MaxRemainderBytes: 2048},
		}}
	if !reflect.DeepEqual(rep.NVML, wantSummary) {
		t.Errorf("summary:\n got %+v\nwant %+v", rep.NVML, wantSummary)
	}

	// The JSON keys scripts read.
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	got := decodeJSON(t, buf.Bytes())
	p := got["processes"].([]any)[0].(map[string]any)["nvml"].(map[string]any)
	for k, v := range map[string]string{"used_bytes": "1412", "traced_bytes": "812", "remainder_bytes": "600",
		"first_remainder_bytes": "500", "drift_bytes": "100", "samples": "3"} {
		if s := p[k].(json.Number).String(); s != v {
			t.Errorf("processes[0].nvml.%s = %s, want %s", k, s, v)
		}
	}
	if d := got["nvml"].(map[string]any)["devices"].([]any)[1].(map[string]any); d["uuid"] != "GPU-1" ||
		d["used_bytes"].(json.Number).String() != "2147483648" {
		t.Errorf("nvml.devices[1] = %v", d)
	}

	// --pid 200: only its rows; nothing is "untraced" for being left out.
	rep, err = Load(path, Options{PIDs: []uint32{200}, Interval: 5 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.NVML.Untraced) != 0 || len(rep.NVML.Intervals) != 1 || rep.NVML.Intervals[0].PID != 200 {
		t.Errorf("--pid 200: untraced %+v, intervals %+v", rep.NVML.Untraced, rep.NVML.Intervals)
	}
}

// A trace without NVML frames has no nvml keys; one recorded where NVML
// was unavailable says why.
func TestNVMLAbsentOrUnavailable(t *testing.T) {
	path, _ := tracetest.Write(t, testMeta(), mixItems()...)
	rep, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.NVML != nil || rep.Processes[0].NVML != nil {
		t.Errorf("nvml %+v, process nvml %+v; want none", rep.NVML, rep.Processes[0].NVML)
	}

	items := append([]any{&tracefile.NVML{Time: base + 10, Error: "NVML unavailable: Driver Not Loaded"}}, mixItems()...)
	path, _ = tracetest.Write(t, testMeta(), items...)
	if rep, err = Load(path, Options{}); err != nil {
		t.Fatal(err)
	}
	want := &NVMLSummary{Failed: 1, Error: "NVML unavailable: Driver Not Loaded", Devices: []GPU{}}
	if !reflect.DeepEqual(rep.NVML, want) || rep.Processes[0].NVML != nil {
		t.Errorf("nvml %+v, process %+v; want %+v", rep.NVML, rep.Processes[0].NVML, want)
	}
}

func allMeta() tracefile.Meta {
	m := testMeta()
	m.All, m.Command = true, nil
	return m
}

// What a process held before tracing began is said only of a process that
// was running then: never of a launched command's processes, nor of one
// whose start time (kept in 10 ms ticks) is within a tick of the trace's
// start. On the H100 a `record -- python3` run said its CUDA context (518
// MiB) was held "before tracing".
func TestNVMLHeldBefore(t *testing.T) {
	item := func(start uint64) []any {
		return []any{
			&tracefile.Process{PID: 100, Comm: "mix", Time: base + 500, Start: start},
			events.Event{Time: base + 1000, Duration: 100, PID: 100, TID: 100, Comm: "mix", API: events.CudaMalloc,
				Addr: 0x7000_0000, Size: 64 << 20},
			&tracefile.NVML{Time: base + 2500, Devices: nvmlDevices(1<<30, 0),
				Processes: []tracefile.NVMLProcess{{PID: 100, Device: 0, UUID: "GPU-0", Used: (518 + 64) << 20}}},
		}
	}
	const tick = 10 * uint64(time.Millisecond)
	for _, c := range []struct {
		name    string
		command bool
		start   uint64
		want    int64
	}{
		{"launched", true, base - tick + 1, 0},
		{"attached, started a tick before", false, base - tick - 1, 518 << 20},
		{"attached, started within the tick", false, base - tick + 1, 0},
		{"attached, started a second before", false, base - 1e9 + 1, 518 << 20},
	} {
		meta := testMeta()
		if !c.command {
			meta.Command, meta.All = nil, true
		}
		path, _ := tracetest.Write(t, meta, item(c.start)...)
		rep, err := Load(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Processes) != 1 || rep.Processes[0].NVML == nil {
			t.Fatalf("%s: processes %+v", c.name, rep.Processes)
		}
		if got := rep.Processes[0].NVML.HeldBeforeBytes; got != c.want {
			t.Errorf("%s: held_before_bytes %d, want %d", c.name, got, c.want)
		}
	}
}

// A sample taken after a process exited is left out of its cross-check:
// the driver lists a process for a while after it ends, with memory it is
// freeing, while cudatrace holds nothing live for it any more. On the H100
// the last sample of a `record -- python3` run came 60 ms after the exit
// (987758592 used, 0 traced) and the report said the untraced memory had
// grown by 928 MiB.
func TestNVMLAfterExit(t *testing.T) {
	sample := func(at, used uint64) *tracefile.NVML {
		return &tracefile.NVML{Time: base + at, Devices: nvmlDevices(1<<30, 0),
			Processes: []tracefile.NVMLProcess{{PID: 100, Device: 0, UUID: "GPU-0", Used: used}}}
	}
	path, _ := tracetest.Write(t, testMeta(),
		&tracefile.Process{PID: 100, Comm: "mix", Time: base + 500},
		events.Event{Time: base + 1000, Duration: 100, PID: 100, TID: 100, Comm: "mix", API: events.CudaMalloc,
			Addr: 0x7000_0000, Size: 64 << 20},
		sample(2000, (500+64)<<20),
		events.Event{Time: base + 3000, PID: 100, TID: 100, Comm: "mix", API: events.ProcessExit, Flags: events.FlagEntryOnly},
		sample(4000, 300<<20),
	)
	rep, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := &ProcessNVML{Samples: 1, UsedBytes: (500 + 64) << 20, TracedBytes: 64 << 20, RemainderBytes: 500 << 20,
		LastNS: 2000, FirstRemainderBytes: 500 << 20, FirstNS: 2000, MinRemainderBytes: 500 << 20,
		MaxRemainderBytes: 500 << 20, MaxUsedBytes: (500 + 64) << 20,
		Devices: []NVMLUse{{PID: 100, Device: 0, UUID: "GPU-0", UsedBytes: (500 + 64) << 20}}}
	if len(rep.Processes) != 1 || !reflect.DeepEqual(rep.Processes[0].NVML, want) {
		t.Fatalf("processes %+v\n got %+v\nwant %+v", rep.Processes, rep.Processes[0].NVML, want)
	}
}

// A sample is written when the reader takes it, and a record made before
// it may still be in the ring then (seen on an H100: a 1 GiB free 25 ms
// before a sample came after it in the file). The sample is set beside the
// ledger as it stood at its time, not at its place in the file.
func TestNVMLSampleBeforeItsEvents(t *testing.T) {
	sample := func(at, used uint64) *tracefile.NVML {
		return &tracefile.NVML{Time: base + at, Devices: nvmlDevices(1<<30, 0),
			Processes: []tracefile.NVMLProcess{{PID: 100, Device: 0, UUID: "GPU-0", Used: used}}}
	}
	ev := func(at, dur uint64, api events.API, addr, size uint64) events.Event {
		e := events.Event{Time: base + at, Duration: dur, PID: 100, TID: 100, Comm: "mix", API: api, Addr: addr, Size: size}
		if dur == 0 {
			e.Flags = events.FlagEntryOnly
		}
		return e
	}
	path, _ := tracetest.Write(t, testMeta(),
		&tracefile.Process{PID: 100, Comm: "mix", Time: base + 500},
		ev(1000, 100, events.CudaMalloc, 0x7000_0000, 1<<30),
		ev(1200, 100, events.CudaMalloc, 0x8000_0000, 64<<20),
		sample(2000, (500+64)<<20), // taken after the free at 1500, written before it
		ev(1500, 0, events.CudaFree, 0x7000_0000, 0),
		ev(2500, 100, events.CudaMalloc, 0x9000_0000, 32<<20),
		sample(3000, (500+96)<<20),
		sample(4000, (500+96)<<20), // no event after it: the ledger at the end
	)
	rep, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := &ProcessNVML{Samples: 3, UsedBytes: (500 + 96) << 20, TracedBytes: 96 << 20, RemainderBytes: 500 << 20,
		LastNS: 4000, FirstRemainderBytes: 500 << 20, FirstNS: 2000, MinRemainderBytes: 500 << 20,
		MaxRemainderBytes: 500 << 20, MaxUsedBytes: (500 + 96) << 20,
		Devices: []NVMLUse{{PID: 100, Device: 0, UUID: "GPU-0", UsedBytes: (500 + 96) << 20}}}
	if len(rep.Processes) != 1 || !reflect.DeepEqual(rep.Processes[0].NVML, want) {
		t.Fatalf("processes %+v\n got %+v\nwant %+v", rep.Processes, rep.Processes[0].NVML, want)
	}
}
