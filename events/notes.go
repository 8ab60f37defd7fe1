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
	execEnvLen   = 16384
	execEnvAt    = ExecNoteLen + 8 // after env_len and pad
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

// DecodeExecEnv returns the environment an exec note's process started
// with, as BPF copied it at the exec (NAME=value strings; the first
// CT_EXEC_ENV bytes: a last one cut short is left out), and its start
// time (task start_boottime, ns); nil where the note has none (a note of
// an older layout, or an environment BPF could not read). whole says the
// copy held all of it (an environment of CT_EXEC_ENV bytes or more was
// cut). The strings are copies: raw is the ring buffer's.
func DecodeExecEnv(raw []byte) (env []string, start uint64, whole bool) {
	if len(raw) < execEnvAt {
		return nil, 0, false
	}
	start = binary.LittleEndian.Uint64(raw[offAddr:])
	n := int(binary.LittleEndian.Uint32(raw[ExecNoteLen:]))
	if n > execEnvLen || execEnvAt+n > len(raw) {
		return nil, start, false
	}
	whole = n < execEnvLen
	b := raw[execEnvAt : execEnvAt+n]
	for len(b) > 0 {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			break // cut at CT_EXEC_ENV: not a whole string
		}
		if i > 0 {
			env = append(env, string(b[:i]))
		}
		b = b[i+1:]
	}
	return env, start, whole
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
