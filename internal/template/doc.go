// Package template owns the root filesystems ("templates") that sandboxes run
// on: their definitions, how they are built from Debian packages, and their
// layout in the data directory.
//
// A built template lives in
//
//	<DataDir>/templates/<name>/rootfs         the root filesystem (read-only lower layer)
//	<DataDir>/templates/<name>/template.json  its Info
//
// Build runs debootstrap into a staging directory
// <DataDir>/templates/.<name>.build-<random>, edits the result on the host
// side (sandbox user, neutral hostname, hosts and resolver files, no
// setuid/setgid bits, no apt caches, warm Python caches), shifts every
// file's owner by BuildOptions.UIDShift to match the runtime's user
// namespace mapping, and renames the staging directory into place. Anything
// half built is undone by a cleanup stack. Debootstrap and the commands run
// in the rootfs get a private mount namespace and their own process group
// (killed on cancellation); mounts still found under a staging directory
// are lazily unmounted before it is removed, and it is not removed while any
// remain. Builds of one name are serialised by a lock file
// <DataDir>/templates/.<name>.lock.
//
// The ownership shift (chown) also drops file capabilities
// (security.capability): sandboxes run without capabilities and with
// no_new_privs, so none are wanted.
//
// Building needs root, debootstrap and the Debian archive keyring on the
// host; it is Linux only (build_other.go fails with a clear error).
// Reading templates (Get, List) works anywhere.
//
// This package imports only the standard library, golang.org/x/sys,
// moby's mountinfo parser and internal/osthread (its build commands'
// Pdeathsig); it knows nothing of sandboxes, the runtime or the server.
package template
