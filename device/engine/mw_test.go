package engine

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
)

// TestBindMW: a BIND_MW work request is executed by the requester when it
// reaches it, in order with the WRs before it, hands the memory layer the
// bind as the WQE carries it and completes with BIND_MW; a refused bind
// completes with MW_BIND_ERR, the QP goes to ERR and what follows is
// flushed (IBTA 10.6.7.2.3; rxe_do_local_ops).
func TestBindMW(t *testing.T) {
	a, b := pair(t, 1, nil, nil, defaultOpts())
	src := a.n.buffer(5000, 0x1000, abi.AccessAll, 1)
	dst := b.n.buffer(5000, 0x1000, abi.AccessAll, 2)
	want := abi.BindMW{MWHandle: 0x1234_56, RKey: 0x1234_57, MRLKey: src.key, Addr: 0x1100, Length: 300,
		Access: abi.AccessRemoteWrite | abi.AccessZeroBased}
	var w abi.SendWQE
	want.Put(&w)
	w.WrID, w.Opcode, w.Flags = 2, abi.WRBindMW, abi.SendSignaled

	a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 5000))
	a.send(t, w)
	require.True(t, a.scq.wait(2, waitFor))
	cq := a.scq.all()
	wantCQE(t, cq[0], abi.CQE{WrID: 1, Opcode: abi.WCRDMAWrite, QPNum: a.qpn})
	wantCQE(t, cq[1], abi.CQE{WrID: 2, Opcode: abi.WCBindMW, QPNum: a.qpn})
	a.n.mem.mu.Lock()
	assert.Equal(t, []abi.BindMW{want}, a.n.mem.binds)
	a.n.mem.mu.Unlock()
	assert.Equal(t, sum(src.b), sum(dst.b), "the WRITE before it")

	t.Run("unsignaled", func(t *testing.T) {
		a.scq.reset()
		w.WrID, w.Flags = 3, 0
		a.send(t, w)
		a.send(t, abi.SendWQE{WrID: 4, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 10))
		require.True(t, a.scq.wait(1, waitFor))
		wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 4, Opcode: abi.WCRDMAWrite, QPNum: a.qpn})
	})
	t.Run("refused", func(t *testing.T) {
		a.scq.reset()
		a.n.mem.mu.Lock()
		a.n.mem.bindErr = errors.New("fake: bind refused")
		a.n.mem.mu.Unlock()
		w.WrID, w.Flags = 5, 0 // errors complete even unsignaled
		a.send(t, w)
		a.send(t, abi.SendWQE{WrID: 6, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 10))
		require.True(t, a.scq.wait(2, waitFor))
		wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 5, Status: abi.WCMWBindErr, Opcode: abi.WCBindMW, QPNum: a.qpn})
		wantCQE(t, a.scq.all()[1], abi.CQE{WrID: 6, Status: abi.WCWRFlushErr, Opcode: abi.WCRDMAWrite, QPNum: a.qpn})
	})
}

// TestBindMWAccessWord: access bits above the 32 the ABI defines make the
// bind fail before it reaches the memory layer.
func TestBindMWAccessWord(t *testing.T) {
	a, _ := pair(t, 1, nil, nil, defaultOpts())
	w := abi.SendWQE{WrID: 7, Opcode: abi.WRBindMW, Flags: abi.SendSignaled, Swap: 1<<40 | uint64(abi.AccessRemoteRead)}
	a.send(t, w)
	require.True(t, a.scq.wait(1, waitFor))
	wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 7, Status: abi.WCMWBindErr, Opcode: abi.WCBindMW, QPNum: a.qpn})
	a.n.mem.mu.Lock()
	assert.Empty(t, a.n.mem.binds)
	a.n.mem.mu.Unlock()
}
