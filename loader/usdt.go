package loader

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// USDTProbe is one statically defined tracepoint site (sys/sdt.h), read
// from an ELF file's .note.stapsdt section.
type USDTProbe struct {
	Provider, Name string
	// Offset is the probe site's file offset, what a uprobe attaches to.
	Offset uint64
	// Semaphore is the file offset of the probe's semaphore, 0 when it has
	// none. The kernel increments it while a uprobe is attached, which is
	// what turns on a guarded probe (PyTorch's are).
	Semaphore uint64
	Args      []USDTArg
}

// USDTArgKind says where an argument lives.
type USDTArgKind uint8

// Argument locations, as bpf/cudatrace.h's enum ct_usdt_arg_kind.
const (
	USDTConst USDTArgKind = 1 // a constant: Value
	USDTReg   USDTArgKind = 2 // a register: RegOff
	USDTMem   USDTArgKind = 3 // memory at a register plus Value
)

// USDTArg is where one argument is and how wide.
type USDTArg struct {
	Kind   USDTArgKind
	Size   int8   // bytes; negative when signed
	RegOff uint16 // offset of the register in struct pt_regs (x86-64)
	Value  int64  // the constant, or the displacement
}

// ReadUSDT lists the USDT probes of the ELF file at path; a file without
// notes has none.
func ReadUSDT(path string) ([]USDTProbe, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("usdt: %w", err)
	}
	defer f.Close()
	sec := f.Section(".note.stapsdt")
	if sec == nil {
		return nil, nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("usdt: %s: read .note.stapsdt: %w", path, err)
	}
	// Prelinking may move the file after the notes were written:
	// .stapsdt.base says where the notes think it is.
	var baseAddr uint64
	if b := f.Section(".stapsdt.base"); b != nil {
		baseAddr = b.Addr
	}
	var out []USDTProbe
	for len(data) >= 12 {
		namesz := binary.LittleEndian.Uint32(data[0:])
		descsz := binary.LittleEndian.Uint32(data[4:])
		typ := binary.LittleEndian.Uint32(data[8:])
		nameEnd := 12 + align4(uint64(namesz))
		descEnd := nameEnd + align4(uint64(descsz))
		if uint64(len(data)) < descEnd || uint64(len(data)) < nameEnd+uint64(descsz) {
			return nil, fmt.Errorf("usdt: %s: truncated note", path)
		}
		name := string(bytes.TrimRight(data[12:12+namesz], "\x00"))
		desc := data[nameEnd : nameEnd+uint64(descsz)]
		data = data[descEnd:]
		if name != "stapsdt" || typ != 3 || len(desc) < 24 {
			continue
		}
		pc := binary.LittleEndian.Uint64(desc[0:])
		base := binary.LittleEndian.Uint64(desc[8:])
		sem := binary.LittleEndian.Uint64(desc[16:])
		strs := strings.SplitN(string(desc[24:]), "\x00", 4)
		if len(strs) < 3 {
			return nil, fmt.Errorf("usdt: %s: malformed note at %#x", path, pc)
		}
		if baseAddr != 0 && base != 0 {
			pc += baseAddr - base
			if sem != 0 {
				sem += baseAddr - base
			}
		}
		p := USDTProbe{Provider: strs[0], Name: strs[1]}
		if p.Offset, err = fileOffset(f, pc); err != nil {
			return nil, fmt.Errorf("usdt: %s: %s:%s: %w", path, p.Provider, p.Name, err)
		}
		if sem != 0 {
			if p.Semaphore, err = fileOffset(f, sem); err != nil {
				return nil, fmt.Errorf("usdt: %s: %s:%s semaphore: %w", path, p.Provider, p.Name, err)
			}
		}
		if p.Args, err = parseUSDTArgs(strs[2]); err != nil {
			return nil, fmt.Errorf("usdt: %s: %s:%s: %w", path, p.Provider, p.Name, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

// fileOffset turns a virtual address of the file into its offset in the
// file, through the loadable segment that holds it.
func fileOffset(f *elf.File, vaddr uint64) (uint64, error) {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && vaddr >= p.Vaddr && vaddr < p.Vaddr+p.Memsz {
			return vaddr - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("address %#x is in no loadable segment", vaddr)
}

// ptRegs are the offsets of x86-64's struct pt_regs fields, by every name
// the assembler gives a register or its lower part.
var ptRegs = func() map[string]uint16 {
	m := map[string]uint16{}
	add := func(off uint16, names ...string) {
		for _, n := range names {
			m[n] = off
		}
	}
	add(0, "r15", "r15d", "r15w", "r15b")
	add(8, "r14", "r14d", "r14w", "r14b")
	add(16, "r13", "r13d", "r13w", "r13b")
	add(24, "r12", "r12d", "r12w", "r12b")
	add(32, "rbp", "ebp", "bp", "bpl")
	add(40, "rbx", "ebx", "bx", "bl")
	add(48, "r11", "r11d", "r11w", "r11b")
	add(56, "r10", "r10d", "r10w", "r10b")
	add(64, "r9", "r9d", "r9w", "r9b")
	add(72, "r8", "r8d", "r8w", "r8b")
	add(80, "rax", "eax", "ax", "al")
	add(88, "rcx", "ecx", "cx", "cl")
	add(96, "rdx", "edx", "dx", "dl")
	add(104, "rsi", "esi", "si", "sil")
	add(112, "rdi", "edi", "di", "dil")
	add(128, "rip", "eip")
	add(152, "rsp", "esp", "sp", "spl")
	return m
}()

// parseUSDTArgs reads an x86-64 argument string: space-separated
// SIZE@LOCATION, SIZE negative for signed, LOCATION one of %reg, $const,
// disp(%reg).
func parseUSDTArgs(s string) ([]USDTArg, error) {
	var out []USDTArg
	for _, field := range strings.Fields(s) {
		sizeStr, loc, ok := strings.Cut(field, "@")
		if !ok {
			return nil, fmt.Errorf("argument %q: no SIZE@", field)
		}
		size, err := strconv.ParseInt(sizeStr, 10, 8)
		if err != nil || !slices.Contains([]int64{1, 2, 4, 8}, max(size, -size)) {
			return nil, fmt.Errorf("argument %q: bad size", field)
		}
		a := USDTArg{Size: int8(size)}
		switch {
		case strings.HasPrefix(loc, "$"):
			a.Kind = USDTConst
			if a.Value, err = strconv.ParseInt(loc[1:], 0, 64); err != nil {
				return nil, fmt.Errorf("argument %q: bad constant", field)
			}
		case strings.HasPrefix(loc, "%"):
			a.Kind = USDTReg
			if a.RegOff, err = regOffset(loc[1:]); err != nil {
				return nil, fmt.Errorf("argument %q: %w", field, err)
			}
		case strings.HasSuffix(loc, ")"):
			disp, reg, ok := strings.Cut(strings.TrimSuffix(loc, ")"), "(")
			if !ok || !strings.HasPrefix(reg, "%") || strings.Contains(reg, ",") {
				return nil, fmt.Errorf("argument %q: unsupported memory operand", field)
			}
			a.Kind = USDTMem
			if disp != "" {
				if a.Value, err = strconv.ParseInt(disp, 0, 64); err != nil {
					return nil, fmt.Errorf("argument %q: bad displacement", field)
				}
			}
			if a.RegOff, err = regOffset(reg[1:]); err != nil {
				return nil, fmt.Errorf("argument %q: %w", field, err)
			}
		default:
			return nil, fmt.Errorf("argument %q: unsupported location", field)
		}
		out = append(out, a)
	}
	return out, nil
}

func regOffset(name string) (uint16, error) {
	if off, ok := ptRegs[name]; ok {
		return off, nil
	}
	return 0, errors.New("unknown register " + name)
}
