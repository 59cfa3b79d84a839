// Package ociimage turns a built template's root filesystem into an OCI
// image, written as one OCI image layout archive (a tar of oci-layout,
// index.json and blobs/sha256/...) that containerd imports with
// `ctr -n k8s.io images import FILE`, so that sandboxes can run as Pods
// from it.
//
// The image has two layers:
//
//  1. the root filesystem tree, streamed from the directory;
//  2. the files Options.Files adds on top (the agent binary at
//     /.sheepfold/agent and its hard link as /usr/local/bin/sudo), owned
//     by root, with their parent directories.
//
// The agent has a layer of its own so that a new agent with the same
// template gives an image whose first (large) layer is unchanged:
// containerd unpacks it once.
//
// A template's files are owned by shifted host ids (host id = image id +
// Options.HostID, see template.BuildOptions.UIDShift); the layer carries
// the image ids. A file owned by an id outside the shifted range is an
// error, never kept as it is. Layers keep regular files, directories,
// symlinks, hard links (an inode seen again becomes a link to its first
// path), device nodes and fifos, with their modes and mtimes (to the
// second); sockets are left out (and listed in Result.Skipped). Of the
// extended attributes, security.capability (a v3 one's root id unshifted)
// and user.* are kept, POSIX ACLs are an error (they name ids and are not
// unshifted), and the rest (security.selinux, trusted.*) is dropped.
// Entries come in lexical path order and the archive holds no time but
// the files' mtimes and Options.Created, so the same tree, files and
// options give the same archive byte for byte.
//
// Each layer is written once, while the sha256 of the uncompressed tar
// (its diff_id) and of the blob are computed. Its tar header in the
// archive needs its size and digest first: into a regular file the layer
// goes in place after a placeholder block that the header then overwrites;
// into anything else (a pipe) it goes to an unlinked temporary file in
// Options.TempDir first and is copied from there. Both give the same bytes.
//
// This package imports the standard library, golang.org/x/sys/unix, the
// OCI image-spec types and klauspost/pgzip (gzip on all cores); it knows
// nothing of templates, sandboxes or the runtime: the caller passes paths,
// ids and the image config.
//
// # The export
//
// `sheepfold template export NAME` (internal/template/ociimage) writes a
// built template as an OCI image layout archive (oci-layout, index.json,
// blobs/sha256/...) that containerd imports (`ctr -n k8s.io images import`),
// named `sheepfold.local/template/NAME:TAG` by the index's
// `io.containerd.image.name` annotation (TAG: the manifest digest's first 12
// hex digits unless `--tag`), so that sandboxes can run as Pods from it.
// Layer 1 is the rootfs tree with its owners unshifted back to the sandbox's
// ids (a file outside the template's shifted range is an error, not kept);
// layer 2 adds the agent at /.sheepfold/agent with /usr/local/bin/sudo as its
// hard link, what the local engine bind-mounts, so a new agent leaves the
// large first layer (and containerd's unpacked snapshot of it) unchanged.
// The config's entrypoint is the agent (the Pod gives `init ...`), Env
// `oci.BaseEnv`, WorkingDir /home/user, User 0:0, labels naming the template
// and the agent's digest. Layers stream into the archive while their
// sha256s are taken (each tar header, which needs the size and digest, is
// written over a placeholder afterwards; to stdout they are staged in
// unlinked temporary files first); the archive goes to FILE.tmp-*, renamed
// into place. The same template and agent give the same bytes. The
// python template (52,000 entries, 1.36 GiB of tar) exports in 6-7 s
// uncompressed and 11-12 s with `--gzip` (439 MiB) on a 2-core machine
// (page cache warm; containerd v2.4.2's import of the uncompressed archive,
// unpacking included: 26 s).
package ociimage
