#!/usr/bin/env bash
# Builds the cgroup v2 test guest into OUT: a Debian root filesystem made
# with debootstrap (systemd as init, the stock kernel from
# linux-image-amd64) as an ext4 image, and the kernel and initrd to boot it
# with. run.sh keys its cache on this file's hash: change anything here and
# the next run rebuilds the guest.
set -euo pipefail

OUT=${1:?usage: image.sh OUTDIR}
SUITE=bookworm
MIRROR=${SHEEPFOLD_GUEST_MIRROR:-http://deb.debian.org/debian}
# systemd as init (cgroup v2 unified, controllers delegated as on a stock
# host), the kernel (its initrd from initramfs-tools loads virtio), udev and
# kmod for the 9p modules, libseccomp2 for runc, debootstrap because the
# .deb depends on it, python3 for the isolation tests' unconfined control
# runs, e2fsprogs (mkfs.ext4) for sandboxes' disks, the libraries the
# host's CRIU links (scripts/criu.sh) and iptables (its network lock);
# util-linux (mount, unshare, nsenter) and coreutils come with minbase.
PACKAGES=systemd,systemd-sysv,udev,kmod,linux-image-amd64,initramfs-tools,dbus,procps,libseccomp2,debootstrap,python3,e2fsprogs,libprotobuf-c1,libnl-3-200,libnet1,libnftables1,libbsd0,libgnutls30,libuuid1,iptables
# Downloaded packages are kept for the next build of the image.
CACHE=${SHEEPFOLD_GUEST_CACHE:-/var/cache/sheepfold-guest}

work=$(mktemp -d /var/tmp/sheepfold-guest.XXXXXX)
# debootstrap mounts /proc and more in the root; an interrupted build
# leaves them.
cleanup() {
	findmnt -rno TARGET | { grep "^$work/" || true; } | sort -r | xargs -r umount -l
	rm -rf "$work"
}
trap cleanup EXIT
root=$work/root

echo "image: debootstrap $SUITE ($PACKAGES) from $MIRROR"
mkdir -p "$CACHE"
debootstrap --variant=minbase --cache-dir="$CACHE" --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
	{ tail -30 "$work/debootstrap.log" >&2; exit 1; }

echo sheepfold-guest >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 sheepfold-guest\n' >"$root/etc/hosts"
# No login: the guest runs sheepfold-ci.service and powers off.
chroot "$root" systemctl mask getty@tty1.service serial-getty@ttyS0.service \
	systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer 2>/dev/null || true
# The loop module: each sandbox's disk is an image on a loop device.
printf '9p\n9pnet_virtio\nloop\n' >"$root/etc/modules-load.d/ci.conf"

# The CI unit: mounts the run's payload (read-only 9p) and outbox (9p),
# runs the payload's in-guest.sh, leaves its exit status in the outbox and
# powers the guest off. Delegate=yes as a service that runs sandboxes has.
cat >"$root/usr/local/sbin/sheepfold-ci" <<'SH'
#!/bin/bash
mkdir -p /ci /ci-out
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=1048576 ci /ci &&
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 ciout /ci-out || { echo "sheepfold-ci: mount 9p failed"; poweroff -f; }
/bin/bash /ci/in-guest.sh 2>&1 | tee /ci-out/log
echo "${PIPESTATUS[0]}" >/ci-out/status
sync
systemctl poweroff --no-block
SH
chmod 0755 "$root/usr/local/sbin/sheepfold-ci"
cat >"$root/etc/systemd/system/sheepfold-ci.service" <<'UNIT'
[Unit]
Description=Sheepfold cgroup v2 CI run
After=local-fs.target systemd-modules-load.service
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/sheepfold-ci
StandardOutput=journal+console
StandardError=inherit
Delegate=yes
TimeoutStartSec=infinity
[Install]
WantedBy=multi-user.target
UNIT
chroot "$root" systemctl enable sheepfold-ci.service >/dev/null 2>&1

kernel=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -1)
initrd=$(ls "$root"/boot/initrd.img-* | sort -V | tail -1)
mkdir -p "$OUT.tmp"
cp "$kernel" "$OUT.tmp/vmlinuz"
cp "$initrd" "$OUT.tmp/initrd.img"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
# The root disk: the rootfs plus room for the tests' sandboxes.
truncate -s 4G "$OUT.tmp/root.img"
mkfs.ext4 -q -L root -d "$root" "$OUT.tmp/root.img"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "image: built $OUT ($(du -sh --apparent-size "$OUT" | cut -f1), $(basename "$kernel"))"
