#!/usr/bin/env bash
# Installs what Sheepfold needs on a Debian host, idempotently:
#   - apt packages: debootstrap (templates), libseccomp-dev (runc's seccomp), nodejs/npm (E2B SDK tests),
#     bubblewrap (`sheepfold bench`'s bwrap baseline), git (the egress tests serve a repository),
#     chromium (the dashboard's browser test),
#     qemu-system-x86 (`make test-cgroupv2` boots a cgroup v2 guest),
#     containernetworking-plugins (the CNI plugins of `make test-kubernetes`'s cluster),
#     the Debian side of E2B's Python SDK (test/e2b/python: the SDK itself is vendored there),
#     and r-base-core and default-jdk-headless (internal/kernel's R and Java tests run them on the host)
#   - postgresql, WITHOUT its default cluster: the tests of the PostgreSQL
#     store start their own (internal/testutil/pgtest) under the postgres user.
#   - runc at a pinned release, built from the Go module proxy with seccomp,
#     into $DATA_DIR/bin (Debian's runc 1.1.5 lacks the November 2025 fixes).
#   - gVisor's runsc at the version go.mod pins for gvisor.dev/gvisor, built
#     static (CGO_ENABLED=0: a cgo build fails at its first run) from the Go
#     module proxy into $DATA_DIR/bin, with runsc.version beside it; sandboxes
#     that choose runtime "gvisor" run under it (internal/runtime/oci).
#   - CRIU at a pinned release with Sheepfold's patches, built from Debian's
#     source package into $DATA_DIR/bin, for runc's checkpoint and restore
#     (scripts/criu.sh says why; bookworm's 3.17 fails on this kernel).
#   - root's entries in /etc/subuid and /etc/subgid for the host ids of the
#     template's owners and of every sandbox (internal/runtime/oci), so that
#     useradd never gives them to a user, when root has none yet.
set -euo pipefail

DATA_DIR=${SHEEPFOLD_DATA_DIR:-/var/lib/sheepfold}
RUNC_VERSION=${RUNC_VERSION:-v1.5.3}
RUNC=$DATA_DIR/bin/runc
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNSC_VERSION=${RUNSC_VERSION:-$(awk '$1 == "gvisor.dev/gvisor" { print $2 }' "$ROOT/go.mod")}
RUNSC=$DATA_DIR/bin/runsc

if [ "$(id -u)" -ne 0 ]; then
	echo "setup: must run as root (it installs packages and builds into $DATA_DIR)" >&2
	exit 1
fi

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]; }
need=()
for pkg in debootstrap libseccomp-dev pkg-config gcc bubblewrap git chromium qemu-system-x86 containernetworking-plugins \
	python3-h2 python3-attr python3-protobuf python3-dateutil python3-packaging python3-typing-extensions \
	python3-wcmatch python3-rich python3-requests python3-anyio python3-h11 python3-certifi python3-idna python3-sniffio \
	r-base-core default-jdk-headless; do
	installed "$pkg" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
	echo "setup: installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# PostgreSQL's server binaries (/usr/lib/postgresql/NN/bin) for the postgres
# store's tests. postgresql-NN's postinst would create and start a cluster
# "main" on port 5432; postgresql-common is installed first so that its
# createcluster.conf can say not to, before the server package comes.
if ! installed postgresql-common; then
	echo "setup: installing postgresql-common"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-common >/dev/null
fi
conf=/etc/postgresql-common/createcluster.conf
if ! grep -Eq '^[[:space:]]*create_main_cluster[[:space:]]*=[[:space:]]*false' "$conf"; then
	sed -i -E 's/^[[:space:]]*#?[[:space:]]*(create_main_cluster)[[:space:]]*=.*$/\1 = false/' "$conf"
	grep -Eq '^create_main_cluster = false' "$conf" || echo 'create_main_cluster = false' >>"$conf"
	echo "setup: $conf: create_main_cluster = false"
fi
if ! installed postgresql; then
	echo "setup: installing postgresql (no default cluster)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

mkdir -p "$DATA_DIR/bin"
# Others may pass through the data dir (sandboxes reach their rootfs under
# run/) but not list it; the database in it is 0600.
chmod 0711 "$DATA_DIR"
chmod 0755 "$DATA_DIR/bin"
want=${RUNC_VERSION#v}
# Capture outputs instead of piping into grep -q: with pipefail, an early
# grep exit would SIGPIPE the writer and fail the check.
version=$("$RUNC" --version 2>/dev/null || true)
features=$("$RUNC" features 2>/dev/null || true)
if [[ "$version" != *"runc version $want"$'\n'* ]] || [[ "$features" != *'"enabled": true'* ]]; then
	echo "setup: building runc $RUNC_VERSION with seccomp into $DATA_DIR/bin"
	GOBIN="$DATA_DIR/bin" CGO_ENABLED=1 go install -tags seccomp "github.com/opencontainers/runc@$RUNC_VERSION"
	version=$("$RUNC" --version)
fi
echo "setup: ${version%%$'\n'*}"

# runsc: built once per pinned version (about 3.5 minutes, 100 MB), into a
# temporary directory first so that a failed build leaves the old one.
if [ -z "$RUNSC_VERSION" ]; then
	echo "setup: go.mod pins no gvisor.dev/gvisor" >&2
	exit 1
fi
if [ ! -x "$RUNSC" ] || [ "$(cat "$RUNSC.version" 2>/dev/null || true)" != "$RUNSC_VERSION" ]; then
	echo "setup: building gVisor's runsc $RUNSC_VERSION (static) into $DATA_DIR/bin"
	tmp=$(mktemp -d "$DATA_DIR/bin/.runsc.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	GOBIN="$tmp" CGO_ENABLED=0 go install "gvisor.dev/gvisor/runsc@$RUNSC_VERSION"
	mv -f "$tmp/runsc" "$RUNSC"
	echo "$RUNSC_VERSION" >"$RUNSC.version"
	rm -rf "$tmp"
	trap - EXIT
fi
echo "setup: runsc $(cat "$RUNSC.version")"

"$(dirname "${BASH_SOURCE[0]}")/criu.sh"

# 1000000..1065535 own the templates' files; each sandbox gets 65536 ids of
# its own after them (oci.DefaultSlots = 4096 ranges).
for f in /etc/subuid /etc/subgid; do
	touch "$f"
	if ! grep -q '^root:' "$f"; then
		echo "root:1000000:$((65536 * 4097))" >>"$f"
		echo "setup: reserved host ids 1000000+ for sandboxes in $f"
	fi
done
