// Command btprobes prints a bpftrace script that puts on a library the
// probes cudatrace attaches to it (loader.Tables: an entry probe on each
// function the library defines, a return probe where cudatrace has one),
// each collecting what cudatrace's does: the arguments at entry, and the
// user stack where the record is made. bench/startup.sh runs it beside
// `cudatrace record` on the same command.
//
// Usage: go run ./bench/btprobes LIBRARY
package main

import (
	"fmt"
	"os"

	"github.com/cudatrace/cudatrace/loader"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: btprobes LIBRARY")
		os.Exit(2)
	}
	lib := os.Args[1]
	fns, err := loader.ProbedFunctions(lib)
	if err != nil || len(fns) == 0 {
		fmt.Fprintf(os.Stderr, "btprobes: %s defines none of cudatrace's functions (%v)\n", lib, err)
		os.Exit(1)
	}
	n := 0
	for _, t := range loader.Tables {
		for _, p := range t.Probes {
			if _, ok := fns[p.Symbol]; !ok {
				continue
			}
			at := fmt.Sprintf("%s:%s", lib, p.Symbol)
			if p.Shape.Returns() {
				fmt.Printf("uprobe:%s { @a[tid] = arg1; }\n", at)
				fmt.Printf("uretprobe:%s { printf(\"%%s %%d %%d %%d %%s\\n\", probe, pid, tid, @a[tid], ustack); delete(@a[tid]); }\n", at)
				n += 2
			} else {
				fmt.Printf("uprobe:%s { printf(\"%%s %%d %%d %%p %%s\\n\", probe, pid, tid, arg0, ustack); }\n", at)
				n++
			}
		}
	}
	fmt.Fprintf(os.Stderr, "btprobes: %d probes on %s\n", n, lib)
}
