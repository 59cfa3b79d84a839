#!/usr/bin/env bash
# bench-pair.sh A B [N [MODE]]: the pool miss (create with a sandbox-wide env var,
# then print(1)) of two builds, interleaved: each of N rounds creates one
# sandbox on each build's server, in alternating order, so that both see
# the same load. MODE "restore" pairs issue 31's restores instead: on each
# server one sandbox with pandas and matplotlib imported, and each round
# pauses it and takes the first result after (the resume), snapshots it
# and starts a sandbox from the snapshot to its first result, and forks it
# into four. A and B are source trees with bin/sheepfold and
# bin/sheepfold-agent built (make build; for an older commit:
# git worktree add DIR COMMIT && make -C DIR build). Both servers use this
# host's templates and runc; neither has anything else to do. It prints
# p50 and p95 of each, and B's difference from A per round.
#
# On a shared machine the whole-run p50 of `sheepfold bench` moves by a
# third between runs of one build; a paired comparison does not.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 A B [N [miss|restore]]" >&2; exit 2; }
A=$(cd "$1" && pwd) B=$(cd "$2" && pwd) N=${3:-40} MODE=${4:-miss}
DATA_DIR=${SHEEPFOLD_DATA_DIR:-/var/lib/sheepfold}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/sheepfold-pair-XXXXXX)
chmod 755 "$WORK"
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start NAME TREE: a server of TREE's build with a pool of 2, its key and URL in $WORK/NAME.{key,url}
start() {
	local name=$1 tree=$2 d=$WORK/$1 port
	mkdir -m 755 "$d"
	ln -s "$DATA_DIR/templates" "$d/templates"
	export SHEEPFOLD_RUNTIME=$DATA_DIR/bin/runc SHEEPFOLD_AGENT=$tree/bin/sheepfold-agent
	"$tree/bin/sheepfold" --data-dir "$d" keys create --name pair 2>&1 | grep -o 'sf_[0-9a-f]\{40\}' >"$d.key"
	port=$(free_port)
	echo "http://127.0.0.1:$port" >"$d.url"
	"$tree/bin/sheepfold" --data-dir "$d" serve --listen "127.0.0.1:$port" --pool 2 --instance "pair-$name-$$" >"$d.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 150); do
		curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && return 0
		sleep 0.2
	done
	echo "$name's server did not start:" >&2
	cat "$d.log" >&2
	exit 1
}
start a "$A"
start b "$B"

PYTHONPATH=$ROOT/sdk/python /usr/bin/python3 - "$WORK" "$N" "$MODE" <<'PY'
import statistics, sys, time
from sheepfold import Sandbox

work, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
servers = {}
for name in "ab":
    key = open(f"{work}/{name}.key").read().strip()
    url = open(f"{work}/{name}.url").read().strip()
    servers[name] = (key, url)

def wait_pool(key, url):
    # Both pools full before a round: no refill competes for the CPU.
    import json, urllib.request
    for _ in range(600):
        req = urllib.request.Request(url + "/v1/version", headers={"Authorization": "Bearer " + key})
        pool = json.load(urllib.request.urlopen(req)).get("pool") or {}
        if pool.get("ready", 0) >= pool.get("size", 0):
            return
        time.sleep(0.1)

def miss(key, url):
    t = time.perf_counter()
    sb = Sandbox.create(envs={"SHEEPFOLD_BENCH": "miss"}, api_key=key, base_url=url)
    created = time.perf_counter()
    ex = sb.run_code("print(1)")
    done = time.perf_counter()
    sb.kill()
    assert ex.logs.stdout == ["1\n"], ex.logs
    return (done - t) * 1000, (created - t) * 1000, (done - created) * 1000

def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, len(v) * p // 100)]

def restores(key, url, sb, k):
    # Round k (from 1) of issue 31's restores on one server: the times in
    # ms of the pause, the resume to the first result, the snapshot, the
    # start from it to the first result and the fork of four. rounds is
    # 41 + k after the resume.
    ms = lambda t: (time.perf_counter() - t) * 1000
    want = str(42 + k)
    t = time.perf_counter()
    sb.pause()
    pause = ms(t)
    t = time.perf_counter()
    ex = sb.run_code("rounds += 1\nlen(pd.DataFrame({'a': [1]})) + rounds")
    resume = ms(t)
    assert ex.text == want, ex
    name = f"pair-{time.time_ns()}"
    t = time.perf_counter()
    sb.create_snapshot(name)
    snap = ms(t)
    t = time.perf_counter()
    c = Sandbox.create(snapshot=name, api_key=key, base_url=url)
    ex = c.run_code("len(pd.DataFrame({'a': [1]})) + rounds")
    start = ms(t)
    c.kill()
    Sandbox.delete_snapshot(name, api_key=key, base_url=url)
    assert ex.text == want, ex
    t = time.perf_counter()
    forks = sb.fork(4)
    fork = ms(t)
    for f in forks:
        assert f.run_code("rounds").text == str(41 + k)
        f.kill()
    return pause, resume, snap, start, fork

if mode == "restore":
    labels = ("pause", "resume → first result", "snapshot", "start from the snapshot → first result", "fork of 4")
    boxes = {}
    for name, (key, url) in servers.items():
        sb = Sandbox.create(timeout=1800, api_key=key, base_url=url)
        # A cold import of both takes seconds, and much more on a loaded host.
        ex = sb.run_code("import pandas as pd, matplotlib.pyplot as plt\nrounds = 41", timeout=600, request_timeout=660)
        assert ex.error is None, ex.error
        boxes[name] = sb
    res = {name: [] for name in servers}
    for i in range(-1, n):  # one warm-up round
        for name in ("ab" if i % 2 == 0 else "ba"):
            r = restores(*servers[name], boxes[name], i + 2)
            if i >= 0:
                res[name].append(r)
    for sb in boxes.values():
        sb.kill()
    for j, what in enumerate(labels):
        a, b = [r[j] for r in res["a"]], [r[j] for r in res["b"]]
        diff = [y - x for x, y in zip(a, b)]
        print(f"{what}: A p50 {statistics.median(a):.0f} p95 {pct(a, 95):.0f} ms; B p50 {statistics.median(b):.0f} p95 {pct(b, 95):.0f} ms; "
              f"B − A median {statistics.median(diff):+.0f} ms over {n} rounds")
    sys.exit(0)

res = {name: [] for name in servers}
for i in range(n):
    for name in ("ab" if i % 2 == 0 else "ba"):
        wait_pool(*servers[name])
        res[name].append(miss(*servers[name]))

for name, label in (("a", "A"), ("b", "B")):
    tot = [r[0] for r in res[name]]
    print(f"{label}: create→print(1) p50 {statistics.median(tot):.1f} ms, p95 {pct(tot, 95):.1f} ms "
          f"(create {statistics.median(r[1] for r in res[name]):.1f}, first print(1) {statistics.median(r[2] for r in res[name]):.1f})")
diff = [b[0] - a[0] for a, b in zip(res["a"], res["b"])]
print(f"B − A per round: median {statistics.median(diff):+.1f} ms, mean {statistics.mean(diff):+.1f} ms, over {n} rounds")
PY
