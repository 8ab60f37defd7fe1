// Package kube names a GPU process's Kubernetes pod, namespace and
// container from the kubelet's pod-resources API
// (k8s.io/kubelet/pkg/apis/podresources/v1, the unix socket
// /var/lib/kubelet/pod-resources/kubelet.sock that NVIDIA's DCGM exporter
// reads).
//
// The API lists each pod by namespace and name, its containers by name,
// and the device IDs each container was allocated (NVIDIA's device plugin
// allocates GPUs by UUID, "GPU-…"; shared by time-slicing as
// "GPU-…::N"). It carries neither the pod's UID nor the container's ID,
// which are what a process's cgroup says (package container). The one key
// both sides have is the GPU: the driver (NVML) says which GPUs a process
// has a context on, by UUID, and the kubelet which container each GPU was
// allocated to. So Devices.Owner names a process only when every GPU it
// uses is allocated to one and the same container, and to no other
// (exclusive allocation, the device plugin's default); a GPU shared by
// several containers (time-slicing, MPS) names none of them. DCGM
// exporter makes the same join per GPU.
//
// The list is read off the caller's goroutine: on a timer, and when
// Refresh asks (a new container seen), at most once a second; readers
// take the latest list without waiting (Devices).
package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultSocket is where the kubelet serves the pod-resources API.
const DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Defaults.
const (
	DefaultInterval = 10 * time.Second
	// listTimeout bounds one List call.
	listTimeout = 5 * time.Second
	// minGap is the least time between two List calls, however often
	// Refresh is called.
	minGap = time.Second
	// maxMessage is the largest List answer read (as DCGM exporter's).
	maxMessage = 16 << 20
)

// Names are a container's, as the kubelet gives them.
type Names struct {
	Namespace, Pod, Container string
}

// Devices is one List answer: which container each device is allocated to.
type Devices struct {
	// Taken is when the List call was made: an answer taken before a
	// container started may give its GPU to a pod that had it before.
	Taken time.Time
	byID  map[string][]Names
}

// NewDevices indexes a List answer taken at taken.
func NewDevices(resp *podresources.ListPodResourcesResponse, taken time.Time) *Devices {
	d := &Devices{Taken: taken, byID: map[string][]Names{}}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			n := Names{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: c.GetName()}
			for _, cd := range c.GetDevices() {
				for _, id := range cd.GetDeviceIds() {
					id = DeviceUUID(id)
					if !slices.Contains(d.byID[id], n) {
						d.byID[id] = append(d.byID[id], n)
					}
				}
			}
		}
	}
	return d
}

// DeviceUUID is the GPU a device plugin's device ID stands for: NVIDIA's
// device plugin names a time-sliced share of GPU-x "GPU-x::N".
func DeviceUUID(id string) string {
	if i := strings.Index(id, "::"); i >= 0 {
		return id[:i]
	}
	return id
}

// Owner returns the one container every GPU in uuids (NVML UUIDs) is
// allocated to, and no other container; false when there is none, or
// more than one (a shared GPU, or GPUs of two containers).
func (d *Devices) Owner(uuids []string) (Names, bool) {
	if d == nil || len(uuids) == 0 {
		return Names{}, false
	}
	var owner Names
	for i, u := range uuids {
		ns := d.byID[u]
		if len(ns) != 1 || (i > 0 && ns[0] != owner) {
			return Names{}, false
		}
		owner = ns[0]
	}
	return owner, true
}

// Len is how many devices the answer allocates.
func (d *Devices) Len() int {
	if d == nil {
		return 0
	}
	return len(d.byID)
}

// String lists the allocations, for messages.
func (d *Devices) String() string {
	if d == nil {
		return "none"
	}
	var out []string
	for id, ns := range d.byID {
		for _, n := range ns {
			out = append(out, fmt.Sprintf("%s=%s/%s/%s", id, n.Namespace, n.Pod, n.Container))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// Options tune a Lister.
type Options struct {
	Socket   string        // the kubelet's socket; "" means DefaultSocket
	Interval time.Duration // between two reads; 0 means DefaultInterval
	Stderr   io.Writer     // one line when the socket is absent or fails
}

// Lister keeps the latest List answer of the kubelet's pod-resources
// API. Start it with Start; Close ends it.
type Lister struct {
	opts    Options
	latest  atomic.Pointer[Devices]
	kick    chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	closing sync.Once
	said    map[string]bool // what was logged (once each); the loop's
}

// Start begins reading the socket in the background. A socket that is
// absent, now or later, means no names (Devices returns nil) and one
// line on Stderr; the lister keeps looking for it.
func Start(opts Options) *Lister {
	if opts.Socket == "" {
		opts.Socket = DefaultSocket
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Stderr == nil {
		opts.Stderr = io.Discard
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Lister{opts: opts, kick: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{}), said: map[string]bool{}}
	go l.loop(ctx)
	return l
}

// Devices is the latest answer; nil before the first, and while the
// socket is absent or failing.
func (l *Lister) Devices() *Devices {
	if l == nil {
		return nil
	}
	return l.latest.Load()
}

// Refresh asks for a read soon (within a second); it never waits.
func (l *Lister) Refresh() {
	if l == nil {
		return
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Close stops the reads and waits for the one in flight.
func (l *Lister) Close() {
	if l == nil {
		return
	}
	l.closing.Do(func() {
		l.cancel()
		<-l.done
	})
}

func (l *Lister) loop(ctx context.Context) {
	defer close(l.done)
	var conn *grpc.ClientConn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	tick := time.NewTicker(l.opts.Interval)
	defer tick.Stop()
	for {
		if err := l.read(ctx, &conn); err != nil && ctx.Err() == nil {
			l.latest.Store(nil)
			l.sayOnce(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(minGap):
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-l.kick:
		}
	}
}

// errAbsent: no socket at the path.
var errAbsent = errors.New("absent")

func (l *Lister) read(ctx context.Context, conn **grpc.ClientConn) error {
	if _, err := os.Stat(l.opts.Socket); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errAbsent
		}
		return err
	}
	if *conn == nil {
		c, err := grpc.NewClient("unix://"+l.opts.Socket,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)))
		if err != nil {
			return err
		}
		*conn = c
	}
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	taken := time.Now()
	resp, err := podresources.NewPodResourcesListerClient(*conn).List(ctx, &podresources.ListPodResourcesRequest{})
	if err != nil {
		return err
	}
	l.latest.Store(NewDevices(resp, taken))
	return nil
}

// sayOnce writes one line per kind of failure for the lister's life.
func (l *Lister) sayOnce(err error) {
	key := "error"
	if errors.Is(err, errAbsent) {
		key = "absent"
	}
	if l.said[key] {
		return
	}
	l.said[key] = true
	if key == "absent" {
		fmt.Fprintf(l.opts.Stderr, "cudatrace agent: no kubelet pod-resources socket at %s: no pod, namespace or container names (outside Kubernetes, or mount /var/lib/kubelet/pod-resources)\n", l.opts.Socket)
		return
	}
	fmt.Fprintf(l.opts.Stderr, "cudatrace agent: warning: kubelet pod-resources at %s: %v: no pod, namespace or container names until it answers\n", l.opts.Socket, err)
}
