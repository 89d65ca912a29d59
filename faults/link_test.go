package faults

import (
	"bytes"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/roce"
)

var (
	local = netip.MustParseAddrPort("127.0.0.1:4791")
	peer  = netip.MustParseAddrPort("127.0.0.2:4791")
)

const frameCap = 2048

// pkt builds a ModeUDP packet from src to dst as the engine would: an RC
// request of op to QP qpn at psn with n payload bytes of seed, in a
// buffer of the engine's capacity.
func pkt(t testing.TB, src, dst netip.AddrPort, op roce.Opcode, qpn, psn uint32, n int) []byte {
	t.Helper()
	p := roce.Path{Mode: roce.ModeUDP, Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port()}
	buf := make([]byte, roce.MaxHeadroom+n+roce.MaxTailroom)
	for i := range n {
		buf[roce.MaxHeadroom+i] = byte(psn) + byte(i)
	}
	h := roce.Headers{BTH: roce.BTHFields{Opcode: op, PKey: 0xffff, DestQP: qpn, PSN: psn},
		AETH: roce.AETHFields{Syndrome: roce.ACKSyndrome(roce.CreditsInvalid)}}
	b, err := p.Build(buf, roce.MaxHeadroom, n, &h)
	require.NoError(t, err)
	out := make([]byte, frameCap)
	return out[:copy(out, b)]
}

// writeMsgs returns the frames of count RDMA WRITEs of pkts packets each
// to QP qpn from PSN psn.
func writeMsgs(t testing.TB, count, pkts int, qpn, psn uint32) [][]byte {
	var out [][]byte
	for range count {
		for i := range pkts {
			op := roce.OpRCWriteMiddle
			switch {
			case pkts == 1:
				op = roce.OpRCWriteOnly
			case i == 0:
				op = roce.OpRCWriteFirst
			case i == pkts-1:
				op = roce.OpRCWriteLast
			}
			out = append(out, pkt(t, local, peer, op, qpn, psn, 64))
			psn++
		}
	}
	return out
}

// fakeLink records what is sent; RecvBatch returns what rx holds.
type fakeLink struct {
	sent    [][]byte
	sentTo  []netip.AddrPort
	rx      [][]byte
	rxFrom  []netip.AddrPort
	refuse  int // SendBatch takes at most this many frames when > 0 ...
	limited bool
	ready   chan struct{}
}

func newFake() *fakeLink { return &fakeLink{ready: make(chan struct{}, 1)} }

func (f *fakeLink) SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	n := len(frames)
	if f.limited {
		n = min(n, f.refuse)
		f.refuse -= n
	}
	for i := range n {
		f.sent = append(f.sent, append([]byte(nil), frames[i]...))
		f.sentTo = append(f.sentTo, peers[i])
	}
	return n, nil
}

func (f *fakeLink) RecvBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	n := 0
	for n < len(frames) && len(f.rx) > 0 {
		frames[n] = frames[n][:copy(frames[n][:cap(frames[n])], f.rx[0])]
		peers[n] = f.rxFrom[0]
		f.rx, f.rxFrom = f.rx[1:], f.rxFrom[1:]
		n++
	}
	return n, nil
}

func (f *fakeLink) Ready() <-chan struct{} { return f.ready }

// clock is a test clock for the injector.
type clock struct {
	mu sync.Mutex
	t  int64
}

func (c *clock) now() int64          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t += int64(d); c.mu.Unlock() }

// observer records what the layer reports.
type observer struct {
	frames [][]byte
	notes  []string
	sent   []bool
}

func (o *observer) Capturing() bool { return true }
func (o *observer) Observe(frames [][]byte, _ []netip.AddrPort, notes []string, sent bool) {
	for i, f := range frames {
		o.frames = append(o.frames, append([]byte(nil), f...))
		n := ""
		if notes != nil {
			n = notes[i]
		}
		o.notes = append(o.notes, n)
		o.sent = append(o.sent, sent)
	}
}

type rig struct {
	inj  *Injector
	link *Link
	fake *fakeLink
	obs  *observer
	clk  *clock
	logs *bytes.Buffer
}

func newRig(t testing.TB, seed uint64, rules ...admin.FaultRule) *rig {
	t.Helper()
	logs := &bytes.Buffer{}
	inj := New(Config{Mode: roce.ModeUDP, Local: local, Seed: seed, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	clk := &clock{}
	inj.clock = clk.now
	fake := newFake()
	obs := &observer{}
	l := inj.Wrap(fake, obs).(*Link)
	if len(rules) > 0 {
		_, err := inj.Add(rules)
		require.NoError(t, err)
	}
	return &rig{inj: inj, link: l, fake: fake, obs: obs, clk: clk, logs: logs}
}

// send sends frames one batch at a time (copies: the caller's stay
// intact) and requires they are all taken.
func (r *rig) send(t testing.TB, frames [][]byte) {
	t.Helper()
	batch := make([][]byte, len(frames))
	peers := make([]netip.AddrPort, len(frames))
	for i, f := range frames {
		batch[i] = append(make([]byte, 0, frameCap), f...)
		peers[i] = peer
	}
	n, err := r.link.SendBatch(batch, peers)
	require.NoError(t, err)
	require.Equal(t, len(frames), n)
}

// recv returns what RecvBatch gives now.
func (r *rig) recv(t testing.TB) [][]byte {
	t.Helper()
	frames := make([][]byte, 16)
	for i := range frames {
		frames[i] = make([]byte, frameCap)
	}
	peers := make([]netip.AddrPort, len(frames))
	n, err := r.link.RecvBatch(frames, peers)
	require.NoError(t, err)
	out := make([][]byte, n)
	for i := range n {
		out[i] = append([]byte(nil), frames[i]...)
		assert.Equal(t, peer, peers[i])
	}
	return out
}

func psnOf(f []byte) uint32 { return roce.BTH(f).PSN() }

func psns(fs [][]byte) []uint32 {
	out := []uint32{}
	for _, f := range fs {
		out = append(out, psnOf(f))
	}
	return out
}

func u32(v uint32) *uint32 { return &v }

// TestNoRulesPassThrough: without rules the link below gets the engine's
// own buffers, untouched.
func TestNoRulesPassThrough(t *testing.T) {
	r := newRig(t, 1)
	r.obs = nil
	r.link.obs = nil
	f := writeMsgs(t, 1, 3, 0x11, 10)
	r.send(t, f)
	require.Equal(t, f, r.fake.sent)
	assert.Nil(t, r.link.flows, "no tracking without rules")
}

// TestDropNthPacketOfMthMessage: "the 3rd packet of the 2nd RDMA WRITE,
// first transmission only" drops exactly that frame; its retransmission
// (a PSN not above the highest sent) goes through, and the observer sees
// the dropped frame with the rule's note.
func TestDropNthPacketOfMthMessage(t *testing.T) {
	r := newRig(t, 7, admin.FaultRule{ID: 3, Dir: "tx", QPN: u32(0x11), Message: &admin.FaultMessage{Kind: "write", Index: 2, Packet: 3},
		Round: "first", Action: admin.FaultAction{Type: "drop"}})
	// An ACK and a SEND on the same flow do not count as WRITEs.
	r.send(t, [][]byte{pkt(t, local, peer, roce.OpRCSendOnly, 0x11, 99, 8)})
	msgs := writeMsgs(t, 3, 4, 0x11, 100) // PSNs 100..111; message 2 is 104..107
	r.send(t, msgs[:6])
	r.send(t, msgs[6:])
	want := []uint32{99, 100, 101, 102, 103, 104, 105, 107, 108, 109, 110, 111}
	assert.Equal(t, want, psns(r.fake.sent), "PSN 106 dropped")
	// Go-back-N from 106: a retransmission round passes.
	r.send(t, msgs[6:])
	assert.Equal(t, append(want, 106, 107, 108, 109, 110, 111), psns(r.fake.sent))
	got := r.inj.List()
	require.Len(t, got, 1)
	assert.Equal(t, uint64(1), got[0].Matched)
	assert.Equal(t, uint64(1), got[0].Applied)
	// The observer saw every frame the engine sent, the dropped one too.
	require.Len(t, r.obs.frames, 1+12+6)
	assert.Equal(t, uint32(106), psnOf(r.obs.frames[7]))
	assert.Equal(t, "fault rule 3: drop", r.obs.notes[7])
	for i, n := range r.obs.notes {
		if i != 7 {
			assert.Empty(t, n, "frame %d", i)
		}
	}
	assert.Contains(t, r.logs.String(), "fault injected")
	assert.Contains(t, r.logs.String(), "psn=106")
	assert.Contains(t, r.logs.String(), "opcode=RC_RDMA_WRITE_MIDDLE")
	assert.Contains(t, r.logs.String(), "rule=3")
}

// TestMessagesCountFromTheRule: a rule counts the messages that start
// after it was installed.
func TestMessagesCountFromTheRule(t *testing.T) {
	r := newRig(t, 7, admin.FaultRule{ID: 1, Action: admin.FaultAction{Type: "ecn"}, Op: []string{"send"}})
	msgs := writeMsgs(t, 4, 2, 0x11, 0)
	r.send(t, msgs[:3]) // message 1 and the first packet of message 2
	_, err := r.inj.Add([]admin.FaultRule{{ID: 2, Message: &admin.FaultMessage{Kind: "write", Index: 1}, Action: admin.FaultAction{Type: "drop"}}})
	require.NoError(t, err)
	r.send(t, msgs[3:])
	assert.Equal(t, []uint32{0, 1, 2, 3, 6, 7}, psns(r.fake.sent), "message 3 is the rule's first")
}

// TestRounds: round 1 is the first retransmission of a PSN, round 2 the
// second.
func TestRounds(t *testing.T) {
	r := newRig(t, 7, admin.FaultRule{ID: 1, Round: "2", Action: admin.FaultAction{Type: "drop"}})
	f := writeMsgs(t, 1, 3, 0x11, 50)
	r.send(t, f)
	r.send(t, f[1:])
	r.send(t, f[1:])
	r.send(t, f[2:])
	assert.Equal(t, []uint32{50, 51, 52, 51, 52, 52}, psns(r.fake.sent), "the third sending of 51 and 52 dropped")
}

// TestCorrupt: a corrupted frame fails its ICRC unless the rule fixes
// it; then the receiver accepts different bytes.
func TestCorrupt(t *testing.T) {
	for _, fix := range []bool{false, true} {
		off := 5
		r := newRig(t, 7, admin.FaultRule{ID: 1, Action: admin.FaultAction{Type: "corrupt", Field: "payload", Offset: &off, Mask: 0x80, FixICRC: fix}})
		f := pkt(t, local, peer, roce.OpRCSendOnly, 0x11, 1, 64)
		r.send(t, [][]byte{f})
		require.Len(t, r.fake.sent, 1)
		got := r.fake.sent[0]
		var p roce.Packet
		ps := roce.Pseudo{Src: local.Addr(), SrcPort: local.Port(), Dst: peer.Addr(), DstPort: peer.Port()}
		err := roce.ParseUDP(got, &ps, &p)
		if !fix {
			assert.ErrorIs(t, err, roce.ErrICRC)
			continue
		}
		require.NoError(t, err)
		var want roce.Packet
		require.NoError(t, roce.ParseUDP(f, &ps, &want))
		assert.Equal(t, want.Payload[5]^0x80, p.Payload[5])
		assert.Equal(t, "fault rule 1: corrupt payload+5 ^0x80, ICRC fixed", r.obs.notes[0])
	}
}

// TestCorruptRx: received frames are corrupted (fixed with the pseudo
// header of the peer to the link) and the observer sees them as they
// arrived.
func TestCorruptRx(t *testing.T) {
	off := 0
	r := newRig(t, 7, admin.FaultRule{ID: 1, Dir: "rx", Action: admin.FaultAction{Type: "corrupt", Offset: &off, Mask: 1, FixICRC: true}})
	in := pkt(t, peer, local, roce.OpRCSendOnly, 0x22, 9, 16)
	r.fake.rx, r.fake.rxFrom = [][]byte{in}, []netip.AddrPort{peer}
	got := r.recv(t)
	require.Len(t, got, 1)
	var p roce.Packet
	ps := roce.Pseudo{Src: peer.Addr(), SrcPort: peer.Port(), Dst: local.Addr(), DstPort: local.Port()}
	require.NoError(t, roce.ParseUDP(got[0], &ps, &p))
	assert.NotEqual(t, in, got[0])
	assert.Equal(t, in, r.obs.frames[0], "observed as it arrived")
	assert.False(t, r.obs.sent[0])
}

// TestDuplicateAndECN: copies follow the frame; CE on the UDP link is
// the BTH FECN bit.
func TestDuplicateAndECN(t *testing.T) {
	r := newRig(t, 7,
		admin.FaultRule{ID: 1, Dir: "tx", Action: admin.FaultAction{Type: "duplicate", Copies: 2}},
		admin.FaultRule{ID: 2, Dir: "tx", Action: admin.FaultAction{Type: "ecn"}})
	r.send(t, [][]byte{pkt(t, local, peer, roce.OpRCSendOnly, 0x11, 1, 8)})
	require.Len(t, r.fake.sent, 3)
	for _, f := range r.fake.sent {
		assert.True(t, roce.BTH(f).FECN())
		var p roce.Packet
		ps := roce.Pseudo{Src: local.Addr(), SrcPort: local.Port(), Dst: peer.Addr(), DstPort: peer.Port()}
		assert.NoError(t, roce.ParseUDP(f, &ps, &p), "FECN is outside the ICRC")
	}
	assert.Equal(t, "fault rule 1: duplicate x2; fault rule 2: ecn CE", r.obs.notes[0])
}

// TestDelayAndReorder: a delayed frame leaves when its time comes; a
// reordered one after k later frames.
func TestDelayAndReorder(t *testing.T) {
	r := newRig(t, 7, admin.FaultRule{ID: 1, Dir: "tx", PSN: "1", Action: admin.FaultAction{Type: "delay", Delay: "100us"}})
	f := writeMsgs(t, 1, 4, 0x11, 0)
	r.send(t, f[:2])
	assert.Equal(t, []uint32{0}, psns(r.fake.sent))
	ch := r.link.Ready()
	assert.NotEqual(t, r.fake.Ready(), ch, "the layer's own channel while it holds a frame")
	r.clk.add(99 * time.Microsecond)
	r.recv(t)
	assert.Equal(t, []uint32{0}, psns(r.fake.sent))
	r.clk.add(time.Microsecond)
	r.recv(t) // a receive call releases due sent frames too
	assert.Equal(t, []uint32{0, 1}, psns(r.fake.sent))
	// A signal of the link below during the hold is not lost.
	r.fake.ready <- struct{}{}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("the forwarder lost the link's signal")
	}
	// Nothing held: back to the link's channel, once a signal the layer's
	// channel still holds (the timer's) has been taken.
	next := r.link.Ready()
	if next != (<-chan struct{})(r.fake.ready) {
		select {
		case <-next:
		default:
			t.Fatal("the layer's channel is offered again without a signal in it")
		}
		next = r.link.Ready()
	}
	assert.Equal(t, (<-chan struct{})(r.fake.ready), next, "back to the link's channel")

	_, err := r.inj.Set(admin.FaultRule{ID: 1, Dir: "tx", PSN: "2", Action: admin.FaultAction{Type: "reorder", Frames: 1}})
	require.NoError(t, err)
	r.send(t, f[2:3])
	r.send(t, f[3:4])
	r.send(t, nil)
	assert.Equal(t, []uint32{0, 1, 3, 2}, psns(r.fake.sent))
}

// TestRateAndDown: a rate of 1000 frames/s passes one frame per ms; a
// link-down period drops everything in the rule's direction.
func TestRateAndDown(t *testing.T) {
	r := newRig(t, 7, admin.FaultRule{ID: 1, Dir: "tx", Action: admin.FaultAction{Type: "rate", PPS: 1000, For: "1500us"}})
	f := writeMsgs(t, 1, 4, 0x11, 0)
	r.send(t, f)
	assert.Equal(t, []uint32{0}, psns(r.fake.sent), "one now, one at 1ms; those at 2ms would wait longer than 1.5ms")
	r.clk.add(time.Millisecond)
	r.recv(t)
	assert.Equal(t, []uint32{0, 1}, psns(r.fake.sent))
	assert.Equal(t, "fault rule 1: rate: drop", r.obs.notes[2], "beyond the longest wait: dropped")
	assert.Equal(t, uint64(2), r.inj.List()[0].RateDrops)

	r.inj.Clear()
	_, err := r.inj.Add([]admin.FaultRule{{ID: 2, Dir: "rx", PSN: "5", Action: admin.FaultAction{Type: "down", For: "1ms"}}})
	require.NoError(t, err)
	for psn := range uint32(8) {
		r.fake.rx = append(r.fake.rx, pkt(t, peer, local, roce.OpRCSendOnly, 0x22, psn, 8))
		r.fake.rxFrom = append(r.fake.rxFrom, peer)
	}
	assert.Equal(t, []uint32{0, 1, 2, 3, 4}, psns(r.recv(t)))
	r.clk.add(time.Millisecond)
	r.fake.rx, r.fake.rxFrom = [][]byte{pkt(t, peer, local, roce.OpRCSendOnly, 0x22, 8, 8)}, []netip.AddrPort{peer}
	assert.Equal(t, []uint32{8}, psns(r.recv(t)), "up again")
	got := r.inj.List()
	assert.Equal(t, uint64(3), got[0].Applied, "the trigger and the two frames after it")
}

// TestBackpressure: frames the link below refuses wait in the layer and
// go first when it takes frames again; until then the engine's frames
// stay with the engine.
func TestBackpressure(t *testing.T) {
	r := newRig(t, 7, admin.FaultRule{ID: 1, Dir: "rx", Action: admin.FaultAction{Type: "drop"}})
	r.fake.limited, r.fake.refuse = true, 2
	f := writeMsgs(t, 1, 4, 0x11, 0)
	r.send(t, f[:3])
	assert.Equal(t, []uint32{0, 1}, psns(r.fake.sent))
	batch := [][]byte{append([]byte(nil), f[3]...)}
	n, err := r.link.SendBatch(batch, []netip.AddrPort{peer})
	require.NoError(t, err)
	assert.Zero(t, n, "the link below is still full")
	r.fake.refuse = 10
	r.send(t, f[3:])
	assert.Equal(t, []uint32{0, 1, 2, 3}, psns(r.fake.sent))
}

// TestSeededDecisions: the same seed makes the same decisions, another
// seed others.
func TestSeededDecisions(t *testing.T) {
	p := 0.5
	run := func(seed uint64) []uint32 {
		r := newRig(t, seed, admin.FaultRule{ID: 4, Probability: &p, Action: admin.FaultAction{Type: "drop"}},
			admin.FaultRule{ID: 5, Probability: &p, Action: admin.FaultAction{Type: "corrupt"}})
		f := writeMsgs(t, 16, 4, 0x11, 0)
		for i := 0; i < len(f); i += 8 {
			r.send(t, f[i:i+8])
		}
		out := psns(r.fake.sent)
		for _, s := range r.fake.sent {
			out = append(out, uint32(s[len(s)-5])) // a payload byte: where corrupt struck
		}
		return out
	}
	a, b, c := run(42), run(42), run(43)
	assert.Equal(t, a, b)
	assert.NotEqual(t, a, c)
	assert.Less(t, len(a)/2, 64, "some frames dropped")
}

// TestRateMarksCEAbove: a rate rule with ce_above marks Congestion
// Experienced (the BTH FECN bit on the UDP link) on the frames that wait
// longer than the threshold, and only on those: a queue marking above a
// threshold K.
func TestRateMarksCEAbove(t *testing.T) {
	r := newRig(t, 7, admin.FaultRule{ID: 1, Dir: "tx", Action: admin.FaultAction{Type: "rate", PPS: 1000, For: "10ms", CEAbove: "2500us"}})
	f := writeMsgs(t, 1, 6, 0x11, 0) // waits 0, 1, ..., 5 ms
	r.send(t, f)
	r.clk.add(6 * time.Millisecond)
	r.recv(t)
	require.Equal(t, []uint32{0, 1, 2, 3, 4, 5}, psns(r.fake.sent))
	for i, s := range r.fake.sent {
		assert.Equal(t, i >= 3, roce.BTH(s).FECN(), "frame %d (waited %d ms)", i, i)
	}
	assert.Contains(t, r.obs.notes[3], "ecn CE")
	assert.NotContains(t, r.obs.notes[2], "ecn")
	st := r.inj.List()[0]
	assert.Equal(t, uint64(3), st.CEMarked)
	assert.Equal(t, uint64((1+2+3+4+5)*time.Millisecond), st.RateWaitNs)
	assert.Zero(t, st.RateDrops)

	bad := admin.FaultRule{ID: 2, Action: admin.FaultAction{Type: "drop", CEAbove: "1ms"}}
	_, err := r.inj.Add([]admin.FaultRule{bad})
	assert.Error(t, err, "ce_above belongs to rate")
	bad = admin.FaultRule{ID: 3, Action: admin.FaultAction{Type: "rate", PPS: 10, CEAbove: "soon"}}
	_, err = r.inj.Add([]admin.FaultRule{bad})
	assert.Error(t, err)
}
