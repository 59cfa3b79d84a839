package oci

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// CRIU's network lock at restore.
//
// A dump locks the sandbox's network namespace (iptables rules that drop
// every packet but CRIU's own) while it reads the TCP connections, and
// records the lock's method in its inventory image. A restore uses the
// recorded method: for a namespace it makes empty (runc's restore of a
// namespace of its own, as every sandbox's is) it puts the same rules in
// the new namespace once it is set up, and takes them out again before
// the tasks resume. Each of those steps runs iptables-restore, once for
// IPv4 and once for IPv6, and the unlock a shell and iptables besides:
// seven programs, 50 to 100 ms of a restore on a 2-core host.
//
// For a sandbox without a network (no interface but lo) the rules guard
// nothing at restore: the new namespace's lo is down (CRIU restores no
// link of an empty namespace; criuRestore brings it up after CRIU
// returns), so no packet can reach or leave any of its sockets while CRIU
// restores them; when the images hold a TCP connection lo comes up before
// the sockets are restored (loopback_linux.go), but no task runs and
// sockets in repair mode send nothing until CRIU resumes them. The
// restore therefore reads an inventory that names no
// lock (skipNetworkLock); the dump still locks, where the rules do keep
// packets from sockets CRIU is reading. A sandbox with a network (a TUN
// device to its gateway) keeps the recorded lock.
//
// The dump locks with nftables where CRIU can (criuHasNftLock: built with
// libnftables, on a kernel with nf_tables), through the CRIU options the
// dump writes (dumpExternals): CRIU then puts in and takes out the same
// drop-all rules (a table of its own) from its own process, where
// iptables starts iptables-restore for IPv4 and IPv6 to lock and again
// with a shell to unlock, on every dump's path (a snapshot, and so each
// fork, unlocks too: its sandbox runs on). The inventory records the
// method, and a restore locks with it as well, a sandbox without a
// network too: the lock's table, there at the dump, is in the ruleset
// CRIU dumped and restores, and only CRIU's unlock, which a skipped lock
// skips, takes it out again (skipNetworkLock leaves such an inventory
// as it is; its lock and unlock start no program).

// criuNetworkLockSkip is CRIU's NETWORK_LOCK_SKIP (criu/include/cr_options.h),
// and inventoryLockField the inventory entry's network_lock_method
// (images/inventory.proto).
const (
	criuNetworkLockNftables = 1
	criuNetworkLockSkip     = 2
	inventoryLockField      = 11
	inventoryImage          = "inventory.img"
)

// criuHasNftLock says whether CRIU at Config.CriuPath can lock a
// network with nftables (`criu check --feature network_lock_nftables`).
func (o *OCI) criuHasNftLock(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, o.cfg.CriuPath, "check", "--feature", "network_lock_nftables")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		o.cfg.Logger.Info("CRIU locks a dump's network with iptables (no nftables lock)", "err", err, "out", tail(out))
		return false
	}
	return true
}

// skipNetworkLock rewrites the inventory image in imgDir so that CRIU's
// restore neither locks nor unlocks the network. The image is written
// anew and renamed into place, never through an existing inode: a
// clone's images are hard links to its snapshot's. It is one magic word
// (the inventory's own), the entry's length (little-endian 32 bits) and
// the entry.
func skipNetworkLock(imgDir string) error {
	path := filepath.Join(imgDir, inventoryImage)
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if m, err := inventoryLock(b); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	} else if m == criuNetworkLockNftables {
		return nil // see above
	}
	out, err := inventoryWithLock(b, criuNetworkLockSkip)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	tmp := path + ".sheepfold"
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// inventoryWithLock returns the inventory image b with its entry's
// network_lock_method set to method (added when the entry has none).
func inventoryWithLock(b []byte, method uint64) ([]byte, error) {
	var entry []byte
	err := inventoryFields(b, func(field []byte, lock bool, _ uint64) {
		if !lock {
			entry = append(entry, field...)
		}
	})
	if err != nil {
		return nil, err
	}
	entry = protowire.AppendTag(entry, inventoryLockField, protowire.VarintType)
	entry = protowire.AppendVarint(entry, method)
	out := append([]byte(nil), b[:4]...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(entry)))
	return append(out, entry...), nil
}

// inventoryLock returns the network_lock_method the inventory image b
// records (CRIU's default, iptables, 0, when it records none).
func inventoryLock(b []byte) (uint64, error) {
	var method uint64
	err := inventoryFields(b, func(_ []byte, lock bool, v uint64) {
		if lock {
			method = v
		}
	})
	return method, err
}

// inventoryFields calls fn with each field of the inventory image b's
// entry, whether it is network_lock_method, and then its value.
func inventoryFields(b []byte, fn func(field []byte, lock bool, method uint64)) error {
	if len(b) < 8 {
		return errors.New("too short")
	}
	if binary.LittleEndian.Uint32(b[:4]) != 0x58313116 { // INVENTORY_MAGIC
		return errors.New("not an inventory image")
	}
	n := binary.LittleEndian.Uint32(b[4:8])
	if int(n) != len(b)-8 {
		return fmt.Errorf("an entry of %d bytes in %d", n, len(b)-8)
	}
	for rest := b[8:]; len(rest) > 0; {
		num, typ, l := protowire.ConsumeTag(rest)
		if l < 0 {
			return protowire.ParseError(l)
		}
		vl := protowire.ConsumeFieldValue(num, typ, rest[l:])
		if vl < 0 {
			return protowire.ParseError(vl)
		}
		var method uint64
		if num == inventoryLockField {
			if typ != protowire.VarintType {
				return fmt.Errorf("network_lock_method of wire type %d", typ)
			}
			method, _ = protowire.ConsumeVarint(rest[l:])
		}
		fn(rest[:l+vl], num == inventoryLockField, method)
		rest = rest[l+vl:]
	}
	return nil
}
