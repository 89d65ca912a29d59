package roce

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wrap puts Ethernet, IP and UDP headers with consistent lengths and
// checksums around tp (BTH through ICRC) and, when fixICRC, rewrites the
// ICRC; it lets tests hand the parser transport packets Build refuses to
// make.
func wrap(v6 bool, tp []byte, fixICRC bool) []byte {
	p := goldenPath(v6, 0x11)
	ipl := IPv4HeaderLen
	et := uint16(EtherTypeIPv4)
	if v6 {
		ipl, et = IPv6HeaderLen, EtherTypeIPv6
	}
	f := make([]byte, EthernetHeaderLen+ipl+UDPHeaderLen+len(tp))
	Ethernet(f).Encode(&EthernetFields{Dst: p.DstMAC, Src: p.SrcMAC, Type: et})
	ip := f[EthernetHeaderLen:]
	ul := uint16(UDPHeaderLen + len(tp))
	if v6 {
		IPv6(ip).Encode(&IPv6Fields{PayloadLength: ul, NextHeader: ProtocolUDP, HopLimit: 64, Src: p.Src.As16(), Dst: p.Dst.As16()})
	} else {
		IPv4(ip).Encode(&IPv4Fields{TotalLength: uint16(ipl) + ul, FlagsFragment: IPv4FlagDF, TTL: 64, Protocol: ProtocolUDP, Src: p.Src.As4(), Dst: p.Dst.As4()})
	}
	UDP(ip[ipl:]).Encode(&UDPFields{SrcPort: 0xc000, DstPort: UDPPort, Length: ul})
	copy(ip[ipl+UDPHeaderLen:], tp)
	if fixICRC && len(tp) >= BTHLen+ICRCLen {
		putICRC(f[len(f)-ICRCLen:], icrcIP(ip[:len(ip)-ICRCLen], v6, ipl))
	}
	return f
}

// transport builds op with n payload bytes in ModeUDP and returns a copy
// of BTH..ICRC.
func transport(t *testing.T, op Opcode, n int) []byte {
	p := Path{Mode: ModeUDP}
	h := Headers{BTH: BTHFields{Opcode: op, PKey: DefaultPKey, DestQP: 0x11}}
	buf := make([]byte, MaxHeadroom+n+MaxTailroom)
	out, err := p.Build(buf, MaxHeadroom, n, &h)
	require.NoError(t, err)
	return bytes.Clone(out)
}

// fixIPv4 recomputes the IPv4 header checksum of frame f.
func fixIPv4(f []byte) {
	ip := IPv4(f[EthernetHeaderLen:])
	ip.SetChecksum(ip.CalculateChecksum())
}

// TestParseDefects hands Parse one defect at a time and expects its
// sentinel error.
func TestParseDefects(t *testing.T) {
	write := func(v6 bool) []byte { return wrap(v6, transport(t, OpRCWriteOnly, 64), true) }
	ipOff := EthernetHeaderLen
	udpOff := func(v6 bool) int {
		if v6 {
			return ipOff + IPv6HeaderLen
		}
		return ipOff + IPv4HeaderLen
	}
	tests := []struct {
		name  string
		v6    bool
		frame func(v6 bool) []byte
		want  error
	}{
		{"short Ethernet", false, func(v6 bool) []byte { return write(v6)[:13] }, ErrTruncated},
		{"short 802.1Q tag", false, func(v6 bool) []byte {
			f := write(v6)
			binary.BigEndian.PutUint16(f[12:], EtherTypeVLAN)
			return f[:17]
		}, ErrTruncated},
		{"ARP", false, func(v6 bool) []byte {
			f := write(v6)
			binary.BigEndian.PutUint16(f[12:], EtherTypeARP)
			return f
		}, ErrNotIP},
		{"RoCE v1", false, func(v6 bool) []byte {
			f := write(v6)
			binary.BigEndian.PutUint16(f[12:], EtherTypeRoCEv1)
			return f
		}, ErrRoCEv1},
		{"short IPv4 header", false, func(v6 bool) []byte { return write(v6)[:ipOff+19] }, ErrTruncated},
		{"short IPv6 header", true, func(v6 bool) []byte { return write(v6)[:ipOff+39] }, ErrTruncated},
		{"IPv6 in an IPv4 EtherType", false, func(v6 bool) []byte {
			f := write(v6)
			f[ipOff] = 0x65
			fixIPv4(f)
			return f
		}, ErrBadIPVersion},
		{"IPv4 in an IPv6 EtherType", true, func(v6 bool) []byte {
			f := write(v6)
			f[ipOff] = 0x40 | f[ipOff]&0xf
			return f
		}, ErrBadIPVersion},
		{"IHL 4", false, func(v6 bool) []byte {
			f := write(v6)
			f[ipOff] = 0x44
			return f
		}, ErrBadIPHeaderLen},
		{"IHL past the end", false, func(v6 bool) []byte {
			f := write(v6)
			f[ipOff] = 0x4f
			return f[:ipOff+40]
		}, ErrBadIPHeaderLen},
		{"IPv4 header checksum", false, func(v6 bool) []byte {
			f := write(v6)
			f[ipOff+10] ^= 1
			return f
		}, ErrBadIPChecksum},
		{"IPv4 more fragments", false, func(v6 bool) []byte {
			f := write(v6)
			IPv4(f[ipOff:]).SetFlagsFragment(IPv4FlagMF)
			fixIPv4(f)
			return f
		}, ErrFragment},
		{"IPv4 fragment offset", false, func(v6 bool) []byte {
			f := write(v6)
			IPv4(f[ipOff:]).SetFlagsFragment(IPv4FlagDF | 8)
			fixIPv4(f)
			return f
		}, ErrFragment},
		{"IPv4 TCP", false, func(v6 bool) []byte {
			f := write(v6)
			f[ipOff+9] = 6
			fixIPv4(f)
			return f
		}, ErrNotUDP},
		{"IPv6 extension header", true, func(v6 bool) []byte {
			f := write(v6)
			f[ipOff+6] = 0 // hop-by-hop options
			return f
		}, ErrNotUDP},
		{"IPv4 total length beyond the frame", false, func(v6 bool) []byte {
			f := write(v6)
			return f[:len(f)-1]
		}, ErrTruncated},
		{"IPv6 payload length beyond the frame", true, func(v6 bool) []byte {
			f := write(v6)
			return f[:len(f)-1]
		}, ErrTruncated},
		{"IPv4 total length too small for UDP", false, func(v6 bool) []byte {
			f := write(v6)
			IPv4(f[ipOff:]).SetTotalLength(27)
			fixIPv4(f)
			return f
		}, ErrBadLength},
		{"IPv6 payload length too small for UDP", true, func(v6 bool) []byte {
			f := write(v6)
			IPv6(f[ipOff:]).SetPayloadLength(7)
			return f
		}, ErrBadLength},
		{"UDP length disagrees with IP", false, func(v6 bool) []byte {
			f := write(v6)
			u := UDP(f[udpOff(v6):])
			u.SetLength(u.Length() - 4)
			return f
		}, ErrBadLength},
		{"UDP length disagrees with IPv6", true, func(v6 bool) []byte {
			f := write(v6)
			u := UDP(f[udpOff(v6):])
			u.SetLength(u.Length() + 4)
			return f
		}, ErrBadLength},
		{"not port 4791", false, func(v6 bool) []byte {
			f := write(v6)
			UDP(f[udpOff(v6):]).SetDstPort(4792)
			return f
		}, ErrNotRoCE},
		{"UDP payload shorter than BTH+ICRC", false, func(v6 bool) []byte {
			return wrap(v6, make([]byte, BTHLen+ICRCLen-1), false)
		}, ErrTruncated},
		{"BTH version 1", true, func(v6 bool) []byte {
			tp := transport(t, OpRCSendOnly, 8)
			BTH(tp).SetTVer(1)
			return wrap(v6, tp, true)
		}, ErrBadBTHVersion},
		{"unknown opcode 0x15", false, func(v6 bool) []byte {
			tp := transport(t, OpRCSendOnly, 8)
			BTH(tp).SetOpcode(0x15)
			return wrap(v6, tp, true)
		}, ErrUnknownOpcode},
		{"RD opcode", false, func(v6 bool) []byte {
			tp := transport(t, OpRCSendOnly, 8)
			BTH(tp).SetOpcode(0x44)
			return wrap(v6, tp, true)
		}, ErrUnknownOpcode},
		{"RDMA WRITE ONLY without room for its RETH", false, func(v6 bool) []byte {
			tp := transport(t, OpRCSendOnly, 8) // 12 + 8 + 4 bytes
			BTH(tp).SetOpcode(OpRCWriteOnly)    // needs 12 + 16 + 4
			return wrap(v6, tp, true)
		}, ErrOpcodeLength},
		{"ACK with a payload", true, func(v6 bool) []byte {
			tp := transport(t, OpRCSendOnly, 8)
			BTH(tp).SetOpcode(OpRCAck)
			return wrap(v6, tp, true)
		}, ErrOpcodeLength},
		{"pad on an opcode without payload", false, func(v6 bool) []byte {
			tp := transport(t, OpRCAck, 0)
			BTH(tp).SetPadCount(1)
			return wrap(v6, tp, true)
		}, ErrBadPad},
		{"pad longer than the payload", false, func(v6 bool) []byte {
			tp := transport(t, OpRCSendOnly, 0)
			BTH(tp).SetPadCount(3)
			return wrap(v6, tp, true)
		}, ErrBadPad},
		{"pad on a FIRST packet", false, func(v6 bool) []byte {
			tp := transport(t, OpRCSendFirst, 256)
			BTH(tp).SetPadCount(2)
			return wrap(v6, tp, true)
		}, ErrBadPad},
		{"payload not a multiple of 4", false, func(v6 bool) []byte {
			tp := transport(t, OpRCSendOnly, 8)
			tp = append(tp[:len(tp)-ICRCLen], 0, 0, 0, 0, 0)
			return wrap(v6, tp, true)
		}, ErrBadPad},
		{"ICRC", false, func(v6 bool) []byte {
			f := write(v6)
			f[len(f)-1] ^= 0x80
			return f
		}, ErrICRC},
		{"ICRC over IPv6", true, func(v6 bool) []byte {
			f := write(v6)
			f[len(f)-ICRCLen-1] ^= 1 // last payload byte
			return f
		}, ErrICRC},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.frame(tt.v6)
			var pkt Packet
			err := Parse(f, &pkt)
			require.Error(t, err)
			assert.ErrorIs(t, err, tt.want)
			for _, other := range allParseErrors {
				if other != tt.want {
					assert.False(t, errors.Is(err, other), "%v also matches %v", err, other)
				}
			}
		})
	}
	// The untouched frames are fine.
	for _, v6 := range []bool{false, true} {
		var pkt Packet
		require.NoError(t, Parse(write(v6), &pkt))
	}
}

var allParseErrors = []error{
	ErrTruncated, ErrNotIP, ErrRoCEv1, ErrBadIPVersion, ErrBadIPHeaderLen, ErrBadIPChecksum,
	ErrFragment, ErrBadLength, ErrNotUDP, ErrNotRoCE, ErrBadBTHVersion, ErrUnknownOpcode,
	ErrOpcodeLength, ErrBadPad, ErrICRC,
}

// TestParseIgnoresEthernetPadding: bytes after the IP packet (minimum
// frame padding, trailers) are not part of the packet.
func TestParseIgnoresEthernetPadding(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		tp := transport(t, OpRCAck, 0)
		f := append(wrap(v6, tp, true), make([]byte, 20)...)
		var pkt Packet
		require.NoError(t, Parse(f, &pkt))
		assert.Equal(t, OpRCAck, pkt.Opcode())
		assert.Empty(t, pkt.Payload)
	}
}

// TestParseIPv4Options accepts an IPv4 header with options; the ICRC
// covers them.
func TestParseIPv4Options(t *testing.T) {
	tp := transport(t, OpRCSendOnly, 5)
	plain := wrap(false, tp, true)
	// Insert 4 bytes of options (NOP NOP NOP EOL).
	f := append([]byte{}, plain[:EthernetHeaderLen+IPv4HeaderLen]...)
	f = append(f, 1, 1, 1, 0)
	f = append(f, plain[EthernetHeaderLen+IPv4HeaderLen:]...)
	ip := IPv4(f[EthernetHeaderLen:])
	ip[0] = 0x46
	ip.SetTotalLength(ip.TotalLength() + 4)
	ip.SetChecksum(ip.CalculateChecksum())
	putICRC(f[len(f)-ICRCLen:], icrcIP(f[EthernetHeaderLen:len(f)-ICRCLen], false, 24))
	var pkt Packet
	require.NoError(t, Parse(f, &pkt))
	assert.Len(t, pkt.IPv4, 24)
	assert.Equal(t, OpRCSendOnly, pkt.Opcode())
	assert.Len(t, pkt.Payload, 5)
	assert.Equal(t, refICRC(f[EthernetHeaderLen:]), pkt.ICRC, "the ICRC covers the options")
	f[EthernetHeaderLen+21] = 7 // option byte: covered by the ICRC
	ip.SetChecksum(ip.CalculateChecksum())
	assert.ErrorIs(t, Parse(f, &pkt), ErrICRC)
}

// TestUDPModeRoundTrip: the UDP link's two ends agree on the ICRC when
// they use the same pseudo header, and disagree when any pseudo field
// differs.
func TestUDPModeRoundTrip(t *testing.T) {
	a4, b4 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	a6, b6 := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	tests := []struct {
		name string
		send Path
		recv Pseudo
		ok   bool
	}{
		{"zero pseudo header", Path{Mode: ModeUDP}, Pseudo{}, true},
		{"IPv4 socket pair", Path{Mode: ModeUDP, Src: a4, Dst: b4, SrcPort: 4791}, Pseudo{Src: a4, Dst: b4, SrcPort: 4791, DstPort: 4791}, true},
		{"IPv4-mapped equals IPv4", Path{Mode: ModeUDP, Src: netip.AddrFrom16(a4.As16()), Dst: b4, SrcPort: 50000}, Pseudo{Src: a4, Dst: netip.AddrFrom16(b4.As16()), SrcPort: 50000}, true},
		{"IPv6 socket pair", Path{Mode: ModeUDP, Src: a6, Dst: b6, SrcPort: 50001}, Pseudo{Src: a6, Dst: b6, SrcPort: 50001}, true},
		{"wrong source address", Path{Mode: ModeUDP, Src: a4, Dst: b4}, Pseudo{Src: b4, Dst: b4}, false},
		{"wrong destination address", Path{Mode: ModeUDP, Src: a6, Dst: b6}, Pseudo{Src: a6, Dst: a6}, false},
		{"wrong source port", Path{Mode: ModeUDP, SrcPort: 1}, Pseudo{SrcPort: 2}, false},
		{"wrong destination port", Path{Mode: ModeUDP, DstPort: 4791}, Pseudo{DstPort: 4792}, false},
		{"family differs", Path{Mode: ModeUDP}, Pseudo{Src: netip.IPv6Unspecified()}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, c := range goldenCases(false) {
				c.path = tt.send
				frame := buildCase(t, c)
				var pkt, rx Packet
				err := ParseUDP(frame, &tt.recv, &pkt)
				r := NewPseudoRx(netip.AddrPortFrom(tt.recv.Dst, tt.recv.DstPort))
				rerr := r.ParseUDP(frame, netip.AddrPortFrom(tt.recv.Src, tt.recv.SrcPort), &rx)
				assert.Equal(t, err, rerr, c.name)
				assert.Equal(t, pkt, rx, c.name)
				if !tt.ok {
					assert.ErrorIs(t, err, ErrICRC, c.name)
					continue
				}
				require.NoError(t, err, c.name)
				assertRoundTrip(t, c, &pkt)
				assert.Nil(t, pkt.Eth)
				assert.Nil(t, pkt.UDP)
			}
		})
	}
}

// TestUDPModePseudoIsTheKernelHeader: the ModeUDP ICRC equals the ICRC of
// the same packet sent as a full frame with the IP and UDP headers the
// pseudo header stands for (IPv4 ID 0 and DF): the pseudo header is
// exactly "what the kernel would have written", modulo the masked fields.
func TestUDPModePseudoIsTheKernelHeader(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, c := range goldenCases(v6) {
			eth := c
			eth.path.DstPort = UDPPort
			eth.path.DontFragment = !v6
			eth.h.IPID = 0
			full := buildCase(t, eth)
			udp := c
			udp.path.Mode = ModeUDP
			udp.path.DstPort = UDPPort
			tp := buildCase(t, udp)
			assert.Equal(t, full[len(full)-len(tp):], tp, c.name)
		}
	}
}

func TestParseUDPDefects(t *testing.T) {
	ps := Pseudo{}
	var pkt Packet
	assert.ErrorIs(t, ParseUDP(nil, &ps, &pkt), ErrTruncated)
	assert.ErrorIs(t, ParseUDP(make([]byte, 15), &ps, &pkt), ErrTruncated)
	assert.ErrorIs(t, ParseUDP(make([]byte, 70000), &ps, &pkt), ErrBadLength)
	tp := transport(t, OpRCReadRequest, 0)
	require.NoError(t, ParseUDP(tp, &ps, &pkt))
	tp[len(tp)-5] ^= 4
	assert.ErrorIs(t, ParseUDP(tp, &ps, &pkt), ErrICRC)
	r := NewPseudoRx(netip.AddrPort{})
	assert.ErrorIs(t, r.ParseUDP(nil, netip.AddrPort{}, &pkt), ErrTruncated)
	assert.ErrorIs(t, r.ParseUDP(make([]byte, 70000), netip.AddrPort{}, &pkt), ErrBadLength)
	assert.ErrorIs(t, r.ParseUDP(tp, netip.AddrPort{}, &pkt), ErrICRC)
	tp[len(tp)-5] ^= 4
	require.NoError(t, r.ParseUDP(tp, netip.AddrPort{}, &pkt))
}

// TestBuildErrors covers Build's refusals.
func TestBuildErrors(t *testing.T) {
	p := goldenPath(false, 1)
	buf := make([]byte, 200)
	h := Headers{BTH: BTHFields{Opcode: OpRCWriteOnly}}
	_, err := p.Build(buf, 10, 4, &h)
	assert.ErrorIs(t, err, ErrNoRoom, "headroom")
	_, err = p.Build(buf, MaxHeadroom, 200-MaxHeadroom-3, &h) // needs 1 pad + 4 ICRC, has 3
	assert.ErrorIs(t, err, ErrNoRoom, "tailroom")
	_, err = p.Build(buf, MaxHeadroom, 1, &Headers{BTH: BTHFields{Opcode: OpRCAck}})
	assert.ErrorIs(t, err, ErrOpcodeLength)
	_, err = p.Build(buf, MaxHeadroom, 6, &Headers{BTH: BTHFields{Opcode: OpRCSendMiddle}})
	assert.ErrorIs(t, err, ErrOpcodeLength, "MIDDLE packets are not padded")
	_, err = p.Build(buf, MaxHeadroom, 0, &Headers{BTH: BTHFields{Opcode: 0x15}})
	assert.ErrorIs(t, err, ErrUnknownOpcode)
	bad := p
	bad.Dst = netip.MustParseAddr("2001:db8::1")
	assert.ErrorIs(t, bad.Validate(), ErrBadPath)
	_, err = bad.Build(buf, MaxHeadroom, 0, &h)
	assert.ErrorIs(t, err, ErrBadPath)
	bad.Mode = 7
	assert.ErrorIs(t, bad.Validate(), ErrBadPath)
	_, err = bad.Build(buf, MaxHeadroom, 0, &h)
	assert.ErrorIs(t, err, ErrBadPath)
	big := make([]byte, MaxHeadroom+70000)
	_, err = p.Build(big, MaxHeadroom, 66000, &h)
	assert.ErrorIs(t, err, ErrNoRoom, "too long for the IP length")
	assert.NoError(t, p.Validate())
	_, err = p.Build(buf, MaxHeadroom, 4, &h)
	assert.NoError(t, err)
}

// TestBuildDoesNotTouchOutside: Build writes only inside the frame it
// returns and leaves the payload alone.
func TestBuildDoesNotTouchOutside(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, c := range goldenCases(v6) {
			hr := c.path.Headroom(c.h.BTH.Opcode)
			buf := make([]byte, 16+hr+len(c.payload)+MaxTailroom+16)
			for i := range buf {
				buf[i] = 0xa5
			}
			copy(buf[16+hr:], c.payload)
			out, err := c.path.Build(buf[:16+hr+len(c.payload)+MaxTailroom], 16+hr, len(c.payload), &c.h)
			require.NoError(t, err)
			start := 16
			end := start + len(out)
			assert.Equal(t, &buf[start], &out[0], "frame starts right at the headroom's start")
			for i := range buf {
				if i < start || i >= end {
					require.Equal(t, byte(0xa5), buf[i], "%s: byte %d outside the frame written", c.name, i)
				}
			}
			assert.Equal(t, nilIfEmpty(c.payload), nilIfEmpty(buf[16+hr:16+hr+len(c.payload)]))
		}
	}
}

// TestAppendCaptureFrame: UDP-link packets wrapped for a capture parse as
// full frames with a valid ICRC, for both families and the zero pseudo
// header.
func TestAppendCaptureFrame(t *testing.T) {
	for _, ps := range []Pseudo{
		{},
		{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2"), SrcPort: 50000},
		{Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8::2"), SrcPort: 4791, DstPort: 4791},
	} {
		var out []byte
		for _, c := range goldenCases(false) {
			c.path = Path{Mode: ModeUDP, Src: ps.Src, Dst: ps.Dst, SrcPort: ps.SrcPort, DstPort: ps.DstPort}
			tp := buildCase(t, c)
			out = AppendCaptureFrame(out[:0], &ps, macA, macB, tp)
			var pkt Packet
			require.NoError(t, Parse(out, &pkt), "%+v %s", ps, c.name)
			assert.Equal(t, tp, []byte(out[len(out)-len(tp):]))
			assert.Equal(t, c.h.BTH.Opcode, pkt.Opcode())
		}
	}
}
