package loader

import (
	"debug/elf"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/cilium/ebpf/link"

	"github.com/cudatrace/cudatrace/proc"
)

// The dynamic loader's notification point (bpf/notify.h ct_dl_notify):
// glibc's and musl's ld.so call _dl_debug_state before and after each
// change to the list of objects a process has mapped, as debuggers expect
// (the r_brk of struct r_debug). A uprobe there tells the reader the
// moment a traced process has mapped a library, so a CUDA library it
// dlopens is attached then rather than at the next scan of its mappings,
// and its interpreter is found before its first allocation.

// loaderPattern matches the file names of dynamic loaders: glibc's
// (ld-linux-x86-64.so.2, ld-linux-aarch64.so.1, ld-2.31.so) and musl's
// (ld-musl-x86_64.so.1).
var loaderPattern = regexp.MustCompile(`^ld-(linux|musl)[-_a-z0-9.]*\.so(\.\d+)*$|^ld-\d+\.\d+\.so$`)

// IsDynamicLoader reports whether a path names a dynamic loader.
func IsDynamicLoader(path string) bool { return loaderPattern.MatchString(filepath.Base(path)) }

// rStateOffset is the offset of r_state in struct r_debug (<link.h>) on
// the 64-bit targets: int r_version, then the r_map and r_brk pointers.
const rStateOffset = 24

// LoaderIn returns the path (one the tracer can open: proc.FilePath) of
// the dynamic loader among process pid's mappings; "" for a static
// program.
func LoaderIn(pid int, maps []proc.Mapping) string {
	if m := LoaderMapping(maps); m != nil {
		return proc.FilePath(pid, *m, maps)
	}
	return ""
}

// LoaderMapping returns the executable mapping of the dynamic loader
// among maps; nil for a static program.
func LoaderMapping(maps []proc.Mapping) *proc.Mapping {
	for i := range maps {
		if m := &maps[i]; m.File() && m.Exec() && IsDynamicLoader(m.Path) {
			return m
		}
	}
	return nil
}

// HasLoader says whether ct_dl_notify is attached to the loader file id
// (not while an attach of it is under way).
func (t *Tracer) HasLoader(id proc.FileID) bool { return t.ldProbes.ready(id) }

// ForgetLoader ends ct_dl_notify's probe on the loader file id, when end
// is called (fileProbes.forget: off the reader's goroutine); a later
// AttachLoader attaches it anew, and a refusal is forgotten too. The
// caller knows that no process maps it.
func (t *Tracer) ForgetLoader(id proc.FileID) (end func()) { return t.ldProbes.forget(id) }

// SystemLoader returns the host's dynamic loader: the interpreter
// /bin/sh names (PT_INTERP), what the host's dynamically linked programs
// run under; "" when it cannot be told.
func SystemLoader() string {
	f, err := proc.OpenELF("/bin/sh", nil)
	if err != nil {
		return ""
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return ""
		}
		path, err := filepath.EvalSymlinks(strings.TrimRight(string(b), "\x00"))
		if err != nil {
			return ""
		}
		return path
	}
	return ""
}

// notifySite finds _dl_debug_state in the ld.so at path, and the cookie
// ct_dl_notify reads r_state with: the byte offset from it to
// _r_debug.r_state (0 where the file names no _r_debug: musl's).
func notifySite(path string) (off, cookie uint64, err error) {
	f, err := proc.OpenELF(path, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("read %s as an ELF file: %w", path, err)
	}
	defer f.Close()
	return notifySiteOf(f.File, path)
}

// notifySiteOf is notifySite of the ELF file f, at path.
func notifySiteOf(f *elf.File, path string) (off, cookie uint64, err error) {
	var state, rdebug *elf.Symbol
	for _, get := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		syms, _ := get()
		for i := range syms {
			s := &syms[i]
			if s.Section == elf.SHN_UNDEF || s.Value == 0 {
				continue
			}
			switch s.Name {
			case "_dl_debug_state":
				if state == nil && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
					state = s
				}
			case "_r_debug":
				if rdebug == nil {
					rdebug = s
				}
			}
		}
	}
	if state == nil {
		return 0, 0, fmt.Errorf("%s: no _dl_debug_state: not a dynamic loader cudatrace knows", path)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_LOAD && prog.Flags&elf.PF_X != 0 && prog.Vaddr <= state.Value && state.Value < prog.Vaddr+prog.Memsz {
			off = state.Value - prog.Vaddr + prog.Off
			break
		}
	}
	if off == 0 {
		return 0, 0, fmt.Errorf("%s: _dl_debug_state at %#x is in no executable segment", path, state.Value)
	}
	if rdebug != nil {
		cookie = uint64(int64(rdebug.Value+rStateOffset) - int64(state.Value))
	}
	return off, cookie, nil
}

// AttachLoader attaches ct_dl_notify to the dynamic loader at path, once
// per file (inode): a second call, on any goroutine, has the first's
// answer, once it is in. It says whether it attached now. With the PID
// filter the program makes records of traced processes only; without it,
// of any process, at most one every few milliseconds each (bpf/notify.h).
func (t *Tracer) AttachLoader(path string) (bool, error) {
	if path == "" {
		return false, nil
	}
	var probe Libraries
	if _, err := probe.Add(path); err != nil {
		return false, err
	}
	return t.AttachLoaderFile(probe.List()[0])
}

// AttachLoaderFile is AttachLoader of a loader whose file was read
// already (Libraries.AddLib): the probe goes on that file (device and
// inode) or on none, whatever its path names by now. A caller that keeps
// the file's ID (record's probed files) so probes the file it keeps: its
// path stat'ed again could name another by then.
func (t *Tracer) AttachLoaderFile(lib Library) (bool, error) {
	return t.ldProbes.attach(proc.FileID{Dev: lib.Dev, Ino: lib.Inode}, func() ([]link.Link, error) { return t.attachLoader(lib) })
}

// attachLoader attaches ct_dl_notify to the notification point of the
// loader lib. Its file is opened once, through proc.Open, and only if it
// is still the one Libraries.Add saw: read and attached through that
// descriptor (/proc/self/fd/N), never through its path again (a
// process's loader is its file: another user's may be anything by now).
func (t *Tracer) attachLoader(lib Library) ([]link.Link, error) {
	f, err := proc.OpenELF(lib.Path, &proc.FileID{Dev: lib.Dev, Ino: lib.Inode})
	if err != nil {
		return nil, fmt.Errorf("read %s as an ELF file: %w", lib.Path, err)
	}
	defer f.Close()
	off, cookie, err := notifySiteOf(f.File, lib.Path)
	if err != nil {
		return nil, err
	}
	ex, err := link.OpenExecutable(proc.FDPath(f.OS()))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", lib.Path, err)
	}
	added, err := t.attach(ex, []site{{name: "_dl_debug_state", prog: t.objs.CtDlNotify, addr: off, cookie: cookie}})
	if err != nil {
		return nil, fmt.Errorf("attach to %s's _dl_debug_state: %w", lib.Path, err)
	}
	return added, nil
}
