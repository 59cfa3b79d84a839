//go:build !linux

package egress

import (
	"context"
	"errors"
)

// Attach needs Linux network namespaces and TUN devices.
func (g *Gateway) Attach(ctx context.Context, pid int) error {
	return errors.New("egress: sandbox networks need Linux")
}

// AttachNetNS needs Linux too.
func (g *Gateway) AttachNetNS(ctx context.Context, path string) error {
	return errors.New("egress: sandbox networks need Linux")
}
