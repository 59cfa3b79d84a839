#!/usr/bin/env bash
# A real two-node Kubernetes cluster on this one machine, for testing a
# Kubernetes sandbox backend against (`make test-kubernetes`).
#
#   cluster.sh build                 build the pinned binaries and images once (cached)
#   cluster.sh up                    start the cluster; wait until both nodes are Ready
#   cluster.sh down                  stop it and undo everything it did to the host
#   cluster.sh status                processes, nodes, pods
#   cluster.sh import-image FILE.tar import an OCI archive into both nodes' containerd
#   cluster.sh kubectl ARGS...       kubectl with the cluster's admin kubeconfig
#   cluster.sh env                   the cluster's paths as shell assignments
#
# Binaries: Kubernetes, etcd and containerd are built from the Go module
# proxy through the wrapper modules in build/ into
# $DATA_DIR/kubernetes/<versions>/bin, once; a stamp there (the versions,
# the Go version, and a hash of the wrapper modules and of the image
# programs) makes a version bump or an edit rebuild. gVisor's runsc and its
# shim (containerd-shim-runsc-v1) are built the same way from build/gvisor
# into $DATA_DIR/kubernetes/gvisor-<version>/bin with a stamp of their own:
# adding or bumping them rebuilds only them (about 9 minutes, not 20). runc is Sheepfold's
# own ($DATA_DIR/bin/runc, scripts/setup.sh); the CNI plugins are Debian's
# (containernetworking-plugins, installed here with apt when missing). No
# registry is reachable: the pause image and the smoke test's image are
# static Go programs (pause/, echo/) written into OCI archives by ociimage/
# and imported with ctr.
#
# Each node's containerd has two runtimes: runc (the default; RuntimeClass
# runc) and gVisor's runsc (RuntimeClass gvisor, handler runsc) on the
# systrap platform (no /dev/kvm on these hosts), its state in the node's
# run dir.
#
# The cluster: etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler on loopback; two kubelets, sf-node-a and sf-node-b, each
# with its own containerd (own socket, root and state: two kubelets on one
# containerd would garbage-collect each other's pods), its own cgroup root
# (/sheepfold-kube-a, /sheepfold-kube-b in every hierarchy: each kubelet
# removes pod cgroups it does not know) and its own CNI network: a bridge
# (sfk-a, sfk-b) that this script creates with the node's address
# (10.88.1.1/24, 10.88.2.1/24; the kubelet serves there: a node IP cannot be
# loopback) and the bridge plugin with host-local IPAM in that subnet. With
# ip_forward on, the host routes between the two bridges, so pods on both
# nodes reach each other and the host reaches every pod. No kube-proxy: no
# Service IPs. State is under $KUBE_ROOT and $KUBE_RUN, logs in
# $KUBE_ROOT/logs.
#
# `up` first saves what it will change on the host into $KUBE_ROOT/host
# (iptables and nft rulesets, sysctls, which default paths exist); `down`
# kills every process of the cluster (its daemons, the shims, the pods'
# processes), unmounts everything under the state dirs, deletes the bridges,
# their veths and the pods' network namespaces, the iptables chains and
# rules and nft tables that appeared, restores the sysctls (ip_forward, the
# bridge-nf ones, and the kernel tunables the kubelet sets: kernel.panic,
# kernel.panic_on_oops, vm.overcommit_memory, ...), removes the cgroup
# roots and the default paths that the daemons created, then the state
# dirs. It is idempotent and works after a failed or partial `up`.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
KUBE_VERSION=v1.37.2
ETCD_VERSION=v3.7.3
CONTAINERD_VERSION=v2.4.2
DATA_DIR=${SHEEPFOLD_DATA_DIR:-/var/lib/sheepfold}
CACHE=$DATA_DIR/kubernetes/kube-$KUBE_VERSION-etcd-$ETCD_VERSION-containerd-$CONTAINERD_VERSION
BIN=$CACHE/bin
IMAGES=$CACHE/images
# gVisor's go branch (the Go module proxy's pseudo-version of its commit);
# the same version must be in build/gvisor/go.mod.
GVISOR_VERSION=v0.0.0-20260905035102-160fafc42237
GVISOR_CACHE=$DATA_DIR/kubernetes/gvisor-$GVISOR_VERSION
GVISOR_BIN=$GVISOR_CACHE/bin
RUNC=$DATA_DIR/bin/runc
CNI_BIN=/usr/lib/cni
KUBE_ROOT=${SHEEPFOLD_KUBE_ROOT:-/var/lib/sheepfold-kube}
KUBE_RUN=${SHEEPFOLD_KUBE_RUN:-/run/sheepfold-kube}
LOGS=$KUBE_ROOT/logs
HOST=$KUBE_ROOT/host
PKI=$KUBE_ROOT/pki
KUBECONFIG_ADMIN=$KUBE_ROOT/admin.kubeconfig
PAUSE_IMAGE=localhost/sheepfold/pause:1
ECHO_IMAGE=localhost/sheepfold/echo:1
NODES=(a b)
ETCD_PORT=32379
APISERVER_PORT=36443
APISERVER=https://127.0.0.1:$APISERVER_PORT
READY_TIMEOUT=${SHEEPFOLD_KUBE_READY_TIMEOUT:-90}
# Kernel tunables the kubelet sets at start (pkg/kubelet/cm: setupKernelTunables).
KUBELET_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
# Default paths the daemons may create on the host whatever their
# configuration says; `down` removes those that `up` did not find. Seen:
# /var/lib/kubelet/device-plugins (the kubelet's device plugin socket has a
# fixed path: both kubelets bind it in turn, harmless without device
# plugins), /var/log/containers (the kubelet's links to the pods' logs),
# /var/lib/cni/results (libcni's cache), /run/containerd/s (the shims'
# sockets, named by a hash of the containerd address: distinct),
# /run/containerd/runsc (the runsc shim's default state root: it is told
# the node's, but uses the default where it reads no options).
HOST_PATHS=(/var/log/containers /var/log/pods /var/lib/cni /run/containerd /run/containerd/runsc /var/run/containerd /opt/containerd
	/run/nri /var/run/nri /var/lib/kubelet /etc/cni /etc/kubernetes /usr/libexec/kubernetes /var/run/cdi /run/cdi /etc/cdi /var/lib/containerd)

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }
now_ms() { date +%s%3N; }
seconds() { printf '%d.%03ds' $(($1 / 1000)) $(($1 % 1000)); }

node_name() { echo "sf-node-$1"; }
node_index() { case $1 in a) echo 1 ;; b) echo 2 ;; *) die "unknown node $1" ;; esac; }
node_ip() { echo "10.88.$(node_index "$1").1"; }
node_subnet() { echo "10.88.$(node_index "$1").0/24"; }
node_bridge() { echo "sfk-$1"; }
node_root() { echo "$KUBE_ROOT/$1"; }
# Short: the shims' sockets live in $(node_run)/containerd/s/<64 hex digits>
# and a unix socket path has at most 107 bytes.
node_run() { echo "$KUBE_RUN/$1"; }
node_sock() { echo "$(node_run "$1")/containerd.sock"; }
node_cgroup() { echo "sheepfold-kube-$1"; }

kubectl() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
ctr() { local n=$1; shift; "$BIN/ctr" --address "$(node_sock "$n")" --namespace k8s.io "$@"; }

# ---------------------------------------------------------------- build

# stamp prints what the cached binaries were built from; a change rebuilds.
stamp() {
	echo "kubernetes $KUBE_VERSION etcd $ETCD_VERSION containerd $CONTAINERD_VERSION"
	go version
	(cd "$HERE" && find build/kubernetes build/etcd build/containerd pause echo ociimage pki -type f ! -name '*_test.go' | sort | xargs cat | sha256sum)
}

# gvisor_stamp: the same for the gVisor binaries.
gvisor_stamp() {
	echo "gvisor $GVISOR_VERSION"
	go version
	(cd "$HERE" && cat build/gvisor/go.mod build/gvisor/go.sum && declare -f build_gvisor) | sha256sum
}

BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd containerd containerd-shim-runc-v2 ctr sheepfold-kube-pki)

GVISOR_BINARIES=(runsc containerd-shim-runsc-v1)

cmd_build() {
	command -v go >/dev/null || die "go is not on PATH"
	build_kubernetes
	build_gvisor
}

build_kubernetes() {
	local want
	want=$(stamp)
	if [ -f "$CACHE/stamp" ] && [ "$(cat "$CACHE/stamp")" = "$want" ]; then
		local b ok=1
		for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || ok=0; done
		[ -f "$IMAGES/pause.tar" ] && [ -f "$IMAGES/echo.tar" ] || ok=0
		if [ $ok = 1 ]; then
			log "binaries cached in $BIN"
			return
		fi
	fi
	local start tmp
	start=$(date +%s)
	tmp=$CACHE.tmp
	rm -rf "$tmp"
	mkdir -p "$tmp/bin" "$tmp/images"
	log "building Kubernetes $KUBE_VERSION, etcd $ETCD_VERSION, containerd $CONTAINERD_VERSION into $BIN (about 20 minutes from empty caches)"
	local kv=${KUBE_VERSION#v} kx cx
	kx="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=${kv%%.*}"
	kx+=" -X k8s.io/component-base/version.gitMinor=$(echo "$kv" | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean"
	kx+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitMajor=${kv%%.*}"
	kx+=" -X k8s.io/client-go/pkg/version.gitMinor=$(echo "$kv" | cut -d. -f2) -X k8s.io/client-go/pkg/version.gitTreeState=clean"
	(cd "$HERE/build/kubernetes" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w $kx" -o "$tmp/bin/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl)
	(cd "$HERE/build/etcd" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/bin/etcd" go.etcd.io/etcd/server/v3)
	cx="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
	(cd "$HERE/build/containerd" && CGO_ENABLED=0 go build -mod=readonly -trimpath -tags urfave_cli_no_docs -ldflags "-s -w $cx" -o "$tmp/bin/" \
		github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr &&
		CGO_ENABLED=0 go build -mod=readonly -trimpath -tags "urfave_cli_no_docs no_grpc" -ldflags "-s -w $cx" -o "$tmp/bin/" \
			github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2)
	build_images "$tmp"
	echo "$want" >"$tmp/stamp"
	rm -rf "$CACHE"
	mv "$tmp" "$CACHE"
	log "built in $(($(date +%s) - start))s"
	echo "build-seconds $(($(date +%s) - start))"
}

# build_gvisor builds runsc and containerd-shim-runsc-v1 into $GVISOR_BIN.
# gVisor builds from the Go module proxy only without cgo.
build_gvisor() {
	local want b ok=1
	want=$(gvisor_stamp)
	for b in "${GVISOR_BINARIES[@]}"; do [ -x "$GVISOR_BIN/$b" ] || ok=0; done
	if [ $ok = 1 ] && [ -f "$GVISOR_CACHE/stamp" ] && [ "$(cat "$GVISOR_CACHE/stamp")" = "$want" ]; then
		log "gVisor binaries cached in $GVISOR_BIN"
		return
	fi
	grep -q "^[[:space:]]*gvisor.dev/gvisor $GVISOR_VERSION\b" "$HERE/build/gvisor/go.mod" ||
		die "build/gvisor/go.mod does not require gvisor.dev/gvisor $GVISOR_VERSION (GVISOR_VERSION here)"
	local start tmp
	start=$(date +%s)
	tmp=$GVISOR_CACHE.tmp
	rm -rf "$tmp"
	mkdir -p "$tmp/bin"
	log "building gVisor $GVISOR_VERSION (runsc, containerd-shim-runsc-v1) into $GVISOR_BIN (about 9 minutes on 2 cores from an empty Go build cache)"
	# The shim lowers its own oom_score_adj to -999 when it starts, and fails
	# where it may not: root lacks CAP_SYS_RESOURCE on these hosts (the reason
	# for restrict_oom_score_adj below). It is built from a copy of the module
	# with that one constant set to 0 (containerd's own score, which needs no
	# privilege), through a replace in a copy of build/gvisor/go.mod; the copy
	# goes when the build ends. runsc is built from the module as it is.
	local mod src
	mod=$(cd "$HERE/build/gvisor" && go list -mod=readonly -m -f '{{.Dir}}' gvisor.dev/gvisor) || die "gvisor.dev/gvisor not found"
	[ -d "$mod" ] || die "gvisor.dev/gvisor not in the module cache"
	src=$tmp/gvisor
	cp -r "$mod" "$src"
	chmod -R u+w "$src"
	sed -i 's/^\(\toomScoreMax\) = -999$/\1 = 0/' "$src/pkg/shim/v1/manager.go"
	grep -q '^	oomScoreMax = 0$' "$src/pkg/shim/v1/manager.go" ||
		die "$mod/pkg/shim/v1/manager.go has no 'oomScoreMax = -999' to change: look again at how the shim sets its OOM score"
	cp "$HERE/build/gvisor/go.mod" "$tmp/shim.mod"
	cp "$HERE/build/gvisor/go.sum" "$tmp/shim.sum"
	echo "replace gvisor.dev/gvisor => $src" >>"$tmp/shim.mod"
	(cd "$HERE/build/gvisor" &&
		CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$GVISOR_VERSION" \
			-o "$tmp/bin/runsc" gvisor.dev/gvisor/runsc &&
		CGO_ENABLED=0 go build -mod=readonly -modfile "$tmp/shim.mod" -trimpath -ldflags "-s -w" \
			-o "$tmp/bin/containerd-shim-runsc-v1" gvisor.dev/gvisor/shim) || { rm -rf "$tmp"; die "building gVisor failed"; }
	rm -rf "$src" "$tmp/shim.mod" "$tmp/shim.sum"
	echo "$want" >"$tmp/stamp"
	rm -rf "$GVISOR_CACHE"
	mv "$tmp" "$GVISOR_CACHE"
	log "gVisor built in $(($(date +%s) - start))s"
	echo "gvisor-build-seconds $(($(date +%s) - start))"
}

# build_images writes the pause and echo images into DIR/images, and the
# certificate writer (pki/) into DIR/bin.
build_images() {
	local dir=$1 work
	work=$(mktemp -d)
	# The repository's module: the image programs use only the standard library.
	(cd "$HERE/../.." && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/pause" ./test/kubernetes/pause &&
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/echo" ./test/kubernetes/echo &&
		go build -o "$work/ociimage" ./test/kubernetes/ociimage &&
		go build -trimpath -o "$dir/bin/sheepfold-kube-pki" ./test/kubernetes/pki) || { rm -rf "$work"; return 1; }
	"$work/ociimage" -name "$PAUSE_IMAGE" -bin "$work/pause" -out "$dir/images/pause.tar"
	"$work/ociimage" -name "$ECHO_IMAGE" -bin "$work/echo" -out "$dir/images/echo.tar"
	rm -rf "$work"
}

# ---------------------------------------------------------------- up

# save_host records what `up` is about to change, for `down`.
save_host() {
	mkdir -p "$HOST"
	iptables-save >"$HOST/iptables" 2>/dev/null || true
	ip6tables-save >"$HOST/ip6tables" 2>/dev/null || true
	if command -v nft >/dev/null; then nft list tables >"$HOST/nft-tables" 2>/dev/null || true; fi
	local s f
	: >"$HOST/sysctl"
	for s in net.ipv4.ip_forward "${KUBELET_SYSCTLS[@]}"; do
		echo "$s=$(sysctl -n "$s")" >>"$HOST/sysctl"
	done
	for f in /proc/sys/net/bridge/bridge-nf-call-*; do
		[ -e "$f" ] || continue
		s=${f#/proc/sys/}
		echo "${s//\//.}=$(cat "$f")" >>"$HOST/sysctl"
	done
	: >"$HOST/paths"
	for f in "${HOST_PATHS[@]}"; do
		[ -e "$f" ] && echo "$f" >>"$HOST/paths"
	done
	ls /run/netns 2>/dev/null >"$HOST/netns" || true
	ls /run/containerd/s 2>/dev/null >"$HOST/shim-sockets" || true
}

# cgroup_mounts prints the mount point of every cgroup hierarchy (v1, the
# hybrid's unified one, or v2).
cgroup_mounts() {
	awk '{ for (i = 7; $i != "-"; i++) {} if ($(i+1) == "cgroup" || $(i+1) == "cgroup2") print $5 }' /proc/self/mountinfo
}

# make_cgroup_root creates the node's cgroup root, which the kubelet wants to
# exist, in every hierarchy.
make_cgroup_root() {
	local n=$1 m d
	for m in $(cgroup_mounts); do
		d=$m/$(node_cgroup "$n")
		mkdir -p "$d"
		# A v1 cpuset cgroup starts with no cpus and mems: no task could join it.
		if [ -f "$d/cpuset.cpus" ] && [ -z "$(cat "$d/cpuset.cpus")" ]; then
			cat "$m/cpuset.cpus" >"$d/cpuset.cpus"
			cat "$m/cpuset.mems" >"$d/cpuset.mems"
		fi
		# v2: hand every controller the root gives it on to the kubelet's cgroups.
		if [ -f "$d/cgroup.controllers" ] && [ -s "$d/cgroup.controllers" ]; then
			sed 's/\([^ ]*\)/+\1/g' "$d/cgroup.controllers" >"$d/cgroup.subtree_control"
		fi
	done
}

make_bridge() {
	local n=$1 br
	br=$(node_bridge "$n")
	ip link add "$br" type bridge
	# Its address, set once: a bridge whose address was never set takes
	# the lowest of its ports' (random) addresses, so it changes when a
	# Pod's veth joins. The node's Pods keep the old one in their ARP
	# caches (a bridge announces no change) and their packets to the
	# node, its gateway, are dropped until the entry goes stale: 30 s
	# without the relays (CI stop 42's TestServerInCluster).
	ip link set dev "$br" address "$(cat "/sys/class/net/$br/address")"
	ip addr add "$(node_ip "$n")/24" dev "$br"
	ip link set "$br" up
}

# kubeconfig NAME CERT: a kubeconfig for the client certificate CERT.
kubeconfig() {
	cat >"$KUBE_ROOT/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sheepfold
  cluster:
    server: $APISERVER
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: sheepfold
  context: {cluster: sheepfold, user: $2}
current-context: sheepfold
EOF
}

make_pki() {
	# The API server listens on loopback; its certificate also names node
	# a's address, where the e2e test relays to it for Pods (no kube-proxy:
	# no Service IP), as a Pod's in-cluster config would reach it.
	local n certs=(
		"apiserver|kube-apiserver||IP:127.0.0.1,IP:10.96.0.1,IP:$(node_ip a),DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local|server"
		"apiserver-kubelet-client|kube-apiserver-kubelet-client|system:masters||client"
		"admin|sheepfold-admin|system:masters||client"
		"controller-manager|system:kube-controller-manager|||client"
		"scheduler|system:kube-scheduler|||client"
	)
	for n in "${NODES[@]}"; do
		certs+=("kubelet-$n|system:node:$(node_name "$n")|system:nodes||client")
		certs+=("kubelet-$n-serving|$(node_name "$n")||IP:$(node_ip "$n"),DNS:$(node_name "$n")|server")
	done
	"$BIN/sheepfold-kube-pki" "$PKI" "${certs[@]}"
	for n in "${NODES[@]}"; do kubeconfig "kubelet-$n" "kubelet-$n"; done
	kubeconfig admin admin
	kubeconfig controller-manager controller-manager
	kubeconfig scheduler scheduler
}

# start NAME COMMAND...: run a daemon in its own session, logging to $LOGS/NAME.log.
start() {
	local name=$1
	shift
	setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$KUBE_RUN/pids/$name"
}

# fail_with NAME MESSAGE: the end of NAME's log, then die.
fail_with() {
	log "$2; the last lines of $LOGS/$1.log:"
	tail -n 30 "$LOGS/$1.log" >&2 || true
	exit 1
}

# wait_for NAME SECONDS COMMAND...: until COMMAND succeeds; fails with NAME's log
# when it does not in time or NAME exits.
wait_for() {
	local name=$1 secs=$2 deadline
	shift 2
	deadline=$(($(date +%s) + secs))
	until "$@" >/dev/null 2>&1; do
		kill -0 "$(cat "$KUBE_RUN/pids/$name")" 2>/dev/null || fail_with "$name" "$name exited"
		[ "$(date +%s)" -lt "$deadline" ] || fail_with "$name" "$name not ready after ${secs}s"
		sleep 0.1
	done
}

start_etcd() {
	start etcd "$BIN/etcd" --name default --data-dir "$KUBE_ROOT/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
		--initial-cluster "default=http://127.0.0.1:$((ETCD_PORT + 1))" --unsafe-no-fsync
}

start_apiserver() {
	start kube-apiserver "$BIN/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$ETCD_PORT" \
		--bind-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
		--advertise-address 127.0.0.1 --endpoint-reconciler-type none \
		--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
		--client-ca-file "$PKI/ca.crt" \
		--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
		--service-cluster-ip-range 10.96.0.0/24 \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
		--allow-privileged=true --profiling=false
}

start_controllers() {
	start kube-controller-manager "$BIN/kube-controller-manager" \
		--kubeconfig "$KUBE_ROOT/controller-manager.kubeconfig" \
		--authentication-kubeconfig "$KUBE_ROOT/controller-manager.kubeconfig" \
		--authorization-kubeconfig "$KUBE_ROOT/controller-manager.kubeconfig" \
		--authentication-skip-lookup \
		--bind-address 127.0.0.1 --secure-port 36257 --leader-elect=false \
		--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
		--use-service-account-credentials=true --profiling=false \
		--flex-volume-plugin-dir "$KUBE_ROOT/flexvolume"
	start kube-scheduler "$BIN/kube-scheduler" \
		--kubeconfig "$KUBE_ROOT/scheduler.kubeconfig" \
		--authentication-kubeconfig "$KUBE_ROOT/scheduler.kubeconfig" \
		--authorization-kubeconfig "$KUBE_ROOT/scheduler.kubeconfig" \
		--authentication-skip-lookup \
		--bind-address 127.0.0.1 --secure-port 36259 --leader-elect=false --profiling=false
}

# containerd_config N: containerd v2's config (version 3) for node N. Each
# runtime is one [...runtimes.NAME] table, and a RuntimeClass whose handler
# is NAME selects it: runc, and runsc (gVisor).
containerd_config() {
	local n=$1 root run
	root=$(node_root "$n")
	run=$(node_run "$n")
	cat <<EOF
version = 3
root = '$root/containerd'
state = '$run/containerd'
# Plugins that would touch host paths shared by both containerds
# (/opt/containerd) or that are not needed.
disabled_plugins = [
  'io.containerd.internal.v1.opt',
  'io.containerd.internal.v1.tracing',
  'io.containerd.tracing.processor.v1.otlp',
  'io.containerd.snapshotter.v1.btrfs',
  'io.containerd.snapshotter.v1.zfs',
  'io.containerd.snapshotter.v1.devmapper',
  'io.containerd.snapshotter.v1.blockfile',
  'io.containerd.snapshotter.v1.erofs',
  'io.containerd.differ.v1.erofs',
]

[grpc]
  address = '$run/containerd.sock'

# NRI, for Sheepfold's plugin (sheepfold nri-plugin, which gives a sandbox
# Pod's containers its pids limit): each node's own socket and plugin
# directories, not the host's defaults both would share.
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = '$run/nri.sock'
  plugin_path = '$root/nri/plugins'
  plugin_config_path = '$root/nri/conf.d'

[ttrpc]
  address = '$run/containerd.sock.ttrpc'

[debug]
  address = ''

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    # Built and imported by cluster.sh: no registry is reachable.
    sandbox = '$PAUSE_IMAGE'

[plugins.'io.containerd.cri.v1.runtime']
  # Root lacks CAP_SYS_RESOURCE on these hosts: without this every pod fails
  # (a container's oom_score_adj may not go below containerd's own).
  restrict_oom_score_adj = true
  # The pods' network namespaces are mounted under the state dir, not /run/netns.
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = []

  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['$CNI_BIN']
    conf_dir = '$root/cni'
    max_conf_num = 1

  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '$RUNC'
        Root = '$run/runc'
        SystemdCgroup = false
    # gVisor: containerd starts the shim at runtime_path; the shim reads its
    # own options (runsc's path, state root and flags) from ConfigPath.
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
      runtime_type = 'io.containerd.runsc.v1'
      runtime_path = '$GVISOR_BIN/containerd-shim-runsc-v1'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
        TypeUrl = 'io.containerd.runsc.v1.options'
        ConfigPath = '$root/runsc.toml'

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
EOF
}

# runsc_config N: the options of node N's runsc shim. platform systrap:
# there is no /dev/kvm here (and ptrace is slower); runsc's state (its
# --root) is in the node's run dir, which `down` removes; its logs go to
# $LOGS/runsc-N when SHEEPFOLD_KUBE_RUNSC_DEBUG is set.
runsc_config() {
	local n=$1
	cat <<EOF
binary_name = '$GVISOR_BIN/runsc'
root = '$(node_run "$n")/runsc'

[runsc_config]
  platform = 'systrap'
EOF
	if [ -n "${SHEEPFOLD_KUBE_RUNSC_DEBUG:-}" ]; then
		echo "  debug = 'true'"
		echo "  debug-log = '$LOGS/runsc-$n/'"
	fi
}

# cni_config N: node N's network: a bridge with host-local addresses in its subnet.
cni_config() {
	local n=$1
	cat <<EOF
{
  "cniVersion": "1.0.0",
  "name": "sheepfold-$n",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$(node_bridge "$n")",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$(node_root "$n")/cni-ipam",
        "ranges": [[{"subnet": "$(node_subnet "$n")", "gateway": "$(node_ip "$n")"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
}

# kubelet_config N: node N's KubeletConfiguration.
kubelet_config() {
	local n=$1 root i
	root=$(node_root "$n")
	i=$(node_index "$n")
	cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(node_ip "$n")
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: $((36247 + i))
readOnlyPort: 0
tlsCertFile: $PKI/kubelet-$n-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-$n-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$(node_sock "$n")
# The host is cgroup v1 (hybrid) here, v2 elsewhere; cgroupfs works on both
# without systemd.
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: /$(node_cgroup "$n")
podLogsDir: $root/pod-logs
volumePluginDir: $root/volume-plugins
# No iptables chains (KUBE-KUBELET-CANARY, ...): nothing here needs them.
makeIPTablesUtilChains: false
failSwapOn: false
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
nodeStatusUpdateFrequency: 2s
# Every Pod's tasks, whatever runs them: the bound on Pods whose container
# cgroup does not hold their tasks (gVisor's: its host threads and stubs
# are in the Pod's cgroup). A sandbox's own limit, at most 4096, is its
# container's (Sheepfold's NRI plugin).
podPidsLimit: 8192
syncFrequency: 10s
shutdownGracePeriod: 0s
EOF
}

start_node() {
	local n=$1 root run
	root=$(node_root "$n")
	run=$(node_run "$n")
	mkdir -p "$root/cni" "$root/cni-ipam" "$root/pod-logs" "$root/volume-plugins" "$run"
	containerd_config "$n" >"$root/containerd.toml"
	runsc_config "$n" >"$root/runsc.toml"
	cni_config "$n" >"$root/cni/10-sheepfold.conflist"
	kubelet_config "$n" >"$root/kubelet.yaml"
	PATH=$BIN:$PATH start "containerd-$n" "$BIN/containerd" --config "$root/containerd.toml"
}

start_kubelet() {
	local n=$1 root
	root=$(node_root "$n")
	PATH=$BIN:$PATH start "kubelet-$n" "$BIN/kubelet" \
		--config "$root/kubelet.yaml" --kubeconfig "$KUBE_ROOT/kubelet-$n.kubeconfig" \
		--root-dir "$root/kubelet" --cert-dir "$root/kubelet/pki" \
		--hostname-override "$(node_name "$n")" --node-ip "$(node_ip "$n")"
}

apiserver_ready() {
	curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$APISERVER/readyz" >/dev/null
}

# nodes_ready: both nodes registered and Ready.
nodes_ready() {
	local out
	out=$(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}' 2>/dev/null) || return 1
	[[ " $out" == *" sf-node-a=True "* && " $out" == *" sf-node-b=True "* ]]
}

cmd_up() {
	[ "$(id -u)" -eq 0 ] || die "must run as root"
	[ -x "$RUNC" ] || die "$RUNC missing: run make setup"
	[ -x "$CNI_BIN/bridge" ] || {
		log "installing containernetworking-plugins"
		apt-get install -y -qq containernetworking-plugins >/dev/null 2>&1 ||
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containernetworking-plugins >/dev/null; }
	}
	cmd_build
	if [ -e "$KUBE_ROOT" ] || [ -e "$KUBE_RUN" ]; then
		die "$KUBE_ROOT or $KUBE_RUN exists: a cluster is up or was not taken down; run $0 down"
	fi
	local n
	for n in "${NODES[@]}"; do
		if ip link show "$(node_bridge "$n")" >/dev/null 2>&1 || [ -n "$(find /sys/fs/cgroup -maxdepth 2 -name "$(node_cgroup "$n")")" ]; then
			die "bridge $(node_bridge "$n") or cgroup $(node_cgroup "$n") exists: left by an earlier cluster; run $0 down"
		fi
	done
	local t0
	t0=$(now_ms)
	mkdir -p "$KUBE_ROOT" "$KUBE_RUN/pids" "$LOGS"
	save_host
	sysctl -qw net.ipv4.ip_forward=1
	for n in "${NODES[@]}"; do
		make_bridge "$n"
		make_cgroup_root "$n"
	done
	make_pki
	start_etcd
	for n in "${NODES[@]}"; do start_node "$n"; done
	wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"
	start_apiserver
	# The controllers and the kubelets wait for the apiserver themselves:
	# starting them now overlaps their own start with the apiserver's.
	start_controllers
	for n in "${NODES[@]}"; do
		wait_for "containerd-$n" 30 test -S "$(node_sock "$n")"
		ctr "$n" images import "$IMAGES/pause.tar" >"$LOGS/import-pause-$n.log" 2>&1 ||
			fail_with "import-pause-$n" "importing the pause image into node $n failed"
		start_kubelet "$n"
	done
	wait_for kube-apiserver 60 apiserver_ready
	kubectl apply -f - >/dev/null <<EOF || die "creating the RuntimeClasses runc and gvisor failed"
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: runc
handler: runc
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor
handler: runsc
EOF
	local deadline=$(($(date +%s) + READY_TIMEOUT)) nodes_ms=
	until [ -n "$nodes_ms" ] && kubectl get serviceaccount default >/dev/null 2>&1; do
		if [ -z "$nodes_ms" ] && nodes_ready; then
			nodes_ms=$(($(now_ms) - t0))
			continue
		fi
		for n in kube-controller-manager kube-scheduler containerd-a containerd-b kubelet-a kubelet-b; do
			kill -0 "$(cat "$KUBE_RUN/pids/$n")" 2>/dev/null || fail_with "$n" "$n exited"
		done
		if [ "$(date +%s)" -ge "$deadline" ]; then
			kubectl get nodes -o wide >&2 || true
			[ -z "$nodes_ms" ] || fail_with kube-controller-manager "no service account default after ${READY_TIMEOUT}s"
			for n in "${NODES[@]}"; do
				kubectl get node "$(node_name "$n")" >/dev/null 2>&1 || fail_with "kubelet-$n" "node $(node_name "$n") did not register in ${READY_TIMEOUT}s"
			done
			fail_with kubelet-a "nodes not Ready after ${READY_TIMEOUT}s (see also $LOGS/kubelet-b.log)"
		fi
		sleep 0.1
	done
	local ms=$(($(now_ms) - t0))
	log "both nodes Ready in $(seconds "$nodes_ms"), the default service account there in $(seconds "$ms"); kubeconfig: $KUBECONFIG_ADMIN"
	echo "up-to-ready-ms $nodes_ms"
	echo "up-to-usable-ms $ms"
}

# ---------------------------------------------------------------- import-image

cmd_import_image() {
	local file=${1:-} n pids=() failed=0
	[ -n "$file" ] || die "usage: $0 import-image FILE.tar"
	[ -f "$file" ] || die "$file: no such file"
	for n in "${NODES[@]}"; do
		[ -S "$(node_sock "$n")" ] || die "node $n's containerd is not running: run $0 up"
	done
	# Both nodes at once: each containerd unpacks its own copy.
	log "importing $file into $(for n in "${NODES[@]}"; do printf '%s ' "$(node_name "$n")"; done)"
	for n in "${NODES[@]}"; do
		ctr "$n" images import "$file" >"$LOGS/import-$n.log" 2>&1 &
		pids+=($!)
	done
	for n in "${!pids[@]}"; do
		wait "${pids[$n]}" || { log "importing $file into node ${NODES[$n]} failed:"; tail -n 20 "$LOGS/import-${NODES[$n]}.log" >&2; failed=1; }
	done
	[ $failed = 0 ] || exit 1
	# The images the nodes now have (ctr warns on stderr that cgroup v1 is deprecated).
	ctr "${NODES[0]}" images list -q 2>/dev/null | grep -v '^sha256:' || true
}

# ---------------------------------------------------------------- down

# our_pids prints the processes of the cluster that are not in its cgroups:
# the daemons, the shims, runc and runsc (a gVisor sandbox's gofer and
# sandbox processes are runsc too), found by their binary and an argument
# naming the state dirs. Clients (ctr, kubectl) are not the cluster's: they
# end by themselves.
our_pids() {
	local exe p
	find /proc -mindepth 2 -maxdepth 2 -name exe \( -lname "$BIN/containerd" -o -lname "$BIN/containerd-shim-runc-v2" \
		-o -lname "$BIN/kube*" ! -lname "$BIN/kubectl" -o -lname "$BIN/etcd" -o -lname "$RUNC" \
		-o -lname "$GVISOR_BIN/runsc" -o -lname "$GVISOR_BIN/containerd-shim-runsc-v1" \) 2>/dev/null |
		while read -r exe; do
			p=${exe%/exe}
			if tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -qE "^($KUBE_ROOT|$KUBE_RUN)(/|$)|(=|^unix://)($KUBE_ROOT|$KUBE_RUN)/"; then
				echo "${p#/proc/}"
			fi
		done
}

# cgroup_pids prints the processes in the nodes' cgroups: the pods'.
cgroup_pids() {
	local m n
	for m in $(cgroup_mounts); do
		for n in "${NODES[@]}"; do
			[ -d "$m/$(node_cgroup "$n")" ] || continue
			find "$m/$(node_cgroup "$n")" -name cgroup.procs -exec cat {} + 2>/dev/null
		done
	done | sort -u
}

# stop NAME...: SIGTERM the daemons of pid files NAME..., SIGKILL those
# still there after 5s.
stop() {
	local name f pid i pids=()
	for name in "$@"; do
		f=$KUBE_RUN/pids/$name
		[ -f "$f" ] || continue
		pid=$(cat "$f")
		# Only if it is still ours: the same pid may since name another process.
		if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$BIN/${name%-[ab]}" ]; then
			kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
		fi
		rm -f "$f"
	done
	[ ${#pids[@]} -gt 0 ] || return 0
	for i in $(seq 50); do
		for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && break; done || return 0
		sleep 0.1
	done
	kill -KILL "${pids[@]}" 2>/dev/null || true
}

kill_all() {
	local i pids
	for i in $(seq 20); do
		pids=$( (cgroup_pids; our_pids) | sort -u)
		[ -n "$pids" ] || return 0
		# shellcheck disable=SC2086
		kill -KILL $pids 2>/dev/null || true
		sleep 0.2
	done
	log "processes still alive: $pids"
	return 1
}

# our_mounts prints the mount points under the state dirs, deepest first.
our_mounts() {
	awk '{ print $5 }' /proc/self/mountinfo | while read -r m; do
		m=$(printf '%b' "$m") # mountinfo escapes spaces and the like as \040
		case $m in "$KUBE_ROOT" | "$KUBE_ROOT"/* | "$KUBE_RUN" | "$KUBE_RUN"/*) echo "$m" ;; esac
	done | awk '{ print length($0) " " $0 }' | sort -rn | cut -d' ' -f2-
}

unmount_all() {
	local i m left
	for i in 1 2 3 4 5; do
		left=$(our_mounts)
		[ -n "$left" ] || return 0
		while read -r m; do
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
		done <<<"$left"
	done
	left=$(our_mounts)
	[ -z "$left" ] || { log "still mounted: $left"; return 1; }
}

delete_network() {
	local n br v
	for n in "${NODES[@]}"; do
		br=$(node_bridge "$n")
		ip link show "$br" >/dev/null 2>&1 || continue
		for v in $(ip -o link show master "$br" 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
			ip link del "$v" 2>/dev/null || true
		done
		ip link del "$br"
	done
	# Network namespaces the CNI or containerd left in /run/netns (ours are
	# mounted under the state dir, so normally none).
	if [ -f "$HOST/netns" ]; then
		for v in /run/netns/cni-*; do
			[ -e "$v" ] || continue
			v=${v##*/}
			grep -qxF "$v" "$HOST/netns" || ip netns delete "$v" 2>/dev/null || true
		done
	fi
}

# restore_iptables CMD SAVED: deletes the rules and the chains that appeared
# since SAVED (an iptables-save output) and refer to KUBE-* or CNI-* chains.
restore_iptables() {
	local cmd=$1 saved=$2 table line chain new
	command -v "$cmd-save" >/dev/null || return 0
	[ -f "$saved" ] || saved=/dev/null
	# "TABLE :CHAIN ..." and "TABLE -A CHAIN RULE" lines of now that were not there before.
	new=$(grep -vxF -f <(awk '/^\*/ { t = substr($0, 2) } /^-A / || /^:/ { print t " " $0 }' "$saved") \
		<("$cmd-save" 2>/dev/null | awk '/^\*/ { t = substr($0, 2) } /^-A / || /^:/ { print t " " $0 }') || true)
	# Rules first (they may jump to the chains).
	grep -E '^[a-z]+ -A .*(KUBE-|CNI-)' <<<"$new" | while read -r table line; do
		eval "set -- ${line#-A }" # the rule as iptables-save quoted it
		"$cmd" -w -t "$table" -D "$@" 2>/dev/null || log "could not delete $cmd -t $table $line"
	done || true
	grep -E '^[a-z]+ :(KUBE-|CNI-)' <<<"$new" | while read -r table chain; do
		chain=${chain#:}
		chain=${chain%% *}
		"$cmd" -w -t "$table" -F "$chain" 2>/dev/null || true
		"$cmd" -w -t "$table" -X "$chain" 2>/dev/null || log "could not delete chain $chain of $cmd -t $table"
	done || true
}

# restore_nft deletes the nft tables that appeared since `up` and hold no rule
# (iptables-nft creates a table when a chain is first added to it).
restore_nft() {
	command -v nft >/dev/null && [ -f "$HOST/nft-tables" ] || return 0
	local family name
	nft list tables 2>/dev/null | while read -r _ family name; do
		grep -qxF "table $family $name" "$HOST/nft-tables" && continue
		if ! nft -j list table "$family" "$name" 2>/dev/null | grep -q '"rule"'; then
			nft delete table "$family" "$name" 2>/dev/null || log "could not delete nft table $family $name"
		else
			log "nft table $family $name appeared and has rules: left as is"
		fi
	done
}

restore_sysctls() {
	[ -f "$HOST/sysctl" ] || return 0
	local kv
	while read -r kv; do
		sysctl -qw "$kv" || log "could not restore $kv"
	done <"$HOST/sysctl"
}

remove_cgroups() {
	local m n d i
	for m in $(cgroup_mounts); do
		for n in "${NODES[@]}"; do
			d=$m/$(node_cgroup "$n")
			[ -d "$d" ] || continue
			for i in 1 2 3 4 5; do
				find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
				[ -d "$d" ] || break
				sleep 0.2
			done
			[ -d "$d" ] && log "could not remove cgroup $d"
		done
	done
	return 0
}

# remove_host_paths removes the default paths that appeared since `up`, and
# the links the kubelets made in /var/log/containers.
remove_host_paths() {
	local f
	# The sockets of shims that were killed (they remove their own on a clean exit).
	if [ -f "$HOST/shim-sockets" ] && [ -d /run/containerd/s ]; then
		for f in /run/containerd/s/*; do
			[ -S "$f" ] && ! grep -qxF "${f##*/}" "$HOST/shim-sockets" && rm -f "$f"
		done
	fi
	if [ -d /var/log/containers ]; then
		find /var/log/containers -maxdepth 1 -type l -lname "$KUBE_ROOT/*" -delete 2>/dev/null || true
	fi
	[ -f "$HOST/paths" ] || return 0
	for f in "${HOST_PATHS[@]}"; do
		[ -e "$f" ] || continue
		grep -qxF "$f" "$HOST/paths" && continue
		# Only what holds no other mount: never delete through one.
		if awk '{ print $5 }' /proc/self/mountinfo | grep -q "^$f\(/\|$\)"; then
			log "$f appeared and holds a mount: left as is"
			continue
		fi
		rm -rf --one-file-system "$f"
	done
}

cmd_down() {
	[ "$(id -u)" -eq 0 ] || die "must run as root"
	local ok=0
	# The kubelets and controllers first, so that nothing restarts a pod; then
	# the pods, the containerds, the apiserver, etcd.
	stop kubelet-a kubelet-b kube-scheduler kube-controller-manager
	kill_all || ok=1
	stop containerd-a containerd-b
	stop kube-apiserver
	stop etcd
	kill_all || ok=1
	unmount_all || ok=1
	delete_network
	if [ -d "$HOST" ]; then
		restore_iptables iptables "$HOST/iptables"
		restore_iptables ip6tables "$HOST/ip6tables"
		restore_nft
		restore_sysctls
	fi
	remove_cgroups
	remove_host_paths
	if [ $ok = 0 ] && [ -z "$(our_mounts)" ]; then
		rm -rf --one-file-system "$KUBE_ROOT" "$KUBE_RUN"
	else
		die "down is incomplete (see above): $KUBE_ROOT and $KUBE_RUN kept; run down again"
	fi
	log "down"
}

# ---------------------------------------------------------------- a node's kubelet

# stop-kubelet N: the node's kubelet dies (SIGKILL); its pods' containers
# run on, as on a node whose kubelet crashed. start-kubelet N starts it
# again, and it removes the containers of pods no longer in the API.
cmd_stop_kubelet() {
	local n=$1 pid
	[[ " ${NODES[*]} " == *" $n "* ]] || die "usage: $0 stop-kubelet|start-kubelet NODE (one of ${NODES[*]})"
	pid=$(cat "$KUBE_RUN/pids/kubelet-$n" 2>/dev/null) || die "kubelet-$n is not running"
	kill -KILL "$pid" 2>/dev/null || die "kubelet-$n is not running"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	log "kubelet-$n killed"
}

cmd_start_kubelet() {
	local n=$1 pid
	[[ " ${NODES[*]} " == *" $n "* ]] || die "usage: $0 stop-kubelet|start-kubelet NODE (one of ${NODES[*]})"
	pid=$(cat "$KUBE_RUN/pids/kubelet-$n" 2>/dev/null || true)
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		die "kubelet-$n is running"
	fi
	start_kubelet "$n"
	log "kubelet-$n started"
}

# ---------------------------------------------------------------- status

cmd_status() {
	local f pid state
	[ -d "$KUBE_RUN/pids" ] || { echo "cluster: not up"; return 1; }
	for f in "$KUBE_RUN"/pids/*; do
		pid=$(cat "$f")
		state=dead
		kill -0 "$pid" 2>/dev/null && state=running
		printf '%-26s pid %-8s %s\n' "$(basename "$f")" "$pid" "$state"
	done
	kubectl get nodes -o wide && kubectl get pods -A -o wide
}

# cmd_env prints the cluster's paths as shell assignments, for smoke.sh and
# other scripts: eval "$(cluster.sh env)".
cmd_env() {
	local v
	for v in BIN GVISOR_BIN IMAGES KUBE_ROOT KUBE_RUN LOGS KUBECONFIG_ADMIN PAUSE_IMAGE ECHO_IMAGE; do
		printf '%s=%q\n' "$v" "${!v}"
	done
	printf 'NODES=(%s)\n' "${NODES[*]}"
}

main() {
	case ${1:-} in
	build) cmd_build ;;
	env) cmd_env ;;
	up) cmd_up ;;
	down) cmd_down ;;
	status) cmd_status ;;
	import-image) cmd_import_image "${2:-}" ;;
	kubectl) shift; kubectl "$@" ;;
	stop-kubelet) cmd_stop_kubelet "${2:-}" ;;
	start-kubelet) cmd_start_kubelet "${2:-}" ;;
	*) die "usage: $0 build|up|down|status|import-image FILE.tar|kubectl ARGS...|env|stop-kubelet N|start-kubelet N" ;;
	esac
}

# Sourced (by a test of a single function), define only.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then main "$@"; fi
