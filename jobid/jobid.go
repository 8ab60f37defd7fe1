// Package jobid reads a process's place in a distributed job from the
// environment it started with: the job it belongs to (one name shared by
// every process of the job, on every node) and its rank in it, as the
// launchers and schedulers of training jobs set them. It is a leaf: the
// environment comes from the caller (proc.Environ reads another process's
// with ptrace access only), and the result is plain data.
//
// Who sets what (each looked up in its own sources or documentation):
//
//   - PyTorch's torchrun (torch.distributed.elastic) sets, in each worker,
//     RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (the node's
//     rank), MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RUN_ID (the
//     rendezvous ID; "none" by default with static rendezvous) and
//     TORCHELASTIC_RESTART_COUNT (how often the agent restarted the
//     workers: an elastic job's attempt; see Attempt). Kubeflow's
//     PyTorchJob sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT itself
//     (and PET_NODE_RANK, PET_NNODES for torchrun in the pod).
//   - Slurm sets SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID (the task's
//     rank in the step), SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS (or
//     SLURM_STEP_NUM_TASKS) and SLURM_JOB_NAME in every task srun starts.
//   - Open MPI's mpirun sets OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//     OMPI_COMM_WORLD_LOCAL_RANK, and the job's ID as PMIX_NAMESPACE (and,
//     in 4.x, OMPI_MCA_ess_base_jobid); PMIx launchers PMIX_RANK; MPICH's
//     and Intel MPI's Hydra PMI_RANK and PMI_SIZE.
//   - Kubernetes JobSet sets JOBSET_NAME and REPLICATED_JOB_NAME in its
//     pods, and Indexed Jobs JOB_COMPLETION_INDEX; Kubeflow's TFJob
//     TF_CONFIG (a JSON object whose "task" has the role and index).
//   - Ray's raylet sets RAY_JOB_ID in every worker process it starts. Ray
//     Train gives a worker its rank after the process started (into
//     os.environ), where the environment it started with does not show it:
//     a Ray worker has its job and no rank.
//
// A process started by one launcher under another (torchrun in a Slurm
// step, mpirun in a JobSet pod) takes its rank from the innermost, which
// started it, and its job from the outermost, which spans every node.
package jobid

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
)

// Identity is a process's place in a distributed job. Fields not known are
// "" or -1 (WorldSize: 0).
type Identity struct {
	// Job names the job: the same for every process of it, on every
	// node, prefixed with what it comes from ("slurm:4242.0",
	// "torchrun:3f2a…", "mpi:93782017", "jobset:train", "ray:01000000",
	// "torch:10.0.0.1:29500" where only the rendezvous address is
	// shared). "" when the process is ranked but nothing names its job.
	Job string
	// Name is a person's name for the job where the scheduler has one
	// (SLURM_JOB_NAME, JOBSET_NAME).
	Name string
	// Launcher is what gave the rank: torchrun, torch (RANK without
	// torchrun's other variables), openmpi, pmix, pmi, slurm,
	// tensorflow, jobset; "" when the process has a job but no rank.
	Launcher string
	// Role is the process's part where the job has several (TF_CONFIG's
	// task type, JobSet's replicated job).
	Role      string
	Rank      int // in the job's world; -1 unknown
	LocalRank int // on its node; -1 unknown
	WorldSize int // processes in the world; 0 unknown
	NodeRank  int // its node's rank in the job; -1 unknown
	// Vars are the variables read, NAME=value, sorted (long values cut).
	Vars []string
}

// Attempt is the attempt of an elastic job the process belongs to (0 the
// first; torchrun's TORCHELASTIC_RESTART_COUNT, kept in Vars: a trace
// read back has it), -1 where nothing says.
func (id *Identity) Attempt() int {
	if id == nil {
		return -1
	}
	for _, v := range id.Vars {
		if n, ok := strings.CutPrefix(v, "TORCHELASTIC_RESTART_COUNT="); ok {
			if a, err := strconv.Atoi(n); err == nil && a >= 0 {
				return a
			}
		}
	}
	return -1
}

// Known reports whether id says anything: a nil Identity says nothing.
func (id *Identity) Known() bool { return id != nil && (id.Job != "" || id.Rank >= 0) }

// Ranked reports whether id has a rank.
func (id *Identity) Ranked() bool { return id != nil && id.Rank >= 0 }

// String names id for a person: "rank 3 of 8 in slurm:4242.0 (train)".
func (id *Identity) String() string {
	if !id.Known() {
		return ""
	}
	var b strings.Builder
	if id.Rank >= 0 {
		b.WriteString("rank " + strconv.Itoa(id.Rank))
		if id.WorldSize > 0 {
			b.WriteString(" of " + strconv.Itoa(id.WorldSize))
		}
		if id.Job != "" {
			b.WriteString(" in ")
		}
	}
	if id.Job != "" {
		b.WriteString(id.Job)
	}
	if id.Name != "" && !strings.HasSuffix(id.Job, ":"+id.Name) {
		b.WriteString(" (" + id.Name + ")")
	}
	return b.String()
}

// Names lists every variable FromEnv reads, for a caller that copies an
// environment's relevant part.
var Names = []string{
	"RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
	"MASTER_ADDR", "MASTER_PORT",
	"PET_NODE_RANK",
	"SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS",
	"SLURM_STEP_NUM_TASKS", "SLURM_JOB_NAME",
	"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_MCA_ess_base_jobid",
	"PMIX_NAMESPACE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
	"JOBSET_NAME", "REPLICATED_JOB_NAME", "JOB_COMPLETION_INDEX", "TF_CONFIG",
	"RAY_JOB_ID",
}

// maxValue cuts a value kept in Vars: TF_CONFIG lists every host of the
// cluster.
const maxValue = 256

// FromEnv reads the identity an environment (NAME=value strings, as
// proc.Environ returns them) gives; nil when it names neither a job nor a
// rank.
func FromEnv(environ []string) *Identity {
	env := map[string]string{}
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if ok && slices.Contains(Names, name) {
			env[name] = value
		}
	}
	if len(env) == 0 {
		return nil
	}
	id := &Identity{Rank: -1, LocalRank: -1, NodeRank: -1}
	id.rank(env)
	id.job(env)
	if !id.Known() {
		return nil
	}
	for name, value := range env {
		if len(value) > maxValue {
			value = value[:maxValue] + "…"
		}
		id.Vars = append(id.Vars, name+"="+value)
	}
	slices.Sort(id.Vars)
	return id
}

// rank takes the rank from the innermost launcher: the one whose
// variables are most specific to the process.
func (id *Identity) rank(env map[string]string) {
	num := func(name string) int {
		v, ok := env[name]
		if !ok {
			return -1
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 {
			return -1
		}
		return n
	}
	set := func(launcher, rank, local, world string) bool {
		r := num(rank)
		if r < 0 {
			return false
		}
		id.Launcher, id.Rank = launcher, r
		if local != "" {
			id.LocalRank = num(local)
		}
		if world != "" {
			id.WorldSize = max(num(world), 0)
		}
		return true
	}
	if set("torch", "RANK", "LOCAL_RANK", "WORLD_SIZE") {
		// RANK alone is the env:// convention (Kubeflow's PyTorchJob, a
		// script's own); with a run ID, torchrun set it.
		if env["TORCHELASTIC_RUN_ID"] != "" {
			id.Launcher = "torchrun"
		}
		id.NodeRank = max(num("GROUP_RANK"), num("PET_NODE_RANK"))
	} else {
		switch {
		case set("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"):
		case set("pmix", "PMIX_RANK", "", ""):
		case set("pmi", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"):
		case set("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS"):
			if id.WorldSize == 0 {
				id.WorldSize = max(num("SLURM_NTASKS"), 0)
			}
		case id.tfConfig(env["TF_CONFIG"]):
		case set("jobset", "JOB_COMPLETION_INDEX", "", ""):
			id.Role = env["REPLICATED_JOB_NAME"]
		}
	}
	if id.NodeRank < 0 {
		id.NodeRank = num("SLURM_NODEID")
	}
}

// tfConfig reads TensorFlow's TF_CONFIG: {"task": {"type": "worker",
// "index": 1}, "cluster": {...}}; the world is every task of the cluster.
func (id *Identity) tfConfig(v string) bool {
	if v == "" {
		return false
	}
	var c struct {
		Cluster map[string][]string `json:"cluster"`
		Task    struct {
			Type  string `json:"type"`
			Index *int   `json:"index"`
		} `json:"task"`
	}
	if json.Unmarshal([]byte(v), &c) != nil || c.Task.Index == nil || *c.Task.Index < 0 {
		return false
	}
	id.Launcher, id.Role, id.Rank = "tensorflow", c.Task.Type, *c.Task.Index
	for _, hosts := range c.Cluster {
		id.WorldSize += len(hosts)
	}
	return true
}

// job takes the job from the outermost scheduler: the one whose name
// every node of the job shares.
func (id *Identity) job(env map[string]string) {
	switch {
	case env["SLURM_JOB_ID"] != "":
		id.Job = "slurm:" + env["SLURM_JOB_ID"]
		if step := env["SLURM_STEP_ID"]; step != "" {
			id.Job += "." + step
		}
		id.Name = env["SLURM_JOB_NAME"]
	case env["JOBSET_NAME"] != "":
		id.Job, id.Name = "jobset:"+env["JOBSET_NAME"], env["JOBSET_NAME"]
		if id.Role == "" {
			id.Role = env["REPLICATED_JOB_NAME"]
		}
	case env["RAY_JOB_ID"] != "":
		id.Job = "ray:" + env["RAY_JOB_ID"]
	case env["TORCHELASTIC_RUN_ID"] != "" && env["TORCHELASTIC_RUN_ID"] != "none":
		id.Job = "torchrun:" + env["TORCHELASTIC_RUN_ID"]
	case env["PMIX_NAMESPACE"] != "":
		id.Job = "mpi:" + env["PMIX_NAMESPACE"]
	case env["OMPI_MCA_ess_base_jobid"] != "":
		id.Job = "mpi:" + env["OMPI_MCA_ess_base_jobid"]
	case env["MASTER_ADDR"] != "" && id.Rank >= 0:
		// Static rendezvous (torchrun's default run ID "none", a
		// PyTorchJob): the address every rank meets at is what they
		// share.
		id.Job = "torch:" + env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]
	}
}
