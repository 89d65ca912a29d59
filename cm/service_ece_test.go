package cm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// addECE is svcNet.add with Config.ECE ece (add: none).
func (n *svcNet) addECE(t *testing.T, ip string, guid uint64, ece uint32) *Service {
	gid := GIDFromIP(netip.MustParseAddr(ip))
	s, err := NewService(ServiceConfig{
		CM:  Config{CAGUID: guid, AckDelay: RXEAckDelay, ECE: ece},
		GSI: svcGSI{n: n, gid: gid}, GIDs: [][16]byte{gid}, MaxMTU: roce.MTU1024,
		InboxMADs: 1 << 16,
	})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	n.mu.Lock()
	n.svcs[gid] = s
	n.mu.Unlock()
	return s
}

// rawClient is a context that keeps every event datagram as it came.
type rawClient struct {
	svcClient
	events chan []byte
}

func newRawClient(h uint32) *rawClient {
	return &rawClient{svcClient: *newSvcClient(h), events: make(chan []byte, 64)}
}

func (c *rawClient) CMPostEvent(b []byte) { c.events <- append([]byte(nil), b...) }

// next returns the next event: its datagram decoded as struct
// vrnic_cm_event and, when it is a struct vrnic_cm_event_ece, its ECE.
func (c *rawClient) next(t *testing.T) (abi.CMEvent, *abi.CMECE) {
	t.Helper()
	select {
	case b := <-c.events:
		switch len(b) {
		case abi.SizeofCMEvent:
			var ev abi.CMEvent
			_, err := abi.Unmarshal(b, &ev)
			require.NoError(t, err)
			return ev, nil
		case abi.SizeofCMEventECE:
			var ev abi.CMEventECE
			_, err := abi.Unmarshal(b, &ev)
			require.NoError(t, err)
			return ev.Ev, &ev.PeerECE
		}
		t.Fatalf("event of %d bytes", len(b))
	case <-time.After(30 * time.Second):
		t.Fatal("no event")
	}
	return abi.CMEvent{}, nil
}

// TestServiceECE: through the CM commands, an RC connection between two
// clients whose IDs negotiate ECE (VRNIC_CM_ID_F_ECE): the REQ offers
// CM_CONNECT's options, the CONNECT_REQUEST reports them (struct
// vrnic_cm_event_ece) and its RTR attributes carry those the passive
// device supports (VRNIC_QP_ECE); CM_ACCEPT's options (the passive QP
// took sr only) bound the REP, and the CONNECT_RESPONSE reports the REP's
// and gives the active side the agreed ones at RTR. An ID without the
// flag sees none of it: events of 352 bytes, RTR attributes without
// VRNIC_QP_ECE.
func TestServiceECE(t *testing.T) {
	n := &svcNet{svcs: map[GID]*Service{}}
	a := n.addECE(t, "10.9.0.1", 0xa, abi.ECEOptions)
	b := n.addECE(t, "10.9.0.2", 0xb, abi.ECEOptions)
	dgid := GIDFromIP(netip.MustParseAddr("10.9.0.2"))
	server, client := newRawClient(1), newRawClient(2)
	sid := ServiceID(PortSpaceTCP, 7000)
	newID := func(s *Service, c Client, flags uint32) uint32 {
		r, err := cmd(t, s, c, abi.CmdCMCreateID, &abi.CmdCMCreateIDReq{QPType: abi.QPTRC, Flags: flags})
		require.NoError(t, err)
		return r.(*abi.RespCMID).CMID
	}
	lid := newID(b, server, abi.CMIDFlagECE)
	_, err := cmd(t, b, server, abi.CmdCMListen, &abi.CmdCMListenReq{CMID: lid, ServiceID: sid})
	require.NoError(t, err)

	id := newID(a, client, abi.CMIDFlagECE)
	_, err = cmd(t, a, client, abi.CmdCMConnect, &abi.CmdCMConnectReq{CMID: id, QPN: 0x111, StartingPSN: 5,
		ServiceID: sid, DGID: dgid, RetryCount: 7, RNRRetryCount: 7, ECEOptions: abi.ECEOptions})
	require.NoError(t, err)
	req, ece := server.next(t)
	require.Equal(t, abi.CMEventConnectRequest, req.Type)
	require.NotNil(t, ece, "a struct vrnic_cm_event_ece")
	assert.Equal(t, abi.CMECE{VendorID: abi.ECEVendorID, Options: abi.ECEOptions}, *ece)
	assert.NotZero(t, req.QPAttr.AttrMask&abi.QPAttrECE)
	assert.Equal(t, uint16(abi.ECEOptions), req.QPAttr.ECEOptions)
	r, err := cmd(t, b, server, abi.CmdCMInitQPAttr, &abi.CmdCMInitQPAttrReq{CMID: req.CMID, QPState: abi.QPSRTR})
	require.NoError(t, err)
	rtr := r.(*abi.CMQPAttr)
	assert.NotZero(t, rtr.AttrMask&abi.QPAttrECE)
	assert.Equal(t, uint16(abi.ECEOptions), rtr.ECEOptions)
	r, err = cmd(t, b, server, abi.CmdCMInitQPAttr, &abi.CmdCMInitQPAttrReq{CMID: req.CMID, QPState: abi.QPSRTS})
	require.NoError(t, err)
	assert.Zero(t, r.(*abi.CMQPAttr).AttrMask&abi.QPAttrECE, "RTS takes no ECE")

	// Unknown option bits are refused.
	_, err = cmd(t, b, server, abi.CmdCMAccept, &abi.CmdCMAcceptReq{CMID: req.CMID, QPN: 0x222, StartingPSN: rtr.RQPSN, ECEOptions: 1 << 5})
	assert.ErrorIs(t, err, unix.EINVAL)
	_, err = cmd(t, b, server, abi.CmdCMAccept, &abi.CmdCMAcceptReq{CMID: req.CMID, QPN: 0x222, StartingPSN: rtr.RQPSN,
		ECEOptions: abi.ECESelectiveRepeat})
	require.NoError(t, err)
	rep, ece := client.next(t)
	require.Equal(t, abi.CMEventConnectResponse, rep.Type)
	require.NotNil(t, ece)
	assert.Equal(t, abi.CMECE{VendorID: abi.ECEVendorID, Options: abi.ECESelectiveRepeat}, *ece)
	assert.NotZero(t, rep.QPAttr.AttrMask&abi.QPAttrECE)
	assert.Equal(t, uint16(abi.ECESelectiveRepeat), rep.QPAttr.ECEOptions)
	_, err = cmd(t, a, client, abi.CmdCMEstablish, &abi.CmdHandleReq{Handle: id})
	require.NoError(t, err)
	est, ece := client.next(t)
	assert.Equal(t, abi.CMEventEstablished, est.Type)
	assert.Equal(t, &abi.CMECE{}, ece, "other events: zero ECE")
	est, _ = server.next(t)
	assert.Equal(t, abi.CMEventEstablished, est.Type)
	info := a.Info()
	var ids []string
	for _, i := range info.IDs {
		ids = append(ids, i.ECE)
	}
	assert.Equal(t, []string{"sr"}, ids, "the operator's view of the agreed options")

	// Without the flag: no ECE, whatever the peer does, and ece_options
	// are refused.
	id2 := newID(a, client, 0)
	_, err = cmd(t, a, client, abi.CmdCMConnect, &abi.CmdCMConnectReq{CMID: id2, QPN: 0x333, ServiceID: sid, DGID: dgid,
		ECEOptions: abi.ECESelectiveRepeat})
	assert.ErrorIs(t, err, unix.EINVAL)
	_, err = cmd(t, a, client, abi.CmdCMConnect, &abi.CmdCMConnectReq{CMID: id2, QPN: 0x333, ServiceID: sid, DGID: dgid,
		RetryCount: 7, RNRRetryCount: 7})
	require.NoError(t, err)
	req, ece = server.next(t)
	require.Equal(t, abi.CMEventConnectRequest, req.Type)
	assert.Equal(t, &abi.CMECE{}, ece, "the REQ carried no ECE")
	assert.NotZero(t, req.QPAttr.AttrMask&abi.QPAttrECE, "the listener's request takes part")
	assert.Zero(t, req.QPAttr.ECEOptions)
	// A client of ABI 1.4 accepts with the command without ece_options.
	acc := make([]byte, abi.Sizeof(&abi.CmdCMAcceptReq{}))
	_, err = abi.Marshal(acc, &abi.CmdCMAcceptReq{CMID: req.CMID, QPN: 0x444, StartingPSN: req.QPAttr.RQPSN})
	require.NoError(t, err)
	_, err = b.Command(server, abi.CmdCMAccept, acc[:abi.OffCMAcceptECE])
	require.NoError(t, err)
	rep, ece = client.next(t)
	require.Equal(t, abi.CMEventConnectResponse, rep.Type)
	assert.Nil(t, ece, "an ID without the flag gets struct vrnic_cm_event")
	assert.Zero(t, rep.QPAttr.AttrMask&abi.QPAttrECE, "and no VRNIC_QP_ECE")
	_, err = b.Command(server, abi.CmdCMAccept, acc[:abi.OffCMAcceptECE+4])
	assert.ErrorIs(t, err, unix.EMSGSIZE)

	_, err = cmd(t, a, client, abi.CmdCMCreateID, &abi.CmdCMCreateIDReq{QPType: abi.QPTRC, Flags: 2})
	assert.ErrorIs(t, err, unix.EINVAL)
}
