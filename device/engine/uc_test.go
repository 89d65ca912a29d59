package engine

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/roce"
)

func ucOpts() qpOpts {
	o := defaultOpts()
	o.typ = abi.QPTUC
	o.sigAll = true
	return o
}

// dropLink drops the frames its drop function picks (by the count of
// frames sent before, from 0).
type dropLink struct {
	Link
	sent atomic.Int64
	drop func(i int64) bool
}

func (l *dropLink) SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	for i := range frames {
		if l.drop(l.sent.Load()) {
			l.sent.Add(1)
			continue // taken and lost
		}
		n, err := l.Link.SendBatch(frames[i:i+1], peers[i:i+1])
		if n == 0 {
			return i, err
		}
		l.sent.Add(1)
	}
	return len(frames), nil
}

// settled waits until the only worker of n has received want frames and
// gone to sleep after handling them: whatever they complete is in the CQs
// by then. (The worker counts a wake-up before it receives and a sleep
// after the pass that handled what it received, so a sleep counted after
// RxFrames reached want follows that pass.)
func settled(t *testing.T, n *node, want uint64) {
	t.Helper()
	c := n.eng.WorkerCounters(0)
	require.Eventually(t, func() bool {
		return c.RxFrames.Load() == want && c.Sleeps.Load() > c.Wakes.Load()
	}, waitFor, 100*time.Microsecond, "the worker received %d frames (has %d) and went to sleep", want, c.RxFrames.Load())
	require.Equal(t, want, c.RxFrames.Load(), "no frame after the ones awaited")
}

// ucPair is a UC QP pair whose sender drops the frames drop picks.
func ucPair(t *testing.T, mode roce.Mode, drop func(int64) bool) (*tqp, *tqp) {
	nw := newNetworkMode(t, mode, 4096, 1024)
	na := newNodeWrap(t, nw, "10.0.0.1", 1, nil, func(l Link) Link { return &dropLink{Link: l, drop: drop} })
	nb := newNode(t, nw, "10.0.0.2", 1, nil)
	o := ucOpts()
	a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
	connect(t, a, b, o)
	return a, b
}

// TestUCDropAndResync: a lost packet drops the rest of its message at
// the responder silently, the receive WR it took serves the next SEND,
// and the responder resumes with the next FIRST or ONLY; the requester
// completes every WR once its last packet is sent (no ACKs). The same
// for an RDMA WRITE with immediate. Both framings.
func TestUCDropAndResync(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			// Messages: 0: SEND 3 packets (frames 0-2), 1: SEND 3
			// packets (3-5, frame 4 lost), 2: SEND ONLY (6), 3: WRITE
			// with immediate, 3 packets (7-9, frame 7 lost), 4: WRITE
			// with immediate ONLY (10).
			a, b := ucPair(t, mode, func(i int64) bool { return i == 4 || i == 7 })
			src := a.n.buffer(1<<16, 0x10000, 0, 1)
			dst := b.n.buffer(1<<16, 0x40000, abi.AccessAll, 2)
			for i := range 3 {
				b.recv(t, uint64(100+i), dst.sge(i*4096, 4096))
			}
			a.send(t, abi.SendWQE{WrID: 0, Opcode: abi.WRSend}, src.sge(0, 3000))
			a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRSend}, src.sge(4096, 3000))
			a.send(t, abi.SendWQE{WrID: 2, Opcode: abi.WRSend}, src.sge(8192, 500))
			a.send(t, abi.SendWQE{WrID: 3, Opcode: abi.WRRDMAWriteWithImm, RemoteAddr: dst.va + 0x8000, RKey: dst.key, ImmData: 3}, src.sge(12288, 3000))
			a.send(t, abi.SendWQE{WrID: 4, Opcode: abi.WRRDMAWriteWithImm, RemoteAddr: dst.va + 0xc000, RKey: dst.key, ImmData: 4}, src.sge(16384, 800))
			require.True(t, a.scq.wait(5, waitFor))
			for i, c := range a.scq.all() {
				assert.Equal(t, abi.WCSuccess, c.Status, "send %d completes: UC has no acknowledgement", i)
				assert.Equal(t, uint64(i), c.WrID)
			}
			require.True(t, b.rcq.wait(3, waitFor))
			settled(t, b.n, 9) // 11 frames, 2 lost: nothing more will complete
			got := b.rcq.all()
			require.Len(t, got, 3)
			assert.Equal(t, abi.CQE{WrID: 100, Opcode: abi.WCRecv, ByteLen: 3000, QPNum: b.qpn}, got[0])
			assert.Equal(t, abi.CQE{WrID: 101, Opcode: abi.WCRecv, ByteLen: 500, QPNum: b.qpn}, got[1], "message 1 lost; its receive WR took message 2")
			assert.Equal(t, abi.CQE{WrID: 102, Opcode: abi.WCRecvRDMAWithImm, ByteLen: 800, QPNum: b.qpn, WCFlags: abi.WCWithImm, ImmOrInv: 4}, got[2])
			assert.Equal(t, src.b[:3000], dst.b[:3000])
			assert.Equal(t, src.b[8192:8192+500], dst.b[4096:4096+500])
			assert.Equal(t, src.b[16384:16384+800], dst.b[0xc000:0xc000+800])
			ctr, err := b.n.eng.Counters(b.qpn)
			require.NoError(t, err)
			assert.Equal(t, uint64(3), ctr.Rare().Dropped.Load(), "frame 5, 8 and 9: the rest of the two broken messages")
			ca, err := a.n.eng.Counters(a.qpn)
			require.NoError(t, err)
			assert.Zero(t, ca.Rare().Retransmits.Load())
			assert.Equal(t, uint64(11), ca.PacketsSent.Load())
		})
	}
}

// TestUCLossy runs SENDs and RDMA WRITEs with immediate of 1 to 4
// packets through the seeded lossy in-memory link (drops, duplicates,
// reordering, delay, corruption) and checks what UC promises: every WR
// completes at the requester; every receive completion is one whole
// message, byte for byte, in order; a message may be missing, never
// partial or repeated. Both framings.
func TestUCLossy(t *testing.T) {
	const msgs = 300
	for _, mode := range modes {
		for _, loss := range []float64{0.02, 0.2} {
			t.Run(fmt.Sprintf("%v/loss%.0f%%", mode, loss*100), func(t *testing.T) {
				seed := uint64(0xc0ffee) + uint64(loss*1000)
				t.Logf("fault seed %#x", seed)
				f := link.Faults{Seed: seed, Drop: loss, Duplicate: loss / 2, Reorder: loss / 2, Delay: loss / 4, Corrupt: loss / 10}
				nw := newNetworkMode(t, mode, 4096, 1024)
				na := newNode(t, nw, "10.0.0.1", 1, &f)
				nb := newNode(t, nw, "10.0.0.2", 1, nil)
				o := ucOpts()
				o.sqDepth = 512
				a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
				connect(t, a, b, o)
				const slot = 4096
				src := na.buffer(msgs*slot, 0x100000, 0, 1)
				dst := nb.buffer(2*msgs*slot, 0x10000000, abi.AccessAll, 2)
				sizeOf := func(i int) int { return 8 + (i*977)%(slot-8) }
				for i := range msgs {
					binary.LittleEndian.PutUint64(src.b[i*slot:], uint64(i))
					b.recv(t, uint64(i), dst.sge(i*slot, slot))
				}
				for i := range msgs {
					w := abi.SendWQE{WrID: uint64(i), Opcode: abi.WRSend}
					if i%3 == 2 {
						w = abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMAWriteWithImm, ImmData: uint32(i),
							RemoteAddr: dst.va + uint64((msgs+i)*slot), RKey: dst.key}
					}
					a.send(t, w, src.sge(i*slot, sizeOf(i)))
				}
				require.True(t, a.scq.wait(msgs, waitFor))
				for _, c := range a.scq.all() {
					require.Equal(t, abi.WCSuccess, c.Status)
				}
				time.Sleep(50 * time.Millisecond) // delayed frames drain
				last := -1
				got := b.rcq.all()
				for k, c := range got {
					require.Equal(t, abi.WCSuccess, c.Status)
					var m int
					var data []byte
					if c.Opcode == abi.WCRecvRDMAWithImm {
						m = int(c.ImmOrInv)
						data = dst.b[(msgs+m)*slot:][:c.ByteLen]
					} else {
						buf := dst.b[int(c.WrID)*slot:]
						m = int(binary.LittleEndian.Uint64(buf))
						data = buf[:c.ByteLen]
					}
					require.Greater(t, m, last, "completion %d: messages in order, none twice", k)
					last = m
					require.Equal(t, sizeOf(m), int(c.ByteLen), "completion %d: message %d whole", k, m)
					require.Equal(t, src.b[m*slot:m*slot+sizeOf(m)], data, "completion %d: message %d intact", k, m)
				}
				t.Logf("%d of %d messages arrived", len(got), msgs)
				assert.NotEmpty(t, got)
				if loss >= 0.2 {
					assert.Less(t, len(got), msgs, "the faults must have cost messages")
				}
			})
		}
	}
}
