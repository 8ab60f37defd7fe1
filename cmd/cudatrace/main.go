// Command cudatrace traces the GPU memory allocations of CUDA programs from
// outside them, with eBPF uprobes on the CUDA libraries.
package main

import "os"

func main() { os.Exit(run(os.Args[1:])) }
