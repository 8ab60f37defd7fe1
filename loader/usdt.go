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

	"github.com/cudatrace/cudatrace/proc"
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
	RegOff uint16 // offset of the register in the machine's struct pt_regs
	Value  int64  // the constant, or the displacement
}

// ReadUSDT lists the USDT probes of the ELF file at path; a file without
// notes has none.
//
// It is opened through proc.OpenELF: never blocking, only a regular file.
func ReadUSDT(path string) ([]USDTProbe, error) {
	f, err := proc.OpenELF(path, nil)
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
		if p.Offset, err = fileOffset(f.File, pc); err != nil {
			return nil, fmt.Errorf("usdt: %s: %s:%s: %w", path, p.Provider, p.Name, err)
		}
		if sem != 0 {
			if p.Semaphore, err = fileOffset(f.File, sem); err != nil {
				return nil, fmt.Errorf("usdt: %s: %s:%s semaphore: %w", path, p.Provider, p.Name, err)
			}
		}
		if p.Args, err = parseUSDTArgs(f.Machine, strs[2]); err != nil {
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

// parseUSDTArgs reads an argument string of a machine's notes:
// space-separated SIZE@LOCATION, SIZE negative for signed, LOCATION in the
// machine's assembler syntax (usdtLocAMD64, usdtLocARM64).
func parseUSDTArgs(machine elf.Machine, s string) ([]USDTArg, error) {
	var loc func(string) (USDTArg, error)
	switch machine {
	case elf.EM_X86_64:
		loc = usdtLocAMD64
	case elf.EM_AARCH64:
		loc = usdtLocARM64
	default:
		return nil, fmt.Errorf("USDT arguments of %v are not read", machine)
	}
	var out []USDTArg
	for _, field := range usdtFields(s) {
		sizeStr, where, ok := strings.Cut(field, "@")
		if !ok {
			return nil, fmt.Errorf("argument %q: no SIZE@", field)
		}
		size, err := strconv.ParseInt(sizeStr, 10, 8)
		if err != nil || !slices.Contains([]int64{1, 2, 4, 8}, max(size, -size)) {
			return nil, fmt.Errorf("argument %q: bad size", field)
		}
		a, err := loc(where)
		if err != nil {
			return nil, fmt.Errorf("argument %q: %w", field, err)
		}
		a.Size = int8(size)
		out = append(out, a)
	}
	return out, nil
}

// usdtFields splits an argument string at the spaces between arguments:
// not at those inside brackets (arm64's "8@[sp, 16]").
func usdtFields(s string) []string {
	var out []string
	depth, start := 0, -1
	for i, c := range s {
		switch {
		case c == '[':
			depth++
		case c == ']':
			depth--
		case (c == ' ' || c == '\t') && depth <= 0:
			if start >= 0 {
				out = append(out, s[start:i])
				start = -1
			}
			continue
		}
		if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		out = append(out, s[start:])
	}
	return out
}

// regOffset is a register's offset in struct pt_regs, by the names in
// regs.
func regOffset(regs map[string]uint16, name string) (uint16, error) {
	if off, ok := regs[name]; ok {
		return off, nil
	}
	return 0, errors.New("unknown register " + name)
}
