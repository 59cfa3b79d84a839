//go:build linux

package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/sheepfold/sheepfold/internal/agent"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// server answers "ok" on every TCP connection to each port given, in the
// network namespace it runs in, and prints "ready" once it listens.
const netlockServer = `
import socket, sys, threading
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(8)
    return s
socks = [serve(int(p)) for p in sys.argv[1:]]
def loop(s):
    while True:
        c, _ = s.accept(); c.sendall(b"ok"); c.close()
for s in socks:
    threading.Thread(target=loop, args=(s,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
`

// netlockProbe connects (tcp) or sends a datagram (udp) to host:port and
// prints what came of it: "ok", or the error's class and errno.
const netlockProbe = `
import socket, sys
proto, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    if proto == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"x", (host, port)); print("ok")
    else:
        s = socket.create_connection((host, port), timeout=1); print(s.recv(2).decode())
except OSError as e:
    print(type(e).__name__, e.errno)
`

// TestNetlock: a namespace the netlock sub-command closed (a Pod's) opens
// no connection and sends no datagram out, admits connections only to the
// agent's port, and keeps its loopback; run twice it leaves one set of
// rules. The same probes before the lock are the control.
func TestNetlock(t *testing.T) {
	testutil.RequireRoot(t)
	pod, outside := fmt.Sprintf("sf-nl%d-pod", os.Getpid()), fmt.Sprintf("sf-nl%d-out", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	for _, ns := range []string{pod, outside} {
		ip("netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		ip("-n", ns, "link", "set", "lo", "up")
	}
	ip("-n", pod, "link", "add", "sfnl0", "type", "veth", "peer", "name", "sfnl1", "netns", outside)
	ip("-n", pod, "addr", "add", "198.51.100.1/30", "dev", "sfnl0")
	ip("-n", outside, "addr", "add", "198.51.100.2/30", "dev", "sfnl1")
	ip("-n", pod, "link", "set", "sfnl0", "up")
	ip("-n", outside, "link", "set", "sfnl1", "up")

	const agentPort, otherPort = 4000, 4001
	serve := func(ns string) {
		cmd := exec.Command("ip", "netns", "exec", ns, "/usr/bin/python3", "-c", netlockServer, fmt.Sprint(agentPort), fmt.Sprint(otherPort))
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
		if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
			t.Fatalf("the server in %s: %q", ns, line)
		}
	}
	serve(pod)
	serve(outside)
	probe := func(ns, proto, host string, port int) string {
		out, err := exec.Command("ip", "netns", "exec", ns, "/usr/bin/python3", "-c", netlockProbe, proto, host, fmt.Sprint(port)).CombinedOutput()
		if err != nil {
			t.Fatalf("probe: %v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	type want struct {
		name, ns, proto, host string
		port                  int
		open, locked          string
	}
	cases := []want{
		{"the Pod connects out", pod, "tcp", "198.51.100.2", agentPort, "ok", "OSError 113"},
		{"the Pod sends a datagram out", pod, "udp", "198.51.100.2", 53, "ok", "PermissionError 1"},
		{"the server connects to the agent's port", outside, "tcp", "198.51.100.1", agentPort, "ok", "ok"},
		{"anyone connects to another port", outside, "tcp", "198.51.100.1", otherPort, "ok", "TimeoutError None"},
		{"the Pod's loopback", pod, "tcp", "127.0.0.1", otherPort, "ok", "ok"},
	}
	for _, c := range cases {
		if got := probe(c.ns, c.proto, c.host, c.port); got != c.open {
			t.Fatalf("before the lock, %s: %q, want %q", c.name, got, c.open)
		}
	}

	netlock := func() {
		t.Helper()
		if out, err := exec.Command("ip", "netns", "exec", pod, testutil.AgentBin(t), "netlock", "--agent-port", fmt.Sprint(agentPort)).CombinedOutput(); err != nil {
			t.Fatalf("netlock: %v: %s", err, out)
		}
	}
	netlock()
	netlock() // a second run replaces the table
	for _, c := range cases {
		start := time.Now()
		if got := probe(c.ns, c.proto, c.host, c.port); got != c.locked {
			t.Errorf("locked, %s: %q, want %q", c.name, got, c.locked)
		}
		t.Logf("locked, %s: %s", c.name, time.Since(start).Round(time.Millisecond))
	}

	f, err := os.Open("/run/netns/" + pod)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]int{}
	for _, ch := range chains {
		if ch.Table.Name != agent.NetLockTable {
			continue
		}
		rs, err := conn.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		rules[ch.Name] = len(rs)
	}
	if rules["input"] != 4 || rules["output"] != 4 || len(rules) != 2 {
		t.Fatalf("after two runs the table holds %v, want input 4 and output 4 rules", rules)
	}
}
