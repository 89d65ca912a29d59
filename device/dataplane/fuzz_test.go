package dataplane

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/doorbell"
	"github.com/vrnic/vrnic/queues"
)

// FuzzSQSource feeds the send adapter arbitrary ring contents and
// producer indices (all client-controlled) and checks what reaches the
// engine: never more SGEs or inline bytes than the QP's capabilities,
// errors only for a malformed WQE or a broken ring (reported once), and
// a consumer index that never passes the producer index.
func FuzzSQSource(f *testing.F) {
	const slots, maxSGE, maxInline = 4, 2, 32
	stride := int(abi.SQWQEBlocks(maxSGE, maxInline) * abi.WQEBlock)
	good := make([]byte, slots*stride)
	w := abi.SendWQE{WrID: 1, Opcode: abi.WRSend, NumSGE: 1}
	w.Put(good)
	(&abi.SGE{Addr: 1, Length: 8, LKey: 2}).Put(good[abi.WQEBlock:])
	f.Add(good, []byte{1, 0, 0, 0, 2, 0, 0, 0})
	f.Add(good, []byte{9, 0, 0, 0})
	f.Add(make([]byte, slots*stride), []byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, ring []byte, pis []byte) {
		r := make([]byte, slots*stride)
		copy(r, ring)
		rec := doorbell.QPRecord{SQPI: new(atomic.Uint32), RQPI: new(atomic.Uint32), SQCI: new(atomic.Uint32), RQCI: new(atomic.Uint32)}
		s, err := newSQSource(r, abi.QPCap{MaxSendWR: slots, MaxSendSGE: maxSGE, MaxInlineData: maxInline}, rec)
		if err != nil {
			t.Fatal(err)
		}
		work := &engine.SendWork{SGEs: make([]abi.SGE, 0, maxSGE), Inline: make([]byte, 0, maxInline)}
		broken := 0
		consumed := uint32(0) // WQEs taken off the ring, malformed ones included
		for i := 0; i+4 <= len(pis) && i < 64; i += 4 {
			rec.SQPI.Store(binary.LittleEndian.Uint32(pis[i:]))
			for range slots + 1 {
				ok, err := s.PollSend(work)
				if len(work.SGEs) > maxSGE || len(work.Inline) > maxInline || cap(work.SGEs) != maxSGE || cap(work.Inline) != maxInline {
					t.Fatalf("private copy grew: %d SGEs, %d inline bytes", len(work.SGEs), len(work.Inline))
				}
				if err != nil {
					var we *queues.WQEError
					switch {
					case errors.As(err, &we):
					case errors.Is(err, errRingBroken):
						broken++
					default:
						t.Fatalf("unexpected error %v", err)
					}
				}
				if !ok {
					if err != nil {
						t.Fatal("an error without a WQE")
					}
					break
				}
				if !errors.Is(err, errRingBroken) {
					consumed++
				}
				if err == nil && work.Flags&abi.SendInline == 0 && len(work.Inline) != 0 {
					t.Fatal("inline data without the inline flag")
				}
			}
			if ci := rec.SQCI.Load(); ci != consumed {
				t.Fatalf("consumer index %d, %d WQEs taken", ci, consumed)
			}
		}
		if broken > 1 {
			t.Fatalf("broken ring reported %d times", broken)
		}
	})
}

// FuzzRecvSource does the same for a receive queue.
func FuzzRecvSource(f *testing.F) {
	const slots, maxSGE = 4, 2
	stride := int(abi.RQWQESize(maxSGE))
	good := make([]byte, slots*stride)
	(&abi.RecvWQE{WrID: 5, NumSGE: 1}).Put(good)
	(&abi.SGE{Addr: 1, Length: 8, LKey: 2}).Put(good[abi.SizeofRecvWQE:])
	f.Add(good, []byte{1, 0, 0, 0})
	f.Add(good, []byte{200, 0, 0, 0})
	f.Fuzz(func(t *testing.T, ring []byte, pis []byte) {
		r := make([]byte, slots*stride)
		copy(r, ring)
		pi, ci := new(atomic.Uint32), new(atomic.Uint32)
		s, err := newRQSource(r, slots, maxSGE, doorbell.QPRecord{RQPI: pi, RQCI: ci})
		if err != nil {
			t.Fatal(err)
		}
		work := &engine.RecvWork{SGEs: make([]abi.SGE, 0, maxSGE)}
		broken := 0
		consumed := uint32(0)
		for i := 0; i+4 <= len(pis) && i < 64; i += 4 {
			pi.Store(binary.LittleEndian.Uint32(pis[i:]))
			for range slots + 1 {
				ok, err := s.PollRecv(work)
				if len(work.SGEs) > maxSGE || cap(work.SGEs) != maxSGE {
					t.Fatalf("private copy grew: %d SGEs", len(work.SGEs))
				}
				var we *queues.WQEError
				switch {
				case err == nil, errors.As(err, &we):
				case errors.Is(err, errRingBroken):
					broken++
				default:
					t.Fatalf("unexpected error %v", err)
				}
				if !ok {
					break
				}
				if !errors.Is(err, errRingBroken) {
					consumed++
				}
			}
			if c := ci.Load(); c != consumed {
				t.Fatalf("consumer index %d, %d WQEs taken", c, consumed)
			}
		}
		if broken > 1 {
			t.Fatalf("broken ring reported %d times", broken)
		}
	})
}
