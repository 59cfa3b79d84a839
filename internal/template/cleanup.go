//go:build linux

package template

import "errors"

// cleanup is a stack of undo functions for a half-built thing (the pattern
// of gVisor's pkg/cleanup): add as each part is made, release once the whole
// succeeded, run on every other way out.
type cleanup struct {
	fns []func() error
}

// add pushes fn; run calls the functions last added first.
func (c *cleanup) add(fn func() error) { c.fns = append(c.fns, fn) }

// release forgets the undo functions: what was built is kept.
func (c *cleanup) release() { c.fns = nil }

// run undoes in reverse order and returns the errors joined.
func (c *cleanup) run() error {
	var errs []error
	for i := len(c.fns) - 1; i >= 0; i-- {
		errs = append(errs, c.fns[i]())
	}
	c.fns = nil
	return errors.Join(errs...)
}
