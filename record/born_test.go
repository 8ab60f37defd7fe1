package record

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/ledger"
)

// renames says "ready", and at a line on stdin writes a title over its
// argv and environment area as setproctitle does (the environment's
// strings copied to the heap first, environ pointed at the copies), says
// "renamed", and waits for stdin to close.
const renames = `#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {
	char buf[64];
	printf("ready\n");
	fflush(stdout);
	if (!fgets(buf, sizeof buf, stdin))
		return 1;
	char *end = argv[argc - 1] + strlen(argv[argc - 1]) + 1;
	int n = 0;
	while (environ[n])
		n++;
	if (n)
		end = environ[n - 1] + strlen(environ[n - 1]) + 1;
	char **copy = malloc((n + 1) * sizeof *copy);
	for (int i = 0; i < n; i++)
		copy[i] = strdup(environ[i]);
	copy[n] = NULL;
	environ = copy;
	memset(argv[0], 0, end - argv[0]);
	strcpy(argv[0], "ray::Worker");
	printf("renamed\n");
	fflush(stdout);
	while (read(0, buf, sizeof buf) > 0)
		;
	return 0;
}
`

// TestBornIdentity: with every process traced (--all), a process whose
// loader's first note shows no CUDA is not captured, but who it is then
// is kept: its read after it renamed itself keeps the command line it
// started with (no longer in its memory), and its job and rank.
func TestBornIdentity(t *testing.T) {
	cc := testenv.LookPath(t, "gcc")
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "renames.c"), filepath.Join(dir, "renames")
	if err := os.WriteFile(src, []byte(renames), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "--worker", "7")
	cmd.Env = []string{"RANK=2", "WORLD_SIZE=4", "TORCHELASTIC_RUN_ID=born"}
	in, _ := cmd.StdinPipe()
	outPipe, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	out := bufio.NewReader(outPipe)
	expect := func(want string) {
		t.Helper()
		if line, err := out.ReadString('\n'); strings.TrimSpace(line) != want {
			t.Fatalf("renames said %q (%v), want %q", line, err, want)
		}
	}
	expect("ready")
	pid := uint32(cmd.Process.Pid)
	var stderr bytes.Buffer
	s := newState(Options{All: true, NoPythonFrames: true, Stderr: &stderr}, &Result{Ledger: ledger.New()})
	s.mapped(pid, 1, nil) // its loader's note as it starts
	if s.lives[pid].pending != nil {
		t.Fatal("a process that maps no CUDA was captured")
	}
	io.WriteString(in, "rename\n")
	expect("renamed")
	s.mapped(pid, 2, nil) // a later note (an import), after the rename
	b := s.lives[pid].born
	if b == nil || !slices.Equal(b.Cmdline, cmd.Args) || b.JobID() != "torchrun:born" || b.Rank() != 2 {
		t.Fatalf("kept %+v, want its command line %q and rank 2 of torchrun:born", b, cmd.Args)
	}
	if stderr.Len() != 0 {
		t.Errorf("warnings: %s", stderr.String())
	}
}
