package proc

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"
)

// A process that renames itself the way setproctitle does (Ray's
// workers, PostgreSQL, many daemons: py-setproctitle's spt_status.c, the
// "clobber argv" mode on Linux) first copies its environment's strings
// to its heap and points libc's environ at an array of the copies, then
// writes its title over the one contiguous area the kernel laid argv and
// the environment out in, padding the rest of it with NULs. From then on
// the area stat's env_start and env_end bound holds no NAME=value string
// (and /proc/PID/cmdline shows the title); the environment the process
// started with lives on in those copies, found from libc's environ.

// clobbered reports whether b, the memory between a process's env_start
// and env_end, was written over since exec laid it out: exec leaves
// NAME=value strings, each ending in one NUL, back to back, so an area
// that starts with a NUL, holds an empty string or holds no NAME=value
// string at all (a title, NUL padding) is no longer the environment. An
// empty area (a process started with none) is not.
func clobbered(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	return b[0] == 0 || bytes.Contains(b, []byte{0, 0}) || len(splitEnviron(b)) == 0
}

// Bounds of the read of libc's environment: the array of pointers, the
// strings together and each string. They are well above any real
// environment (a few KiB, a Kubernetes pod's some tens) and keep a
// process that points environ at garbage from making the tracer read
// much of it.
const (
	maxLibcEnvEntries = 4096
	maxLibcEnvBytes   = 1 << 20
	maxLibcEnvString  = 128 << 10
)

// libcEnviron reads the environment process pid's C library holds now:
// the NULL-terminated array its environ variable points at, and each
// NAME=value string that array points at, all with process_vm_readv (no
// more privilege than Environ). The variable is found as the process's
// dynamic linker found it: the executable's own copy where it defines one
// (a copy relocation: Debian's python3.11 has one, and libc's own then
// stays unused), else the C library's (glibc's libc.so.6, musl's
// ld-musl-*.so.1), at its load bias. A statically linked program has no
// dynamic symbol to find it by: an error.
func libcEnviron(pid int) ([]string, error) {
	maps, err := ReadMaps(pid)
	if err != nil {
		return nil, err
	}
	addr, err := environAddr(pid, maps)
	if err != nil {
		return nil, err
	}
	mem := OpenMem(pid)
	var word [8]byte
	if err := mem.ReadAt(word[:], addr); err != nil {
		return nil, fmt.Errorf("libc's environ: %w", err)
	}
	arr := nativeWord(word[:])
	if arr == 0 {
		return nil, fmt.Errorf("pid %d: libc's environ is NULL", pid)
	}
	ptrs, err := readPointers(mem, arr, maxLibcEnvEntries)
	if err != nil {
		return nil, fmt.Errorf("libc's environ array at %#x: %w", arr, err)
	}
	var out []string
	budget := maxLibcEnvBytes
	for _, p := range ptrs {
		s, err := readCString(mem, p, min(budget, maxLibcEnvString))
		if err != nil {
			continue // one bad entry: the others still name the job
		}
		budget -= len(s) + 1
		if i := strings.IndexByte(s, '='); i > 0 {
			out = append(out, s)
		}
		if budget <= 0 {
			break
		}
	}
	return out, nil
}

// nativeWord is a 64-bit word of a traced process (amd64 and arm64 are
// both little-endian).
func nativeWord(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// readPointers reads the NULL-terminated array of pointers at addr, at
// most limit of them, a page at a time (a read past the page the array
// ends in could fail on what is not mapped).
func readPointers(mem Mem, addr uint64, limit int) ([]uint64, error) {
	var out []uint64
	buf := make([]byte, pageSize)
	for len(out) < limit {
		n := pageSize - int(addr%uint64(pageSize))
		n -= n % 8
		if n == 0 { // a misaligned array straddling a page: read one word
			n = 8
		}
		if err := mem.ReadAt(buf[:n], addr); err != nil {
			return nil, err
		}
		for i := 0; i+8 <= n; i += 8 {
			p := nativeWord(buf[i : i+8])
			if p == 0 {
				return out, nil
			}
			if len(out) == limit {
				break
			}
			out = append(out, p)
		}
		addr += uint64(n)
	}
	return nil, fmt.Errorf("no NULL in its first %d entries", limit)
}

// readCString reads the NUL-terminated string at addr, of at most limit
// bytes, never reading past the page it ends in.
func readCString(mem Mem, addr uint64, limit int) (string, error) {
	var out []byte
	start := addr
	buf := make([]byte, pageSize)
	for len(out) <= limit {
		n := pageSize - int(addr%uint64(pageSize))
		if err := mem.ReadAt(buf[:n], addr); err != nil {
			return "", err
		}
		if i := bytes.IndexByte(buf[:n], 0); i >= 0 {
			out = append(out, buf[:i]...)
			if len(out) > limit {
				break
			}
			return string(out), nil
		}
		out = append(out, buf[:n]...)
		addr += uint64(n)
	}
	return "", fmt.Errorf("string at %#x: longer than %d bytes", start, limit)
}

var pageSize = os.Getpagesize()

// environNames are the names libc's environment variable has in a
// dynamic symbol table (glibc and musl alias all three).
var environNames = []string{"__environ", "environ", "_environ"}

// libcFile matches the C library's file name: glibc's libc.so.6 (and
// older libc-2.NN.so), musl's ld-musl-ARCH.so.1 (its loader and libc in
// one) and Alpine's libc.musl-ARCH.so.1.
var libcFile = regexp.MustCompile(`^(libc\.so(\.6)?|libc-2\.[0-9]+\.so|ld-musl-[a-z0-9_]+\.so\.1|libc\.musl-[a-z0-9_]+\.so\.1)$`)

// environAddr returns where in process pid (its mappings maps) the
// environ variable its code uses lies: the executable's definition first,
// as symbol lookup goes, then the C library's.
func environAddr(pid int, maps []Mapping) (uint64, error) {
	var exe, libc *Mapping
	var exeSt unix.Stat_t
	haveExe := unix.Stat(filepath.Join(Root, fmt.Sprint(pid), "exe"), &exeSt) == nil
	for i := range maps {
		m := &maps[i]
		if !m.File() {
			continue
		}
		// Each object's first mapping listed (loadBias looks at them all).
		if exe == nil && haveExe && m.Inode == exeSt.Ino {
			exe = m
		}
		if libc == nil && libcFile.MatchString(filepath.Base(m.Path)) {
			libc = m
		}
	}
	var errs []error
	for _, m := range []*Mapping{exe, libc} {
		if m == nil {
			continue
		}
		addr, err := symbolAddr(pid, *m, maps, environNames)
		if err == nil {
			return addr, nil
		}
		errs = append(errs, err)
	}
	if libc == nil {
		errs = append(errs, fmt.Errorf("pid %d maps no C library (a static program?)", pid))
	}
	return 0, fmt.Errorf("libc's environ not found: %w", errors.Join(errs...))
}

// maxDynsym bounds the dynamic symbol table (and its strings) read from a
// file a process maps: libc's is some 100 KiB.
const maxDynsym = 32 << 20

// symbolAddr returns the address in process pid of the first of names
// that the object mapping m maps (maps: all the process's mappings)
// defines as a dynamic symbol: its value moved by the object's load bias.
func symbolAddr(pid int, m Mapping, maps []Mapping, names []string) (uint64, error) {
	f, err := OpenMapping(pid, m) // the one way a traced process's files are opened (open.go)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	ef, err := elf.NewFile(f)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", m.Path, err)
	}
	if ef.Class != elf.ELFCLASS64 || ef.ByteOrder.String() != "LittleEndian" {
		return 0, fmt.Errorf("%s: not a 64-bit little-endian object", m.Path)
	}
	for _, s := range ef.Sections {
		if (s.Type == elf.SHT_DYNSYM || s.Type == elf.SHT_STRTAB) && s.Size > maxDynsym {
			return 0, fmt.Errorf("%s: a section of %d bytes: not read", m.Path, s.Size)
		}
	}
	syms, err := ef.DynamicSymbols()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", m.Path, err)
	}
	bias, ok := loadBias(ef, pid, m, maps)
	if !ok {
		return 0, fmt.Errorf("%s: no load segment matches its mappings", m.Path)
	}
	for _, name := range names {
		for _, s := range syms {
			if s.Name == name && s.Section != elf.SHN_UNDEF && s.Value != 0 && elf.ST_TYPE(s.Info) == elf.STT_OBJECT {
				return bias + s.Value, nil
			}
		}
	}
	return 0, fmt.Errorf("%s defines none of %s", m.Path, strings.Join(names, ", "))
}

// loadBias returns what the object that mapping m maps was moved by: the
// address one of its mappings starts at less the address its load
// segment gives that page (p_vaddr and p_offset are congruent modulo the
// page size, so the mapping of file offset off lies at bias + p_vaddr +
// off - p_offset).
func loadBias(ef *elf.File, pid int, m Mapping, maps []Mapping) (uint64, bool) {
	for _, mm := range maps {
		if mm.Inode != m.Inode || mm.Dev != m.Dev || mm.Path != m.Path {
			continue
		}
		for _, p := range ef.Progs {
			if p.Type != elf.PT_LOAD || p.Filesz == 0 {
				continue
			}
			lo := p.Off &^ uint64(pageSize-1)
			if mm.Offset < lo || mm.Offset >= p.Off+p.Filesz {
				continue
			}
			return mm.Start - mm.Offset - (p.Vaddr - p.Off), true
		}
	}
	return 0, false
}
