package jobid

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestFromEnv(t *testing.T) {
	base := []string{"PATH=/usr/bin", "HOME=/root"}
	for _, c := range []struct {
		name string
		env  []string
		want *Identity // Vars left out
		str  string
	}{
		{"no job", nil, nil, ""},
		{"torchrun", []string{"RANK=3", "LOCAL_RANK=1", "WORLD_SIZE=8", "GROUP_RANK=1", "TORCHELASTIC_RUN_ID=5c6a",
			"MASTER_ADDR=node-a", "MASTER_PORT=29500"},
			&Identity{Job: "torchrun:5c6a", Launcher: "torchrun", Rank: 3, LocalRank: 1, WorldSize: 8, NodeRank: 1},
			"rank 3 of 8 in torchrun:5c6a"},
		// torchrun's default static rendezvous: run ID "none", shared by
		// every such job; the master's address is what the ranks share.
		{"torchrun static", []string{"RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=2", "TORCHELASTIC_RUN_ID=none",
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"},
			&Identity{Job: "torch:127.0.0.1:29500", Launcher: "torchrun", Rank: 0, LocalRank: 0, WorldSize: 2, NodeRank: -1},
			"rank 0 of 2 in torch:127.0.0.1:29500"},
		{"pytorchjob", []string{"RANK=2", "WORLD_SIZE=4", "MASTER_ADDR=mnist-master-0", "MASTER_PORT=23456", "PET_NODE_RANK=2"},
			&Identity{Job: "torch:mnist-master-0:23456", Launcher: "torch", Rank: 2, LocalRank: -1, WorldSize: 4, NodeRank: 2},
			"rank 2 of 4 in torch:mnist-master-0:23456"},
		{"slurm", []string{"SLURM_JOB_ID=4242", "SLURM_STEP_ID=0", "SLURM_PROCID=5", "SLURM_LOCALID=1", "SLURM_NODEID=2",
			"SLURM_NTASKS=8", "SLURM_JOB_NAME=train"},
			&Identity{Job: "slurm:4242.0", Name: "train", Launcher: "slurm", Rank: 5, LocalRank: 1, WorldSize: 8, NodeRank: 2},
			"rank 5 of 8 in slurm:4242.0 (train)"},
		// torchrun in a Slurm step: the rank is torchrun's, the job Slurm's
		// (SLURM_PROCID is the torchrun's task, one per node).
		{"torchrun in slurm", []string{"SLURM_JOB_ID=4242", "SLURM_STEP_ID=1", "SLURM_PROCID=1", "SLURM_NODEID=1",
			"RANK=6", "LOCAL_RANK=2", "WORLD_SIZE=8", "GROUP_RANK=1", "TORCHELASTIC_RUN_ID=none"},
			&Identity{Job: "slurm:4242.1", Launcher: "torchrun", Rank: 6, LocalRank: 2, WorldSize: 8, NodeRank: 1},
			"rank 6 of 8 in slurm:4242.1"},
		// Open MPI 4.1's mpirun, as it sets them (seen here, 4.1.4).
		{"openmpi", []string{"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1",
			"OMPI_MCA_ess_base_jobid=93782017", "PMIX_NAMESPACE=93782017", "PMIX_RANK=1"},
			&Identity{Job: "mpi:93782017", Launcher: "openmpi", Rank: 1, LocalRank: 1, WorldSize: 4, NodeRank: -1},
			"rank 1 of 4 in mpi:93782017"},
		{"mpich", []string{"PMI_RANK=7", "PMI_SIZE=16", "MPI_LOCALRANKID=3"},
			&Identity{Launcher: "pmi", Rank: 7, LocalRank: 3, WorldSize: 16, NodeRank: -1}, "rank 7 of 16"},
		{"jobset with torchrun", []string{"JOBSET_NAME=llama", "REPLICATED_JOB_NAME=trainer", "JOB_COMPLETION_INDEX=1",
			"RANK=9", "WORLD_SIZE=16", "TORCHELASTIC_RUN_ID=llama"},
			&Identity{Job: "jobset:llama", Name: "llama", Launcher: "torchrun", Role: "trainer", Rank: 9, LocalRank: -1,
				WorldSize: 16, NodeRank: -1}, "rank 9 of 16 in jobset:llama"},
		{"jobset alone", []string{"JOBSET_NAME=sim", "REPLICATED_JOB_NAME=workers", "JOB_COMPLETION_INDEX=4"},
			&Identity{Job: "jobset:sim", Name: "sim", Launcher: "jobset", Role: "workers", Rank: 4, LocalRank: -1, NodeRank: -1},
			"rank 4 in jobset:sim"},
		{"tfjob", []string{`TF_CONFIG={"cluster":{"chief":["a:2222"],"worker":["b:2222","c:2222"]},"task":{"type":"worker","index":1}}`},
			&Identity{Launcher: "tensorflow", Role: "worker", Rank: 1, LocalRank: -1, WorldSize: 3, NodeRank: -1}, "rank 1 of 3"},
		{"ray worker", []string{"RAY_JOB_ID=01000000", "RAY_RAYLET_PID=77"},
			&Identity{Job: "ray:01000000", Rank: -1, LocalRank: -1, NodeRank: -1}, "ray:01000000"},
		{"bad numbers", []string{"RANK=x", "OMPI_COMM_WORLD_RANK=-1", "SLURM_PROCID=2"},
			&Identity{Launcher: "slurm", Rank: 2, LocalRank: -1, NodeRank: -1}, "rank 2"},
		{"master alone", []string{"MASTER_ADDR=h", "MASTER_PORT=1"}, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := FromEnv(append(append([]string{}, base...), c.env...))
			if got != nil {
				var want []string // what it read: the job's variables, not the others
				for _, kv := range c.env {
					if name, _, _ := strings.Cut(kv, "="); slices.Contains(Names, name) {
						want = append(want, kv)
					}
				}
				slices.Sort(want)
				if !slices.Equal(got.Vars, want) {
					t.Errorf("vars %q, want %q", got.Vars, want)
				}
				got.Vars = nil
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("FromEnv(%q)\n got %+v\nwant %+v", c.env, got, c.want)
			}
			if s := got.String(); s != c.str {
				t.Errorf("String() = %q, want %q", s, c.str)
			}
		})
	}
}

// A long value (TF_CONFIG lists the whole cluster) is cut in Vars.
func TestFromEnvCutsLongValues(t *testing.T) {
	long := `TF_CONFIG={"task":{"type":"worker","index":0},"cluster":{"worker":["` + strings.Repeat("h", 1000) + `"]}}`
	id := FromEnv([]string{long})
	if id == nil || len(id.Vars) != 1 || len(id.Vars[0]) > len("TF_CONFIG=")+maxValue+len("…") {
		t.Fatalf("%+v", id)
	}
	if id.Rank != 0 || id.WorldSize != 1 {
		t.Errorf("rank %d world %d, want 0 of 1", id.Rank, id.WorldSize)
	}
}
