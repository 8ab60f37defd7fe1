package pystack

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
)

// Builds of 3.10 to 3.12 without DWARF (Debian's and Ubuntu's system
// pythons, NVIDIA's PyTorch containers, conda, python-build-standalone)
// take their offsets from their version's table (versions; the figures
// in tables.go, generated): one table per minor version, as py-spy keeps
// one binding per minor for all its patch releases. The structures the walks read are not part of the stable ABI,
// but CPython leaves them alone within a minor version once it is
// released. Evidence, for the fields read here:
//
//   - tables.go's figures are the DWARF offsets of pyenv's 3.10.13,
//     3.11.7 and 3.12.1 builds (TestOffsetTables regenerates them and
//     fails when an installed pyenv build's DWARF says otherwise).
//   - py-spy's bindgen bindings of 3.10.0rc1, 3.11.0 and 3.12.0
//     (src/python_bindings/v3_1x_0.rs; they carry no layout tests, so
//     their offsets were taken with Rust's offset_of! on those
//     structures) give the same figure for every field but two: 3.11's
//     _PyRuntime is opaque there, so 3.11's interpreters.head is only
//     py-spy's pyruntime::get_interp_head_offset (40, as for 3.12; 32
//     for 3.10, both equal to the table's), and 3.11's main_thread (which
//     the walks use on 3.10 only) is unchecked.
//   - Debian 12's /usr/bin/python3.11 (3.11.2, built statically, with
//     other compiler options) reads exact stacks with the 3.11 table
//     (TestStackWithoutDWARF), as do pyenv's builds with their
//     libpython stripped (that test and vmtest's
//     TestPythonFramesWithoutDWARF).
//
// The figures hold for arm64 too: both are LP64 with the same alignment,
// and no structure read has a field before the ones read whose size
// differs between them (pthread_mutex_t, 40 bytes on x86-64 and 48 on
// arm64, lies in _PyRuntime past interpreters.head). Debian 12's arm64
// /usr/bin/python3.11 reads exact stacks with the 3.11 table (vmtest's
// TestKernels, arm64).
//
// What the table cannot describe is refused: other architectures, debug builds (Py_DEBUG changes PyObject's
// header with Py_TRACE_REFS) and pre-releases (alphas and betas change
// the structures).

// tableOffsets are the offsets of a build without DWARF from its minor
// version's table, or why there is none for it.
func tableOffsets(f *elf.File, syms []elf.Symbol, minor int) (offsets, error) {
	var o offsets
	v := versions[minor]
	switch {
	case v.debug != nil:
		return o, errors.New("its _Py_DebugOffsets are not the layout read here (free-threaded builds are not read)")
	case v.table == nil:
		return o, fmt.Errorf("no built-in offsets for CPython 3.%d", minor)
	}
	o = *v.table
	if f.Machine != elf.EM_X86_64 && f.Machine != elf.EM_AARCH64 || f.Class != elf.ELFCLASS64 {
		return o, fmt.Errorf("the built-in offsets are x86-64's and arm64's, not %v's", f.Machine)
	}
	for _, s := range syms {
		// _Py_NegativeRefcount is Py_REF_DEBUG's (implied by Py_DEBUG),
		// _Py_ForgetReference Py_TRACE_REFS'.
		if s.Section != elf.SHN_UNDEF && (s.Name == "_Py_NegativeRefcount" || s.Name == "_Py_ForgetReference") {
			return o, errors.New("a debug build (Py_DEBUG): the built-in offsets are release builds'")
		}
	}
	if v := buildVersion(f, syms, minor); pyPrerelease.MatchString(v) {
		return o, fmt.Errorf("CPython %s is a pre-release: the built-in offsets are releases'", v)
	}
	return o, nil
}

var pyPrerelease = regexp.MustCompile(`^3\.\d+\.\d+[ab]\d+`)

// buildVersion is the build's PY_VERSION ("3.11.2", "3.12.0b4"), "" when
// it cannot be told. 3.11 and later export it as Py_Version
// (PY_VERSION_HEX); 3.10 has only the string in its read-only data, the
// one Py_GetVersion formats, possibly the tail of another string (the
// linker merges "3.10.13" into "/root/.pyenv/versions/3.10.13").
func buildVersion(f *elf.File, syms []elf.Symbol, minor int) string {
	for _, s := range syms {
		if s.Name != "Py_Version" || s.Section == elf.SHN_UNDEF || s.Size != 8 {
			continue
		}
		var b [8]byte
		if !readVaddr(f, s.Value, b[:]) {
			break
		}
		hex := binary.LittleEndian.Uint64(b[:])
		v := fmt.Sprintf("%d.%d.%d", hex>>24&0xff, hex>>16&0xff, hex>>8&0xff)
		if level := map[uint64]string{0xa: "a", 0xb: "b", 0xc: "rc"}[hex>>4&0xf]; level != "" {
			v += fmt.Sprintf("%s%d", level, hex&0xf)
		}
		return v
	}
	sec := f.Section(".rodata")
	if sec == nil {
		return ""
	}
	data, err := sec.Data()
	if err != nil {
		return ""
	}
	// "3.M." preceded by neither a digit nor a dot, then the rest of the
	// string: a patch number, a pre-release tag, a '+'. A scan with
	// bytes.Index: a regexp over the few MiB of .rodata took 50 ms.
	pre := []byte(fmt.Sprintf("3.%d.", minor))
	found := ""
	for i := 0; ; {
		j := bytes.Index(data[i:], pre)
		if j < 0 {
			return found
		}
		start := i + j
		i = start + len(pre)
		if start > 0 && (data[start-1] >= '0' && data[start-1] <= '9' || data[start-1] == '.') {
			continue
		}
		end := bytes.IndexByte(data[start:], 0)
		if end < 0 {
			return found
		}
		v := string(data[start : start+end])
		if !pyVersionString.MatchString(v) {
			continue
		}
		if found == "" {
			found = v
		} else if v != found {
			return "" // two versions: neither is surely PY_VERSION
		}
	}
}

var pyVersionString = regexp.MustCompile(`^3\.\d+\.\d+(?:(?:a|b|rc)\d+)?\+?$`)

// readVaddr reads b from the file's initialized data at virtual address
// addr.
func readVaddr(f *elf.File, addr uint64, b []byte) bool {
	for _, sec := range f.Sections {
		if sec.Type == elf.SHT_PROGBITS && addr >= sec.Addr && addr+uint64(len(b)) <= sec.Addr+sec.Size {
			_, err := sec.ReadAt(b, int64(addr-sec.Addr))
			return err == nil
		}
	}
	return false
}
