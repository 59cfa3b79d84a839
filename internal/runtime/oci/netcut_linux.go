package oci

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// A network detached for a dump (checkpoint_linux.go) leaves the sockets
// that led through it: TCP connections and connected UDP sockets whose
// addresses were the TUN's. CRIU dumps them, but its restore connects
// them again (TCP repair, UDP connect) in a namespace that has no route
// out yet (the gateway is attached after the restore), fails
// (ENETUNREACH) and leaves the sandbox unrestorable. A dump of a sandbox
// with a network therefore first closes, with the kernel's SOCK_DESTROY
// (sock_diag), every TCP and UDP socket of its namespace whose local or
// remote address is neither unspecified nor loopback: their owners see
// ECONNABORTED, as a connection the network dropped. Its loopback
// sockets, and sockets listening on every address, are kept. It runs
// while the sandbox is frozen, right before the dump, so that no socket
// can be made in between (and none could lead out: the namespace has no
// interface but lo).

// sockID is an inet_diag_sockid, as the kernel lays it out.
type sockID [48]byte

func (id sockID) addrs(family uint8) (src, dst netip.Addr) {
	if family == unix.AF_INET {
		return netip.AddrFrom4([4]byte(id[4:8])), netip.AddrFrom4([4]byte(id[20:24]))
	}
	return netip.AddrFrom16([16]byte(id[4:20])).Unmap(), netip.AddrFrom16([16]byte(id[20:36])).Unmap()
}

// diagReq is an inet_diag_req_v2.
type diagReq struct {
	family, proto uint8
	states        uint32
	id            sockID
}

func (r *diagReq) Len() int { return 56 }

func (r *diagReq) Serialize() []byte {
	b := make([]byte, 56)
	b[0], b[1] = r.family, r.proto
	nl.NativeEndian().PutUint32(b[4:8], r.states)
	copy(b[8:], r.id[:])
	return b
}

// leadsOut says whether a socket with these addresses used the network
// rather than the loopback.
func leadsOut(src, dst netip.Addr) bool {
	out := func(a netip.Addr) bool { return a.IsValid() && !a.IsUnspecified() && !a.IsLoopback() }
	return out(src) || out(dst)
}

// cutNetwork closes every socket of the network namespace of pid that led
// through its network, and says how many it closed.
func cutNetwork(pid int) (int, error) {
	n := 0
	err := inNetns(fmt.Sprintf("/proc/%d/ns/net", pid), func() error {
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
				req := nl.NewNetlinkRequest(nl.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP)
				req.AddData(&diagReq{family: family, proto: proto, states: 0xffffffff})
				msgs, err := req.Execute(unix.NETLINK_INET_DIAG, nl.SOCK_DIAG_BY_FAMILY)
				if err != nil {
					return fmt.Errorf("list sockets: %w", err)
				}
				for _, m := range msgs {
					if len(m) < 4+len(sockID{}) {
						continue
					}
					id := sockID(m[4 : 4+len(sockID{})])
					if !leadsOut(id.addrs(family)) {
						continue
					}
					del := nl.NewNetlinkRequest(nl.SOCK_DESTROY, unix.NLM_F_ACK)
					del.AddData(&diagReq{family: family, proto: proto, states: 0xffffffff, id: id})
					if _, err := del.Execute(unix.NETLINK_INET_DIAG, 0); err != nil && !errors.Is(err, unix.ENOENT) {
						return fmt.Errorf("close a socket that led through the network: %w", err)
					}
					n++
				}
			}
		}
		return nil
	})
	return n, err
}
