package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/ebpf"
	"github.com/vrnic/vrnic/verbs"
)

// TestKernelFaultsTAP: the kernel-side injector on the bridge ports of
// two TAP daemons faults their RoCE v2 traffic where the daemons cannot
// see it, in the kernel: seeded drops of the requests to B and of the
// ACKs to A, three corrupted requests, three duplicated ones. Every RDMA
// WRITE completes with success and its data arrives intact; A
// retransmitted; B counted exactly the three corrupted frames as ICRC
// errors and saw the duplicates.
func TestKernelFaultsTAP(t *testing.T) {
	a, b, ns := tapPair(t, "vrkft")
	h, err := netns.GetFromName(ns)
	require.NoError(t, err)
	defer h.Close()
	// Egress of a TAP in the bridge: the frames the kernel hands to its
	// daemon.
	toB, err := ebpf.AttachTCFaults(ebpf.TCFaultConfig{Interface: "vfb", Netns: h})
	require.NoError(t, err)
	defer toB.Close()
	toA, err := ebpf.AttachTCFaults(ebpf.TCFaultConfig{Interface: "vfa", Netns: h})
	require.NoError(t, err)
	defer toA.Close()

	ea, eb := connectPair(t, a, b, 12) // ACK timeout 16.8 ms
	qb, qa := eb.qp.QPN, ea.qp.QPN
	drop := ebpf.TCFaultRule{Action: ebpf.TCDrop, QPN: &qb, OpcodeMask: 0xe0, Prob: 0.1, Seed: 11}
	require.NoError(t, toB.SetRules([]ebpf.TCFaultRule{
		drop,
		{Action: ebpf.TCCorrupt, QPN: &qb, Skip: 10, Limit: 3, CorruptOffset: 40}, // in the payload
		{Action: ebpf.TCDuplicate, QPN: &qb, Skip: 20, Limit: 3},
	}))
	require.NoError(t, toA.SetRules([]ebpf.TCFaultRule{
		{Action: ebpf.TCDrop, QPN: &qa, Opcode: 0x11, OpcodeMask: 0xff, Prob: 0.1, Seed: 12}, // RC ACKNOWLEDGE
	}))

	const writes = 60
	for i := range writes {
		for j := range 4096 {
			ea.buf.Bytes[j] = byte(i*31 + j*7 + j>>8)
		}
		require.NoError(t, ea.qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRRDMAWrite,
			SGL: []abi.SGE{ea.mr.SGE(0, 4096)}, RemoteAddr: eb.mr.Addr, RKey: eb.mr.RKey}))
		c := pollOne(t, ea.cq)
		require.Equal(t, abi.WCSuccess, c.Status, "WRITE %d", i)
		require.Equal(t, ea.buf.Bytes[:4096], eb.buf.Bytes[:4096], "WRITE %d arrived intact", i)
	}

	cb, err := toB.Counts(3)
	require.NoError(t, err)
	ca, err := toA.Counts(1)
	require.NoError(t, err)
	t.Logf("to B: drop %+v, corrupt %+v, duplicate %+v; to A: ACK drop %+v", cb[0], cb[1], cb[2], ca[0])
	// The hook sees at least one packet per WRITE (the TAP link may send
	// a WRITE's frames as one segmented packet); the seed's draws among
	// the first that many are certain drops.
	var sure uint64
	for k := range uint64(writes) {
		if ebpf.TCFaultTakes(drop, k) {
			sure++
		}
	}
	require.NotZero(t, sure, "the seed drops something among the first %d matches", writes)
	assert.GreaterOrEqual(t, cb[0].Applied, sure)
	assert.Equal(t, uint64(3), cb[1].Applied, "corrupted")
	assert.Equal(t, uint64(3), cb[2].Applied, "duplicated")
	assert.NotZero(t, ca[0].Matched, "ACKs crossed vfa")

	q, err := ea.qp.Query()
	require.NoError(t, err)
	assert.NotZero(t, q.Retransmits, "A went back after the drops")
	info, err := admin.Serving(b.sock)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), info.Wire.ICRCErrors, "B dropped exactly the corrupted frames")
	assert.GreaterOrEqual(t, info.DataPath.Duplicates, uint64(3), "B saw the duplicates")
	t.Logf("A retransmits %d; B wire %+v, duplicates %d", q.Retransmits, info.Wire, info.DataPath.Duplicates)
}
