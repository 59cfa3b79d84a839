package template

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/parser"
)

// Devices a template's sandboxes are given unless their create asks
// otherwise (Info.GPUs, Info.Devices): set by a Dockerfile's labels or
// SetDevices.
const (
	// LabelGPU is the number of GPUs ("1") each sandbox of the template
	// is given.
	LabelGPU = "sheepfold.gpu"
	// LabelDevices are CDI devices by name, comma-separated
	// ("vendor.com/class=name,...").
	LabelDevices = "sheepfold.devices"
)

// maxDevices is the most devices a template may ask for, as a sandbox
// (internal/sandbox.MaxDevices).
const maxDevices = 16

// checkDevices refuses a device request no sandbox could be given.
func checkDevices(gpus int, devices []string) error {
	if gpus < 0 || gpus+len(devices) > maxDevices {
		return fmt.Errorf("%d devices asked for; a sandbox has 0 to %d", gpus+len(devices), maxDevices)
	}
	for i, d := range devices {
		if _, _, _, err := parser.ParseQualifiedName(d); err != nil || len(d) > 256 {
			return fmt.Errorf("device %.64q is not a CDI device name such as nvidia.com/gpu=0", d)
		}
		if slices.Contains(devices[:i], d) {
			return fmt.Errorf("device %q is asked for twice", d)
		}
	}
	return nil
}

// devicesFromLabels reads the device labels of a Dockerfile's (or its
// base's) labels.
func devicesFromLabels(labels map[string]string) (gpus int, devices []string, err error) {
	if v, ok := labels[LabelGPU]; ok && strings.TrimSpace(v) != "" {
		if gpus, err = strconv.Atoi(strings.TrimSpace(v)); err != nil {
			return 0, nil, fmt.Errorf("LABEL %s=%q: not a number of GPUs", LabelGPU, v)
		}
	}
	for _, d := range strings.Split(labels[LabelDevices], ",") {
		if d = strings.TrimSpace(d); d != "" {
			devices = append(devices, d)
		}
	}
	if err := checkDevices(gpus, devices); err != nil {
		return 0, nil, fmt.Errorf("LABEL %s / %s: %v", LabelGPU, LabelDevices, err)
	}
	return gpus, devices, nil
}

// SetDevices sets the devices each sandbox of template name is given
// unless its create asks otherwise: gpus GPUs and devices by their CDI
// names; none for 0 and nil.
func SetDevices(dataDir, name string, gpus int, devices []string) error {
	if err := checkDevices(gpus, devices); err != nil {
		return err
	}
	info, err := Get(dataDir, name)
	if err != nil {
		return err
	}
	info.GPUs, info.Devices = gpus, slices.Clone(devices)
	if len(info.Devices) == 0 {
		info.Devices = nil
	}
	return writeInfo(filepath.Join(templatesDir(dataDir), name), info)
}
