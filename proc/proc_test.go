package proc

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseMaps(t *testing.T) {
	text := `55d0c0a00000-55d0c0a21000 r--p 00000000 fd:01 1234                       /usr/bin/python3.11
7f1c2a000000-7f1c2a021000 r-xp 0001a000 fd:01 98765                      /opt/my libs/libcudart.so.12 (deleted)
7f1c2b000000-7f1c2b001000 rw-p 00000000 00:00 0 
7ffd1a3fe000-7ffd1a400000 r-xp 00000000 00:00 0                          [vdso]
7f1c2c000000-7f1c2c001000 r-xp 00000000 fd:01 77                         /tmp/0
`
	maps, err := ParseMaps(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mapping{
		{Start: 0x55d0c0a00000, End: 0x55d0c0a21000, Perms: "r--p", Dev: "fd:01", Inode: 1234, Path: "/usr/bin/python3.11"},
		{Start: 0x7f1c2a000000, End: 0x7f1c2a021000, Offset: 0x1a000, Perms: "r-xp", Dev: "fd:01", Inode: 98765, Path: "/opt/my libs/libcudart.so.12"},
		{Start: 0x7f1c2b000000, End: 0x7f1c2b001000, Perms: "rw-p", Dev: "00:00"},
		{Start: 0x7ffd1a3fe000, End: 0x7ffd1a400000, Perms: "r-xp", Dev: "00:00", Path: "[vdso]"},
		{Start: 0x7f1c2c000000, End: 0x7f1c2c001000, Perms: "r-xp", Dev: "fd:01", Inode: 77, Path: "/tmp/0"},
	}
	if len(maps) != len(want) {
		t.Fatalf("got %d mappings, want %d: %+v", len(maps), len(want), maps)
	}
	for i := range want {
		if maps[i] != want[i] {
			t.Errorf("mapping %d:\n got %+v\nwant %+v", i, maps[i], want[i])
		}
	}
	if !maps[1].Exec() || maps[0].Exec() || !maps[1].File() || maps[3].File() || maps[2].File() {
		t.Errorf("Exec/File wrong: %+v", maps)
	}
}

func TestParseMapsMalformed(t *testing.T) {
	for _, line := range []string{"garbage", "zz-10 r-xp 0 00:00 0", "10-20 r-xp xyz 00:00 0", "10-20 r-xp 0 00:00 inode"} {
		if _, err := ParseMaps(strings.NewReader(line + "\n")); err == nil {
			t.Errorf("ParseMaps(%q) succeeded", line)
		}
	}
}

func TestSelf(t *testing.T) {
	pid := os.Getpid()
	maps, err := ReadMaps(pid)
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	found := false
	for _, m := range maps {
		if m.Exec() && m.Path == exe {
			found = true
		}
	}
	if !found {
		t.Errorf("no executable mapping of %s in own maps", exe)
	}
	args, err := Cmdline(pid)
	if err != nil || len(args) != len(os.Args) || args[0] != os.Args[0] {
		t.Errorf("Cmdline = %q, %v; want %q", args, err, os.Args)
	}
	if ppid, err := PPID(pid); err != nil || ppid != os.Getppid() {
		t.Errorf("PPID = %d, %v; want %d", ppid, err, os.Getppid())
	}
	if !Alive(pid) || !Exists(pid) {
		t.Error("own process not alive")
	}
}

func TestZombieAndGone(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Skip("cannot run true:", err)
	}
	pid := cmd.Process.Pid
	// Not reaped yet: a zombie exists but is not alive.
	for i := 0; i < 200 && Alive(pid); i++ {
		exec.Command("sleep", "0.01").Run()
	}
	if Alive(pid) {
		t.Fatalf("pid %d (exited, unreaped) still alive", pid)
	}
	cmd.Wait()
	if _, err := Comm(pid); !errors.Is(err, ErrNoProcess) {
		t.Errorf("Comm of reaped pid: %v, want ErrNoProcess", err)
	}
	if _, err := ReadMaps(pid); !errors.Is(err, ErrNoProcess) {
		t.Errorf("ReadMaps of reaped pid: %v, want ErrNoProcess", err)
	}
	if c, err := Comm(os.Getpid()); err != nil || c == "" {
		t.Errorf("Comm(self) = %q, %v", c, err)
	}
}

// TestStartTime: this process started before now and after boot, and a
// child started after it.
func TestStartTime(t *testing.T) {
	self, err := StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		t.Fatal(err)
	}
	now := uint64(ts.Nano())
	if self == 0 || self > now {
		t.Fatalf("start %d, now %d (boot ns)", self, now)
	}
	time.Sleep(20 * time.Millisecond)
	cmd := exec.Command("sleep", "1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	child, err := StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if child <= self || child > now+uint64(5*time.Second) {
		t.Errorf("child started at %d, this process at %d, now %d", child, self, now)
	}
	if _, err := StartTime(1 << 30); err == nil {
		t.Error("StartTime of no process: no error")
	}
}

func TestFind(t *testing.T) {
	maps := []Mapping{{Start: 0x1000, End: 0x2000}, {Start: 0x3000, End: 0x5000}}
	for _, c := range []struct {
		addr uint64
		want int
	}{{0xfff, -1}, {0x1000, 0}, {0x1fff, 0}, {0x2000, -1}, {0x3000, 1}, {0x4fff, 1}, {0x5000, -1}} {
		if got := Find(maps, c.addr); got != c.want {
			t.Errorf("Find(%#x) = %d, want %d", c.addr, got, c.want)
		}
	}
	if got := Find(nil, 0x1000); got != -1 {
		t.Errorf("Find in no mappings = %d, want -1", got)
	}
}

// Running: this process, by its start time or any; not with another
// start (its PID given to another process), not a PID no process has.
func TestRunning(t *testing.T) {
	self := os.Getpid()
	st, err := StartTime(self)
	if err != nil {
		t.Fatal(err)
	}
	if !Running(self, st) || !Running(self, 0) {
		t.Errorf("Running(self, %d) or (self, 0) false", st)
	}
	if Running(self, st+uint64(StartTimeTick)) {
		t.Error("Running with another start time: true")
	}
	if Running(1<<22+7, 0) {
		t.Error("Running of a PID above pid_max's largest: true")
	}
}
