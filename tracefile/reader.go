package tracefile

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/cudatrace/cudatrace/events"
)

// Record is one frame read back. Exactly one of the typed fields is set,
// according to Type. Event and Raw are reused by the next call to Next:
// copy what must outlive it.
type Record struct {
	Type     Type
	Offset   int64  // of the frame in the file
	Raw      []byte // the payload
	Event    *events.Event
	Process  *Process
	Attach   *Attach
	Counters *Counters
	End      *End
	NVML     *NVML
	Python   *Python
	Symbols  *Symbols
}

// Reader reads a trace frame by frame.
type Reader struct {
	f     *os.File // nil for NewReader
	r     *bufio.Reader
	meta  Meta
	off   int64
	buf   []byte
	hdr   [5]byte
	meta1 bool // the meta frame was read
	ev    events.Event
	err   error
}

// Open opens a trace file and reads its header and meta frame.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	r, err := NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.f = f
	return r, nil
}

// NewReader reads the header and meta frame from in.
func NewReader(in io.Reader) (*Reader, error) {
	r := &Reader{r: bufio.NewReaderSize(in, 256<<10)}
	var h [headerSize]byte
	n, err := io.ReadFull(r.r, h[:])
	if n < len(Magic) || string(h[:len(Magic)]) != Magic {
		if err != nil && n == 0 {
			return nil, fmt.Errorf("empty file: %w", ErrNotTrace)
		}
		return nil, ErrNotTrace
	}
	if err != nil {
		return nil, fmt.Errorf("header: %w", ErrTruncated)
	}
	if v := binary.LittleEndian.Uint16(h[len(Magic):]); v != Version {
		return nil, fmt.Errorf("version %d (this cudatrace reads %d): %w", v, Version, ErrVersion)
	}
	r.off = int64(headerSize)
	rec, err := r.Next()
	if err == io.EOF {
		return nil, fmt.Errorf("no meta frame: %w", ErrTruncated)
	}
	if err != nil {
		return nil, err
	}
	if rec.Type != TypeMeta {
		return nil, fmt.Errorf("first frame is %s, not meta: %w", rec.Type, ErrCorrupt)
	}
	return r, nil
}

// Meta returns the trace's meta frame.
func (r *Reader) Meta() Meta { return r.meta }

// Next returns the next frame. It returns io.EOF at a clean end of file,
// and an error wrapping ErrTruncated or ErrCorrupt where the file stops
// making sense; every frame before that was intact. Frames of types this
// version does not know are skipped.
func (r *Reader) Next() (Record, error) {
	for {
		if r.err != nil {
			return Record{}, r.err
		}
		rec, err := r.next()
		if err != nil {
			r.err = err
			return Record{}, err
		}
		if rec.Type >= TypeMeta && rec.Type <= lastType {
			return rec, nil
		}
	}
}

func (r *Reader) next() (Record, error) {
	start := r.off
	hdr := r.hdr[:]
	n, err := io.ReadFull(r.r, hdr)
	if err == io.EOF {
		return Record{}, io.EOF
	}
	if err != nil {
		return Record{}, r.readErr(start, n, err)
	}
	size := binary.LittleEndian.Uint32(hdr[:4])
	if size > MaxFrame {
		return Record{}, fmt.Errorf("frame at offset %d claims %d bytes: %w", start, size, ErrCorrupt)
	}
	if cap(r.buf) < int(size)+4 {
		r.buf = make([]byte, int(size)+4)
	}
	body := r.buf[:size+4]
	m, err := io.ReadFull(r.r, body)
	if err != nil {
		return Record{}, r.readErr(start, len(hdr)+m, err)
	}
	r.off += int64(len(hdr) + len(body))
	payload := body[:size]
	crc := crc32.Update(0, castagnoli, hdr[4:5])
	crc = crc32.Update(crc, castagnoli, payload)
	if crc != binary.LittleEndian.Uint32(body[size:]) {
		return Record{}, fmt.Errorf("frame at offset %d: checksum mismatch: %w", start, ErrCorrupt)
	}
	rec := Record{Type: Type(hdr[4]), Offset: start, Raw: payload}
	switch rec.Type {
	case TypeMeta:
		if r.meta1 {
			return Record{}, fmt.Errorf("second meta frame at offset %d: %w", start, ErrCorrupt)
		}
		r.meta1 = true
		err = json.Unmarshal(payload, &r.meta)
	case TypeEvent:
		err = events.Decode(payload, &r.ev)
		rec.Event = &r.ev
	case TypeProcess:
		rec.Process = new(Process)
		err = json.Unmarshal(payload, rec.Process)
	case TypeAttach:
		rec.Attach = new(Attach)
		err = json.Unmarshal(payload, rec.Attach)
	case TypeCounters:
		rec.Counters = new(Counters)
		err = json.Unmarshal(payload, rec.Counters)
	case TypeEnd:
		rec.End = new(End)
		err = json.Unmarshal(payload, rec.End)
	case TypeNVML:
		rec.NVML = new(NVML)
		err = json.Unmarshal(payload, rec.NVML)
	case TypePython:
		rec.Python = new(Python)
		err = json.Unmarshal(payload, rec.Python)
	case TypeSymbols:
		rec.Symbols = new(Symbols)
		err = json.Unmarshal(payload, rec.Symbols)
	}
	if err != nil {
		return Record{}, fmt.Errorf("%s frame at offset %d: %v: %w", rec.Type, start, err, ErrCorrupt)
	}
	return rec, nil
}

func (r *Reader) readErr(start int64, got int, err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("last frame at offset %d cut after %d bytes: %w", start, got, ErrTruncated)
	}
	return fmt.Errorf("read trace at offset %d: %w", start, err)
}

// Close closes a Reader from Open.
func (r *Reader) Close() error {
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}
