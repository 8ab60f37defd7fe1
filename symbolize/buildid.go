package symbolize

import (
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
)

// maxNote bounds what is read of a note section or segment: real ones are a
// few hundred bytes, and a corrupt header must not make us allocate its
// claimed size.
const maxNote = 1 << 20

// ntGNUBuildID is NT_GNU_BUILD_ID, which debug/elf does not define.
const ntGNUBuildID = 3

// BuildID returns the hex GNU build ID (NT_GNU_BUILD_ID note) of the ELF file
// at path, or "" with a nil error when the file has none.
func BuildID(path string) (id string, err error) {
	defer func() {
		if r := recover(); r != nil {
			notePanic(r)
			id, err = "", fmt.Errorf("read build ID of %s: malformed ELF: %v", path, r)
		}
	}()
	f, err := openELF(path)
	if err != nil {
		return "", fmt.Errorf("read build ID of %s: %w", path, err)
	}
	defer f.Close()
	id, err = buildIDOf(f.File)
	if err != nil {
		return "", fmt.Errorf("read build ID of %s: %w", path, err)
	}
	return id, nil
}

// BuildIDFile is BuildID of a file already open (proc.OpenMapping): "" with
// a nil error when it has none. It does not close f.
func BuildIDFile(f *os.File) (id string, err error) {
	defer func() {
		if r := recover(); r != nil {
			notePanic(r)
			id, err = "", fmt.Errorf("read build ID of %s: malformed ELF: %v", f.Name(), r)
		}
	}()
	ef, err := elf.NewFile(f)
	if err != nil {
		return "", fmt.Errorf("read build ID of %s: %w", f.Name(), err)
	}
	id, err = buildIDOf(ef)
	if err != nil {
		return "", fmt.Errorf("read build ID of %s: %w", f.Name(), err)
	}
	return id, nil
}

func buildIDOf(f *elf.File) (string, error) {
	var firstErr error
	// Section headers first, where the linker names the note; program
	// headers for files whose section headers were stripped or lost.
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOTE {
			continue
		}
		id, err := noteBuildID(s.Open(), s.Size, s.Addralign, f.ByteOrder)
		if id != "" {
			return id, nil
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		id, err := noteBuildID(p.Open(), p.Filesz, p.Align, f.ByteOrder)
		if id != "" {
			return id, nil
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return "", firstErr
}

func noteBuildID(r io.Reader, size, align uint64, bo binary.ByteOrder) (string, error) {
	if size > maxNote {
		size = maxNote
	}
	b := make([]byte, size)
	n, err := io.ReadFull(r, b)
	if err != nil && n == 0 {
		return "", fmt.Errorf("read notes: %w", err)
	}
	b = b[:n]
	// Notes are padded to 4 bytes, except in segments aligned to 8 (where
	// the linker puts .note.gnu.property).
	pad := uint64(4)
	if align == 8 {
		pad = 8
	}
	roundUp := func(x uint64) uint64 { return (x + pad - 1) &^ (pad - 1) }
	for len(b) >= 12 {
		namesz := uint64(bo.Uint32(b[0:]))
		descsz := uint64(bo.Uint32(b[4:]))
		typ := bo.Uint32(b[8:])
		b = b[12:]
		nameEnd := roundUp(namesz)
		if nameEnd > uint64(len(b)) || descsz > uint64(len(b))-nameEnd {
			break
		}
		name := b[:namesz]
		desc := b[nameEnd : nameEnd+descsz]
		if typ == ntGNUBuildID && string(name) == "GNU\x00" && len(desc) > 0 {
			return hex.EncodeToString(desc), nil
		}
		next := nameEnd + roundUp(descsz)
		if next > uint64(len(b)) {
			break
		}
		b = b[next:]
	}
	return "", nil
}
