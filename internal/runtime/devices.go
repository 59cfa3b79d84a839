package runtime

import "errors"

// Device is a device a runtime can give sandboxes (Devices): a device
// its host's CDI specs (the Container Device Interface) describe.
type Device struct {
	// Name is the device's fully qualified CDI name, vendor/class=name
	// (e.g. "nvidia.com/gpu=0").
	Name string
	// Class is vendor/class (e.g. "nvidia.com/gpu"), which a request for
	// a number of GPUs draws from.
	Class string
}

// Devices is implemented by runtimes that give sandboxes devices
// described by CDI specs on their host (Spec.Devices). A runtime without
// it refuses a Spec with devices (ErrUnsupported). The engine decides
// which sandbox holds which device; the runtime only applies the device's
// edits (device nodes, their device-cgroup rules, mounts, environment)
// to the sandbox it creates.
type Devices interface {
	// Devices lists the devices the host's CDI specs describe now, in
	// the order of their names; an unreadable or invalid spec is an
	// error naming it.
	Devices() ([]Device, error)
}

// GPUScheduler is implemented by runtimes whose cluster chooses a
// sandbox's GPUs itself (Kubernetes: an extended resource its device
// plugin allocates): the engine passes Spec.GPUs, a number, and names no
// device.
type GPUScheduler interface {
	// GPUResource names what a GPU is to the cluster (nvidia.com/gpu).
	GPUResource() string
}

// ErrDeviceNotFound reports a device the runtime's CDI specs do not
// describe (any more).
var ErrDeviceNotFound = errors.New("device not found")
