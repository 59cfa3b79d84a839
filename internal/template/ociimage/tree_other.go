//go:build !linux

package ociimage

import (
	"archive/tar"
	"context"
	"errors"
	"time"
)

// errUnsupported: reading a tree's owners, devices and xattrs is written
// for Linux.
var errUnsupported = errors.New("exporting a template image needs Linux")

func addTree(context.Context, *tar.Writer, string, idRange) (int, []string, error) {
	return 0, nil, errUnsupported
}

func addFiles(*tar.Writer, string, idRange, []File, time.Time) (int, error) {
	return 0, errUnsupported
}
