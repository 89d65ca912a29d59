package hostile

// Memory window probes: a client names another client's window (its
// handle, its rkey) in DEALLOC_MW, in a BIND_MW work request and in a
// LOCAL_INV, and uses handles that are stale or of the wrong kind. Each
// gets its errno or error completion, the victim's window keeps working,
// and once the clients are gone the daemon holds nothing.

import (
	"bytes"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/rcpair"
	"github.com/vrnic/vrnic/verbs"
)

// mwSide is one client: two RC QPs connected to each other on the
// daemon's loopback, a buffer whose MR lets windows be bound to it (no
// remote right of its own), and a source buffer.
type mwSide struct {
	c        *verbs.Context
	pd       *verbs.PD
	cq       *verbs.CQ
	qpA, qpB *verbs.QP // A writes into B's memory; B binds the windows
	src, tgt *verbs.Buffer
	mrSrc    *verbs.MR
	mrTgt    *verbs.MR // LOCAL_WRITE | MW_BIND
	wc       []abi.CQE
	seq      uint64
}

func newMWSide(t *testing.T, sock, name string) *mwSide {
	t.Helper()
	s := &mwSide{wc: make([]abi.CQE, 16)}
	var err error
	s.c, err = verbs.Open(sock, verbs.WithClientName(name))
	require.NoError(t, err)
	s.pd, err = s.c.AllocPD()
	require.NoError(t, err)
	s.cq, err = s.c.CreateCQ(64, nil)
	require.NoError(t, err)
	attr := verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: s.cq, RecvCQ: s.cq, Cap: abi.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}
	s.qpA, err = s.pd.CreateQP(attr)
	require.NoError(t, err)
	s.qpB, err = s.pd.CreateQP(attr)
	require.NoError(t, err)
	s.src, err = s.c.Alloc(8192, 4096)
	require.NoError(t, err)
	s.tgt, err = s.c.Alloc(8192, 4096)
	require.NoError(t, err)
	s.mrSrc, err = s.pd.RegMR(s.src, abi.AccessLocalWrite)
	require.NoError(t, err)
	s.mrTgt, err = s.pd.RegMR(s.tgt, abi.AccessLocalWrite|abi.AccessMWBind)
	require.NoError(t, err)
	gid, err := s.c.QueryGID(1, 0)
	require.NoError(t, err)
	a, b := rcpair.Local(s.qpA, 100, gid.GID, s.mrSrc), rcpair.Local(s.qpB, 900, gid.GID, s.mrTgt)
	ra := rcpair.Attr{MTU: abi.MTU1024, MaxRdAtomic: 1}
	require.NoError(t, rcpair.Connect(s.qpA, 100, b, ra))
	require.NoError(t, rcpair.Connect(s.qpB, 900, a, ra))
	return s
}

// post posts wr on qp and returns the status of its completion.
func (s *mwSide) post(t *testing.T, qp *verbs.QP, wr verbs.SendWR) abi.WCStatus {
	t.Helper()
	s.seq++
	wr.WrID, wr.Flags = s.seq, wr.Flags|abi.SendSignaled
	require.NoError(t, qp.PostSend(&wr))
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n := s.cq.Poll(s.wc)
		for _, e := range s.wc[:n] {
			if e.WrID == s.seq {
				return e.Status
			}
		}
		if n == 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}
	t.Fatalf("no completion for WR %d in 10 s", s.seq)
	return 0
}

// write writes 64 bytes from A through rkey at va of B's memory and, when
// it succeeds, checks they landed.
func (s *mwSide) write(t *testing.T, rkey uint32, va uint64) abi.WCStatus {
	t.Helper()
	s.seq++
	msg := []byte(fmt.Sprintf("%-64d", s.seq))
	copy(s.src.Bytes, msg)
	st := s.post(t, s.qpA, verbs.SendWR{Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{s.mrSrc.SGE(0, 64)}, RemoteAddr: va, RKey: rkey})
	if st == abi.WCSuccess {
		off := va - s.mrTgt.Addr
		assert.True(t, bytes.Equal(msg, s.tgt.Bytes[off:off+64]), "the WRITE landed")
	}
	return st
}

func mwResources(t *testing.T, adm *admin.Client) admin.ResourceCounts {
	t.Helper()
	i, err := adm.Info()
	require.NoError(t, err)
	return i.Resources
}

func TestMWForeignAndStaleHandles(t *testing.T) {
	d := memHelperStartDaemon(t, "")
	adm, err := admin.Dial(d.sock)
	require.NoError(t, err)
	defer adm.Close()
	before := mwResources(t, adm)

	v := newMWSide(t, d.sock, "victim")
	vmw, err := v.pd.AllocMW(abi.MWType2)
	require.NoError(t, err)
	vkey := vmw.NextRKey()
	require.Equal(t, abi.WCSuccess, v.post(t, v.qpB, vmw.BindWR(0, 0, vkey, v.mrTgt, v.mrTgt.Addr+4096, 4096, abi.AccessRemoteWrite)))
	require.Equal(t, abi.WCSuccess, v.write(t, vkey, v.mrTgt.Addr+4096), "the victim's window works")

	x := newMWSide(t, d.sock, "attacker")
	// DEALLOC_MW of the victim's window: not the attacker's.
	assert.ErrorIs(t, x.c.Destroy(abi.CmdDeallocMW, vmw.Handle), syscall.ENOENT)
	// ALLOC_MW in a PD the client does not hold (PD handles are the
	// context's own: the victim's number names the attacker's PD, if any),
	// of a bad type.
	_, err = x.c.RawPD(0x7fff).AllocMW(abi.MWType1)
	assert.ErrorIs(t, err, syscall.ENOENT, "a PD handle the context does not hold")
	for _, typ := range []abi.MWType{0, 3, 0xffffffff} {
		_, err = x.pd.AllocMW(typ)
		assert.ErrorIs(t, err, syscall.EINVAL, "type %d", typ)
	}
	// BIND_MW of the victim's window (its handle, the victim's MR, and
	// then the attacker's own MR): refused, the attacker's QP in error.
	forged := &verbs.MW{Handle: vmw.Handle, RKey: vkey}
	assert.Equal(t, abi.WCMWBindErr, x.post(t, x.qpB, forged.BindWR(0, 0, vkey+1, v.mrTgt, v.mrTgt.Addr, 64, abi.AccessRemoteWrite|abi.AccessRemoteRead)))
	x = newMWSideReplacing(t, x, d.sock)
	assert.Equal(t, abi.WCMWBindErr, x.post(t, x.qpB, forged.BindWR(0, 0, vkey+1, x.mrTgt, x.mrTgt.Addr, 64, abi.AccessRemoteWrite)))
	x = newMWSideReplacing(t, x, d.sock)
	// LOCAL_INV of the victim's window rkey: not in the attacker's PD.
	assert.Equal(t, abi.WCLocProtErr, x.post(t, x.qpB, verbs.SendWR{Opcode: abi.WRLocalInv, InvRKey: vkey}))
	x = newMWSideReplacing(t, x, d.sock)
	// The victim's rkey through the attacker's QP: another PD's window.
	assert.Equal(t, abi.WCRemAccessErr, x.write(t, vkey, v.mrTgt.Addr+4096))
	x = newMWSideReplacing(t, x, d.sock)
	require.Equal(t, abi.WCSuccess, v.write(t, vkey, v.mrTgt.Addr+4096), "the victim's window still works")

	// Stale and wrong-kind handles of the attacker's own.
	own, err := x.pd.AllocMW(abi.MWType1)
	require.NoError(t, err)
	require.NoError(t, own.Dealloc())
	assert.ErrorIs(t, own.Dealloc(), syscall.ENOENT, "deallocated twice")
	assert.ErrorIs(t, x.c.Destroy(abi.CmdDeallocMW, x.mrTgt.Handle), syscall.ENOENT, "an MR handle")
	assert.ErrorIs(t, x.c.Destroy(abi.CmdDeallocMW, x.pd.Handle), syscall.ENOENT, "a PD handle")
	assert.Equal(t, abi.WCMWBindErr, x.post(t, x.qpB, own.BindWR(0, 0, own.NextRKey(), x.mrTgt, x.mrTgt.Addr, 64, abi.AccessRemoteWrite)), "bind of a deallocated window")
	// A window bound to an MR holds it.
	x = newMWSideReplacing(t, x, d.sock)
	mine, err := x.pd.AllocMW(abi.MWType1)
	require.NoError(t, err)
	require.Equal(t, abi.WCSuccess, x.post(t, x.qpB, mine.BindWR(0, 0, mine.NextRKey(), x.mrTgt, x.mrTgt.Addr, 64, abi.AccessRemoteWrite)))
	assert.ErrorIs(t, x.mrTgt.Dereg(), syscall.EINVAL, "DEREG_MR with a window bound")
	assert.ErrorIs(t, x.pd.Dealloc(), syscall.EBUSY, "DEALLOC_PD with a window")
	require.Equal(t, abi.WCSuccess, x.write(t, mine.RKey, x.mrTgt.Addr))

	res := mwResources(t, adm)
	assert.Equal(t, 2, res.MW, "the victim's and the attacker's windows: %+v", res)
	// The attacker leaves with its window bound; the victim goes on.
	require.NoError(t, x.c.Close())
	require.Eventually(t, func() bool { return mwResources(t, adm).MW == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, abi.WCSuccess, v.write(t, vkey, v.mrTgt.Addr+4096), "the victim's window after the attacker left")
	require.NoError(t, vmw.Dealloc())
	assert.Equal(t, abi.WCRemAccessErr, v.write(t, vkey, v.mrTgt.Addr+4096), "a deallocated window")
	require.NoError(t, v.c.Close())
	require.Eventually(t, func() bool { return mwResources(t, adm) == before }, 10*time.Second, 10*time.Millisecond,
		"the daemon holds what it held before: %+v, want %+v", mwResources(t, adm), before)
}

// newMWSideReplacing closes s (its QPs are in error) and opens a new
// client in its place.
func newMWSideReplacing(t *testing.T, s *mwSide, sock string) *mwSide {
	t.Helper()
	require.NoError(t, s.c.Close())
	return newMWSide(t, sock, "attacker")
}
