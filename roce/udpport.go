package roce

// UDP source port selection. RoCE v2 uses the UDP source port as flow
// entropy for ECMP; it must be stable for a QP so that its packets stay in
// order on one path, and lies in 49152..65535. vrnic uses the functions
// Linux uses, so a vrnic QP picks the port an rxe QP would (checked
// against the rxe captures):
//
//   - UDPSrcPort(qpn): rxe's default for a QP, used for UD QPs:
//     0xC000 + (hash_32(qpn, 14) & 0x3fff) (rxe_qp.c).
//   - UDPSrcPortForFlow(fl, lqpn, rqpn): connected QPs (RC, UC) once the
//     peer is known: include/rdma/ib_verbs.h rdma_get_udp_sport, which
//     folds the GRH flow label, or if that is zero a label computed from
//     the local and remote QPNs (rdma_calc_flow_label), into 14 bits.

const (
	// srcPortBase is the start of the IANA dynamic port range.
	srcPortBase = 0xc000
	// goldenRatio32 is the Linux hash_32 multiplier.
	goldenRatio32 = 0x61C88647
	// flowLabelMask masks a 20-bit IPv6/GRH flow label.
	flowLabelMask = 0xfffff
)

// UDPSrcPort returns the UDP source port for packets of the QP numbered
// qpn (its own QPN).
func UDPSrcPort(qpn uint32) uint16 {
	h := (qpn * goldenRatio32) >> (32 - 14)
	return uint16(srcPortBase + h&0x3fff)
}

// FlowLabel returns the flow label Linux derives for a connection between
// local QP lqpn and remote QP rqpn (rdma_calc_flow_label): symmetric, so
// both directions of an RC connection hash alike.
func FlowLabel(lqpn, rqpn uint32) uint32 {
	v := uint64(lqpn) * uint64(rqpn)
	v ^= v >> 20
	v ^= v >> 40
	return uint32(v & flowLabelMask)
}

// UDPSrcPortForFlow returns the UDP source port of a connected QP from its
// flow label fl (0 when the address vector has none) and the local and
// remote QPNs, as rdma_get_udp_sport does.
func UDPSrcPortForFlow(fl, lqpn, rqpn uint32) uint16 {
	fl &= flowLabelMask
	if fl == 0 {
		fl = FlowLabel(lqpn, rqpn)
	}
	low := fl&0x3fff ^ fl>>14
	return uint16(low | srcPortBase)
}
