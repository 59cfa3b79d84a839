package oci

import (
	"maps"
	"path/filepath"
	"slices"
)

// User namespaces made ahead of need.
//
// Making a sandbox's user namespace runs two programs as its owner
// (userns_linux.go): on the development machine about 7 ms of CPU and
// 10 ms of wall time, all of it on a pool miss's critical path, before
// `runc run`. So the runtime keeps a few made in advance, each for a free
// range, made in the background after each create and destroy, and a
// create takes a range that has one ready in preference to the lowest
// free range. (A spare made only for the lowest free range was waited
// for: a create right after a destroy takes the freed range, whose spare
// the destroy had only just begun.) A spare is a namespace like any
// other: fresh (nothing has ever run in it but its holder, which has no
// capabilities), owned by its range's uid and mapping that range, so
// using it gives the sandbox exactly what making it on demand would. It
// is used only by a create that was allocated its range; one whose range
// another engine took meanwhile waits until that range is free again.
// Nothing is reused: a namespace a sandbox ran in dies with it.

// maxSpares bounds the namespaces kept made in advance for free ranges:
// two creates in a row find one ready.
const maxSpares = 2

// readySpares returns the ranges with a namespace made in advance, lowest
// first: allocate tries them before the others.
func (o *OCI) readySpares() []uint32 {
	o.spareMu.Lock()
	defer o.spareMu.Unlock()
	return slices.Sorted(maps.Keys(o.spares))
}

// userns returns the user namespace for a sandbox with the range at base:
// a spare made for it (waiting for one being made), or a new one.
func (o *OCI) userns(base uint32) (*nsHolder, error) {
	o.spareMu.Lock()
	if o.making == base && o.madeCh != nil {
		ch := o.madeCh
		o.spareMu.Unlock()
		<-ch
		o.spareMu.Lock()
	}
	h := o.spares[base]
	delete(o.spares, base)
	o.spareMu.Unlock()
	if h != nil {
		return h, nil
	}
	return o.ns.newUserns(base, idRange{Inside: 0, Host: base, Size: o.cfg.IDMap.Size})
}

// kickSpares asks the spare maker to look again (after a create or a
// destroy changed which ranges are free); it never waits.
func (o *OCI) kickSpares() {
	select {
	case o.spareKick <- struct{}{}:
	default:
	}
}

// makeSpares runs until Close, keeping maxSpares namespaces made for free
// ranges.
func (o *OCI) makeSpares() {
	for {
		select {
		case <-o.quit:
			return
		case <-o.spareKick:
		}
		for o.makeOneSpare() {
		}
	}
}

// makeOneSpare makes a namespace for the lowest free range without one,
// unless maxSpares free ranges have one; false when it made none.
func (o *OCI) makeOneSpare() bool {
	select {
	case <-o.quit:
		return false
	default:
	}
	o.spareMu.Lock()
	usable := 0
	for b := range o.spares {
		if o.ids.isFree(b) {
			usable++
		}
	}
	base, ok := o.ids.nextFree(func(b uint32) bool { return o.spares[b] != nil })
	if !ok || usable >= maxSpares {
		o.spareMu.Unlock()
		return false
	}
	o.making, o.madeCh = base, make(chan struct{})
	o.spareMu.Unlock()

	h, err := o.makeSpare(base)
	var drop []*nsHolder
	o.spareMu.Lock()
	close(o.madeCh)
	o.making, o.madeCh = 0, nil
	if err != nil {
		o.cfg.Logger.Warn("make a user namespace in advance", "err", err)
	} else {
		o.spares[base] = h
	}
	// Past the bound, drop spares (spareToDrop).
	for {
		pick, ok := o.spareToDrop()
		if !ok {
			break
		}
		drop = append(drop, o.spares[pick])
		delete(o.spares, pick)
	}
	o.spareMu.Unlock()
	for _, h := range drop {
		h.close()
	}
	return err == nil
}

// spareToDrop picks a spare to drop while more than maxSpares are kept
// for ranges this engine does not hold: one whose range another engine
// took meanwhile, else the highest. The spare of a range this engine's
// create took is that create's, neither dropped nor counted: the create is
// between allocating the range and taking the spare (userns), which
// mounting its root keeps apart. spareMu is held.
func (o *OCI) spareToDrop() (uint32, bool) {
	var other, free []uint32
	for b := range o.spares {
		switch bundle, held := o.ids.holder(b); {
		case held && filepath.Dir(bundle) == o.bundles:
		case held:
			other = append(other, b)
		default:
			free = append(free, b)
		}
	}
	switch {
	case len(other)+len(free) <= maxSpares:
		return 0, false
	case len(other) > 0:
		return other[0], true
	}
	return slices.Max(free), true
}

// makeSpare makes a namespace for the range at base, and the range's
// idmapped view of templates (made once per range: idmapUserns), so that
// the first create in a range need not make it either.
func (o *OCI) makeSpare(base uint32) (*nsHolder, error) {
	if _, err := o.idmapUserns(base); err != nil {
		return nil, err
	}
	return o.ns.newUserns(base, idRange{Inside: 0, Host: base, Size: o.cfg.IDMap.Size})
}

// closeSpares ends the spares (Close, after makeSpares stopped).
func (o *OCI) closeSpares() {
	o.spareMu.Lock()
	defer o.spareMu.Unlock()
	for b, h := range o.spares {
		h.close()
		delete(o.spares, b)
	}
}
