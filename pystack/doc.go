// Package pystack is what cudatrace knows of CPython 3.10 to 3.15: the one
// home for Python frames outside BPF (bpf/python.h walks a thread's
// frames at each allocation, bpf/pycode.h captures code objects; package
// events decodes what they write).
//
// The rest of cudatrace calls:
//
//   - DetectQuick (a process's mappings), DetectFile (an interpreter file),
//     SystemInterpreters and InterpreterFiles (where interpreters are):
//     an Interp, the interpreter and its structures' layout, from its
//     _Py_DebugOffsets (3.13 on; free-threaded builds are refused), its
//     DWARF, or its minor version's table (release builds of 3.10 to
//     3.12 without DWARF: table.go, tables.go). Finish adds the parts of
//     the interpreter loop only the full symbol table names.
//   - Interp.BPF and BPFFile: the layout as BPF takes it (struct
//     ct_pyoffsets), checked against what the walk and the capture read
//     (bpf.go); the loader puts it in its maps as it is.
//   - Interp.Parse (a code object from what BPF captured of it at its
//     first sight) and CodeInfo.Frame, else Interp.Code (read from the
//     process with process_vm_readv, proc.Mem: ptrace access only, the
//     process never stopped): a frame's file, function and line, from the
//     code object's line table.
//   - Table, Merge and the rest of frames.go: a process's Python frames
//     numbered, merged into its native stacks, and named again.
//
// What differs between CPython versions is versions.go's table, one entry
// per minor version: adding a version is an entry there and a line in
// TestLayoutProbe's probeVersions.
package pystack
