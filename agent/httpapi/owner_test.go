package httpapi

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// owner_live_bytes: the GPU memory (segments) of each running process by
// device and owner, or per device and owner without process labels.
func TestMetricsOwner(t *testing.T) {
	pid := fmt.Sprintf(`pid="%d",pod="",pod_uid="",rank="3"`, os.Getpid())
	for _, c := range []struct {
		labels bool
		want   []string
	}{
		{true, []string{
			`cudatrace_owner_live_bytes{UUID="GPU-aaaa",comm="job",container="",container_id="",gpu="0",job_id="slurm:42.0",namespace="",owner="application",` + pid + `} 100`,
			`cudatrace_owner_live_bytes{UUID="",comm="job",container="",container_id="",gpu="1",job_id="slurm:42.0",namespace="",owner="application",` + pid + `} 40`}},
		{false, []string{
			`cudatrace_owner_live_bytes{UUID="GPU-aaaa",gpu="0",owner="application"} 100`,
			`cudatrace_owner_live_bytes{UUID="",gpu="1",owner="application"} 40`}},
	} {
		_, body := fetch(t, serve(t, Options{ProcessLabels: c.labels}).URL+"/metrics")
		for _, w := range c.want {
			if !strings.Contains(body, w+"\n") {
				t.Errorf("/metrics lacks %s", w)
			}
		}
		// Tensors lie inside segments: never counted again.
		if n := strings.Count(body, "cudatrace_owner_live_bytes{"); n != 2 {
			t.Errorf("%d owner_live_bytes series, want 2", n)
		}
	}
}
