package cm

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/roce"
)

// at returns the MAD byte at CM data offset off.
func at(mad []byte, off int) byte { return mad[MADHeaderLen+off] }

func sampleREQ() *REQ {
	r := &REQ{
		LocalCommID: 0x11223344, VendorID: 0xabcdef, ServiceID: 0x0000000001064e21,
		LocalCAGUID: 0x0002c90300a1b2c3, LocalQKey: 0xcafef00d, LocalQPN: 0x123456,
		ResponderResources: 0x07, LocalEECN: 0x0a0b0c, InitiatorDepth: 0x05, RemoteEECN: 0x0d0e0f,
		RemoteCMResponseTimeout: 20, TransportServiceType: TransportRC, EndToEndFlowControl: true,
		StartingPSN: 0x654321, LocalCMResponseTimeout: 20, RetryCount: 7, PKey: 0xffff,
		PathMTU: roce.MTU1024, RDCExists: false, RNRRetryCount: 7, MaxCMRetries: 15, SRQ: false,
		Primary: Path{
			LocalLID: 0xffff, RemoteLID: 0xfffe,
			LocalGID:  GIDFromIP(netip.MustParseAddr("192.168.1.1")),
			RemoteGID: GIDFromIP(netip.MustParseAddr("192.168.1.2")),
			FlowLabel: 0xabcde, PacketRate: 16, TrafficClass: 0x5a, HopLimit: 64, SL: 5,
			SubnetLocal: true, LocalACKTimeout: 17,
		},
		Alternate: Path{LocalLID: 0x1234, RemoteLID: 0x5678, FlowLabel: 1, PacketRate: 0x3f,
			TrafficClass: 1, HopLimit: 2, SL: 15, LocalACKTimeout: 31},
		SAPSupported: true,
	}
	for i := range r.PrivateData {
		r.PrivateData[i] = byte(i + 1)
	}
	return r
}

// TestREQLayout checks every REQ field at its IBTA position, byte by byte.
func TestREQLayout(t *testing.T) {
	mad, err := Marshal(0x0000000100000abc, 0x42, sampleREQ())
	require.NoError(t, err)
	require.Len(t, mad, MADLen)
	// Common MAD header.
	assert.Equal(t, []byte{1, 0x07, 2, 0x03, 0, 0, 0, 0}, mad[:8])
	assert.Equal(t, uint64(0x0000000100000abc), binary.BigEndian.Uint64(mad[8:]))
	assert.Equal(t, []byte{0x00, 0x10, 0, 0, 0, 0, 0, 0x42}, mad[16:24])

	d := mad[MADHeaderLen:]
	assert.Equal(t, []byte{0x11, 0x22, 0x33, 0x44}, d[0:4], "local comm ID")
	assert.Equal(t, []byte{0x00, 0xab, 0xcd, 0xef}, d[4:8], "vendor ID in bytes 5-7")
	assert.Equal(t, []byte{0, 0, 0, 0, 0x01, 0x06, 0x4e, 0x21}, d[8:16], "service ID")
	assert.Equal(t, []byte{0x00, 0x02, 0xc9, 0x03, 0x00, 0xa1, 0xb2, 0xc3}, d[16:24], "CA GUID")
	assert.Equal(t, []byte{0, 0, 0, 0}, d[24:28], "reserved")
	assert.Equal(t, []byte{0xca, 0xfe, 0xf0, 0x0d}, d[28:32], "Q_Key")
	assert.Equal(t, []byte{0x12, 0x34, 0x56, 0x07}, d[32:36], "QPN, responder resources")
	assert.Equal(t, []byte{0x0a, 0x0b, 0x0c, 0x05}, d[36:40], "local EECN, initiator depth")
	// remote EECN; byte 43: remote CM response timeout 10100, transport
	// 00, end-to-end flow control 1.
	assert.Equal(t, []byte{0x0d, 0x0e, 0x0f, 0xa1}, d[40:44])
	// starting PSN; byte 47: local CM response timeout 10100, retry 111.
	assert.Equal(t, []byte{0x65, 0x43, 0x21, 0xa7}, d[44:48])
	// P_Key; byte 50: MTU 0011, RDC 0, RNR retry 111; byte 51: max CM
	// retries 1111, SRQ 0, extended transport 000.
	assert.Equal(t, []byte{0xff, 0xff, 0x37, 0xf0}, d[48:52])
	assert.Equal(t, []byte{0xff, 0xff, 0xff, 0xfe}, d[52:56], "primary LIDs")
	assert.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 1}, d[56:72], "primary local GID")
	assert.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 2}, d[72:88], "primary remote GID")
	// flow label 20 bits, 6 reserved, packet rate 6 bits (010000).
	assert.Equal(t, []byte{0xab, 0xcd, 0xe0, 0x10}, d[88:92])
	// traffic class, hop limit, SL 0101 + subnet local 1, ACK timeout
	// 10001 + 3 reserved.
	assert.Equal(t, []byte{0x5a, 64, 0x58, 0x88}, d[92:96])
	assert.Equal(t, []byte{0x12, 0x34, 0x56, 0x78}, d[96:100], "alternate LIDs")
	assert.Equal(t, []byte{0x00, 0x00, 0x10, 0x3f}, d[132:136], "alternate flow label, rate")
	// alternate: TC 1, hop limit 2, SL 1111 subnet local 0, ACK timeout
	// 11111 then SAP supported (bit 5) 1.
	assert.Equal(t, []byte{1, 2, 0xf0, 0xfc}, d[136:140])
	assert.Equal(t, byte(1), d[140], "private data starts at 140")
	assert.Equal(t, byte(92), d[231], "and ends at 231")
}

func TestREPLayout(t *testing.T) {
	rep := &REP{LocalCommID: 1, RemoteCommID: 2, LocalQKey: 3, LocalQPN: 0xabcdef, VendorID: 0x123456,
		LocalEECN: 0x0a0b0c, StartingPSN: 0x010203, ResponderResources: 4, InitiatorDepth: 5,
		TargetACKDelay: 15, FailoverAccepted: 2, EndToEndFlowControl: true, RNRRetryCount: 6, SRQ: true,
		LocalCAGUID: 0x1122334455667788}
	rep.PrivateData[0], rep.PrivateData[195] = 0xaa, 0xbb
	mad, err := Marshal(7, 0, rep)
	require.NoError(t, err)
	d := mad[MADHeaderLen:]
	assert.Equal(t, []byte{0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3}, d[0:12])
	assert.Equal(t, []byte{0xab, 0xcd, 0xef, 0x12, 0x0a, 0x0b, 0x0c, 0x34, 0x01, 0x02, 0x03, 0x56}, d[12:24])
	// resp. resources, initiator depth; byte 26: target ACK delay 01111,
	// failover 10, e2e 1; byte 27: RNR retry 110, SRQ 1.
	assert.Equal(t, []byte{4, 5, 0x7d, 0xd0}, d[24:28])
	assert.Equal(t, []byte{0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88}, d[28:36])
	assert.Equal(t, byte(0xaa), d[36])
	assert.Equal(t, byte(0xbb), d[231])
}

func TestShortMessageLayouts(t *testing.T) {
	for _, c := range []struct {
		name string
		msg  Message
		want map[int]byte
	}{
		{"MRA", &MRA{LocalCommID: 0x01020304, RemoteCommID: 0x05060708, MessageMRAed: MsgREP, ServiceTimeout: 24},
			map[int]byte{0: 1, 3: 4, 4: 5, 7: 8, 8: 0x40, 9: 0xc0}},
		{"REJ", &REJ{LocalCommID: 1, RemoteCommID: 2, MessageRejected: MsgOther, RejectInfoLen: 8, Reason: RejectConsumerDefined,
			ARI: [72]byte{0xee}, PrivateData: [148]byte{0xdd}},
			map[int]byte{3: 1, 7: 2, 8: 0x80, 9: 8 << 1, 10: 0, 11: 28, 12: 0xee, 84: 0xdd}},
		{"RTU", &RTU{LocalCommID: 1, RemoteCommID: 2, PrivateData: [224]byte{0xdd}}, map[int]byte{3: 1, 7: 2, 8: 0xdd}},
		{"DREQ", &DREQ{LocalCommID: 1, RemoteCommID: 2, RemoteQPN: 0xabcdef, PrivateData: [220]byte{0xdd}},
			map[int]byte{3: 1, 7: 2, 8: 0xab, 9: 0xcd, 10: 0xef, 11: 0, 12: 0xdd}},
		{"DREP", &DREP{LocalCommID: 1, RemoteCommID: 2, PrivateData: [224]byte{0xdd}}, map[int]byte{3: 1, 7: 2, 8: 0xdd}},
		{"SIDR_REQ", &SIDRReq{RequestID: 9, PKey: 0xffff, ServiceID: 0x01110000 | 7, PrivateData: [216]byte{0xdd}},
			map[int]byte{3: 9, 4: 0xff, 5: 0xff, 12: 0x01, 13: 0x11, 15: 7, 16: 0xdd}},
		{"SIDR_REP", &SIDRRep{RequestID: 9, Status: SIDRNoQP, InfoLen: 2, VendorID: 0x123456, QPN: 0xabcdef,
			ServiceID: 0x01110007, QKey: 0x01234567, Info: [72]byte{0xee}, PrivateData: [136]byte{0xdd}},
			map[int]byte{3: 9, 4: 3, 5: 2, 6: 0x12, 7: 0x34, 8: 0xab, 10: 0xef, 11: 0x56, 16: 0x01, 19: 0x07,
				20: 0x01, 23: 0x67, 24: 0xee, 96: 0xdd}},
	} {
		t.Run(c.name, func(t *testing.T) {
			mad, err := Marshal(1, 0, c.msg)
			require.NoError(t, err)
			for off, b := range c.want {
				assert.Equal(t, b, at(mad, off), "byte %d", off)
			}
			_, got, err := Decode(mad)
			require.NoError(t, err)
			assert.Equal(t, c.msg, got)
		})
	}
}

func TestRoundTrip(t *testing.T) {
	req := sampleREQ()
	mad, err := Marshal(99, 0, req)
	require.NoError(t, err)
	h, got, err := Decode(mad)
	require.NoError(t, err)
	assert.Equal(t, req, got)
	assert.Equal(t, AttrREQ, h.AttrID)
	assert.Equal(t, uint64(99), h.TID)
}

func TestDecodeRejects(t *testing.T) {
	good, err := Marshal(1, 0, sampleREQ())
	require.NoError(t, err)
	mod := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	for _, c := range []struct {
		name string
		mad  []byte
		err  error
	}{
		{"short", good[:255], ErrShortMAD},
		{"long", append(append([]byte(nil), good...), 0), ErrShortMAD},
		{"empty", nil, ErrShortMAD},
		{"base version", mod(func(b []byte) { b[0] = 2 }), ErrBadHeader},
		{"class", mod(func(b []byte) { b[1] = 0x03 }), ErrBadHeader},
		{"class version", mod(func(b []byte) { b[2] = 1 }), ErrBadHeader},
		{"method", mod(func(b []byte) { b[3] = 0x01 }), ErrBadHeader},
		{"LAP", mod(func(b []byte) { b[17] = 0x19 }), ErrUnsupportedAttribute},
		{"APR", mod(func(b []byte) { b[17] = 0x1a }), ErrUnsupportedAttribute},
		{"unknown attribute", mod(func(b []byte) { b[16] = 0xff }), ErrUnsupportedAttribute},
		{"MTU 0", mod(func(b []byte) { b[MADHeaderLen+50] &= 0x0f }), ErrBadField},
		{"MTU 6", mod(func(b []byte) { b[MADHeaderLen+50] = 0x60 | b[MADHeaderLen+50]&0x0f }), ErrBadField},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, m, err := Decode(c.mad)
			assert.ErrorIs(t, err, c.err)
			assert.Nil(t, m)
		})
	}
	rej, err := Marshal(1, 0, &REJ{Reason: RejectStaleConn})
	require.NoError(t, err)
	bad := append([]byte(nil), rej...)
	bad[MADHeaderLen+9] = 73 << 1
	_, _, err = Decode(bad)
	assert.ErrorIs(t, err, ErrBadField, "REJ info length 73")
	bad = append([]byte(nil), rej...)
	bad[MADHeaderLen+8] = 0xc0
	_, _, err = Decode(bad)
	assert.ErrorIs(t, err, ErrBadField, "REJ message rejected 3")
	bad = append([]byte(nil), rej...)
	bad[MADHeaderLen+11] = 0
	_, _, err = Decode(bad)
	assert.ErrorIs(t, err, ErrBadField, "REJ reason 0")
	srep, err := Marshal(1, 0, &SIDRRep{})
	require.NoError(t, err)
	srep[MADHeaderLen+4] = 6
	_, _, err = Decode(srep)
	assert.ErrorIs(t, err, ErrBadField, "SIDR status 6")
}

func TestEncodeRange(t *testing.T) {
	for _, m := range []Message{
		&REQ{LocalQPN: 1 << 24, PathMTU: roce.MTU1024},
		&REQ{PathMTU: 16},
		&REQ{PathMTU: roce.MTU256, Primary: Path{FlowLabel: 1 << 20}},
		&REP{VendorID: 1 << 24},
		&REJ{RejectInfoLen: 73, Reason: 1},
		&MRA{ServiceTimeout: 32},
		&DREQ{RemoteQPN: 1 << 24},
		&SIDRRep{InfoLen: 73},
	} {
		_, err := Marshal(1, 0, m)
		assert.ErrorIs(t, err, ErrFieldRange, "%#v", m)
	}
	assert.ErrorIs(t, Encode(make([]byte, 10), 1, 0, &RTU{}), ErrShortMAD)
}

func TestTimeouts(t *testing.T) {
	assert.Equal(t, time.Millisecond, IBADuration(0))
	assert.Equal(t, time.Millisecond, IBADuration(8))
	assert.Equal(t, 512*time.Millisecond, IBADuration(17))
	assert.Equal(t, 4096*time.Millisecond, IBADuration(20))
	assert.Equal(t, 65536*time.Millisecond, IBADuration(24))
	// REQ timeout of rdma_cm over RoCE: 2 × 2^(16-8) + 2^(20-8) ms.
	assert.Equal(t, 4608*time.Millisecond, reqTimeout(16, 20))
	// cm_ack_timeout: rxe's ACK delay 15, packet life time 16 → 17.
	assert.Equal(t, uint8(17), AckTimeout(15, 16))
	assert.Equal(t, uint8(19), AckTimeout(18, 16), "within half: round up")
	assert.Equal(t, uint8(20), AckTimeout(20, 10), "ACK delay dominates")
	assert.Equal(t, uint8(18), AckTimeout(17, 16))
	assert.Equal(t, uint8(31), AckTimeout(31, 31))
	assert.Equal(t, uint8(2), AckTimeout(0, 0), "packet life 0: 1, ACK delay within half: 2")
}
