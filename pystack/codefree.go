package pystack

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cudatrace/cudatrace/bpf"
)

// Code objects freed, counted for CPython 3.10 to 3.13. BPF takes a
// frame's code object as the one it checked at that address before,
// without reading its identity again, while nothing in the process freed
// a code object since (bpf/pycode.h py_check): a new one can be made at a
// freed one's address (CPython's allocator does so at once). 3.14 on count
// their frees themselves (_code_object_generation); for the older ones
// BPF counts them, with a probe at the entry of their code_dealloc (bpf/
// python.h ct_code_free), which every code object's free goes through:
// it is PyCode_Type's tp_dealloc, called through that pointer by
// Py_DECREF, whoever made the object. Without the probe BPF reads each
// frame's identity at every record (some 140 ns a frame on the machine
// this was written on).

// tpDeallocOffset is where PyTypeObject holds tp_dealloc in a 64-bit
// build with the GIL: after PyObject_VAR_HEAD (ob_refcnt, ob_type,
// ob_size), tp_name, tp_basicsize and tp_itemsize, eight bytes each, in
// every version read here (Include/cpython/object.h).
const tpDeallocOffset = 48

// Relocation types that put an address in a word: x86-64's and arm64's
// relative one (the load bias plus the addend) and absolute one (a
// symbol's value plus the addend).
const (
	rX8664Relative   = 8    // R_X86_64_RELATIVE
	rX8664Abs64      = 1    // R_X86_64_64
	rAArch64Relative = 1027 // R_AARCH64_RELATIVE
	rAArch64Abs64    = 257  // R_AARCH64_ABS64
)

// codeFreeSite finds code_dealloc in the interpreter file f, whose
// PyCode_Type is at codeType (a virtual address of the file), and returns
// its offset in the file, where a uprobe is put. tp_dealloc's word holds
// its address: in the file's data in an executable built at a fixed
// address (Debian's python3.X) or with packed relative relocations
// (DT_RELR), else given by a relocation (a position-independent
// executable, a libpython). It must be in the file's code; where syms
// (the symbols read already: the full table is not read for this) name
// code_dealloc, it must be that.
func codeFreeSite(f *elf.File, codeType uint64, syms []elf.Symbol) (uint64, error) {
	if codeType == 0 {
		return 0, errors.New("no PyCode_Type symbol")
	}
	slot := codeType + tpDeallocOffset
	target, err := relocated(f, slot)
	if err != nil {
		return 0, err
	}
	if target == 0 {
		if target, err = dataWord(f, slot); err != nil {
			return 0, err
		}
	}
	for _, s := range syms {
		if s.Name == "code_dealloc" && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 && s.Value != target {
			return 0, fmt.Errorf("PyCode_Type's tp_dealloc is %#x, not code_dealloc (%#x)", target, s.Value)
		}
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && p.Vaddr <= target && target < p.Vaddr+p.Filesz {
			return target - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("PyCode_Type's tp_dealloc %#x is in no executable segment", target)
}

// relocated returns the address a dynamic relocation puts in the word at
// addr (0: none does).
func relocated(f *elf.File, addr uint64) (uint64, error) {
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB {
		return 0, errors.New("not a 64-bit little-endian file")
	}
	var dynsyms []elf.Symbol
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_RELA {
			continue
		}
		b, err := sec.Data()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", sec.Name, err)
		}
		for i := 0; i+24 <= len(b); i += 24 {
			if binary.LittleEndian.Uint64(b[i:]) != addr {
				continue
			}
			info := binary.LittleEndian.Uint64(b[i+8:])
			addend := binary.LittleEndian.Uint64(b[i+16:])
			switch typ, sym := uint32(info), uint32(info>>32); {
			case typ == rX8664Relative && f.Machine == elf.EM_X86_64, typ == rAArch64Relative && f.Machine == elf.EM_AARCH64:
				return addend, nil
			case typ == rX8664Abs64 && f.Machine == elf.EM_X86_64, typ == rAArch64Abs64 && f.Machine == elf.EM_AARCH64:
				if dynsyms == nil {
					if dynsyms, err = f.DynamicSymbols(); err != nil {
						return 0, fmt.Errorf("its dynamic symbols: %w", err)
					}
				}
				// DynamicSymbols leaves out the null symbol at index 0.
				if sym == 0 || int(sym) > len(dynsyms) || dynsyms[sym-1].Section == elf.SHN_UNDEF {
					return 0, fmt.Errorf("the relocation of %#x names a symbol not in the file", addr)
				}
				return dynsyms[sym-1].Value + addend, nil
			default:
				return 0, fmt.Errorf("the relocation of %#x is of type %d", addr, typ)
			}
		}
	}
	return 0, nil
}

// dataWord reads the 8 bytes at addr from the file's data.
func dataWord(f *elf.File, addr uint64) (uint64, error) {
	for _, sec := range f.Sections {
		if sec.Type == elf.SHT_PROGBITS && sec.Addr <= addr && addr+8 <= sec.Addr+sec.Size {
			var w [8]byte
			if _, err := sec.ReadAt(w[:], int64(addr-sec.Addr)); err != nil {
				return 0, fmt.Errorf("%s: %w", sec.Name, err)
			}
			return binary.LittleEndian.Uint64(w[:]), nil
		}
	}
	return 0, fmt.Errorf("PyCode_Type's tp_dealloc %#x is in no section with data", addr)
}

// CodeFreeSite is where, in the file at Path, code_dealloc begins (a file
// offset): a probe there counts the process's code objects freed (see
// above), for CPython 3.10 to 3.13; ok is false where the file was not
// read for it or it was not found (each frame's identity is read at every
// record, as without the probe), and for 3.14 on, which count them.
func (in *Interp) CodeFreeSite() (off uint64, ok bool) {
	return in.codeFree, in.codeFree != 0
}

// CountedFrees marks layout o (BPF, BPFFile) as one whose process's code
// object frees BPF counts (ct_code_free, attached at CodeFreeSite), for a
// version without a count of its own; it says whether it did.
func CountedFrees(o *bpf.CudatraceCtPyoffsets) bool {
	if o.InterpCodeGen >= 0 || o.Minor >= 14 {
		return false
	}
	o.InterpCodeGen = GenFrees
	return true
}

// GenFrees is CT_PY_GEN_FREES (bpf/cudatrace.h): the layout's
// InterpCodeGen (ct_pyoffsets's interp_code_gen) for a process whose code
// object frees ct_code_free counts (CountedFrees).
const GenFrees = -2
