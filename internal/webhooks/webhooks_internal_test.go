package webhooks

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// testHooks returns a webhook dialler over the operator's rules, whose
// names resolve to *answer.
func testHooks(t *testing.T, hosts, cidrs []string, answer *[]string) *Service {
	t.Helper()
	dest, err := parseDestinations(hosts, cidrs)
	if err != nil {
		t.Fatal(err)
	}
	w := newService(Config{}, nil, dest)
	w.lookup = func(context.Context, string) ([]netip.Addr, error) {
		var out []netip.Addr
		for _, a := range *answer {
			out = append(out, netip.MustParseAddr(a))
		}
		return out, nil
	}
	return w
}

// listen is a loopback listener that accepts (and closes) connections.
func listen(t *testing.T) string {
	t.Helper()
	ln, _ := testutil.ClosingListener(t, "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// A name is judged by the address it resolves to when it is dialled: one
// that resolved to a public address when registered and to loopback,
// private or metadata addresses when delivering (DNS rebinding) is not
// dialled, and an allowlist naming it does not make those addresses
// reachable. Control: with the operator's range the same dial connects.
func TestWebhookDialChecksTheAddressDialled(t *testing.T) {
	t.Parallel()
	port := listen(t)
	answer := []string{"203.0.113.7"}
	w := testHooks(t, []string{"hooks.test"}, nil, &answer)
	if _, err := w.checkURL("http://hooks.test:" + port + "/x"); err != nil {
		t.Fatalf("registration refused: %v", err)
	}
	for _, a := range []string{"127.0.0.1", "::1", "::ffff:127.0.0.1", "10.1.2.3", "100.64.0.1", "192.168.1.1",
		"172.16.0.1", "169.254.169.254", "::ffff:169.254.169.254", "fe80::1", "0.0.0.0", "224.0.0.1", "240.0.0.1", "fd00::1", "64:ff9b::7f00:1"} {
		answer = []string{a}
		c, err := w.dial(context.Background(), "tcp", "hooks.test:"+port)
		if err == nil {
			c.Close()
			t.Fatalf("hooks.test resolving to %s was dialled", a)
		}
		if !strings.Contains(err.Error(), "webhook") {
			t.Fatalf("dial to %s failed for another reason: %v", a, err)
		}
	}
	// The address itself, without a name: the dialler's Control hook
	// refuses it (what dial checks before is only the allowlist).
	answer = nil
	if c, err := w.dial(context.Background(), "tcp", "127.0.0.1:"+port); err == nil {
		c.Close()
		t.Fatal("127.0.0.1 was dialled")
	}
	// Control: the operator allows loopback by range; the same name now
	// connects, so the refusals above were the address rule's.
	answer = []string{"127.0.0.1"}
	w2 := testHooks(t, []string{"hooks.test"}, []string{"127.0.0.0/8"}, &answer)
	c, err := w2.dial(context.Background(), "tcp", "hooks.test:"+port)
	if err != nil {
		t.Fatalf("allowed loopback: %v", err)
	}
	c.Close()
	// Metadata and link-local stay refused whatever the operator allows.
	w3 := testHooks(t, nil, []string{"0.0.0.0/0", "::/0"}, &answer)
	for _, a := range []string{"169.254.169.254", "169.254.1.1", "fe80::1", "0.0.0.0", "224.0.0.1"} {
		if err := w3.dest.checkAddr(netip.MustParseAddr(a)); err == nil || !strings.Contains(err.Error(), "no webhook may reach") {
			t.Fatalf("%s with everything allowed: %v", a, err)
		}
	}
	if err := w3.dest.checkAddr(netip.MustParseAddr("10.0.0.1")); err != nil {
		t.Fatalf("10.0.0.1 with everything allowed: %v", err)
	}
	// So does every address the egress classification calls cloud
	// metadata, public ones (Azure's wireserver) included.
	metadata := 0
	for _, s := range []string{"169.254.169.254", "168.63.129.16", "100.100.100.200", "192.0.0.192", "fd00:ec2::254", "fd20:ce::254"} {
		a := netip.MustParseAddr(s)
		if _, bad := policy.CloudMetadata(a); !bad {
			t.Errorf("%s is not cloud metadata to the egress classification", s)
			continue
		}
		metadata++
		if err := w3.dest.checkAddr(a); err == nil || !strings.Contains(err.Error(), "no webhook may reach") {
			t.Fatalf("metadata address %s with everything allowed: %v", s, err)
		}
	}
	if metadata == 0 {
		t.Fatal("policy.ForbiddenAddr names no cloud metadata address")
	}
}

// The host's own address is refused like loopback, unless allowed.
func TestWebhookHostAddress(t *testing.T) {
	t.Parallel()
	own := netip.MustParseAddr("198.51.100.9")
	d, _ := parseDestinations(nil, nil)
	d.hostAddr = func(a netip.Addr) bool { return a == own }
	if err := d.checkAddr(own); err == nil || !strings.Contains(err.Error(), "host's own") {
		t.Fatalf("the host's address: %v", err)
	}
	if err := d.checkAddr(netip.MustParseAddr("198.51.100.10")); err != nil {
		t.Fatalf("another public address: %v", err)
	}
	d.allowed = []netip.Prefix{netip.MustParsePrefix("198.51.100.9/32")}
	if err := d.checkAddr(own); err != nil {
		t.Fatalf("the host's address, allowed: %v", err)
	}
}

// The scheduler: an account never holds more than its share of the
// slots, and accounts with work take turns.
func TestWebhookScheduler(t *testing.T) {
	t.Parallel()
	type started struct {
		owner   string
		release chan struct{}
	}
	sched := func(workers, per int) (*Service, chan started) {
		w := newService(Config{Workers: workers, AccountWorkers: per}, nil, &destinations{})
		ch := make(chan started, 100)
		done := make(chan struct{}) // ends every delivery at cleanup
		w.send = func(d delivery) {
			r := make(chan struct{})
			ch <- started{d.hook.Owner, r}
			select {
			case <-r:
			case <-done:
			}
		}
		t.Cleanup(func() {
			close(done)
			w.Stop()
		})
		return w, ch
	}
	push := func(w *Service, own string, n int) {
		for range n {
			w.push(delivery{hook: storeWebhook(own)})
		}
	}
	next := func(ch chan started) started {
		t.Helper()
		select {
		case st := <-ch:
			return st
		case <-time.After(10 * time.Second):
			t.Fatal("no delivery started")
		}
		return started{}
	}

	// Five slots, two an account: a's ten deliveries take two, b's two,
	// c's one.
	w, ch := sched(5, 2)
	push(w, "a", 10)
	push(w, "b", 10)
	push(w, "c", 1)
	count := map[string]int{}
	var held []started
	for range 5 {
		st := next(ch)
		count[st.owner]++
		held = append(held, st)
	}
	if count["a"] != 2 || count["b"] != 2 || count["c"] != 1 {
		t.Fatalf("slots per account %v, want a 2, b 2, c 1", count)
	}
	for _, st := range held {
		close(st.release)
	}

	// One slot: b's delivery, queued after a's three, goes second.
	w, ch = sched(1, 1)
	push(w, "a", 3)
	push(w, "b", 1)
	var order []string
	for range 4 {
		st := next(ch)
		order = append(order, st.owner)
		close(st.release)
	}
	if got := strings.Join(order, ""); got != "abaa" {
		t.Fatalf("order %s, want abaa", got)
	}
}

func storeWebhook(owner string) store.Webhook { return store.Webhook{ID: "wh_" + owner, Owner: owner} }
