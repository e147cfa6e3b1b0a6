//go:build linux

package ebpf

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// A hook is one of the cgroup socket hooks the Proxier attaches.
type hook struct {
	name    string
	attach  ebpf.AttachType
	v6      bool
	reverse bool // recvmsg and getpeername: show the service's address
}

// hooks lists the eight hooks, in the order they are attached.
var hooks = []hook{
	{"connect4", ebpf.AttachCGroupInet4Connect, false, false},
	{"connect6", ebpf.AttachCGroupInet6Connect, true, false},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, false, false},
	{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, true, false},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, false, true},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, true, true},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, false, true},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, true, true},
}

// Offsets in struct bpf_sock_addr.
const (
	ctxUserIP4  = 4
	ctxUserIP6  = 8
	ctxUserPort = 24
	ctxProtocol = 36
)

// The stack frame of the programs: the keys and values they pass to map
// helpers, at these offsets from the frame pointer. Every byte is zeroed
// first, so that padding is zero as the Proxier writes it.
const (
	stFE     = -24  // feKey
	stCfg    = -28  // uint32 0, the key of kp_config
	stSlot   = -40  // slotKey (also the key of kp_sets)
	stAffKey = -56  // affKey
	stEP     = -88  // affVal: the endpoint chosen, and now
	stMember = -120 // memberKey
	stRevKey = -152 // revKey
	stRevVal = -176 // endpoint: the service's address
	stFlow   = -192 // affKey of kp_udpflows: the socket's cookie and the set
	stBottom = stFlow
)

// golden spreads socket cookies, which count up, over the slots.
const golden = -0x61c8864680b583eb // 0x9E3779B97F4A7C15 as int64

func mapPtr(r asm.Register, name string) asm.Instruction {
	return asm.LoadMapPtr(r, 0).WithReference(name)
}

// stackPtr sets r to the frame pointer plus off.
func stackPtr(r asm.Register, off int32) asm.Instructions {
	return asm.Instructions{asm.Mov.Reg(r, asm.RFP), asm.Add.Imm(r, off)}
}

// lookup looks the key at stack offset key up in a map; R0 is the value
// or 0.
func lookup(name string, key int32) asm.Instructions {
	out := asm.Instructions{mapPtr(asm.R1, name)}
	out = append(out, stackPtr(asm.R2, key)...)
	return append(out, asm.FnMapLookupElem.Call())
}

// update writes the value at stack offset val under the key at key.
func update(name string, key, val int32) asm.Instructions {
	out := asm.Instructions{mapPtr(asm.R1, name)}
	out = append(out, stackPtr(asm.R2, key)...)
	out = append(out, stackPtr(asm.R3, val)...)
	return append(out, asm.Mov.Imm(asm.R4, 0), asm.FnMapUpdateElem.Call())
}

// copyWords copies n 32-bit words from src+soff to dst+doff.
func copyWords(dst asm.Register, doff int16, src asm.Register, soff int16, n int) asm.Instructions {
	var out asm.Instructions
	for i := range n {
		out = append(out,
			asm.LoadMem(asm.R1, src, soff+int16(4*i), asm.Word),
			asm.StoreMem(dst, doff+int16(4*i), asm.R1, asm.Word))
	}
	return out
}

// prologue saves the context in R6 and zeroes the frame.
func prologue() asm.Instructions {
	out := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1), asm.Mov.Imm(asm.R0, 0)}
	for off := stBottom; off < 0; off += 8 {
		out = append(out, asm.StoreMem(asm.RFP, int16(off), asm.R0, asm.DWord))
	}
	return out
}

// loadAddr stores the socket address of the context (the destination of
// connect and sendmsg, the peer of recvmsg and getpeername) at stack
// offset off as 16 bytes, IPv4 mapped, and its port after it.
func loadAddr(v6 bool, off int16) asm.Instructions {
	var out asm.Instructions
	if v6 {
		out = copyWords(asm.RFP, off, asm.R6, ctxUserIP6, 4)
	} else {
		out = asm.Instructions{
			asm.StoreImm(asm.RFP, off+10, 0xffff, asm.Half),
			asm.LoadMem(asm.R1, asm.R6, ctxUserIP4, asm.Word),
			asm.StoreMem(asm.RFP, off+12, asm.R1, asm.Word),
		}
	}
	return append(out,
		asm.LoadMem(asm.R1, asm.R6, ctxUserPort, asm.Word),
		asm.StoreMem(asm.RFP, off+16, asm.R1, asm.Half))
}

// storeAddr writes the endpoint at src+off (16 bytes of address, then
// the port) into the context's address.
func storeAddr(v6 bool, src asm.Register, off int16) asm.Instructions {
	var out asm.Instructions
	if v6 {
		out = copyWords(asm.R6, ctxUserIP6, src, off, 4)
	} else {
		out = asm.Instructions{
			asm.LoadMem(asm.R1, src, off+12, asm.Word),
			asm.StoreMem(asm.R6, ctxUserIP4, asm.R1, asm.Word),
		}
	}
	return append(out,
		asm.LoadMem(asm.R1, src, off+16, asm.Half),
		asm.StoreMem(asm.R6, ctxUserPort, asm.R1, asm.Word))
}

// forwardProgram is connect4/6 and sendmsg4/6: a TCP or UDP flow to a
// frontend gets the action of its origin (the node's network namespace,
// or another: a pod); forwarding picks an endpoint of the set (the
// client's pin when the set has affinity and the pin is alive, else a
// random slot, or for UDP a slot chosen by the socket, so that one socket
// stays on one endpoint), rewrites the destination and records the
// service's address for recvmsg and getpeername.
func forwardProgram(v6 bool) asm.Instructions {
	out := prologue()
	out = append(out,
		asm.LoadMem(asm.R1, asm.R6, ctxProtocol, asm.Word),
		asm.JEq.Imm(asm.R1, unix.IPPROTO_TCP, "proto"),
		asm.JEq.Imm(asm.R1, unix.IPPROTO_UDP, "proto"),
		asm.Ja.Label("pass"),
		asm.StoreMem(asm.RFP, stFE+18, asm.R1, asm.Byte).WithSymbol("proto"),
	)
	out = append(out, loadAddr(v6, stFE)...)
	out = append(out, lookup(mapFrontends, stFE)...)
	out = append(out,
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnGetNetnsCookie.Call(),
		asm.StoreMem(asm.RFP, stAffKey, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R8, asm.R0),
	)
	out = append(out, lookup(mapConfig, stCfg)...)
	out = append(out,
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.JEq.Reg(asm.R1, asm.R8, "node"),
		asm.LoadMem(asm.R1, asm.R7, 1, asm.Byte),
		asm.LoadMem(asm.R8, asm.R7, 8, asm.Word),
		asm.Ja.Label("act"),
		asm.LoadMem(asm.R1, asm.R7, 0, asm.Byte).WithSymbol("node"),
		asm.LoadMem(asm.R8, asm.R7, 4, asm.Word),
		asm.JEq.Imm(asm.R1, int32(actForward), "forward").WithSymbol("act"),
		asm.JEq.Imm(asm.R1, int32(actReject), "reject"),
		asm.JEq.Imm(asm.R1, int32(actDrop), "drop"),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("pass"),
		asm.Return(),
		asm.Mov.Imm(asm.R1, -int32(unix.ECONNREFUSED)).WithSymbol("reject"),
		asm.FnSetRetval.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("drop"),
		asm.Return(),
		asm.StoreMem(asm.RFP, stSlot, asm.R8, asm.Word).WithSymbol("forward"),
		asm.StoreMem(asm.RFP, stAffKey+8, asm.R8, asm.Word),
		asm.StoreMem(asm.RFP, stMember, asm.R8, asm.Word),
	)
	out = append(out, lookup(mapSets, stSlot)...)
	out = append(out,
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.LoadMem(asm.R1, asm.R9, 4, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "pick"),
	)
	out = append(out, pinned()...)
	out = append(out, pick()...)
	pin := update(mapAffinity, stAffKey, stEP)
	pin[0] = pin[0].WithSymbol("pin")
	out = append(out, pin...)
	xlate := storeAddr(v6, asm.RFP, stEP)
	xlate[0] = xlate[0].WithSymbol("xlate")
	out = append(out, xlate...)
	out = append(out,
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnGetSocketCookie.Call(),
		asm.StoreMem(asm.RFP, stRevKey, asm.R0, asm.DWord),
	)
	out = append(out, copyWords(asm.RFP, stRevKey+8, asm.RFP, stEP, 5)...)
	out = append(out, copyWords(asm.RFP, stRevVal, asm.RFP, stFE, 4)...)
	out = append(out,
		asm.LoadMem(asm.R1, asm.RFP, stFE+16, asm.Half),
		asm.StoreMem(asm.RFP, stRevVal+16, asm.R1, asm.Half),
	)
	out = append(out, update(mapReverse, stRevKey, stRevVal)...)
	return append(out, asm.Mov.Imm(asm.R0, 1), asm.Return())
}

// pinned follows the client's pin when it is younger than the set's
// timeout and its endpoint still belongs to the set: it jumps to "pin"
// (which renews it) with the endpoint at stEP, else to "pick".
func pinned() asm.Instructions {
	out := lookup(mapAffinity, stAffKey)
	out = append(out,
		asm.JEq.Imm(asm.R0, 0, "pick"),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.FnKtimeGetNs.Call(),
		asm.LoadMem(asm.R1, asm.R7, 24, asm.DWord),
		asm.Mov.Reg(asm.R2, asm.R0),
		asm.Sub.Reg(asm.R2, asm.R1),
		asm.LoadMem(asm.R1, asm.R9, 4, asm.Word),
		asm.Mul.Imm(asm.R1, 1_000_000_000),
		asm.JGE.Reg(asm.R2, asm.R1, "pick"),
		asm.StoreMem(asm.RFP, stEP+24, asm.R0, asm.DWord),
	)
	out = append(out, copyWords(asm.RFP, stEP, asm.R7, 0, 5)...)
	out = append(out, copyWords(asm.RFP, stMember+8, asm.R7, 0, 5)...)
	out = append(out, lookup(mapMembers, stMember)...)
	return append(out,
		asm.JEq.Imm(asm.R0, 0, "pick"),
		asm.Ja.Label("pin"),
	)
}

// pick chooses a slot of the set in R9 (id at stSlot), copies its
// endpoint to stEP and jumps to "xlate", or to "pin" (with the time) when
// the set has affinity. A slot that a concurrent shrink of the set took
// away is replaced by slot 0.
func pick() asm.Instructions {
	out := asm.Instructions{
		asm.LoadMem(asm.R1, asm.R6, ctxProtocol, asm.Word).WithSymbol("pick"),
		asm.JEq.Imm(asm.R1, unix.IPPROTO_UDP, "udp"),
		asm.FnGetPrandomU32.Call(),
		asm.Ja.Label("mod"),
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("udp"),
		asm.FnGetSocketCookie.Call(),
		asm.StoreMem(asm.RFP, stFlow, asm.R0, asm.DWord),
		asm.LoadMem(asm.R1, asm.RFP, stSlot, asm.Word),
		asm.StoreMem(asm.RFP, stFlow+8, asm.R1, asm.Word),
	}
	out = append(out, lookup(mapFlows, stFlow)...)
	out = append(out,
		asm.JEq.Imm(asm.R0, 0, "hash"),
		asm.Mov.Reg(asm.R7, asm.R0),
	)
	out = append(out, copyWords(asm.RFP, stMember+8, asm.R7, 0, 5)...)
	out = append(out, lookup(mapMembers, stMember)...)
	out = append(out,
		asm.JEq.Imm(asm.R0, 0, "hash"),
		asm.Mov.Reg(asm.R0, asm.R7),
		asm.Ja.Label("slot"),
		asm.LoadMem(asm.R0, asm.RFP, stFlow, asm.DWord).WithSymbol("hash"),
		asm.LoadImm(asm.R1, golden, asm.DWord),
		asm.Mul.Reg(asm.R0, asm.R1),
		asm.RSh.Imm(asm.R0, 32),
		asm.LoadMem(asm.R1, asm.R9, 0, asm.Word).WithSymbol("mod"),
		asm.JEq.Imm(asm.R1, 0, "pass"),
		asm.Mod.Reg(asm.R0, asm.R1),
		asm.StoreMem(asm.RFP, stSlot+4, asm.R0, asm.Word),
	)
	out = append(out, lookup(mapSlots, stSlot)...)
	out = append(out,
		asm.JNE.Imm(asm.R0, 0, "slot"),
		asm.StoreImm(asm.RFP, stSlot+4, 0, asm.Word),
	)
	out = append(out, lookup(mapSlots, stSlot)...)
	out = append(out, asm.JEq.Imm(asm.R0, 0, "pass"))
	cp := copyWords(asm.RFP, stEP, asm.R0, 0, 5)
	cp[0] = cp[0].WithSymbol("slot")
	out = append(out, cp...)
	out = append(out,
		asm.LoadMem(asm.R1, asm.R6, ctxProtocol, asm.Word),
		asm.JNE.Imm(asm.R1, unix.IPPROTO_UDP, "affinity"),
	)
	out = append(out, update(mapFlows, stFlow, stEP)...)
	return append(out,
		asm.LoadMem(asm.R1, asm.R9, 4, asm.Word).WithSymbol("affinity"),
		asm.JEq.Imm(asm.R1, 0, "xlate"),
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, stEP+24, asm.R0, asm.DWord),
	)
}

// reverseProgram is recvmsg4/6 and getpeername4/6: a socket that was sent
// to an endpoint sees the service's address as its peer, while that
// frontend exists; the record of a frontend that is gone is deleted.
func reverseProgram(v6 bool) asm.Instructions {
	out := prologue()
	out = append(out,
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnGetSocketCookie.Call(),
		asm.StoreMem(asm.RFP, stRevKey, asm.R0, asm.DWord),
	)
	out = append(out, loadAddr(v6, stRevKey+8)...)
	out = append(out, lookup(mapReverse, stRevKey)...)
	out = append(out,
		asm.JEq.Imm(asm.R0, 0, "done"),
		asm.Mov.Reg(asm.R7, asm.R0),
	)
	out = append(out, copyWords(asm.RFP, stFE, asm.R7, 0, 5)...)
	out = append(out,
		asm.LoadMem(asm.R1, asm.R6, ctxProtocol, asm.Word),
		asm.StoreMem(asm.RFP, stFE+18, asm.R1, asm.Byte),
	)
	out = append(out, lookup(mapFrontends, stFE)...)
	out = append(out, asm.JNE.Imm(asm.R0, 0, "rewrite"), mapPtr(asm.R1, mapReverse))
	out = append(out, stackPtr(asm.R2, stRevKey)...)
	out = append(out, asm.FnMapDeleteElem.Call(), asm.Ja.Label("done"))
	rw := storeAddr(v6, asm.R7, 0)
	rw[0] = rw[0].WithSymbol("rewrite")
	out = append(out, rw...)
	return append(out, asm.Mov.Imm(asm.R0, 1).WithSymbol("done"), asm.Return())
}

// programSpec returns the program of a hook.
func programSpec(h hook) *ebpf.ProgramSpec {
	insns := forwardProgram(h.v6)
	if h.reverse {
		insns = reverseProgram(h.v6)
	}
	return &ebpf.ProgramSpec{
		Name:         "kp_" + h.name,
		Type:         ebpf.CGroupSockAddr,
		AttachType:   h.attach,
		Instructions: insns,
		License:      "Apache-2.0",
	}
}
