package engine

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

func TestRNR(t *testing.T) {
	t.Run("recv_posted_late", func(t *testing.T) {
		// rnr_retry 7 means retry forever (IBTA 9.7.5.2.8): far more
		// than 7 RNR NAKs, and the SEND still completes once a RECV is
		// posted.
		o := defaultOpts()
		o.rnrRetry = 7 // infinite
		o.minRNR = 1   // 10 us
		a, b := pair(t, 1, nil, nil, o)
		src := a.n.buffer(3000, 0x1000, abi.AccessAll, 1)
		dst := b.n.buffer(3000, 0x1000, abi.AccessAll, 2)
		a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(0, 3000))
		ca, err := a.n.eng.Counters(a.qpn)
		require.NoError(t, err)
		deadline := time.Now().Add(waitFor)
		for ca.Rare().RNRNAKsReceived.Load() < 20 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		require.GreaterOrEqual(t, ca.Rare().RNRNAKsReceived.Load(), uint64(20), "RNR NAKs while no RECV is posted")
		assert.Zero(t, a.scq.count.Load(), "the SEND waits for a RECV")
		b.recv(t, 2, dst.sge(0, 3000))
		require.True(t, a.scq.wait(1, waitFor))
		require.True(t, b.rcq.wait(1, waitFor))
		wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 1, Opcode: abi.WCSend, QPNum: a.qpn})
		wantCQE(t, b.rcq.all()[0], abi.CQE{WrID: 2, Opcode: abi.WCRecv, QPNum: b.qpn, ByteLen: 3000})
		assert.Equal(t, sum(src.b), sum(dst.b))
	})
	t.Run("rnr_retry_exhausted", func(t *testing.T) {
		// The requester waits the RNR timer the responder's NAK carries
		// (the responder's min_rnr_timer, 1.28 ms here; its own is 10
		// us) before each of its rnr_retry retries.
		o := defaultOpts()
		o.rnrRetry = 2
		o.minRNR = 1
		a, b := pair(t, 1, nil, nil, o)
		require.NoError(t, b.n.eng.ModifyQP(b.qpn, QPAttr{Mask: abi.QPAttrMinRNRTimer, MinRNRTimer: 14}))
		src := a.n.buffer(100, 0x1000, abi.AccessAll, 1)
		start := time.Now()
		a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(0, 100))
		require.True(t, a.scq.wait(1, waitFor))
		assert.GreaterOrEqual(t, time.Since(start), 2*roce.RNRTimer(14).Duration(), "two RNR waits of the peer's timer")
		wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 1, Status: abi.WCRNRRetryExcErr, Opcode: abi.WCSend, QPNum: a.qpn})
		ca, err := a.n.eng.Counters(a.qpn)
		require.NoError(t, err)
		assert.Equal(t, uint64(3), ca.Rare().RNRNAKsReceived.Load(), "rnr_retry 2: the first try and two retries")
		// The QP is in ERR: later WRs and RECVs are flushed.
		a.send(t, abi.SendWQE{WrID: 2, Opcode: abi.WRSend}, src.sge(0, 100))
		a.recv(t, 3, src.sge(0, 100))
		require.True(t, a.scq.wait(2, waitFor))
		require.True(t, a.rcq.wait(1, waitFor))
		wantCQE(t, a.scq.all()[1], abi.CQE{WrID: 2, Status: abi.WCWRFlushErr, Opcode: abi.WCSend, QPNum: a.qpn})
		wantCQE(t, a.rcq.all()[0], abi.CQE{WrID: 3, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: a.qpn})
		wantErrEvents(t, a) // RNR_RETRY_EXC_ERR says why: no event
		assert.Nil(t, b.state.events())
	})
}

// deadPeer returns a QP (ACK timeout 65.5 us, retry_cnt retry) connected
// to a peer QP that was then destroyed: frames to it are dropped.
func deadPeer(t *testing.T, retry uint8) (*tqp, qpOpts) {
	o := defaultOpts()
	o.timeout = 4 // 65.5 us
	o.retry = retry
	a, b := pair(t, 1, nil, nil, o)
	<-b.n.eng.DestroyQP(b.qpn)
	return a, o
}

// TestDeadPeer: a peer that never answers. Each local ACK timeout (4.096
// us * 2^timeout) costs a retry; after retry_cnt retries the oldest WR
// completes with RETRY_EXC_ERR, the QP goes to ERR and everything else,
// posted before or after, completes with WR_FLUSH_ERR. retry_cnt 7 is a
// count of 7 like any other (IBTA 9.7.6.1.3: a 3-bit count; Linux rxe
// makes 7 infinite, the IBTA does so only for rnr_retry).
func TestDeadPeer(t *testing.T) {
	for _, retry := range []uint8{3, 7} {
		t.Run(fmt.Sprintf("retry_cnt=%d", retry), func(t *testing.T) {
			a, o := deadPeer(t, retry)
			src := a.n.buffer(5000, 0x1000, abi.AccessAll, 1)
			a.recv(t, 9, src.sge(0, 10))
			start := time.Now()
			a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: 0x1000, RKey: 0x200}, src.sge(0, 5000))
			a.send(t, abi.SendWQE{WrID: 2, Opcode: abi.WRSend}, src.sge(0, 10))
			require.True(t, a.scq.wait(2, waitFor))
			elapsed := time.Since(start)
			cq := a.scq.all()
			wantCQE(t, cq[0], abi.CQE{WrID: 1, Status: abi.WCRetryExcErr, Opcode: abi.WCRDMAWrite, QPNum: a.qpn})
			wantCQE(t, cq[1], abi.CQE{WrID: 2, Status: abi.WCWRFlushErr, Opcode: abi.WCSend, QPNum: a.qpn})
			ca, err := a.n.eng.Counters(a.qpn)
			require.NoError(t, err)
			assert.Equal(t, uint64(retry)+1, ca.Rare().Timeouts.Load(), "retry_cnt %d: %d retries, the next timeout fails", retry, retry)
			assert.Equal(t, uint64(retry), ca.Rare().Retransmits.Load(), "one go-back-N restart per retry")
			assert.GreaterOrEqual(t, elapsed, time.Duration(retry+1)*time.Duration(ackTimeout(o.timeout)), "%d timeouts of 4.096 us * 2^%d", retry+1, o.timeout)
			require.True(t, a.rcq.wait(1, waitFor))
			wantCQE(t, a.rcq.all()[0], abi.CQE{WrID: 9, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: a.qpn})
			// Later posts complete too.
			a.send(t, abi.SendWQE{WrID: 3, Opcode: abi.WRSend}, src.sge(0, 10))
			a.recv(t, 10, src.sge(0, 10))
			require.True(t, a.scq.wait(3, waitFor))
			require.True(t, a.rcq.wait(2, waitFor))
			wantCQE(t, a.scq.all()[2], abi.CQE{WrID: 3, Status: abi.WCWRFlushErr, Opcode: abi.WCSend, QPNum: a.qpn})
			wantCQE(t, a.rcq.all()[1], abi.CQE{WrID: 10, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: a.qpn})
			wantErrEvents(t, a) // RETRY_EXC_ERR says why: no event
		})
	}
}

// TestRedundantRetries: the restarts after an ACK timeout with fewer than
// redundantRetries retries left put their first packet on the wire twice;
// the others once.
func TestRedundantRetries(t *testing.T) {
	for _, retry := range []uint8{2, 7} {
		t.Run(fmt.Sprintf("retry_cnt=%d", retry), func(t *testing.T) {
			a, _ := deadPeer(t, retry)
			src := a.n.buffer(100, 0x1000, abi.AccessAll, 1)
			a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: 0x1000, RKey: 0x200}, src.sge(0, 100))
			require.True(t, a.scq.wait(1, waitFor))
			wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 1, Status: abi.WCRetryExcErr, Opcode: abi.WCRDMAWrite, QPNum: a.qpn})
			ca, err := a.n.eng.Counters(a.qpn)
			require.NoError(t, err)
			dups := min(int(retry), redundantRetries)
			assert.Equal(t, uint64(1+int(retry)+dups), ca.PacketsSent.Load(),
				"the WRITE, %d retries, %d of them with the packet twice", retry, dups)
		})
	}
}

func TestRemoteErrors(t *testing.T) {
	t.Run("remote_access", func(t *testing.T) {
		a, b := pair(t, 2, nil, nil, defaultOpts())
		src := a.n.buffer(100, 0x1000, abi.AccessAll, 1)
		ro := b.n.buffer(100, 0x1000, abi.AccessRemoteRead|abi.AccessLocalWrite, 2) // no remote write
		b.recv(t, 20, ro.sge(0, 100))
		a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: ro.va, RKey: ro.key}, src.sge(0, 100))
		a.send(t, abi.SendWQE{WrID: 2, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, RemoteAddr: ro.va, RKey: ro.key}, src.sge(0, 100))
		require.True(t, a.scq.wait(2, waitFor))
		cq := a.scq.all()
		wantCQE(t, cq[0], abi.CQE{WrID: 1, Status: abi.WCRemAccessErr, Opcode: abi.WCRDMAWrite, QPNum: a.qpn})
		wantCQE(t, cq[1], abi.CQE{WrID: 2, Status: abi.WCWRFlushErr, Opcode: abi.WCRDMARead, QPNum: a.qpn})
		// The responder went to ERR too: its RQ is flushed.
		require.True(t, b.rcq.wait(1, waitFor))
		wantCQE(t, b.rcq.all()[0], abi.CQE{WrID: 20, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: b.qpn})
		wantErrNAKs(t, a, b, roce.NAKRemoteAccessError)
		// The requester's completion says why; the responder's client
		// has no completion that does (the WRITE took no receive WQE):
		// QP_ACCESS_ERR (IBTA C9-222.1.1).
		wantErrEvents(t, a)
		wantErrEvents(t, b, abi.EventQPAccessErr)
	})
	t.Run("bad_rkey_read_and_misaligned_atomic", func(t *testing.T) {
		for _, wr := range []abi.SendWQE{
			{WrID: 1, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, RemoteAddr: 0x1000, RKey: 0xdead00},
			{WrID: 1, Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled, RemoteAddr: 0x1003, RKey: 0},
		} {
			a, b := pair(t, 1, nil, nil, defaultOpts())
			src := a.n.buffer(100, 0x1000, abi.AccessAll, 1)
			word := b.n.buffer(64, 0x1000, abi.AccessAll, 2)
			want := abi.WCRemAccessErr
			if wr.Opcode == abi.WRAtomicFetchAdd {
				wr.RKey = word.key
				want = abi.WCRemInvReqErr
			}
			a.send(t, wr, src.sge(0, 8))
			require.True(t, a.scq.wait(1, waitFor))
			wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 1, Status: want, Opcode: wcOpcode(wr.Opcode), QPNum: a.qpn})
			if want == abi.WCRemAccessErr {
				wantErrNAKs(t, a, b, roce.NAKRemoteAccessError)
				wantErrEvents(t, b, abi.EventQPAccessErr)
			} else {
				wantErrNAKs(t, a, b, roce.NAKInvalidRequest)
				wantErrEvents(t, b, abi.EventQPReqErr)
			}
			wantErrEvents(t, a)
		}
	})
	t.Run("recv_too_small", func(t *testing.T) {
		a, b := pair(t, 1, nil, nil, defaultOpts())
		src := a.n.buffer(100, 0x1000, abi.AccessAll, 1)
		dst := b.n.buffer(50, 0x1000, abi.AccessAll, 2)
		b.recv(t, 7, dst.sge(0, 50))
		a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(0, 100))
		require.True(t, a.scq.wait(1, waitFor))
		require.True(t, b.rcq.wait(1, waitFor))
		wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 1, Status: abi.WCRemInvReqErr, Opcode: abi.WCSend, QPNum: a.qpn})
		wantCQE(t, b.rcq.all()[0], abi.CQE{WrID: 7, Status: abi.WCLocLenErr, Opcode: abi.WCRecv, QPNum: b.qpn})
		wantErrNAKs(t, a, b, roce.NAKInvalidRequest)
		// Both clients have a completion that says why: no event.
		wantErrEvents(t, a)
		wantErrEvents(t, b)
	})
	t.Run("remote_operational", func(t *testing.T) {
		// The responder cannot write the RECV's buffer (its lkey is
		// unknown): its receive completes with LOC_PROT_ERR, it answers
		// NAK remote operational error, the SEND completes with
		// REM_OP_ERR, and both QPs go to ERR.
		a, b := pair(t, 1, nil, nil, defaultOpts())
		src := a.n.buffer(100, 0x1000, abi.AccessAll, 1)
		b.recv(t, 7, abi.SGE{Addr: 0x1000, Length: 100, LKey: 0xbad00})
		b.recv(t, 8, abi.SGE{Addr: 0x1000, Length: 100, LKey: 0xbad00})
		a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(0, 100))
		a.send(t, abi.SendWQE{WrID: 2, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(0, 100))
		require.True(t, a.scq.wait(2, waitFor))
		require.True(t, b.rcq.wait(2, waitFor))
		wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 1, Status: abi.WCRemOpErr, Opcode: abi.WCSend, QPNum: a.qpn})
		wantCQE(t, a.scq.all()[1], abi.CQE{WrID: 2, Status: abi.WCWRFlushErr, Opcode: abi.WCSend, QPNum: a.qpn})
		wantCQE(t, b.rcq.all()[0], abi.CQE{WrID: 7, Status: abi.WCLocProtErr, Opcode: abi.WCRecv, QPNum: b.qpn})
		wantCQE(t, b.rcq.all()[1], abi.CQE{WrID: 8, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: b.qpn})
		wantErrNAKs(t, a, b, roce.NAKRemoteOperationalErr)
		wantErrEvents(t, a)
		wantErrEvents(t, b) // LOC_PROT_ERR says why: no event
	})
	t.Run("local_protection", func(t *testing.T) {
		a, b := pair(t, 1, nil, nil, defaultOpts())
		dst := b.n.buffer(100, 0x1000, abi.AccessAll, 2)
		a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, abi.SGE{Addr: 0x1000, Length: 100, LKey: 0xbad})
		require.True(t, a.scq.wait(1, waitFor))
		wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 1, Status: abi.WCLocProtErr, Opcode: abi.WCRDMAWrite, QPNum: a.qpn})
		wantErrEvents(t, a)
		assert.Nil(t, b.state.events())
	})
}

// wantErrNAKs checks the fatal-NAK counters after one NAK of code c from
// responder b to requester a: one sent by b and one received by a of that
// code, none of another.
func wantErrNAKs(t *testing.T, a, b *tqp, c roce.NAKCode) {
	t.Helper()
	ca, _ := a.n.eng.Counters(a.qpn)
	cb, _ := b.n.eng.Counters(b.qpn)
	va, vb := ca.Load(), cb.Load()
	sent := [3]uint64{vb.InvalidReqNAKsSent, vb.RemAccessNAKsSent, vb.RemOpNAKsSent}
	rcvd := [3]uint64{va.InvalidReqNAKsReceived, va.RemAccessNAKsReceived, va.RemOpNAKsReceived}
	var want [3]uint64
	want[c-roce.NAKInvalidRequest] = 1
	assert.Equal(t, want, sent, "fatal NAKs sent by the responder (invalid request, remote access, remote operational)")
	assert.Equal(t, want, rcvd, "fatal NAKs received by the requester")
	assert.Zero(t, va.InvalidReqNAKsSent+va.RemAccessNAKsSent+va.RemOpNAKsSent, "the requester sent none")
}

// TestFence: a fenced WR is not started before the READ ahead of it has
// completed (IBTA 10.8.3.3); an unfenced one is.
func TestFence(t *testing.T) {
	for _, fence := range []bool{true, false} {
		t.Run(fmt.Sprintf("fence=%v", fence), func(t *testing.T) {
			a, b := pair(t, 1, nil, nil, defaultOpts())
			src := b.n.buffer(256<<10, 0x100000, abi.AccessAll, 1)
			dst := a.n.buffer(256<<10, 0x100000, abi.AccessAll, 2)
			wsrc := a.n.buffer(64, 0x900000, abi.AccessAll, 3)
			var mu sync.Mutex
			var events []string
			var hook traceFunc = func(qp *QP, format string, args ...any) {
				if qp.qpn != a.qpn || len(args) == 0 {
					return
				}
				op, ok := args[0].(roce.Opcode)
				if !ok || (op != roce.OpRCReadResponseLast && op != roce.OpRCWriteOnly) {
					return
				}
				// The first of each: a retransmission (an ACK timeout on a
				// loaded machine) repeats the send, and the order of the
				// first ones is what the fence decides.
				ev := strings.Fields(format)[0] + " " + op.String()
				mu.Lock()
				if !slices.Contains(events, ev) {
					events = append(events, ev)
				}
				mu.Unlock()
			}
			traceHook.Store(&hook)
			t.Cleanup(func() { traceHook.Store(nil) })
			flags := abi.SendSignaled
			if fence {
				flags |= abi.SendFence
			}
			// Both posted before the kick, so without the fence the WRITE
			// goes out right behind the READ request.
			require.NoError(t, a.sq.post(abi.SendWQE{WrID: 1, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, RemoteAddr: src.va, RKey: src.key},
				[]abi.SGE{dst.sge(0, 256<<10)}, nil))
			require.NoError(t, a.sq.post(abi.SendWQE{WrID: 2, Opcode: abi.WRRDMAWrite, Flags: flags, RemoteAddr: src.va, RKey: src.key},
				[]abi.SGE{wsrc.sge(0, 64)}, nil))
			a.n.eng.Kick(a.qpn)
			require.True(t, a.scq.wait(2, waitFor))
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, events, 2, "%v", events)
			if fence {
				assert.Equal(t, []string{"rx RC_RDMA_READ_RESPONSE_LAST", "send RC_RDMA_WRITE_ONLY"}, events)
			} else {
				assert.Equal(t, []string{"send RC_RDMA_WRITE_ONLY", "rx RC_RDMA_READ_RESPONSE_LAST"}, events)
			}
		})
	}
}

// TestReadAtomicCredits: a requester never has more READ and atomic
// requests outstanding than max_rd_atomic (the responder's resources
// agreed at connection time): with a queue of
// READs and FETCH_AND_ADDs posted at once, the number sent but not yet
// answered (the last READ response or the atomic acknowledgement
// received) reaches max_rd_atomic and never exceeds it, and everything
// completes with the right data.
func TestReadAtomicCredits(t *testing.T) {
	for _, credits := range []uint8{1, 3} {
		t.Run(fmt.Sprintf("max_rd_atomic=%d", credits), func(t *testing.T) {
			o := defaultOpts()
			o.rdAtomic = credits
			a, b := pair(t, 1, nil, nil, o)
			var mu sync.Mutex
			outstanding, most := 0, 0
			var hook traceFunc = func(qp *QP, format string, args ...any) {
				if qp.qpn != a.qpn || len(args) == 0 {
					return
				}
				op, ok := args[0].(roce.Opcode)
				if !ok {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				switch ev := strings.Fields(format)[0]; {
				case ev == "send" && (op == roce.OpRCReadRequest || op == roce.OpRCFetchAdd):
					outstanding++
					most = max(most, outstanding)
				case ev == "rx" && (op == roce.OpRCReadResponseLast || op == roce.OpRCAtomicAck):
					outstanding--
				}
			}
			traceHook.Store(&hook)
			t.Cleanup(func() { traceHook.Store(nil) })
			const n = 12
			src := b.n.buffer(n*8192, 0x100000, abi.AccessAll, 1)
			counter := b.n.buffer(8, 0x900000, abi.AccessAll, 0)
			binary.LittleEndian.PutUint64(counter.b, 0)
			dst := a.n.buffer(n*8192, 0x100000, abi.AccessAll, 2)
			res := a.n.buffer(n*8, 0x900000, abi.AccessAll, 3)
			for i := range n {
				if i%3 == 2 {
					require.NoError(t, a.sq.post(abi.SendWQE{WrID: uint64(i), Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled,
						RemoteAddr: counter.va, RKey: counter.key, CompareAdd: 1}, []abi.SGE{res.sge(8*i, 8)}, nil))
					continue
				}
				require.NoError(t, a.sq.post(abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMARead, Flags: abi.SendSignaled,
					RemoteAddr: src.va + uint64(8192*i), RKey: src.key}, []abi.SGE{dst.sge(8192*i, 8192)}, nil))
			}
			a.n.eng.Kick(a.qpn)
			require.True(t, a.scq.wait(n, waitFor))
			for i, c := range a.scq.all() {
				want := abi.CQE{WrID: uint64(i), Opcode: abi.WCRDMARead, QPNum: a.qpn, ByteLen: 8192}
				if i%3 == 2 {
					want = abi.CQE{WrID: uint64(i), Opcode: abi.WCFetchAdd, QPNum: a.qpn}
				}
				wantCQE(t, c, want)
				if i%3 != 2 {
					assert.Equal(t, sum(src.b[8192*i:8192*(i+1)]), sum(dst.b[8192*i:8192*(i+1)]), "READ %d data", i)
				}
			}
			assert.Equal(t, uint64(n/3), binary.LittleEndian.Uint64(counter.b))
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, int(credits), most, "READ/atomic requests outstanding at most")
			assert.Zero(t, outstanding)
		})
	}
}
