package proc

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// FilesMapped finds the files asked for in every process's maps, a
// deleted one's too, and one's inode on another device (an overlay's
// file, stat'ed), and says when a process's maps could not be read
// (then nothing can be said to be mapped by no one).
func TestFilesMapped(t *testing.T) {
	root := t.TempDir()
	old := Root
	Root = root
	t.Cleanup(func() { Root = old })
	write := func(pid, text string) {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "maps"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10", "00400000-00401000 r-xp 00000000 fd:01 1234   /usr/bin/python3.11 (deleted)\n"+
		"7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n")
	write("11", "00400000-00401000 r-xp 00000000 08:02 99 /srv/ctr/usr/bin/python3.12\n00500000-00501000 r--p 00000000 08:02 99 /srv/ctr/usr/bin/python3.12")
	write("12", "00400000-00401000 r-xp 00000000 fd:01 77 /bin/sh\n")
	if err := os.WriteFile(filepath.Join(root, "self"), nil, 0o644); err != nil { // not a process
		t.Fatal(err)
	}
	a := FileID{Dev: unix.Mkdev(0xfd, 1), Ino: 1234}
	b := FileID{Dev: unix.Mkdev(8, 2), Ino: 99}
	c := FileID{Dev: unix.Mkdev(0xfd, 1), Ino: 4321}
	d := FileID{Dev: unix.Mkdev(0x2d, 0), Ino: 99} // b's inode on another device: an overlay's, stat'ed
	got, unread, err := FilesMapped(map[FileID]bool{a: true, b: true, c: true, d: true})
	if err != nil || len(unread) != 0 || len(got) != 3 || !got[a] || !got[b] || !got[d] {
		t.Errorf("FilesMapped: %v (unread %v, %v), want %v, %v and %v, all read", got, unread, err, a, b, d)
	}
	// A process whose maps cannot be read.
	if err := os.MkdirAll(filepath.Join(root, "13", "maps"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, unread, err := FilesMapped(map[FileID]bool{c: true}); err != nil || len(got) != 0 || len(unread) != 1 || unread[0] != 13 {
		t.Errorf("with an unreadable maps: %v (unread %v, %v), want none, 13 unread", got, unread, err)
	}
	// This process, through the real /proc: its executable.
	Root = old
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		t.Fatal(err)
	}
	self := FileID{Dev: st.Dev, Ino: st.Ino}
	if got, _, err := FilesMapped(map[FileID]bool{self: true}); !got[self] {
		t.Errorf("this test's own executable %v not found mapped (%v)", self, err)
	}
}

// BenchmarkFilesMapped: one pass over every process's maps on this
// machine, for one file no process maps.
func BenchmarkFilesMapped(b *testing.B) {
	pids, _ := PIDs()
	b.ReportMetric(float64(len(pids)), "processes")
	want := map[FileID]bool{{Dev: 1, Ino: 1}: true}
	for b.Loop() {
		FilesMapped(want)
	}
}
