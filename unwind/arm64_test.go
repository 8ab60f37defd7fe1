package unwind

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/symbolize"
)

// armDump reads testdata/arm64/dump-<series>: what the arm64 chain
// (testdata/arm64/README.md) saw in ct_snap under Debian's arm64 kernel of
// that series: pc, sp, x29 and the signed x30, the stack from sp up, the
// mappings. Its files at /unwind are testdata/arm64's; every other file
// (the guest's libc and loader) is named by a path that does not exist
// here, so that the unwind stops at main's return into libc whatever this
// host has installed.
func armDump(t testing.TB, series string) dump {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "arm64", "dump-"+series))
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(bytes.NewReader(raw))
	var d dump
	var n int
	if _, err := fmt.Fscanf(r, "%x %x %x %x %d\n", &d.regs.IP, &d.regs.SP, &d.regs.BP, &d.regs.LR, &n); err != nil {
		t.Fatalf("dump header: %v", err)
	}
	d.window = make([]byte, n)
	if _, err := io.ReadFull(r, d.window); err != nil {
		t.Fatalf("dump window: %v", err)
	}
	if d.maps, err = proc.ParseMaps(r); err != nil {
		t.Fatalf("dump maps: %v", err)
	}
	here, _ := filepath.Abs(filepath.Join("testdata", "arm64"))
	gone := filepath.Join(t.TempDir(), "not-here")
	for i := range d.maps {
		if p, ok := strings.CutPrefix(d.maps[i].Path, "/unwind/"); ok {
			d.maps[i].Path = filepath.Join(here, p)
		} else if strings.HasPrefix(d.maps[i].Path, "/") {
			d.maps[i].Path = filepath.Join(gone, d.maps[i].Path)
		}
	}
	return d
}

// armChainWant is the chain from ct_snap's caller on, down to main.
func armChainWant(t testing.TB) []wantFrame {
	return append([]wantFrame{{"chain_leaf", "dumpself.c", lineOf(t, "arm64/dumpself.c", "chain_leaf")}},
		append(chainWant(t)[:3], wantFrame{"main", "dumpself.c", lineOf(t, "arm64/dumpself.c", "main")})...)
}

// Stacks of arm64 code without frame pointers whose return addresses are
// signed (pointer authentication: -mbranch-protection=standard), captured
// under Debian's arm64 kernels 6.1 (the codes in bits 48-54) and 6.12
// (52-bit addresses: bits 52-54, so some codes are 0), unwound on this
// host from the arm64 files' own CFI: every frame to main, exact to
// function and line, and main's return into libc, whose signed address is
// stripped to one in libc's mapping. Two ways: at the probe inside
// ct_snap, a leaf that signed x30 and keeps it there (a USDT probe in a
// function body: the link register known, the CFA at the stack pointer),
// and at its return (a uretprobe: the return address in pc, the link
// register unknown). The stack holds signed return addresses and
// unsigned ones (libchain2's, built without pointer authentication).
func TestUnwindARM64PAC(t *testing.T) {
	for _, series := range []string{"6.1", "6.12"} {
		t.Run(series, func(t *testing.T) {
			d := armDump(t, series)
			maps := NewMaps(d.maps)
			if mask := maps.vaMask; mask != 1<<48-1 {
				t.Fatalf("address space mask %#x, want 48 bits: the mappings end at %#x", mask, d.maps[len(d.maps)-1].End)
			}
			if d.regs.LR&^maps.vaMask == 0 {
				t.Fatalf("x30 %#x carries no PAC: the dump does not test stripping", d.regs.LR)
			}
			libc := func(pc uint64) bool {
				i := proc.Find(d.maps, pc)
				return i >= 0 && strings.HasSuffix(d.maps[i].Path, "/libc.so.6")
			}
			u := New()
			defer u.Close()
			sym := symbolize.New()
			want := armChainWant(t)

			// At the probe in ct_snap.
			pcs, stop := u.Unwind(NewMaps(d.maps), d.regs, d.window, false, nil)
			frames := sym.FramesOf(symbolize.Proc{}, d.maps, pcs)
			for i, f := range frames {
				t.Logf("#%d %#x %s %s:%d (%s)", i, f.Addr, f.Function, filepath.Base(f.File), f.Line, filepath.Base(f.Module))
			}
			t.Logf("stop: %s", stop)
			if len(frames) == 0 || frames[0].Function != "ct_snap" {
				t.Fatalf("frame 0: %+v, want ct_snap", frames)
			}
			checkChain(t, frames[1:], want)
			if len(pcs) != len(want)+2 || !libc(pcs[len(pcs)-1]) || stop.Kind != StopNoCFI {
				t.Errorf("%d frames, the last %#x, stop %q; want main's return into libc last, where the files end",
					len(pcs), pcs[len(pcs)-1], stop)
			}

			// At ct_snap's return: pc is the return address (unsigned by
			// the return probe's kernel), the link register unknown.
			ret := d.regs
			ret.IP, ret.LR = d.regs.LR&maps.vaMask, 0
			rpcs, _ := u.Unwind(NewMaps(d.maps), ret, d.window, true, nil)
			if !slices.Equal(rpcs, pcs[1:]) {
				t.Errorf("from ct_snap's return: %x, want %x", rpcs, pcs[1:])
			}

			// The stack held both kinds: return addresses signed (the
			// executable's and libchain1's frames) and not (libchain2's).
			signed, plain := 0, 0
			for off := 0; off+8 <= len(d.window); off += 8 {
				w := binary.LittleEndian.Uint64(d.window[off:])
				if slices.Contains(pcs[2:], w&maps.vaMask) {
					if w&^maps.vaMask != 0 {
						signed++
					} else {
						plain++
					}
				}
			}
			if signed < 2 || plain < 1 {
				t.Errorf("the window holds %d signed and %d plain return addresses of the stack, want both kinds", signed, plain)
			}
		})
	}
}

// What a frame cannot be told is left out, never guessed: a window cut
// short of a signed return address stops there (StopWindow), and with the
// link register unknown a leaf's return address has no rule (StopRule).
func TestUnwindARM64Absent(t *testing.T) {
	d := armDump(t, "6.1")
	u := New()
	defer u.Close()
	full, _ := u.Unwind(NewMaps(d.maps), d.regs, d.window, false, nil)
	for n := 8; n < len(d.window); n += 8 {
		pcs, stop := u.Unwind(NewMaps(d.maps), d.regs, d.window[:n], false, nil)
		if stop.Kind == StopWindow && len(pcs) < len(full) && !slices.Equal(pcs, full[:len(pcs)]) {
			t.Fatalf("a %d-byte window gave %x, not a prefix of %x", n, pcs, full)
		}
		if stop.Kind != StopWindow && len(pcs) < len(full) {
			t.Fatalf("a %d-byte window stopped at %d frames with %q, want the window's stop", n, len(pcs), stop)
		}
	}
	noLR := d.regs
	noLR.LR = 0
	pcs, stop := u.Unwind(NewMaps(d.maps), noLR, d.window, false, nil)
	if len(pcs) != 1 || stop.Kind != StopRule {
		t.Errorf("without x30, at a leaf that keeps its return address there: %x, %q; want the leaf alone and StopRule", pcs, stop)
	}
}
