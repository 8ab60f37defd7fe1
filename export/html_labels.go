package export

// html_labels.go: how the page names its call paths. Every distinct path
// gets a distinct label, the part that tells it apart first (as pprof's
// web UI and speedscope label a frame by what differs): a helper every
// path goes through (an allocation wrapper, the same model layer) is not
// what the user reads first, and two paths that read the same are told
// apart by their call (cudaMalloc, cudaMallocAsync…), then by the first
// frame where they differ; the page adds the process where only that
// differs. And each path's line: the innermost line of the user's own
// code, Python first, past a shared helper, never a library's or the C
// library's.

import (
	"fmt"
	"hash/maphash"
	"path"
	"strings"

	"github.com/cudatrace/cudatrace/owner"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/report"
)

// labelFrame is one frame as a label shows it.
type labelFrame struct {
	short string // "function (file:line)", else the function, else module+offset
	name  string // the function, else short
	line  string // "file:line", "" without a file
}

func toLabelFrame(f report.Frame) labelFrame {
	lf := labelFrame{short: f.Short(), name: f.Function}
	if lf.short == "" {
		lf.short = f.Address
	}
	if lf.name == "" {
		lf.name = lf.short
	}
	if f.File != "" {
		lf.line = fmt.Sprintf("%s:%d", f.File, f.Line)
	}
	return lf
}

// pathInfo is what labels a path: its frames, innermost first, and its
// call.
type pathInfo struct {
	frames []report.Frame
	api    string
	level  int
}

// candidates are the frames a path's label is made of, innermost first:
// its Python frames where it has any, else its native frames outside
// CUDA's own libraries and the program's start-up.
func candidates(fs []report.Frame) []labelFrame {
	var py, native []labelFrame
	for _, f := range fs {
		switch {
		case f.Module == pystack.Module:
			py = append(py, toLabelFrame(f))
		case f.Short() == "" || owner.IsCUDA(f.Module) || startup(f):
		default:
			native = append(native, toLabelFrame(f))
		}
	}
	if len(py) > 0 {
		return py
	}
	return native
}

// userFrames are the frames of the user's own code, innermost first, for
// the path's line: its Python frames outside the standard library and
// installed packages (all its Python frames where none is), else its
// native frames with a source file outside the C library and CUDA's (a
// program built without debug information has none: then its named native
// frames).
func userFrames(fs []report.Frame) []labelFrame {
	var py, pyLib, native, named []labelFrame
	for _, f := range fs {
		switch {
		case f.Module == pystack.Module && libraryPython(f.File):
			pyLib = append(pyLib, toLabelFrame(f))
		case f.Module == pystack.Module:
			py = append(py, toLabelFrame(f))
		case owner.IsCUDA(f.Module) || startup(f) || systemLibrary(f.Module):
		case f.File != "":
			native = append(native, toLabelFrame(f))
		case f.Function != "":
			named = append(named, toLabelFrame(f))
		}
	}
	for _, c := range [][]labelFrame{py, pyLib, native, named} {
		if len(c) > 0 {
			return c
		}
	}
	return nil
}

// libraryPython reports whether file is Python's own or an installed
// package's, not the user's.
func libraryPython(file string) bool {
	return file == "" || strings.Contains(file, "/site-packages/") || strings.Contains(file, "/dist-packages/") ||
		strings.HasPrefix(file, "<") || strings.Contains(file, "/lib/python3") && !strings.Contains(file, "-packages/") ||
		strings.Contains(file, "/lib64/python3")
}

// systemLibrary reports whether module is a library of the system (the C
// library, its threads, the dynamic loader, libffi, libstdc++), whose
// lines are nobody's leak.
func systemLibrary(module string) bool {
	base := path.Base(module)
	for _, p := range []string{"libc.so", "libc-", "libpthread", "ld-linux", "ld-", "libffi", "libstdc++", "libgcc_s", "libdl"} {
		if strings.HasPrefix(base, p) {
			return true
		}
	}
	return false
}

// bareName is a function's name without its C++ namespaces and classes
// (c10::cuda::…::alloc_block is alloc_block) or Python's classes: enough to
// tell two paths apart, the whole of it on hover.
func bareName(name string) string {
	head, rest, _ := strings.Cut(name, " (")
	if i := strings.LastIndex(head, "::"); i >= 0 && !strings.ContainsAny(head[i:], "<>()") {
		head = head[i+2:]
	}
	if rest != "" {
		return head + " (" + rest
	}
	return head
}

// distinctAt returns, for each list, the first index at which its prefix
// is no other distinct list's (of the same group): what tells it apart;
// the last index where none does (it is all of another list, or another
// list is all of it and more). Lists alike count once: the same code in
// two processes, or two paths that differ only outside the lists.
func distinctAt(lists [][]labelFrame, group []int) []int {
	seed := maphash.MakeSeed()
	hashes := make([][]uint64, len(lists))
	type key struct {
		group int
		h     uint64
	}
	first := map[key]uint64{} // a prefix -> the first whole list that has it
	multi := map[key]bool{}   // prefixes of more than one distinct list
	for i, l := range lists {
		var h maphash.Hash
		h.SetSeed(seed)
		hs := make([]uint64, len(l))
		for d, f := range l {
			h.WriteString(f.short)
			h.WriteByte(0)
			hs[d] = h.Sum64()
		}
		hashes[i] = hs
		if len(hs) == 0 {
			continue
		}
		whole := hs[len(hs)-1]
		for _, p := range hs {
			k := key{group[i], p}
			if w, ok := first[k]; !ok {
				first[k] = whole
			} else if w != whole {
				multi[k] = true
			}
		}
	}
	out := make([]int, len(lists))
	for i, hs := range hashes {
		out[i] = max(len(hs)-1, 0)
		for d, h := range hs {
			if !multi[key{group[i], h}] {
				out[i] = d
				break
			}
		}
	}
	return out
}

// pathLabels names each path, distinctly where they differ, and gives
// each its user's line (ByLine's key, "" none).
func pathLabels(paths []pathInfo) (labels, lines []string) {
	n := len(paths)
	cands := make([][]labelFrame, n)
	users := make([][]labelFrame, n)
	group := make([]int, n)
	for i, p := range paths {
		cands[i] = candidates(p.frames)
		users[i] = userFrames(p.frames)
		group[i] = p.level
	}
	at := distinctAt(cands, group)
	labels = make([]string, n)
	for i, p := range paths {
		c := cands[i]
		switch {
		case len(c) == 0 && len(p.frames) > 0:
			labels[i] = toLabelFrame(p.frames[0]).short
		case len(c) == 0:
			labels[i] = "(no stack)"
		default:
			d := at[i]
			parts := []string{c[d].short}
			if d+1 < len(c) {
				parts = append(parts, c[d+1].short)
			}
			labels[i] = strings.Join(parts, " ← ")
			if d > 0 {
				labels[i] += " · via " + bareName(c[0].name)
			}
		}
	}
	// Paths that still read the same: their call, then the first frame
	// where they differ.
	same := map[[2]string][]int{}
	for i, l := range labels {
		k := [2]string{fmt.Sprint(paths[i].level), l}
		same[k] = append(same[k], i)
	}
	for _, g := range same {
		if len(g) < 2 {
			continue
		}
		apis := map[string]bool{}
		for _, i := range g {
			apis[paths[i].api] = true
		}
		if len(apis) > 1 {
			for _, i := range g {
				labels[i] += " · " + paths[i].api
			}
			continue
		}
		all := make([][]labelFrame, len(g))
		for j, i := range g {
			for _, f := range paths[i].frames {
				all[j] = append(all[j], toLabelFrame(f))
			}
		}
		for j, i := range g {
			for d, f := range all[j] {
				differs := false
				for k := range g {
					if k != j && (d >= len(all[k]) || all[k][d].short != f.short) {
						differs = true
					}
				}
				if differs {
					labels[i] += " · at " + bareName(f.short)
					break
				}
			}
		}
	}
	lines = make([]string, n)
	uat := distinctAt(users, group)
	for i, u := range users {
		for d := uat[i]; d >= 0 && d < len(u); d-- {
			// The line past the shared helper, else the innermost with one.
			if u[d].line != "" {
				lines[i] = u[d].line
				break
			}
		}
		if lines[i] == "" && len(u) > 0 {
			lines[i] = u[min(uat[i], len(u)-1)].short
		}
	}
	return labels, lines
}
