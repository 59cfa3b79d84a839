package ociimage

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// capabilityXattr holds a file's capabilities (struct vfs_ns_cap_data,
// little endian): magic_etc (revision in the top byte, the effective flag
// in bit 0), then permitted and inheritable pairs, and in revision 3 the
// host uid that is root of the user namespace the capabilities are for.
const capabilityXattr = "security.capability"

const (
	capRevisionMask = 0xff000000
	capRevision1    = 0x01000000 // 12 bytes: one 32-bit pair
	capRevision2    = 0x02000000 // 20 bytes: two 32-bit pairs
	capRevision3    = 0x03000000 // 24 bytes: revision 2 and the root id
	capSize1        = 12
	capSize2        = 20
	capSize3        = 24
)

// unshiftCapability returns the security.capability value v with its
// namespace root id unshifted. A revision 3 value whose root id is the
// image's root becomes revision 2 (capabilities for any namespace's root,
// as a revision 2 value read in the image is); revisions 1 and 2 have no id.
func unshiftCapability(v []byte, ids idRange) ([]byte, error) {
	if len(v) < 4 {
		return nil, fmt.Errorf("%s of %d bytes", capabilityXattr, len(v))
	}
	magic := binary.LittleEndian.Uint32(v)
	want := map[uint32]int{capRevision1: capSize1, capRevision2: capSize2, capRevision3: capSize3}
	size, ok := want[magic&capRevisionMask]
	if !ok {
		return nil, fmt.Errorf("%s has unknown revision %#x", capabilityXattr, magic&capRevisionMask)
	}
	if len(v) != size {
		return nil, fmt.Errorf("%s revision %#x has %d bytes, want %d", capabilityXattr, magic&capRevisionMask, len(v), size)
	}
	if size != capSize3 {
		return slices.Clone(v), nil
	}
	host := binary.LittleEndian.Uint32(v[capSize2:])
	id, ok := ids.unshift(host)
	if !ok {
		return nil, fmt.Errorf("%s is for the root id %d, outside the shifted ids", capabilityXattr, host)
	}
	if id == 0 {
		out := slices.Clone(v[:capSize2])
		binary.LittleEndian.PutUint32(out, capRevision2|magic&^capRevisionMask)
		return out, nil
	}
	out := slices.Clone(v)
	binary.LittleEndian.PutUint32(out[capSize2:], id)
	return out, nil
}
