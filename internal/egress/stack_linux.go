package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/sheepfold/sheepfold/internal/events"
)

const nicID = 1

// sniffTimeout bounds how long a client may take to send its whole
// ClientHello or HTTP header block once it has started.
const sniffTimeout = 10 * time.Second

// Attach puts the sandbox's network interface into the network namespace
// of pid (the sandbox's init, created but not yet started) and starts the
// userspace stack behind it. Close undoes it, and Detach, after which
// Attach may be called again (a restored sandbox's new namespace).
func (g *Gateway) Attach(ctx context.Context, pid int) error {
	return g.attachAt(fmt.Sprintf("/proc/%d/ns/net", pid), true)
}

// AttachNetns is Attach to the network namespace bound at netns, for a
// runtime that makes the namespace before the sandbox's processes: gVisor's
// runsc, whose Sentry takes the interfaces it finds there when it starts
// (internal/runtime/oci, runsc_linux.go), and removes their addresses from
// the host's side. The device's address then has no peer (runsc removes an
// address by its local half, which does not name one with a peer); the
// default route through the device reaches the gateway all the same.
func (g *Gateway) AttachNetns(ctx context.Context, netns string) error {
	return g.attachAt(netns, false)
}

// AttachNamespace is Attach to the network namespace at path (a
// /proc/PID/ns/net or /proc/PID/fd/N of one), the device's address with
// the gateway as its peer: a template build step's, made before its
// container (internal/engine, build.go).
func (g *Gateway) AttachNamespace(ctx context.Context, path string) error {
	return g.attachAt(path, true)
}

// attachAt is Attach, AttachNetns and AttachNamespace: the device in the namespace at
// netns, its address with the gateway as its peer or not.
func (g *Gateway) attachAt(netns string, peer bool) error {
	g.amu.Lock()
	defer g.amu.Unlock()
	switch {
	case len(g.closers) > 0:
		return errors.New("egress: the gateway is attached already")
	case g.ctx.Err() != nil:
		return errors.New("egress: the gateway is closed")
	}
	err := g.attach(netns, peer)
	if err != nil {
		g.detachLocked()
	}
	return err
}

// attach is Attach's work; amu is held, and what it made is undone by
// detachLocked when it fails.
func (g *Gateway) attach(netns string, peer bool) error {
	fd, err := openTUN(netns, peer)
	if err != nil {
		return err
	}
	ep, tun, err := newLink(fd, g.linkWriteFailed)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("egress link: %w", err)
	}
	// The device goes with the descriptor's last close, which the
	// reader's Read, woken by Close, makes on its way out: the closer
	// waits for it, so that the device is gone once Detach returns.
	read, reading := make(chan struct{}), false
	g.closers = append(g.closers, func() {
		tun.Close()
		if reading {
			<-read
		}
	})
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	g.closers = append(g.closers, func() { s.Close(); s.Wait() })
	sum := func() string { return stackSummary(s.Stats()) }
	g.stackSum.Store(&sum)
	if terr := s.CreateNIC(nicID, ep); terr != nil {
		return fmt.Errorf("egress nic: %s", terr)
	}
	// The stack answers for every address: it is the sandbox's whole
	// network, and each flow is decided by the gateway.
	if terr := s.SetPromiscuousMode(nicID, true); terr != nil {
		return fmt.Errorf("egress promiscuous: %s", terr)
	}
	if terr := s.SetSpoofing(nicID, true); terr != nil {
		return fmt.Errorf("egress spoofing: %s", terr)
	}
	gw := tcpip.AddrFrom4(GatewayAddr.As4())
	if terr := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol: ipv4.ProtocolNumber, AddressWithPrefix: gw.WithPrefix(),
	}, stack.AddressProperties{}); terr != nil {
		return fmt.Errorf("egress address: %s", terr)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nicID}})
	sack := tcpip.TCPSACKEnabled(true)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	// No TIME_WAIT. When the outside closes first, the stack's end of the
	// connection is the one left in TIME_WAIT, and the sandbox's kernel,
	// which holds none, may pick the same source port again at once; a
	// SYN that reaches a TIME_WAIT endpoint is reused only by a listening
	// endpoint, which a forwarder is not, so it was dropped without a word
	// for 60 s and the sandbox's connect timed out. On this point-to-point
	// link no segment of an old connection can arrive late.
	tw := tcpip.TCPTimeWaitTimeoutOption(0)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &tw)

	// DNS over UDP and TCP at the gateway's address; bound endpoints take
	// their packets before the forwarders below see them.
	local := tcpip.FullAddress{NIC: nicID, Addr: gw, Port: 53}
	udpConn, err := gonet.DialUDP(s, &local, nil, ipv4.ProtocolNumber)
	if err != nil {
		return fmt.Errorf("egress dns: %w", err)
	}
	g.closers = append(g.closers, func() { udpConn.Close() })
	tcpLn, err := gonet.ListenTCP(s, local, ipv4.ProtocolNumber)
	if err != nil {
		return fmt.Errorf("egress dns: %w", err)
	}
	g.closers = append(g.closers, func() { tcpLn.Close() })
	go g.serveDNS(udpConn)
	go g.serveDNSTCP(tcpLn)

	s.SetTransportProtocolHandler(tcp.ProtocolNumber, tcp.NewForwarder(s, 0, 1024, g.handleTCP).HandlePacket)
	s.SetTransportProtocolHandler(udp.ProtocolNumber, udp.NewForwarder(s, g.handleUDP).HandlePacket)
	reading = true
	go func() {
		defer close(read)
		readLink(tun, ep)
	}()
	g.log.Debug("egress attached", "netns", netns, "mode", g.pol.Load().Mode)
	return nil
}

// newLink wraps the TUN fd as the stack's link. Packets are carried with
// as few goroutine hops as possible (each costs latency on a busy host):
// readLink delivers what the sandbox sends from the goroutine that read
// it, and the stack's outgoing packets are written to the TUN by the
// goroutine that produced them.
func newLink(fd int, writeFailed func(error)) (*channel.Endpoint, *os.File, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, nil, err
	}
	tun := os.NewFile(uintptr(fd), "tun") // non-blocking: reads wait in Go's netpoller
	ep := channel.New(256, MTU, "")
	ep.LinkEPCapabilities = stack.CapabilityRXChecksumOffload // the sandbox's kernel computed them
	var mu sync.Mutex                                         // keeps the queue's order on the wire
	ep.AddNotify(notifyFunc(func() {
		mu.Lock()
		defer mu.Unlock()
		for pkt := ep.Read(); pkt != nil; pkt = ep.Read() {
			v := pkt.ToView()
			if _, err := tun.Write(v.AsSlice()); err != nil {
				writeFailed(err)
			}
			v.Release()
			pkt.DecRef()
		}
	}))
	return ep, tun, nil
}

// linkWriteFailed counts a packet the TUN refused; the first of each
// gateway is logged as a warning (the sandbox loses that packet).
func (g *Gateway) linkWriteFailed(err error) {
	msg := err.Error()
	g.seen.lastLinkErr.Store(&msg)
	if g.seen.linkWriteErrs.Add(1) == 1 {
		g.log.Warn("egress link write failed", "err", err)
	}
}

// stackSummary picks the userspace stack's counters that explain a stall.
func stackSummary(st tcpip.Stats) string {
	return fmt.Sprintf("%d packets dropped, %d malformed ip, %d invalid tcp segments, %d tcp checksum errors, %d forwarder in-flight drops, %d failed connections, %d tcp retransmits, %d tcp timeouts",
		st.DroppedPackets.Value(), st.IP.MalformedPacketsReceived.Value(), st.TCP.InvalidSegmentsReceived.Value(),
		st.TCP.ChecksumErrors.Value(), st.TCP.ForwardMaxInFlightDrop.Value(), st.TCP.FailedConnectionAttempts.Value(),
		st.TCP.Retransmits.Value(), st.TCP.Timeouts.Value())
}

type notifyFunc func()

func (f notifyFunc) WriteNotify() { f() }

// readLink delivers the sandbox's IPv4 packets to the stack until the
// TUN is closed. IPv6 (the sandbox has no route for it) is dropped.
func readLink(tun *os.File, ep *channel.Endpoint) {
	buf := make([]byte, MTU)
	for {
		n, err := tun.Read(buf)
		if err != nil {
			return
		}
		if n == 0 || buf[0]>>4 != 4 {
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(buf[:n])})
		ep.InjectInbound(ipv4.ProtocolNumber, pkt)
		pkt.DecRef()
	}
}

// openTUN creates the TUN device inside the network namespace at netns
// and configures it. The namespace is owned by the sandbox's user namespace;
// the host's root holds every capability over it. The work happens on a
// thread locked to this goroutine that never returns to the host's
// namespace: Go ends a thread whose goroutine exits while locked.
func openTUN(netns string, peer bool) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		fd, err := tunIn(netns, peer)
		ch <- result{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}

func tunIn(netns string, peer bool) (fd int, err error) {
	ns, err := unix.Open(netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open sandbox network namespace: %w", err)
	}
	defer unix.Close(ns)
	if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
		return -1, fmt.Errorf("enter sandbox network namespace: %w", err)
	}
	fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
		}
	}()
	ifr, err := unix.NewIfreq(TUNName)
	if err != nil {
		return -1, err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return -1, fmt.Errorf("create tun: %w", err)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return -1, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(TUNName)
	if err != nil {
		return -1, fmt.Errorf("find tun: %w", err)
	}
	host32 := net.CIDRMask(32, 32)
	steps := []struct {
		what string
		do   func() error
	}{
		{"mtu", func() error { return h.LinkSetMTU(link, MTU) }},
		{"address", func() error {
			a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(SandboxAddr.AsSlice()), Mask: host32}}
			if peer {
				a.Peer = &net.IPNet{IP: net.IP(GatewayAddr.AsSlice()), Mask: host32}
			}
			return h.AddrAdd(link, a)
		}},
		{"up", func() error { return h.LinkSetUp(link) }},
		{"route", func() error {
			return h.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK,
				Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}})
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			return -1, fmt.Errorf("configure tun %s: %w", st.what, err)
		}
	}
	return fd, nil
}

func addrPort(a tcpip.Address, port uint16) netip.AddrPort {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return netip.AddrPortFrom(ip.Unmap(), port)
}

// handleTCP decides a new connection from the sandbox (a SYN nobody
// listens for) and, if allowed, dials out and carries it.
func (g *Gateway) handleTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	dst := addrPort(id.LocalAddress, id.LocalPort)
	f, up, why := g.connect(dst, dst.String(), dst.String())
	if why != nil {
		r.Complete(true)
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		f.end()
		g.seen.handshakeFailed.Add(1)
		g.log.Info("egress handshake failed", "target", f.target, "err", terr)
		up.Close()
		r.Complete(true)
		return
	}
	r.Complete(false)
	g.seen.carried.Add(1)
	f.splice(gonet.NewTCPConn(&wq, ep), up)
}

// handleUDP refuses UDP other than DNS to the gateway; the stack answers
// with ICMP port unreachable, so the sender fails fast.
func (g *Gateway) handleUDP(r *udp.ForwarderRequest) bool {
	id := r.ID()
	dst := addrPort(id.LocalAddress, id.LocalPort)
	g.report(deny(events.KindNetworkDenied, "udp is allowed only for DNS to "+GatewayAddr.String()), "udp", dst.String())
	return false
}

// serveDNS answers DNS over UDP until the gateway closes.
func (g *Gateway) serveDNS(c *gonet.UDPConn) {
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		if out := g.answerDNS(g.ctx, buf[:n]); out != nil {
			_, _ = c.WriteTo(out, from)
		}
	}
}

// serveDNSTCP answers DNS over TCP (two-byte length prefixes).
func (g *Gateway) serveDNSTCP(ln *gonet.TCPListener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			stop := context.AfterFunc(g.ctx, func() { c.Close() })
			defer stop()
			for {
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				msg := make([]byte, int(l[0])<<8|int(l[1]))
				if _, err := io.ReadFull(c, msg); err != nil {
					return
				}
				out := g.answerDNS(g.ctx, msg)
				if out == nil {
					return
				}
				if _, err := c.Write(append([]byte{byte(len(out) >> 8), byte(len(out))}, out...)); err != nil {
					return
				}
			}
		}()
	}
}
