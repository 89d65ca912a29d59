package link

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// UDP segmentation and receive offload (UDP_SEGMENT, UDP_GRO): what the
// UDP link does with them, and why the ICRC allows it.
//
// Send: SendBatch packs consecutive frames to one peer into one message
// when they have one length (the last may be shorter), at most
// gsoMaxSegs of them and at most a UDP payload's worth of bytes: one
// iovec per frame (no copy) and a UDP_SEGMENT control message with that
// length. The kernel sends the message through the stack as one datagram
// and cuts it into one datagram per frame where it has to (the device,
// or the receiving socket when it does not take it whole), writing an IP
// and a UDP header for each segment. Every frame carries its own BTH and
// its own ICRC, computed before the call over the pseudo header of its
// own length (roce.Pseudo), so the segments are exactly the datagrams
// sendmmsg would have sent one by one. One pass through the stack, one
// socket-buffer charge and, on loopback, one delivery, instead of one
// per frame.
//
// Steering: the reuseport program picks the socket of a datagram from its
// first frame's BTH, and a segmented datagram reaches one socket whole
// (on loopback the kernel cuts it, if at all, at that socket). So a
// message holds frames for one destination QP, which all belong to one
// worker of the receiver, with one exception: plain ACKs for several QPs
// share one (coalescesAcross), a receiver of several workers handing
// those for another worker's QP to it (udp_forward.go), where one that
// comes after a later ACK of its QP is a harmless duplicate. The ACKs a
// worker writes for many QPs in one batch then go as one datagram.
// Receive coalescing cannot be told any of that:
// the kernel merges the datagrams of one flow (addresses and ports: all
// QPs between two daemons) whatever QP they are for, and the merged
// datagram goes to the socket of its first frame's QP. A link of several
// workers therefore does not ask for UDP_GRO.
//
// Receive: the socket of a one-worker link asks for UDP_GRO, so a
// datagram may hold several frames of one sender (all of one size but
// the last, named by the UDP_GRO control message). RecvBatch receives into port-private buffers
// of a whole UDP payload each and copies the frames out, in order, into
// the caller's buffers; frames that do not fit this call wait for the
// next one.
//
// The ICRC: IBTA Annex A17 (and Linux rxe_icrc.c) masks the IPv4 TOS, TTL
// and header checksum, the IPv6 traffic class, flow label and hop limit,
// and the UDP checksum. Still covered: the IPv4 total length and
// identification, the IPv6 payload length, the UDP length, the addresses
// and ports. For the segments of a UDP_SEGMENT send the kernel writes the
// lengths of each segment (known to the sender: its frame's) and, over
// IPv4, identification numbers that go up by one per segment from the
// datagram's (0 for an unconnected socket with DF set, as the link's
// are: ip_select_ident_segs, inet_gso_segment). A receiving UDP socket
// sees none of these: the link's ICRC covers the pseudo header of
// roce.Pseudo (identification 0, the lengths of the frame), computed by
// the sender and checked by the receiver from the addresses and the
// frame alone, whatever the kernel wrote on the way. The segments are
// therefore verifiable end to end over IPv4 and IPv6 alike (the tests
// send GSO batches over both and check every ICRC). What differs is a
// capture of the wire: over IPv6 every header field the ICRC covers is
// the pseudo header's, so a RoCE v2 verifier of the real frames agrees;
// over IPv4 segment k carries identification k, which the ICRC (computed
// with 0) does not match for k > 0 — the sender could precompute it, but
// a receiving socket cannot learn the identification of a datagram, so
// the link could not verify it. Hence the IPv4 default
// (UDPConfig.SegmentIPv4): segment on a loopback address, where lo
// carries the message whole and no segment is ever cut where its headers
// can be read. See kernel-notes/udp-offload.md.

const (
	// gsoMaxSegs is the most frames of one message: the kernel's
	// UDP_MAX_SEGMENTS (64 before Linux 6.9).
	gsoMaxSegs = 64
	// udpMaxPayload is the largest UDP payload: 65535 - 8 - 20 (IPv4);
	// the IPv6 limit (65527) is higher, the IPv4 one is used for both.
	udpMaxPayload = 65507
	// groBufs is the number of datagrams one recvmmsg of a GRO port
	// takes, into buffers of groBufLen bytes each (512 KiB per port).
	groBufs = 8
	// groBufLen holds any UDP datagram: a GRO datagram is at most 64 KiB.
	groBufLen = 1 << 16
)

// setOffload checks that the kernel knows UDP_SEGMENT and, when wantGRO,
// asks for UDP_GRO on fd; each result reports whether it is on.
func setOffload(fd int, wantGRO bool) (gso, gro bool) {
	gso = unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_SEGMENT, 0) == nil
	if wantGRO {
		gro = unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1) == nil
	}
	return gso, gro
}

// buildTx fills the send batch with frames[i:end] (at most len(b.msgs)
// frames) and returns the number of messages: consecutive valid frames to
// one peer and one destination QP, of one length (the last may be
// shorter), share a message when
// the port segments (gso), as long as the message stays within
// gsoMaxSegs frames and udpMaxPayload bytes.
func (p *UDPPort) buildTx(i, end int) (k int) {
	frames, peers := p.txFrames, p.txPeers
	b := &p.tx
	open := false // message k-1 may take more frames
	j := 0        // iovecs used
	for f := i; f < end; f++ {
		payload := frames[f]
		namelen, ok := putSockaddr(&b.names[k], peers[f], p.v6)
		b.invalid[f-i] = !ok || len(payload) < udpMinPayload
		if b.invalid[f-i] {
			continue
		}
		b.iovs[j].Base = &payload[0]
		b.iovs[j].SetLen(len(payload))
		j++
		if m := k - 1; open && peers[f] == peers[b.first[m]] && (sameDestQP(payload, frames[b.first[m]]) || coalescesAcross(payload, frames[b.first[m]])) && len(payload) <= b.seg[m] &&
			b.nfr[m] < gsoMaxSegs && b.bytes[m]+len(payload) <= udpMaxPayload {
			b.nfr[m]++
			b.bytes[m] += len(payload)
			open = len(payload) == b.seg[m] // a shorter frame is the last
			continue
		}
		b.first[k], b.nfr[k], b.iov[k] = f, 1, j-1
		b.bytes[k], b.seg[k], b.nlen[k] = len(payload), len(payload), namelen
		k++
		open = p.gso
	}
	for m := range k {
		h := &b.msgs[m].Hdr
		*h = unix.Msghdr{Name: &b.names[m][0], Namelen: b.nlen[m], Iov: &b.iovs[b.iov[m]]}
		h.SetIovlen(b.nfr[m])
		if b.nfr[m] > 1 {
			putGSOCmsg(&b.ctl[m], uint16(b.seg[m]))
			h.Control = &b.ctl[m][0]
			h.SetControllen(gsoCmsgLen)
		}
	}
	return k
}

// sameDestQP reports whether frames a and b (at least a BTH long) are for
// one destination QP: BTH bytes 5..7.
func sameDestQP(a, b []byte) bool {
	return a[5] == b[5] && a[6] == b[6] && a[7] == b[7]
}

// groRx holds what a GRO port received and has not yet handed out:
// got datagrams in bufs, the next frame at offset off of datagram cur.
type groRx struct {
	bufs [][]byte
	ctl  [][groCmsgLen + tosCmsgLen]byte // UDP_GRO, then IP_TOS / IPV6_TCLASS (UDPConfig.ECN)
	ce   []bool                          // the datagram arrived marked CE (UDPConfig.ECN)
	lens []int                           // datagram lengths
	segs []int                           // segment sizes (the datagram's length when not coalesced)
	from []netip.AddrPort
	got  int
	cur  int
	off  int
}

// newGRORx returns the receive state of a GRO port whose recvmmsg calls
// take at most n datagrams (groBufs, or fewer when the batch is smaller).
func newGRORx(n int) *groRx {
	n = min(n, groBufs)
	g := &groRx{
		bufs: make([][]byte, n),
		ctl:  make([][groCmsgLen + tosCmsgLen]byte, n),
		ce:   make([]bool, n),
		lens: make([]int, n),
		segs: make([]int, n),
		from: make([]netip.AddrPort, n),
	}
	for i := range g.bufs {
		g.bufs[i] = make([]byte, groBufLen)
	}
	return g
}

// recvGRO is RecvBatch on the socket fd of a GRO port: it hands out the
// frames left from the last call, then receives more datagrams into the
// port's buffers while the caller has room, and copies their frames out
// in order.
func (p *UDPPort) recvGRO(fd uintptr) {
	frames, peers := p.rxFrames, p.rxPeers
	g := p.groRx
	c := &p.Counters
	total, drained, full := 0, false, false
	for total < len(frames) {
		if g.cur == g.got {
			if drained {
				break
			}
			g.cur, g.off, g.got = 0, 0, p.recvGROBufs(fd)
			full = g.got == len(g.bufs)
			drained = !full
			if g.got == 0 {
				break
			}
		}
		for g.cur < g.got && total < len(frames) {
			n, s := g.lens[g.cur], g.segs[g.cur]
			if g.off >= n {
				g.cur, g.off = g.cur+1, 0
				continue
			}
			l := min(s, n-g.off)
			seg := g.bufs[g.cur][g.off : g.off+l]
			g.off += l
			if l > p.fcap {
				c.RxTruncated.Add(1)
				continue
			}
			buf := frames[total]
			buf = buf[:min(cap(buf), p.fcap)]
			if len(buf) < udpMinPayload {
				p.rxErr = fmt.Errorf("%w: receive buffer of capacity %d", ErrInvalid, cap(buf))
				g.off -= l // not handed out: next time
				p.rxN = total
				return
			}
			if l > len(buf) {
				c.RxTruncated.Add(1)
				continue
			}
			frames[total] = buf[:copy(buf, seg)]
			if g.ce[g.cur] && l >= udpMinPayload {
				frames[total][4] |= bthFECN // udp_ecn.go
			}
			peers[total] = g.from[g.cur]
			total++
			c.RxFrames.Add(1)
			c.RxBytes.Add(uint64(l))
		}
	}
	p.rxN = total
	if g.cur < g.got || full {
		p.signal() // more is waiting, here or in the socket
	}
}

// recvGROBufs receives up to groBufs datagrams into g.bufs with one
// recvmmsg and records their lengths, segment sizes and senders; a
// datagram of another family or truncated gets length 0 (counted). It
// returns the number received, 0 when the socket is empty.
func (p *UDPPort) recvGROBufs(fd uintptr) int {
	g := p.groRx
	b := &p.rx
	c := &p.Counters
	n := len(g.bufs)
	for i := range n {
		b.iovs[i].Base = &g.bufs[i][0]
		b.iovs[i].SetLen(len(g.bufs[i]))
		m := &b.msgs[i]
		m.Hdr = unix.Msghdr{Name: &b.names[i][0], Namelen: sockaddrLen, Iov: &b.iovs[i], Control: &g.ctl[i][0]}
		m.Hdr.SetIovlen(1)
		if p.ecn {
			m.Hdr.SetControllen(groCmsgLen + tosCmsgLen)
		} else {
			m.Hdr.SetControllen(groCmsgLen)
		}
		m.Len = 0
	}
	got := recvNow(fd, b.msgs[:n], c)
	for i := range got {
		m := &b.msgs[i]
		l := int(m.Len)
		from, ok := sockaddrAddrPort(&b.names[i], m.Hdr.Namelen, p.v6)
		switch {
		case m.Hdr.Flags&unix.MSG_TRUNC != 0:
			c.RxTruncated.Add(1)
			l = 0
		case !ok:
			c.RxForeign.Add(1)
			l = 0
		}
		ctl := g.ctl[i][:min(int(m.Hdr.Controllen), len(g.ctl[i]))]
		s := groSegSize((*[groCmsgLen]byte)(g.ctl[i][:groCmsgLen]), len(ctl))
		g.ce[i] = false
		if p.ecn && l > 0 {
			e, ok := cmsgECN(ctl)
			g.ce[i] = ok && e == ecnCE
			if g.ce[i] {
				c.RxCE.Add(1)
			}
		}
		if s <= 0 || s > l {
			s = l
		} else if s < l {
			c.RxGRO.Add(1)
		}
		g.lens[i], g.segs[i], g.from[i] = l, s, from
	}
	b.clear(n)
	return got
}
