// Package container tells which container, and which Kubernetes pod, a
// process runs in, from its cgroup path (/proc/PID/cgroup). Container
// runtimes name the cgroup after the container ID (docker, containerd,
// CRI-O, podman), and the kubelet puts each pod's containers under a
// cgroup named after the pod's UID, with either cgroup driver:
//
//	cgroupfs: /kubepods/burstable/pod<uid>/<container id>
//	systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope
//	docker:   /docker/<id>, /system.slice/docker-<id>.scope
//	podman:   /machine.slice/libpod-<id>.scope
package container

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Info is what a cgroup path says of a process. Empty fields are unknown
// (a process on the host has neither).
type Info struct {
	Cgroup string // the cgroup v2 path (or the first v1 path naming a container)
	ID     string // container ID, 64 hex digits
	PodUID string // Kubernetes pod UID, with dashes
}

// Root is where /proc is read; tests point it elsewhere.
var Root = "/proc"

var (
	// A container ID: 64 hex digits, possibly after a runtime's prefix
	// and before ".scope".
	idRE = regexp.MustCompile(`(?:^|[-/:])([0-9a-f]{64})(?:\.scope)?$`)
	// The pod: "pod" then the UID, dashed (cgroupfs) or with underscores
	// (systemd), ending the path element.
	podRE = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$`)
)

// Of reads pid's cgroup. A process that has exited is an error.
func Of(pid int) (Info, error) {
	f, err := os.Open(filepath.Join(Root, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return Info{}, fmt.Errorf("container of pid %d: %w", pid, err)
	}
	defer f.Close()
	return Parse(f)
}

// Parse reads a /proc/PID/cgroup file: "hierarchy-ID:controllers:path"
// lines, "0::path" for cgroup v2. The v2 path wins; on a v1 host, the
// first path that names a container.
func Parse(r io.Reader) (Info, error) {
	var v2, v1 string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
			continue
		}
		if v1 == "" && FromPath(parts[2]).ID != "" {
			v1 = parts[2]
		}
	}
	if err := sc.Err(); err != nil {
		return Info{}, fmt.Errorf("read cgroup: %w", err)
	}
	if in := FromPath(v2); in.ID != "" || in.PodUID != "" || v1 == "" {
		return in, nil
	}
	return FromPath(v1), nil
}

// FromPath reads a cgroup path: the container ID is the innermost element
// that names one, the pod UID the innermost pod element.
func FromPath(path string) Info {
	in := Info{Cgroup: path}
	elems := strings.Split(path, "/")
	for i := len(elems) - 1; i >= 0; i-- {
		e := elems[i]
		if in.ID == "" {
			if m := idRE.FindStringSubmatch(e); m != nil {
				in.ID = m[1]
			}
		}
		if in.PodUID == "" {
			if m := podRE.FindStringSubmatch(e); m != nil {
				in.PodUID = strings.ReplaceAll(m[1], "_", "-")
			}
		}
	}
	return in
}

// Short is the 12-digit form of a container ID that docker and crictl show.
func (in Info) Short() string {
	if len(in.ID) > 12 {
		return in.ID[:12]
	}
	return in.ID
}
