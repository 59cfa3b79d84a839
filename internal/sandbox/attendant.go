package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/volume"
)

// Attendants: a volume's files and figures on a runtime whose host does
// not hold its volumes (runtime.Volumes without runtime.VolumeOpener:
// Kubernetes' claims, which live on the nodes or the storage).
//
// An attendant is an instance of the runtime made like a sandbox's (the
// default template, the runtime's own confinement: on Kubernetes a Pod
// of the agent image with the sandbox Pods' security context, no service
// account token, no network but its agent's port) that mounts one volume
// read-write at attendantMount and runs no tenant code. The file API's
// calls (list, read, write, remove) go to its agent, acting as the
// sandboxes' "user" (uid 1000, no capabilities): what a call reaches is
// what that user reaches in the attendant, through the agent's own
// confinement (openat2 RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS from the
// attendant's root). The volume's use is measured there too, by `du` as
// the attendant's root (every file, whatever its mode; one filesystem;
// blocks, not apparent sizes), at most every usageFresh.
//
// An attendant serves a burst of calls: it stays attendantIdle after its
// last call, attendantLife at most (then the next call starts another),
// and its agent's own deadline ends it soon after even if this engine
// dies (runtime.Spec.Lifetime; the next engine's reconcile or the
// replicas' collector deletes what is left). It is not a sandbox: no
// account owns it, nothing meters it, it is not listed, and no record
// claims it: a shared runtime marks it (runtime.Spec.Attendant) with
// that lifetime, and the replicas' collectors leave it be until its
// lifetime has run (runtime.Held.Until), however long a call through
// it lasts within it, then take what its agent's end left.
//
// With sandboxes: an attendant starts on the node of a live sandbox that
// mounts its volume (a ReadWriteOnce claim is one node's), and none
// starts while such a sandbox has no node yet (ERR_VOLUME_IN_USE, retry
// after a second). A create that mounts a volume stops its attendant
// first, waiting for the calls in flight (attendantDrain at most), so
// that no Pod waits on the claim. One writer at a time is the server's
// check before each write, as on the local engine (VolumeWriters): the
// attendant is not a writer of its own.

// attendantMount is where an attendant mounts its volume.
const attendantMount = "/mnt/volume"

// Attendants' times; variables for tests.
var (
	attendantIdle  = 20 * time.Second
	attendantLife  = 90 * time.Second
	attendantDrain = 30 * time.Second
	usageFresh     = 30 * time.Second
)

// measureCmd measures the volume at attendantMount: its first field is
// the bytes used. A variable for tests.
var measureCmd = []string{"du", "-s", "-x", "-B1", attendantMount}

// attendantLimits are an attendant's: enough for the agent and du.
var attendantLimits = runtime.Limits{MemoryBytes: 256 << 20, DiskBytes: 64 << 20, CPUs: 0.5, Pids: 64}

// attendant is one volume's attendant (see the top of this file).
type attendant struct {
	vol   string
	id    string
	ready chan struct{} // closed once started; err says how
	err   error
	agent agentClient
	born  time.Time

	// users, idle, stopping and drained are guarded by the Manager's mu.
	users    int
	idle     *time.Timer
	stopping bool
	drained  chan struct{} // closed when users reaches 0 while stopping
}

// measurement is a volume's use measured by its attendant.
type measurement struct {
	used int64
	at   time.Time
}

// attends reports whether this engine reaches volumes through attendants.
func (m *Manager) attends() bool {
	_, volumes := m.cfg.Runtime.(runtime.Volumes)
	_, opener := m.cfg.Runtime.(runtime.VolumeOpener)
	return volumes && !opener
}

// attend returns volume id's attendant, started if need be, with one
// more user: the caller calls m.leave with it when done.
func (m *Manager) attend(ctx context.Context, id string) (*attendant, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, apierr.New(apierr.Capacity, "the engine is shutting down")
	}
	if m.removing[id] {
		m.mu.Unlock()
		return nil, apierr.New(apierr.VolumeNotFound, "the volume is being deleted")
	}
	a := m.attendants[id]
	if a != nil && time.Since(a.born) > attendantLife {
		m.retire(a) // a fresh one below; this one ends once idle
		a = nil
	}
	if a == nil {
		node := ""
		for _, s := range m.sandboxes {
			if !slicesHasVolume(s.volumes, id) {
				continue
			}
			if s.node == "" && s.State() == StateStarting {
				m.mu.Unlock()
				return nil, &apierr.Error{Code: apierr.VolumeInUse, RetryAfter: time.Second,
					Message: "a sandbox that mounts the volume is starting; retry once it runs"}
			}
			node = s.node
		}
		a = &attendant{vol: id, id: "vf" + newID(), ready: make(chan struct{}), born: time.Now()}
		if m.attendants == nil {
			m.attendants = map[string]*attendant{}
		}
		m.attendants[id] = a
		a.users++
		m.mu.Unlock()
		m.startAttendant(ctx, a, node)
		if a.err != nil {
			m.leave(a)
			return nil, a.err
		}
		return a, nil
	}
	a.users++
	if a.idle != nil {
		a.idle.Stop()
		a.idle = nil
	}
	m.mu.Unlock()
	select {
	case <-a.ready:
	case <-ctx.Done():
		m.leave(a)
		return nil, ctx.Err()
	}
	if a.err != nil {
		m.leave(a)
		return nil, a.err
	}
	return a, nil
}

func slicesHasVolume(vols []VolumeMount, id string) bool {
	for _, v := range vols {
		if v.ID == id {
			return true
		}
	}
	return false
}

// startAttendant starts a's instance on node ("": anywhere) and waits
// for its agent; a.err says why not. It closes a.ready.
func (m *Manager) startAttendant(ctx context.Context, a *attendant, node string) {
	defer close(a.ready)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StartTimeout+m.cfg.AgentTimeout)
	defer cancel()
	defer context.AfterFunc(m.ctx, cancel)()
	tpl := m.cfg.DefaultTemplate
	rootfs, err := m.cfg.Templates.RootFS(tpl)
	if err != nil {
		a.err = apierr.Wrap(err, apierr.TemplateNotFound, "the volume's files are reached through the template %q, which is not available", tpl)
		return
	}
	spec := runtime.Spec{
		ID: a.id, Template: tpl, RootFS: rootfs, Limits: attendantLimits, Node: node,
		Volumes:  []runtime.VolumeMount{{ID: a.vol, Path: attendantMount}},
		Lifetime: attendantLife + attendantIdle + attendantDrain, Attendant: true,
	}
	began := time.Now()
	inst, err := m.cfg.Runtime.Create(ctx, spec)
	if err != nil {
		if errors.Is(err, runtime.ErrVolumeNotFound) {
			a.err = apierr.Wrap(err, apierr.VolumeNotFound, "the volume's storage is gone")
		} else {
			a.err = m.startErr(err, "could not reach the volume's files")
		}
		return
	}
	a.agent = newAgentClient(inst, m.agentCall, m.log.With("attendant", a.id))
	for {
		pctx, pcancel := context.WithTimeout(ctx, probeTimeout)
		_, err = a.agent.call(pctx, agentproto.Request{Op: agentproto.OpPing}, nil, agentproto.Handlers{}, callOptions{})
		pcancel()
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			a.err = apierr.Wrap(err, apierr.Internal, "the volume's attendant did not answer")
			m.destroyAttendant(a)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	m.log.Info("volume attendant started", "volume", a.vol, "attendant", a.id, "node", inst.Node,
		"took", time.Since(began).Round(time.Millisecond))
}

// leave drops one user of a; the last one arms its idle timer, or lets a
// stop waiting on it go on.
func (m *Manager) leave(a *attendant) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a.users--
	if a.users > 0 {
		return
	}
	if a.stopping {
		if a.drained != nil {
			close(a.drained)
			a.drained = nil
		}
		return
	}
	if a.err != nil {
		m.retire(a)
		return
	}
	a.idle = time.AfterFunc(attendantIdle, func() {
		m.mu.Lock()
		if a.users > 0 || a.stopping {
			m.mu.Unlock()
			return
		}
		m.retire(a)
		m.mu.Unlock()
	})
}

// retire takes a out of the table and destroys it once it has no user
// (in the background). m.mu is held.
func (m *Manager) retire(a *attendant) {
	if m.attendants[a.vol] == a {
		delete(m.attendants, a.vol)
	}
	if a.stopping {
		return
	}
	a.stopping = true
	if a.idle != nil {
		a.idle.Stop()
		a.idle = nil
	}
	wait := make(chan struct{})
	if a.users == 0 {
		close(wait)
	} else {
		a.drained = wait
	}
	m.reaps.Go(func() {
		select {
		case <-wait:
		case <-time.After(attendantDrain):
		}
		<-a.ready
		if a.err == nil {
			m.destroyAttendant(a)
		}
	})
}

// stopAttendants stops the attendant of volume id ("": of every volume)
// and waits until it is destroyed: calls in flight end first,
// attendantDrain at most.
func (m *Manager) stopAttendants(ctx context.Context, id string) {
	m.mu.Lock()
	var stop []*attendant
	for v, a := range m.attendants {
		if id == "" || v == id {
			stop = append(stop, a)
		}
	}
	waits := make([]chan struct{}, len(stop))
	for i, a := range stop {
		delete(m.attendants, a.vol)
		a.stopping = true
		if a.idle != nil {
			a.idle.Stop()
			a.idle = nil
		}
		waits[i] = make(chan struct{})
		if a.users == 0 {
			close(waits[i])
		} else {
			a.drained = waits[i]
		}
	}
	m.mu.Unlock()
	for i, a := range stop {
		select {
		case <-waits[i]:
		case <-time.After(attendantDrain):
		case <-ctx.Done():
		}
		<-a.ready
		if a.err == nil {
			m.destroyAttendant(a)
		}
	}
}

// destroyAttendant ends a's connections and destroys its instance; a
// failure is retried in the background (reap).
func (m *Manager) destroyAttendant(a *attendant) {
	if a.agent.conns != nil {
		a.agent.conns.closeAll()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.cfg.Runtime.Destroy(ctx, a.id); err != nil {
		m.reap(a.id, err)
		return
	}
	m.log.Info("volume attendant stopped", "volume", a.vol, "attendant", a.id)
}

// measure measures volume id's use through its attendant: the last
// figure when it is younger than fresh.
func (m *Manager) measure(ctx context.Context, id string, fresh time.Duration) (int64, error) {
	m.mu.Lock()
	last, ok := m.measured[id]
	m.mu.Unlock()
	if ok && time.Since(last.at) < fresh {
		return last.used, nil
	}
	a, err := m.attend(ctx, id)
	if err != nil {
		return 0, err
	}
	defer m.leave(a)
	return m.measureWith(ctx, a)
}

// measureWith runs du as the attendant's root over its volume.
func (m *Manager) measureWith(ctx context.Context, a *attendant) (int64, error) {
	var out, errOut bytes.Buffer
	done, err := a.agent.call(ctx, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: measureCmd[0], Args: measureCmd[1:], User: agentproto.UserRoot,
		Cwd: "/", TimeoutMS: 60_000, MaxOutputBytes: 64 << 10,
	}}, nil, agentproto.Handlers{Event: func(ev agentproto.Event) error {
		switch ev.Type {
		case agentproto.EventStdout:
			out.Write(ev.Data)
		case agentproto.EventStderr:
			errOut.Write(ev.Data)
		}
		return nil
	}}, callOptions{idle: agentIdle})
	if err != nil {
		return 0, apierr.Wrap(err, apierr.Internal, "could not measure the volume")
	}
	// du exits 1 when a file vanished while it ran: its sum stands.
	if done.ExitCode == nil || *done.ExitCode > 1 {
		return 0, apierr.Wrap(fmt.Errorf("du: exit %v: %s", done.ExitCode, strings.TrimSpace(errOut.String())),
			apierr.Internal, "could not measure the volume")
	}
	f := strings.Fields(out.String())
	used, perr := int64(0), error(nil)
	if len(f) > 0 {
		used, perr = strconv.ParseInt(f[0], 10, 64)
	}
	if len(f) == 0 || perr != nil {
		return 0, apierr.Wrap(fmt.Errorf("du said %q", out.String()), apierr.Internal, "could not measure the volume")
	}
	m.noteUse(a.vol, used)
	return used, nil
}

// measureWritten measures, in the background, the volumes stopped
// sandbox s mounted read-write, on an engine of attendants: what the
// next create checks against the volume's size (the server's
// OverVolume). A failure is logged; the figure then stays the last one.
func (m *Manager) measureWritten(s *Sandbox) {
	if !m.attends() {
		return
	}
	for _, v := range s.volumes {
		if v.ReadOnly {
			continue
		}
		m.mu.Lock()
		closed := m.closed // until measured, the last figure stands
		m.mu.Unlock()
		if closed {
			continue
		}
		m.reaps.Go(func() {
			ctx, cancel := context.WithTimeout(m.ctx, m.cfg.StartTimeout+m.cfg.AgentTimeout+time.Minute)
			defer cancel()
			if _, err := m.measure(ctx, v.ID, 0); err != nil && m.ctx.Err() == nil {
				m.log.Warn("could not measure a volume after its writer stopped", "volume", v.ID, "sandbox", s.ID, "err", err)
			}
		})
	}
}

func (m *Manager) noteUse(id string, used int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.measured == nil {
		m.measured = map[string]measurement{}
	}
	m.measured[id] = measurement{used: used, at: time.Now()}
}

// LastVolumeUse is volume id's last measured use and when it was
// measured; ok is false when it never was (by this engine).
func (m *Manager) LastVolumeUse(id string) (used int64, at time.Time, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	u, ok := m.measured[id]
	return u.used, u.at, ok
}

// attendedFiles are a volume's files through its attendant
// (VolumeFiles). Each call holds the attendant for its length.
type attendedFiles struct {
	m    *Manager
	ctx  context.Context
	vol  string
	size int64 // the volume's size: writes past it are refused
}

var _ VolumeFiles = (*attendedFiles)(nil)

// at is volume path p in the attendant; p is from the volume's root.
func (f *attendedFiles) at(p string) (string, error) {
	if strings.ContainsRune(p, 0) || len(p) > 4096 {
		return "", volume.ErrBadPath
	}
	return path.Join(attendantMount, path.Clean("/"+p)), nil
}

// fromAt is the inverse of at for the agent's answers.
func fromAt(p string) string {
	r := strings.TrimPrefix(p, attendantMount)
	if r == "" {
		return "/"
	}
	return r
}

func entryFrom(fi agentproto.FileInfo) volume.Entry {
	t := fi.Type
	switch t {
	case "file", "dir", "symlink":
	default:
		t = "other"
	}
	return volume.Entry{Name: fi.Name, Path: fromAt(fi.Path), Type: t, Size: fi.Size, ModTime: fi.ModTime.UTC()}
}

// call runs one request on the volume's attendant.
func (f *attendedFiles) call(req agentproto.Request, body io.Reader, h agentproto.Handlers) (agentproto.Event, error) {
	a, err := f.m.attend(f.ctx, f.vol)
	if err != nil {
		return agentproto.Event{}, err
	}
	defer f.m.leave(a)
	done, err := a.agent.call(f.ctx, req, body, h, callOptions{idle: agentIdle})
	return done, attendedErr(err)
}

// attendedErr maps the agent's errors to internal/volume's, as the host's
// files report them.
func attendedErr(err error) error {
	switch apierr.CodeOf(err) {
	case "":
		return err
	case apierr.NotFound:
		return fmt.Errorf("%w: %v", volume.ErrNotFound, err)
	case apierr.DiskFull:
		return fmt.Errorf("%w: %v", volume.ErrFull, err)
	}
	return err
}

// Open implements VolumeFiles: the file is read whole into memory first
// (at most the volume's size), so that the caller sees its size.
func (f *attendedFiles) Open(p string) (io.ReadCloser, volume.Entry, error) {
	ap, err := f.at(p)
	if err != nil {
		return nil, volume.Entry{}, err
	}
	var info agentproto.FileInfo
	var buf bytes.Buffer
	_, err = f.call(agentproto.Request{Op: agentproto.OpFileRead, Path: ap, Limit: f.size}, nil, agentproto.Handlers{
		Event: func(ev agentproto.Event) error {
			if ev.Type == agentproto.EventFile && ev.Entry != nil {
				info = *ev.Entry
			}
			return nil
		},
		Data: func(b []byte) error { buf.Write(b); return nil },
	})
	if err != nil {
		return nil, volume.Entry{}, err
	}
	e := entryFrom(info)
	if e.Type == "dir" {
		return nil, e, volume.ErrIsDir
	}
	e.Size = int64(buf.Len())
	return io.NopCloser(&buf), e, nil
}

// Write implements VolumeFiles. The volume's size bounds it: its use
// measured now (usageFresh) plus the body; a body of unknown length
// gets the room left as its limit. Past the size, volume.ErrFull.
func (f *attendedFiles) Write(p string, r io.Reader, max int64) (volume.Entry, error) {
	ap, err := f.at(p)
	if err != nil {
		return volume.Entry{}, err
	}
	a, err := f.m.attend(f.ctx, f.vol)
	if err != nil {
		return volume.Entry{}, err
	}
	defer f.m.leave(a)
	used, err := f.m.measureWith(f.ctx, a)
	if err != nil {
		return volume.Entry{}, err
	}
	room := f.size - used
	if room <= 0 {
		return volume.Entry{}, fmt.Errorf("%w: %d of %d bytes used", volume.ErrFull, used, f.size)
	}
	limit := max
	if limit <= 0 || room < limit {
		limit = room
	}
	done, err := a.agent.call(f.ctx, agentproto.Request{Op: agentproto.OpFileWrite, Path: ap, Limit: limit}, r,
		agentproto.Handlers{}, callOptions{idle: agentIdle})
	if apierr.CodeOf(err) == apierr.FileTooLarge && limit == room && (max <= 0 || room < max) {
		return volume.Entry{}, fmt.Errorf("%w: the file would take the volume past its size (%d of %d bytes used)", volume.ErrFull, used, f.size)
	}
	if apierr.CodeOf(err) == apierr.FileTooLarge {
		return volume.Entry{}, volume.ErrFileTooLong
	}
	if err != nil {
		return volume.Entry{}, attendedErr(err)
	}
	f.m.mu.Lock()
	delete(f.m.measured, f.vol) // changed: measured again when asked
	f.m.mu.Unlock()
	return entryFrom(entry(done)), nil
}

// List implements VolumeFiles: a directory's children.
func (f *attendedFiles) List(p string, max int) ([]volume.Entry, error) {
	ap, err := f.at(p)
	if err != nil {
		return nil, err
	}
	done, err := f.call(agentproto.Request{Op: agentproto.OpFileList, Path: ap, Depth: 1, Limit: int64(max)}, nil, agentproto.Handlers{})
	if err != nil {
		return nil, err
	}
	if done.Truncated {
		return nil, volume.ErrTooMany
	}
	out := make([]volume.Entry, 0, len(done.Entries))
	for _, e := range done.Entries {
		out = append(out, entryFrom(e))
	}
	return out, nil
}

// Remove implements VolumeFiles: a file or an empty directory, as on
// the host.
func (f *attendedFiles) Remove(p string) error {
	ap, err := f.at(p)
	if err != nil {
		return err
	}
	if ap == attendantMount {
		return fmt.Errorf("%w: the volume's root", volume.ErrBadPath)
	}
	st, err := f.call(agentproto.Request{Op: agentproto.OpFileStat, Path: ap}, nil, agentproto.Handlers{})
	if err != nil {
		return err
	}
	if e := entry(st); e.Type == "dir" {
		l, err := f.call(agentproto.Request{Op: agentproto.OpFileList, Path: ap, Depth: 1, Limit: 1}, nil, agentproto.Handlers{})
		if err != nil {
			return err
		}
		if len(l.Entries) > 0 {
			return volume.ErrNotEmpty
		}
	}
	_, err = f.call(agentproto.Request{Op: agentproto.OpFileRemove, Path: ap}, nil, agentproto.Handlers{})
	if err == nil {
		f.m.mu.Lock()
		delete(f.m.measured, f.vol)
		f.m.mu.Unlock()
	}
	return err
}

// Close implements VolumeFiles: the attendant stays for the next calls.
func (f *attendedFiles) Close() error { return nil }
