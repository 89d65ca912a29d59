package cm

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
)

// eceNode adds a node whose CM supports the ECE options ece (Config.ECE).
func eceNode(n *fakeNet, name, ip string, guid uint64, ece uint32) *node {
	return n.addWith(name, ip, guid, false, func(c *Config) { c.ECE = ece })
}

// madECE returns the ECE a REQ or REP MAD carries on the wire: the
// attribute modifier (MAD bytes 20..23) and the Vendor ID (REQ: the 24
// bits at CM data byte 5; REP: bytes 15, 19 and 23 of the CM data).
func madECE(t *testing.T, mad []byte) ECE {
	t.Helper()
	d := mad[MADHeaderLen:]
	e := ECE{Options: binary.BigEndian.Uint32(mad[20:24])}
	switch AttrID(binary.BigEndian.Uint16(mad[16:18])) {
	case AttrREQ:
		e.VendorID = uint32(d[5])<<16 | uint32(d[6])<<8 | uint32(d[7])
		assert.Zero(t, d[4], "the REQ's byte 4 is reserved")
	case AttrREP:
		e.VendorID = uint32(d[15])<<16 | uint32(d[19])<<8 | uint32(d[23])
	default:
		t.Fatalf("not a REQ or REP")
	}
	return e
}

// eceRun connects a (offering offer) to b, which accepts with the options
// its RTR attributes give masked by took (what its QP took), and returns
// the REQ and REP MADs and both sides' RTR options.
func eceRun(t *testing.T, n *fakeNet, a, b *node, typ TransportType, offer, took uint32) (req, rep []byte, ra, rb uint32, evA, evB Event) {
	t.Helper()
	var mads [][]byte
	n.filter = func(p packet, _ int) int {
		if p.attr() == AttrREQ || p.attr() == AttrREP {
			mads = append(mads, p.mad)
		}
		return 1
	}
	p := connectParams(a, b, 0x100)
	p.QPType, p.ECE = typ, offer
	ca, err := a.m.Connect(p)
	require.NoError(t, err)
	n.run()
	evs := b.takeEvents()
	require.Len(t, evs, 1)
	evB = evs[0]
	require.Equal(t, EventConnectRequest, evB.Type)
	rtr, err := b.m.QPAttr(evB.Conn, QPStateRTR)
	require.NoError(t, err)
	acc := b.accept
	acc.StartingPSN, acc.ECE = rtr.RQPSN, rtr.ECE&took
	require.NoError(t, b.m.Accept(evB.Conn, acc))
	n.run()
	evs = a.takeEvents()
	require.Len(t, evs, 1)
	evA = evs[0]
	require.Equal(t, EventREPReceived, evA.Type)
	rtrA, err := a.m.QPAttr(ca, QPStateRTR)
	require.NoError(t, err)
	rtrB, err := b.m.QPAttr(evB.Conn, QPStateRTR)
	require.NoError(t, err)
	require.NoError(t, a.m.RTU(ca, nil))
	n.run()
	require.Len(t, mads, 2, "REQ and REP")
	assert.Equal(t, rtrA.ECE, a.m.ConnECE(ca))
	assert.Equal(t, rtrB.ECE, b.m.ConnECE(evB.Conn))
	return mads[0], mads[1], rtrA.ECE, rtrB.ECE, evA, evB
}

// TestECEAgreement: two vrnic CMs agree on the options both support and
// the passive side's QP took: the REQ offers vrnic's vendor ID with the
// active side's options, the REP answers with the intersection (or
// carries no ECE when it is empty), and both sides' RTR attributes give
// the same options. A UC connection offers none.
func TestECEAgreement(t *testing.T) {
	const sr, rto, all = abi.ECESelectiveRepeat, abi.ECEAdaptiveRTO, abi.ECEOptions
	for _, c := range []struct {
		name                string
		typ                 TransportType
		cfgA, cfgB          uint32
		offer, took, agreed uint32
	}{
		{"both all", TransportRC, all, all, all, all, all},
		{"offer sr", TransportRC, all, all, sr, all, sr},
		{"passive supports rto", TransportRC, all, rto, all, all, rto},
		{"active supports sr", TransportRC, sr, all, all, all, sr},
		{"disjoint", TransportRC, all, rto, sr, all, 0},
		{"passive QP took sr", TransportRC, all, all, all, sr, sr},
		{"passive QP took none", TransportRC, all, all, all, 0, 0},
		{"passive switched off", TransportRC, all, 0, all, all, 0},
		{"active switched off", TransportRC, 0, all, all, all, 0},
		{"offer none", TransportRC, all, all, 0, all, 0},
		{"UC", TransportUC, all, all, all, all, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newNet(t)
			a := eceNode(n, "A", "192.168.1.1", guidA, c.cfgA)
			b := eceNode(n, "B", "192.168.1.2", guidB, c.cfgB)
			require.NoError(t, b.m.Listen(ServiceID(PortSpaceTCP, 7471), 0))
			req, rep, ra, rb, evA, evB := eceRun(t, n, a, b, c.typ, c.offer, c.took)
			offered := c.offer & c.cfgA
			if c.typ != TransportRC {
				offered = 0
			}
			wantREQ := ECE{}
			if offered != 0 {
				wantREQ = ECE{VendorID: abi.ECEVendorID, Options: offered}
			}
			assert.Equal(t, wantREQ, madECE(t, req), "REQ on the wire")
			assert.Equal(t, wantREQ, evB.ECE, "CONNECT_REQUEST reports the REQ's")
			wantREP := ECE{}
			if c.agreed != 0 {
				wantREP = ECE{VendorID: abi.ECEVendorID, Options: c.agreed}
			}
			assert.Equal(t, wantREP, madECE(t, rep), "REP on the wire")
			assert.Equal(t, wantREP, evA.ECE, "the REP's ECE reported")
			assert.Equal(t, c.agreed, ra, "active RTR")
			assert.Equal(t, c.agreed, rb, "passive RTR")
		})
	}
}

// TestECENoECEREQ: a REQ without ECE (what Linux sends) gets the REP it
// got before vrnic knew ECE, byte for byte (the same REP as from a CM
// without ECE), and neither side's QP gets an option.
func TestECENoECEREQ(t *testing.T) {
	reps := map[uint32][]byte{}
	for _, cfgB := range []uint32{0, abi.ECEOptions} {
		n := newNet(t)
		a := eceNode(n, "A", "192.168.1.1", guidA, 0) // a peer without ECE
		b := eceNode(n, "B", "192.168.1.2", guidB, cfgB)
		require.NoError(t, b.m.Listen(ServiceID(PortSpaceTCP, 7471), 0))
		req, rep, ra, rb, evA, evB := eceRun(t, n, a, b, TransportRC, abi.ECEOptions, abi.ECEOptions)
		assert.Equal(t, ECE{}, madECE(t, req))
		assert.Equal(t, ECE{}, madECE(t, rep))
		assert.Equal(t, ECE{}, evA.ECE)
		assert.Equal(t, ECE{}, evB.ECE)
		assert.Zero(t, ra)
		assert.Zero(t, rb)
		reps[cfgB] = rep
	}
	assert.Equal(t, reps[0], reps[abi.ECEOptions], "the REP is the REP of a CM without ECE")
}

// TestECEForeignVendor: a REQ (forged, or an mlx5 host's) offering
// options under another vendor ID agrees on none: the REP carries no ECE
// and the QP gets no option; the event still reports what the REQ
// carried (rdma_get_remote_ece). The same for a REP answering with
// another vendor ID, and a REP may not add options that were not offered.
func TestECEForeignVendor(t *testing.T) {
	n := newNet(t)
	b := eceNode(n, "B", "192.168.1.2", guidB, abi.ECEOptions)
	require.NoError(t, b.m.Listen(ServiceID(PortSpaceTCP, 7471), 0))
	var reps [][]byte
	n.filter = func(p packet, _ int) int {
		if p.attr() == AttrREP {
			reps = append(reps, p.mad)
		}
		return 1
	}
	for i, vendor := range []uint32{0x15b3, abi.ECEVendorID ^ 1, 0xffffff} {
		req := forgedREQ(mallory, b.gid, uint32(100+i), uint32(0x300+i), 0x77)
		req.VendorID = vendor
		mad, err := Marshal(0xbad0000000000001+uint64(i), abi.ECEOptions, req)
		require.NoError(t, err)
		n.deliver(packet{from: mallory, to: b.gid, mad: mad})
		n.run()
		evs := b.takeEvents()
		require.Len(t, evs, 1)
		assert.Equal(t, ECE{VendorID: vendor, Options: abi.ECEOptions}, evs[0].ECE)
		rtr, err := b.m.QPAttr(evs[0].Conn, QPStateRTR)
		require.NoError(t, err)
		assert.Zero(t, rtr.ECE, "vendor %#x", vendor)
		acc := b.accept
		acc.QPN, acc.StartingPSN, acc.ECE = uint32(0x400+i), rtr.RQPSN, abi.ECEOptions
		require.NoError(t, b.m.Accept(evs[0].Conn, acc))
		n.run()
		require.Len(t, reps, i+1)
		assert.Equal(t, ECE{}, madECE(t, reps[i]), "vendor %#x: REP without ECE", vendor)
	}

	// The active side: a REP with another vendor ID, or options beyond
	// the offer.
	for _, c := range []struct {
		rep    ECE
		offer  uint32
		agreed uint32
	}{
		{ECE{0x15b3, abi.ECEOptions}, abi.ECEOptions, 0},
		{ECE{abi.ECEVendorID, abi.ECEOptions}, abi.ECESelectiveRepeat, abi.ECESelectiveRepeat},
		{ECE{abi.ECEVendorID, abi.ECEOptions | 1<<9}, abi.ECEOptions, abi.ECEOptions},
		{ECE{0, abi.ECEOptions}, abi.ECEOptions, 0},
	} {
		t.Run(fmt.Sprintf("REP %#x/%#x offer %#x", c.rep.VendorID, c.rep.Options, c.offer), func(t *testing.T) {
			n := newNet(t)
			a := eceNode(n, "A", "192.168.1.1", guidA, abi.ECEOptions)
			to := capture(n, mallory)
			p := connectParams(a, &node{gid: mallory}, 0x100)
			p.ECE = c.offer
			ca, err := a.m.Connect(p)
			require.NoError(t, err)
			n.run()
			require.Len(t, *to, 1)
			req := (*to)[0].(*REQ)
			assert.Equal(t, uint32(abi.ECEVendorID), req.VendorID)
			rep := &REP{LocalCommID: 0x5151, RemoteCommID: uint32(ca), LocalQPN: 0x999, VendorID: c.rep.VendorID,
				StartingPSN: 1, ResponderResources: 1, InitiatorDepth: 1, LocalCAGUID: 0x77}
			mad, err := Marshal(uint64(req.LocalCommID), c.rep.Options, rep)
			require.NoError(t, err)
			n.deliver(packet{from: mallory, to: a.gid, mad: mad})
			n.run()
			evs := a.takeEvents()
			require.Len(t, evs, 1)
			require.Equal(t, EventREPReceived, evs[0].Type)
			assert.Equal(t, c.rep, evs[0].ECE)
			rtr, err := a.m.QPAttr(ca, QPStateRTR)
			require.NoError(t, err)
			assert.Equal(t, c.agreed, rtr.ECE)
		})
	}
}
