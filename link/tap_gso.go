package link

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"

	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/tap"
)

// UDP segmentation offload on the TAP link (IFF_VNET_HDR, TUN_F_USO4/6).
//
// Send: consecutive frames of one SendBatch that differ only in what the
// kernel's segmentation rewrites (same Ethernet header, same IP header
// but for identification, lengths and checksum, same UDP ports, same BTH
// destination QP), of one length but a shorter last, at most
// tapGSOMaxSegs and an IP datagram of at most 64 KiB, go as one write: a
// virtio-net header (GSO_UDP_L4, gso_size = one frame's UDP payload,
// NEEDS_CSUM at the UDP checksum), the first frame's headers with the
// lengths of the whole datagram, a correct IPv4 header checksum and the
// UDP pseudo-header sum, then the UDP payloads (BTH..ICRC) of every frame.
// The kernel forwards it whole where the next device takes USO (the
// bridge, a peer TAP with the offload) and cuts it into one frame per
// payload where not (inet_gso_segment, __udp_gso_segment), writing into
// segment k: the first frame's headers, its own IP and UDP lengths, IPv4
// identification first+k, a fresh IPv4 header checksum and a full UDP
// checksum. Every field the ICRC covers is therefore known here: the link
// gives frame k of a run the identification first+k (roce ICRCShift: the
// ICRC is updated for the new value without reading the payload; the
// caller's frame is not written, the new ICRC goes in a private 4-byte
// part of the write). The segments are then, byte for byte, the frames a
// write per frame would have put on the wire with those identifications,
// except the IPv4 UDP checksum: a segment always carries a full one
// (NEEDS_CSUM is mandatory for GSO_UDP_L4) where the engine writes 0 over
// IPv4. The ICRC masks the UDP checksum; both are valid RoCE v2.
//
// Receive: a read returns a virtio-net header and a frame, or, when a
// sender wrote a segmented packet and nothing on the way cut it, the whole
// packet (gso_type GSO_UDP_L4). The port reads into the worker's buffer
// with a private overflow buffer behind it, keeps the first segment in
// place and copies the others into the next buffers, rebuilding each
// segment's headers as the kernel's segmentation would have written them
// (identification first+k, lengths, IPv4 header checksum, full UDP
// checksum), so the engine's parser checks every ICRC over the headers
// the sender computed it for. Segments that do not fit the caller's batch
// wait in the overflow buffer for the next call. A frame with a partial
// checksum (NEEDS_CSUM, the kernel's own UDP traffic through a TAP that
// takes checksum offload) gets its checksum completed as
// skb_checksum_help would. Anything inconsistent is dropped and counted
// (RxBad). See kernel-notes/tap-offload.md.

const (
	// tapGSOMaxSegs is the most frames the link puts in one segmented
	// write (the kernel's UDP_MAX_SEGMENTS before Linux 6.9).
	tapGSOMaxSegs = 64
	// tapGSORxMaxSegs is the most segments a received packet may hold
	// (UDP_MAX_SEGMENTS since 6.9); more is dropped as bad input.
	tapGSORxMaxSegs = 128
	// ipMaxLen is the largest IP datagram (IPv4 total length; the IPv6
	// payload length is held to the same).
	ipMaxLen = 0xffff
	// maxL234 holds Ethernet with one 802.1Q tag, IPv4 with options and
	// UDP (86 bytes).
	maxL234 = roce.EthernetHeaderLen + roce.VLANTagLen + 60 + roce.UDPHeaderLen
	// overflowLen is what a read may put after the worker's buffer: any
	// IP datagram with its Ethernet header.
	overflowLen = ipMaxLen + roce.EthernetHeaderLen + roce.VLANTagLen
)

// tapPacketQueue is what the offload needs from a queue (tap.Queue).
type tapPacketQueue interface {
	TryReadPacket(parts [][]byte) (int, error)
	WritePacket(parts [][]byte) error
}

// hdrs locates the headers of an Ethernet frame holding IPv4 or IPv6 UDP.
type hdrs struct {
	l3, l4, hl int // IP header, UDP header, end of the UDP header
	v6         bool
}

// parseHdrs reads the headers of frame: Ethernet (one 802.1Q tag at
// most), IPv4 (not a fragment) or IPv6 without extension headers, UDP.
// It checks no length field.
func parseHdrs(frame []byte) (h hdrs, ok bool) {
	eth := roce.Ethernet(frame)
	if !eth.IsValid() {
		return h, false
	}
	h.l3 = eth.HeaderLen()
	ip := frame[h.l3:]
	switch eth.Type() {
	case roce.EtherTypeIPv4:
		v4 := roce.IPv4(ip)
		if !v4.IsValid() || v4.Version() != 4 || v4.HeaderLen() < roce.IPv4HeaderLen || v4.Protocol() != roce.ProtocolUDP || v4.IsFragment() {
			return h, false
		}
		h.l4 = h.l3 + v4.HeaderLen()
	case roce.EtherTypeIPv6:
		v6 := roce.IPv6(ip)
		if !v6.IsValid() || v6.Version() != 6 || v6.NextHeader() != roce.ProtocolUDP {
			return h, false
		}
		h.l4, h.v6 = h.l3+roce.IPv6HeaderLen, true
	default:
		return h, false
	}
	h.hl = h.l4 + roce.UDPHeaderLen
	return h, len(frame) >= h.hl
}

// lengthsMatch reports whether the IP and UDP length fields of frame
// (headers h) describe exactly its len bytes.
func lengthsMatch(frame []byte, h hdrs) bool {
	ulen := len(frame) - h.l4
	if roce.UDP(frame[h.l4:]).Length() != uint16(ulen) || ulen > ipMaxLen {
		return false
	}
	if h.v6 {
		return roce.IPv6(frame[h.l3:]).PayloadLength() == uint16(ulen)
	}
	return int(roce.IPv4(frame[h.l3:]).TotalLength()) == len(frame)-h.l3
}

// gsoHead checks that frame (a frame the engine built) can start a
// segmented write: RoCE v2 (UDP to 4791, a BTH and an ICRC after the UDP
// header) with consistent lengths.
func gsoHead(frame []byte) (hdrs, bool) {
	h, ok := parseHdrs(frame)
	if !ok || len(frame) < h.hl+roce.BTHLen+roce.ICRCLen || !lengthsMatch(frame, h) ||
		roce.UDP(frame[h.l4:]).DstPort() != roce.UDPPort {
		return h, false
	}
	return h, true
}

// sameFlow reports whether g can follow f (headers h) in one segmented
// write: equal in everything the kernel copies from the first segment
// (Ethernet header, IP header but identification, lengths and checksum,
// UDP ports) and for the same BTH destination QP, with g's own lengths
// consistent.
func sameFlow(f, g []byte, h hdrs) bool {
	if len(g) < h.hl+roce.BTHLen+roce.ICRCLen || !bytes.Equal(f[:h.l3], g[:h.l3]) {
		return false
	}
	a, b := f[h.l3:h.l4], g[h.l3:h.l4]
	if h.v6 {
		if !bytes.Equal(a[0:4], b[0:4]) || !bytes.Equal(a[6:], b[6:]) {
			return false
		}
	} else if !bytes.Equal(a[0:2], b[0:2]) || !bytes.Equal(a[6:10], b[6:10]) || !bytes.Equal(a[12:], b[12:]) {
		return false
	}
	if !bytes.Equal(f[h.l4:h.l4+4], g[h.l4:h.l4+4]) || !sameDestQP(f[h.hl:], g[h.hl:]) {
		return false
	}
	return lengthsMatch(g, h)
}

// udpPseudoSum returns the folded one's complement sum of the UDP pseudo
// header of the IP header ip (headers h) for a UDP length of ulen: what a
// UDP header's checksum field holds while the checksum is partial
// (CHECKSUM_PARTIAL; the kernel's ~csum_tcpudp_magic / ~csum_ipv6_magic).
func udpPseudoSum(ip []byte, v6 bool, ulen int) uint16 {
	var s uint32
	addrs := ip[12:20]
	if v6 {
		addrs = ip[8:40]
	}
	for i := 0; i < len(addrs); i += 2 {
		s += uint32(binary.BigEndian.Uint16(addrs[i:]))
	}
	s += roce.ProtocolUDP + uint32(ulen)
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

// fixSegment rewrites the headers of seg (headers h, copied from the
// first segment of a segmented packet) for its own length and
// identification id (IPv4), as the kernel's segmentation writes them:
// IP total or payload length, identification, header checksum, UDP
// length, full UDP checksum (0 is sent as 0xffff).
func fixSegment(seg []byte, h hdrs, id uint16) {
	ulen := len(seg) - h.l4
	u := roce.UDP(seg[h.l4:])
	u.SetLength(uint16(ulen))
	if h.v6 {
		ip := roce.IPv6(seg[h.l3:])
		ip.SetPayloadLength(uint16(ulen))
		u.SetChecksum(roce.UDPChecksum(ip[8:24], ip[24:40], seg[h.l4:]))
		return
	}
	ip := roce.IPv4(seg[h.l3:])
	ip.SetTotalLength(uint16(len(seg) - h.l3))
	ip.SetID(id)
	ip.SetChecksum(ip.CalculateChecksum())
	u.SetChecksum(roce.UDPChecksum(ip[12:16], ip[16:20], seg[h.l4:]))
}

// completeCsum finishes a partial checksum (NEEDS_CSUM) of frame as
// skb_checksum_help does: the checksum of frame[start:] with the partial
// sum in place, stored at start+off (0 as 0xffff). False if the offsets
// do not fit the frame.
func completeCsum(frame []byte, start, off int) bool {
	if start < roce.EthernetHeaderLen || off < 0 || start+off+2 > len(frame) {
		return false
	}
	c := roce.Checksum(frame[start:])
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(frame[start+off:], c)
	return true
}

// tapGSO is a port's offload state (owner-private).
type tapGSO struct {
	q tapPacketQueue

	// Send.
	off    bool // the kernel refused a segmented write: one frame per write
	whdr   [tap.VnetHdrLen + maxL234]byte
	zero   [tap.VnetHdrLen]byte
	icrc   [tapGSOMaxSegs][roce.ICRCLen]byte
	wparts [][]byte
	shifts [2]struct {
		tail  int
		shift roce.ICRCShift
	}

	// Receive.
	rhdr   [tap.VnetHdrLen]byte
	over   []byte // indexed by packet offset: a read fills over[fcap:]
	rparts [3][]byte
	// The segments of a received packet not yet handed out.
	pend     bool
	ph       hdrs
	tmpl     [maxL234]byte
	gsoSize  int
	id0      uint16
	nextSeg  int
	pendData []byte // their payloads, in order (in over)
}

func newTapGSO(q tapPacketQueue, fcap int) *tapGSO {
	return &tapGSO{
		q:      q,
		wparts: make([][]byte, 0, 2+2*tapGSOMaxSegs),
		over:   make([]byte, fcap+overflowLen),
	}
}

// shift returns the ICRC shift over tail bytes, from a two-entry cache
// (a run has at most two frame lengths).
func (g *tapGSO) shift(tail int) roce.ICRCShift {
	for i := range g.shifts {
		if g.shifts[i].tail == tail && g.shifts[i].shift != 0 {
			return g.shifts[i].shift
		}
	}
	s := roce.NewICRCShift(tail)
	g.shifts[1] = g.shifts[0]
	g.shifts[0].tail, g.shifts[0].shift = tail, s
	return s
}

// runLen returns how many frames from frames[0] (headers h, a valid run
// head) one segmented write can carry, and the IP datagram length.
func runLen(frames [][]byte, h hdrs) (n, ipLen int) {
	f := frames[0]
	ipLen = len(f) - h.l3
	n = 1
	for n < len(frames) && n < tapGSOMaxSegs {
		g := frames[n]
		if len(g) > len(f) || ipLen+len(g)-h.hl > ipMaxLen || !sameFlow(f, g, h) {
			break
		}
		ipLen += len(g) - h.hl
		n++
		if len(g) < len(f) {
			break // a shorter frame ends the run
		}
	}
	return n, ipLen
}

// sendOffload is SendBatch on a port with the offload.
func (p *TAPPort) sendOffload(frames [][]byte) (int, error) {
	g := p.gso
	c := &p.Counters
	for i := 0; i < len(frames); {
		n, ipLen := 1, 0
		h, ok := gsoHead(frames[i])
		if ok && !g.off {
			n, ipLen = runLen(frames[i:], h)
		}
		if n > 1 {
			err := p.writeRun(frames[i:i+n], h, ipLen)
			if err == nil {
				c.TxGSO.Add(1)
				c.TxGSOFrames.Add(uint64(n))
				c.TxFrames.Add(uint64(n))
				c.TxBytes.Add(uint64(ipLen + h.l3 + (n-1)*h.hl))
				i += n
				continue
			}
			if errors.Is(err, os.ErrClosed) {
				return i, errTAPClosed(err)
			}
			// The kernel refused the segmented packet: from now on one
			// frame per write, starting with these.
			g.off = true
			p.link.gsoRefused(p.index, err)
			n = 1
		}
		g.wparts = append(g.wparts[:0], g.zero[:], frames[i])
		if err := g.q.WritePacket(g.wparts); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return i, errTAPClosed(err)
			}
			c.TxErrors.Add(1) // dropped
		} else {
			c.TxFrames.Add(1)
			c.TxBytes.Add(uint64(len(frames[i])))
		}
		i++
	}
	return len(frames), nil
}

// writeRun writes frames (a run: runLen) as one segmented packet of an
// IP datagram of ipLen bytes.
func (p *TAPPort) writeRun(frames [][]byte, h hdrs, ipLen int) error {
	g := p.gso
	f := frames[0]
	vh := tap.VnetHdr{
		Flags: tap.VnetFlagNeedsCsum, GSOType: tap.VnetGSOUDPL4, HdrLen: uint16(h.hl),
		GSOSize: uint16(len(f) - h.hl), CsumStart: uint16(h.l4), CsumOffset: 6,
	}
	vh.Encode(g.whdr[:])
	hp := g.whdr[:tap.VnetHdrLen+h.hl]
	head := hp[tap.VnetHdrLen:]
	copy(head, f[:h.hl])
	ip := head[h.l3:]
	ulen := ipLen - (h.l4 - h.l3)
	if h.v6 {
		roce.IPv6(ip).SetPayloadLength(uint16(ulen))
	} else {
		v4 := roce.IPv4(ip)
		v4.SetTotalLength(uint16(ipLen))
		v4.SetChecksum(v4.CalculateChecksum())
	}
	u := roce.UDP(head[h.l4:])
	u.SetLength(uint16(ulen))
	u.SetChecksum(udpPseudoSum(ip, h.v6, ulen))
	g.wparts = append(g.wparts[:0], hp, f[h.hl:])
	if h.v6 {
		for _, s := range frames[1:] {
			g.wparts = append(g.wparts, s[h.hl:])
		}
		return g.q.WritePacket(g.wparts)
	}
	id0 := roce.IPv4(f[h.l3:]).ID()
	for k, s := range frames[1:] {
		k++
		id := id0 + uint16(k)
		own := roce.IPv4(s[h.l3:]).ID()
		if own == id {
			g.wparts = append(g.wparts, s[h.hl:])
			continue
		}
		end := len(s) - roce.ICRCLen
		icrc := roce.StoredICRC(s) ^ g.shift(roce.IPv4IDTail(len(s)-h.l3)).IPv4IDDelta(own, id)
		binary.LittleEndian.PutUint32(g.icrc[k][:], icrc)
		g.wparts = append(g.wparts, s[h.hl:end], g.icrc[k][:])
	}
	return g.q.WritePacket(g.wparts)
}

// recvOffload is RecvBatch on a port with the offload: frames[:want] are
// at full length, each of at least fcap bytes.
func (p *TAPPort) recvOffload(frames [][]byte, want int) (int, error) {
	g := p.gso
	c := &p.Counters
	k := p.emitPending(frames, 0, want)
	for k < want && !g.pend {
		slot := frames[k]
		g.rparts = [3][]byte{g.rhdr[:], slot[:p.fcap], g.over[p.fcap:]}
		n, err := g.q.TryReadPacket(g.rparts[:])
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return k, nil
			}
			c.ReadErrors.Add(1)
			return k, err
		}
		if n == 0 {
			break
		}
		n -= tap.VnetHdrLen
		if n <= 0 || n > p.fcap+overflowLen {
			c.RxBad.Add(1)
			continue
		}
		var vh tap.VnetHdr
		vh.Decode(g.rhdr[:])
		if vh.GSOType == tap.VnetGSONone {
			if n > p.fcap {
				c.RxBad.Add(1) // longer than any frame of the device
				continue
			}
			f := slot[:n]
			if vh.Flags&tap.VnetFlagNeedsCsum != 0 && !completeCsum(f, int(vh.CsumStart), int(vh.CsumOffset)) {
				c.RxBad.Add(1)
				continue
			}
			if p.accept(f) {
				frames[k] = f
				k++
			}
			continue
		}
		if first, ok := p.splitRead(slot, n, &vh); ok {
			frames[k] = slot[:first]
			k++
			k = p.emitPending(frames, k, want)
		}
	}
	if g.pend {
		p.signal() // segments wait here: the worker must come back
	}
	return k, nil
}

// splitRead takes a segmented packet of n bytes read into slot (and the
// overflow buffer behind it): it checks it, leaves its first segment in
// slot with that segment's headers and makes the others pending. It
// returns the first segment's length; false if the packet was dropped
// (counted).
func (p *TAPPort) splitRead(slot []byte, n int, vh *tap.VnetHdr) (int, bool) {
	g := p.gso
	c := &p.Counters
	inSlot := min(n, p.fcap)
	h, ok := parseHdrs(slot[:inSlot])
	gso := int(vh.GSOSize)
	payload := n - h.hl
	switch {
	case !ok, vh.GSOType != tap.VnetGSOUDPL4, gso == 0, payload <= 0, h.hl+gso > p.fcap,
		(payload+gso-1)/gso > tapGSORxMaxSegs,
		vh.Flags&tap.VnetFlagNeedsCsum != 0 && (int(vh.CsumStart) != h.l4 || vh.CsumOffset != 6):
		c.RxBad.Add(1)
		return 0, false
	}
	// The length fields describe the whole packet (the kernel's
	// segmentation takes the lengths from the buffer, but a packet that
	// says otherwise was not built by a sender that meant it).
	if roce.UDP(slot[h.l4:]).Length() != uint16(n-h.l4) ||
		(h.v6 && roce.IPv6(slot[h.l3:]).PayloadLength() != uint16(n-h.l4)) ||
		(!h.v6 && int(roce.IPv4(slot[h.l3:]).TotalLength()) != n-h.l3) {
		c.RxBad.Add(1)
		return 0, false
	}
	first := min(h.hl+gso, n)
	if !p.accept(slot[:first]) {
		return 0, false // not RoCE for this queue: counted by accept
	}
	c.RxGSO.Add(1)
	c.RxGSOFrames.Add(1)
	copy(g.tmpl[:h.hl], slot[:h.hl])
	g.ph, g.gsoSize, g.nextSeg = h, gso, 1
	if !h.v6 {
		g.id0 = roce.IPv4(slot[h.l3:]).ID()
	}
	// The payloads after the first segment, made contiguous in over: the
	// part the read put in slot goes just before what it put in over.
	tail := inSlot - first
	copy(g.over[p.fcap-tail:p.fcap], slot[first:inSlot])
	g.pendData = g.over[p.fcap-tail : p.fcap+max(0, n-p.fcap)]
	g.pend = len(g.pendData) > 0
	fixSegment(slot[:first], h, g.id0)
	return first, true
}

// emitPending copies pending segments into frames[k:want] and returns the
// new k.
func (p *TAPPort) emitPending(frames [][]byte, k, want int) int {
	g := p.gso
	c := &p.Counters
	h := g.ph
	for g.pend && k < want {
		l := min(g.gsoSize, len(g.pendData))
		dst := frames[k][:h.hl+l]
		copy(dst, g.tmpl[:h.hl])
		copy(dst[h.hl:], g.pendData[:l])
		g.pendData = g.pendData[l:]
		fixSegment(dst, h, g.id0+uint16(g.nextSeg))
		g.nextSeg++
		g.pend = len(g.pendData) > 0
		frames[k] = dst
		k++
		c.RxFrames.Add(1)
		c.RxBytes.Add(uint64(len(dst)))
		c.RxGSOFrames.Add(1)
	}
	return k
}
