package vmtest

// The real-GPU suite (vmtest/gpu) run here on its stand-in check: the same
// machinery that compares cudatrace with PyTorch, JAX and CuPy on a GPU
// machine (record, memviz export at each checkpoint's time, comparison,
// results files), against the stand-in libcudart. Privileged.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

type suiteResults struct {
	Results []struct {
		Check       string   `json:"check"`
		Status      string   `json:"status"`
		Reason      string   `json:"reason"`
		Problems    []string `json:"problems"`
		Checkpoints []struct {
			Label    string `json:"label"`
			Reserved struct {
				Framework uint64 `json:"framework"`
				Cudatrace uint64 `json:"cudatrace"`
			} `json:"reserved"`
		} `json:"checkpoints"`
	} `json:"results"`
}

func runSuite(t *testing.T, dir string, env []string, args ...string) (suiteResults, int, string) {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		skipOrFail(t, "no python3: %v", err)
	}
	_, file, _, _ := runtime.Caller(0)
	suite := filepath.Join(filepath.Dir(file), "gpu", "suite.py")
	cmd := exec.CommandContext(testContext(t), python, append([]string{suite, "--cudatrace", tracerBin, "--out", dir,
		"--python", python}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("suite.py: %v\n%s", err, out)
	}
	var res suiteResults
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatalf("no results.json (%v); suite.py said:\n%s", err, out)
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	return res, code, string(out)
}

// TestGPUSuiteStandin: the stand-in check passes with every checkpoint
// equal, a workload that misreports its memory by 512 bytes fails it, and
// a framework that is missing is a skip, not a failure.
func TestGPUSuiteStandin(t *testing.T) {
	_, dir := traceSetup(t)
	res, code, out := runSuite(t, filepath.Join(dir, "ok"), nil, "--only", "standin", "--standin-lib", fakeLib)
	if code != 0 || len(res.Results) != 1 || res.Results[0].Status != "pass" {
		t.Fatalf("exit %d, results %+v\n%s", code, res.Results, out)
	}
	cps := res.Results[0].Checkpoints
	if len(cps) != 5 || cps[4].Label != "snapshot" {
		t.Fatalf("checkpoints %+v, want 4 rounds and the snapshot", cps)
	}
	for i, cp := range cps {
		if cp.Reserved.Cudatrace != cp.Reserved.Framework || cp.Reserved.Cudatrace == 0 ||
			(i > 0 && cp.Reserved.Framework == cps[i-1].Reserved.Framework && i < 4) {
			t.Errorf("checkpoint %+v: want equal, non-zero, and changing from round to round", cp)
		}
	}

	res, code, out = runSuite(t, filepath.Join(dir, "lie"), []string{"STANDIN_LIE=512"}, "--only", "standin",
		"--standin-lib", fakeLib)
	if code != 1 || len(res.Results) != 1 || res.Results[0].Status != "fail" || len(res.Results[0].Problems) != 5 ||
		!strings.Contains(res.Results[0].Problems[0], "(-512)") {
		t.Fatalf("a workload 512 bytes off: exit %d, results %+v\n%s", code, res.Results, out)
	}

	if exec.Command("python3", "-c", "import torch").Run() == nil {
		return // a machine with PyTorch: the GPU run is the suite's own business
	}
	res, code, out = runSuite(t, filepath.Join(dir, "skip"), nil, "--only", "torch-native")
	if code != 0 || len(res.Results) != 1 || res.Results[0].Status != "skip" ||
		!strings.Contains(res.Results[0].Reason, "torch is not installed") {
		t.Fatalf("without PyTorch: exit %d, results %+v\n%s", code, res.Results, out)
	}
}

// TestGPUSuiteParsing runs suite.py's own unit tests (vmtest/gpu/
// suite_test.py): how it reads PyTorch's `_memory_viz stats` output and
// the trace's times. No GPU, no root.
func TestGPUSuiteParsing(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		skipOrFail(t, "no python3: %v", err)
	}
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.CommandContext(testContext(t), python, "-m", "unittest", "-v", "suite_test")
	cmd.Dir = filepath.Join(filepath.Dir(file), "gpu")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("suite_test.py: %v\n%s", err, out)
	}
}
