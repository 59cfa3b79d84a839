package oci

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Devices from CDI specs (runtime.Devices).
//
// The host's CDI specs (Config.CDISpecDirs), read with the maintained CDI
// library, say for each device what a container needs to use it: device
// nodes, mounts, environment, hooks. Create applies the edits of the
// sandbox's devices (runtime.Spec.Devices) to its OCI spec; runc then
// bind-mounts each device node into the sandbox's /dev (a sandbox has a
// user namespace, in which no node can be made) and allows it, and only
// it, in the sandbox's device cgroup, after the spec's deny-all rule. The
// specs are read again at every create and listing, so that a device a
// vendor's tool adds or removes counts at once.
//
// CDI specs are the operator's, like the host's /dev: their mounts and
// hooks run with the host's authority, and their device nodes must be
// reachable by the sandbox's root (a node under a directory only host
// root may search cannot be bind-mounted by runc's init, which runs as
// the sandbox's root).

// cdiCache reads the specs in dirs: on demand, without a watcher.
func cdiCache(dirs []string) *cdi.Cache {
	c, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false)) // its error is always nil
	return c
}

// Devices implements runtime.Devices. A spec that cannot be read is
// logged, and the others' devices listed: one vendor's broken spec does
// not take the others' devices away.
func (o *OCI) Devices() ([]runtime.Device, error) {
	devs, err := listCDI(o.cdi, o.cfg.CDISpecDirs)
	if err != nil {
		o.cfg.Logger.Warn("CDI specs with errors: their devices are not offered", "err", err)
	}
	return devs, nil
}

// CDIDevices lists the devices the CDI specs in dirs describe, as a
// runtime with Config.CDISpecDirs dirs would (sheepfold doctor), and an
// error naming each spec that cannot be read.
func CDIDevices(dirs []string) ([]runtime.Device, error) { return listCDI(cdiCache(dirs), dirs) }

func listCDI(c *cdi.Cache, dirs []string) ([]runtime.Device, error) {
	if len(dirs) == 0 {
		return nil, nil
	}
	var err error
	if c.Refresh() != nil {
		var bad []string
		for path, errs := range c.GetErrors() {
			bad = append(bad, fmt.Sprintf("%s: %v", path, errors.Join(errs...)))
		}
		slices.Sort(bad)
		err = fmt.Errorf("CDI specs that cannot be read: %s", strings.Join(bad, "; "))
	}
	var out []runtime.Device
	for _, name := range c.ListDevices() {
		vendor, class, _, err := parser.ParseQualifiedName(name)
		if err != nil {
			continue // the cache holds valid names only
		}
		out = append(out, runtime.Device{Name: name, Class: vendor + "/" + class})
	}
	slices.SortFunc(out, func(a, b runtime.Device) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

// injectDevices applies the CDI edits of devices to spec.
func (o *OCI) injectDevices(spec *specs.Spec, devices []string) error {
	if len(devices) == 0 {
		return nil
	}
	if len(o.cfg.CDISpecDirs) == 0 {
		return fmt.Errorf("%w: this server reads no CDI specs, so it has no devices to give", runtime.ErrUnsupported)
	}
	// A broken spec of another vendor does not stop the others' devices:
	// the devices asked for that no spec describes are named below.
	_ = o.cdi.Refresh()
	hostPaths := map[string]string{}
	for _, name := range devices {
		d := o.cdi.GetDevice(name)
		if d == nil {
			return fmt.Errorf("%w: no CDI spec describes %s any more", runtime.ErrDeviceNotFound, name)
		}
		for _, e := range []*cdispec.ContainerEdits{&d.ContainerEdits, &d.GetSpec().ContainerEdits} {
			if len(e.NetDevices) > 0 {
				// A sandbox's network is the gateway's or none: a
				// device may not bring an interface of the host's.
				return fmt.Errorf("%w: device %s moves a network interface into the sandbox", runtime.ErrUnsupported, name)
			}
			for _, n := range e.DeviceNodes {
				if n.HostPath != "" && n.HostPath != n.Path {
					hostPaths[n.Path] = n.HostPath
				}
			}
		}
	}
	if unresolved, err := o.cdi.InjectDevices(spec, devices...); err != nil {
		if len(unresolved) > 0 {
			return fmt.Errorf("%w: no CDI spec describes %s any more", runtime.ErrDeviceNotFound, strings.Join(unresolved, ", "))
		}
		return err
	}
	// In a user namespace runc bind-mounts each device node from the
	// host's same path. A node whose host path differs is bound from
	// there instead; its device-cgroup rule stays.
	spec.Linux.Devices = slices.DeleteFunc(spec.Linux.Devices, func(d specs.LinuxDevice) bool {
		host, ok := hostPaths[d.Path]
		if ok {
			spec.Mounts = append(spec.Mounts, specs.Mount{Destination: d.Path, Type: "bind", Source: host,
				Options: []string{"bind", "nosuid", "noexec"}})
		}
		return ok
	})
	return nil
}
