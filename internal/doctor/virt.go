package doctor

import (
	"fmt"
	"os"
	"strings"
)

// Virt is what the host offers a full guest (the qemu guest of `make
// test-cgroupv2`, which runs the engine on pure cgroup v2). Sandboxes do
// not need it; the check is there so that a user can see why that test
// runs under KVM or under TCG's emulation.
//
// A writable /dev/kvm is no proof that KVM can run a stock guest: the
// kvm_pvm module (pagetable-based virtual machines, found on hosts that
// are themselves guests without nested virtualization) provides a
// /dev/kvm that runs only kernels built for PVM. There, a stock Debian
// kernel never prints a line and one vCPU spins. Hardware virtualization
// is what the CPU flags vmx (Intel VT-x) and svm (AMD-V) say.
type Virt struct {
	KVM    bool   // /dev/kvm opens for reading and writing
	Flag   string // "vmx", "svm" or "" (neither in /proc/cpuinfo)
	Module string // the KVM module present: kvm_intel, kvm_amd, kvm_pvm or ""
}

// kvmModules are the modules that provide /dev/kvm, the hardware ones
// first: a host with both kvm_intel and kvm_pvm is a hardware host.
var kvmModules = []string{"kvm_intel", "kvm_amd", "kvm_pvm"}

// ReadVirt reads what the host under root offers: /dev/kvm, the CPU's
// flags and the KVM module in /sys/module (built in or loaded alike;
// /proc/modules is absent on kernels without module support).
func ReadVirt(root string) Virt {
	d := doctor{o: Options{Root: root}}
	var v Virt
	if f, err := os.OpenFile(d.path("dev/kvm"), os.O_RDWR, 0); err == nil {
		f.Close()
		v.KVM = true
	}
	if info, err := d.read("proc/cpuinfo"); err == nil {
		v.Flag = virtFlag(info)
	}
	for _, m := range kvmModules {
		if _, err := os.Stat(d.path("sys/module/" + m)); err == nil {
			v.Module = m
			break
		}
	}
	return v
}

// virtFlag finds vmx or svm among cpuinfo's flags.
func virtFlag(cpuinfo string) string {
	for _, line := range strings.Split(cpuinfo, "\n") {
		name, flags, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != "flags" {
			continue
		}
		for _, f := range strings.Fields(flags) {
			if f == "vmx" || f == "svm" {
				return f
			}
		}
		return ""
	}
	return ""
}

// Offer says what /dev/kvm is here: from hardware virtualization, from
// PVM, or none.
func (v Virt) Offer() string {
	mod := v.Module
	if mod == "" {
		mod = "no KVM module in /sys/module"
	}
	switch {
	case !v.KVM:
		return "no usable /dev/kvm"
	case v.Flag != "" && v.Module != "kvm_pvm":
		return fmt.Sprintf("/dev/kvm from hardware virtualization (%s, %s)", v.Flag, mod)
	case v.Module == "kvm_pvm":
		return "/dev/kvm from PVM (kvm_pvm, no vmx or svm): it runs only guest kernels built for PVM"
	default:
		return fmt.Sprintf("/dev/kvm without hardware virtualization (no vmx or svm in /proc/cpuinfo; %s)", mod)
	}
}

// Probe is what a KVM boot of the guest showed.
type Probe int

const (
	// ProbeNotRun: no KVM boot has been tried yet.
	ProbeNotRun Probe = iota
	// ProbeOutput: the guest's first serial output arrived within the bound.
	ProbeOutput
	// ProbeSilent: the guest printed nothing within the bound.
	ProbeSilent
)

// ParseProbe reads a probe result as the guest test's script names it.
func ParseProbe(s string) (Probe, error) {
	switch s {
	case "", "none":
		return ProbeNotRun, nil
	case "output":
		return ProbeOutput, nil
	case "silent":
		return ProbeSilent, nil
	}
	return 0, fmt.Errorf("unknown probe result %q (none, output or silent)", s)
}

// Accelerators qemu is given.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// GuestAccel chooses the accelerator for the guest by what works, not by
// what exists: KVM only with hardware virtualization, and only until a
// KVM boot has shown that the guest prints nothing (a KVM that cannot run
// this guest); TCG otherwise. The reason is what the test logs.
func GuestAccel(v Virt, p Probe) (accel, reason string) {
	switch {
	case !v.KVM:
		return AccelTCG, v.Offer()
	case v.Flag == "" || v.Module == "kvm_pvm":
		return AccelTCG, v.Offer() + "; a stock guest kernel cannot boot under it"
	case p == ProbeSilent:
		return AccelTCG, v.Offer() + ", but a KVM boot of the guest printed nothing within the bound"
	case p == ProbeOutput:
		return AccelKVM, v.Offer() + "; the guest's first output arrived within the bound"
	}
	return AccelKVM, v.Offer() + "; the guest falls back to TCG if it prints nothing within the bound"
}

func (d doctor) virt() Result {
	v := ReadVirt(d.o.Root)
	accel, _ := GuestAccel(v, ProbeNotRun)
	how := "KVM (TCG if the guest prints nothing within the bound)"
	if accel == AccelTCG {
		how = "TCG (software emulation, about ten times slower)"
	}
	return result("virt", OK, "", "%s; the cgroup v2 guest test uses %s", v.Offer(), how)
}
