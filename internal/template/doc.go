// Package template owns the root filesystems ("templates") that sandboxes run
// on: their definitions, how they are built from Debian packages, and their
// layout in the data directory.
//
// A built template lives in
//
//	<DataDir>/templates/<name>/rootfs         the root filesystem (read-only lower layer)
//	<DataDir>/templates/<name>/template.json  its Info
//
// The builtin templates (python) are declared in builtin/NAME.Dockerfile
// (builtin.go, embedded): FROM debian:SUITE, RUN apt-get install lines
// (the packages) and LABEL sheepfold.description, in Dockerfile syntax
// read by BuildKit's parser; Builtin and Lookup return what they say.
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
// # Templates from a Dockerfile
//
// BuildDockerfile builds a template on top of a built one, or of an OCI
// image (FROM oci-archive:FILE or oci:DIR: ociimport_linux.go; FROM
// HOST/REPO:TAG from a registry the operator lists, pulled with
// go-containerregistry into a layout: registry.go), from a
// Dockerfile, parsed by BuildKit's parser (ParseDockerfile; what it
// refuses is refused at parse time with the line). Every step that
// changes files (RUN, COPY, ADD, WORKDIR) makes a layer: an overlay of the
// layers so far over the base template's rootfs, mounted at
// <templates>/.layers/.tmp-*/merged, whose upper dir becomes
// <templates>/.layers/<key>/diff once the step succeeds. The key hashes
// the key before it, the instruction after variable expansion, the
// environment, build args, user, working directory and labels, and the
// content of the context files a COPY reads; the first key hashes the
// base (its Hash, or its template.json). A layer whose key is there is
// reused; the last key is the template's Hash. RUN is a StepRunner's (the
// engine's: internal/runtime/oci's StepRunner, a runc container without
// network); COPY and ADD read the context and write the overlay through
// os.Root, so no path or symbolic link leaves either tree. The template
// is then the base's rootfs copied as hard links (cp -al) with each
// layer's upper dir applied in order (whiteouts delete, opaque dirs
// replace, files are hard-linked in), installed as Build installs. ENV,
// USER, WORKDIR and the labels sheepfold.start and sheepfold.ready are kept
// in its Info. The log of each name's last build is kept in
// <templates>/.logs/<name>.log (BuildLog).
//
// Hold marks a template's tree in use by a sandbox (a shared flock on
// the tree's directory, which the engine takes for each sandbox from its
// create to its destroy: hold_linux.go); Remove refuses a name held
// (ErrInUse); a tag moved, a tag removed or a name rebuilt leaves its
// old tree to its holders, removed by the last release or, after a
// restart, by Sweep.
//
// This package imports the standard library, golang.org/x/sys, moby's
// mountinfo parser, BuildKit's Dockerfile parser, instructions and shell
// lexer, the OCI image-spec types, go-containerregistry (pulls), and internal/osthread (its build commands' Pdeathsig); it knows
// nothing of sandboxes, the runtime or the server.
package template
