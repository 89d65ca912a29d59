package roce

import (
	"encoding/binary"
	"hash/crc32"
	"math/bits"
	"net/netip"
)

// The invariant CRC (IBTA vol. 1, Annex A17.3.3 for RoCE v2): CRC-32 with
// the IEEE 802.3 polynomial, computed as if the packet were preceded by 8
// bytes of 0xFF (the place of the InfiniBand LRH), over
//
//	IP header | UDP header | BTH | extension headers | payload | pad
//
// with the fields that routers may change taken as all ones:
//
//	IPv4: Type of Service, Time to Live, Header Checksum
//	IPv6: Traffic Class, Flow Label, Hop Limit
//	UDP:  Checksum
//	BTH:  byte 4 (FECN, BECN, Resv6a)
//
// The result is the usual (inverted) CRC-32 value, stored in the last four
// bytes of the packet least significant byte first: Linux rxe stores the
// CPU-order value and every RoCE v2 NIC agrees (checked against real
// captures in the tests).
//
// Speed: the state after the 8 0xFF bytes is computed once (icrcSeed).
// Per packet the CRC runs in one pass over the packet in place, the
// packet never written: crcMasked reads the bytes, ORs a per-layout mask
// (icrcMasks, icrcBTHMask) into the first icrcMaskLen of them as they
// are loaded, and feeds them to the CRC. On amd64 with PCLMULQDQ and
// SSE4.1 that is assembly (icrc_amd64.s). Under 128 bytes (an ACK, a
// small WRITE, any packet's headers) it is icrcShort: one 128-bit lane
// folded 16 bytes a step with carry-less multiplies, the mask OR-ed into
// each block as it is loaded, the under-16-byte tail shuffled and
// blended into a last block, and a Barrett reduction: a few multiplies
// and no table lookups. On the UDP link it also takes the pseudo IP/UDP
// header, composed in Go as 8-byte words (crcPseudoHead), ahead of the
// transport packet, all in one call. From 128 bytes it is icrcFold,
// folding 4 x 128-bit lanes, the mask OR-ed in registers as the first
// two 64-byte blocks are loaded; with AVX-512 VPCLMULQDQ, from
// icrcFoldWideMin bytes, the same routine folds four zmm registers (16
// lanes, 256 bytes a step) instead. The wide form matters because
// hash/crc32 itself uses VPCLMULQDQ on such CPUs from 1 KiB, where
// 128-bit PCLMULQDQ alone runs at about half its speed. The folded state
// is reduced to 32 bits in the assembly (a Barrett reduction); icrcFold's
// under-16-byte tail finishes in Go with slicing steps. A packet whose
// payload is copied in (Framer) has its ICRC computed as it is copied:
// icrcFoldCopy stores every block it loads, the headers' part coming
// from icrcShort over the just written headers (crcHead, crcPseudoHead),
// the state chained from piece to piece (crcCopy). Without PCLMULQDQ
// (and for buffers under 16 bytes), the masked prefix is read as 8-byte
// words, OR-ed in registers and fed to slicing-by-16 steps in Go, the
// rest going to crc32.Update.
// Alternatives measured slower: a masked copy on the stack handed to
// crc32.Update escapes to the heap (hash/crc32 calls its implementation
// through a function value); storing masked bytes (in place or in a copy)
// before loading them as wider words stalls on store forwarding; splitting
// the packet into a Go prefix and a second crc32.Update call pays that
// call's fixed cost (~35 ns) per packet.

// icrcSeed is the CRC-32 of 8 bytes of 0xFF.
var icrcSeed = crc32.Update(0, crc32.IEEETable, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})

// icrcMaskLen is the length of a mask: two 64-byte blocks, enough for
// IPv4 with options (60) + UDP (8) + BTH (12) and for IPv6 (40) + UDP + BTH.
// Mask bytes past the variant fields are zero.
const icrcMaskLen = 128

// icrcMask holds ones at the ICRC-variant bits of the first bytes of a
// buffer, zeros elsewhere.
type icrcMask = [icrcMaskLen]byte

// maskIPv4 sets the ICRC-variant fields of the IPv4 header h to ones.
func maskIPv4(h []byte) {
	h[ipv4TOS] = 0xff
	h[ipv4TTL] = 0xff
	h[ipv4Checksum] = 0xff
	h[ipv4Checksum+1] = 0xff
}

// maskIPv6 sets the ICRC-variant fields of the IPv6 header h to ones.
func maskIPv6(h []byte) {
	h[0] |= 0x0f
	h[1] = 0xff
	h[2] = 0xff
	h[3] = 0xff
	h[ipv6HopLimit] = 0xff
}

// icrcMasks[ihl] (IHL 5..15) and icrcMasks[16] (IPv6) hold ones at the
// variant bits of IP header, UDP header and BTH for each header layout.
var icrcMasks = func() (m [17]icrcMask) {
	for ihl := 5; ihl <= 15; ihl++ {
		mk := m[ihl][:]
		maskIPv4(mk)
		u := ihl * 4
		mk[u+udpChecksum], mk[u+udpChecksum+1] = 0xff, 0xff
		mk[u+UDPHeaderLen+bthFB] = 0xff
	}
	mk := m[16][:]
	mk[0] = 0x0f // the low nibble: top of the traffic class
	maskIPv6(mk)
	u := IPv6HeaderLen
	mk[u+udpChecksum], mk[u+udpChecksum+1] = 0xff, 0xff
	mk[u+UDPHeaderLen+bthFB] = 0xff
	return m
}()

// icrcBTHMask masks BTH byte 4 of a buffer starting at BTH byte 0: the
// transport packet after a pseudo header.
var icrcBTHMask = icrcMask{bthFB: 0xff}

// icrcIP returns the ICRC of pkt, an IP packet (IPv4 when v6 is false,
// with header length iphl) holding UDP and a transport packet through the
// pad, without the ICRC itself. The caller has checked the lengths. pkt
// is only read.
func icrcIP(pkt []byte, v6 bool, iphl int) uint32 {
	mk := &icrcMasks[16]
	if !v6 {
		mk = &icrcMasks[iphl>>2&0xf]
	}
	if useFold && uint(len(pkt)-icrcShortMin) <= icrcShortMax-icrcShortMin {
		return ^icrcShort(^icrcSeed, nil, 0, pkt, mk) // crcMasked's choice, one call less
	}
	// The variant bits end at BTH byte 4, at most iphl + UDP + BTH.
	m := (iphl + UDPHeaderLen + bthFB + 1 + 7) &^ 7
	return ^crcMasked(^icrcSeed, pkt, mk, m)
}

// crcMaskedGeneric is crcMasked in portable Go: the first m bytes (m a
// multiple of 8, at most icrcMaskLen and len(p)) are read as 8-byte
// words, OR-ed with mk and fed to slicing-by-16 steps; the rest goes to
// hash/crc32 in place, or under 64 bytes to slicing steps too.
func crcMaskedGeneric(c uint32, p []byte, mk *icrcMask, m int) uint32 {
	c = crcMaskedWords(c, p[:m], mk)
	if rest := p[m:]; len(rest) < 64 {
		// Slicing steps beat hash/crc32's fixed cost per call here (an
		// ACK: 44 bytes, 4 past the mask).
		return crcWords(c, rest)
	}
	return ^crc32.Update(^c, crc32.IEEETable, p[m:])
}

// crcWords returns the raw CRC-32 state after c over b in slicing-by-16
// steps: for the few bytes of headers, where hash/crc32's fixed cost per
// call would dominate.
func crcWords(c uint32, b []byte) uint32 {
	le := binary.LittleEndian
	for len(b) >= 16 {
		c = crcWord2(c, le.Uint64(b), le.Uint64(b[8:]))
		b = b[16:]
	}
	return crcTail(c, b)
}

// crcHeadGeneric is crcHead in portable Go: the first m bytes of p OR-ed
// with mk, the rest plain, all in slicing-by-16 steps.
func crcHeadGeneric(c uint32, p []byte, mk *icrcMask, m int) uint32 {
	return crcWords(crcMaskedWords(c, p[:m], mk), p[m:])
}

// crcMaskedWords returns the raw CRC-32 state after c over h (its length
// a multiple of 8, at most icrcMaskLen) with mk OR-ed in, read as 8-byte
// words in slicing-by-16 steps.
func crcMaskedWords(c uint32, h []byte, mk *icrcMask) uint32 {
	le := binary.LittleEndian
	i := 0
	for ; i+16 <= len(h); i += 16 {
		c = crcWord2(c, le.Uint64(h[i:])|le.Uint64(mk[i:]), le.Uint64(h[i+8:])|le.Uint64(mk[i+8:]))
	}
	if i < len(h) {
		c = crcWord(c, le.Uint64(h[i:])|le.Uint64(mk[i:]))
	}
	return c
}

// crcCopyChunk is how much crcCopyGeneric copies before it reads the
// copy back: small enough that the bytes are still in the L1 cache.
const crcCopyChunk = 2048

// crcCopyGeneric is crcCopy in portable Go: copy a chunk, then CRC the
// copy (dst, daemon memory: the CRC covers exactly the bytes stored even
// if src, client memory, changes meanwhile).
func crcCopyGeneric(c uint32, dst, src []byte) uint32 {
	dst = dst[:len(src)]
	for len(src) > 0 {
		k := min(len(src), crcCopyChunk)
		d := dst[:k]
		copy(d, src[:k])
		if k < 64 {
			c = crcWords(c, d)
		} else {
			c = ^crc32.Update(^c, crc32.IEEETable, d)
		}
		dst, src = dst[k:], src[k:]
	}
	return c
}

// crcTail advances the raw CRC-32 state c over b, fewer than 16 bytes, in
// at most four slicing steps (8, 4, 2, 1 bytes).
func crcTail(c uint32, b []byte) uint32 {
	le := binary.LittleEndian
	t := &crcTab
	if len(b) >= 8 {
		c = crcWord(c, le.Uint64(b))
		b = b[8:]
	}
	if len(b) >= 4 {
		c ^= le.Uint32(b)
		c = t[0][c>>24] ^ t[1][c>>16&0xff] ^ t[2][c>>8&0xff] ^ t[3][c&0xff]
		b = b[4:]
	}
	if len(b) >= 2 {
		c ^= uint32(le.Uint16(b))
		c = c>>16 ^ t[0][c>>8&0xff] ^ t[1][c&0xff]
		b = b[2:]
	}
	if len(b) >= 1 {
		c = c>>8 ^ t[0][byte(c)^b[0]]
	}
	return c
}

// crcTab are the slicing-by-16 tables of the IEEE polynomial: crcTab[k][b]
// is the CRC contribution of byte b followed by k zero bytes.
var crcTab = func() (t [16][256]uint32) {
	t[0] = *crc32.MakeTable(crc32.IEEE)
	for i := 1; i < 16; i++ {
		for j := range 256 {
			c := t[i-1][j]
			t[i][j] = c>>8 ^ t[0][c&0xff]
		}
	}
	return t
}()

// crcWord advances the raw (not inverted) CRC-32 state c over the 8 bytes
// of w, first byte in the low bits (little-endian load order): one step of
// slicing-by-8. Working on words built in registers avoids storing masked
// bytes and loading them back (a store-forwarding stall per word).
func crcWord(c uint32, w uint64) uint32 {
	t := &crcTab
	c ^= uint32(w)
	h := uint32(w >> 32)
	return t[0][h>>24] ^ t[1][h>>16&0xff] ^ t[2][h>>8&0xff] ^ t[3][h&0xff] ^
		t[4][c>>24] ^ t[5][c>>16&0xff] ^ t[6][c>>8&0xff] ^ t[7][c&0xff]
}

// crcWord2 is crcWord over w0 then w1 in one slicing-by-16 step: the 16
// lookups are independent, so the chain of dependent steps is halved.
func crcWord2(c uint32, w0, w1 uint64) uint32 {
	t := &crcTab
	c ^= uint32(w0)
	h0 := uint32(w0 >> 32)
	l1, h1 := uint32(w1), uint32(w1>>32)
	return t[15][c&0xff] ^ t[14][c>>8&0xff] ^ t[13][c>>16&0xff] ^ t[12][c>>24] ^
		t[11][h0&0xff] ^ t[10][h0>>8&0xff] ^ t[9][h0>>16&0xff] ^ t[8][h0>>24] ^
		t[7][l1&0xff] ^ t[6][l1>>8&0xff] ^ t[5][l1>>16&0xff] ^ t[4][l1>>24] ^
		t[3][h1&0xff] ^ t[2][h1>>8&0xff] ^ t[1][h1>>16&0xff] ^ t[0][h1>>24]
}

// netWord places the 16-bit value v in network byte order in the low two
// bytes of a little-endian word.
func netWord(v uint64) uint64 { return uint64(bits.ReverseBytes16(uint16(v))) }

// Pseudo is the pseudo IP and UDP header over which the UDP link
// (ModeUDP) computes the ICRC, since the kernel, not vrnic, writes the real
// ones. Both ends must use the same values; with the addresses and ports
// of the socket pair that is automatic (the sender uses local, peer; the
// receiver peer, local as reported by recvmsg). A link may instead fix
// the addresses to the zero value to survive NAT: the kernel's UDP
// checksum still covers the real ones.
//
// The header is built with these fixed values:
//
//	IPv4 (when neither address is native IPv6): version 4, IHL 5, TOS
//	     masked, Total Length = 28 + transport length, Identification 0,
//	     Flags/Fragment 0x4000 (DF), TTL masked, Protocol 17, Checksum
//	     masked, Src, Dst (0.0.0.0 when invalid);
//	IPv6 (when either address is native IPv6): version 6, Traffic Class
//	     and Flow Label masked, Payload Length = 8 + transport length,
//	     Next Header 17, Hop Limit masked, Src, Dst (:: when invalid);
//	UDP: SrcPort, DstPort (4791 when 0), Length = 8 + transport length,
//	     Checksum masked.
//
// The transport length runs from the BTH through the ICRC. IPv4-mapped
// IPv6 addresses count as IPv4. The result is the ICRC a full RoCE v2
// frame with exactly those IP and UDP headers would carry (a test checks
// this), so a capture tool can rebuild verifiable frames from a UDP link.
type Pseudo struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
}

// icrcPseudo returns the ICRC of body (BTH..pad) under pseudo header ps
// (see Pseudo for the values). body is only read.
func icrcPseudo(ps *Pseudo, body []byte) uint32 {
	return ^crcPseudoHead(ps, body, len(body)+ICRCLen)
}

// icrcShortMin and icrcShortMax bound the buffers icrcShort (amd64)
// takes: a whole block up to the mask's length.
const (
	icrcShortMin = 16
	icrcShortMax = icrcMaskLen
)

// pseudoHdr is a pseudo header as the CRC reads it: 16-byte blocks of two
// little-endian 8-byte words each (load order: the first byte in the low
// bits). Over IPv6 it is the 48 bytes of the IPv6 and UDP headers, three
// blocks; over IPv4 the 28 bytes of the IPv4 and UDP headers preceded by
// 4 zero bytes, two blocks, so that the transport packet after it starts
// on a block boundary. The zero bytes do not change the CRC: the state
// the CRC starts with over IPv4 is icrcSeed4, the one that 4 zero bytes
// take to the usual ^icrcSeed.
type pseudoHdr [6]uint64

// icrcSeed4 is the raw CRC state that 4 zero bytes take to ^icrcSeed.
var icrcSeed4 = crcUnshift(^icrcSeed, 4)

// crcUnshift returns the raw CRC-32 state that n zero bytes take to c:
// the CRC's step over a zero bit, c>>1 ^ (c&1)*crcPoly, run backwards
// (crcPoly has its top bit set, so the top bit of a stepped state tells
// whether the polynomial was added).
func crcUnshift(c uint32, n int) uint32 {
	for range 8 * n {
		if c&(1<<31) != 0 {
			c = (c^crcPoly)<<1 | 1
		} else {
			c <<= 1
		}
	}
	return c
}

// crcPseudoHead returns the raw CRC-32 state after the pseudo header of
// ps for a transport packet of tlen bytes (BTH through ICRC) and then
// body, its first bytes (at least BTHLen), BTH byte 4 masked. The pseudo
// header is composed as 8-byte words (see pseudoHdr); with PCLMULQDQ, a
// short body goes with them to one icrcShort call, and otherwise to
// crcPseudoLong. The addresses are read once each in their 16-byte
// form (netip.Addr.As16: IPv4 and IPv4-mapped IPv6 alike as
// ::ffff:a.b.c.d, an invalid address as zeros), which tells IPv4 from
// IPv6 without converting them.
func crcPseudoHead(ps *Pseudo, body []byte, tlen int) uint32 {
	var h pseudoHdr
	c, nh := ps.compose(&h, tlen)
	if useFold && uint(len(body)-icrcShortMin) <= icrcShortMax-icrcShortMin {
		return icrcShort(c, &h, nh, body, &icrcBTHMask)
	}
	return crcPseudoLong(c, &h, nh, body)
}

// compose writes ps's pseudo header for a transport packet of tlen bytes
// (BTH through ICRC) into h and returns the CRC state it starts from and
// its number of blocks.
func (ps *Pseudo) compose(h *pseudoHdr, tlen int) (c uint32, nh int) {
	ul := uint64(UDPHeaderLen + tlen) // UDP length
	dp := uint64(ps.DstPort)
	if dp == 0 {
		dp = UDPPort
	}
	// source port | destination port | UDP length | checksum ff ff
	udp := netWord(uint64(ps.SrcPort)) | netWord(dp)<<16 | netWord(ul)<<32 | 0xffff<<48
	s0, s1 := addrWords(ps.Src)
	d0, d1 := addrWords(ps.Dst)
	if native6(ps.Src, s0, s1) || native6(ps.Dst, d0, d1) {
		// 6f ff ff ff | payload length | next header 17 | hop limit ff
		h[0] = 0x6f | 0xffffff<<8 | netWord(ul)<<32 | ProtocolUDP<<48 | 0xff<<56
		h[1], h[2], h[3], h[4] = s0, s1, d0, d1
		h[5] = udp
		return ^icrcSeed, 3
	}
	// 00 00 00 00 | 45 ff | total length
	h[0] = 0x45<<32 | 0xff<<40 | netWord(IPv4HeaderLen+ul)<<48
	// id 0 | 40 00 (DF) | ttl ff | protocol 17 | checksum ff ff
	h[1] = 0x40<<16 | 0xff<<32 | ProtocolUDP<<40 | 0xffff<<48
	// source | destination: the last 4 bytes of each 16-byte form
	h[2] = s1>>32 | d1&^0xffffffff
	h[3] = udp
	return icrcSeed4, 2
}

// crcBody returns the raw CRC-32 state after c over body (at least
// BTHLen bytes, BTH byte 4 masked): the rest of a packet whose pseudo
// header c has taken.
func crcBody(c uint32, body []byte) uint32 {
	if useFold && uint(len(body)-icrcShortMin) <= icrcShortMax-icrcShortMin {
		return icrcShort(c, nil, 0, body, &icrcBTHMask)
	}
	return crcMasked(c, body, &icrcBTHMask, 8)
}

// PseudoTx is a sender's pseudo header state: the pseudo header and
// transport length of the last packet it sent and, from the second packet
// in a row that has them both, the raw CRC-32 state after that pseudo
// header. A stream of like packets (a QP's small WRITEs, a worker's ACKs
// to one peer) then has its ICRC from the transport packet alone, and a
// packet unlike the last costs what it would without a PseudoTx. The zero
// value is ready; a PseudoTx is not for concurrent use.
type PseudoTx struct {
	ps   Pseudo
	tlen int    // 0: none yet
	c    uint32 // when ok
	ok   bool

	// ModeEthernet (Path.ShortOffset, Path.BuildShort): the link headers
	// of the last path, and the transport length of the last packet and,
	// from the second in a row, the CRC state after its IP and UDP
	// headers. at is the path ShortOffset last prepared them for, as an
	// address: ShortOffset and BuildShort check it, and it holds nothing
	// alive.
	tmpl  linkTemplate
	at    uintptr
	etlen int
	ec    uint32
	eok   bool
}

// crc is crcPseudoHead through t.
func (t *PseudoTx) crc(ps *Pseudo, body []byte, tlen int) uint32 {
	if t.tlen == tlen && t.ps.same(ps) {
		if !t.ok {
			t.c, t.ok = ps.state(tlen), true
		}
		return crcBody(t.c, body)
	}
	t.ps, t.tlen, t.ok = *ps, tlen, false
	return crcPseudoHead(ps, body, tlen)
}

// same reports whether ps and q are equal, field by field (== on the
// struct is a call to compare memory).
func (ps *Pseudo) same(q *Pseudo) bool {
	return ps.SrcPort == q.SrcPort && ps.DstPort == q.DstPort && ps.Src == q.Src && ps.Dst == q.Dst
}

// icrc is icrcPseudo through t.
func (t *PseudoTx) icrc(ps *Pseudo, body []byte) uint32 {
	return ^t.crc(ps, body, len(body)+ICRCLen)
}

// state returns the raw CRC-32 state after ps's pseudo header for a
// transport packet of tlen bytes.
func (ps *Pseudo) state(tlen int) uint32 {
	var h pseudoHdr
	c, nh := ps.compose(&h, tlen)
	return crcPseudoWords(c, &h, nh)
}

// PseudoRx is the pseudo header (see Pseudo) of the datagrams received on
// one local address and port, with a PseudoTx's memory of the last
// datagram: its source and transport length and, from the second datagram
// in a row that has them both, the raw CRC-32 state after its pseudo
// header (one peer's small WRITEs, or its ACKs, have the same). A
// PseudoRx is not for concurrent use.
type PseudoRx struct {
	local netip.AddrPort
	from  netip.AddrPort
	tlen  int    // 0: none yet
	c     uint32 // when ok
	ok    bool
}

// NewPseudoRx returns the PseudoRx of datagrams received on local.
func NewPseudoRx(local netip.AddrPort) PseudoRx {
	return PseudoRx{local: local}
}

// crc is crcPseudoHead for a transport packet of tlen bytes from from
// whose first bytes are body.
func (r *PseudoRx) crc(from netip.AddrPort, body []byte, tlen int) uint32 {
	if r.tlen == tlen && r.from.Port() == from.Port() && r.from.Addr() == from.Addr() {
		if !r.ok {
			ps := r.pseudo(from)
			r.c, r.ok = ps.state(tlen), true
		}
		return crcBody(r.c, body)
	}
	r.from, r.tlen, r.ok = from, tlen, false
	ps := r.pseudo(from)
	return crcPseudoHead(&ps, body, tlen)
}

// pseudo returns the pseudo header of a datagram from from.
func (r *PseudoRx) pseudo(from netip.AddrPort) Pseudo {
	return Pseudo{Src: from.Addr(), Dst: r.local.Addr(), SrcPort: from.Port(), DstPort: r.local.Port()}
}

// addrWords returns the 16-byte form of a (netip.Addr.As16) as two
// little-endian words.
func addrWords(a netip.Addr) (w0, w1 uint64) {
	b := a.As16()
	return binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])
}

// native6 reports whether a, whose 16-byte form read as two little-endian
// words is w0, w1, is a native IPv6 address: valid and not ::ffff:0:0/96
// (what Unmap turns into IPv4).
func native6(a netip.Addr, w0, w1 uint64) bool {
	return a.IsValid() && (w0 != 0 || uint32(w1) != 0xffff0000)
}

// crcPseudoWords returns the raw CRC-32 state after c over the first nh
// blocks of h, in slicing-by-16 steps.
func crcPseudoWords(c uint32, h *pseudoHdr, nh int) uint32 {
	for i := range nh {
		c = crcWord2(c, h[2*i], h[2*i+1])
	}
	return c
}

// crcPseudoGeneric is crcPseudoLong in portable Go.
func crcPseudoGeneric(c uint32, h *pseudoHdr, nh int, body []byte) uint32 {
	return crcMaskedGeneric(crcPseudoWords(c, h, nh), body, &icrcBTHMask, 8)
}

// putICRC stores crc little-endian at b[0:4].
func putICRC(b []byte, crc uint32) { binary.LittleEndian.PutUint32(b, crc) }

// getICRC loads the little-endian ICRC at b[0:4].
func getICRC(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
