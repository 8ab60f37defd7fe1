package loader

import (
	"errors"
	"strconv"
	"strings"
)

// ptRegsAMD64 are the offsets of x86-64's struct pt_regs fields, by every
// name the assembler gives a register or its lower part.
var ptRegsAMD64 = func() map[string]uint16 {
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

// usdtLocAMD64 reads an x86-64 argument location (AT&T syntax): %reg,
// $const, disp(%reg).
func usdtLocAMD64(loc string) (USDTArg, error) {
	var a USDTArg
	var err error
	switch {
	case strings.HasPrefix(loc, "$"):
		a.Kind = USDTConst
		if a.Value, err = strconv.ParseInt(loc[1:], 0, 64); err != nil {
			return a, errors.New("bad constant")
		}
	case strings.HasPrefix(loc, "%"):
		a.Kind = USDTReg
		a.RegOff, err = regOffset(ptRegsAMD64, loc[1:])
	case strings.HasSuffix(loc, ")"):
		disp, reg, ok := strings.Cut(strings.TrimSuffix(loc, ")"), "(")
		if !ok || !strings.HasPrefix(reg, "%") || strings.Contains(reg, ",") {
			return a, errors.New("unsupported memory operand")
		}
		a.Kind = USDTMem
		if disp != "" {
			if a.Value, err = strconv.ParseInt(disp, 0, 64); err != nil {
				return a, errors.New("bad displacement")
			}
		}
		a.RegOff, err = regOffset(ptRegsAMD64, reg[1:])
	default:
		return a, errors.New("unsupported location")
	}
	return a, err
}
