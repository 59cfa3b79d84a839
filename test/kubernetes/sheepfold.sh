#!/usr/bin/env bash
# Run by test.sh on a cluster that is up: Sheepfold's Kubernetes backend
# end to end. The python template becomes an image (sheepfold template
# export) imported into both nodes, the sandboxes' seccomp profile goes
# into each kubelet's seccomp directory, bin/sheepfold becomes the server's
# image (imported too), each node's containerd gets Sheepfold's NRI plugin
# (the sandboxes' pids limits), and test/kubernetes/e2e runs `sheepfold serve
# --backend kubernetes` over a real PostgreSQL against the cluster, on the
# host and as deploy/kubernetes's Deployment. Everything it writes is under the cluster's state dir, which
# down removes.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CLUSTER=$HERE/cluster.sh
eval "$("$CLUSTER" env)"
BIN_SF=$REPO/bin/sheepfold

for n in "${NODES[@]}"; do
	dir=$KUBE_ROOT/$n/kubelet/seccomp/sheepfold
	mkdir -p "$dir"
	"$BIN_SF" seccomp-profile >"$dir/agent.json"
done

archive=$KUBE_ROOT/python.oci.tar
t=$(date +%s%3N)
out=$("$BIN_SF" template export python -o "$archive" --force)
echo "$out"
image=$(awk '$1 == "image" { print $2 }' <<<"$out")
[ -n "$image" ] || { echo "sheepfold.sh: FAIL: no image name in the export's output" >&2; exit 1; }
echo "sheepfold.sh: template exported in $(($(date +%s%3N) - t)) ms"
t=$(date +%s%3N)
"$CLUSTER" import-image "$archive"
echo "sheepfold.sh: image imported into both nodes in $(($(date +%s%3N) - t)) ms"
rm -f "$archive"

# The server's own image, for the Deployment of deploy/kubernetes:
# bin/sheepfold (static) alone, as its entrypoint.
server_image=sheepfold.local/server:e2e
archive=$KUBE_ROOT/server.oci.tar
(cd "$REPO" && go run ./test/kubernetes/ociimage -name "$server_image" -bin "$BIN_SF" -out "$archive")
"$CLUSTER" import-image "$archive"
rm -f "$archive"

# Sheepfold's NRI plugin on each node, as deploy/kubernetes/nri.yaml's
# DaemonSet runs it on a real cluster: a sandbox Pod's containers get its
# pids limit, and its agent refuses to start without it. Here on the host,
# at each node's own NRI socket; stopped when this script ends.
nri_pids=()
stop_nri() {
	local p
	for p in "${nri_pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
}
trap stop_nri EXIT
for n in "${NODES[@]}"; do
	"$BIN_SF" nri-plugin --socket "$KUBE_RUN/$n/nri.sock" 2>"$LOGS/nri-plugin-$n.log" &
	nri_pids+=($!)
done
for n in "${NODES[@]}"; do
	for i in $(seq 100); do
		grep -q '"msg":"registered with the runtime"' "$LOGS/nri-plugin-$n.log" && break
		[ "$i" = 100 ] && { echo "sheepfold.sh: FAIL: the NRI plugin of node $n did not register:" >&2; cat "$LOGS/nri-plugin-$n.log" >&2; exit 1; }
		sleep 0.1
	done
done
echo "sheepfold.sh: the NRI plugin registered with both nodes' containerd"

cd "$REPO"
export SHEEPFOLD_E2E_KUBECONFIG=$KUBECONFIG_ADMIN SHEEPFOLD_E2E_IMAGE=$image SHEEPFOLD_E2E_SERVER_IMAGE=$server_image SHEEPFOLD_E2E_BIN=$BIN_SF SHEEPFOLD_E2E_CLUSTER=$CLUSTER SHEEPFOLD_E2E_E2B_DIR=$REPO/test/e2b SHEEPFOLD_E2E_VOLUME_DIR=$KUBE_ROOT/volumes
if [ "${SHEEPFOLD_KUBE_BENCH:-}" = 1 ]; then
	# make bench-kubernetes: the bench instead of the e2e test.
	go test -tags 'kubernetes_e2e kubernetes_bench' -count=1 -v -timeout 30m -run '^TestBenchPods$' ./test/kubernetes/e2e/
	exit
fi
# Its output is kept for test.sh's failure digest (the cluster's logs go
# with down). SHEEPFOLD_E2E_RUN, a -run pattern, runs some tests only.
go test -tags kubernetes_e2e -count=1 -v -timeout 30m ${SHEEPFOLD_E2E_RUN:+-run "$SHEEPFOLD_E2E_RUN"} ./test/kubernetes/e2e/ 2>&1 | tee "$LOGS/e2e.out"

# The manifests of deploy/kubernetes are valid for this API server (a
# server-side dry run: nothing is made).
kc() { "$CLUSTER" kubectl "$@"; }
kc apply --dry-run=server -f "$REPO/deploy/kubernetes/namespace.yaml"
kc create namespace sheepfold >/dev/null
trap 'kc delete namespace sheepfold --wait=false >/dev/null; stop_nri' EXIT
for f in rbac rbac-portforward server runtimeclasses nri; do
	kc apply --dry-run=server -f "$REPO/deploy/kubernetes/$f.yaml"
done
