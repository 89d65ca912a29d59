package link

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/tap"
)

// fakePktQueue is a queue of whole packets (virtio-net header first) for
// the offload path: TryReadPacket scatters the next queued packet over the
// parts as readv would, WritePacket records the gathered packet.
type fakePktQueue struct {
	in      [][]byte
	written [][]byte
	refuse  bool
}

func (q *fakePktQueue) TryReadPacket(parts [][]byte) (int, error) {
	if len(q.in) == 0 {
		return 0, nil
	}
	p := q.in[0]
	q.in = q.in[1:]
	n := 0
	for _, part := range parts {
		n += copy(part, p[n:])
	}
	return len(p), nil // like tun_put_user: the packet's length even if cut
}

func (q *fakePktQueue) WritePacket(parts [][]byte) error {
	if q.refuse && len(parts) > 2 {
		return fmt.Errorf("write: %w", errEINVAL)
	}
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	q.written = append(q.written, b)
	return nil
}

var errEINVAL = fmt.Errorf("invalid argument")

// newGSOPort returns port 0 of a one-queue link over fakes with the
// offload on, over q.
func newGSOPort(t *testing.T, q *fakePktQueue) *TAPPort {
	l, _, _ := newFakeTAPLink(t, 1, TAPConfig{})
	p := l.Ports()[0]
	p.gso = newTapGSO(q, testFrameCap)
	return p
}

// newBarePort is a one-queue port with the offload over q and no waiter
// goroutine (for the fuzz target).
func newBarePort(q *fakePktQueue) *TAPPort {
	return &TAPPort{
		link: &TAPLink{cfg: TAPConfig{Logger: slog.New(slog.DiscardHandler)}}, nq: 1, fcap: testFrameCap,
		ready: make(chan struct{}, 1), arm: make(chan struct{}, 1), sizes: make([]int, 64), gso: newTapGSO(q, testFrameCap),
	}
}

// gsoRun builds n frames to one QP of payload size seg (the last of
// last bytes), all with identification 0, as the engine does.
func gsoRun(t testing.TB, v6 bool, n, seg, last int) [][]byte {
	var out [][]byte
	for k := range n {
		size := seg
		if k == n-1 {
			size = last
		}
		h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCWriteMiddle, PKey: 0xffff, DestQP: 0x4711, PSN: uint32(100 + k)}}
		if size%4 != 0 {
			h.BTH.Opcode = roce.OpRCWriteLast
		}
		out = append(out, bytes.Clone(buildFrame(t, tapPath(v6), &h, size)))
	}
	return out
}

// wireFrame is frame k of a run as the wire carries it after the kernel
// cut the segmented packet: built again with identification k, and over
// IPv4 with the full UDP checksum the segmentation writes.
func wireFrame(f []byte, k int) []byte {
	w := bytes.Clone(f)
	h, _ := parseHdrs(w)
	if !h.v6 {
		roce.SetIPv4ID(w[h.l3:], uint16(k))
		ip := w[h.l3:]
		roce.UDP(w[h.l4:]).SetChecksum(roce.UDPChecksum(ip[12:16], ip[16:20], w[h.l4:]))
	}
	return w
}

// refSegment cuts a segmented packet (virtio-net header first) as the
// kernel's inet_gso_segment / ipv6_gso_segment and __udp_gso_segment do,
// written independently of the link's code: the first segment's headers
// copied, identification +k, own lengths, header checksum, full UDP
// checksum.
func refSegment(t testing.TB, pkt []byte) [][]byte {
	var vh tap.VnetHdr
	vh.Decode(pkt)
	p := pkt[tap.VnetHdrLen:]
	hl, gso := int(vh.HdrLen), int(vh.GSOSize)
	l3 := 14
	v6 := binary.BigEndian.Uint16(p[12:]) == 0x86dd
	l4 := int(vh.CsumStart)
	require.Equal(t, hl, l4+8)
	var out [][]byte
	for k, off := 0, hl; off < len(p); k, off = k+1, off+gso {
		end := min(off+gso, len(p))
		s := append(bytes.Clone(p[:hl]), p[off:end]...)
		ulen := len(s) - l4
		binary.BigEndian.PutUint16(s[l4+4:], uint16(ulen))
		s[l4+6], s[l4+7] = 0, 0
		var sum uint32
		add := func(b []byte) {
			for i := 0; i+1 < len(b); i += 2 {
				sum += uint32(binary.BigEndian.Uint16(b[i:]))
			}
			if len(b)%2 == 1 {
				sum += uint32(b[len(b)-1]) << 8
			}
		}
		if v6 {
			binary.BigEndian.PutUint16(s[l3+4:], uint16(ulen))
			add(s[l3+8 : l3+40])
		} else {
			binary.BigEndian.PutUint16(s[l3+2:], uint16(len(s)-l3))
			id := binary.BigEndian.Uint16(p[l3+4:]) + uint16(k)
			binary.BigEndian.PutUint16(s[l3+4:], id)
			s[l3+10], s[l3+11] = 0, 0
			var hs uint32
			for i := l3; i < l4; i += 2 {
				hs += uint32(binary.BigEndian.Uint16(s[i:]))
			}
			for hs > 0xffff {
				hs = hs>>16 + hs&0xffff
			}
			binary.BigEndian.PutUint16(s[l3+10:], ^uint16(hs))
			add(s[l3+12 : l3+20])
		}
		sum += 17 + uint32(ulen)
		add(s[l4:])
		for sum > 0xffff {
			sum = sum>>16 + sum&0xffff
		}
		c := ^uint16(sum)
		if c == 0 {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(s[l4+6:], c)
		out = append(out, s)
	}
	return out
}

// TestTAPGSOSendSplit: SendBatch puts a run in one segmented write whose
// segments, cut as the kernel cuts them, are the run's frames with
// identifications 0..n-1, each a valid RoCE v2 frame; the receive side
// splits the same packet into the same frames; frames of other QPs,
// other lengths or other headers end runs.
func TestTAPGSOSendSplit(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, c := range []struct{ n, seg, last int }{{2, 1024, 1024}, {5, 4096, 100}, {64, 256, 3}, {64, 16, 16}, {17, 512, 0}} {
			t.Run(fmt.Sprintf("v6=%v/%d×%d+%d", v6, c.n, c.seg, c.last), func(t *testing.T) {
				q := &fakePktQueue{}
				p := newGSOPort(t, q)
				run := gsoRun(t, v6, c.n, c.seg, c.last)
				orig := make([][]byte, len(run))
				for i := range run {
					orig[i] = bytes.Clone(run[i])
				}
				n, err := p.SendBatch(run, nil)
				require.NoError(t, err)
				require.Equal(t, c.n, n)
				require.Len(t, q.written, 1, "one write")
				for i := range run {
					require.Equal(t, orig[i], run[i], "the caller's frame %d is not written", i)
				}
				assert.EqualValues(t, 1, p.Counters.TxGSO.Load())
				assert.EqualValues(t, c.n, p.Counters.TxFrames.Load())
				segs := refSegment(t, q.written[0])
				require.Len(t, segs, c.n)
				var pkt roce.Packet
				for k := range segs {
					require.NoError(t, roce.Parse(segs[k], &pkt), "segment %d", k)
					require.Equal(t, wireFrame(run[k], k), segs[k], "segment %d", k)
				}
				// Receive: the same packet read whole.
				q.in = append(q.in, q.written[0])
				got := recvGSOAll(t, p, c.n)
				for k := range got {
					require.NoError(t, roce.Parse(got[k], &pkt), "split frame %d", k)
					require.Equal(t, segs[k], got[k], "split frame %d = kernel segment", k)
				}
				assert.EqualValues(t, 1, p.Counters.RxGSO.Load())
				assert.EqualValues(t, c.n, p.Counters.RxGSOFrames.Load())
				assert.EqualValues(t, c.n, p.Counters.RxFrames.Load())
			})
		}
	}
}

// recvGSOAll receives n frames from p in batches of 7 (so segments wait
// for the next call), as copies.
func recvGSOAll(t *testing.T, p *TAPPort, n int) [][]byte {
	bufs := newBufs(7)
	var out [][]byte
	for tries := 0; len(out) < n && tries < 100; tries++ {
		var k int
		if out, k = recvCopies(t, p, bufs, out); k == 0 {
			break
		}
	}
	require.Len(t, out, n)
	return out
}

// TestTAPGSORuns: where runs end.
func TestTAPGSORuns(t *testing.T) {
	q := &fakePktQueue{}
	p := newGSOPort(t, q)
	a := gsoRun(t, false, 3, 1024, 1024)
	other := gsoRun(t, false, 1, 1024, 1024)[0]
	other[len(other)-20]++ // any payload: still joins (payload is not compared)
	roce.StoreICRC(other[14:])
	qp := bytes.Clone(a[0])
	roce.BTH(qp[14+20+8:]).SetDestQP(0x4712)
	roce.StoreICRC(qp[14:])
	v6 := gsoRun(t, true, 2, 1024, 1024)
	short := gsoRun(t, false, 2, 1024, 512)
	tos := bytes.Clone(a[0])
	roce.IPv4(tos[14:]).SetTOS(4)
	roce.IPv4(tos[14:]).SetChecksum(roce.IPv4(tos[14:]).CalculateChecksum())
	batch := [][]byte{a[0], a[1], a[2], other, qp, v6[0], v6[1], short[0], short[1], a[0], tos, a[0][:100]}
	n, err := p.SendBatch(batch, nil)
	require.NoError(t, err)
	require.Equal(t, len(batch), n)
	var sizes []int
	for _, w := range q.written {
		var vh tap.VnetHdr
		vh.Decode(w)
		if vh.GSOType == tap.VnetGSONone {
			sizes = append(sizes, 1)
		} else {
			sizes = append(sizes, len(refSegment(t, w)))
		}
	}
	// a0 a1 a2 other | qp | v6 v6 | short0 short1 | a0 | tos | truncated
	assert.Equal(t, []int{4, 1, 2, 2, 1, 1, 1}, sizes)
	assert.EqualValues(t, len(batch), p.Counters.TxFrames.Load())
}

// TestTAPGSORefused: a kernel that refuses segmented writes turns the
// port to one frame per write, losing nothing.
func TestTAPGSORefused(t *testing.T) {
	q := &fakePktQueue{refuse: true}
	p := newGSOPort(t, q)
	run := gsoRun(t, false, 4, 256, 256)
	n, err := p.SendBatch(run, nil)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Len(t, q.written, 4)
	for i, w := range q.written {
		assert.Equal(t, make([]byte, tap.VnetHdrLen), w[:tap.VnetHdrLen])
		assert.Equal(t, run[i], w[tap.VnetHdrLen:])
	}
	assert.Contains(t, p.link.Offload(), "refused")
	assert.Zero(t, p.Counters.TxErrors.Load())
}

// TestTAPGSOBadInput: inconsistent or truncated segmented packets are
// dropped and counted; a partial checksum of a plain frame is completed.
func TestTAPGSOBadInput(t *testing.T) {
	q := &fakePktQueue{}
	p := newGSOPort(t, q)
	run := gsoRun(t, false, 4, 256, 256)
	require.NoError(t, func() error { _, err := p.SendBatch(run, nil); return err }())
	good := q.written[0]
	q.written = nil
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	bad := [][]byte{
		mod(func(b []byte) []byte { b[4], b[5] = 0, 0; return b }),                          // gso_size 0
		mod(func(b []byte) []byte { b[1] = tap.VnetGSOUDPL4 | tap.VnetGSOECN; return b }),   // ECN
		mod(func(b []byte) []byte { b[1] = 1; return b }),                                   // TCPv4
		mod(func(b []byte) []byte { b[4], b[5] = 1, 0; return b }),                          // 1-byte segments: too many
		mod(func(b []byte) []byte { b[6]++; return b }),                                     // csum_start elsewhere
		mod(func(b []byte) []byte { return b[:len(b)-1] }),                                  // shorter than its lengths say
		mod(func(b []byte) []byte { return b[:tap.VnetHdrLen+30] }),                         // truncated headers
		mod(func(b []byte) []byte { b[tap.VnetHdrLen+12] = 0x88; return b }),                // not IP
		mod(func(b []byte) []byte { return b[:tap.VnetHdrLen] }),                            // header only
		mod(func(b []byte) []byte { return b[:3] }),                                         // less than a header
		mod(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[4:], 5000); return b }), // segment larger than a frame
	}
	q.in = append(q.in, bad...)
	q.in = append(q.in, good)
	got := recvGSOAll(t, p, 4)
	var pkt roce.Packet
	for _, f := range got {
		require.NoError(t, roce.Parse(f, &pkt))
	}
	assert.EqualValues(t, len(bad), p.Counters.RxBad.Load(), "bad reads counted")

	// A plain frame with a partial UDP checksum.
	f := gsoRun(t, true, 1, 100, 100)[0]
	want := bytes.Clone(f)
	h, _ := parseHdrs(f)
	roce.UDP(f[h.l4:]).SetChecksum(udpPseudoSum(f[h.l3:], true, len(f)-h.l4))
	vh := tap.VnetHdr{Flags: tap.VnetFlagNeedsCsum, CsumStart: uint16(h.l4), CsumOffset: 6}
	pk := make([]byte, tap.VnetHdrLen)
	vh.Encode(pk)
	q.in = append(q.in, append(pk, f...))
	got = recvGSOAll(t, p, 1)
	assert.Equal(t, want, got[0], "partial checksum completed")
}

// TestTAPGSONoAllocs: a segmented write and the split of a segmented read
// allocate nothing.
func TestTAPGSONoAllocs(t *testing.T) {
	q := &fakePktQueue{}
	p := newGSOPort(t, q)
	run := gsoRun(t, false, 8, 1024, 1024)
	_, err := p.SendBatch(run, nil)
	require.NoError(t, err)
	pkt := q.written[0]
	q.written = make([][]byte, 0, 1)
	bufs := newBufs(8)
	ins := make([][]byte, 1)
	allocs := testing.AllocsPerRun(100, func() {
		ins[0] = pkt
		q.in = ins
		for i := range bufs {
			bufs[i] = bufs[i][:cap(bufs[i])]
		}
		if k, _ := p.RecvBatch(bufs, nil); k != 8 {
			t.Fatalf("received %d", k)
		}
	})
	assert.Zero(t, allocs, "split")
	w := &countingPktQueue{}
	p.gso.q = w
	allocs = testing.AllocsPerRun(100, func() { p.SendBatch(run, nil) })
	assert.Zero(t, allocs, "segmented write")
	assert.Equal(t, 101, w.n)
}

type countingPktQueue struct{ n int }

func (q *countingPktQueue) TryReadPacket([][]byte) (int, error) { return 0, nil }
func (q *countingPktQueue) WritePacket([][]byte) error          { q.n++; return nil }

// FuzzTAPGSORecv: any read (virtio-net header and packet) is split or
// dropped without panicking, and every frame handed out is at most the
// frame capacity.
func FuzzTAPGSORecv(f *testing.F) {
	for _, v6 := range []bool{false, true} {
		q := &fakePktQueue{}
		p := newBarePort(q)
		if _, err := p.SendBatch(gsoRun(f, v6, 3, 200, 52), nil); err != nil || len(q.written) != 1 {
			f.Fatal("seed", err)
		}
		f.Add(q.written[0])
		f.Add(q.written[0][:len(q.written[0])-60])
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, pkt []byte) {
		q := &fakePktQueue{in: [][]byte{pkt}}
		p := newBarePort(q)
		bufs := newBufs(4)
		for range 200 {
			for i := range bufs {
				bufs[i] = bufs[i][:cap(bufs[i])]
			}
			k, err := p.RecvBatch(bufs, nil)
			if err != nil || k == 0 {
				break
			}
			for i := range k {
				if len(bufs[i]) > testFrameCap {
					t.Fatalf("frame of %d bytes", len(bufs[i]))
				}
			}
		}
	})
}
