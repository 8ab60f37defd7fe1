package events

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// LoadedObject is one object a process's dynamic loader mapped, as its
// list of them says (struct ct_dlobj, bpf/cudatrace.h; bpf/notify.h): a
// LibrariesMapped record carries those mapped since the process's last
// one, read in the process when the loader said its list was consistent.
type LoadedObject struct {
	Entry uint64 // its struct link_map in the process
	Bias  uint64 // l_addr: what its file's addresses are moved by
	Path  string // l_name, as the process names it; "" for the program itself
}

// Layout of struct ct_dlobj and struct ct_exec_note (decode_test.go
// checks it against the bpf2go twins).
const (
	dlNameLen    = 256
	dlObjSize    = 16 + dlNameLen
	dlBatch      = 16
	execNameLen  = 256
	ExecNoteLen  = headerSize + execNameLen
	loadedMaxLen = headerSize + dlBatch*dlObjSize
)

// DecodeLoaded appends to dst the objects of a LibrariesMapped record (ev
// its header, decoded: Size of them) and returns it.
func DecodeLoaded(raw []byte, ev *Event, dst []LoadedObject) ([]LoadedObject, error) {
	if ev.API != LibrariesMapped {
		return dst, fmt.Errorf("decode loaded objects: a %s record", ev.API)
	}
	n := ev.Size
	if n > dlBatch || len(raw) < headerSize+int(n)*dlObjSize {
		return dst, fmt.Errorf("decode loaded objects: %d objects in %d bytes: %w", n, len(raw), ErrShortRecord)
	}
	le := binary.LittleEndian
	for i := range int(n) {
		o := raw[headerSize+i*dlObjSize:]
		dst = append(dst, LoadedObject{Entry: le.Uint64(o), Bias: le.Uint64(o[8:]), Path: cString(o[16 : 16+dlNameLen])})
	}
	return dst, nil
}

// DecodeExec returns the file an exec note's process runs now, as exec
// was given it; "" when the record has none.
func DecodeExec(raw []byte) string {
	if len(raw) < ExecNoteLen {
		return ""
	}
	return cString(raw[headerSize:ExecNoteLen])
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
