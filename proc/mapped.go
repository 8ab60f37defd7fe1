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
// the process still runs its code. So does a mapping of the same inode
// on another device: a file of an overlay file system (a container's
// image) is stat'ed with the overlay's device while /proc/PID/maps shows
// the layer's (check), and a file taken as mapped is kept, never wrongly
// let go. err: /proc could not be listed.
func FilesMapped(files map[FileID]bool) (mapped map[FileID]bool, unread []int, err error) {
	mapped = map[FileID]bool{}
	if len(files) == 0 {
		return mapped, nil, nil
	}
	pids, err := PIDs()
	if err != nil {
		return nil, nil, err
	}
	byInode := map[uint64][]FileID{}
	for id := range files {
		byInode[id.Ino] = append(byInode[id.Ino], id)
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
			if ino, ok := lineInode(line); ok {
				for _, id := range byInode[ino] {
					mapped[id] = true
				}
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

// lineInode reads the inode of a /proc/PID/maps line ("start-end perms
// offset major:minor inode path"); ok is false for an anonymous mapping.
func lineInode(line []byte) (uint64, bool) {
	for n := 0; n < 4; n++ {
		i := bytes.IndexAny(line, " \t")
		if i < 0 {
			return 0, false
		}
		line = bytes.TrimLeft(line[i:], " \t")
	}
	if i := bytes.IndexAny(line, " \t"); i >= 0 {
		line = line[:i]
	}
	ino, err := strconv.ParseUint(string(line), 10, 64)
	return ino, err == nil && ino != 0
}
