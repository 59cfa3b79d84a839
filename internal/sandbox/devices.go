package sandbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Devices in sandboxes (CDI).
//
// A create asks for devices by their CDI names (CreateOptions.Devices,
// e.g. "nvidia.com/gpu=0") or for a number of GPUs (CreateOptions.GPUs),
// which the engine draws from the devices of Config.GPUClass; a runtime
// whose cluster chooses GPUs itself (runtime.GPUScheduler: Kubernetes)
// is handed the number instead, and takes no names. The
// runtime lists the devices its host's CDI specs describe
// (runtime.Devices) and applies a device's edits to the sandbox it
// creates; the engine decides who holds what. A device is held by one
// live sandbox at a time (running or starting), unless
// Config.ShareDevices; the sandbox's devices are fixed at create and freed
// when it ends. A sandbox with devices never comes from the warm pool and
// cannot be paused, snapshotted or forked (a device's state is not the
// sandbox's to save).

// MaxDevices is the most devices one sandbox may ask for.
const MaxDevices = 16

// DefaultGPUClass is Config.GPUClass's default: the CDI class
// nvidia-container-toolkit generates GPUs under.
const DefaultGPUClass = "nvidia.com/gpu"

// wantsDevices says whether the create asks for any device.
func (opt CreateOptions) wantsDevices() bool { return opt.GPUs > 0 || len(opt.Devices) > 0 }

// listDevices checks a create's device request against what the runtime
// offers and returns what the runtime lists; nil when none is asked.
func (m *Manager) listDevices(opt CreateOptions) ([]runtime.Device, error) {
	if !opt.wantsDevices() {
		return nil, nil
	}
	if opt.GPUs < 0 || opt.GPUs+len(opt.Devices) > MaxDevices {
		return nil, apierr.New(apierr.BadRequest, "%d devices asked for; a sandbox has 0 to %d", opt.GPUs+len(opt.Devices), MaxDevices)
	}
	if err := opt.checkDeviceCap(); err != nil {
		return nil, err
	}
	for i, d := range opt.Devices {
		if _, _, _, err := parser.ParseQualifiedName(d); err != nil || len(d) > 256 {
			return nil, apierr.New(apierr.BadRequest, "device %.64q is not a CDI device name such as nvidia.com/gpu=0", d)
		}
		if slices.Contains(opt.Devices[:i], d) {
			return nil, apierr.New(apierr.BadRequest, "device %q is asked for twice", d)
		}
	}
	if opt.AutoPause {
		return nil, apierr.New(apierr.NotSupported, "a sandbox with devices cannot be paused, so not auto-paused either")
	}
	if _, ok := m.cfg.Runtime.(runtime.GPUScheduler); ok {
		if len(opt.Devices) > 0 {
			return nil, apierr.New(apierr.NotSupported, "this server's runtime (%s) gives GPUs by number (resources.gpu), not devices by name", m.cfg.Runtime.Name())
		}
		return nil, nil // its cluster chooses them
	}
	rd, ok := m.cfg.Runtime.(runtime.Devices)
	if !ok {
		return nil, apierr.New(apierr.NotSupported, "this server's runtime (%s) gives sandboxes no devices", m.cfg.Runtime.Name())
	}
	devs, err := rd.Devices()
	if err != nil {
		return nil, apierr.Wrap(err, apierr.Internal, "could not read the host's devices")
	}
	for _, d := range opt.Devices {
		if !slices.ContainsFunc(devs, func(x runtime.Device) bool { return x.Name == d }) {
			return nil, apierr.New(apierr.DeviceNotFound, "device %q is not one of this server's (%s)", d, deviceNames(devs))
		}
	}
	if n := countClass(devs, m.gpuClass()); opt.GPUs > n {
		return nil, apierr.New(apierr.DeviceNotFound, "%d GPUs asked for; this server has %d (CDI class %s)", opt.GPUs, n, m.gpuClass())
	}
	return devs, nil
}

func (m *Manager) gpuClass() string {
	if m.cfg.GPUClass == "" {
		return DefaultGPUClass
	}
	return m.cfg.GPUClass
}

// TemplateRootFS returns the root filesystem of template name.
func (m *Manager) TemplateRootFS(name string) (string, error) {
	if name == "" {
		name = m.cfg.DefaultTemplate
	}
	return m.cfg.Templates.RootFS(name)
}

// CheckDevices refuses, before anything is made, a create whose devices
// this server could never give (names it has not, more than a sandbox
// or the owner's MaxDevices allows): what Create would refuse first.
func (m *Manager) CheckDevices(opt CreateOptions) error {
	if opt.Template == "" {
		opt.Template = m.cfg.DefaultTemplate
	}
	m.templateDevices(&opt)
	_, err := m.listDevices(opt)
	return err
}

// templateDevices gives a create that names no devices (GPUs 0, Devices
// nil; an empty non-nil Devices asks for none) its template's.
func (m *Manager) templateDevices(opt *CreateOptions) {
	td, ok := m.cfg.Templates.(TemplateDevices)
	if !ok || opt.GPUs != 0 || opt.Devices != nil || opt.Snapshot != "" {
		return // a snapshot's clone is made as the snapshot was: without devices
	}
	opt.GPUs, opt.Devices = td.Devices(opt.Template)
}

// takeDevices chooses s's devices among devs: the named ones, then GPUs
// of the GPU class, each held by no other live sandbox (the least held,
// with ShareDevices). m.mu is held.
func (m *Manager) takeDevices(s *Sandbox, opt CreateOptions, devs []runtime.Device) error {
	s.gpus = opt.GPUs
	if !opt.wantsDevices() {
		return nil
	}
	if err := m.ownerDevicesFree(opt); err != nil {
		return err
	}
	if _, ok := m.cfg.Runtime.(runtime.GPUScheduler); ok {
		return nil
	}
	held := map[string]string{} // device -> a live sandbox holding it
	users := map[string]int{}
	for _, o := range m.sandboxes {
		for _, d := range o.devices {
			held[d] = o.ID
			users[d]++
		}
	}
	for _, d := range opt.Devices {
		if id, ok := held[d]; ok && !m.cfg.ShareDevices {
			return apierr.New(apierr.DeviceInUse, "device %q is held by sandbox %s: one sandbox at a time", d, id)
		}
	}
	take := slices.Clone(opt.Devices)
	var free []string
	for _, d := range devs {
		if d.Class == m.gpuClass() && !slices.Contains(take, d.Name) && (m.cfg.ShareDevices || held[d.Name] == "") {
			free = append(free, d.Name)
		}
	}
	// The least held first (all free ones hold none), in name order.
	slices.SortStableFunc(free, func(a, b string) int { return users[a] - users[b] })
	if opt.GPUs > len(free) {
		return apierr.New(apierr.DeviceInUse, "%d GPUs asked for, %d free: the others are held by live sandboxes", opt.GPUs, len(free))
	}
	s.devices = append(take, free[:opt.GPUs]...)
	return nil
}

// ErrDeviceCap is the cause (apierr.Error.Err, never sent) of a create
// refused because its owner's live sandboxes hold CreateOptions.MaxDevices
// devices already: it passes when one of them ends (a batch waits).
var ErrDeviceCap = errors.New("sandbox: the account's devices at once are held")

// asked is how many devices a create asks for.
func (opt CreateOptions) asked() int { return opt.GPUs + len(opt.Devices) }

// checkDeviceCap refuses a create that asks for more devices than its
// owner may ever hold at once (CreateOptions.MaxDevices).
func (opt CreateOptions) checkDeviceCap() error {
	if opt.MaxDevices > 0 && opt.asked() > opt.MaxDevices {
		return &apierr.Error{Code: apierr.BadRequest, Details: map[string]any{"field": "resources"},
			Message: fmt.Sprintf("%d devices asked for, above this account's max_devices of %d", opt.asked(), opt.MaxDevices)}
	}
	return nil
}

// ownerDevicesFree refuses a create whose devices, with those its
// owner's live sandboxes hold, would pass CreateOptions.MaxDevices. m.mu
// is held, so that two creates of one account cannot both pass.
func (m *Manager) ownerDevicesFree(opt CreateOptions) error {
	if opt.MaxDevices <= 0 {
		return nil
	}
	held := 0
	for _, o := range m.sandboxes {
		if o.owner == opt.Owner {
			held += o.DeviceCount()
		}
	}
	if held+opt.asked() > opt.MaxDevices {
		return &apierr.Error{Code: apierr.SessionQuotaExceeded, Err: ErrDeviceCap, RetryAfter: time.Second,
			Details: map[string]any{"limit": "max_devices", "held": held},
			Message: fmt.Sprintf("device limit of %d reached: this account's live sandboxes hold %d and this one asks for %d", opt.MaxDevices, held, opt.asked())}
	}
	return nil
}

func countClass(devs []runtime.Device, class string) int {
	n := 0
	for _, d := range devs {
		if d.Class == class {
			n++
		}
	}
	return n
}

func deviceNames(devs []runtime.Device) string {
	if len(devs) == 0 {
		return "it has none"
	}
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	return strings.Join(names, ", ")
}

// gpuCount is Spec.GPUs: the number asked for, for a runtime whose
// cluster chooses GPUs (others get the devices by name).
func (s *Sandbox) gpuCount(m *Manager) int {
	if _, ok := m.cfg.Runtime.(runtime.GPUScheduler); ok {
		return s.gpus
	}
	return 0
}

// DeviceCount is how many devices the sandbox holds, for metering: its
// devices, or the GPUs its cluster gave it (runtime.GPUScheduler).
func (s *Sandbox) DeviceCount() int { return max(len(s.devices), s.gpus) }

// Devices returns the CDI names of the sandbox's devices.
func (s *Sandbox) Devices() []string { return slices.Clone(s.devices) }

// noDevices refuses what a sandbox with devices cannot do.
func (s *Sandbox) noDevices(what string) error {
	if len(s.devices) == 0 {
		return nil
	}
	return apierr.New(apierr.NotSupported, "sandbox %s has devices (%s): a sandbox with devices cannot be %s", s.ID, strings.Join(s.devices, ", "), what)
}
