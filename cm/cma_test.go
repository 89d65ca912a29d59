package cm

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/roce"
)

func TestServiceID(t *testing.T) {
	assert.Equal(t, uint64(0x0000000001060000|7471), ServiceID(PortSpaceTCP, 7471))
	assert.Equal(t, uint64(0x0000000001110000|7174), ServiceID(PortSpaceUDP, 7174))
	assert.Equal(t, uint64(0x00000000013f0001), ServiceID(PortSpaceIB, 1))
	assert.Equal(t, uint64(0x0000000000020005), ServiceID(PortSpaceIPoIB, 5))
	ps, port, ok := ParseServiceID(0x0000000001064e21)
	assert.True(t, ok)
	assert.Equal(t, PortSpaceTCP, ps)
	assert.Equal(t, uint16(20001), port)
	_, _, ok = ParseServiceID(0x1000000001064e21)
	assert.False(t, ok)
	_, _, ok = ParseServiceID(0x0000000001074e21)
	assert.False(t, ok)
}

func TestCMAHeader(t *testing.T) {
	h := CMAHeader{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 0x1234}
	b := make([]byte, CMAHeaderLen)
	require.NoError(t, h.Marshal(b))
	// IPv4 addresses after 12 zero bytes (union cma_ip_addr), not
	// IPv4-mapped.
	assert.Equal(t, []byte{0x00, 0x40, 0x12, 0x34,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2}, b)
	got, err := ParseCMAHeader(b)
	require.NoError(t, err)
	assert.Equal(t, h, got)

	h6 := CMAHeader{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), SrcPort: 1}
	require.NoError(t, h6.Marshal(b))
	assert.Equal(t, byte(0x60), b[1])
	assert.Equal(t, byte(0xfd), b[4])
	assert.Equal(t, byte(2), b[35])
	got, err = ParseCMAHeader(b)
	require.NoError(t, err)
	assert.Equal(t, h6, got)

	assert.ErrorIs(t, (&CMAHeader{Src: h.Src, Dst: h6.Dst}).Marshal(b), ErrInvalidParam)
	b[1] = 0x50
	_, err = ParseCMAHeader(b)
	assert.ErrorIs(t, err, ErrBadField)
	b[0] = 1
	_, err = ParseCMAHeader(b)
	assert.ErrorIs(t, err, ErrBadField)
	_, err = ParseCMAHeader(b[:35])
	assert.ErrorIs(t, err, ErrBadField)

	pd, err := CMAPrivateData(h, []byte{9})
	require.NoError(t, err)
	assert.Len(t, pd, CMAHeaderLen+1)
	_, err = CMAPrivateData(h, make([]byte, 57))
	assert.ErrorIs(t, err, ErrPrivateDataLen)
}

func TestRoCEPath(t *testing.T) {
	src := netip.MustParseAddrPort("192.168.1.1:43000")
	dst := netip.MustParseAddrPort("192.168.1.2:7471")
	p := RoCEPath(src, dst, roce.MTU4096, 7, 64, 0x20)
	assert.Equal(t, GID{10: 0xff, 11: 0xff, 12: 192, 13: 168, 14: 1, 15: 1}, p.SGID)
	assert.Equal(t, dst.Addr(), p.DGID.IP())
	assert.Equal(t, uint32((43000*31+7471)&0xfffff), p.FlowLabel)
	assert.Equal(t, uint16(0xffff), p.PKey)
	assert.Equal(t, uint8(16), p.PacketLifeTime)
	assert.Equal(t, uint8(0x20), p.TrafficClass)
	assert.Equal(t, uint8(0), p.SL)
	assert.Equal(t, 4096, p.MTU.Bytes())
	assert.Equal(t, "::ffff:192.168.1.1", p.SGID.String())
}
