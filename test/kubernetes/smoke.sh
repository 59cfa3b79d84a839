#!/usr/bin/env bash
# The test cluster's smoke test, run after `cluster.sh up` (make
# test-kubernetes runs up, this, down). It never skips: anything missing or
# wrong is a failure with the reason and the relevant logs.
#
#   - imports the echo image (a static Go HTTP server, echo/) into both nodes
#     with `cluster.sh import-image`;
#   - creates one pod per node (nodeSelector on kubernetes.io/hostname, so the
#     scheduler places them; RuntimeClass runc; imagePullPolicy Never) and
#     checks that they run on different nodes;
#   - reaches each pod's IP from the host, then each pod from the other
#     (the echo server fetches ?get=URL itself);
#   - deletes them and checks that nothing is left: no pod, no running task
#     in either containerd, no veth on the bridges, no pod cgroup.
# It prints the time from creating a pod to its first answer.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CLUSTER=$HERE/cluster.sh
eval "$("$CLUSTER" env)"

fail() {
	echo "smoke: FAIL: $*" >&2
	"$CLUSTER" kubectl get pods -o wide >&2 || true
	"$CLUSTER" kubectl get events --sort-by=.lastTimestamp >&2 || true
	local n
	for n in "${NODES[@]}"; do
		echo "smoke: the last lines of $LOGS/kubelet-$n.log:" >&2
		tail -n 15 "$LOGS/kubelet-$n.log" >&2 || true
	done
	exit 1
}
k() { "$CLUSTER" kubectl "$@"; }
now_ms() { date +%s%3N; }
seconds() { printf '%d.%03ds' $(($1 / 1000)) $(($1 % 1000)); }

[ -f "$KUBECONFIG_ADMIN" ] || fail "no cluster: run $CLUSTER up first"

"$CLUSTER" import-image "$IMAGES/echo.tar" >/dev/null || fail "importing the echo image failed"

# pod N: the manifest of the echo pod for node N.
pod() {
	cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: echo-$1
  labels: {app: sheepfold-smoke}
spec:
  runtimeClassName: runc
  nodeSelector: {kubernetes.io/hostname: sf-node-$1}
  terminationGracePeriodSeconds: 2
  dnsPolicy: Default # the cluster has no DNS service
  containers:
  - name: echo
    image: $ECHO_IMAGE
    imagePullPolicy: Never
    args: [":8080"]
    ports: [{containerPort: 8080}]
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: POD_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
EOF
}

declare -A created ip answered
for n in "${NODES[@]}"; do
	created[$n]=$(now_ms)
	pod "$n" | k apply -f - >/dev/null || fail "creating pod echo-$n failed"
done

# Wait for each pod's IP, then for its first answer from the host.
deadline=$(($(date +%s) + 60))
for n in "${NODES[@]}"; do
	while :; do
		ip[$n]=$(k get pod "echo-$n" -o jsonpath='{.status.podIP}' 2>/dev/null || true)
		if [ -n "${ip[$n]}" ] && out=$(curl -sf --max-time 1 "http://${ip[$n]}:8080/" 2>/dev/null); then
			answered[$n]=$(now_ms)
			break
		fi
		[ "$(date +%s)" -lt "$deadline" ] || fail "pod echo-$n did not answer on ${ip[$n]:-no IP}:8080 within 60s"
		sleep 0.05
	done
	[ "$out" = "pod=echo-$n ip=${ip[$n]}" ] || fail "echo-$n at ${ip[$n]} answered \"$out\""
	echo "smoke: echo-$n (${ip[$n]}) answered the host $(seconds $((answered[$n] - created[$n]))) after it was created"
done

node_a=$(k get pod echo-a -o jsonpath='{.spec.nodeName}')
node_b=$(k get pod echo-b -o jsonpath='{.spec.nodeName}')
if [ "$node_a" != sf-node-a ] || [ "$node_b" != sf-node-b ]; then
	fail "pods scheduled on $node_a and $node_b, want sf-node-a and sf-node-b"
fi
case ${ip[a]} in 10.88.1.*) ;; *) fail "echo-a has IP ${ip[a]}, not in node a's subnet 10.88.1.0/24" ;; esac
case ${ip[b]} in 10.88.2.*) ;; *) fail "echo-b has IP ${ip[b]}, not in node b's subnet 10.88.2.0/24" ;; esac

# Pod to pod, both ways, across the two nodes' bridges.
for pair in "a b" "b a"; do
	read -r from to <<<"$pair"
	out=$(curl -sS --max-time 10 "http://${ip[$from]}:8080/?get=http://${ip[$to]}:8080/" 2>&1) ||
		fail "echo-$from could not reach echo-$to: $out"
	[ "$out" = "pod=echo-$to ip=${ip[$to]}" ] || fail "echo-$from fetching echo-$to got \"$out\""
	echo "smoke: echo-$from reached echo-$to"
done

# The pods' logs come through the apiserver from the kubelets.
k logs echo-a | grep -q 'listening on :8080' || fail "kubectl logs echo-a lacks the server's start line"

t=$(now_ms)
k delete pod echo-a echo-b --wait=true --timeout=60s >/dev/null || fail "deleting the pods failed"
echo "smoke: pods deleted in $(seconds $(($(now_ms) - t)))"

# Nothing left: the kubelets remove the pod cgroups and stop the sandboxes
# (tearing down their network) shortly after the pods are gone.
left() {
	local n m
	m=$(k get pods -o name 2>/dev/null) || { echo "kubectl get pods failed"; return; }
	[ -z "$m" ] || { echo "pods: $m"; return; }
	for n in "${NODES[@]}"; do
		# (ctr warns on stderr that cgroup v1 is deprecated.)
		m=$("$BIN/ctr" --address "$KUBE_RUN/$n/containerd.sock" -n k8s.io tasks list -q 2>/dev/null) || { echo "ctr tasks list on node $n failed"; return; }
		[ -z "$m" ] || { echo "running tasks on node $n: $m"; return; }
		m=$(ip -o link show master "sfk-$n" 2>/dev/null | awk -F': ' '{ print $2 }')
		[ -z "$m" ] || { echo "veths on sfk-$n: $m"; return; }
		m=$(find "/sys/fs/cgroup/memory/sheepfold-kube-$n" "/sys/fs/cgroup/sheepfold-kube-$n" -maxdepth 3 -type d -name 'pod*' 2>/dev/null)
		[ -z "$m" ] || { echo "pod cgroups on node $n: $m"; return; }
	done
}
deadline=$(($(date +%s) + 30))
while :; do
	what=$(left)
	[ -n "$what" ] || break
	[ "$(date +%s)" -lt "$deadline" ] || fail "30s after deleting the pods, left: $what"
	sleep 0.2
done
echo "smoke: nothing left of the pods"
echo "smoke: ok"
