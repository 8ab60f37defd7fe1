package loader

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// bpfMaps returns the sizes (KiB) of this process's mappings of BPF maps
// and how much of each is resident, from /proc/self/smaps.
func bpfMaps(t *testing.T) (sizes, rss []int) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if fs := strings.Fields(l); len(fs) > 0 && strings.Contains(fs[0], "-") && !strings.HasSuffix(fs[0], ":") {
			in = strings.HasSuffix(l, "anon_inode:bpf-map")
			continue
		}
		if !in {
			continue
		}
		fs := strings.Fields(l)
		if len(fs) < 2 {
			continue
		}
		n, _ := strconv.Atoi(fs[1])
		switch fs[0] {
		case "Size:":
			sizes = append(sizes, n)
		case "Rss:":
			rss = append(rss, n)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return sizes, rss
}

// A tracer that unwinds in BPF maps uw_rows and uw_index as it starts,
// all of them resident: the resident memory a watcher of the agent sees
// holds them from the start, where it used to jump by their size
// (24 MiB) at the first file's rows, minutes into a run; Close unmaps
// them.
func TestUnwindTablesMappedAtStart(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	const rows = 1 << 16
	for _, mode := range []UnwindMode{UnwindBPF, UnwindOff} {
		tr, err := New(Options{Unwind: mode, UnwindRows: rows})
		if err != nil {
			testenv.SkipOrFail(t, "load BPF: %v", err)
		}
		sizes, rss := bpfMaps(t)
		tr.Close()
		after, _ := bpfMaps(t)
		for _, s := range after {
			if s == rows*16>>10 || s == rows*8>>10 {
				t.Errorf("mode %d: a %d KiB BPF map still mapped after Close", mode, s)
			}
		}
		want := map[int]bool{}
		if mode == UnwindBPF {
			want[rows*16>>10], want[rows*8>>10] = true, true // uw_rows' 16-byte rows, uw_index's 8-byte buckets
		}
		got := map[int]bool{}
		for i, s := range sizes {
			if s == rows*16>>10 || s == rows*8>>10 {
				got[s] = true
				if i < len(rss) && rss[i] != s {
					t.Errorf("mode %d: a %d KiB BPF map mapped, %d KiB of it resident, want all", mode, s, rss[i])
				}
			}
		}
		if len(got) != len(want) || got[rows*16>>10] != want[rows*16>>10] || got[rows*8>>10] != want[rows*8>>10] {
			t.Errorf("mode %d: BPF maps of the unwind tables' sizes mapped: %v (all: %v KiB), want %v", mode, got, sizes, want)
		}
	}
}
