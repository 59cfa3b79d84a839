#!/usr/bin/env bash
# `make test-kubernetes`: cluster.sh up, smoke.sh, sheepfold.sh (the
# Kubernetes backend end to end), then cluster.sh down
# whatever happened, and a check that down left the host as up found it:
# the same iptables, ip6tables and nft rulesets, links, network namespaces,
# sysctls, no mount under the state dirs, no cgroup of the cluster, no
# process of the cluster, no state dir. Any difference fails the test.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CLUSTER=$HERE/cluster.sh
eval "$("$CLUSTER" env)"
start=$(date +%s)

"$CLUSTER" build || exit 1

snap=$(mktemp -d)
trap 'rm -rf "$snap"' EXIT

# host_state DIR: what up changes and down must restore.
host_state() {
	local d=$1 s
	mkdir -p "$d"
	iptables-save 2>/dev/null | grep -v '^#' >"$d/iptables"
	ip6tables-save 2>/dev/null | grep -v '^#' >"$d/ip6tables"
	if command -v nft >/dev/null; then nft list ruleset >"$d/nft" 2>/dev/null; fi
	ip -o link show | awk -F': ' '{ print $2 }' | sort >"$d/links"
	ip netns list 2>/dev/null | sort >"$d/netns"
	for s in net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops \
		kernel.keys.root_maxkeys kernel.keys.root_maxbytes; do
		echo "$s=$(sysctl -n "$s")"
	done >"$d/sysctl"
	cat /proc/sys/net/bridge/bridge-nf-call-* >>"$d/sysctl" 2>/dev/null
	awk '{ print $5 }' /proc/self/mountinfo | grep -E "^($KUBE_ROOT|$KUBE_RUN)(/|$)" >"$d/mounts"
	find /sys/fs/cgroup -maxdepth 2 -type d -name 'sheepfold-kube-*' >"$d/cgroups"
	ls -d /var/log/containers /var/log/pods /var/lib/cni /run/containerd /run/containerd/runsc /run/runsc /opt/containerd /run/nri /var/lib/kubelet \
		/etc/cni /etc/kubernetes /usr/libexec/kubernetes "$KUBE_ROOT" "$KUBE_RUN" >"$d/paths" 2>/dev/null
	for p in /proc/[0-9]*; do
		case $(readlink "$p/exe" 2>/dev/null) in
		"$BIN"/ctr | "$BIN"/kubectl) ;; # clients, maybe someone else's
		"$BIN"/* | "$GVISOR_BIN"/*) echo "process ${p#/proc/}: $(tr '\0' ' ' <"$p/cmdline")" ;;
		esac
	done >"$d/processes"
}

host_state "$snap/before"
status=0
"$CLUSTER" up >"$snap/up.out" || status=1
cat "$snap/up.out"
if [ $status = 0 ]; then
	"$CLUSTER" status || status=1
	"$HERE/smoke.sh" || status=1
fi
if [ $status = 0 ]; then
	"$HERE/sheepfold.sh" || status=1
fi
# Leave a running pod on each node, with a tmpfs volume, for down to clean
# up: down must not depend on the pods having been deleted. Node b's is a
# gVisor sandbox (runsc's sandbox and gofer processes, its state dir).
if [ $status = 0 ]; then
	for n in "${NODES[@]}"; do
		class=runc
		[ "$n" = b ] && class=gvisor
		"$CLUSTER" kubectl apply -f - >/dev/null <<EOF || status=1
apiVersion: v1
kind: Pod
metadata: {name: left-$n}
spec:
  nodeSelector: {kubernetes.io/hostname: sf-node-$n}
  runtimeClassName: $class
  dnsPolicy: Default
  containers:
  - name: echo
    image: $ECHO_IMAGE
    imagePullPolicy: Never
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes: [{name: scratch, emptyDir: {medium: Memory}}]
EOF
	done
	"$CLUSTER" kubectl wait --for=condition=Ready pod/left-a pod/left-b --timeout=60s || status=1
	echo "test-kubernetes: left running for down: $(awk '{ print $5 }' /proc/self/mountinfo | grep -cE "^($KUBE_ROOT|$KUBE_RUN)/") mounts under the state dirs"
fi
# failure_digest: what a failure needs to be understood, printed last (CI
# shows the end of the output) and gathered before down removes the logs:
# the failing tests' own messages, the nodes, the cluster's recent events
# and the warnings and errors of its components.
failure_digest() {
	local f
	echo "== test-kubernetes: failure digest =="
	if [ -f "$LOGS/e2e.out" ]; then
		# Go: the last messages of each test before its --- FAIL line.
		awk '/^=== RUN/ { n = 0 } /_test\.go:[0-9]+: / { m[n++ % 6] = $0 }
			/^--- FAIL/ { print; for (i = (n > 6 ? n - 6 : 0); i < n; i++) print m[i % 6]; n = 0 }' "$LOGS/e2e.out" | cut -c1-400
		# node --test (the E2B SDKs' suite): its own list of failures.
		awk '/failing tests:/ { on = 1 } on && k++ < 40' "$LOGS/e2e.out" | cut -c1-400
	fi
	"$CLUSTER" kubectl get nodes -o wide 2>&1 | head -5
	"$CLUSTER" kubectl get events -A --sort-by=.lastTimestamp 2>&1 | grep -v ' Normal ' | tail -15 | cut -c1-300
	for f in kubelet-a kubelet-b kube-apiserver kube-controller-manager containerd-a containerd-b etcd; do
		[ -f "$LOGS/$f.log" ] || continue
		echo "-- $f: its last warnings and errors"
		grep -E '^[EW][0-9]{4} |"level":"(warn|error)"|level=(warning|error)' "$LOGS/$f.log" | tail -6 | cut -c1-300
	done
}
[ $status = 0 ] || failure_digest >"$snap/digest" 2>&1

t=$(date +%s%3N)
"$CLUSTER" down || status=1
down_ms=$(($(date +%s%3N) - t))
host_state "$snap/after"
if ! diff -r "$snap/before" "$snap/after" >"$snap/diff"; then
	echo "test-kubernetes: FAIL: down did not restore the host:" >&2
	cat "$snap/diff" >&2
	status=1
fi

sed -n 's/^up-to-ready-ms \(.*\)/test-kubernetes: up to both nodes Ready: \1 ms/p; s/^up-to-usable-ms \(.*\)/test-kubernetes: up to the default service account (pods admitted): \1 ms/p' "$snap/up.out"
echo "test-kubernetes: down in $down_ms ms; whole test $(($(date +%s) - start))s"
if [ $status = 0 ]; then
	echo "test-kubernetes: ok (host state after down equals before up)"
	echo "1 passed, 0 failed"
else
	[ -f "$snap/digest" ] && cat "$snap/digest"
	echo "test-kubernetes: FAILED"
	echo "0 passed, 1 failed"
fi
exit $status
