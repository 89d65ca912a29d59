package faults

import (
	"net/netip"

	"github.com/vrnic/vrnic/roce"
)

// view locates the parts of one RoCE v2 frame the rules look at and the
// actions change. It is a light parse: offsets and lengths are checked,
// the ICRC is not (the receiver does that). A frame that is not RoCE v2
// (ARP, ND, anything else on a TAP) has ok false and passes every rule
// untouched.
type view struct {
	ok   bool
	ip   int // offset of the IP header (-1: ModeUDP, no IP header)
	v6   bool
	bth  int // offset of the BTH
	end  int // offset of the ICRC (the transport packet ends at end+4)
	pay  int // offset of the payload
	pend int // end of the payload (before the pad)
	op   roce.Opcode
	info *roce.OpInfo
	psn  uint32
	qpn  uint32 // BTH destination QP
	src  int64  // DETH source QP, -1 when the frame has none
	// syn is the AETH syndrome kind of an ACKNOWLEDGE (ACK, RNR NAK, NAK).
	syn  roce.SyndromeKind
	peer netip.Addr // the remote end: destination on tx, source on rx
}

// parseView fills v from frame f of mode; peer is the frame's peer
// beside it (ModeUDP).
func parseView(f []byte, mode roce.Mode, tx bool, peer netip.AddrPort, v *view) {
	*v = view{ip: -1, src: -1}
	bth, end := 0, len(f)-roce.ICRCLen
	if mode == roce.ModeUDP {
		v.peer = peer.Addr().Unmap()
	} else {
		eth := roce.Ethernet(f)
		if !eth.IsValid() {
			return
		}
		ip := eth.HeaderLen()
		var ipEnd, udp int
		switch eth.Type() {
		case roce.EtherTypeIPv4:
			h := roce.IPv4(f[ip:])
			if !h.IsValid() || h.Version() != 4 || h.HeaderLen() < roce.IPv4HeaderLen || h.Protocol() != roce.ProtocolUDP {
				return
			}
			ipEnd, udp = ip+int(h.TotalLength()), ip+h.HeaderLen()
			if tx {
				v.peer = h.Dst()
			} else {
				v.peer = h.Src()
			}
		case roce.EtherTypeIPv6:
			h := roce.IPv6(f[ip:])
			if !h.IsValid() || h.Version() != 6 || h.NextHeader() != roce.ProtocolUDP {
				return
			}
			ipEnd, udp = ip+roce.IPv6HeaderLen+int(h.PayloadLength()), ip+roce.IPv6HeaderLen
			v.v6 = true
			if tx {
				v.peer = h.Dst().Unmap()
			} else {
				v.peer = h.Src().Unmap()
			}
		default:
			return
		}
		if ipEnd > len(f) || udp+roce.UDPHeaderLen > ipEnd || roce.UDP(f[udp:]).DstPort() != roce.UDPPort {
			return
		}
		v.ip, bth, end = ip, udp+roce.UDPHeaderLen, ipEnd-roce.ICRCLen
	}
	if end-bth < roce.BTHLen {
		return
	}
	b := roce.BTH(f[bth:])
	info := b.Opcode().Info()
	if !info.Valid() || end-bth < info.HeaderLen {
		return
	}
	v.ok, v.bth, v.end, v.op, v.info = true, bth, end, b.Opcode(), info
	v.psn, v.qpn = b.PSN(), b.DestQP()
	v.pay = bth + info.HeaderLen
	v.pend = max(v.pay, end-b.PadCount())
	if info.Has(roce.HdrDETH) {
		o := bth + info.Offset(roce.HdrDETH)
		v.src = int64(roce.DETH(f[o:]).SrcQP())
	}
	if v.op == roce.OpRCAck {
		o := bth + info.Offset(roce.HdrAETH)
		v.syn = roce.AETH(f[o:]).Syndrome().Kind()
	}
}

// kind is a message kind (admin.FaultMessageKinds) of a frame, for
// message counting; kindNone for frames of no kind.
type kind uint8

const (
	kindNone kind = iota
	kindSend
	kindWrite
	kindRead
	kindReadResp
	kindAtomic
	kindAtomicAck
	kindAck
	numKinds
)

var kindNames = [numKinds]string{"", "send", "write", "read", "read_response", "atomic", "atomic_ack", "ack"}

func kindByName(s string) kind {
	for k, n := range kindNames {
		if n == s && k != 0 {
			return kind(k)
		}
	}
	return kindNone
}

// kindOf returns the message kind of an opcode.
func kindOf(op roce.Opcode, info *roce.OpInfo) kind {
	f := info.Flags
	switch {
	case op == roce.OpRCAck:
		return kindAck
	case op == roce.OpRCAtomicAck:
		return kindAtomicAck
	case f&roce.OpSend != 0:
		return kindSend
	case f&roce.OpWrite != 0:
		return kindWrite
	case f&(roce.OpRead|roce.OpRequest) == roce.OpRead|roce.OpRequest:
		return kindRead
	case f&(roce.OpRead|roce.OpResponse) == roce.OpRead|roce.OpResponse:
		return kindReadResp
	case f&(roce.OpAtomic|roce.OpRequest) == roce.OpAtomic|roce.OpRequest:
		return kindAtomic
	}
	return kindNone
}
