// Package kubetest is a fake kubelet pod-resources server for tests: the
// real API package's gRPC service, on a unix socket, answering List with
// what the test sets.
package kubetest

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Server answers List with its pods.
type Server struct {
	podresources.UnimplementedPodResourcesListerServer
	mu    sync.Mutex
	pods  []*podresources.PodResources
	lists atomic.Int64
	srv   *grpc.Server
	done  chan struct{}
}

// Pod is one pod's answer: containers by name, each with its device IDs
// of resource (e.g. "nvidia.com/gpu").
func Pod(namespace, name string, containers ...*podresources.ContainerResources) *podresources.PodResources {
	return &podresources.PodResources{Namespace: namespace, Name: name, Containers: containers}
}

// Container is a container with the device IDs of resource allocated.
func Container(name, resource string, ids ...string) *podresources.ContainerResources {
	c := &podresources.ContainerResources{Name: name}
	if len(ids) > 0 {
		c.Devices = []*podresources.ContainerDevices{{ResourceName: resource, DeviceIds: ids}}
	}
	return c
}

// Serve listens on the unix socket path and serves pods until Stop.
func Serve(path string, pods ...*podresources.PodResources) (*Server, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	s := &Server{pods: pods, srv: grpc.NewServer(), done: make(chan struct{})}
	podresources.RegisterPodResourcesListerServer(s.srv, s)
	go func() { defer close(s.done); s.srv.Serve(ln) }()
	return s, nil
}

// Set replaces the pods listed.
func (s *Server) Set(pods ...*podresources.PodResources) {
	s.mu.Lock()
	s.pods = pods
	s.mu.Unlock()
}

// Lists is how many List calls were answered.
func (s *Server) Lists() int64 { return s.lists.Load() }

// List is the API's.
func (s *Server) List(context.Context, *podresources.ListPodResourcesRequest) (*podresources.ListPodResourcesResponse, error) {
	s.lists.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	return &podresources.ListPodResourcesResponse{PodResources: s.pods}, nil
}

// Stop ends the server (and removes its socket).
func (s *Server) Stop() {
	s.srv.Stop()
	<-s.done
}
