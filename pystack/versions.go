package pystack

import (
	"fmt"
	"maps"
	"slices"
)

// versions are the CPython versions cudatrace reads, by minor version
// (3.minor): for each, all that the tracer knows of it that is not the
// same for every version. Nothing else in cudatrace says what a version
// is; the code branches on these facts, never on a version number.
//
// Adding a version (3.16) is one entry here and one test case: a line
// in probeVersions (probe_test.go), the interpreter TestLayoutProbe runs
// its probe under, which checks every offset read against that
// interpreter's own memory and names its frames with this package's
// code. TestVersions fails while a version has no such line. The entry
// takes no figure copied by hand: a version that describes itself in
// _Py_DebugOffsets (3.13 on) gives where its sections start (compare its
// Include/internal/pycore_debug_offsets.h with the last version's), and
// one that does not takes a table generated from a build's DWARF
// (tables.go, TestOffsetTables -update). BPF is told the minor itself
// (struct ct_pyoffsets, Interp.BPF); its walk (bpf/python.h) tells 3.10
// and 3.11 apart from the rest and takes 3.12 on alike, so a version
// whose frames are kept as 3.13's needs nothing new there.
var versions = map[int]version{
	10: {frames: frameObjects, table: &offsets310},
	11: {frames: frameEntry, locations: true, table: &offsets311},
	12: {frames: frameOwner, locations: true, table: &offsets312, entryOwner: 3},
	13: {frames: frameCurrent, locations: true, entryOwner: 3,
		debug: &debugSection{ts: 19, frame: 28, code: 34, pyobject: 44, bytes: 64, unicode: 67, tsThreadID: 5, tsNativeID: 6}},
	// 3.14 added members to three _Py_DebugOffsets sections:
	// interpreter_state (threads_main after threads_head;
	// code_object_generation and tlbc_generation at its end),
	// interpreter_frame (stackpointer, tlbc_index) and code_object
	// (co_tlbc). FRAME_OWNED_BY_INTERPRETER took FRAME_OWNED_BY_CSTACK's 3.
	14: {frames: frameCurrent, locations: true, entryOwner: 3,
		debug: &debugSection{ts: 22, frame: 31, code: 39, pyobject: 50, bytes: 74, unicode: 77, tsThreadID: 5, tsNativeID: 6, interpCodeGen: 20}},
	// 3.15 added eight members to thread_state, three of them between
	// current_frame and thread_id (which moved from +5 to +8), and four
	// words between type_object and tuple; its frame, code, bytes and
	// unicode members are 3.14's.
	15: {frames: frameCurrent, locations: true, entryOwner: 3,
		debug: &debugSection{ts: 22, frame: 39, code: 47, pyobject: 58, bytes: 86, unicode: 89, tsThreadID: 8, tsNativeID: 9, interpCodeGen: 20}},
}

// version is what differs between CPython minor versions.
type version struct {
	// frames is how its threads keep their frames: what the walks read
	// (dwarfOffsets names the members, bpf/python.h follows them).
	frames frameKind
	// locations: its line table is the location table of 3.11 on
	// (Objects/locations.md), counted in code units, and a code object's
	// Py_SIZE is its number of code units; else 3.10's co_linetable of
	// (bytecode delta, line delta) byte pairs, counted in bytes.
	locations bool
	// entryOwner is the owner (_PyInterpreterFrame.owner, frames from
	// frameOwner on) of the shim frame each C call of the interpreter
	// loop starts with (FRAME_OWNED_BY_CSTACK, 3.14's
	// FRAME_OWNED_BY_INTERPRETER); bpf/python.h takes it as 3.
	entryOwner uint8
	// table is the structure offsets of its release builds for x86-64 and
	// arm64, taken where a build has no _Py_DebugOffsets (table.go); nil
	// where there is none.
	table *offsets
	// debug says where its _Py_DebugOffsets sections start; nil before
	// 3.13, which have none.
	debug *debugSection
}

// frameKind is how a version's threads keep their frames.
type frameKind int

const (
	// frameObjects (3.10): the thread state's frame, a PyFrameObject;
	// f_back, f_code, f_lasti (in bytes).
	frameObjects frameKind = iota
	// frameEntry (3.11): _PyInterpreterFrame, the current one in the
	// thread state's cframe; previous, f_code, prev_instr, and is_entry
	// set on the first frame of each C call of the interpreter loop.
	frameEntry
	// frameOwner (3.12): as 3.11, the entry frames told by owner
	// (entryOwner) instead of is_entry.
	frameOwner
	// frameCurrent (3.13 on): the thread state's current_frame;
	// previous, f_executable, instr_ptr, owner.
	frameCurrent
)

// debugSection says where a version's _Py_DebugOffsets sections start, in
// words from its start (each section's first word is its structure's
// size), and where in the thread_state section its thread ids are. The
// members the walk reads keep their place within each section: thread
// state next (+2) and current_frame (+4); interpreter frame previous (+1),
// executable (+2), instr_ptr (+3), owner (+5); code object filename (+1)
// to firstlineno (+5), co_code_adaptive (+9); bytes ob_sval (+2); unicode
// state (+1), length (+2), asciiobject_size (+3); thread state interp
// (+3). interpCodeGen is the word of the interpreter_state section's
// code_object_generation (3.14 on; 0 before, which have none): the count
// of the interpreter's code objects freed, which CPython's code_dealloc
// counts up before it frees one (Objects/codeobject.c), for remote
// debuggers to know their caches of code objects stale; bpf/pycode.h
// py_check takes it for that.
type debugSection struct {
	ts, frame, code, pyobject, bytes, unicode int
	tsThreadID, tsNativeID                    int
	interpCodeGen                             int
}

// oldestMinor and newestMinor are the oldest and newest CPython read:
// 3.oldestMinor to 3.newestMinor, each in versions. Another is refused by
// name (DetectQuick).
var oldestMinor, newestMinor = slices.Min(slices.Collect(maps.Keys(versions))), slices.Max(slices.Collect(maps.Keys(versions)))

// Versions names the CPython versions read, for users: "3.10 to 3.15".
func Versions() string { return fmt.Sprintf("3.%d to 3.%d", oldestMinor, newestMinor) }
