package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	cpuinfoIntel = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme de pse vmx ssse3 hypervisor\n\nprocessor\t: 1\nflags\t\t: fpu vme de pse vmx ssse3 hypervisor\n"
	cpuinfoAMD   = "processor\t: 0\nflags\t\t: fpu sse2 svm npt\n"
	// What a Firecracker guest with the kvm_pvm module shows: no vmx or svm.
	cpuinfoNone = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme de pse ssse3 hypervisor\n"
)

// virtHost writes a fake /dev/kvm (when kvm), cpuinfo and a module
// directory under a new root.
func virtHost(t *testing.T, kvm bool, cpuinfo string, modules ...string) string {
	t.Helper()
	root := t.TempDir()
	write(t, filepath.Join(root, "proc/cpuinfo"), cpuinfo)
	if kvm {
		write(t, filepath.Join(root, "dev/kvm"), "")
	}
	for _, m := range modules {
		if err := os.MkdirAll(filepath.Join(root, "sys/module", m), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestGuestAccel(t *testing.T) {
	cases := []struct {
		name    string
		kvm     bool
		cpuinfo string
		modules []string
		probe   Probe
		accel   string
		reason  string // a part of the reason
	}{
		{"no /dev/kvm", false, cpuinfoIntel, []string{"kvm_intel"}, ProbeNotRun, AccelTCG, "no usable /dev/kvm"},
		{"no /dev/kvm, probe ignored", false, cpuinfoIntel, nil, ProbeOutput, AccelTCG, "no usable /dev/kvm"},
		{"intel hardware", true, cpuinfoIntel, []string{"kvm", "kvm_intel"}, ProbeNotRun, AccelKVM, "hardware virtualization (vmx, kvm_intel)"},
		{"amd hardware", true, cpuinfoAMD, []string{"kvm_amd"}, ProbeNotRun, AccelKVM, "(svm, kvm_amd)"},
		{"hardware, guest printed", true, cpuinfoIntel, []string{"kvm_intel"}, ProbeOutput, AccelKVM, "first output arrived"},
		{"hardware, guest silent", true, cpuinfoIntel, []string{"kvm_intel"}, ProbeSilent, AccelTCG, "printed nothing within the bound"},
		{"pvm", true, cpuinfoNone, []string{"kvm", "kvm_pvm"}, ProbeNotRun, AccelTCG, "from PVM (kvm_pvm"},
		// PVM never gets a KVM boot, whatever a probe said.
		{"pvm, probe said output", true, cpuinfoNone, []string{"kvm_pvm"}, ProbeOutput, AccelTCG, "cannot boot under it"},
		// A host that shows vmx (nested) but whose /dev/kvm is PVM's.
		{"pvm with vmx", true, cpuinfoIntel, []string{"kvm_pvm"}, ProbeNotRun, AccelTCG, "from PVM"},
		{"no flags, unknown module", true, cpuinfoNone, nil, ProbeNotRun, AccelTCG, "without hardware virtualization"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := ReadVirt(virtHost(t, c.kvm, c.cpuinfo, c.modules...))
			accel, reason := GuestAccel(v, c.probe)
			if accel != c.accel || !strings.Contains(reason, c.reason) {
				t.Errorf("GuestAccel(%+v, %d) = %s %q, want %s with %q", v, c.probe, accel, reason, c.accel, c.reason)
			}
		})
	}
}

func TestReadVirtModuleOrder(t *testing.T) {
	// kvm_intel and kvm_pvm loaded together: the hardware module is the one in use.
	v := ReadVirt(virtHost(t, true, cpuinfoIntel, "kvm_pvm", "kvm_intel"))
	if v.Module != "kvm_intel" || v.Flag != "vmx" || !v.KVM {
		t.Errorf("ReadVirt = %+v, want kvm_intel, vmx, KVM", v)
	}
}

func TestParseProbe(t *testing.T) {
	for in, want := range map[string]Probe{"": ProbeNotRun, "none": ProbeNotRun, "output": ProbeOutput, "silent": ProbeSilent} {
		if got, err := ParseProbe(in); err != nil || got != want {
			t.Errorf("ParseProbe(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := ParseProbe("maybe"); err == nil {
		t.Error("ParseProbe accepted an unknown result")
	}
}

func TestVirtCheck(t *testing.T) {
	o := options(t)
	o.Root = virtHost(t, true, cpuinfoNone, "kvm_pvm")
	r := doctor{o: o}.virt()
	if r.Status != OK || !strings.Contains(r.Detail, "from PVM") || !strings.Contains(r.Detail, "uses TCG") {
		t.Errorf("virt check on a PVM host: %s %q", r.Status, r.Detail)
	}
	o.Root = virtHost(t, true, cpuinfoAMD, "kvm_amd")
	if r := (doctor{o: o}).virt(); !strings.Contains(r.Detail, "uses KVM") {
		t.Errorf("virt check on an AMD host: %q", r.Detail)
	}
}
