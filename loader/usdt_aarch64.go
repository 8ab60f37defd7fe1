package loader

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ptRegsARM64 are the offsets of arm64's struct user_pt_regs fields (the
// kernel's struct pt_regs begins with it), by register name: x0-x30 and
// their lower halves w0-w30 (the BPF side reads the whole register and
// keeps the argument's size), and sp. pc (256) is left out: the BPF side
// reads offsets below 256.
var ptRegsARM64 = func() map[string]uint16 {
	m := map[string]uint16{"sp": 248}
	for i := uint16(0); i <= 30; i++ {
		m[fmt.Sprintf("x%d", i)] = 8 * i
		m[fmt.Sprintf("w%d", i)] = 8 * i
	}
	return m
}()

// usdtLocARM64 reads an arm64 argument location as GCC writes it for
// sys/sdt.h: a register (x0), a constant (-7: no '$' on arm64), or memory
// at a register plus an offset ([sp, 16], [x19], [x29, -12]).
func usdtLocARM64(loc string) (USDTArg, error) {
	var a USDTArg
	var err error
	switch {
	case strings.HasPrefix(loc, "[") && strings.HasSuffix(loc, "]"):
		reg, disp, hasDisp := strings.Cut(loc[1:len(loc)-1], ",")
		a.Kind = USDTMem
		if hasDisp {
			if a.Value, err = strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(disp), "#"), 0, 64); err != nil {
				return a, errors.New("bad offset")
			}
		}
		a.RegOff, err = regOffset(ptRegsARM64, strings.TrimSpace(reg))
	case loc != "" && (loc[0] == '-' || loc[0] >= '0' && loc[0] <= '9' || loc[0] == '#'):
		a.Kind = USDTConst
		if a.Value, err = strconv.ParseInt(strings.TrimPrefix(loc, "#"), 0, 64); err != nil {
			return a, errors.New("bad constant")
		}
	default:
		a.Kind = USDTReg
		a.RegOff, err = regOffset(ptRegsARM64, loc)
	}
	return a, err
}
