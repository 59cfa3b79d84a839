package agent

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// NetLockTable is the nftables table (family inet) LockNetwork writes.
const NetLockTable = "sheepfold"

// LockNetwork makes the calling process's network namespace (a Pod's)
// as closed as a local sandbox's, which has only a loopback: it sends
// nothing but on the loopback and in connections made to it, and it
// admits new connections only to agentPort. Everything a sandbox in a Pod
// needs goes through its agent: the server dials the agent's port, and
// ports and egress ride on those connections (port.connect,
// egress.accept), so the Pod never opens a connection of its own.
//
// A NetworkPolicy says the same, but only a CNI plugin that enforces
// NetworkPolicies carries it out (the bridge plugin does not); these
// rules are in the Pod's own namespace whatever the cluster runs. A Pod's
// init container applies them with CAP_NET_ADMIN, which its sandbox's
// code never has, so nothing in the sandbox, root included, can change
// them. IPv6 neighbour discovery stays open both ways (without it an IPv6
// Pod reaches nothing, not even its server); the kernel alone sends it.
//
// The table is replaced whole, in one transaction, so a second run leaves
// the same rules.
func LockNetwork(agentPort int) error {
	if agentPort <= 0 || agentPort > 65535 {
		return fmt.Errorf("agent port %d is not a TCP port", agentPort)
	}
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return fmt.Errorf("the loopback: %w", err)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: NetLockTable}
	c.AddTable(t)
	c.DelTable(t) // whatever an earlier run left
	c.AddTable(t)
	drop := nftables.ChainPolicyDrop
	chain := func(name string, hook *nftables.ChainHook) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: hook, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	}
	rule := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(exprs, &expr.Verdict{Kind: expr.VerdictAccept})})
	}
	loIndex := binaryutil.NativeEndian.PutUint32(uint32(lo.Index))
	established := []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
	neighbour := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		// router solicitation (133) to redirect (137)
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{133}, ToData: []byte{137}},
	}
	port := make([]byte, 2)
	binary.BigEndian.PutUint16(port, uint16(agentPort))

	in := chain("input", nftables.ChainHookInput)
	rule(in, &expr.Meta{Key: expr.MetaKeyIIF, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: loIndex})
	rule(in, established...)
	rule(in,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port})
	rule(in, neighbour...)

	out := chain("output", nftables.ChainHookOutput)
	rule(out, &expr.Meta{Key: expr.MetaKeyOIF, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: loIndex})
	rule(out, established...)
	rule(out, neighbour...)
	// A TCP connection out fails at once, as on a local sandbox (which
	// has no route: ENETUNREACH), rather than when its timeout passes:
	// "administratively prohibited" makes connect fail with EHOSTUNREACH.
	// Other packets meet the chain's policy, whose drop fails their send
	// with EPERM.
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED},
	}})

	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables rules: %w", err)
	}
	return nil
}
