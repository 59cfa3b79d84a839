package oci

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
)

// iskEntry is a files image's entry of an inet socket, as CRIU writes it.
func iskEntry(id uint64, proto, state, sport, dport uint64, src, dst netip.Addr) []byte {
	addr := func(b []byte, num protowire.Number, a netip.Addr) []byte {
		s := a.AsSlice()
		for i := 0; i < len(s); i += 4 {
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(binary.NativeEndian.Uint32(s[i:i+4])))
		}
		return b
	}
	family := uint64(unix.AF_INET)
	if src.Is6() {
		family = unix.AF_INET6
	}
	var isk []byte
	for _, f := range [][2]uint64{{1, id}, {2, 1000 + id}, {3, family}, {4, unix.SOCK_STREAM}, {5, proto}, {6, state}, {7, sport}, {8, dport}} {
		isk = protowire.AppendTag(isk, protowire.Number(f[0]), protowire.VarintType)
		isk = protowire.AppendVarint(isk, f[1])
	}
	isk = addr(isk, inetSkSrcAddr, src)
	isk = addr(isk, inetSkDstAddr, dst)
	var fe []byte
	fe = protowire.AppendTag(fe, 1, protowire.VarintType)
	fe = protowire.AppendVarint(fe, 5) // INETSK
	fe = protowire.AppendTag(fe, 2, protowire.VarintType)
	fe = protowire.AppendVarint(fe, id)
	fe = protowire.AppendTag(fe, fileEntryInetSk, protowire.BytesType)
	return protowire.AppendBytes(fe, isk)
}

// TestFilesWithoutOutwardTCP: in a files image, a TCP socket whose
// address is the sandbox's network's (v4 and v6) loses its ports and
// becomes CLOSE; loopback connections, a listener on every address and
// a UDP socket stay byte for byte.
func TestFilesWithoutOutwardTCP(t *testing.T) {
	lo, lo6 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")
	any4 := netip.IPv4Unspecified()
	tun, peer := netip.MustParseAddr("10.255.255.2"), netip.MustParseAddr("203.0.113.10")
	tun6, peer6 := netip.MustParseAddr("fd00::2"), netip.MustParseAddr("2001:db8::10")
	entries := []struct {
		e   []byte
		cut bool
	}{
		{iskEntry(1, unix.IPPROTO_TCP, 1, 40000, 8080, lo, lo), false},
		{iskEntry(2, unix.IPPROTO_TCP, tcpStateClose, 40001, 80, tun, peer), true},
		{iskEntry(3, unix.IPPROTO_TCP, 10, 8080, 0, any4, any4), false},
		{iskEntry(4, unix.IPPROTO_UDP, tcpStateClose, 40002, 53, tun, peer), false},
		{iskEntry(5, unix.IPPROTO_TCP, 1, 40003, 443, tun6, peer6), true},
		{iskEntry(6, unix.IPPROTO_TCP, 1, 40004, 8081, lo6, lo6), false},
	}
	img := binary.LittleEndian.AppendUint32(nil, imgCommonMagic)
	img = binary.LittleEndian.AppendUint32(img, filesMagic)
	for _, e := range entries {
		img = binary.LittleEndian.AppendUint32(img, uint32(len(e.e)))
		img = append(img, e.e...)
	}
	out, n, err := filesWithoutOutwardTCP(img)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("cut %d sockets, want 2", n)
	}
	rest := out[8:]
	for i, e := range entries {
		l := binary.LittleEndian.Uint32(rest[:4])
		got := rest[4 : 4+l]
		rest = rest[4+l:]
		if !e.cut {
			if string(got) != string(e.e) {
				t.Errorf("entry %d changed", i+1)
			}
			continue
		}
		var isk []byte
		for g := got; len(g) > 0; {
			num, typ, l := protowire.ConsumeTag(g)
			vl := protowire.ConsumeFieldValue(num, typ, g[l:])
			if num == fileEntryInetSk {
				isk, _ = protowire.ConsumeBytes(g[l:])
			}
			g = g[l+vl:]
		}
		fields := map[protowire.Number]uint64{}
		for g := isk; len(g) > 0; {
			num, _, l := protowire.ConsumeTag(g)
			v, vl := protowire.ConsumeVarint(g[l:])
			if num != inetSkSrcAddr && num != inetSkDstAddr {
				fields[num] = v
			}
			g = g[l+vl:]
		}
		if fields[inetSkState] != tcpStateClose || fields[inetSkSrcPort] != 0 || fields[inetSkDstPort] != 0 || fields[inetSkProto] != unix.IPPROTO_TCP {
			t.Errorf("entry %d after the cut: %v", i+1, fields)
		}
	}
	if len(rest) != 0 {
		t.Errorf("%d bytes after the entries", len(rest))
	}
	if _, _, err := filesWithoutOutwardTCP(img[:len(img)-3]); err == nil {
		t.Error("a cut-off image was read")
	}
}
