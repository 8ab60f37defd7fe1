package unwind

import "debug/elf"

// arch is what unwinding needs of an architecture: its DWARF register
// numbers, and how it keeps a return address. A file's arch comes from its
// ELF header, not from the build: a trace recorded on arm64 unwinds the
// same on an x86-64 host.
type arch struct {
	name string
	sp   uint64 // the stack pointer's DWARF number
	fp   uint64 // the frame pointer's (rbp, x29): the one callee-saved register followed
	// ra is the return address column CIEs name. On x86-64 it is no
	// register (16: rip in expressions, the frame's pc); on arm64 it is
	// x30, the link register, which holds the return address until the
	// function saves it: a frame that has not (a leaf, a function's first
	// instructions) finds it there (lrReg).
	ra    uint64
	lrReg bool
	// pac: return addresses may carry a pointer authentication code in
	// their high bits (arm64 code built with -mbranch-protection=pac-ret,
	// which Debian's and Ubuntu's userlands are). Every return address is
	// stripped to the address space's bits (Maps.vaMask) rather than
	// following DW_CFA_AARCH64_negate_ra_state: a signed and an unsigned
	// one come out the same, and a frame is right or absent.
	pac bool
}

var (
	archAMD64 = &arch{name: "x86-64", sp: 7, fp: 6, ra: 16}
	archARM64 = &arch{name: "arm64", sp: 31, fp: 29, ra: 30, lrReg: true, pac: true}
)

// archOf is the arch of an ELF file's machine; nil for one not unwound.
func archOf(m elf.Machine) *arch {
	switch m {
	case elf.EM_X86_64:
		return archAMD64
	case elf.EM_AARCH64:
		return archARM64
	}
	return nil
}
