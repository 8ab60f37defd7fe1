package tracefile

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/cudatrace/cudatrace/events"
)

// FuzzReader: no input makes the reader panic, loop or return a frame that
// is not in the input; reading always ends in io.EOF or one of the
// package's errors, and that ending sticks.
func FuzzReader(f *testing.F) {
	// Small seeds: the fuzzer minimizes every new input it finds, and that
	// is slow on a large one.
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Meta{Tool: "cudatrace", StartBoot: 1})
	if err != nil {
		f.Fatal(err)
	}
	w.WriteAttach(&Attach{Library: "/lib/libcudart.so", Symbols: []string{"cudaMalloc"}})
	w.WriteProcess(sampleProcesses()[1])
	w.WriteEvent(events.Encode(nil, &events.Event{Time: 2, PID: 1, Comm: "a", API: events.CudaMalloc, Stack: []uint64{1, 2}}))
	w.WriteEvent(events.Encode(nil, &events.Event{Time: 3, PID: 1, API: events.CudaFree, StackErr: -14}))
	w.WriteCounters(&Counters{Time: 4, Counters: map[string]uint64{"events": 2}})
	w.WriteEnd(&End{Time: 5, Events: 2})
	if err := w.Close(); err != nil {
		f.Fatal(err)
	}
	small := buf.Bytes()
	f.Add(small)
	f.Add(small[:len(small)-3])
	f.Add(small[:headerSize])
	f.Add([]byte{})
	unknown := append(header(Version), appendFrame(nil, byte(TypeMeta), []byte("{}"))...)
	unknown = appendFrame(unknown, 200, []byte("future"))
	unknown = appendFrame(unknown, byte(TypeEvent), events.Encode(nil, &events.Event{StackErr: -14}))
	f.Add(unknown)
	f.Add(append(header(2), appendFrame(nil, byte(TypeMeta), []byte("{}"))...))

	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := NewReader(bytes.NewReader(data))
		if err != nil {
			if r != nil {
				t.Fatal("NewReader returned a Reader and an error")
			}
			if !errors.Is(err, ErrNotTrace) && !errors.Is(err, ErrVersion) &&
				!errors.Is(err, ErrTruncated) && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("NewReader: unexpected error %v", err)
			}
			return
		}
		last := int64(-1)
		// Every frame takes at least 9 bytes, so this many calls must reach
		// the end.
		for range len(data)/9 + 2 {
			rec, err := r.Next()
			if err != nil {
				if err != io.EOF && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Next: unexpected error %v", err)
				}
				if _, again := r.Next(); again != err {
					t.Fatalf("error did not stick: %v then %v", err, again)
				}
				return
			}
			if rec.Offset <= last || rec.Offset < int64(headerSize) || rec.Offset+9+int64(len(rec.Raw)) > int64(len(data)) {
				t.Fatalf("frame at %d of %d bytes, after one at %d, in %d bytes", rec.Offset, len(rec.Raw), last, len(data))
			}
			last = rec.Offset
			if !bytes.Equal(rec.Raw, data[rec.Offset+5:rec.Offset+5+int64(len(rec.Raw))]) {
				t.Fatalf("frame at %d: payload is not the file's", rec.Offset)
			}
			switch {
			case rec.Type < TypeMeta || rec.Type > TypeNVML:
				t.Fatalf("frame of unknown type %d returned", rec.Type)
			case (rec.Event != nil) != (rec.Type == TypeEvent),
				(rec.Process != nil) != (rec.Type == TypeProcess),
				(rec.Attach != nil) != (rec.Type == TypeAttach),
				(rec.Counters != nil) != (rec.Type == TypeCounters),
				(rec.End != nil) != (rec.Type == TypeEnd),
				(rec.NVML != nil) != (rec.Type == TypeNVML):
				t.Fatalf("%s frame with the wrong fields set: %+v", rec.Type, rec)
			case rec.Event != nil && len(rec.Event.Stack) > events.MaxFrames:
				t.Fatalf("%d frames", len(rec.Event.Stack))
			}
		}
		t.Fatal("Next never reached the end")
	})
}
