package engine

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/link"
)

// ATOMIC WRITE and FLUSH (IBTA 1.5 Memory Placement Extensions) between
// two engines.

// TestAtomicWrite: the 8 bytes land as they lay in the WQE, the words
// around are untouched, and the completion is ATOMIC_WRITE with every
// field right; a FLUSH after it (global visibility, range and whole
// region) completes as FLUSH. Nothing consumes a receive WQE.
func TestAtomicWrite(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			a, b := pairMode(t, mode, 1, nil, nil, defaultOpts())
			word := b.n.buffer(24, 0x40000000, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessFlushGlobal, 1)
			before := append([]byte(nil), word.b...)
			v := []byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}
			a.send(t, abi.SendWQE{WrID: 7, Opcode: abi.WRAtomicWrite, Flags: abi.SendSignaled, RemoteAddr: word.va + 8,
				RKey: word.key, CompareAdd: binary.LittleEndian.Uint64(v)})
			a.send(t, abi.SendWQE{WrID: 8, Opcode: abi.WRFlush, Flags: abi.SendSignaled, RemoteAddr: word.va + 8,
				RKey: word.key, CompareAdd: 8, Swap: abi.FlushWQEBits(abi.FlushGlobal, abi.FlushRange)})
			a.send(t, abi.SendWQE{WrID: 9, Opcode: abi.WRFlush, Flags: abi.SendSignaled, RKey: word.key,
				Swap: abi.FlushWQEBits(abi.FlushGlobal, abi.FlushMR)})
			require.True(t, a.scq.wait(3, waitFor))
			cq := a.scq.all()
			wantCQE(t, cq[0], abi.CQE{WrID: 7, Opcode: abi.WCAtomicWrite, QPNum: a.qpn})
			wantCQE(t, cq[1], abi.CQE{WrID: 8, Opcode: abi.WCFlush, QPNum: a.qpn})
			wantCQE(t, cq[2], abi.CQE{WrID: 9, Opcode: abi.WCFlush, QPNum: a.qpn})
			assert.Equal(t, v, word.b[8:16], "the 8 bytes, in order")
			assert.Equal(t, before[:8], word.b[:8], "the word before")
			assert.Equal(t, before[16:], word.b[16:], "the word after")
			assert.Empty(t, b.rcq.all(), "no receive WQE consumed")
			assert.Equal(t, 1, b.n.mem.atomicWrites)
			assert.Equal(t, 2, b.n.mem.flushes)
		})
	}
}

// TestPlacementErrors: the responder's checks and the status the
// requester completes with (IBTA 9.7.5.2: remote access error NAK ->
// REM_ACCESS_ERR, invalid request NAK -> REM_INV_REQ_ERR), and the local
// ones.
func TestPlacementErrors(t *testing.T) {
	flushG := abi.FlushWQEBits(abi.FlushGlobal, abi.FlushRange)
	cases := []struct {
		name   string
		access uint32 // the target MR's
		wqe    abi.SendWQE
		status abi.WCStatus
		op     abi.WCOpcode
	}{
		{"atomic_write_without_remote_write", abi.AccessLocalWrite | abi.AccessRemoteAtomic | abi.AccessFlushGlobal,
			abi.SendWQE{Opcode: abi.WRAtomicWrite, RemoteAddr: 8}, abi.WCRemAccessErr, abi.WCAtomicWrite},
		{"atomic_write_misaligned", abi.AccessAll,
			abi.SendWQE{Opcode: abi.WRAtomicWrite, RemoteAddr: 4}, abi.WCRemInvReqErr, abi.WCAtomicWrite},
		{"atomic_write_out_of_bounds", abi.AccessAll,
			abi.SendWQE{Opcode: abi.WRAtomicWrite, RemoteAddr: 64}, abi.WCRemAccessErr, abi.WCAtomicWrite},
		{"flush_without_flush_access", abi.AccessLocalWrite | abi.AccessRemoteWrite | abi.AccessRemoteRead,
			abi.SendWQE{Opcode: abi.WRFlush, RemoteAddr: 0, CompareAdd: 16, Swap: flushG}, abi.WCRemAccessErr, abi.WCFlush},
		{"flush_whole_without_flush_access", abi.AccessLocalWrite | abi.AccessRemoteWrite,
			abi.SendWQE{Opcode: abi.WRFlush, Swap: abi.FlushWQEBits(abi.FlushGlobal, abi.FlushMR)}, abi.WCRemAccessErr, abi.WCFlush},
		{"flush_persistent_on_global_mr", abi.AccessLocalWrite | abi.AccessFlushGlobal,
			abi.SendWQE{Opcode: abi.WRFlush, CompareAdd: 8, Swap: abi.FlushWQEBits(abi.FlushPersistent, abi.FlushRange)}, abi.WCRemAccessErr, abi.WCFlush},
		{"flush_beyond_mr", abi.AccessAll,
			abi.SendWQE{Opcode: abi.WRFlush, RemoteAddr: 8, CompareAdd: 64, Swap: flushG}, abi.WCRemAccessErr, abi.WCFlush},
		{"flush_no_placement_type", abi.AccessAll,
			abi.SendWQE{Opcode: abi.WRFlush, CompareAdd: 8, Swap: 0}, abi.WCLocQPOpErr, abi.WCFlush},
		{"flush_bad_selectivity", abi.AccessAll,
			abi.SendWQE{Opcode: abi.WRFlush, CompareAdd: 8, Swap: abi.FlushWQEBits(abi.FlushGlobal, 2)}, abi.WCLocQPOpErr, abi.WCFlush},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := pair(t, 1, nil, nil, defaultOpts())
			mr := b.n.buffer(64, 0x70000000, c.access, 3)
			before := append([]byte(nil), mr.b...)
			w := c.wqe
			w.WrID, w.Flags, w.RKey, w.RemoteAddr = 5, abi.SendSignaled, mr.key, mr.va+w.RemoteAddr
			a.send(t, w)
			require.True(t, a.scq.wait(1, waitFor))
			wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 5, Status: c.status, Opcode: c.op, QPNum: a.qpn})
			assert.Equal(t, before, mr.b, "memory untouched")
			assert.Zero(t, b.n.mem.atomicWrites)
		})
	}
}

// TestAtomicWriteDuplicate: every frame the requester sends arrives twice.
// A duplicate ATOMIC WRITE or FLUSH is answered again from its responder
// resource and not executed again: a word written by a later RDMA WRITE
// keeps that value although the ATOMIC WRITE before it arrives a second
// time after it.
func TestAtomicWriteDuplicate(t *testing.T) {
	o := defaultOpts()
	a, b := pair(t, 1, &link.Faults{Seed: 1, Duplicate: 1, Reorder: 0}, nil, o)
	word := b.n.buffer(16, 0x40000000, abi.AccessAll, 1)
	src := a.n.buffer(8, 0x50000000, abi.AccessAll, 2)
	const n = 20
	for i := range n {
		a.send(t, abi.SendWQE{WrID: uint64(i), Opcode: abi.WRAtomicWrite, Flags: abi.SendSignaled, RemoteAddr: word.va,
			RKey: word.key, CompareAdd: uint64(i)})
	}
	a.send(t, abi.SendWQE{WrID: n, Opcode: abi.WRFlush, Flags: abi.SendSignaled, RemoteAddr: word.va, RKey: word.key,
		CompareAdd: 8, Swap: abi.FlushWQEBits(abi.FlushGlobal, abi.FlushRange)})
	a.send(t, abi.SendWQE{WrID: n + 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: word.va, RKey: word.key}, src.sge(0, 8))
	require.True(t, a.scq.wait(n+2, waitFor))
	for i, c := range a.scq.all() {
		op := abi.WCAtomicWrite
		switch i {
		case n:
			op = abi.WCFlush
		case n + 1:
			op = abi.WCRDMAWrite
		}
		wantCQE(t, c, abi.CQE{WrID: uint64(i), Opcode: op, QPNum: a.qpn})
	}
	assert.Equal(t, src.b, word.b[:8], "the RDMA WRITE's bytes stay")
	assert.Equal(t, n, b.n.mem.atomicWrites, "each ATOMIC WRITE executed once")
	assert.Equal(t, 1, b.n.mem.flushes, "the FLUSH executed once")
	cb, err := b.n.eng.Counters(b.qpn)
	require.NoError(t, err)
	assert.NotZero(t, cb.Rare().Duplicates.Load(), "duplicates arrived")
}

// TestPlacementUnreliable: UC and UD have no ATOMIC WRITE or FLUSH (the
// IBTA defines them for RC): the WR completes in error.
func TestPlacementUnreliable(t *testing.T) {
	o := defaultOpts()
	o.typ = abi.QPTUC
	a, b := pair(t, 1, nil, nil, o)
	word := b.n.buffer(16, 0x40000000, abi.AccessAll, 1)
	a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRAtomicWrite, Flags: abi.SendSignaled, RemoteAddr: word.va, RKey: word.key})
	require.True(t, a.scq.wait(1, waitFor))
	c := a.scq.all()[0]
	assert.NotEqual(t, abi.WCSuccess, c.Status)
	assert.Equal(t, abi.WCAtomicWrite, c.Opcode)
	assert.Zero(t, b.n.mem.atomicWrites)
}

// TestPlacementCredits: a fenced SEND waits for an outstanding ATOMIC WRITE
// as for a READ (IBTA 10.8.3.3), which holds a max_rd_atomic credit.
func TestPlacementCredits(t *testing.T) {
	o := defaultOpts()
	o.rdAtomic = 1
	a, b := pair(t, 1, nil, nil, o)
	word := b.n.buffer(64, 0x40000000, abi.AccessAll, 1)
	for i := range 8 {
		a.send(t, abi.SendWQE{WrID: uint64(i), Opcode: abi.WRAtomicWrite, Flags: abi.SendSignaled | abi.SendFence,
			RemoteAddr: word.va + uint64(i%8)*8, RKey: word.key, CompareAdd: uint64(i) << 8})
	}
	require.True(t, a.scq.wait(8, waitFor))
	for i, c := range a.scq.all() {
		wantCQE(t, c, abi.CQE{WrID: uint64(i), Opcode: abi.WCAtomicWrite, QPNum: a.qpn})
		assert.Equal(t, uint64(i)<<8, binary.LittleEndian.Uint64(word.b[i*8:]))
	}
}
