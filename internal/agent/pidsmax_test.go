package agent

import (
	"errors"
	"strings"
	"testing"
)

// readPidsMax finds the container's own pids.max in the layouts a Pod's
// container sees (cgroup v2 with or without a cgroup namespace, v1's
// pids controller bound to the container's own directory, or the whole
// hierarchy), and CheckPidsMax refuses anything but the sandbox's limit.
func TestReadPidsMax(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		files map[string]string
		self  string
		want  int64
		path  string
		err   string
	}{
		{name: "v2 cgroup namespace", files: map[string]string{"cgroup.controllers": "pids\n", "pids.max": "64\n"}, self: "0::/\n", want: 64, path: "pids.max"},
		{name: "v2 no limit", files: map[string]string{"cgroup.controllers": "pids\n", "pids.max": "max\n"}, self: "0::/\n", want: -1, path: "pids.max"},
		{
			name:  "v2 whole hierarchy",
			files: map[string]string{"cgroup.controllers": "pids\n", "kubepods/pod1/abc/pids.max": "64\n"},
			self:  "0::/kubepods/pod1/abc\n", want: 64, path: "kubepods/pod1/abc/pids.max",
		},
		{name: "v1 bound", files: map[string]string{"pids/pids.max": "256\n", "memory/memory.usage_in_bytes": "1\n"}, self: v1Self, want: 256, path: "pids/pids.max"},
		{
			name:  "v1 whole hierarchy",
			files: map[string]string{"pids/pids.max": "max\n", "pids/kubepods/burstable/pod1/abc/pids.max": "256\n"},
			self:  v1Self, want: 256, path: "pids/kubepods/burstable/pod1/abc/pids.max",
		},
		{name: "v1 without the pids controller", files: map[string]string{"memory/memory.usage_in_bytes": "1\n"}, self: v1Self, err: "no pids controller mounted"},
		{name: "v2 without the pids controller", files: map[string]string{"cgroup.controllers": "memory\n"}, self: "0::/\n", err: "cannot read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			writeTree(t, root, tc.files, nil)
			got, path, err := readPidsMax(root, tc.self)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %d from %s, err %v; want an error saying %q", got, path, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want || path != root+"/"+tc.path {
				t.Fatalf("got %d from %s, %v; want %d from %s", got, path, err, tc.want, tc.path)
			}
		})
	}
}

// CheckPidsMax against the agent's own cgroup: a tree whose pids.max is
// the limit passes, another limit or none fails with ErrPidsMax naming
// what it found.
func TestCheckPidsMax(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeTree(t, root, map[string]string{"cgroup.controllers": "pids\n", "pids.max": "64\n"}, nil)
	if err := CheckPidsMax(root, 64); err != nil {
		t.Fatalf("pids.max 64, limit 64: %v", err)
	}
	if err := CheckPidsMax(root, 256); !errors.Is(err, ErrPidsMax) || !strings.Contains(err.Error(), "is 64, not 256") {
		t.Fatalf("pids.max 64, limit 256: %v", err)
	}
	none := t.TempDir()
	writeTree(t, none, map[string]string{"cgroup.controllers": "pids\n", "pids.max": "max\n"}, nil)
	if err := CheckPidsMax(none, 64); !errors.Is(err, ErrPidsMax) || !strings.Contains(err.Error(), "is max, not 64: the node runs no sheepfold NRI plugin") {
		t.Fatalf("pids.max max, limit 64: %v", err)
	}
	if err := CheckPidsMax(t.TempDir(), 64); !errors.Is(err, ErrPidsMax) {
		t.Fatalf("no cgroup: %v", err)
	}
}
