package sandbox

import "fmt"

// TemplateHolds is implemented by Templates whose root filesystems may be
// replaced while sandboxes run on them (internal/engine: a tag moved to
// another build, a name rebuilt): each sandbox holds the root it runs on
// from its create until its destroy has unmounted it, so that the old
// root stays for it and is removed once its last sandbox is gone. A
// paused sandbox's root stays held while it is paused, and the next
// engine holds it again when it takes the sandbox back (keep.go).
type TemplateHolds interface {
	// HoldRoot holds root filesystem rootfs (a RootFS answer) until
	// release is called; it fails when that root is gone (the
	// template moved on and nothing held it). release(true): the
	// sandbox is gone, its root may go with it if nothing names or
	// holds it; release(false): the engine closes, leaving the root to
	// the paused sandboxes on it and the next engine.
	HoldRoot(rootfs string) (release func(collect bool), err error)
}

// holdRoot holds rootfs for sandbox id (TemplateHolds), until
// releaseRoot(id). A Templates without holds holds nothing.
func (m *Manager) holdRoot(id, rootfs string) error {
	h, ok := m.cfg.Templates.(TemplateHolds)
	if !ok {
		return nil
	}
	release, err := h.HoldRoot(rootfs)
	if err != nil {
		return fmt.Errorf("hold the template's root: %w", err)
	}
	m.holdsMu.Lock()
	defer m.holdsMu.Unlock()
	if m.holds == nil {
		m.holds = map[string]func(bool){}
	}
	if old := m.holds[id]; old != nil {
		old(true)
	}
	m.holds[id] = release
	return nil
}

// releaseRoot lets go of sandbox id's root: its destroy has unmounted it
// (or it never started).
func (m *Manager) releaseRoot(id string) {
	m.holdsMu.Lock()
	release := m.holds[id]
	delete(m.holds, id)
	m.holdsMu.Unlock()
	if release != nil {
		release(true)
	}
}

// releaseRoots lets go of every root still held, at Close, removing
// none: the paused sandboxes it leaves still run on theirs and are held
// again by the next engine (keep.go), and what could not be destroyed
// is destroyed by the next engine's start before it sweeps the unused
// trees (internal/engine).
func (m *Manager) releaseRoots() {
	m.holdsMu.Lock()
	holds := m.holds
	m.holds = nil
	m.holdsMu.Unlock()
	for _, release := range holds {
		release(false) // the next engine sweeps what nothing holds then
	}
}
