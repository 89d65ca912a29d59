package cm

import (
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// The golden tests against Linux: the rdma_cm connections between two
// Soft-RoCE hosts in testdata/rxe (see its README.md). vrnic's CM is put
// in the place of either host: fed the REQ the Linux client sent, it must
// answer with the REP the Linux server sent and give its QP the
// attributes the Linux client's QP needs; fed the REP the Linux server
// sent, after a REQ of its own for the same set-up, it must have sent the
// REQ the Linux client sent and give its QP the attributes the Linux
// server's QP needs. Comm IDs, transaction IDs and the Starting PSNs are
// random and left aside; every other field is compared.

// rxeCaptures are the captures with REQ/REP connections.
var rxeCaptures = []string{"rping_cm", "ucmatose_cm", "send_bw_cm", "send_bw_bidir_cm", "read_bw_cm", "read_bw_bidir_cm"}

// The hosts of the captures: A is the server (passive), B the client.
var (
	rxeA     = netip.MustParseAddr("10.91.0.11")
	rxeB     = netip.MustParseAddr("10.91.0.12")
	rxeGUIDA = uint64(0x505400fffe5b000b)
	rxeGUIDB = uint64(0x505400fffe5b000c)
)

// linux61PacketLifeTime is the packet life time Linux 6.1's rdma_cm gives
// a RoCE route (CMA_IBOE_PACKET_LIFETIME 18; later kernels, and vrnic's
// RoCEPath, use 16): the REQs of the captures carry its local ACK timeout,
// cm_ack_timeout(15, 18) = 19.
const linux61PacketLifeTime = 18

// capMAD is a CM MAD of a capture.
type capMAD struct {
	frame    int // 1-based, as Wireshark numbers them
	src, dst netip.Addr
	raw      []byte
	hdr      Header
	msg      Message
}

// qpFlow names the requests one host sends to one QP.
type qpFlow struct {
	src netip.Addr
	qpn uint32
}

type rxeCapture struct {
	name string
	mads []capMAD
	// firstReq is the PSN of the first RC request packet (not an ACK or
	// a READ response) each host sent to each QP.
	firstReq map[qpFlow]uint32
}

// capConn is one connection of a capture: B's REQ, A's REP, B's RTU.
type capConn struct {
	req, rep, rtu *capMAD
}

func loadRxeCapture(t *testing.T, name string) *rxeCapture {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "rxe", name+".pcap"))
	require.NoError(t, err)
	pr, err := roce.NewPcapReader(bytes.NewReader(b))
	require.NoError(t, err)
	c := &rxeCapture{name: name, firstReq: map[qpFlow]uint32{}}
	for i := 1; ; i++ {
		_, data, err := pr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		var pkt roce.Packet
		if roce.Parse(bytes.Clone(data), &pkt) != nil {
			continue // ARP
		}
		op := pkt.Opcode()
		if op == roce.OpUDSendOnly && pkt.BTH.DestQP() == QP1 {
			h, msg, err := Decode(pkt.Payload)
			require.NoError(t, err, "%s frame %d", name, i)
			c.mads = append(c.mads, capMAD{frame: i, src: pkt.Src().Unmap(), dst: pkt.Dst().Unmap(),
				raw: bytes.Clone(pkt.Payload), hdr: h, msg: msg})
			continue
		}
		if op < 0x20 && pkt.Info.Is(roce.OpRequest) { // RC requests
			f := qpFlow{pkt.Src().Unmap(), pkt.BTH.DestQP()}
			if _, seen := c.firstReq[f]; !seen {
				c.firstReq[f] = pkt.BTH.PSN()
			}
		}
	}
	return c
}

// conns pairs each REQ with its REP and RTU.
func (c *rxeCapture) conns(t *testing.T) []capConn {
	var out []capConn
	for i := range c.mads {
		req, ok := c.mads[i].msg.(*REQ)
		if !ok {
			continue
		}
		cc := capConn{req: &c.mads[i]}
		for j := range c.mads {
			switch m := c.mads[j].msg.(type) {
			case *REP:
				if m.RemoteCommID == req.LocalCommID {
					cc.rep = &c.mads[j]
				}
			case *RTU:
				if m.LocalCommID == req.LocalCommID {
					cc.rtu = &c.mads[j]
				}
			}
		}
		require.NotNil(t, cc.rep, "%s: no REP for the REQ of frame %d", c.name, cc.req.frame)
		require.NotNil(t, cc.rtu, "%s: no RTU for the REQ of frame %d", c.name, cc.req.frame)
		out = append(out, cc)
	}
	require.NotEmpty(t, out, c.name)
	return out
}

// rxeDevice is the port and device a Manager speaks for in these tests.
type rxeDevice struct {
	name                    string
	mtu                     roce.MTU
	maxRdAtomic, maxInitRdA uint8
}

var rxeDevices = []rxeDevice{
	// Soft-RoCE on the 1500-byte bridge: active MTU 1024,
	// max_qp_rd_atom and max_qp_init_rd_atom 128. vrnic in its place
	// must do exactly what Linux did.
	{"rxe", roce.MTU1024, 128, 128},
	// A vrnic device of the default depth (16): what the peer offers
	// beyond it is clamped, not refused.
	{"vrnic16", roce.MTU1024, 16, 16},
}

// capturingManager is a Manager whose MADs and events are kept.
type capturingManager struct {
	m      *Manager
	mu     sync.Mutex
	sent   []capMAD
	events []Event
}

func newCapturingManager(t *testing.T, guid uint64, dev rxeDevice) *capturingManager {
	cm := &capturingManager{}
	m, err := NewManager(Config{
		CAGUID: guid, AckDelay: RXEAckDelay, PortMTU: dev.mtu, MaxRdAtomic: dev.maxRdAtomic,
		MaxInitRdAtomic: dev.maxInitRdA, Clock: NewFakeClock(t0), Seed: guid,
		// As vrnicd by default: ECE on, which a Linux peer must not notice
		// but in the REQ's ECE fields.
		ECE: abi.ECEOptions,
		Sender: SenderFunc(func(dst GID, mad []byte) error {
			h, msg, err := Decode(mad)
			require.NoError(t, err)
			cm.mu.Lock()
			cm.sent = append(cm.sent, capMAD{dst: dst.IP(), raw: bytes.Clone(mad), hdr: h, msg: msg})
			cm.mu.Unlock()
			return nil
		}),
		Handler: func(ev Event) {
			cm.mu.Lock()
			cm.events = append(cm.events, ev)
			cm.mu.Unlock()
		},
	})
	require.NoError(t, err)
	t.Cleanup(m.Close)
	cm.m = m
	return cm
}

// take returns what was sent and reported so far, and forgets it.
func (c *capturingManager) take() ([]capMAD, []Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, e := c.sent, c.events
	c.sent, c.events = nil, nil
	return s, e
}

// withRemote re-encodes a captured message with another remote comm ID
// (the ID vrnic chose instead of the Linux host).
func withRemote(t *testing.T, m *capMAD, remote uint32) []byte {
	t.Helper()
	var msg Message
	switch x := m.msg.(type) {
	case *REP:
		c := *x
		c.RemoteCommID = remote
		msg = &c
	case *RTU:
		c := *x
		c.RemoteCommID = remote
		msg = &c
	default:
		t.Fatalf("withRemote: %T", m.msg)
	}
	b, err := Marshal(m.hdr.TID, m.hdr.AttrModifier, msg)
	require.NoError(t, err)
	return b
}

func minU8(a, b uint8) uint8 { return min(a, b) }

// initAccess is Linux cm_init_qp_init_attr's access flags: remote write,
// and remote read and atomic when the QP has responder resources.
func initAccess(responderResources uint8) int {
	if responderResources > 0 {
		return AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	}
	return AccessRemoteWrite
}

// TestRxeCapturesLinuxPSNs holds the captures themselves to the Linux
// semantics the other tests rely on: the Starting PSN of B's REQ is the
// first PSN A sends on the connection, that of A's REP the first PSN B
// sends.
func TestRxeCapturesLinuxPSNs(t *testing.T) {
	checked := 0
	for _, name := range rxeCaptures {
		c := loadRxeCapture(t, name)
		for _, cn := range c.conns(t) {
			req, rep := cn.req.msg.(*REQ), cn.rep.msg.(*REP)
			if psn, ok := c.firstReq[qpFlow{rxeA, req.LocalQPN}]; ok {
				assert.Equal(t, req.StartingPSN, psn, "%s: A's first PSN to B's QP %#x", name, req.LocalQPN)
				checked++
			}
			if psn, ok := c.firstReq[qpFlow{rxeB, rep.LocalQPN}]; ok {
				assert.Equal(t, rep.StartingPSN, psn, "%s: B's first PSN to A's QP %#x", name, rep.LocalQPN)
				checked++
			}
		}
	}
	assert.GreaterOrEqual(t, checked, 15, "PSNs checked against the wire")
}

// TestRxeCapturesNoECE: Linux with Soft-RoCE (a provider without ECE)
// sends no ECE: neither vendor ID nor options in its REQs and REPs.
func TestRxeCapturesNoECE(t *testing.T) {
	for _, name := range rxeCaptures {
		c := loadRxeCapture(t, name)
		for _, cn := range c.conns(t) {
			for _, m := range []*capMAD{cn.req, cn.rep} {
				assert.Zero(t, m.hdr.AttrModifier, "%s frame %d", name, m.frame)
				switch x := m.msg.(type) {
				case *REQ:
					assert.Zero(t, x.VendorID, "%s frame %d", name, m.frame)
				case *REP:
					assert.Zero(t, x.VendorID, "%s frame %d", name, m.frame)
				}
			}
		}
	}
}

// TestGoldenRxePassive puts vrnic's CM in host A's place: B's REQ from
// each capture arrives at a listener, the owner accepts as the Linux
// server's program and librdmacm did, and the REP must be A's; the QP
// attributes must be those that make B's first PSN arrive in sequence and
// A send from the PSN B expects.
func TestGoldenRxePassive(t *testing.T) { eachRxeConn(t, goldenPassive) }

// eachRxeConn runs f as a subtest for every connection of every capture,
// on every device of rxeDevices.
func eachRxeConn(t *testing.T, f func(*testing.T, *rxeCapture, capConn, rxeDevice)) {
	for _, name := range rxeCaptures {
		c := loadRxeCapture(t, name)
		for _, cn := range c.conns(t) {
			for _, dev := range rxeDevices {
				t.Run(fmt.Sprintf("%s/frame%d/%s", name, cn.req.frame, dev.name), func(t *testing.T) {
					f(t, c, cn, dev)
				})
			}
		}
	}
}

func goldenPassive(t *testing.T, c *rxeCapture, cn capConn, dev rxeDevice) {
	req, rep, rtu := cn.req.msg.(*REQ), cn.rep.msg.(*REP), cn.rtu.msg.(*RTU)
	a := newCapturingManager(t, rxeGUIDA, dev)
	require.NoError(t, a.m.Listen(req.ServiceID, 0))
	require.NoError(t, a.m.HandleMAD(GIDFromIP(rxeB), cn.req.raw))
	sent, evs := a.take()
	require.Empty(t, sent)
	require.Len(t, evs, 1)
	require.Equal(t, EventConnectRequest, evs[0].Type)
	id := evs[0].Conn

	// Before the REP: librdmacm's rdma_accept moves the QP to INIT, RTR
	// and RTS first (ucma_modify_qp_rtr, ucma_modify_qp_rts).
	init, err := a.m.QPAttr(id, QPStateInit)
	require.NoError(t, err)
	assert.Equal(t, initAccess(req.InitiatorDepth), init.AccessFlags, "cm_init_qp_init_attr")
	assert.Equal(t, uint16(DefaultPKey), init.PKey)
	rtr, err := a.m.QPAttr(id, QPStateRTR)
	require.NoError(t, err)
	assert.Equal(t, min(req.PathMTU, dev.mtu), rtr.PathMTU)
	assert.Equal(t, req.LocalQPN, rtr.DestQPN)
	assert.Equal(t, minU8(req.InitiatorDepth, dev.maxRdAtomic), rtr.MaxDestRdAtomic,
		"responder resources: B's initiator depth, at most the device's")
	assert.Equal(t, GIDFromIP(rxeB), rtr.AH.DGID)
	assert.Equal(t, GIDFromIP(rxeA), rtr.AH.SGID)
	assert.Equal(t, req.Primary.FlowLabel, rtr.AH.FlowLabel)
	assert.Equal(t, req.Primary.HopLimit, rtr.AH.HopLimit)
	assert.Equal(t, req.Primary.TrafficClass, rtr.AH.TrafficClass)
	assert.Zero(t, rtr.MinRNRTimer)
	assert.Zero(t, rtr.RQPSN&^roce.PSNMask)
	rts, err := a.m.QPAttr(id, QPStateRTS)
	require.NoError(t, err)
	assert.Equal(t, req.StartingPSN, rts.SQPSN, "A sends from the PSN B's REQ says B expects (cm_req_handler: sq_psn)")
	if psn, ok := c.firstReq[qpFlow{rxeA, req.LocalQPN}]; ok {
		assert.Equal(t, psn, rts.SQPSN, "the first PSN Linux's A sent on the wire")
	}
	assert.Equal(t, req.Primary.LocalACKTimeout, rts.Timeout, "av.timeout: the REQ's packet life time + 1")
	assert.Zero(t, rtr.ECE, "Linux's REQ offers no ECE option")
	assert.Equal(t, req.RetryCount, rts.RetryCount)
	assert.Equal(t, req.RNRRetryCount, rts.RNRRetry)
	assert.Equal(t, minU8(req.ResponderResources, dev.maxInitRdA), rts.MaxRdAtomic,
		"initiator depth: B's responder resources, at most the device's")

	// Accept as the server's program did (rdma_accept with its
	// conn_param; a program on a device of fewer resources asks for at
	// most the device's, ucma_valid_param): the REP announces the PSN
	// the RTR attributes expect.
	respRes, initDepth := minU8(rep.ResponderResources, dev.maxRdAtomic), minU8(rep.InitiatorDepth, dev.maxInitRdA)
	// vrnic's library accepts with the options its QP took: those of the
	// RTR attributes; the QP could take them all.
	require.NoError(t, a.m.Accept(id, AcceptParams{QPN: rep.LocalQPN, StartingPSN: rtr.RQPSN,
		ResponderResources: respRes, InitiatorDepth: initDepth, FlowControl: rep.EndToEndFlowControl,
		RNRRetryCount: rep.RNRRetryCount, SRQ: rep.SRQ, FailoverAccepted: 0, PrivateData: rep.PrivateData[:],
		ECE: rtr.ECE | abi.ECEOptions}))
	sent, evs = a.take()
	require.Empty(t, evs)
	require.Len(t, sent, 1)
	got, ok := sent[0].msg.(*REP)
	require.True(t, ok, "%T", sent[0].msg)
	assert.Equal(t, rxeB, sent[0].dst)
	assert.Equal(t, cn.req.hdr.TID, sent[0].hdr.TID, "the REP carries the REQ's transaction ID")
	assert.Equal(t, cn.rep.hdr.AttrModifier, sent[0].hdr.AttrModifier, "the REP's attribute modifier: no ECE")
	assert.Equal(t, cn.rep.raw[:24], sent[0].raw[:24], "the MAD header as Linux's")
	assert.Equal(t, rtr.RQPSN, got.StartingPSN, "the REP's Starting PSN is the PSN A's RTR expects")
	want := *rep
	want.LocalCommID, want.StartingPSN = got.LocalCommID, got.StartingPSN
	want.ResponderResources, want.InitiatorDepth = respRes, initDepth
	assert.Equal(t, &want, got, "REP field by field (comm ID and PSN aside)")
	assert.Equal(t, uint8(15), got.TargetACKDelay)
	assert.Zero(t, got.FailoverAccepted)

	// After the REP: as Linux once ib_send_cm_rep has run.
	rtr2, err := a.m.QPAttr(id, QPStateRTR)
	require.NoError(t, err)
	assert.Equal(t, got.StartingPSN, rtr2.RQPSN)
	assert.Equal(t, respRes, rtr2.MaxDestRdAtomic)
	rts2, err := a.m.QPAttr(id, QPStateRTS)
	require.NoError(t, err)
	assert.Equal(t, req.StartingPSN, rts2.SQPSN)
	assert.Equal(t, initDepth, rts2.MaxRdAtomic)

	// B's RTU establishes the connection.
	require.NoError(t, a.m.HandleMAD(GIDFromIP(rxeB), withRemote(t, cn.rtu, got.LocalCommID)))
	sent, evs = a.take()
	assert.Empty(t, sent)
	require.Len(t, evs, 1)
	assert.Equal(t, EventEstablished, evs[0].Type)
	assert.Equal(t, rtu.LocalCommID, req.LocalCommID)
}

// TestGoldenRxeActive puts vrnic's CM in host B's place: it connects with
// the set-up B's program had (same QPN, ports, depths, retry counts, a
// port of MTU 1024), and its REQ must be B's; then A's REP arrives, and
// the QP attributes must be those that make A's first PSN arrive in
// sequence and B send from the PSN A expects; its RTU must be B's.
func TestGoldenRxeActive(t *testing.T) { eachRxeConn(t, goldenActive) }

func goldenActive(t *testing.T, c *rxeCapture, cn capConn, dev rxeDevice) {
	req, rep, rtu := cn.req.msg.(*REQ), cn.rep.msg.(*REP), cn.rtu.msg.(*RTU)
	require.Equal(t, uint8(19), req.Primary.LocalACKTimeout, "Linux 6.1: cm_ack_timeout(15, 18)")
	b := newCapturingManager(t, rxeGUIDB, dev)

	// The route rdma_cm resolved (cma_resolve_iboe_route), from the
	// addresses in the REQ's cma_hdr and the service ID's port. Its MTU
	// is left at 4096: the port's active MTU (1024) must bound the REQ.
	hdr, err := ParseCMAHeader(req.PrivateData[:])
	require.NoError(t, err)
	_, port, ok := ParseServiceID(req.ServiceID)
	require.True(t, ok)
	path := RoCEPath(netip.AddrPortFrom(hdr.Src, hdr.SrcPort), netip.AddrPortFrom(hdr.Dst, port), roce.MTU4096,
		req.Primary.PacketRate, 64, req.Primary.TrafficClass)
	path.PacketLifeTime = linux61PacketLifeTime
	pd, err := CMAPrivateData(hdr, req.PrivateData[CMAHeaderLen:])
	require.NoError(t, err)
	// rdma_connect with the program's conn_param (at most the device's,
	// ucma_valid_param); the PSN is the ID's own random seq_num.
	const myPSN = 0x3c5a96
	respRes, initDepth := minU8(req.ResponderResources, dev.maxRdAtomic), minU8(req.InitiatorDepth, dev.maxInitRdA)
	id, err := b.m.Connect(ConnectParams{Path: path, ServiceID: req.ServiceID, QPN: req.LocalQPN, QPType: TransportRC,
		StartingPSN: myPSN, ResponderResources: respRes, InitiatorDepth: initDepth,
		FlowControl: req.EndToEndFlowControl, RetryCount: req.RetryCount, RNRRetryCount: req.RNRRetryCount,
		RemoteCMResponseTimeout: CMAResponseTimeout, LocalCMResponseTimeout: CMAResponseTimeout,
		MaxCMRetries: CMAMaxCMRetries, SRQ: req.SRQ, PrivateData: pd, ECE: abi.ECEOptions})
	require.NoError(t, err)
	sent, _ := b.take()
	require.Len(t, sent, 1)
	gotREQ, ok := sent[0].msg.(*REQ)
	require.True(t, ok, "%T", sent[0].msg)
	assert.Equal(t, rxeA, sent[0].dst)
	reqTID := sent[0].hdr.TID
	// The REQ offers vrnic's ECE options (what vrnic's library offers
	// by default), which Linux's did not: its ECE fields differ, every
	// other field is Linux's.
	assert.Equal(t, uint32(abi.ECEOptions), sent[0].hdr.AttrModifier, "the REQ's ECE options")
	assert.Zero(t, cn.req.hdr.AttrModifier)
	want := *req
	want.LocalCommID, want.StartingPSN = gotREQ.LocalCommID, myPSN
	want.ResponderResources, want.InitiatorDepth = respRes, initDepth
	want.VendorID = abi.ECEVendorID
	assert.Equal(t, &want, gotREQ, "REQ field by field (comm ID, PSN and ECE aside)")
	assert.Equal(t, roce.MTU1024, gotREQ.PathMTU, "the port's active MTU bounds the route's")
	assert.Equal(t, uint32(myPSN), gotREQ.StartingPSN, "the REQ announces the PSN this side expects")

	// A's REP, addressed to vrnic's comm ID.
	require.NoError(t, b.m.HandleMAD(GIDFromIP(rxeA), withRemote(t, cn.rep, gotREQ.LocalCommID)))
	sent, evs := b.take()
	assert.Empty(t, sent)
	require.Len(t, evs, 1)
	require.Equal(t, EventREPReceived, evs[0].Type)

	init, err := b.m.QPAttr(id, QPStateInit)
	require.NoError(t, err)
	assert.Equal(t, initAccess(rep.InitiatorDepth), init.AccessFlags, "cm_init_qp_init_attr")
	rtr, err := b.m.QPAttr(id, QPStateRTR)
	require.NoError(t, err)
	assert.Equal(t, roce.MTU1024, rtr.PathMTU)
	assert.Equal(t, rep.LocalQPN, rtr.DestQPN)
	assert.Zero(t, rtr.ECE, "Linux's REP agrees on no ECE option")
	assert.Equal(t, uint32(myPSN), rtr.RQPSN, "B expects the PSN its REQ announced (ib_send_cm_req: rq_psn)")
	assert.Equal(t, minU8(rep.InitiatorDepth, dev.maxRdAtomic), rtr.MaxDestRdAtomic,
		"responder resources: A's initiator depth, at most the device's")
	assert.Equal(t, GIDFromIP(rxeA), rtr.AH.DGID)
	assert.Equal(t, GIDFromIP(rxeB), rtr.AH.SGID)
	assert.Equal(t, req.Primary.FlowLabel, rtr.AH.FlowLabel)
	assert.Equal(t, uint8(64), rtr.AH.HopLimit)
	rts, err := b.m.QPAttr(id, QPStateRTS)
	require.NoError(t, err)
	assert.Equal(t, rep.StartingPSN, rts.SQPSN, "B sends from the PSN A's REP says A expects (cm_rep_handler: sq_psn)")
	if psn, ok := c.firstReq[qpFlow{rxeB, rep.LocalQPN}]; ok {
		assert.Equal(t, psn, rts.SQPSN, "the first PSN Linux's B sent on the wire")
	}
	assert.Equal(t, AckTimeout(rep.TargetACKDelay, linux61PacketLifeTime), rts.Timeout, "cm_rep_handler: av.timeout")
	assert.Equal(t, req.RetryCount, rts.RetryCount)
	assert.Equal(t, rep.RNRRetryCount, rts.RNRRetry)
	assert.Equal(t, minU8(rep.ResponderResources, dev.maxInitRdA), rts.MaxRdAtomic,
		"initiator depth: A's responder resources, at most the device's")

	// The RTU, as B's.
	require.NoError(t, b.m.RTU(id, nil))
	sent, evs = b.take()
	require.Len(t, evs, 1)
	assert.Equal(t, EventEstablished, evs[0].Type)
	require.Len(t, sent, 1)
	gotRTU, ok := sent[0].msg.(*RTU)
	require.True(t, ok, "%T", sent[0].msg)
	assert.Equal(t, rxeA, sent[0].dst)
	wantRTU := *rtu
	wantRTU.LocalCommID, wantRTU.RemoteCommID = gotREQ.LocalCommID, rep.LocalCommID
	assert.Equal(t, &wantRTU, gotRTU, "RTU field by field (comm IDs aside)")
	assert.Equal(t, cn.rtu.hdr.TID, cn.req.hdr.TID, "Linux's RTU carries the REQ's transaction ID")
	assert.Equal(t, reqTID, sent[0].hdr.TID, "and so does vrnic's")
}
