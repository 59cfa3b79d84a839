package oci

// User namespaces made ahead of need.
//
// Making a sandbox's user namespace runs two programs as its owner
// (userns_linux.go): on the development machine about 7 ms of CPU and
// 10 ms of wall time, all of it on a pool miss's critical path, before
// `runc run`. So the runtime keeps a few made in advance, each for the
// range the next allocation is expected to hand out (the lowest free
// slot), made in the background after each create and destroy. A spare
// is a namespace like any other: fresh (nothing has ever run in it but
// its holder, which has no capabilities), owned by its range's uid and
// mapping that range, so using it gives the sandbox exactly what making
// it on demand would. It is used only by a create that was allocated its
// range; one made for a range another sandbox took meanwhile waits until
// that range is free again. Nothing is reused: a namespace a sandbox ran
// in dies with it.

// maxSpares bounds the namespaces kept made in advance: one for the next
// slot, and one more for a slot a destroy freed meanwhile (a create after
// a destroy takes the freed slot, not the one the spare was made for).
const maxSpares = 2

// userns returns the user namespace for a sandbox with the range at base:
// a spare made for it (waiting for one being made: a create right after a
// destroy finds the freed range's spare under way), or a new one.
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
// destroy moved the lowest free slot); it never waits.
func (o *OCI) kickSpares() {
	select {
	case o.spareKick <- struct{}{}:
	default:
	}
}

// makeSpares runs until Close, keeping a namespace made for the range the
// next allocation will take.
func (o *OCI) makeSpares() {
	for {
		select {
		case <-o.quit:
			return
		case <-o.spareKick:
		}
		base, ok := o.ids.next()
		if !ok {
			continue
		}
		o.spareMu.Lock()
		have := o.spares[base] != nil
		if !have {
			o.making, o.madeCh = base, make(chan struct{})
		}
		o.spareMu.Unlock()
		if have {
			continue
		}
		h, err := o.makeSpare(base)
		var drop []*nsHolder
		o.spareMu.Lock()
		close(o.madeCh)
		o.making, o.madeCh = 0, nil
		switch {
		case err != nil:
			o.cfg.Logger.Warn("make a user namespace in advance", "err", err)
		case o.spares[base] != nil: // unreachable: only this goroutine adds
			drop = append(drop, h)
		default:
			o.spares[base] = h
		}
		// Past the bound, keep the lowest ranges: allocation takes the
		// lowest free slot.
		for len(o.spares) > maxSpares {
			var top uint32
			for b := range o.spares {
				top = max(top, b)
			}
			drop = append(drop, o.spares[top])
			delete(o.spares, top)
		}
		o.spareMu.Unlock()
		for _, h := range drop {
			h.close()
		}
	}
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
