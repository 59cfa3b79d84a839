#!/bin/bash
# Runs inside the cgroup v2 guest (run.sh boots it), as root from
# sheepfold-ci.service (Delegate=yes). /ci is run.sh's bin/cgroupv2
# (read-only),
# /ci-out the outbox; the template's disk is labelled template. Every step runs; the
# exit status is non-zero when any failed.
set -uo pipefail
export SHEEPFOLD_DATA_DIR=/var/lib/sheepfold
# run.sh may narrow the run for development (GUEST_STEPS="oci sandbox").
[ -f /ci-out/env ] && . /ci-out/env
STEPS=${GUEST_STEPS:-prepare leaf host oci sandbox doctor nested nocgroups e2e doctorbreaks}
failed=()
t0=$(date +%s)

step() {
	local name=$1
	shift
	case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
	echo "=== $name"
	local s
	s=$(date +%s)
	if "$@"; then
		echo "--- ok $name ($(($(date +%s) - s))s)"
	else
		echo "--- FAIL $name ($(($(date +%s) - s))s)"
		failed+=("$name")
	fi
}

# The host as a user's: the data dir, runc, CRIU and the template, the ids
# setup.sh reserves.
prepare() {
	mkdir -p $SHEEPFOLD_DATA_DIR/bin $SHEEPFOLD_DATA_DIR/templates/python /opt/ci &&
		chmod 0711 $SHEEPFOLD_DATA_DIR &&
		mount -o ro -L template $SHEEPFOLD_DATA_DIR/templates/python &&
		cp /ci/* /opt/ci/ &&
		chmod 0755 /opt/ci && install -m 0755 /ci/runc $SHEEPFOLD_DATA_DIR/bin/runc &&
		install -m 0755 /ci/criu $SHEEPFOLD_DATA_DIR/bin/criu &&
		echo "root:1000000:$((65536 * 4097))" >>/etc/subuid &&
		echo "root:1000000:$((65536 * 4097))" >>/etc/subgid
}

# This script and the unit's runner move into the leaf of the delegated
# cgroup that the engine itself moves into (oci.cgroupRoot): a cgroup with
# processes in it cannot give controllers to children ("no internal
# processes"), and the engines of the tests find the delegated cgroup as
# the leaf's parent.
leaf() {
	local d=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup) p
	mkdir -p "$d/supervisor" || return 1
	# (a pid may be gone by the time it is written: the list's own reader)
	for p in $(cat "$d/cgroup.procs"); do echo "$p" >"$d/supervisor/cgroup.procs" 2>/dev/null; done
	[ -z "$(cat "$d/cgroup.procs")" ] || { echo "still in $d: $(cat "$d/cgroup.procs")"; return 1; }
}

# What this guest is: the point of the exercise.
host() {
	uname -r
	systemctl --version | head -1
	[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || { echo "not pure cgroup v2"; return 1; }
	echo "own cgroup: $(cat /proc/self/cgroup)"
	echo "root controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
	echo "delegated: $(cat "/sys/fs/cgroup$(dirname "$(cut -d: -f3 /proc/self/cgroup)")/cgroup.controllers")"
	[ ! -d /sys/fs/cgroup/unified ] || { echo "hybrid layout"; return 1; }
}

# gotest PKG [go test flags]: a compiled test binary (these packages have
# no testdata), verbose enough to show what ran. The guest has no gVisor
# (its runsc pass is the host's, make test-gvisor) and no source tree.
gotest() {
	local pkg=$1
	shift
	(cd /opt/ci && SHEEPFOLD_AGENT_BIN=/opt/ci/sheepfold-agent SHEEPFOLD_TEST_GUEST=1 \
		"/opt/ci/$(basename "$pkg").test" -test.v -test.count=1 -test.timeout=15m "$@" 2>&1 |
		grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic|\s+\S+_test\.go)' | grep -v '^=== RUN')
	return "${PIPESTATUS[0]}"
}

# The package as a user installs it: the unit starts (its first-run step
# finds the template current), the Go SDK end-to-end check runs against it,
# and stopping it leaves no sandbox behind.
e2e() {
	echo "SHEEPFOLD_POOL=1" >/etc/default/sheepfold
	DEBIAN_FRONTEND=noninteractive dpkg -i /ci/sheepfold.deb || return 1
	systemctl is-enabled sheepfold.service || return 1
	local i
	for i in $(seq 600); do
		(exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null && break
		systemctl -q is-failed sheepfold.service && break
		sleep 1
	done
	systemctl --no-pager status sheepfold.service | head -12
	local key
	key=$(sheepfold keys create --name ci | grep -o 'sf_[0-9a-f]\{40\}') || return 1
	local service
	service=$(systemctl show -P ControlGroup sheepfold.service)
	SHEEPFOLD_URL=http://127.0.0.1:8080 SHEEPFOLD_API_KEY=$key SHEEPFOLD_SERVICE_CGROUP=$service \
		/opt/ci/e2e.test -test.v -test.count=1 -test.timeout=15m -test.run '^TestServiceOnCgroupV2$' 2>&1 | grep -Ev '^=== (RUN|PAUSE|CONT)'
	local rc=${PIPESTATUS[0]}
	journalctl -u sheepfold.service --no-pager | grep -E 'level=(WARN|ERROR)' | tail -20
	# The server's own host checks find nothing wrong on a stock host.
	journalctl -u sheepfold.service --no-pager | grep 'host check failed' && rc=1
	systemctl stop sheepfold.service || rc=1
	[ ! -d "/sys/fs/cgroup$service" ] || { echo "cgroups left after stop: $(find "/sys/fs/cgroup$service" -type d)"; rc=1; }
	return $rc
}

# `sheepfold doctor` on this host says all is well, then names each thing
# broken one at a time (exit status 1 and a FAIL line for its check).
doctorbreaks() {
	local out rc=0
	export SHEEPFOLD_RUNTIME=/usr/lib/sheepfold/runc
	sheepfold doctor || return 1
	broken() { # broken CHECK: doctor must fail on CHECK
		out=$(sheepfold doctor)
		if [ $? -eq 1 ] && grep -q "^FAIL $1 " <<<"$out"; then
			echo "broken $1: $(grep "^FAIL $1 " <<<"$out")"
		else
			echo "broken $1, but doctor says:"
			echo "$out"
			rc=1
		fi
	}
	umount $SHEEPFOLD_DATA_DIR/templates/python && broken template
	mount -o ro -L template $SHEEPFOLD_DATA_DIR/templates/python || rc=1
	SHEEPFOLD_RUNTIME=/nonexistent/runc broken runtime
	local max
	max=$(sysctl -n user.max_user_namespaces)
	sysctl -qw user.max_user_namespaces=0 && broken userns
	sysctl -qw user.max_user_namespaces="$max" || rc=1
	sheepfold doctor >/dev/null || { echo "doctor fails after repairs"; rc=1; }
	return $rc
}

# `sheepfold serve` in a container of its own (a nested runc run with a
# private cgroup namespace): it takes its namespace's root as its delegated
# cgroup, and its sandboxes' cgroups lie inside the container's.
nested() {
	SHEEPFOLD_RUNC=$SHEEPFOLD_DATA_DIR/bin/runc SHEEPFOLD_BIN_DIR=/opt/ci \
		/opt/ci/e2e.test -test.v -test.count=1 -test.timeout=15m -test.run '^TestServerInContainer$' 2>&1 | grep -Ev '^=== (RUN|PAUSE|CONT)'
	return "${PIPESTATUS[0]}"
}

# No cgroup is left behind by the tests: an engine removes its parent
# cgroup (sheepfold, or the tests' sheepfold-test) with its last sandbox.
nocgroups() {
	local left
	left=$(find /sys/fs/cgroup -type d \( -name sheepfold -o -name sheepfold-test -o -name "nested-*" \))
	[ -z "$left" ] || { echo "cgroups left behind:"; find $left -type d; return 1; }
}

step prepare prepare
step leaf leaf
case " ${failed[*]} " in *" prepare "* | *" leaf "*) STEPS="" ;; esac
step host host
step oci gotest internal/runtime/oci
# The engine's tests where cgroups matter (the rest of the package does not
# depend on the host's cgroup layout and runs in `make test`): isolation,
# the limits (memory OOM, pids, disk; a full disk that is not an OOM kill). Left out: tests whose budgets assume
# native speed and fail under TCG's tenfold slowdown (TestPolicyResources'
# 0.5 s of CPU, matplotlib's font cache in TestRuncStatefulPython,
# TestRuncLifetimeHoldsWithoutEngine's 10 s); the crash sweep runs in
# internal/runtime/oci (TestSweepDeadInstance, TestSweepRetriesStubbornLeftovers).
SANDBOX_RUN=${SANDBOX_RUN:-'^(TestIsolation|TestForkBombContained|TestDiskLimit|TestPolicyResizesLiveSandbox|TestDiskFullIsNotOOM|TestRuncMemoryBomb|TestRuncOOMScore|TestRuncTimeoutKeepsSandboxUsable|TestPauseResume|TestFreezeResume)$'}
step sandbox gotest internal/sandbox -test.run "$SANDBOX_RUN"
step doctor gotest internal/doctor
step nested nested
step nocgroups nocgroups
step e2e e2e
step doctorbreaks doctorbreaks
# What the kernel said (overlayfs and the OOM killer explain themselves there).
[ ${#failed[@]} -eq 0 ] || dmesg | grep -iE 'overlay|oom|cgroup|9p' | tail -30
echo "=== guest done in $(($(date +%s) - t0))s; failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
