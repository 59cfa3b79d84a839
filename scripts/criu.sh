#!/usr/bin/env bash
# Builds CRIU at a pinned release, with Sheepfold's patches, into
# $DATA_DIR/bin/criu, where runc's checkpoint and restore find it
# (internal/runtime/oci, checkpoint_linux.go); does nothing when that binary
# is already this build (its --version names the release and the patch set).
#
# Why a build of our own: Debian bookworm's CRIU 3.17 fails on kernels since
# 6.13 (the vDSO's layout), 4.1.1 hangs at checkpoint; 4.2.1 works. The
# source is Debian's own package (the upstream tarball of a newer suite's
# source package, checked against the sha256 below; its build dependencies
# from this host's suite), fetched with apt from a sources list of its own,
# so the host's apt configuration is left as it is. The build takes about 3
# minutes on 2 cores.
#
# criu.patch (next to this script) changes four things, each needed by
# sandboxes whose user namespace another host uid owns, on hosts whose root
# lacks CAP_SYS_RESOURCE (this project's CI host) or not:
#   - cr-dump.c: a task's rlimits are read from /proc/<pid>/limits when
#     prlimit64() is refused (it needs CAP_SYS_RESOURCE over the namespace);
#   - sk-unix.c: a unix socket of another network namespace (the agent's
#     listening socket, the host's) named --external unix[<inode>] is dumped
#     by its inode alone, and restored only from --inherit-fd;
#   - namespaces.c: the check that a dump's namespaces belong to its user
#     namespace opens them before entering it (a restored task that is not
#     dumpable, such as the agent, has its mm's user namespace from CRIU);
#   - cr-restore.c: with SHEEPFOLD_CRIU_USERNS_OWNER=<id> in its environment
#     (runc passes its own on), the restored root task's new user namespace
#     is made as that host id, which then owns it, as the sandbox's own uid
#     owns the namespace Create makes (its per-user kernel counters).
# Bump CRIU_PATCHSET whenever criu.patch changes: the next setup rebuilds.
set -euo pipefail

DATA_DIR=${SHEEPFOLD_DATA_DIR:-/var/lib/sheepfold}
CRIU_VERSION=4.2.1
CRIU_DEB_VERSION=4.2.1-1
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
CRIU_PATCHSET=sheepfold-2
# Suites whose source lists may hold $CRIU_DEB_VERSION (apt picks it from any).
CRIU_SUITES=${CRIU_SUITES:-"forky sid trixie-backports"}
MIRROR=${SHEEPFOLD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CRIU=$DATA_DIR/bin/criu
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ "$(id -u)" -ne 0 ]; then
	echo "criu: must run as root (it installs packages and builds into $DATA_DIR)" >&2
	exit 1
fi

# Captured, not piped into grep -q (see setup.sh).
version=$("$CRIU" --version 2>/dev/null || true)
if [[ "$version" == *"Version: $CRIU_VERSION"$'\n'* ]] && [[ "$version" == *"GitID: $CRIU_PATCHSET"* ]]; then
	echo "setup: criu $CRIU_VERSION ($CRIU_PATCHSET)"
	exit 0
fi

# What the build needs, and what criu links at run time (the -dev packages
# bring the libraries); iptables for CRIU's network lock.
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]; }
need=()
for pkg in gcc make pkg-config patch xz-utils libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler \
	libnl-3-dev libcap-dev libnet1-dev libbsd-dev libnftables-dev uuid-dev libgnutls28-dev iptables; do
	installed "$pkg" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
	echo "setup: installing ${need[*]} (to build criu)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

work=$(mktemp -d /var/tmp/sheepfold-criu.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "setup: building criu $CRIU_VERSION ($CRIU_PATCHSET) into $DATA_DIR/bin (a few minutes)"

# apt with a state of its own: only these deb-src lists, signed by the
# Debian archive's keys.
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
for suite in $CRIU_SUITES; do
	echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $suite main"
done >"$work/apt/sources.list"
aptopts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache" -o APT::Sandbox::User=root)
apt-get "${aptopts[@]}" update -qq
(cd "$work" && apt-get "${aptopts[@]}" source -qq --download-only --tar-only "criu=$CRIU_DEB_VERSION") >"$work/source.log" 2>&1 ||
	{ cat "$work/source.log" >&2; echo "criu: no suite of $CRIU_SUITES has criu $CRIU_DEB_VERSION any more: pin a newer one in $0" >&2; exit 1; }
tarball=$work/criu_$CRIU_VERSION.orig.tar.xz
echo "$CRIU_SHA256  $tarball" | sha256sum -c --quiet - || { echo "criu: $tarball is not the pinned tarball" >&2; exit 1; }

tar -C "$work" -xf "$tarball"
src=$work/criu-$CRIU_VERSION
patch -d "$src" -p1 --quiet <"$here/criu.patch"
# GITID is what --version prints as GitID: the patch set.
if ! make -C "$src" -j"$(nproc)" criu GITID="$CRIU_PATCHSET" >"$work/build.log" 2>&1; then
	tail -40 "$work/build.log" >&2
	exit 1
fi
mkdir -p "$DATA_DIR/bin"
install -m 0755 "$src/criu/criu" "$CRIU.new"
mv -f "$CRIU.new" "$CRIU"
version=$("$CRIU" --version)
echo "setup: criu ${version%%$'\n'*} ($CRIU_PATCHSET)"
