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

// AttachNetns needs Linux network namespaces and TUN devices.
func (g *Gateway) AttachNetns(ctx context.Context, path string) error {
	return errors.New("egress: sandbox networks need Linux")
}

// AttachNamespace needs Linux too.
func (g *Gateway) AttachNamespace(ctx context.Context, path string) error {
	return errors.New("egress: sandbox networks need Linux")
}
