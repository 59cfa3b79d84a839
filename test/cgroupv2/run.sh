#!/usr/bin/env bash
# `make test-cgroupv2`: runs the engine's privileged tests, the limits
# tests, the crash sweep and an end-to-end check of the installed service
# inside a qemu guest whose host is what most users have: Debian's kernel,
# systemd as init, pure cgroup v2 with the controllers delegated to the
# service (Delegate=yes). This host (cgroup v1 hybrid) cannot show any of
# that. The accelerator is chosen by what works (`sheepfold doctor
# --guest-accel`): KVM only with hardware virtualization (vmx or svm; a
# /dev/kvm from the kvm_pvm module cannot boot a stock kernel), and a KVM
# boot that prints nothing within $SHEEPFOLD_GUEST_KVM_BOUND seconds is
# stopped and the same run made under TCG, about ten times slower than
# native.
#
# The guest image (image.sh) and the template's disk are built once and
# cached under $DATA_DIR/guest, again when image.sh or the template
# changes. Each run boots the cached image with its writes thrown away
# (snapshot), shares bin/cgroupv2 read-only over 9p (the binaries, the
# .deb, runc, the compiled tests, in-guest.sh) and an outbox where the
# guest leaves its log and exit status. No status is a failure: this never skips.
set -euo pipefail
cd "$(dirname "$0")/../.."

DATA_DIR=${SHEEPFOLD_DATA_DIR:-/var/lib/sheepfold}
GUEST_DIR=$DATA_DIR/guest
TIMEOUT=${SHEEPFOLD_GUEST_TIMEOUT:-1500}
MEM=${SHEEPFOLD_GUEST_MEM:-4096}
SMP=${SHEEPFOLD_GUEST_SMP:-2}
start=$(date +%s)
elapsed() { echo "$(($(date +%s) - start))s"; }

[ -f bin/sheepfold.deb ] || { echo "test-cgroupv2: bin/sheepfold.deb missing: run make deb" >&2; exit 1; }
command -v qemu-system-x86_64 >/dev/null || { echo "test-cgroupv2: qemu-system-x86_64 missing: run make setup" >&2; exit 1; }
template=$DATA_DIR/templates/python
[ -f "$template/template.json" ] || { echo "test-cgroupv2: template $template missing: run make template" >&2; exit 1; }
mkdir -p "$GUEST_DIR"

# 1. The guest image, keyed on its recipe.
image=$GUEST_DIR/image-$(sha256sum test/cgroupv2/image.sh | cut -c1-16)
if [ ! -f "$image/root.img" ]; then
	rm -rf "$GUEST_DIR"/image-*
	test/cgroupv2/image.sh "$image"
fi

# 2. The template's disk, keyed on its template.json (which names the
# build's time and size): the engine needs a real filesystem under it
# (overlayfs, idmapped mounts), which 9p is not.
timg=$GUEST_DIR/template-$(sha256sum "$template/template.json" | cut -c1-16).img
if [ ! -f "$timg" ]; then
	rm -f "$GUEST_DIR"/template-*.img
	echo "test-cgroupv2: making the template's disk $timg"
	size=$(du -sm "$template" | cut -f1)
	rm -f "$timg.tmp"
	truncate -s "$((size * 13 / 10 + 256))M" "$timg.tmp"
	mkfs.ext4 -q -L template -d "$template" "$timg.tmp"
	mv "$timg.tmp" "$timg"
fi

# 3. What runs inside: the binaries, the pinned runc and CRIU, and compiled tests.
out=bin/cgroupv2
rm -rf "$out"
mkdir -p "$out"
cp bin/sheepfold bin/sheepfold-agent bin/sheepfold.deb "$DATA_DIR/bin/runc" "$DATA_DIR/bin/criu" test/cgroupv2/in-guest.sh "$out/"
for pkg in internal/runtime/oci internal/sandbox internal/doctor; do
	go test -c -o "$out/$(basename "$pkg").test" "./$pkg"
done
go test -c -tags cgroupv2guest -o "$out/e2e.test" ./test/cgroupv2
echo "test-cgroupv2: payload ready ($(elapsed))"

# 4. Boot.
outbox=$(mktemp -d /var/tmp/sheepfold-cgroupv2.XXXXXX)
trap 'rm -rf "$outbox"' EXIT
# For development: GUEST_STEPS="prepare leaf host oci" runs only those steps,
# SANDBOX_RUN narrows internal/sandbox's tests.
for v in GUEST_STEPS SANDBOX_RUN; do
	[ -z "${!v:-}" ] || printf '%s=%q\n' "$v" "${!v}" >>"$outbox/env"
done
# boot ACCEL: runs the guest under kvm or tcg, its serial console on our
# stdout and in $serial. Under KVM, a guest that has printed nothing after
# $KVM_BOUND seconds is stopped and silent set: that KVM cannot run it.
serial=$outbox/serial.log
silent=0
boot() {
	local args=(-accel tcg,thread=multi -cpu max)
	[ "$1" = kvm ] && args=(-accel kvm -cpu host)
	rm -f "$outbox/status"
	: >"$serial"
	timeout --foreground -k 10 "$TIMEOUT" qemu-system-x86_64 \
		-machine q35 "${args[@]}" -smp "$SMP" -m "$MEM" \
		-nodefaults -no-user-config -display none -no-reboot -serial stdio \
		-kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
		-append "root=/dev/vda rw console=ttyS0 loglevel=3 systemd.show_status=error panic=-1" \
		-drive "file=$image/root.img,format=raw,if=virtio,snapshot=on" \
		-drive "file=$timg,format=raw,if=virtio,readonly=on" \
		-device virtio-rng-pci \
		-virtfs "local,path=$PWD/$out,mount_tag=ci,security_model=none,readonly=on" \
		-virtfs "local,path=$outbox,mount_tag=ciout,security_model=none" </dev/null > >(tee -a "$serial") &
	local pid=$! waited=0
	if [ "$1" = kvm ]; then
		while [ ! -s "$serial" ] && kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$KVM_BOUND" ]; do
			sleep 1
			waited=$((waited + 1))
		done
		if [ ! -s "$serial" ] && kill -0 "$pid" 2>/dev/null; then
			kill "$pid"
			wait "$pid" || true
			silent=1
			return 0
		fi
	fi
	local rc=0
	wait "$pid" || rc=$?
	return "$rc"
}
KVM_BOUND=${SHEEPFOLD_GUEST_KVM_BOUND:-60}
IFS=$'\t' read -r accel why < <(bin/sheepfold doctor --guest-accel)
# For development: SHEEPFOLD_GUEST_ACCEL=kvm tries KVM whatever the host
# offers (the fallback to TCG still applies).
if [ -n "${SHEEPFOLD_GUEST_ACCEL:-}" ]; then
	accel=$SHEEPFOLD_GUEST_ACCEL why="SHEEPFOLD_GUEST_ACCEL"
fi
echo "test-cgroupv2: booting the guest under $accel ($why; $SMP CPUs, $MEM MiB, timeout ${TIMEOUT}s)"
rc=0
boot "$accel" || rc=$?
if [ "$silent" = 1 ]; then
	IFS=$'\t' read -r accel why < <(bin/sheepfold doctor --guest-accel --guest-probe silent)
	echo "test-cgroupv2: the KVM boot printed nothing in ${KVM_BOUND}s: booting again under $accel ($why; $(elapsed))"
	rc=0
	boot "$accel" || rc=$?
fi
if [ "$rc" -ne 0 ]; then
	echo "test-cgroupv2: FAIL: qemu exited with $rc after $(elapsed) (124: timed out)" >&2
	exit 1
fi
if [ ! -f "$outbox/status" ]; then
	echo "test-cgroupv2: FAIL: the guest left no exit status ($(elapsed))" >&2
	exit 1
fi
status=$(cat "$outbox/status")
if [ "$status" != 0 ]; then
	echo "test-cgroupv2: FAIL: in-guest status $status ($(elapsed))" >&2
	exit 1
fi
echo "test-cgroupv2: ok ($(elapsed))"
