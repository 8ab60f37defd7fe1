// Package pickle is a small Python pickle writer, enough for the PyTorch
// memory snapshot (package export's memviz format) and nothing more.
//
// The reader that matters most is pytorch.org/memory_viz: MemoryViz.js has
// its own unpickler (torch/utils/viz/MemoryViz.js, function unpickle(buffer)),
// a switch over opcodes that throws "UNKNOWN OPCODE" on anything else. So this
// writer emits ONLY opcodes that function reads, and of those only ones that
// CPython's protocol 2 defines, so that the PROTO 2 header is honest for
// pickle.load and pickletools too:
//
//	PROTO 2, STOP                       header and end
//	NONE, NEWTRUE, NEWFALSE             None, True, False
//	BININT1, BININT2, BININT, LONG1     int, in the shortest form, as CPython
//	BINFLOAT                            float (8 bytes, big-endian)
//	BINUNICODE                          str (UTF-8 with a 4-byte length)
//	EMPTY_LIST, EMPTY_DICT, MARK,       list and dict, filled in batches of at
//	APPENDS, SETITEMS                   most 1000 items, as CPython's pickler
//	EMPTY_TUPLE, TUPLE1, TUPLE2,        tuple (a segment's segment_pool_id is
//	TUPLE3, TUPLE                       a 2-tuple)
//	BINPUT, LONG_BINPUT,                memo: a repeated string (dict keys,
//	BINGET, LONG_BINGET                 states, file names) is written once
//	                                    and referred to after that
//
// Left out although MemoryViz.js reads them: SHORT_BINUNICODE, MEMOIZE, FRAME
// (protocol 4, not 2) and APPEND, SETITEM, LIST, DICT (the batched forms do
// their work). MemoryViz.js marks LONG_BINPUT "untested"; it is
// memo[read_uint4()] = top of stack, with the read_uint4 that BININT and
// BINUNICODE use, and only snapshots with more than 256 distinct strings
// need it.
//
// The JS reader holds every number as a float64, so an int of magnitude 2^53
// or more is an error (ErrUnsafeInt), never a silently rounded address.
//
// Only strings are memoized: a shared list or dict would be one object in two
// places for the JS reader, whose annotate_snapshot edits entries in place.
package pickle

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Opcodes, named as in CPython's pickletools.
const (
	pkProto      = 0x80
	pkStop       = '.'
	pkNone       = 'N'
	pkNewTrue    = 0x88
	pkNewFalse   = 0x89
	pkBinInt1    = 'K'
	pkBinInt2    = 'M'
	pkBinInt     = 'J'
	pkLong1      = 0x8a
	pkBinFloat   = 'G'
	pkBinUnicode = 'X'
	pkEmptyList  = ']'
	pkEmptyDict  = '}'
	pkEmptyTuple = ')'
	pkTuple1     = 0x85
	pkTuple2     = 0x86
	pkTuple3     = 0x87
	pkTuple      = 't'
	pkMark       = '('
	pkAppends    = 'e'
	pkSetItems   = 'u'
	pkBinPut     = 'q'
	pkLongBinPut = 'r'
	pkBinGet     = 'h'
	pkLongBinGet = 'j'
)

// opcodes is the table above by pickletools name; the tests hold the
// encoder's output to it.
var opcodes = []string{
	"PROTO", "STOP",
	"NONE", "NEWTRUE", "NEWFALSE",
	"BININT1", "BININT2", "BININT", "LONG1",
	"BINFLOAT",
	"BINUNICODE",
	"EMPTY_LIST", "EMPTY_DICT", "MARK", "APPENDS", "SETITEMS",
	"EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "TUPLE",
	"BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
}

// Opcodes lists, by their pickletools names, every opcode an Encoder
// writes: the tests of its output (and of export's memory snapshot) check
// against it.
func Opcodes() []string { return slices.Clone(opcodes) }

// MaxSafeInt is the largest magnitude memory_viz's JS reader holds exactly
// (Number.MAX_SAFE_INTEGER, 2^53-1). Larger ints are refused.
const MaxSafeInt = 1<<53 - 1

const (
	pickleBatch = 1000 // items per APPENDS / SETITEMS, as CPython's pickler

	// pickleMaxDepth bounds nesting so that a cyclic []any is an error, not
	// a stack overflow. The memory snapshot nests 7 deep.
	pickleMaxDepth = 1000

	// pickleMaxMemo caps the memo for an input of millions of distinct
	// strings; past it new strings are written whole each time, which is
	// still correct.
	pickleMaxMemo = 1 << 20
)

var (
	// ErrUnsafeInt is returned for an int whose magnitude is 2^53 or more:
	// memory_viz reads numbers as float64 and would show a rounded value.
	ErrUnsafeInt = errors.New("int magnitude >= 2^53, which memory_viz cannot read exactly")
	// ErrUnsupported is returned for a value with no pickle mapping.
	ErrUnsupported = errors.New("type has no pickle mapping")
)

// KV is one entry of a Dict.
type KV struct {
	Key   string
	Value any
}

// Dict is a dict written in slice order, so the caller picks the key order
// (a Go map is written with its keys sorted, to be deterministic). A
// repeated key is written twice and the reader keeps the last value.
type Dict []KV

// Tuple is written as a Python tuple (an array in memory_viz).
type Tuple []any

// LazyList is a list whose items are made while it is being written, so a
// long list of records never exists as one []any: Item(i) is called once for
// each i in [0, Len), in order, and its result is written before the next
// call.
type LazyList struct {
	Len  int
	Item func(i int) (any, error)
}

// Encoder writes Go values as pickles to a stream. It is not safe for
// concurrent use.
type Encoder struct {
	out  io.Writer
	w    *bufio.Writer
	err  error // the first write error; later writes are skipped
	memo map[string]uint32
	buf  [16]byte
}

// NewEncoder returns an encoder writing to w through a 64 KiB buffer,
// which each Encode flushes.
func NewEncoder(w io.Writer) *Encoder {
	return &Encoder{out: w, w: bufio.NewWriterSize(w, 64<<10)}
}

// errPickleWrite stops the walk after a write error; Encode reports the
// write error itself.
var errPickleWrite = errors.New("write failed")

// Encode writes v as one whole pickle, from PROTO 2 to STOP, and flushes.
//
//	nil                       None
//	bool                      bool
//	int and uint kinds        int; |v| must be <= MaxSafeInt (ErrUnsafeInt)
//	float32, float64          float
//	string                    str; must be valid UTF-8
//	Dict                    dict, keys in slice order
//	map[string]T              dict, keys sorted
//	[]T, [N]T, LazyList     list ([]byte is refused: no bytes opcode in
//	                          MemoryViz.js)
//	Tuple                   tuple
//	*T                        what it points to; nil is None
//
// Named types are written by their kind; anything else is
// ErrUnsupported. An error says where in v it happened, such as
// `pickle: $["segments"][3]["size"]: …`.
//
// After an error in v, what is still in the buffer is dropped, so a small
// value writes nothing, but a large one may have written some of its first
// 64 KiB blocks already. A write error is sticky: every later Encode returns
// it.
func (e *Encoder) Encode(v any) error {
	if e.err != nil {
		return e.err
	}
	e.memo = make(map[string]uint32)
	defer func() { e.memo = nil }()
	e.buf[0], e.buf[1] = pkProto, 2
	e.write(e.buf[:2])
	err := e.value(v, 0)
	if e.err != nil {
		return e.err
	}
	if err != nil {
		e.w.Reset(e.out) // drop the unfinished pickle, keep the encoder usable
		if pe, ok := err.(*picklePathError); ok {
			return pe
		}
		return fmt.Errorf("pickle: %w", err)
	}
	e.writeByte(pkStop)
	if e.err == nil {
		if err := e.w.Flush(); err != nil {
			e.err = fmt.Errorf("pickle: write: %w", err)
		}
	}
	return e.err
}

// writeByte and write buffer output, keeping the first error. They take a
// byte or a slice of e.buf rather than a variadic list, which would cost an
// allocation per call.
func (e *Encoder) writeByte(c byte) {
	if e.err != nil {
		return
	}
	if err := e.w.WriteByte(c); err != nil {
		e.err = fmt.Errorf("pickle: write: %w", err)
	}
}

func (e *Encoder) write(b []byte) {
	if e.err != nil {
		return
	}
	if _, err := e.w.Write(b); err != nil {
		e.err = fmt.Errorf("pickle: write: %w", err)
	}
}

func (e *Encoder) writeString(s string) {
	if e.err != nil {
		return
	}
	if _, err := e.w.WriteString(s); err != nil {
		e.err = fmt.Errorf("pickle: write: %w", err)
	}
}

// picklePathError says where in the value an error happened. The path is
// built while unwinding, innermost element first, so encoding that succeeds
// pays nothing for it.
type picklePathError struct {
	rev []string // path elements, innermost first
	err error
}

func (p *picklePathError) Error() string {
	var b strings.Builder
	b.WriteString("pickle: $")
	for i := len(p.rev) - 1; i >= 0; i-- {
		// A path 1000 deep (a cycle) says no more with all of it.
		if n := len(p.rev); n > 40 && i == n-21 {
			b.WriteString("…")
			i = 9
		}
		b.WriteString(p.rev[i])
	}
	b.WriteString(": ")
	b.WriteString(p.err.Error())
	return b.String()
}

func (p *picklePathError) Unwrap() error { return p.err }

// pickleAt adds one path element (an index or a key) to err.
func pickleAt(err error, elem string) error {
	if err == errPickleWrite {
		return err
	}
	// A type assertion, not errors.As: a LazyList.Item error that wraps
	// some other encoder's path error must not get this path glued on.
	if pe, ok := err.(*picklePathError); ok {
		pe.rev = append(pe.rev, elem)
		return pe
	}
	return &picklePathError{rev: []string{elem}, err: err}
}

func (e *Encoder) value(v any, depth int) error {
	if e.err != nil {
		return errPickleWrite
	}
	if depth > pickleMaxDepth {
		return fmt.Errorf("nested more than %d deep (a cycle?)", pickleMaxDepth)
	}
	// The common types first, without reflection.
	switch x := v.(type) {
	case nil:
		e.writeByte(pkNone)
		return nil
	case bool:
		if x {
			e.writeByte(pkNewTrue)
		} else {
			e.writeByte(pkNewFalse)
		}
		return nil
	case int:
		return e.int(int64(x))
	case int64:
		return e.int(x)
	case uint64:
		return e.uint(x)
	case float64:
		e.float(x)
		return nil
	case string:
		return e.str(x)
	case Dict:
		return e.dict(len(x), func(i int) (string, any) { return x[i].Key, x[i].Value }, depth)
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return e.dict(len(keys), func(i int) (string, any) { return keys[i], x[keys[i]] }, depth)
	case []any:
		return e.list(len(x), func(i int) (any, error) { return x[i], nil }, depth)
	case LazyList:
		if x.Len < 0 || (x.Len > 0 && x.Item == nil) {
			return fmt.Errorf("LazyList of length %d without an Item func", x.Len)
		}
		return e.list(x.Len, x.Item, depth)
	case Tuple:
		return e.tuple(x, depth)
	}
	return e.reflectValue(reflect.ValueOf(v), depth)
}

// reflectValue covers the rest: other int widths, named types (type Action
// string), typed slices and maps, pointers.
func (e *Encoder) reflectValue(rv reflect.Value, depth int) error {
	switch rv.Kind() {
	case reflect.Bool:
		return e.value(rv.Bool(), depth)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return e.int(rv.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return e.uint(rv.Uint())
	case reflect.Float32, reflect.Float64:
		e.float(rv.Float())
		return nil
	case reflect.String:
		return e.str(rv.String())
	case reflect.Pointer:
		if rv.IsNil() {
			e.writeByte(pkNone)
			return nil
		}
		return e.value(rv.Elem().Interface(), depth+1)
	case reflect.Slice:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			// bytes need BINBYTES, which MemoryViz.js does not read, and a
			// list of small ints is seldom what was meant.
			return fmt.Errorf("%s: %w (MemoryViz.js reads no bytes opcode)", rv.Type(), ErrUnsupported)
		}
		return e.list(rv.Len(), func(i int) (any, error) { return rv.Index(i).Interface(), nil }, depth)
	case reflect.Array:
		return e.list(rv.Len(), func(i int) (any, error) { return rv.Index(i).Interface(), nil }, depth)
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return fmt.Errorf("%s: %w (dict keys must be strings)", rv.Type(), ErrUnsupported)
		}
		keys := rv.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		return e.dict(len(keys), func(i int) (string, any) {
			return keys[i].String(), rv.MapIndex(keys[i]).Interface()
		}, depth)
	case reflect.Invalid:
		e.writeByte(pkNone) // a nil interface inside a typed container
		return nil
	}
	return fmt.Errorf("%s: %w", rv.Type(), ErrUnsupported)
}

func (e *Encoder) uint(u uint64) error {
	if u > MaxSafeInt {
		return fmt.Errorf("%d: %w", u, ErrUnsafeInt)
	}
	return e.int(int64(u))
}

// int writes v in the shortest form, as CPython's save_long does.
func (e *Encoder) int(v int64) error {
	if v > MaxSafeInt || v < -MaxSafeInt {
		return fmt.Errorf("%d: %w", v, ErrUnsafeInt)
	}
	b := e.buf[:]
	switch {
	case v >= 0 && v <= 0xff:
		b[0], b[1] = pkBinInt1, byte(v)
		e.write(b[:2])
	case v >= 0 && v <= 0xffff:
		b[0] = pkBinInt2
		binary.LittleEndian.PutUint16(b[1:], uint16(v))
		e.write(b[:3])
	case v >= math.MinInt32 && v <= math.MaxInt32:
		b[0] = pkBinInt
		binary.LittleEndian.PutUint32(b[1:], uint32(int32(v)))
		e.write(b[:5])
	default:
		// LONG1: little-endian two's complement in the fewest bytes that
		// keep the sign (7 at most below 2^53), as CPython's encode_long.
		b[0] = pkLong1
		binary.LittleEndian.PutUint64(b[2:], uint64(v))
		n := 8
		for n > 1 {
			last, prevNeg := b[2+n-1], b[2+n-2]&0x80 != 0
			if (last != 0x00 || prevNeg) && (last != 0xff || !prevNeg) {
				break
			}
			n--
		}
		b[1] = byte(n)
		e.write(b[:2+n])
	}
	return nil
}

func (e *Encoder) float(f float64) {
	e.buf[0] = pkBinFloat
	binary.BigEndian.PutUint64(e.buf[1:], math.Float64bits(f))
	e.write(e.buf[:9])
}

func (e *Encoder) str(s string) error {
	if id, ok := e.memo[s]; ok {
		e.memoOp(pkBinGet, pkLongBinGet, id)
		return nil
	}
	if !utf8.ValidString(s) {
		// CPython decodes BINUNICODE strictly and would refuse the pickle.
		return fmt.Errorf("string %q is not valid UTF-8", s)
	}
	if uint64(len(s)) > math.MaxUint32 {
		return fmt.Errorf("string of %d bytes: BINUNICODE holds at most 4 GiB", len(s))
	}
	e.buf[0] = pkBinUnicode
	binary.LittleEndian.PutUint32(e.buf[1:], uint32(len(s)))
	e.write(e.buf[:5])
	e.writeString(s)
	// A reference to "" would cost as much as "" itself.
	if s != "" && len(e.memo) < pickleMaxMemo {
		id := uint32(len(e.memo))
		e.memo[s] = id
		e.memoOp(pkBinPut, pkLongBinPut, id)
	}
	return nil
}

// memoOp writes a memo put or get: the 1-byte index form below 256, the
// 4-byte one above.
func (e *Encoder) memoOp(short, long byte, id uint32) {
	if id < 256 {
		e.buf[0], e.buf[1] = short, byte(id)
		e.write(e.buf[:2])
		return
	}
	e.buf[0] = long
	binary.LittleEndian.PutUint32(e.buf[1:], id)
	e.write(e.buf[:5])
}

// list writes EMPTY_LIST, then MARK items APPENDS for each batch. CPython
// writes a batch of one as item APPEND; MARK item APPENDS means the same
// and keeps the opcode set smaller.
func (e *Encoder) list(n int, item func(int) (any, error), depth int) error {
	e.writeByte(pkEmptyList)
	for start := 0; start < n; start += pickleBatch {
		e.writeByte(pkMark)
		for i := start; i < min(n, start+pickleBatch); i++ {
			v, err := item(i)
			if err == nil {
				err = e.value(v, depth+1)
			}
			if err != nil {
				return pickleAt(err, "["+strconv.Itoa(i)+"]")
			}
		}
		e.writeByte(pkAppends)
	}
	return nil
}

// dict is list's counterpart: EMPTY_DICT, then MARK key value … SETITEMS.
func (e *Encoder) dict(n int, kv func(int) (string, any), depth int) error {
	e.writeByte(pkEmptyDict)
	for start := 0; start < n; start += pickleBatch {
		e.writeByte(pkMark)
		for i := start; i < min(n, start+pickleBatch); i++ {
			k, v := kv(i)
			err := e.str(k)
			if err == nil {
				err = e.value(v, depth+1)
			}
			if err != nil {
				return pickleAt(err, "["+strconv.Quote(k)+"]")
			}
		}
		e.writeByte(pkSetItems)
	}
	return nil
}

// tuple uses protocol 2's short forms up to 3 items, as CPython does.
func (e *Encoder) tuple(t Tuple, depth int) error {
	if len(t) == 0 {
		e.writeByte(pkEmptyTuple)
		return nil
	}
	if len(t) > 3 {
		e.writeByte(pkMark)
	}
	for i, v := range t {
		if err := e.value(v, depth+1); err != nil {
			return pickleAt(err, "["+strconv.Itoa(i)+"]")
		}
	}
	switch len(t) {
	case 1:
		e.writeByte(pkTuple1)
	case 2:
		e.writeByte(pkTuple2)
	case 3:
		e.writeByte(pkTuple3)
	default:
		e.writeByte(pkTuple)
	}
	return nil
}
