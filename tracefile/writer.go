package tracefile

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/cudatrace/cudatrace/internal/outfile"
)

// Writer appends frames to a trace. It buffers: call Flush to push what was
// written to the file (the recorder does on every poll tick, so a killed
// tracer loses at most one tick of events). A Writer is not safe for
// concurrent use.
type Writer struct {
	f    *os.File // nil when writing to a plain io.Writer
	w    *bufio.Writer
	hdr  [frameHeader]byte
	tail [frameTrailer]byte
	err  error // sticky: after a failed write every later call returns it
}

// Create creates (or truncates) path and writes the header and meta frame.
// Only a regular file is written (a link to one is followed); a new one is
// 0600: a trace holds command lines and stacks (internal/outfile).
func Create(path string, meta Meta) (*Writer, error) {
	f, err := outfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("create trace: %w", err)
	}
	w, err := NewWriter(f, meta)
	if err != nil {
		f.Close()
		os.Remove(f.Name()) // the file, not a link to it
		return nil, err
	}
	w.f = f
	return w, nil
}

// NewWriter writes the header and meta frame to out.
func NewWriter(out io.Writer, meta Meta) (*Writer, error) {
	w := &Writer{w: bufio.NewWriterSize(out, 256<<10)}
	var h [headerSize]byte
	copy(h[:], Magic)
	binary.LittleEndian.PutUint16(h[len(Magic):], Version)
	w.write(h[:])
	w.writeJSON(TypeMeta, meta)
	if err := w.Flush(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *Writer) write(b []byte) {
	if w.err != nil {
		return
	}
	if _, err := w.w.Write(b); err != nil {
		w.err = fmt.Errorf("write trace: %w", err)
	}
}

// frame writes one frame: u32 payload length, u8 type, payload, u32
// CRC-32C of type and payload, all little-endian. A frame that fits in
// what the buffer has free is put together there and handed over in one
// Write, its CRC started from the type byte's, worked out once: the
// recorder writes a frame per event, which took three Writes and a CRC
// of the type byte alone each.
func (w *Writer) frame(t Type, payload []byte) error {
	if w.err != nil {
		return w.err
	}
	if len(payload) > MaxFrame {
		return fmt.Errorf("write %s frame of %d bytes: over the %d-byte limit", t, len(payload), MaxFrame)
	}
	crc := crc32.Update(typeCRC[t], castagnoli, payload)
	if n := frameHeader + len(payload) + frameTrailer; n <= w.w.Available() {
		b := w.w.AvailableBuffer()
		b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
		b = append(b, byte(t))
		b = append(b, payload...)
		b = binary.LittleEndian.AppendUint32(b, crc)
		w.write(b)
		return w.err
	}
	binary.LittleEndian.PutUint32(w.hdr[:4], uint32(len(payload)))
	w.hdr[4] = byte(t)
	w.write(w.hdr[:])
	w.write(payload)
	binary.LittleEndian.PutUint32(w.tail[:], crc)
	w.write(w.tail[:])
	return w.err
}

// A frame's bytes around its payload: the length and type before it, the
// CRC after.
const (
	frameHeader  = 5
	frameTrailer = 4
)

// typeCRC is the CRC-32C of each type byte alone: where every frame's CRC
// starts.
var typeCRC = func() (c [256]uint32) {
	for t := range c {
		c[t] = crc32.Update(0, castagnoli, []byte{byte(t)})
	}
	return c
}()

func (w *Writer) writeJSON(t Type, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s frame: %w", t, err)
	}
	return w.frame(t, b)
}

// WriteEvent appends one raw ring-buffer record (events.Decode's input).
func (w *Writer) WriteEvent(raw []byte) error { return w.frame(TypeEvent, raw) }

// WriteProcess appends a process description.
func (w *Writer) WriteProcess(p *Process) error { return w.writeJSON(TypeProcess, p) }

// WriteAttach appends an attached library.
func (w *Writer) WriteAttach(a *Attach) error { return w.writeJSON(TypeAttach, a) }

// WriteCounters appends a counters snapshot.
func (w *Writer) WriteCounters(c *Counters) error { return w.writeJSON(TypeCounters, c) }

// WriteNVML appends a sample of the driver's view.
func (w *Writer) WriteNVML(n *NVML) error { return w.writeJSON(TypeNVML, n) }

// WriteEnd appends the end frame. Write nothing after it.
func (w *Writer) WriteEnd(e *End) error { return w.writeJSON(TypeEnd, e) }

// WritePython writes a Python frame record.
func (w *Writer) WritePython(p *Python) error { return w.writeJSON(TypePython, p) }

// WriteSymbols writes a frame of native frames named at record time.
func (w *Writer) WriteSymbols(s *Symbols) error { return w.writeJSON(TypeSymbols, s) }

// Flush writes buffered frames to the underlying writer.
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	if err := w.w.Flush(); err != nil {
		w.err = fmt.Errorf("write trace: %w", err)
	}
	return w.err
}

// Close flushes and, for a Writer from Create, closes the file.
func (w *Writer) Close() error {
	err := w.Flush()
	if w.f != nil {
		if cerr := w.f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close trace: %w", cerr)
		}
		w.f = nil
	}
	return err
}
