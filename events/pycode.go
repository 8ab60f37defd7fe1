package events

import (
	"encoding/binary"
	"fmt"
)

// PyCodeCapture is what BPF copied of a CPython code object at its first
// sight in a process (struct ct_pycode, bpf/cudatrace.h; bpf/pycode.h):
// the first bytes of the code object and of the objects that name it, at
// their addresses in the process, as many of each as could be read. Its
// record is a PyCode event's, before the record that showed the code
// object. package pystack names frames from it.
type PyCodeCapture struct {
	PID   uint32
	Time  uint64
	Code  uint64 // the code object's address
	Ident uint64 // its identity then: another capture at Code with another is another code object
	// The file name and (qualified) name str objects and the line table
	// bytes object, at the addresses the code object held.
	File, Name, Table                      uint64
	Head, FileBytes, NameBytes, TableBytes []byte
}

// Layout of struct ct_pycode after its header (decode_test.go checks it
// against the bpf2go twin).
const (
	offPyFile       = headerSize
	offPyName       = headerSize + 8
	offPyTable      = headerSize + 16
	offPyLens       = headerSize + 24
	offPyHead       = headerSize + 40
	pyHeadSize      = 256
	pyFileSize      = 512
	pyNameSize      = 256
	pyTableSize     = 4096
	PyCodeRecordLen = offPyHead + pyHeadSize + pyFileSize + pyNameSize + pyTableSize
)

// DecodePyCode reads a PyCode record (ev its header, decoded) into c,
// copying its parts out of raw (the ring's memory).
func DecodePyCode(raw []byte, ev *Event, c *PyCodeCapture) error {
	if ev.API != PyCode {
		return fmt.Errorf("decode code object capture: a %s record", ev.API)
	}
	if len(raw) < PyCodeRecordLen {
		return fmt.Errorf("decode code object capture of %d bytes: %w", len(raw), ErrShortRecord)
	}
	le := binary.LittleEndian
	*c = PyCodeCapture{PID: ev.PID, Time: ev.Time, Code: ev.Addr, Ident: ev.Size,
		File: le.Uint64(raw[offPyFile:]), Name: le.Uint64(raw[offPyName:]), Table: le.Uint64(raw[offPyTable:])}
	off := offPyHead
	for i, part := range []struct {
		dst  *[]byte
		size int
	}{{&c.Head, pyHeadSize}, {&c.FileBytes, pyFileSize}, {&c.NameBytes, pyNameSize}, {&c.TableBytes, pyTableSize}} {
		n := int(le.Uint32(raw[offPyLens+4*i:]))
		if n > part.size {
			return fmt.Errorf("decode code object capture: part %d of %d bytes in %d: %w", i, n, part.size, ErrShortRecord)
		}
		*part.dst = append([]byte(nil), raw[off:off+n]...)
		off += part.size
	}
	return nil
}
