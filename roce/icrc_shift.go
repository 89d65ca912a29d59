package roce

import "encoding/binary"

// Changing covered bytes of a packet without recomputing its ICRC.
//
// The ICRC is a CRC-32, affine in the message: for two messages of one
// length, CRC(a XOR b) = CRC(a) XOR CRC(b) XOR CRC(zeros), so changing
// bytes of a packet changes its ICRC by the raw CRC (zero initial value,
// no final inversion) of the difference, which is the difference bytes
// followed by as many zero bytes as the packet has after them. The zero
// bytes act as a multiplication by x^(8n) modulo the polynomial (zlib's
// crc32_combine uses the same identity). The masked fields of the ICRC are
// ones in both packets, so they do not count.
//
// The TAP link uses this to renumber the IPv4 identification of the
// frames it hands the kernel as one segmented packet: segment k of such a
// packet carries the identification of the first plus k (the kernel's
// inet_gso_segment), and its ICRC must cover that value.

// crcPoly is the reflected IEEE polynomial.
const crcPoly = 0xedb88320

// multModP returns a*b modulo the CRC polynomial (reflected: bit 31 is
// x^0).
func multModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				break
			}
		}
		if b&1 != 0 {
			b = b>>1 ^ crcPoly
		} else {
			b >>= 1
		}
	}
	return p
}

// x2nModP[k] is x^(2^k) modulo the polynomial.
var x2nModP = func() (t [32]uint32) {
	p := uint32(1) << 30 // x^1
	t[0] = p
	for i := 1; i < 32; i++ {
		p = multModP(p, p)
		t[i] = p
	}
	return t
}()

// ICRCShift moves a raw CRC-32 state over a run of zero bytes: x^(8n)
// modulo the polynomial for n bytes (NewICRCShift).
type ICRCShift uint32

// NewICRCShift returns the shift over n zero bytes (n >= 0). It costs
// about as much as the CRC of a few hundred bytes; callers reuse it for
// packets of one length.
func NewICRCShift(n int) ICRCShift {
	p := uint32(1) << 31 // x^0
	for k := 3; n != 0; n, k = n>>1, k+1 {
		if n&1 != 0 {
			p = multModP(x2nModP[k&31], p)
		}
	}
	return ICRCShift(p)
}

// IPv4IDDelta returns what to XOR into the ICRC of a packet whose IPv4
// identification changes from old to id, s being NewICRCShift of the
// number of bytes the ICRC covers after the identification field
// (IPv4IDTail).
func (s ICRCShift) IPv4IDDelta(old, id uint16) uint32 {
	d := old ^ id
	if d == 0 {
		return 0
	}
	t := &crcTab[0]
	c := t[byte(d>>8)]
	c = c>>8 ^ t[byte(c)^byte(d)]
	return multModP(uint32(s), c)
}

// IPv4IDTail returns the number of bytes the ICRC covers after the IPv4
// identification field of a packet of ipLen bytes from the start of its
// IP header through its ICRC.
func IPv4IDTail(ipLen int) int { return ipLen - ipv4ID - 2 - ICRCLen }

// SetIPv4ID sets the identification of the RoCE v2 IPv4 packet ip (IP
// header through ICRC, with a valid header checksum and ICRC) to id and
// updates its header checksum and its ICRC to match, without reading the
// payload: the packet is then the one Build writes with Headers.IPID = id.
// ip must hold a whole packet (the caller checked the lengths).
func SetIPv4ID(ip []byte, id uint16) {
	h := IPv4(ip)
	old := h.ID()
	if old == id {
		return
	}
	icrc := ip[len(ip)-ICRCLen:]
	putICRC(icrc, getICRC(icrc)^NewICRCShift(IPv4IDTail(len(ip))).IPv4IDDelta(old, id))
	h.SetID(id)
	h.SetChecksum(h.CalculateChecksum())
}

// StoredICRC returns the ICRC stored in the last four bytes of pkt.
func StoredICRC(pkt []byte) uint32 { return binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:]) }
