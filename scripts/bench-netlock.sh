#!/usr/bin/env bash
# bench-netlock.sh [N]: what CRIU's network lock costs a dump, by method.
# A Python process in a network namespace of its own, holding a loopback
# TCP connection (as a sandbox's may), is dumped N times with each method,
# alternating, --leave-running as a snapshot's dump (lock, then unlock):
# iptables (CRIU's default: iptables-restore for IPv4 and IPv6 to lock,
# again with a shell to unlock) and nftables (libnftables in CRIU's own
# process; internal/runtime/oci netlock_linux.go). The lock and unlock
# times come from CRIU's own log. It prints each and the medians, with
# nftables' ratio to iptables measured in the same run. Needs root and the
# CRIU `make setup` builds.
set -euo pipefail
N=${1:-5}
CRIU=${SHEEPFOLD_DATA_DIR:-/var/lib/sheepfold}/bin/criu
WORK=$(mktemp -d /tmp/sheepfold-netlock-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
setsid unshare --net --fork /usr/bin/python3 -c '
import os, socket, sys, time
os.system("ip link set lo up")
ln = socket.create_server(("127.0.0.1", 0))
c = socket.create_connection(ln.getsockname())
s, _ = ln.accept()
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(1)
' "$WORK/pid" </dev/null >/dev/null 2>&1 &
for _ in $(seq 100); do [ -f "$WORK/pid" ] && break; sleep 0.1; done
pid=$(cat "$WORK/pid")
for i in $(seq "$N"); do
	for m in iptables nftables; do
		rm -rf "$WORK/img" && mkdir "$WORK/img"
		"$CRIU" dump -t "$pid" -D "$WORK/img" -o dump.log -v4 --tcp-established --leave-running --shell-job --network-lock "$m"
		echo "$m $WORK/img/dump.log"
		cp "$WORK/img/dump.log" "$WORK/$m-$i.log"
	done
done >/dev/null
/usr/bin/python3 - "$WORK" "$N" <<'PY'
import statistics, sys
work, n = sys.argv[1], int(sys.argv[2])
def stamp(l):
    return float(l[1:l.index(")")])
def step(lines, name):
    # from CRIU's "Lock network"/"Unlock network" line to its next step
    for i, l in enumerate(lines):
        if name in l:
            j = i + 1
            while j < len(lines) - 1 and "network-" in lines[j] and "scripts" in lines[j]:
                j += 1
            return (stamp(lines[j]) - stamp(l)) * 1000
    raise SystemExit(f"no {name!r} in CRIU's log")
res = {}
for m in ("iptables", "nftables"):
    res[m] = []
    for i in range(1, n + 1):
        lines = [l for l in open(f"{work}/{m}-{i}.log", errors="replace") if l.startswith("(")]
        res[m].append(step(lines, "net: Lock network") + step(lines, "net: Unlock network"))
    print(m, "lock+unlock ms:", " ".join(f"{v:.0f}" for v in res[m]), f"median {statistics.median(res[m]):.0f}")
print(f"nftables/iptables: {statistics.median(res['nftables']) / statistics.median(res['iptables']):.2f}x")
PY
