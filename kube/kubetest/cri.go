package kubetest

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Runtime is a stand-in container runtime: the CRI's RuntimeService (the
// real API package's) on a unix socket, answering ContainerStatus,
// ListContainers and PodSandboxStatus for the containers the test adds.
type Runtime struct {
	cri.UnimplementedRuntimeServiceServer
	mu         sync.Mutex
	containers map[string]RuntimeContainer
	calls      atomic.Int64
	srv        *grpc.Server
	done       chan struct{}
}

// RuntimeContainer is one container as the kubelet made it. With
// SandboxOnly its pod's names are on its sandbox alone, not its labels.
type RuntimeContainer struct {
	ID, Name, Namespace, Pod, PodUID string
	SandboxOnly                      bool
}

// ServeRuntime serves the CRI on the unix socket path until Stop.
func ServeRuntime(path string, cs ...RuntimeContainer) (*Runtime, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	r := &Runtime{containers: map[string]RuntimeContainer{}, srv: grpc.NewServer(), done: make(chan struct{})}
	r.Add(cs...)
	cri.RegisterRuntimeServiceServer(r.srv, r)
	go func() { defer close(r.done); r.srv.Serve(ln) }()
	return r, nil
}

// Add adds containers.
func (r *Runtime) Add(cs ...RuntimeContainer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		r.containers[c.ID] = c
	}
}

// Calls is how many calls were answered.
func (r *Runtime) Calls() int64 { return r.calls.Load() }

func (r *Runtime) get(id string) (RuntimeContainer, error) {
	r.calls.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return c, status.Errorf(codes.NotFound, "container %q not found", id)
	}
	return c, nil
}

// ContainerStatus is the API's.
func (r *Runtime) ContainerStatus(_ context.Context, req *cri.ContainerStatusRequest) (*cri.ContainerStatusResponse, error) {
	c, err := r.get(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	labels := map[string]string{"io.kubernetes.container.name": c.Name}
	if !c.SandboxOnly {
		labels["io.kubernetes.pod.name"] = c.Pod
		labels["io.kubernetes.pod.namespace"] = c.Namespace
		labels["io.kubernetes.pod.uid"] = c.PodUID
	}
	return &cri.ContainerStatusResponse{Status: &cri.ContainerStatus{Id: c.ID, Metadata: &cri.ContainerMetadata{Name: c.Name},
		State: cri.ContainerState_CONTAINER_RUNNING, Labels: labels}}, nil
}

// ListContainers is the API's (by ID only).
func (r *Runtime) ListContainers(_ context.Context, req *cri.ListContainersRequest) (*cri.ListContainersResponse, error) {
	c, err := r.get(req.GetFilter().GetId())
	if err != nil {
		return &cri.ListContainersResponse{}, nil
	}
	return &cri.ListContainersResponse{Containers: []*cri.Container{{Id: c.ID, PodSandboxId: "sandbox-" + c.ID}}}, nil
}

// PodSandboxStatus is the API's.
func (r *Runtime) PodSandboxStatus(_ context.Context, req *cri.PodSandboxStatusRequest) (*cri.PodSandboxStatusResponse, error) {
	id := req.GetPodSandboxId()
	if len(id) < 8 {
		return nil, status.Error(codes.NotFound, "no sandbox")
	}
	c, err := r.get(id[len("sandbox-"):])
	if err != nil {
		return nil, err
	}
	return &cri.PodSandboxStatusResponse{Status: &cri.PodSandboxStatus{Id: id,
		Metadata: &cri.PodSandboxMetadata{Name: c.Pod, Namespace: c.Namespace, Uid: c.PodUID}}}, nil
}

// Stop ends the server.
func (r *Runtime) Stop() {
	r.srv.Stop()
	<-r.done
}
