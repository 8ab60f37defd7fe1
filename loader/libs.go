package loader

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/cudatrace/cudatrace/proc"
)

// libPattern matches the file names of the CUDA libraries cudatrace probes:
// the runtime (libcudart), the driver (libcuda), and PyTorch's caching
// allocator (libc10_cuda, for its USDT probes).
var libPattern = regexp.MustCompile(`^(libcuda(rt)?|libc10_cuda)\.so(\.\d+)*$`)

// IsCUDALibrary reports whether a path names a library cudatrace probes.
func IsCUDALibrary(path string) bool { return libPattern.MatchString(filepath.Base(path)) }

// Library is one library file to probe, identified by its inode: the same
// file reached through two paths (a symlink, a bind mount) is probed once,
// and two copies at different paths are two libraries.
type Library struct {
	Path  string // a path the tracer can open (through /proc/PID/root for a container)
	Dev   uint64
	Inode uint64
}

// Libraries collects libraries, keeping one per inode.
type Libraries struct {
	list []Library
	seen map[[2]uint64]bool
}

// Add records path if it is a file not seen before; it reports whether it
// was new. The file is found as proc.Open finds it (only a regular file;
// under /proc/PID/root, inside that root), and Attach opens only that
// file (its device and inode) later.
func (ls *Libraries) Add(path string) (bool, error) {
	_, isNew, err := ls.AddLib(path)
	return isNew, err
}

// AddLib is Add, which also returns the file as it found it at path: path,
// and its device and inode, whether it was new or not.
func (ls *Libraries) AddLib(path string) (lib Library, isNew bool, err error) {
	f, err := proc.Open(path, nil)
	if err != nil {
		return lib, false, fmt.Errorf("library %s: %w", path, err)
	}
	var st syscall.Stat_t
	err = syscall.Fstat(int(f.Fd()), &st)
	f.Close()
	if err != nil {
		return lib, false, fmt.Errorf("library %s: %w", path, err)
	}
	lib = Library{Path: path, Dev: st.Dev, Inode: st.Ino}
	key := [2]uint64{st.Dev, st.Ino}
	if ls.seen == nil {
		ls.seen = make(map[[2]uint64]bool)
	}
	if ls.seen[key] {
		return lib, false, nil
	}
	ls.seen[key] = true
	ls.list = append(ls.list, lib)
	return lib, true, nil
}

// Remove forgets the library file dev, inode (Add's): added again, it is
// new.
func (ls *Libraries) Remove(dev, inode uint64) {
	key := [2]uint64{dev, inode}
	if !ls.seen[key] {
		return
	}
	delete(ls.seen, key)
	ls.list = slices.DeleteFunc(ls.list, func(l Library) bool { return l.Dev == dev && l.Inode == inode })
}

// HasInode reports whether a library added has that inode (a mapping's,
// whose device /proc/PID/maps writes otherwise than stat).
func (ls *Libraries) HasInode(inode uint64) bool {
	for _, l := range ls.list {
		if l.Inode == inode {
			return true
		}
	}
	return false
}

// List returns the libraries in the order they were added.
func (ls *Libraries) List() []Library { return ls.list }

// FromProcess returns the CUDA libraries mapped by pid (CUDAPaths).
func FromProcess(pid int) ([]string, error) {
	maps, err := proc.ReadMaps(pid)
	if err != nil {
		return nil, err
	}
	return CUDAPaths(pid, maps), nil
}

// CUDAPaths returns the CUDA libraries among process pid's mappings, each
// once, by the path the tracer opens it at (proc.FilePath): a container's
// through /proc/PID/root, so that its own copy is the one probed, and
// otherwise the path the process maps it at, which messages and reports
// show as users know it.
func CUDAPaths(pid int, maps []proc.Mapping) []string {
	var out []string
	seen := map[string]bool{}
	for _, m := range maps {
		if m.File() && IsCUDALibrary(m.Path) && !seen[m.Path] {
			seen[m.Path] = true
			out = append(out, proc.FilePath(pid, m, maps))
		}
	}
	return out
}

// SearchPath returns the CUDA libraries process pid would load by name
// (dlopen("libcuda.so.1"), a DT_NEEDED), where its dynamic loader would
// look: the directories of its LD_LIBRARY_PATH (its environment, read
// with ptrace access: proc.Environ), then the system's (the ld.so cache
// and SearchDirs) when it sees the tracer's files, or its own standard
// directories when it has a root of its own. Probes attached to them
// before it loads one trace its calls from the first: a uprobe sits on
// the file, whoever maps it later.
func SearchPath(pid int) []string {
	root, err := proc.RootDir(pid, nil)
	if err != nil {
		return nil
	}
	var dirs []string
	if env, err := proc.Environ(pid); err == nil {
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, "LD_LIBRARY_PATH="); ok {
				dirs = append(dirs, filepath.SplitList(v)...)
			}
		}
	}
	var found []string
	if root == "" {
		found, _ = FromSystem()
	} else {
		dirs = append(dirs, ownRootDirs(root, runtime.GOARCH)...)
	}
	for _, d := range dirs {
		if !filepath.IsAbs(d) {
			continue // relative to a working directory that may be another by then
		}
		ents, err := os.ReadDir(filepath.Join(root, d))
		if err != nil {
			continue
		}
		for _, e := range ents {
			if IsCUDALibrary(e.Name()) {
				found = append(found, filepath.Join(root, d, e.Name()))
			}
		}
	}
	return found
}

// ownRootDirs are the standard directories, under a process's own root
// (a container's), where its loader or its frameworks find CUDA on
// architecture goarch (archDirs): those that exist, as the process names
// them (root left off).
func ownRootDirs(root, goarch string) []string {
	var out []string
	for _, d := range slices.Concat([]string{"/usr/local/cuda/lib64"}, archDirs[goarch],
		[]string{"/usr/lib64", "/usr/lib", "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"}) {
		matches, _ := filepath.Glob(filepath.Join(root, d))
		for _, m := range matches {
			out = append(out, strings.TrimPrefix(m, root))
		}
	}
	return out
}

// SearchDirs returns the directories a system-wide search looks in, besides
// the ld.so cache: CUDA toolkits (their targets for this machine's
// architecture: archDirs), the distribution's library directories, pip
// wheels (nvidia-cuda-runtime-cu12 puts libcudart in
// site-packages/nvidia/cuda_runtime/lib) and conda environments. Globs are
// expanded; missing directories are left out.
func SearchDirs() []string { return searchDirs("", runtime.GOARCH) }

// archDirs are where CUDA's libraries are installed on each architecture,
// by GOARCH: the toolkit's target directory (x86_64-linux; sbsa-linux on
// servers such as Grace Hopper and Grace Blackwell, aarch64-linux on
// Jetson), the distribution's multiarch directory and the driver's
// directories in it (nvidia/, Jetson's tegra/). Another architecture's
// (a cross toolkit's targets) are left out: their libraries cannot be
// probed here.
var archDirs = map[string][]string{
	"amd64": {
		"/usr/local/cuda/targets/x86_64-linux/lib", "/usr/local/cuda-*/targets/x86_64-linux/lib",
		"/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu/nvidia",
	},
	"arm64": {
		"/usr/local/cuda/targets/sbsa-linux/lib", "/usr/local/cuda-*/targets/sbsa-linux/lib",
		"/usr/local/cuda/targets/aarch64-linux/lib", "/usr/local/cuda-*/targets/aarch64-linux/lib",
		"/usr/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu/nvidia", "/usr/lib/aarch64-linux-gnu/tegra",
	},
}

// searchDirs is SearchDirs for the architecture goarch, its system
// directories under root ("" for the host's).
func searchDirs(root, goarch string) []string {
	home, _ := os.UserHomeDir()
	var patterns []string
	for _, p := range append(append([]string{"/usr/local/cuda/lib64", "/usr/local/cuda-*/lib64"}, archDirs[goarch]...),
		"/usr/lib64", "/usr/lib", "/opt/conda/lib", "/opt/conda/envs/*/lib") {
		patterns = append(patterns, root+p)
	}
	patterns = append(patterns,
		filepath.Join(home, "miniconda3/lib"), filepath.Join(home, "anaconda3/lib"),
		filepath.Join(home, "miniconda3/envs/*/lib"),
	)
	for _, env := range []string{"CONDA_PREFIX", "VIRTUAL_ENV", "CUDA_HOME", "CUDA_PATH"} {
		if v := os.Getenv(env); v != "" {
			patterns = append(patterns, filepath.Join(v, "lib"), filepath.Join(v, "lib64"),
				filepath.Join(v, "lib/python3*/site-packages/nvidia/*/lib"))
		}
	}
	for _, sp := range []string{
		root + "/usr/lib/python3*/dist-packages", root + "/usr/local/lib/python3*/dist-packages",
		root + "/usr/lib/python3*/site-packages", root + "/usr/local/lib/python3*/site-packages",
		root + "/opt/conda/lib/python3*/site-packages", root + "/opt/conda/envs/*/lib/python3*/site-packages",
		filepath.Join(home, ".local/lib/python3*/site-packages"),
		filepath.Join(home, ".pyenv/versions/*/lib/python3*/site-packages"),
		filepath.Join(home, "*/lib/python3*/site-packages"), // virtualenvs kept in $HOME
	} {
		patterns = append(patterns, filepath.Join(sp, "nvidia/*/lib"), filepath.Join(sp, "torch/lib"))
	}
	var out []string
	seen := map[string]bool{}
	for _, p := range patterns {
		matches, _ := filepath.Glob(p)
		sort.Strings(matches)
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && fi.IsDir() && !seen[m] {
				seen[m] = true
				out = append(out, m)
			}
		}
	}
	return out
}

// hostMachine is the ELF machine of the programs this architecture runs.
var hostMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH]

// otherMachine reports whether path is an ELF file built for another
// architecture than this one's (a cross toolkit's library, an x86-64
// wheel on arm64): its functions cannot be probed here. A file that is
// not ELF, or cannot be read, is not known to be.
func otherMachine(path string) bool {
	f, err := proc.OpenELF(path, nil)
	if err != nil {
		return false
	}
	defer f.Close()
	return hostMachine != elf.EM_NONE && f.Machine != hostMachine
}

// FromSystem finds CUDA libraries installed on the host: in the ld.so cache
// and in SearchDirs. It also returns where it looked, for the error a user
// sees when nothing is found.
func FromSystem() (found, searched []string) {
	seen := map[string]bool{}
	add := func(p string) {
		if r, err := filepath.EvalSymlinks(p); err == nil && !seen[r] {
			seen[r] = true
			if !otherMachine(r) {
				found = append(found, r)
			}
		}
	}
	if out, err := exec.Command("ldconfig", "-p").Output(); err == nil {
		searched = append(searched, "ld.so cache (ldconfig -p)")
		for _, p := range parseLdconfig(out) {
			if IsCUDALibrary(p) {
				add(p)
			}
		}
	}
	for _, dir := range SearchDirs() {
		searched = append(searched, dir)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if IsCUDALibrary(e.Name()) {
				add(filepath.Join(dir, e.Name()))
			}
		}
	}
	return found, searched
}

// parseLdconfig extracts library paths from `ldconfig -p` output:
//
//	libcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
func parseLdconfig(out []byte) []string {
	var paths []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if _, p, ok := strings.Cut(sc.Text(), " => "); ok {
			paths = append(paths, strings.TrimSpace(p))
		}
	}
	return paths
}

// ExportsCUDA reports whether the ELF file at path defines one of the
// functions the attach tables probe: a program with the CUDA runtime linked
// statically is probed like libcudart itself. Unreadable or non-ELF files
// define nothing.
func ExportsCUDA(path string) bool {
	fns, err := ProbedFunctions(path)
	return err == nil && len(fns) > 0
}

// ProbedFunctions returns the file offset of each function of the attach
// tables the ELF file at path defines (in .symtab or .dynsym), what a
// uprobe attaches to. A function only imported (undefined: a runtime calls
// the driver) is not defined there. The file is opened through
// proc.OpenELF: never blocking, only a regular file.
func ProbedFunctions(path string) (map[string]uint64, error) {
	f, err := proc.OpenELF(path, nil)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	want := map[string]bool{}
	for _, t := range Tables {
		for _, p := range t.Probes {
			want[p.Symbol] = true
		}
	}
	for _, p := range LearnProbes {
		want[p.Symbol] = true
	}
	out := map[string]uint64{}
	for _, get := range []func() ([]elf.Symbol, error){f.Symbols, f.DynamicSymbols} {
		syms, _ := get() // a file without one of the tables has the other
		for _, s := range syms {
			if !want[s.Name] || s.Section == elf.SHN_UNDEF || s.Value == 0 || elf.ST_TYPE(s.Info) != elf.STT_FUNC {
				continue
			}
			// The offset in the file of the address: through the
			// executable segment that maps it.
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_LOAD && prog.Flags&elf.PF_X != 0 &&
					prog.Vaddr <= s.Value && s.Value < prog.Vaddr+prog.Memsz {
					out[s.Name] = s.Value - prog.Vaddr + prog.Off
					break
				}
			}
		}
	}
	return out, nil
}
