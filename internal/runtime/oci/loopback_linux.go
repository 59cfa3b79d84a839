package oci

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
)

// The sandbox's own TCP connections across a restore.
//
// runc has CRIU leave the network namespace's configuration out of a
// dump (runc always passes CRIU's --empty-ns network: "runc doesn't
// manage network devices"), so a restore makes a new, empty namespace
// whose lo is down. CRIU then restores the sandbox's established TCP
// connections (--tcp-established: TCP repair) into it, and a connection
// over the loopback (a client and a server of the sandbox's own talking
// over 127.0.0.1 or ::1) cannot be connected again on a loopback that is
// down: the restore fails ("Can't connect inet socket back: Network is
// unreachable") and leaves the sandbox paused for good.
//
// A restore whose images hold a TCP connection (a tcp-stream image)
// therefore brings lo up in the new namespace before CRIU restores the
// sockets: CRIU runs its action scripts at "setup-namespaces", once the
// namespaces are made and before any file or socket is restored, with
// the new init's host pid in CRTOOLS_INIT_PID. Our script (criuNSScript,
// named by the CRIU options of the restore) writes that pid into a FIFO
// of the bundle and waits for the answer on another; the engine brings
// lo up in /proc/<pid>/ns/net (loopbackUp, as it does after any restore)
// and answers "ok", or "failed" (which fails the script and so the
// restore). Both FIFOs are root's alone (0600) in the bundle, which no
// process of the sandbox can reach by a path. No packet reaches a socket
// CRIU is restoring: the sandbox's tasks do not run until CRIU resumes
// them, and sockets in repair mode send nothing.
//
// A connection that led out of the sandbox through its network was cut
// before the dump (netcut_linux.go), so the namespace's connections that
// are left are its loopback's: they are restored as they were, with the
// bytes in flight.

// Files of a bundle for the handshake.
const (
	criuNSScript = "criu-setup-ns.sh" // CRIU's action script
	criuNSPid    = "criu-ns.pid"      // FIFO: the script writes the new init's pid
	criuNSAnswer = "criu-ns.answer"   // FIFO: the engine answers "ok" or "failed"
)

// holdsTCP says whether the CRIU images in dir hold an established TCP
// connection.
func holdsTCP(dir string) (bool, error) {
	m, err := filepath.Glob(filepath.Join(dir, "tcp-stream-*.img"))
	return len(m) > 0, err
}

// loopbackHandshake prepares bundle b's action script and FIFOs, and
// returns the CRIU options that name the script and a function that
// answers the script once and, once done is closed (CRIU has ended),
// removes the FIFOs and returns.
func loopbackHandshake(b string) (conf string, serve func(done <-chan struct{}) error, err error) {
	script := filepath.Join(b, criuNSScript)
	pidPath, answerPath := filepath.Join(b, criuNSPid), filepath.Join(b, criuNSAnswer)
	text := fmt.Sprintf(`#!/bin/sh
[ "$CRTOOLS_SCRIPT_ACTION" = setup-namespaces ] || exit 0
echo "$CRTOOLS_INIT_PID" > %s || exit 1
read -r answer < %s || exit 1
[ "$answer" = ok ]
`, pidPath, answerPath)
	if err := os.WriteFile(script, []byte(text), 0o700); err != nil {
		return "", nil, err
	}
	if err := os.Chmod(script, 0o700); err != nil {
		return "", nil, err
	}
	// Each FIFO is opened here read-write, which never blocks: the
	// script's open for writing (of the pid) and for reading (of the
	// answer) never waits for the engine, and the engine's read of the
	// pid can be ended by done.
	open := func(path string) (*os.File, error) {
		_ = os.Remove(path)
		if err := unix.Mkfifo(path, 0o600); err != nil {
			return nil, fmt.Errorf("mkfifo %s: %w", path, err)
		}
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		return os.NewFile(uintptr(fd), path), nil
	}
	pidF, err := open(pidPath)
	if err != nil {
		return "", nil, err
	}
	answerF, err := open(answerPath)
	if err != nil {
		pidF.Close()
		os.Remove(pidPath)
		return "", nil, err
	}
	serve = func(done <-chan struct{}) error {
		// The answer stays in its FIFO until CRIU is done: the script
		// may open it only after it was written.
		defer func() {
			<-done
			pidF.Close()
			answerF.Close()
			os.Remove(pidPath)
			os.Remove(answerPath)
			os.Remove(script)
		}()
		go func() {
			<-done
			pidF.Close() // ends the read below when CRIU never ran the script
		}()
		line, err := bufio.NewReader(pidF).ReadString('\n')
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read the restored init's pid: %w", err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil || pid <= 0 {
			answerF.WriteString("failed\n")
			return fmt.Errorf("CRIU's script gave the pid %q", strings.TrimSpace(line))
		}
		if err := inNetns(fmt.Sprintf("/proc/%d/ns/net", pid), loopbackUp); err != nil {
			answerF.WriteString("failed\n")
			return err
		}
		if _, err := answerF.WriteString("ok\n"); err != nil {
			return fmt.Errorf("answer CRIU's script: %w", err)
		}
		return nil
	}
	return fmt.Sprintf("action-script %s\n", script), serve, nil
}

// A connection that led out of a sandbox with a network was closed
// before the dump (netcut_linux.go), but its socket stays in the images
// as a TCP socket with the addresses it had (CRIU reads the peer's with
// SO_PEERNAME, which answers for a closed socket too), and CRIU restores
// any TCP socket with a peer by TCP repair: a bind to the sandbox's
// network address and a connect to the peer, in a namespace that has
// neither yet (the gateway is attached after the restore), which fails
// the restore. CRIU's tcp-close would restore every connection closed,
// the loopback's too. Instead, before such a restore, cutOutwardTCP
// rewrites, in the images, each TCP socket whose address leads out
// (leadsOut) into an unbound, unconnected one in state CLOSE (no ports,
// the addresses kept for CRIU's log: it neither binds nor repairs it): its owner holds a socket that is
// no longer connected (a read ends, a write fails with EPIPE), as it
// would after the connection was dropped. The loopback's sockets are
// left as they were.

// Fields of CRIU's images (images/fdinfo.proto, images/sk-inet.proto)
// and its magic words (criu/include/magic.h).
const (
	filesImage      = "files.img"
	imgCommonMagic  = 0x54564319
	filesMagic      = 0x56303138
	fileEntryInetSk = 4  // file_entry.isk
	inetSkFamily    = 3  // inet_sk_entry.family
	inetSkProto     = 5  // inet_sk_entry.proto
	inetSkState     = 6  // inet_sk_entry.state
	inetSkSrcPort   = 7  // inet_sk_entry.src_port
	inetSkDstPort   = 8  // inet_sk_entry.dst_port
	inetSkSrcAddr   = 11 // inet_sk_entry.src_addr
	inetSkDstAddr   = 12 // inet_sk_entry.dst_addr
	tcpStateClose   = 7  // TCP_CLOSE
)

// cutOutwardTCP rewrites the files image in imgDir as above and says how
// many sockets it cut. An image with none is left as it is; one with
// some is written anew and renamed into place (a clone's images are hard
// links to its snapshot's).
func cutOutwardTCP(imgDir string) (int, error) {
	path := filepath.Join(imgDir, filesImage)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	out, n, err := filesWithoutOutwardTCP(b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	if n == 0 {
		return 0, nil
	}
	tmp := path + ".sheepfold"
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return 0, err
	}
	return n, nil
}

// filesWithoutOutwardTCP returns the files image b with its outward TCP
// sockets cut, and how many it cut.
func filesWithoutOutwardTCP(b []byte) ([]byte, int, error) {
	if len(b) < 8 || binary.LittleEndian.Uint32(b[:4]) != imgCommonMagic || binary.LittleEndian.Uint32(b[4:8]) != filesMagic {
		return nil, 0, errors.New("not a files image")
	}
	out := append([]byte(nil), b[:8]...)
	cut := 0
	for rest := b[8:]; len(rest) > 0; {
		if len(rest) < 4 {
			return nil, 0, errors.New("an entry's length cut off")
		}
		n := int(binary.LittleEndian.Uint32(rest[:4]))
		if n > len(rest)-4 {
			return nil, 0, fmt.Errorf("an entry of %d bytes in %d", n, len(rest)-4)
		}
		entry := rest[4 : 4+n]
		rest = rest[4+n:]
		var fe []byte
		changed := false
		for e := entry; len(e) > 0; {
			num, typ, l := protowire.ConsumeTag(e)
			if l < 0 {
				return nil, 0, protowire.ParseError(l)
			}
			vl := protowire.ConsumeFieldValue(num, typ, e[l:])
			if vl < 0 {
				return nil, 0, protowire.ParseError(vl)
			}
			field := e[:l+vl]
			if num == fileEntryInetSk && typ == protowire.BytesType {
				isk, _ := protowire.ConsumeBytes(e[l:])
				if cutIsk, ok, err := unconnected(isk); err != nil {
					return nil, 0, err
				} else if ok {
					field = protowire.AppendTag(nil, fileEntryInetSk, protowire.BytesType)
					field = protowire.AppendBytes(field, cutIsk)
					changed = true
					cut++
				}
			}
			fe = append(fe, field...)
			e = e[l+vl:]
		}
		if !changed {
			fe = entry
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(fe)))
		out = append(out, fe...)
	}
	return out, cut, nil
}

// unconnected returns the inet socket entry isk made an unbound,
// unconnected TCP socket in state CLOSE, when it is a TCP socket whose
// address leads out (ok false: isk stays).
func unconnected(isk []byte) (out []byte, ok bool, err error) {
	var family, proto uint64
	var src, dst []uint32
	for e := isk; len(e) > 0; {
		num, typ, l := protowire.ConsumeTag(e)
		if l < 0 {
			return nil, false, protowire.ParseError(l)
		}
		vl := protowire.ConsumeFieldValue(num, typ, e[l:])
		if vl < 0 {
			return nil, false, protowire.ParseError(vl)
		}
		switch {
		case typ == protowire.VarintType && (num == inetSkFamily || num == inetSkProto || num == inetSkSrcAddr || num == inetSkDstAddr):
			v, _ := protowire.ConsumeVarint(e[l:])
			switch num {
			case inetSkFamily:
				family = v
			case inetSkProto:
				proto = v
			case inetSkSrcAddr:
				src = append(src, uint32(v))
			case inetSkDstAddr:
				dst = append(dst, uint32(v))
			}
		case typ == protowire.BytesType && (num == inetSkSrcAddr || num == inetSkDstAddr): // packed
			p, _ := protowire.ConsumeBytes(e[l:])
			for len(p) > 0 {
				v, n := protowire.ConsumeVarint(p)
				if n < 0 {
					return nil, false, protowire.ParseError(n)
				}
				if num == inetSkSrcAddr {
					src = append(src, uint32(v))
				} else {
					dst = append(dst, uint32(v))
				}
				p = p[n:]
			}
		}
		e = e[l+vl:]
	}
	if proto != unix.IPPROTO_TCP || !leadsOut(criuAddr(family, src), criuAddr(family, dst)) {
		return nil, false, nil
	}
	for e := isk; len(e) > 0; {
		num, typ, l := protowire.ConsumeTag(e)
		vl := protowire.ConsumeFieldValue(num, typ, e[l:])
		switch num {
		case inetSkState, inetSkSrcPort, inetSkDstPort:
		default:
			out = append(out, e[:l+vl]...)
		}
		e = e[l+vl:]
	}
	out = protowire.AppendTag(out, inetSkState, protowire.VarintType)
	out = protowire.AppendVarint(out, tcpStateClose)
	out = protowire.AppendTag(out, inetSkSrcPort, protowire.VarintType)
	out = protowire.AppendVarint(out, 0)
	out = protowire.AppendTag(out, inetSkDstPort, protowire.VarintType)
	out = protowire.AppendVarint(out, 0)
	return out, true, nil
}

// criuAddr reads an address as CRIU's images keep it: the bytes of
// in_addr or in6_addr in 32-bit words of the host's order.
func criuAddr(family uint64, words []uint32) netip.Addr {
	var b []byte
	for _, w := range words {
		b = binary.NativeEndian.AppendUint32(b, w)
	}
	switch {
	case family == unix.AF_INET && len(b) >= 4:
		return netip.AddrFrom4([4]byte(b[:4]))
	case family == unix.AF_INET6 && len(b) >= 16:
		return netip.AddrFrom16([16]byte(b[:16])).Unmap()
	}
	return netip.Addr{}
}
