package testenv

import (
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// InotifyEvent is one event read from an inotify descriptor: the watch it
// came by and, for a watched directory, the name of the entry.
type InotifyEvent struct {
	Wd   int32
	Mask uint32
	Name string
}

// ReadInotify drains fd, an inotify descriptor opened IN_NONBLOCK, of the
// events it holds now.
func ReadInotify(fd int) []InotifyEvent {
	var out []InotifyEvent
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if n <= 0 || err != nil {
			return out
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			end := min(off+unix.SizeofInotifyEvent+int(ev.Len), n)
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:end]), "\x00")
			out = append(out, InotifyEvent{Wd: ev.Wd, Mask: ev.Mask, Name: name})
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}
