package gpustat

import (
	"errors"
	"reflect"
	"testing"
)

func TestFakeAndSample(t *testing.T) {
	f := &Fake{
		Devs: []Device{{Index: 0, UUID: "GPU-a", Name: "Fake H100", Total: 80 << 30, Used: 5 << 30, Free: 75 << 30}},
		Procs: []ProcessUsage{
			{PID: 300, Device: 1, UUID: "GPU-b", Used: 7},
			{PID: 200, Device: 0, UUID: "GPU-a", Used: 1000},
			{PID: 300, Device: 0, UUID: "GPU-a", Used: 500},
		},
	}
	// The clock reads how many queries were made: Take stamps the sample
	// between the devices' and the processes'.
	s, at, err := Take(f, func() uint64 { return uint64(f.Calls) })
	if err != nil {
		t.Fatal(err)
	}
	if at != 1 || f.Calls != 2 {
		t.Errorf("stamped after %d queries of %d, want after the devices' (1 of 2)", at, f.Calls)
	}
	want := []ProcessUsage{
		{PID: 200, Device: 0, UUID: "GPU-a", Used: 1000},
		{PID: 300, Device: 0, UUID: "GPU-a", Used: 500},
		{PID: 300, Device: 1, UUID: "GPU-b", Used: 7},
	}
	if !reflect.DeepEqual(s.Processes, want) || !reflect.DeepEqual(s.Devices, f.Devs) {
		t.Errorf("sample %+v", s)
	}
	if n, ok := s.Used(300); n != 507 || !ok {
		t.Errorf("Used(300) = %d, %v; want 507 on two devices", n, ok)
	}
	if n, ok := s.Used(1); n != 0 || ok {
		t.Errorf("Used(1) = %d, %v; want not listed", n, ok)
	}
	f.Err = errors.New("GPU is lost")
	if _, _, err := Take(f, nil); err == nil || err.Error() != "GPU is lost" {
		t.Errorf("Take with a failing source: %v", err)
	}
	if err := f.Close(); err != nil || !f.Closed {
		t.Errorf("Close: %v", err)
	}
}
