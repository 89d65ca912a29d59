package roce

// UDP source port selection. RoCE v2 uses the UDP source port as flow
// entropy for ECMP; it must be stable for a QP so that its packets stay in
// order on one path. vrnic uses the same function as Linux rxe
// (rxe_qp.c: RXE_ROCE_V2_SPORT + (hash_32(qpn, 14) & 0x3fff)), so a
// vrnic QP picks the port an rxe QP with the same number would.

const (
	// srcPortBase is the start of the IANA dynamic port range.
	srcPortBase = 0xc000
	// goldenRatio32 is the Linux hash_32 multiplier.
	goldenRatio32 = 0x61C88647
)

// UDPSrcPort returns the UDP source port for packets of the QP numbered
// qpn (its own QPN): a value in 49152..65535.
func UDPSrcPort(qpn uint32) uint16 {
	h := (qpn * goldenRatio32) >> (32 - 14)
	return uint16(srcPortBase + h&0x3fff)
}
