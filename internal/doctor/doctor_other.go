//go:build !linux

package doctor

import "errors"

var errNotLinux = errors.New("sandboxes need Linux")

func probeUserns() error { return errNotLinux }

func probeOverlay(string) error { return errNotLinux }

func freeBytes(string) (int64, error) { return 0, errNotLinux }
