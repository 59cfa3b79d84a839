package oci

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

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

// criuNetworkLockSkip is CRIU's NETWORK_LOCK_SKIP (criu/include/cr_options.h),
// and inventoryLockField the inventory entry's network_lock_method
// (images/inventory.proto).
const (
	criuNetworkLockSkip = 2
	inventoryLockField  = 11
	inventoryImage      = "inventory.img"
)

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
	if len(b) < 8 {
		return nil, errors.New("too short")
	}
	if binary.LittleEndian.Uint32(b[:4]) != 0x58313116 { // INVENTORY_MAGIC
		return nil, errors.New("not an inventory image")
	}
	n := binary.LittleEndian.Uint32(b[4:8])
	if int(n) != len(b)-8 {
		return nil, fmt.Errorf("an entry of %d bytes in %d", n, len(b)-8)
	}
	var entry []byte
	for rest := b[8:]; len(rest) > 0; {
		num, typ, l := protowire.ConsumeTag(rest)
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		vl := protowire.ConsumeFieldValue(num, typ, rest[l:])
		if vl < 0 {
			return nil, protowire.ParseError(vl)
		}
		if num != inventoryLockField {
			entry = append(entry, rest[:l+vl]...)
		} else if typ != protowire.VarintType {
			return nil, fmt.Errorf("network_lock_method of wire type %d", typ)
		}
		rest = rest[l+vl:]
	}
	entry = protowire.AppendTag(entry, inventoryLockField, protowire.VarintType)
	entry = protowire.AppendVarint(entry, method)
	out := append([]byte(nil), b[:4]...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(entry)))
	return append(out, entry...), nil
}
