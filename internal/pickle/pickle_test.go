package pickle

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// pickleTagScript loads a pickle and prints it as JSON with every value
// tagged by its exact Python type (True is not 1, (1,) is not [1]), ints as
// decimal strings and floats as their IEEE bits, so the comparison with the
// Go side is exact. Dicts keep their order. It fails on trailing bytes.
const pickleTagScript = `
import json, pickle, struct, sys
def tag(x):
    t = type(x)
    if x is None: return ["none"]
    if t is bool: return ["bool", x]
    if t is int: return ["int", str(x)]
    if t is float: return ["float", struct.pack(">d", x).hex()]
    if t is str: return ["str", x]
    if t is list: return ["list", [tag(v) for v in x]]
    if t is tuple: return ["tuple", [tag(v) for v in x]]
    if t is dict:
        assert all(type(k) is str for k in x), "non-str key"
        return ["dict", [[k, tag(v)] for k, v in x.items()]]
    raise TypeError(t)
with open(sys.argv[1], "rb") as f:
    obj = pickle.load(f)
    rest = f.read()
    assert rest == b"", "%d bytes after STOP" % len(rest)
json.dump(tag(obj), sys.stdout)
`

// pickleTag is pickleTagScript's tagging of what Encode should produce for
// v, built independently of the encoder.
func pickleTag(t *testing.T, v any) any {
	t.Helper()
	switch x := v.(type) {
	case nil:
		return []any{"none"}
	case bool:
		return []any{"bool", x}
	case string:
		return []any{"str", x}
	case float64:
		return []any{"float", fmt.Sprintf("%016x", math.Float64bits(x))}
	case float32:
		return pickleTag(t, float64(x))
	case Dict:
		kvs := []any{}
		for _, kv := range x {
			kvs = append(kvs, []any{kv.Key, pickleTag(t, kv.Value)})
		}
		return []any{"dict", kvs}
	case Tuple:
		items := []any{}
		for _, e := range x {
			items = append(items, pickleTag(t, e))
		}
		return []any{"tuple", items}
	case LazyList:
		items := []any{}
		for i := range x.Len {
			e, err := x.Item(i)
			if err != nil {
				t.Fatal(err)
			}
			items = append(items, pickleTag(t, e))
		}
		return []any{"list", items}
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return []any{"int", strconv.FormatInt(rv.Int(), 10)}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return []any{"int", strconv.FormatUint(rv.Uint(), 10)}
	case reflect.String:
		return []any{"str", rv.String()}
	case reflect.Pointer:
		if rv.IsNil() {
			return []any{"none"}
		}
		return pickleTag(t, rv.Elem().Interface())
	case reflect.Slice, reflect.Array:
		items := []any{}
		for i := range rv.Len() {
			items = append(items, pickleTag(t, rv.Index(i).Interface()))
		}
		return []any{"list", items}
	case reflect.Map:
		keys := rv.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		kvs := []any{}
		for _, k := range keys {
			kvs = append(kvs, []any{k.String(), pickleTag(t, rv.MapIndex(k).Interface())})
		}
		return []any{"dict", kvs}
	}
	t.Fatalf("pickleTag: unhandled %T", v)
	return nil
}

func pickleEncode(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := NewEncoder(&buf).Encode(v); err != nil {
		t.Fatalf("Encode: %v", err)
	}
	return buf.Bytes()
}

// pickleRoundTrip loads Encode(v) in CPython and requires exactly v back.
func pickleRoundTrip(t *testing.T, py string, v any) {
	t.Helper()
	out := testenv.RunPython(t, py, pickleTagScript, testenv.TempFile(t, "v.pickle", pickleEncode(t, v)))
	var got any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("python output: %v", err)
	}
	wantJSON, err := json.Marshal(pickleTag(t, v))
	if err != nil {
		t.Fatal(err)
	}
	var want any
	if err := json.Unmarshal(wantJSON, &want); err != nil {
		t.Fatal(err)
	}
	if path, diff := pickleDiff(got, want, "$"); diff != "" {
		t.Fatalf("python read back something else at %s: %s", path, diff)
	}
}

// pickleDiff finds the first difference between two decoded JSON trees.
func pickleDiff(got, want any, path string) (string, string) {
	g, gok := got.([]any)
	w, wok := want.([]any)
	if !gok || !wok {
		if !reflect.DeepEqual(got, want) {
			return path, fmt.Sprintf("got %v, want %v", got, want)
		}
		return "", ""
	}
	if len(g) != len(w) {
		return path, fmt.Sprintf("got %d items, want %d (got %.200v, want %.200v)", len(g), len(w), g, w)
	}
	for i := range g {
		if p, d := pickleDiff(g[i], w[i], fmt.Sprintf("%s/%d", path, i)); d != "" {
			return p, d
		}
	}
	return "", ""
}

type pickleName string

func TestPickleRoundTrip(t *testing.T) {
	py := testenv.Python3(t, "pickle", "pickletools")

	// Lists and a dict past 2 batches of 1000, so APPENDS/SETITEMS batching
	// and the memo past index 255 (LONG_BINPUT/LONG_BINGET) are exercised.
	ints := make([]any, 2600)
	for i := range ints {
		ints[i] = int64(i*i*i) - 5_000_000 // negative, 1-, 2-, 4-byte and LONG1
	}
	strs := make([]any, 2700)
	for i := range strs {
		strs[i] = fmt.Sprintf("s%d", i%900) // 900 distinct, each seen 3 times
	}
	bigDict := map[string]any{}
	for i := range 2501 {
		bigDict[fmt.Sprintf("k%05d", i)] = i
	}
	seven := 7
	var nilPtr *int
	lazy := LazyList{Len: 1001, Item: func(i int) (any, error) { return Tuple{i, strconv.Itoa(i)}, nil }}

	v := Dict{
		{"zeta first", "dict order is the caller's"},
		{"ints", ints},
		{"strs", strs},
		{"big dict", bigDict},
		{"edges", []any{
			0, 1, 255, 256, 65535, 65536, -1, -128, -129, -255, -256, -32768, -65536,
			math.MaxInt32, math.MinInt32, int64(math.MaxInt32) + 1, int64(math.MinInt32) - 1,
			int64(1) << 32, int64(1) << 40, -(int64(1) << 40), int64(1)<<47 - 1, int64(1) << 47,
			int64(MaxSafeInt), int64(-MaxSafeInt), uint64(MaxSafeInt), uint64(0x7f3a_1c00_0000),
			int8(-8), int16(-300), int32(-70000), uint8(200), uint16(60000), uint32(4_000_000_000), uint(12),
		}},
		{"floats", []any{0.0, math.Copysign(0, -1), 1.5, -2.25, 1e300, 5e-324, math.Inf(1), math.Inf(-1), float32(0.1), math.Pi}},
		{"consts", []any{nil, true, false}},
		{"unicode", []any{"", "ascii", "héllo wörld", "日本語のテキスト", "emoji 🎉🚀", "nul\x00inside", "tab\tnewline\n", "\u2028", strings.Repeat("ü", 300)}},
		{"repeated", []any{"héllo wörld", "日本語のテキスト", "ascii"}},
		{"tuples", []any{Tuple{}, Tuple{1}, Tuple{1, "a"}, Tuple{1, "a", nil}, Tuple{1, 2, 3, 4, 5}, Tuple{Tuple{}, []any{}}}},
		{"empty", []any{[]any{}, map[string]any{}, Dict{}, LazyList{}, []string(nil)}},
		{"nested", map[string]any{"b": []any{map[string]any{"y": []any{[]any{[]any{"deep"}}}, "x": Dict{{"q", 1}, {"p", 2}}}}, "a": nil}},
		{"typed", Dict{
			{"[]string", []string{"x", "y"}},
			{"[]int64", []int64{-1, 1 << 40}},
			{"map[string]int", map[string]int{"b": 2, "a": 1}},
			{"named string", pickleName("named")},
			{"pointer", &seven},
			{"nil pointer", nilPtr},
			{"array", [2]int64{3, -4}},
			{"[]Dict", []Dict{{{"k", "v"}}}},
		}},
		{"lazy", lazy},
	}
	pickleRoundTrip(t, py, v)
}

// TestPickleMatchesCPython: for scalars and single strings the encoder picks
// the same opcodes as CPython's pickle.dumps(v, protocol=2), byte for byte.
func TestPickleMatchesCPython(t *testing.T) {
	py := testenv.Python3(t, "pickle", "pickletools")
	type sample struct {
		Kind, Value, Ours string
	}
	var samples []sample
	add := func(kind, value string, v any) {
		samples = append(samples, sample{kind, value, hex.EncodeToString(pickleEncode(t, v))})
	}
	for _, n := range []int64{0, 1, 200, 255, 256, 1000, 65535, 65536, 1 << 20, math.MaxInt32, math.MaxInt32 + 1,
		-1, -2, -255, -256, -65536, math.MinInt32, math.MinInt32 - 1, 1 << 31, 1 << 32, 1<<39 - 1, 1 << 39,
		-(1 << 39), 1<<47 - 1, 1 << 47, 1 << 48, -(1 << 48), 0x7f3a1c000000, MaxSafeInt, -MaxSafeInt, 0x80, 0x8000, 0x800000, -0x81} {
		add("int", strconv.FormatInt(n, 10), n)
	}
	for _, f := range []float64{0, 1, -1.5, 1e100, math.SmallestNonzeroFloat64, math.Inf(1), math.MaxFloat64} {
		add("float", fmt.Sprintf("%016x", math.Float64bits(f)), f)
	}
	for _, s := range []string{"a", "active_allocated", "日本語", "🎉", strings.Repeat("x", 70000)} {
		add("str", s, s)
	}
	add("none", "", nil)
	add("bool", "1", true)
	add("bool", "0", false)
	add("tuple", "", Tuple{}) // CPython memoizes a list or dict, but not ()

	in, err := json.Marshal(samples)
	if err != nil {
		t.Fatal(err)
	}
	script := `
import json, pickle, struct, sys
bad = []
for s in json.load(open(sys.argv[1])):
    k, v = s["Kind"], s["Value"]
    obj = {"int": lambda: int(v), "float": lambda: struct.unpack(">d", bytes.fromhex(v))[0],
           "str": lambda: v, "none": lambda: None, "bool": lambda: v == "1",
           "tuple": lambda: ()}[k]()
    want = pickle.dumps(obj, protocol=2).hex()
    if want != s["Ours"]:
        bad.append("%s %.40r: cpython %.80s, ours %.80s" % (k, obj, want, s["Ours"]))
print("\n".join(bad))
`
	path := filepath.Join(t.TempDir(), "samples.json")
	if err := os.WriteFile(path, in, 0o644); err != nil {
		t.Fatal(err)
	}
	if out := strings.TrimSpace(string(testenv.RunPython(t, py, script, path))); out != "" {
		t.Fatalf("bytes differ from CPython's protocol 2 pickler:\n%s", out)
	}
}

// TestPickleOpcodes walks the output with pickletools.genops: it must use
// exactly the opcodes listed in pickle.go (all MemoryViz.js reads), none
// newer than protocol 2, and this value must exercise every one of them, so
// the list cannot go stale in either direction.
func TestPickleOpcodes(t *testing.T) {
	py := testenv.Python3(t, "pickle", "pickletools")
	keys := make([]any, 300) // > 256 distinct strings: LONG_BINPUT, LONG_BINGET
	for i := range keys {
		keys[i] = fmt.Sprintf("key%d", i)
	}
	v := Dict{
		{"keys", keys},
		{"again", keys},
		{"ints", []any{1, 300, -1, 1 << 40, 70000}},
		{"misc", []any{nil, true, false, 1.5, ""}},
		{"tuples", []any{Tuple{}, Tuple{1}, Tuple{1, 2}, Tuple{1, 2, 3}, Tuple{1, 2, 3, 4}}},
		{"empty", map[string]any{}},
	}
	res := testenv.PickleOpcodes(t, py, Opcodes(), testenv.TempFile(t, "v.pickle", pickleEncode(t, v)))
	if len(res.Extra) > 0 {
		t.Errorf("encoder emitted opcodes outside the MemoryViz.js set: %v", res.Extra)
	}
	if len(res.Unused) > 0 {
		t.Errorf("listed opcodes this test never saw emitted (stale list or weak test): %v", res.Unused)
	}
}

// TestPickleBatches checks the batch layout directly: 2500 items make
// batches of 1000, 1000 and 500, each its own MARK … APPENDS.
func TestPickleBatches(t *testing.T) {
	items := make([]any, 2500)
	for i := range items {
		items[i] = 7 // BININT1 7: two bytes, never a MARK or APPENDS byte
	}
	b := pickleEncode(t, items)
	if got := bytes.Count(b, []byte{pkMark}); got != 3 {
		t.Errorf("%d MARKs, want 3", got)
	}
	if got := bytes.Count(b, []byte{pkAppends}); got != 3 {
		t.Errorf("%d APPENDS, want 3", got)
	}
	want := 2 + 1 + 3*2 + 2500*2 + 1 // PROTO 2, EMPTY_LIST, MARK+APPENDS ×3, items, STOP
	if len(b) != want {
		t.Errorf("%d bytes, want %d", len(b), want)
	}
}

func TestPickleUnsafeInts(t *testing.T) {
	for _, v := range []any{
		uint64(1) << 53, int64(1) << 53, -(int64(1) << 53), uint64(math.MaxUint64), int64(math.MinInt64),
		uint(1) << 60, int(1) << 62,
	} {
		err := NewEncoder(&bytes.Buffer{}).Encode(Dict{{"seg", []any{0, v}}})
		if !errors.Is(err, ErrUnsafeInt) {
			t.Errorf("%T %v: got %v, want ErrUnsafeInt", v, v, err)
			continue
		}
		if !strings.Contains(err.Error(), `$["seg"][1]`) {
			t.Errorf("%v: error does not say where: %v", v, err)
		}
	}
	// The largest safe magnitudes are fine.
	for _, v := range []any{uint64(MaxSafeInt), int64(MaxSafeInt), int64(-MaxSafeInt)} {
		if err := NewEncoder(&bytes.Buffer{}).Encode(v); err != nil {
			t.Errorf("%v: %v", v, err)
		}
	}
}

type pickleFailWriter struct{ after int }

func (w *pickleFailWriter) Write(p []byte) (int, error) {
	if w.after -= len(p); w.after < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

func TestPickleErrors(t *testing.T) {
	cyclic := []any{nil}
	cyclic[0] = cyclic
	boom := errors.New("boom")
	for _, c := range []struct {
		name string
		v    any
		is   error  // errors.Is target, if any
		msg  string // substring of the message
	}{
		{"struct", struct{}{}, ErrUnsupported, "struct {}"},
		{"int keys", map[int]string{1: "a"}, ErrUnsupported, "dict keys must be strings"},
		{"bytes", []byte("raw"), ErrUnsupported, "bytes"},
		{"chan", []any{make(chan int)}, ErrUnsupported, "$[0]"},
		{"complex", complex(1, 2), ErrUnsupported, "complex128"},
		{"invalid utf-8", Dict{{"name", "bad\xff"}}, nil, `$["name"]: string "bad\xff" is not valid UTF-8`},
		{"invalid utf-8 key", map[string]any{"\xfe": 1}, nil, "not valid UTF-8"},
		{"cycle", cyclic, nil, "a cycle?"},
		{"lazy item error", LazyList{Len: 3, Item: func(i int) (any, error) {
			if i == 2 {
				return nil, boom
			}
			return i, nil
		}}, boom, "$[2]: boom"},
		{"lazy without func", LazyList{Len: 1}, nil, "without an Item func"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			enc := NewEncoder(&buf)
			err := enc.Encode(c.v)
			if err == nil {
				t.Fatal("no error")
			}
			// The unfinished pickle is dropped and the encoder still works.
			if buf.Len() != 0 {
				t.Errorf("%d bytes written", buf.Len())
			}
			if err := enc.Encode([]any{1}); err != nil || !bytes.Equal(buf.Bytes(), []byte("\x80\x02](K\x01e.")) {
				t.Errorf("next Encode: %v, %q", err, buf.Bytes())
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("%v: not %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("%q does not contain %q", err, c.msg)
			}
		})
	}

	// A write error comes back as one, after the buffer fills or at Flush.
	// At 70 KiB the first 64 KiB go out and the final Flush fails.
	for _, after := range []int{0, 10, 70 << 10} {
		big := make([]any, 50000)
		for i := range big {
			big[i] = "some text"
		}
		err := NewEncoder(&pickleFailWriter{after: after}).Encode(big)
		if err == nil || !strings.Contains(err.Error(), "pickle: write: disk full") {
			t.Errorf("fail after %d bytes: got %v", after, err)
		}
	}
}

func TestPickleDeterministic(t *testing.T) {
	m := map[string]any{}
	for i := range 100 {
		m[strconv.Itoa(i)] = map[string]any{"x": i, "y": strconv.Itoa(i)}
	}
	first := pickleEncode(t, m)
	for range 5 {
		if !bytes.Equal(first, pickleEncode(t, m)) {
			t.Fatal("map output differs between runs")
		}
	}
}
