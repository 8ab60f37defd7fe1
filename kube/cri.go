package kube

// cri.go: a container's Kubernetes names from the container runtime, over
// the CRI (k8s.io/cri-api's RuntimeService, the socket the kubelet itself
// talks to: containerd's, CRI-O's, cri-dockerd's). The kubelet labels every
// container it creates with its pod's name, namespace and UID and its own
// name (io.kubernetes.pod.name, ...), and ContainerStatus returns them for
// a container ID, which is what a process's cgroup says (package
// container). So a process in a pod is named by its own container, whatever
// GPU it uses and however that GPU is shared (time-slicing, MPS, MIG, the
// device plugin's index names), where the pod-resources join by GPU
// (podresources.go) cannot tell the pods on one GPU apart.
//
// Lookups run on the resolver's goroutine: Names never waits; an ID it
// does not know yet is asked for, and named at a later call.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The kubelet's labels on a container (and on its pod's sandbox).
const (
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelContainerName = "io.kubernetes.container.name"
)

// CRISockets are where the container runtimes serve the CRI, tried in
// order when no socket is given.
var CRISockets = []string{
	"/run/containerd/containerd.sock",
	"/run/crio/crio.sock",
	"/run/k3s/containerd/containerd.sock",
	"/run/cri-dockerd.sock",
	"/var/run/cri-dockerd.sock",
}

// CRIOptions tune a CRI resolver.
type CRIOptions struct {
	// Socket is the runtime's CRI socket; "" tries CRISockets.
	Socket string
	Stderr io.Writer // one line when the runtime is absent or fails
	// Retry is how long a failed or unknown ID waits before it is asked
	// again; 0 means 10 s.
	Retry time.Duration
}

// Pod is what the runtime says of a container: its names and its pod's UID.
type Pod struct {
	Names
	UID string
}

const (
	criTimeout = 2 * time.Second
	criMax     = 16 << 10 // IDs remembered; past it, the oldest answers go
	criQueue   = 256
)

// CRI resolves container IDs to their pod's names.
type CRI struct {
	opts   CRIOptions
	mu     sync.Mutex
	known  map[string]criEntry
	order  []string // of known, oldest first
	asks   chan string
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	said   map[string]bool // the loop's
}

type criEntry struct {
	pod     Pod
	ok      bool      // the runtime named it
	pending bool      // asked, no answer yet
	retry   time.Time // a failed or unnamed ID is asked again after it
}

// StartCRI starts a resolver. A runtime that is absent or fails gives one
// line on Stderr and no names, never wrong ones.
func StartCRI(opts CRIOptions) *CRI {
	if opts.Stderr == nil {
		opts.Stderr = io.Discard
	}
	if opts.Retry <= 0 {
		opts.Retry = 10 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &CRI{opts: opts, known: map[string]criEntry{}, asks: make(chan string, criQueue), cancel: cancel,
		done: make(chan struct{}), said: map[string]bool{}}
	go c.loop(ctx)
	return c
}

// Names returns what the runtime said of container id; false while it is
// unknown (asked for now, at most every Retry).
func (c *CRI) Names(id string) (Pod, bool) {
	if c == nil || id == "" {
		return Pod{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, seen := c.known[id]
	if e.ok {
		return e.pod, true
	}
	if e.pending || (seen && time.Now().Before(e.retry)) {
		return Pod{}, false
	}
	select {
	case c.asks <- id:
		e.pending = true
		if !seen {
			c.order = append(c.order, id)
		}
		c.known[id] = e
		c.trim()
	default: // the loop is behind: asked again at a later call
	}
	return Pod{}, false
}

// trim forgets the oldest answers past criMax (c.mu held).
func (c *CRI) trim() {
	for len(c.order) > criMax {
		id := c.order[0]
		c.order = c.order[1:]
		if !c.known[id].pending {
			delete(c.known, id)
		} else {
			c.order = append(c.order, id)
			break
		}
	}
}

// Close stops the resolver.
func (c *CRI) Close() {
	if c == nil {
		return
	}
	c.once.Do(func() {
		c.cancel()
		<-c.done
	})
}

func (c *CRI) loop(ctx context.Context) {
	defer close(c.done)
	var conn *grpc.ClientConn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for {
		var id string
		select {
		case <-ctx.Done():
			return
		case id = <-c.asks:
		}
		pod, err := c.ask(ctx, &conn, id)
		c.mu.Lock()
		e := criEntry{pod: pod, ok: err == nil, retry: time.Now().Add(c.opts.Retry)}
		if _, still := c.known[id]; still {
			c.known[id] = e
		}
		c.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			c.sayOnce(err)
		}
	}
}

// errNoRuntime: no CRI socket found.
var errNoRuntime = errors.New("no container runtime socket")

// errNotPod: a container the kubelet did not make (no pod labels).
var errNotPod = errors.New("not a Kubernetes container")

func (c *CRI) socket() (string, error) {
	if c.opts.Socket != "" {
		if _, err := os.Stat(c.opts.Socket); err != nil {
			return "", fmt.Errorf("%w: %v", errNoRuntime, err)
		}
		return c.opts.Socket, nil
	}
	for _, s := range CRISockets {
		if _, err := os.Stat(s); err == nil {
			return s, nil
		}
	}
	return "", errNoRuntime
}

func (c *CRI) ask(ctx context.Context, conn **grpc.ClientConn, id string) (Pod, error) {
	if *conn == nil {
		sock, err := c.socket()
		if err != nil {
			return Pod{}, err
		}
		cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)))
		if err != nil {
			return Pod{}, err
		}
		*conn = cc
	}
	ctx, cancel := context.WithTimeout(ctx, criTimeout)
	defer cancel()
	rt := cri.NewRuntimeServiceClient(*conn)
	resp, err := rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return Pod{}, errNotPod // not the runtime's: docker without the CRI, podman
		}
		return Pod{}, err
	}
	st := resp.GetStatus()
	l := st.GetLabels()
	p := Pod{Names: Names{Namespace: l[LabelPodNamespace], Pod: l[LabelPodName], Container: l[LabelContainerName]},
		UID: l[LabelPodUID]}
	if p.Container == "" {
		p.Container = st.GetMetadata().GetName()
	}
	if p.Pod == "" || p.Namespace == "" {
		// Labels left out: the pod's sandbox has its metadata.
		list, err := rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{Id: id}})
		if err != nil {
			return Pod{}, err
		}
		if len(list.GetContainers()) != 1 {
			return Pod{}, errNotPod
		}
		sb, err := rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: list.GetContainers()[0].GetPodSandboxId()})
		if err != nil {
			return Pod{}, err
		}
		m := sb.GetStatus().GetMetadata()
		p.Pod, p.Namespace, p.UID = m.GetName(), m.GetNamespace(), m.GetUid()
	}
	if p.Pod == "" || p.Namespace == "" {
		return Pod{}, errNotPod
	}
	return p, nil
}

// sayOnce writes one line per kind of failure for the resolver's life (a
// container that is not a pod's says nothing).
func (c *CRI) sayOnce(err error) {
	if errors.Is(err, errNotPod) {
		return
	}
	key := "error"
	if errors.Is(err, errNoRuntime) {
		key = "absent"
	}
	if c.said[key] {
		return
	}
	c.said[key] = true
	if key == "absent" {
		where := c.opts.Socket
		if where == "" {
			where = fmt.Sprint(CRISockets)
		}
		fmt.Fprintf(c.opts.Stderr, "cudatrace agent: no container runtime (CRI) socket at %s: pods are named only by the GPUs the kubelet gave them (mount the runtime's socket read-only, or --cri-socket)\n", where)
		return
	}
	fmt.Fprintf(c.opts.Stderr, "cudatrace agent: warning: container runtime (CRI): %v: processes it does not name stay unnamed until it answers\n", err)
}
