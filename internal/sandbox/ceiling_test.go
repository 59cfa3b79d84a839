package sandbox_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

func i64(v int64) *int64 { return &v }

// TestGrant: the one decision of a sandbox's resources, for every field
// of a create: over the ceiling (the engine's or the account's) or below
// the smallest sandbox is ERR_BAD_REQUEST naming the caller's field; what
// is not asked is the default cut to the ceiling; the policy's memory and
// disk are granted over the plain limits, both checked.
func TestGrant(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, sandbox.Config{
		DefaultLimits: runtime.Limits{CPUs: 1, MemoryBytes: 512 << 20, DiskBytes: 256 << 20, Pids: 256},
		MaxLimits:     runtime.Limits{CPUs: 2, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, Pids: 512},
		MaxTimeout:    time.Hour, DefaultTimeout: 5 * time.Minute,
	})
	names := sandbox.FieldNames{CPUs: "--cpus", Memory: "--memory", Disk: "--disk", Pids: "--pids", Timeout: "--timeout",
		PolicyMemory: "p.memory_mb", PolicyDisk: "p.disk_write_mb"}
	acct := sandbox.Ceiling{CPUs: 1, MemoryBytes: 256 << 20, DiskBytes: 128 << 20, Timeout: 10 * time.Minute}
	pol := func(mem, disk *int64) *policy.Policy {
		return &policy.Policy{ResourceLimits: &policy.ResourceLimits{MemoryMB: mem, DiskWriteMB: disk}}
	}
	tests := []struct {
		name   string
		opt    sandbox.CreateOptions
		c      sandbox.Ceiling
		want   sandbox.Grant
		refuse string // the field a refusal names, and what it says
		says   string
		// inMemory: the runtime keeps disks in memory, and admission
		// counts them as memory.
		inMemory bool
	}{
		{name: "nothing asked, no account",
			want: sandbox.Grant{Limits: runtime.Limits{CPUs: 1, MemoryBytes: 512 << 20, DiskBytes: 256 << 20, Pids: 256}, Timeout: 5 * time.Minute}},
		{name: "nothing asked, cut to the account", c: acct,
			want: sandbox.Grant{Limits: runtime.Limits{CPUs: 1, MemoryBytes: 256 << 20, DiskBytes: 128 << 20, Pids: 256}, Timeout: 5 * time.Minute}},
		{name: "at every ceiling", c: acct, opt: sandbox.CreateOptions{Timeout: 10 * time.Minute,
			Limits: runtime.Limits{CPUs: 1, MemoryBytes: 256 << 20, DiskBytes: 128 << 20, Pids: 512}},
			want: sandbox.Grant{Limits: runtime.Limits{CPUs: 1, MemoryBytes: 256 << 20, DiskBytes: 128 << 20, Pids: 512}, Timeout: 10 * time.Minute}},
		{name: "the policy's memory and disk win", c: acct, opt: sandbox.CreateOptions{Limits: runtime.Limits{MemoryBytes: 64 << 20, DiskBytes: 8 << 20},
			Policy: pol(i64(200), i64(100))},
			want: sandbox.Grant{Limits: runtime.Limits{CPUs: 1, MemoryBytes: 200 << 20, DiskBytes: 100 << 20, Pids: 256}, Timeout: 5 * time.Minute}},
		{name: "memory over the account", c: acct, opt: sandbox.CreateOptions{Limits: runtime.Limits{MemoryBytes: 257 << 20}},
			refuse: "--memory", says: "above this account's max_memory_mb of 256 MiB"},
		{name: "policy memory over the account", c: acct, opt: sandbox.CreateOptions{Policy: pol(i64(4096), nil)},
			refuse: "p.memory_mb", says: "asks for 4096 MiB, above this account's max_memory_mb of 256 MiB"},
		{name: "plain memory over while the policy's fits", c: acct, opt: sandbox.CreateOptions{Limits: runtime.Limits{MemoryBytes: 300 << 20},
			Policy: pol(i64(200), nil)}, refuse: "--memory", says: "above this account's"},
		{name: "policy disk over the account", c: acct, opt: sandbox.CreateOptions{Policy: pol(nil, i64(129))},
			refuse: "p.disk_write_mb", says: "above this account's max_disk_mb of 128 MiB"},
		{name: "disk over the account", c: acct, opt: sandbox.CreateOptions{Limits: runtime.Limits{DiskBytes: 129 << 20}},
			refuse: "--disk", says: "max_disk_mb"},
		{name: "cpus over the account", c: acct, opt: sandbox.CreateOptions{Limits: runtime.Limits{CPUs: 1.5}},
			refuse: "--cpus", says: "above this account's max_cpus of 1 CPUs"},
		{name: "cpus over the engine", opt: sandbox.CreateOptions{Limits: runtime.Limits{CPUs: 3}},
			refuse: "--cpus", says: "above this server's largest sandbox of 2 CPUs"},
		{name: "memory over the engine, under a larger account", c: sandbox.Ceiling{MemoryBytes: 1 << 40},
			opt: sandbox.CreateOptions{Policy: pol(i64(1025), nil)}, refuse: "p.memory_mb", says: "this server's largest sandbox of 1024 MiB"},
		{name: "pids over the engine", opt: sandbox.CreateOptions{Limits: runtime.Limits{Pids: 513}}, refuse: "--pids", says: "512 tasks"},
		{name: "timeout over the account", c: acct, opt: sandbox.CreateOptions{Timeout: 10*time.Minute + time.Second},
			refuse: "--timeout", says: "max_timeout of 600 s"},
		{name: "timeout over the engine", opt: sandbox.CreateOptions{Timeout: 2 * time.Hour}, refuse: "--timeout", says: "3600 s"},
		{name: "negative timeout", opt: sandbox.CreateOptions{Timeout: -time.Second}, refuse: "--timeout", says: "smallest"},
		{name: "tiny memory", opt: sandbox.CreateOptions{Limits: runtime.Limits{MemoryBytes: 1 << 20}}, refuse: "--memory", says: "the smallest sandbox has 32 MiB"},
		{name: "NaN cpus", opt: sandbox.CreateOptions{Limits: runtime.Limits{CPUs: math.NaN()}}, refuse: "--cpus", says: "smallest"},
		{name: "an account below the smallest sandbox", c: sandbox.Ceiling{MemoryBytes: 16 << 20},
			refuse: "--memory", says: "this account's max_memory_mb of 16 MiB is below the smallest sandbox"},
		{name: "larger than the host, the disk in memory", c: sandbox.Ceiling{HostBytes: 600 << 20}, opt: sandbox.CreateOptions{Policy: pol(i64(400), nil)},
			inMemory: true, refuse: "p.memory_mb", says: "memory 400 MiB plus disk 256 MiB (kept in memory) is more than this host can hold"},
		{name: "the host's size exactly, the disk in memory", c: sandbox.Ceiling{HostBytes: 656 << 20}, opt: sandbox.CreateOptions{Policy: pol(i64(400), nil)},
			inMemory: true, want: sandbox.Grant{Limits: runtime.Limits{CPUs: 1, MemoryBytes: 400 << 20, DiskBytes: 256 << 20, Pids: 256}, Timeout: 5 * time.Minute}},
		{name: "the disk in memory over the host", c: sandbox.Ceiling{HostBytes: 600 << 20}, opt: sandbox.CreateOptions{Limits: runtime.Limits{MemoryBytes: 64 << 20},
			Policy: pol(nil, i64(1024))}, inMemory: true, refuse: "p.disk_write_mb", says: "plus disk 1024 MiB (kept in memory)"},
		{name: "memory larger than the host", c: sandbox.Ceiling{HostBytes: 399 << 20}, opt: sandbox.CreateOptions{Policy: pol(i64(400), nil)},
			refuse: "p.memory_mb", says: "memory 400 MiB is more than this host can hold"},
		{name: "a disk of its own is not memory", c: sandbox.Ceiling{HostBytes: 400 << 20}, opt: sandbox.CreateOptions{Policy: pol(i64(400), i64(1024))},
			want: sandbox.Grant{Limits: runtime.Limits{CPUs: 1, MemoryBytes: 400 << 20, DiskBytes: 1 << 30, Pids: 256}, Timeout: 5 * time.Minute}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opt.Names = names
			rt.DiskMemory.Store(tt.inMemory)
			g, err := m.Grant(tt.opt, tt.c)
			if tt.refuse == "" {
				if err != nil || g != tt.want {
					t.Fatalf("granted %+v, %v; want %+v", g, err, tt.want)
				}
				return
			}
			wantCode(t, err, apierr.BadRequest)
			e := apierr.From(err)
			if e.Details["field"] != tt.refuse || !strings.Contains(e.Message, tt.refuse) || !strings.Contains(e.Message, tt.says) {
				t.Fatalf("refusal %q (field %v); want it to name %s and say %q", e.Message, e.Details["field"], tt.refuse, tt.says)
			}
		})
	}
}

// TestCreateGrants: Create decides through Grant whoever calls it (the
// CLI's `run` calls the engine directly): the engine's bounds hold, the
// refusal names the caller's field, and the runtime is given what was
// granted, the policy's memory and disk included.
func TestCreateGrants(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, sandbox.Config{MaxLimits: runtime.Limits{MemoryBytes: 256 << 20, DiskBytes: 128 << 20}})
	names := sandbox.FieldNames{Memory: "--memory", Disk: "--disk"}
	_, err := m.Create(context.Background(), sandbox.CreateOptions{Limits: runtime.Limits{MemoryBytes: 257 << 20}, Names: names})
	if err == nil || !strings.Contains(err.Error(), "--memory asks for 257 MiB") {
		t.Fatalf("over the engine's memory: %v", err)
	}
	_, err = m.Create(context.Background(), sandbox.CreateOptions{Names: names,
		Policy: &policy.Policy{ResourceLimits: &policy.ResourceLimits{DiskWriteMB: i64(129)}}})
	if err == nil || !strings.Contains(err.Error(), "security_policy.resource_limits.disk_write_mb asks for 129 MiB") {
		t.Fatalf("over the engine's disk: %v", err)
	}
	s, err := m.Create(context.Background(), sandbox.CreateOptions{Names: names, Limits: runtime.Limits{MemoryBytes: 64 << 20},
		Policy: &policy.Policy{ResourceLimits: &policy.ResourceLimits{MemoryMB: i64(256), DiskWriteMB: i64(128)}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rt.Spec(s.ID).Limits; got.MemoryBytes != 256<<20 || got.DiskBytes != 128<<20 || s.Limits != got {
		t.Fatalf("the runtime was given %+v, the sandbox says %+v", got, s.Limits)
	}
}
