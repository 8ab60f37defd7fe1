package vmtest

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestShippedMounts: the DaemonSet as shipped runs the agent unprivileged
// (the capabilities are TestShippedPrivileges'), with the node's PID
// namespace and no host network, and mounts from the host only what it
// reads: BTF, the kubelet's pod-resources and the container runtime's CRI
// socket, read-only; the OOM dumps' directory is its one writable mount.
func TestShippedMounts(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "deploy", "kubernetes", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type mount struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	found := false
	for {
		var doc struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						HostPID     bool `yaml:"hostPID"`
						HostNetwork bool `yaml:"hostNetwork"`
						Containers  []struct {
							Name            string   `yaml:"name"`
							Args            []string `yaml:"args"`
							VolumeMounts    []mount  `yaml:"volumeMounts"`
							SecurityContext struct {
								Privileged               *bool `yaml:"privileged"`
								AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
							} `yaml:"securityContext"`
						} `yaml:"containers"`
						Volumes []struct {
							Name     string `yaml:"name"`
							HostPath *struct {
								Path string `yaml:"path"`
								Type string `yaml:"type"`
							} `yaml:"hostPath"`
						} `yaml:"volumes"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if doc.Kind != "DaemonSet" {
			continue
		}
		found = true
		ps := doc.Spec.Template.Spec
		if !ps.HostPID || ps.HostNetwork {
			t.Errorf("hostPID %v, hostNetwork %v: want the node's PIDs and the pod's network", ps.HostPID, ps.HostNetwork)
		}
		host := map[string]string{}
		for _, v := range ps.Volumes {
			if v.HostPath != nil {
				host[v.Name] = v.HostPath.Path
			}
		}
		want := map[string]string{"btf": "/sys/kernel/btf", "dumps": "/var/lib/cudatrace/oom",
			"pod-resources": "/var/lib/kubelet/pod-resources", "cri": "/run/containerd/containerd.sock"}
		if len(host) != len(want) {
			t.Errorf("host paths %v, want %v", host, want)
		}
		for name, path := range want {
			if host[name] != path {
				t.Errorf("volume %s: host path %q, want %q", name, host[name], path)
			}
		}
		for _, c := range ps.Containers {
			if c.Name != "agent" {
				continue
			}
			sc := c.SecurityContext
			if sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("privileged %v, allowPrivilegeEscalation %v: want both false", sc.Privileged, sc.AllowPrivilegeEscalation)
			}
			for _, m := range c.VolumeMounts {
				if _, isHost := host[m.Name]; isHost && m.Name != "dumps" && !m.ReadOnly {
					t.Errorf("host mount %s (%s) is writable", m.Name, m.MountPath)
				}
				if m.Name == "cri" && !slices.Contains(c.Args, "--cri-socket="+m.MountPath) {
					t.Errorf("the CRI socket is mounted at %s, but --cri-socket does not name it: %v", m.MountPath, c.Args)
				}
			}
		}
	}
	if !found {
		t.Fatal("daemonset.yaml: no DaemonSet")
	}
}
