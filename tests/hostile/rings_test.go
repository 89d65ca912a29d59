package hostile

// Ring probe: a client that writes garbage into its own rings and
// doorbell records (the daemon never trusts shared memory). The hostile
// client (the memory probes' helper process, mode "rings") connects pairs
// of RC QPs of its own through the daemon and breaks one QP of each pair:
//
//   - rq: its RQ producer index claims more receives than the ring holds,
//     and the peer SENDs to it;
//   - sq: its SQ producer index claims more WQEs than the ring holds;
//   - wqe: one SQ slot holds random bytes, published with a producer
//     index that is right;
//   - cq: its send CQ's consumer index is past the producer's, then it
//     posts a WRITE.
//
// For each it reports the completion the broken QP got (where one can be
// written) and the state QUERY_QP gives. The victim beside it (memProbe)
// keeps its memory intact and progresses; the daemon's memory comes back
// to its baseline once the hostile client is killed.

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/rcpair"
	"github.com/vrnic/vrnic/verbs"
)

func TestRingGarbage(t *testing.T) {
	memProbe(t, "rings", func(t *testing.T, r memProbeResult) {
		// A broken queue of a QP: the QP's own error completion, ERR.
		assert.Equal(t, "LOC_QP_OP_ERR/ERR", r.hostile["rq"], "garbage RQ producer index: the receiving QP")
		assert.Equal(t, "REM_OP_ERR/ERR", r.hostile["rq_peer"], "garbage RQ producer index: the sender")
		assert.Equal(t, "LOC_QP_OP_ERR/ERR", r.hostile["sq"], "garbage SQ producer index")
		assert.Contains(t, []string{"LOC_QP_OP_ERR/ERR", "LOC_LEN_ERR/ERR", "LOC_PROT_ERR/ERR"}, r.hostile["wqe"], "garbage WQE")
		// A CQ whose consumer index is garbage takes CQEs while the ring
		// the daemon knows of has room, then none: the CQ overflows and
		// the QP goes to ERR.
		assert.True(t, strings.HasSuffix(r.hostile["cq"], "/ERR"), "garbage CQ consumer index: %s", r.hostile["cq"])
	})
}

// ringsPair is two RC QPs of one context connected to each other through
// the daemon, with their own CQs, and an MR both may address.
type ringsPair struct {
	a, b   *verbs.QP
	ca, cb *verbs.CQ
	mr     *verbs.MR
}

func ringsNewPair(c *verbs.Context, pd *verbs.PD, mr *verbs.MR, gid [16]byte, psn uint32) (*ringsPair, error) {
	p := &ringsPair{mr: mr}
	var err error
	if p.ca, err = c.CreateCQ(16, nil); err != nil {
		return nil, err
	}
	if p.cb, err = c.CreateCQ(16, nil); err != nil {
		return nil, err
	}
	mk := func(cq *verbs.CQ) (*verbs.QP, error) {
		return pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq,
			Cap: abi.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	}
	if p.a, err = mk(p.ca); err != nil {
		return nil, err
	}
	if p.b, err = mk(p.cb); err != nil {
		return nil, err
	}
	attr := rcpair.Attr{MTU: abi.MTU1024, MaxRdAtomic: 1}
	if err := rcpair.Connect(p.a, psn, rcpair.Local(p.b, psn+100, gid, mr), attr); err != nil {
		return nil, err
	}
	if err := rcpair.Connect(p.b, psn+100, rcpair.Local(p.a, psn, gid, mr), attr); err != nil {
		return nil, err
	}
	return p, nil
}

// ringsOutcome waits (at most 10 s) for a completion on cq and for qp to
// leave RTS, and returns "STATUS/STATE" ("none/STATE" without a
// completion).
func ringsOutcome(qp *verbs.QP, cq *verbs.CQ) string {
	wc := make([]abi.CQE, 8)
	status := "none"
	deadline := time.Now().Add(10 * time.Second)
	var state abi.QPState
	for time.Now().Before(deadline) {
		if status == "none" {
			if n := cq.Poll(wc); n > 0 {
				status = wc[0].Status.String()
			}
		}
		a, err := qp.Query()
		if err != nil {
			return "query: " + err.Error()
		}
		state = a.Attr.QPState
		if status != "none" && state != abi.QPSRTS {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Sprintf("%s/%v", status, state)
}

// ringsHostile is the hostile client of TestRingGarbage.
func ringsHostile(sock string) (string, error) {
	c, err := verbs.Open(sock, verbs.WithClientName("hostile-rings"))
	if err != nil {
		return "", err
	}
	pd, err := c.AllocPD()
	if err != nil {
		return "", err
	}
	buf, err := c.Alloc(1<<16, 4096)
	if err != nil {
		return "", err
	}
	mr, err := pd.RegMR(buf, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead)
	if err != nil {
		return "", err
	}
	g, err := c.QueryGID(1, 0)
	if err != nil {
		return "", err
	}
	pair := func(psn uint32) (*ringsPair, error) { return ringsNewPair(c, pd, mr, g.GID, psn) }
	put32 := func(b []byte, v uint32) { binary.LittleEndian.PutUint32(b, v) }
	get32 := func(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
	write := func(qp *verbs.QP) error {
		return qp.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
			SGL: []abi.SGE{mr.SGE(0, 64)}, RemoteAddr: mr.Addr + 4096, RKey: mr.RKey})
	}
	out := map[string]string{}

	// rq: b's RQ claims 4x its ring; a SENDs to b.
	p, err := pair(1000)
	if err != nil {
		return "", err
	}
	rec := p.b.RawDoorbellRecord()
	put32(rec[abi.OffDBRQPI:], get32(rec[abi.OffDBRQCI:])+4*8)
	if err := p.a.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{mr.SGE(0, 16)}}); err != nil {
		return "", err
	}
	out["rq"], out["rq_peer"] = ringsOutcome(p.b, p.cb), ringsOutcome(p.a, p.ca)

	// sq: a's SQ claims 4x its ring.
	if p, err = pair(2000); err != nil {
		return "", err
	}
	rec = p.a.RawDoorbellRecord()
	put32(rec[abi.OffDBSQPI:], get32(rec[abi.OffDBSQCI:])+4*8)
	p.a.RawMark() // as a post marks it in the doorbell summary (ABI 1.3)
	c.RawKick()
	out["sq"] = ringsOutcome(p.a, p.ca)

	// wqe: a valid producer index over a slot of random bytes.
	if p, err = pair(3000); err != nil {
		return "", err
	}
	rng := rand.New(rand.NewPCG(7, 7))
	rec = p.a.RawDoorbellRecord()
	pi := get32(rec[abi.OffDBSQPI:])
	sq := p.a.RawSQ()
	slot := len(sq) / 8 // 8 slots
	garbage := sq[int(pi%8)*slot : int(pi%8+1)*slot]
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}
	garbage[0] = 0xee // an opcode no WR has (the first byte of the slot)
	put32(rec[abi.OffDBSQPI:], pi+1)
	p.a.RawMark()
	c.RawKick()
	out["wqe"] = ringsOutcome(p.a, p.ca)

	// cq: a's CQ consumer index far past its producer's, then more
	// WRITEs than the CQ holds (the daemon needs the consumer index once
	// the ring it knows of is full).
	if p, err = pair(4000); err != nil {
		return "", err
	}
	crec := p.ca.RawDoorbellRecord()
	put32(crec[abi.OffDBCQCI:], get32(crec[abi.OffDBCQPI:])+1<<20)
	for posted, deadline := 0, time.Now().Add(10*time.Second); posted < 40 && time.Now().Before(deadline); {
		if err := write(p.a); err != nil {
			if st, _ := p.a.Query(); st.Attr.QPState != abi.QPSRTS {
				break // the QP left RTS: nothing more completes
			}
			time.Sleep(time.Millisecond) // the SQ is full until the daemon takes its WQEs
			continue
		}
		posted++
	}
	out["cq"] = ringsOutcome(p.a, p.ca)

	var b strings.Builder
	for _, k := range []string{"rq", "rq_peer", "sq", "wqe", "cq"} {
		fmt.Fprintf(&b, "%s=%s ", k, out[k])
	}
	return strings.TrimSpace(b.String()), nil
}
