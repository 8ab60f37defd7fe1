package proc

import (
	"bytes"
	"errors"
	"io"
	"os"
	"slices"
	"strconv"
)

// FilesMapped says which of files some process maps now, from every
// process's /proc/PID/maps (one read each, the lines' device and inode
// fields only). unread are the processes whose maps could not be read for
// another reason than their end (the tracer lacks the right to read
// them): a caller that needs to know that nothing maps a file must find
// out otherwise what they may map. A mapping of a deleted file counts:
// the process still runs its code. err: /proc could not be listed.
func FilesMapped(files map[FileID]bool) (mapped map[FileID]bool, unread []int, err error) {
	mapped = map[FileID]bool{}
	if len(files) == 0 {
		return mapped, nil, nil
	}
	pids, err := PIDs()
	if err != nil {
		return nil, nil, err
	}
	buf := make([]byte, 0, 64<<10)
	for _, pid := range pids {
		b, err := readAll(path(pid, "maps"), buf)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, errESRCH) {
				unread = append(unread, pid)
			}
			continue
		}
		buf = b[:0]
		for len(b) > 0 {
			line := b
			if i := bytes.IndexByte(b, '\n'); i >= 0 {
				line, b = b[:i], b[i+1:]
			} else {
				b = nil
			}
			if id, ok := lineFile(line); ok && files[id] {
				mapped[id] = true
			}
		}
	}
	return mapped, unread, nil
}

// readAll reads the file at name into buf's room, grown as needed (a
// maps file reads as the kernel writes it, a page or so a read).
func readAll(name string, buf []byte) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, max(cap(buf), 4096))
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// lineFile reads the device and inode of a /proc/PID/maps line
// ("start-end perms offset major:minor inode path").
func lineFile(line []byte) (FileID, bool) {
	var fields [5][]byte
	n := 0
	for n < 5 {
		for len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
			line = line[1:]
		}
		if len(line) == 0 {
			return FileID{}, false
		}
		i := bytes.IndexAny(line, " \t")
		if i < 0 {
			i = len(line)
		}
		fields[n], line = line[:i], line[i:]
		n++
	}
	ino, err := strconv.ParseUint(string(fields[4]), 10, 64)
	if err != nil || ino == 0 {
		return FileID{}, false
	}
	m := Mapping{Dev: string(fields[3]), Inode: ino}
	return m.ID()
}
