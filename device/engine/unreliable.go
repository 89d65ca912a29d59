package engine

import (
	"net/netip"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// The unreliable services: UD (IBTA 9.8, RoCE v2: annex A17) and UC
// (IBTA 9.4, 9.7 for what UC keeps of the RC rules).
//
// Requester. Both run the RC requester (requester.go) with these
// differences: no ACK is asked for or expected, so there is no ACK timer,
// no retry and no RNR wait; a WQE is done once its last packet was handed
// to the link (worker.flush reports every such frame it gave the link:
// sentThrough) and completes in order; the window limits the packets
// queued but not yet handed over. A send WR that fails moves the QP to
// SQE (enterSQE), where the SQ is flushed and receives go on.
//
//   - UD: one packet per message (SEND ONLY, SEND ONLY with immediate),
//     DETH with the Q_Key and the source QP, to the QP and through the
//     address handle the WQE names (prepareUD, useAH). A message longer
//     than the port's MTU fails with a local length error.
//   - UC: SEND and RDMA WRITE (with and without immediate) segmented at
//     the path MTU like RC, with the UC opcodes.
//
// Responder.
//
//   - UD (inputUD): a packet for the QP passes the Q_Key check (IBTA
//     10.2.5: the DETH Q_Key must equal the QP's; a mismatch is dropped
//     and counted), takes a receive WQE (none posted: dropped and counted;
//     UD has no RNR), and lands with the 40-byte GRH in front of the
//     payload (udGRH); the completion carries the source QP, IBV_WC_GRH,
//     the immediate data and byte_len = 40 + payload.
//   - UC (ucRx): a message is accepted packet by packet in PSN order; a
//     gap (lost packets) or a packet that does not continue the message
//     in progress drops the rest of that message silently, and the
//     responder resynchronises on the next FIRST or ONLY packet at any
//     PSN (IBTA 9.7.5.1.1 for UC: no NAKs, no duplicates detected beyond
//     the PSN order). The receive WQE of a dropped SEND is kept for the
//     next SEND. An operation the QP does not allow (remote write access),
//     a bad R_Key or a bad length drops the message; nothing is answered.

// unreliableOp reports whether a send opcode is carried by service svc
// (IBTA 9.4: UC carries SEND and RDMA WRITE; 9.8: UD only SEND).
func unreliableOp(svc roce.Service, op abi.WROpcode) bool {
	switch op {
	case abi.WRSend, abi.WRSendWithImm:
		return true
	case abi.WRRDMAWrite, abi.WRRDMAWriteWithImm:
		return svc == roce.ServiceUC
	}
	return false
}

// prepareUD resolves the address handle of a UD send WQE and checks its
// length against the port's MTU (status.go has the statuses).
func (qp *QP) prepareUD(e *swqe) abi.WCStatus {
	e.ah = qp.cfg.AHs.Lookup(e.AHHandle)
	switch {
	case e.ah == nil:
		return unknownAHStatus
	case e.ah.attr.PD != qp.cfg.PD:
		return foreignAHStatus
	case e.length > uint64(qp.mtu):
		return udLengthStatus
	}
	return abi.WCSuccess
}

// ucOpcodeOffset turns an RC SEND/WRITE opcode into its UC twin.
const ucOpcodeOffset = roce.OpUCSendFirst - roce.OpRCSendFirst

// unreliableHeaders sets what a UD or UC packet of e has beyond RC's:
// its opcode, and for UD the destination QP, the Q_Key and the path of
// the WQE's address handle.
func (qp *QP) unreliableHeaders(e *swqe, o *packet) {
	if qp.svc == roce.ServiceUC {
		o.opcode += ucOpcodeOffset
		return
	}
	o.opcode = roce.OpUDSendOnly
	if e.Opcode == abi.WRSendWithImm {
		o.opcode = roce.OpUDSendOnlyImm
	}
	o.destQP = e.RemoteQPN & roce.QPNMask
	// IBTA 10.2.5: a Q_Key in a send WR with its high-order bit set means
	// "use the QP's own Q_Key".
	o.qkey = e.RemoteQKey
	if o.qkey&0x8000_0000 != 0 {
		o.qkey = qp.attr.QKey
	}
	qp.useAH(e.ah)
}

// sentThrough is told by the worker that the link took the packet with
// PSN psn of this UD or UC QP: every WQE whose last packet it was, or
// came before, is done; done WQEs complete in order.
func (qp *QP) sentThrough(psn uint32) {
	next := roce.PSNAdd(psn, 1)
	if roce.PSNDiff(next, qp.comp.psn) > 0 {
		qp.comp.psn = next
	}
	for i := qp.head; i != qp.next; i++ {
		e := &qp.sq[i&qp.sqMask]
		if e.state == wqeDone {
			continue
		}
		if e.state != wqePending || roce.PSNDiff(e.last, psn) > 0 {
			break
		}
		e.state = wqeDone
	}
	if qp.state == abi.QPSRTS || qp.state == abi.QPSSQD {
		qp.advanceHead()
	}
	qp.w.busy = true
}

// inputUD checks and delivers a packet for UD QP qp (the worker found it
// by the BTH destination QP). frameLen is the length of the UDP payload
// (ModeUDP: what the GRH's IP header announces).
func (w *worker) inputUD(qp *QP, pkt *roce.Packet, frameLen int, from netip.AddrPort) {
	if pkt.Info.Service != roce.ServiceUD || pkt.BTH.PKey() != pkeyDefault {
		w.Counters.BadPeer.Add(1)
		return
	}
	qp.Counters.PacketsReceived.Add(1)
	switch qp.state {
	case abi.QPSRTR, abi.QPSRTS, abi.QPSSQD, abi.QPSSQE:
	default:
		qp.Counters.Rare().Dropped.Add(1)
		return
	}
	if pkt.DETH.QKey() != qp.attr.QKey {
		qp.Counters.Rare().QKeyViolations.Add(1)
		qp.Counters.Rare().Dropped.Add(1)
		return
	}
	if len(pkt.Payload) > int(qp.mtu) {
		qp.Counters.Rare().Dropped.Add(1)
		return
	}
	r := &qp.resp
	r.rqe.SGEs = r.rqe.SGEs[:0]
	ok, err := qp.cfg.RQ.PollRecv(&r.rqe)
	if err != nil {
		qp.completeRecv(&r.rqe, qp.w.rejectedSource(err), abi.WCRecv, 0, 0, 0, false)
		qp.enterError(sourceEvent(err))
		return
	}
	if !ok {
		// UD has no RNR NAK: the packet is dropped.
		qp.Counters.Rare().NoRecvWQE.Add(1)
		qp.Counters.Rare().Dropped.Add(1)
		return
	}
	r.rqeTaken = w.now // taken and completed at once: latency.go
	grh := w.grh[:]
	sl := w.udGRH(grh, pkt, frameLen, from)
	mem := qp.cfg.Mem
	if err = mem.Scatter(r.rqe.SGEs, 0, grh); err == nil && len(pkt.Payload) > 0 {
		err = mem.Scatter(r.rqe.SGEs, roce.GRHLen, pkt.Payload)
	}
	if err != nil {
		st, fatal := unreliableRecvStatus(err)
		qp.completeRecv(&r.rqe, st, abi.WCRecv, 0, 0, 0, false)
		if fatal {
			qp.enterError(evNone) // the receive's completion says why
		}
		return
	}
	flags, imm := abi.WCGRH, uint32(0)
	if pkt.ImmDt != nil {
		flags, imm = flags|abi.WCWithImm, pkt.ImmDt.Imm()
	}
	c := &w.cqe
	*c = abi.CQE{WrID: r.rqe.WrID, Status: abi.WCSuccess, Opcode: abi.WCRecv, QPNum: qp.qpn,
		ByteLen: uint32(roce.GRHLen + len(pkt.Payload)), WCFlags: flags, ImmOrInv: imm, SrcQP: pkt.DETH.SrcQP(), SL: sl}
	qp.pushRecv(c, pkt.BTH.SE())
	w.busy = true
}

// udGRH writes the 40-byte GRH a UD receive buffer starts with (IBTA
// 11.4.1.2; RoCE v2, annex A17.4.5.1), as Linux rxe and mlx5 write it:
// over IPv6 the packet's IPv6 header; over IPv4 20 zero bytes, then the
// packet's IPv4 header (rdma-core tells the two apart by the version
// nibbles and the IPv4 header checksum: ibv_create_ah_from_wc). In
// ModeUDP the kernel consumed the IP header: it is rebuilt from what the
// datagram says (addresses, length) with the values vrnic sends with (TTL
// or hop limit 64, traffic class 0, identification 0, don't fragment,
// flow label 0) and a valid checksum.
//
// It returns the completion's SL: the RoCE packet type, as ConnectX
// reports it in a UD receive's SL (annex A17.4.5.1 asks the CQE to say
// whether the frame was IPv4 or IPv6; mlx5's CQE says it there): bit 3
// set for a frame with a UDP header (RoCE v2), bits 2:0 the L3 header, 1
// IPv6, 2 IPv4. UCX's ud_verbs up to 1.17 reads it to find the
// destination GID in the GRH and silently drops every packet when it is
// 0, as rxe leaves it (UCX_UD_ETH_DGID_CHECK); for a RoCE v2 port the SL
// carries no priority, so nothing else is lost.
func (w *worker) udGRH(grh []byte, pkt *roce.Packet, frameLen int, from netip.AddrPort) (sl uint8) {
	clear(grh)
	switch {
	case pkt.IPv4 != nil:
		copy(grh[roce.GRHLen-roce.IPv4HeaderLen:], pkt.IPv4[:roce.IPv4HeaderLen])
		return slRoCEv2IPv4
	case pkt.IPv6 != nil:
		copy(grh, pkt.IPv6[:roce.IPv6HeaderLen])
		return slRoCEv2IPv6
	}
	src, dst := from.Addr().Unmap(), w.local.Addr().Unmap()
	udpLen := roce.UDPHeaderLen + frameLen
	if src.Is4() && dst.Is4() {
		roce.IPv4(grh[roce.GRHLen-roce.IPv4HeaderLen:]).Encode(&roce.IPv4Fields{
			TotalLength: uint16(roce.IPv4HeaderLen + udpLen), FlagsFragment: roce.IPv4FlagDF,
			TTL: 64, Protocol: roce.ProtocolUDP, Src: src.As4(), Dst: dst.As4(),
		})
		return slRoCEv2IPv4
	}
	roce.IPv6(grh).Encode(&roce.IPv6Fields{
		PayloadLength: uint16(udpLen), NextHeader: roce.ProtocolUDP, HopLimit: 64, Src: src.As16(), Dst: dst.As16(),
	})
	return slRoCEv2IPv6
}

// The SL of a UD receive completion (udGRH).
const (
	slRoCEv2IPv6 = 0x8 | 0x1
	slRoCEv2IPv4 = 0x8 | 0x2
)

// ucRx handles one packet for UC QP qp (see the file comment).
func (qp *QP) ucRx(p *packet) {
	switch qp.state {
	case abi.QPSRTR, abi.QPSRTS, abi.QPSSQD, abi.QPSSQE:
	default:
		qp.Counters.Rare().Dropped.Add(1)
		return
	}
	qp.w.busy = true
	r := &qp.resp
	info := p.opcode.Info()
	start := info.Is(roce.OpFirst) || info.Is(roce.OpOnly)
	d := roce.PSNDiff(p.psn, r.epsn)
	switch {
	case d < 0:
		// Older than expected: a duplicate (UC never retransmits).
		qp.Counters.Rare().Duplicates.Add(1)
		return
	case d > 0 || r.ucDrop:
		if !start {
			// Packets were lost: the message in progress is lost
			// with them; wait for the next FIRST or ONLY.
			qp.ucDropMessage(p)
			return
		}
		qp.ucAbort()
	}
	r.epsn = roce.PSNAdd(p.psn, 1)
	switch {
	case start:
		qp.ucAbort() // a message in progress lost its tail
	case r.inSend && info.Is(roce.OpSend), r.inWrite && info.Is(roce.OpWrite):
	default:
		qp.ucDropMessage(p)
		return
	}
	if !qp.ucCheck(p, info) {
		qp.ucDropMessage(p)
		return
	}
	qp.ucExecute(p, info)
}

// ucDropMessage drops p and the rest of its message.
func (qp *QP) ucDropMessage(p *packet) {
	qp.Counters.Rare().Dropped.Add(1)
	qp.ucAbort()
	qp.resp.ucDrop = true
	qp.resp.epsn = roce.PSNAdd(p.psn, 1)
}

// ucAbort forgets the message in progress; the receive WQE a SEND held
// stays for the next message.
func (qp *QP) ucAbort() {
	r := &qp.resp
	r.inSend, r.inWrite, r.off, r.ucDrop = false, false, 0, false
}

// ucCheck runs the responder's checks on a UC packet that continues or
// starts a message: access, receive WQE, lengths, R_Key. false: drop the
// message (counted).
func (qp *QP) ucCheck(p *packet, info *roce.OpInfo) bool {
	r := &qp.resp
	n := uint32(len(p.payload))
	switch {
	case info.Is(roce.OpWrite) && qp.attr.AccessFlags&abi.AccessRemoteWrite == 0:
		return false
	case (info.Is(roce.OpFirst) || info.Is(roce.OpMiddle)) && n != qp.mtu, n > qp.mtu:
		return false
	}
	if info.Is(roce.OpWrite) {
		if info.Is(roce.OpFirst) || info.Is(roce.OpOnly) {
			if info.Is(roce.OpOnly) && n != p.dmaLen || info.Is(roce.OpFirst) && p.dmaLen <= qp.mtu {
				return false
			}
			if p.dmaLen > 0 && qp.cfg.Mem.CheckRemote(p.rkey, p.va, uint64(p.dmaLen), abi.AccessRemoteWrite) != nil {
				return false
			}
			r.wVA, r.wRKey, r.wLen, r.off = p.va, p.rkey, p.dmaLen, 0
		}
		total := r.off + uint64(n)
		if total > uint64(r.wLen) || info.Is(roce.OpLast) && total != uint64(r.wLen) {
			return false
		}
	}
	if info.Is(roce.OpRecvWQE) && !r.rqeValid && (info.Is(roce.OpSend) || info.Is(roce.OpLast) || info.Is(roce.OpOnly)) {
		r.rqe.SGEs = r.rqe.SGEs[:0]
		ok, err := qp.cfg.RQ.PollRecv(&r.rqe)
		if err != nil {
			qp.completeRecv(&r.rqe, qp.w.rejectedSource(err), abi.WCRecv, 0, 0, 0, false)
			qp.enterError(sourceEvent(err))
			return false
		}
		if !ok {
			qp.Counters.Rare().NoRecvWQE.Add(1)
			return false
		}
		r.rqeValid, r.rqeTaken = true, qp.w.now
	}
	return true
}

// ucExecute places a checked UC packet and completes its message.
func (qp *QP) ucExecute(p *packet, info *roce.OpInfo) {
	r := &qp.resp
	mem := qp.cfg.Mem
	end := info.Is(roce.OpLast) || info.Is(roce.OpOnly)
	if info.Is(roce.OpSend) {
		if len(p.payload) > 0 {
			if err := mem.Scatter(r.rqe.SGEs, r.off, p.payload); err != nil {
				st, fatal := unreliableRecvStatus(err)
				r.rqeValid = false
				qp.completeRecv(&r.rqe, st, abi.WCRecv, 0, 0, 0, false)
				qp.ucDropMessage(p)
				if fatal {
					qp.enterError(evNone) // the receive's completion says why
				}
				return
			}
		}
		r.off += uint64(len(p.payload))
		r.inSend = true
		if end {
			var flags abi.WCFlags
			var imm uint32
			if info.Is(roce.OpImm) {
				flags, imm = abi.WCWithImm, p.imm
			}
			r.rqeValid = false
			qp.completeRecv(&r.rqe, abi.WCSuccess, abi.WCRecv, uint32(r.off), flags, imm, p.se)
			r.inSend, r.off = false, 0
		}
		return
	}
	if len(p.payload) > 0 {
		if err := mem.WriteRemote(r.wRKey, r.wVA+r.off, p.payload); err != nil {
			qp.ucDropMessage(p)
			return
		}
	}
	r.off += uint64(len(p.payload))
	r.inWrite = true
	if end {
		if info.Is(roce.OpImm) {
			r.rqeValid = false
			qp.completeRecv(&r.rqe, abi.WCSuccess, abi.WCRecvRDMAWithImm, r.wLen, abi.WCWithImm, p.imm, p.se)
		}
		r.inWrite, r.off = false, 0
	}
}
