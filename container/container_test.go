package container

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const id = "3f4e1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"

func TestFromPath(t *testing.T) {
	cases := []struct {
		path    string
		id, pod string
	}{
		{"/", "", ""},
		{"/user.slice/user-0.slice/session-1.scope", "", ""},
		{"/docker/" + id, id, ""},
		{"/system.slice/docker-" + id + ".scope", id, ""},
		{"/machine.slice/libpod-" + id + ".scope/container", id, ""},
		{"/kubepods/burstable/pod7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b/" + id, id, "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"},
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c5a1f2e_3b4d_4e5f_8a9b_0c1d2e3f4a5b.slice/cri-containerd-" + id + ".scope",
			id, "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"},
		{"/kubepods.slice/kubepods-pod7c5a1f2e_3b4d_4e5f_8a9b_0c1d2e3f4a5b.slice/crio-" + id + ".scope",
			id, "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"},
		// Docker (cri-dockerd) under the kubelet's systemd driver.
		{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod7c5a1f2e_3b4d_4e5f_8a9b_0c1d2e3f4a5b.slice/docker-" + id + ".scope",
			id, "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"},
		// CRI-O under the cgroupfs driver.
		{"/kubepods/burstable/pod7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b/crio-" + id, id, "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"},
		// Read from a cgroup namespace of its own (the agent's pod's, on
		// cgroup v2): the path is relative to the reader's root.
		{"/../../kubepods-burstable-pod7c5a1f2e_3b4d_4e5f_8a9b_0c1d2e3f4a5b.slice/cri-containerd-" + id + ".scope",
			id, "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"},
		// The pause container's pod, no container below it yet.
		{"/kubepods/besteffort/pod7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b", "", "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"},
		// 63 hex digits is no container ID.
		{"/docker/" + id[1:], "", ""},
	}
	for _, c := range cases {
		got := FromPath(c.path)
		if got.ID != c.id || got.PodUID != c.pod || got.Cgroup != c.path {
			t.Errorf("FromPath(%q) = %+v, want id %q pod %q", c.path, got, c.id, c.pod)
		}
	}
	if s := (Info{ID: id}).Short(); s != id[:12] {
		t.Errorf("Short = %q", s)
	}
}

func TestParse(t *testing.T) {
	v1 := "12:pids:/kubepods/burstable/pod7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b/" + id + "\n" +
		"11:memory:/kubepods/burstable/pod7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b/" + id + "\n" +
		"1:name=systemd:/\n0::/\n"
	in, err := Parse(strings.NewReader(v1))
	if err != nil || in.ID != id || in.PodUID != "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b" {
		t.Errorf("v1: %+v %v", in, err)
	}
	// cgroup v1 with the systemd driver: containerd's and CRI-O's scopes.
	for _, scope := range []string{"cri-containerd-", "crio-"} {
		v1 = "11:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c5a1f2e_3b4d_4e5f_8a9b_0c1d2e3f4a5b.slice/" + scope + id + ".scope\n" +
			"1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c5a1f2e_3b4d_4e5f_8a9b_0c1d2e3f4a5b.slice/" + scope + id + ".scope\n"
		in, err = Parse(strings.NewReader(v1))
		if err != nil || in.ID != id || in.PodUID != "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b" {
			t.Errorf("v1, systemd driver, %s: %+v %v", scope, in, err)
		}
	}
	in, err = Parse(strings.NewReader("0::/system.slice/docker-" + id + ".scope\n"))
	if err != nil || in.ID != id || in.PodUID != "" || in.Cgroup != "/system.slice/docker-"+id+".scope" {
		t.Errorf("v2: %+v %v", in, err)
	}
	in, err = Parse(strings.NewReader("0::/user.slice\ngarbage\n"))
	if err != nil || in.ID != "" || in.Cgroup != "/user.slice" {
		t.Errorf("host: %+v %v", in, err)
	}
}

func TestOf(t *testing.T) {
	dir := t.TempDir()
	old := Root
	Root = dir
	t.Cleanup(func() { Root = old })
	if err := os.MkdirAll(filepath.Join(dir, "42"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "42", "cgroup"), []byte("0::/docker/"+id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if in, err := Of(42); err != nil || in.ID != id {
		t.Errorf("Of(42) = %+v, %v", in, err)
	}
	if _, err := Of(43); err == nil {
		t.Error("Of(43): no error for a missing process")
	}
}
