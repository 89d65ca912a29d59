package link

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/vrnic/vrnic/roce"
)

// Frames for another port's QP.
//
// A datagram reaches the socket its first frame's QP steers to
// (udp_steer.go), and a segmented datagram reaches it whole, or cut at
// that socket: every frame after the first goes where the first went. The
// link's own senders put frames for several QPs in one datagram only
// where it does no harm if they arrive late (plain ACKs, see
// coalescesAcross), and a sender of another implementation may do as it
// likes. A port of a link of several workers therefore checks the QP of
// every frame it receives and hands a frame for another port's QP to that
// port's inbox: the owner returns it from its next RecvBatch, ahead of
// what its socket holds, and is woken (Ready) if it sleeps. The frame is
// copied once; an inbox holds at most inboxCap frames, and a frame that
// finds it full is dropped and counted (RxForwardDrops: its owner is not
// reading, RC retransmits). A link of one worker checks nothing.
//
// Order: frames of one QP that come through two sockets, some directly,
// some handed over, may be returned in another order than sent. For a
// plain ACK that is harmless: an ACK is cumulative, and one that comes
// after a later one names PSNs already acknowledged, a duplicate response
// the completer drops (IBTA 9.7.5.1.5).

// inboxCap bounds the frames waiting in a port's inbox.
const inboxCap = 256

// udpInbox holds the frames other ports received for a port's QPs.
type udpInbox struct {
	n     atomic.Int32 // len(bufs), read without the lock
	mu    sync.Mutex
	bufs  [][]byte
	from  []netip.AddrPort
	spare [][]byte // buffers of frames handed out, for reuse
}

// steersElsewhere returns the port that owns the QP of frame (a UDP
// payload of n bytes, at least udpMinPayload), and whether that is
// another port than p.
func (p *UDPPort) steersElsewhere(frame []byte) (int, bool) {
	n := len(p.link.ports)
	if n == 1 {
		return 0, false
	}
	dst := roce.SteerQueue(roce.BTH(frame).DestQP(), n)
	return dst, dst != p.index
}

// forward copies frame, from from, into the inbox of port dst and wakes
// it.
func (p *UDPPort) forward(dst int, frame []byte, from netip.AddrPort) {
	q := p.link.ports[dst]
	in := &q.inbox
	in.mu.Lock()
	if len(in.bufs) >= inboxCap {
		in.mu.Unlock()
		p.Counters.RxForwardDrops.Add(1)
		return
	}
	var buf []byte
	if k := len(in.spare); k > 0 && cap(in.spare[k-1]) >= len(frame) {
		buf, in.spare = in.spare[k-1][:len(frame)], in.spare[:k-1]
	} else {
		buf = make([]byte, len(frame), max(len(frame), q.fcap))
	}
	copy(buf, frame)
	in.bufs = append(in.bufs, buf)
	in.from = append(in.from, from)
	in.n.Store(int32(len(in.bufs)))
	in.mu.Unlock()
	p.Counters.RxForwarded.Add(1)
	q.signal()
}

// takeInbox copies the frames waiting in p's inbox into frames (the
// caller's buffers, as RecvBatch) and their senders into peers, oldest
// first, and returns how many it copied. What does not fit waits for the
// next call (Ready is signalled).
func (p *UDPPort) takeInbox(frames [][]byte, peers []netip.AddrPort) int {
	in := &p.inbox
	if in.n.Load() == 0 {
		return 0
	}
	c := &p.Counters
	in.mu.Lock()
	k, used := 0, 0
	for ; used < len(in.bufs) && k < len(frames); used++ {
		f := in.bufs[used]
		buf := frames[k][:min(cap(frames[k]), p.fcap)]
		if len(f) > len(buf) {
			c.RxTruncated.Add(1)
		} else {
			frames[k] = buf[:copy(buf, f)]
			peers[k] = in.from[used]
			k++
			c.RxFrames.Add(1)
			c.RxBytes.Add(uint64(len(f)))
		}
		in.spare = append(in.spare, f)
		in.bufs[used] = nil
	}
	rest := copy(in.bufs, in.bufs[used:])
	clear(in.bufs[rest:])
	in.bufs = in.bufs[:rest]
	copy(in.from, in.from[used:])
	in.from = in.from[:rest]
	in.n.Store(int32(rest))
	in.mu.Unlock()
	if rest > 0 {
		p.signal()
	}
	return k
}

// coalescesAcross reports whether frames a and b, for different QPs, may
// share a segmented datagram: both plain ACKs (an RC Acknowledge with an
// ACK syndrome, no payload). Only those: a datagram goes to the worker of
// its first frame's QP, and a frame of another worker's QP reaches its
// owner through that worker (udp_forward.go), possibly after frames of
// the same QP sent later; data, READ responses and NAKs must not.
func coalescesAcross(a, b []byte) bool {
	return plainACK(a) && plainACK(b)
}

// plainACK reports whether frame (a UDP payload) is an RC Acknowledge
// with an ACK syndrome and nothing else.
func plainACK(frame []byte) bool {
	return len(frame) == roce.BTHLen+roce.AETHLen+roce.ICRCLen && roce.Opcode(frame[0]) == roce.OpRCAck &&
		roce.Syndrome(frame[roce.BTHLen]).Kind() == roce.SyndromeACK
}
