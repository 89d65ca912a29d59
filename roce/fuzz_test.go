package roce

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// confine copies data to the end of a larger buffer and returns it as a
// slice whose capacity equals its length: any read past the end by
// reslicing panics instead of silently reading the neighbour's bytes.
func confine(data []byte) []byte {
	buf := make([]byte, 64+len(data))
	for i := range buf[:64] {
		buf[i] = 0xee
	}
	copy(buf[64:], data)
	return buf[64:len(buf):len(buf)]
}

// checkPacket asserts the invariants of a successfully parsed packet.
func checkPacket(t *testing.T, pkt *Packet, tlen int) {
	info := pkt.Info
	require.NotNil(t, info)
	require.True(t, info.Valid())
	assert.Equal(t, pkt.BTH.Opcode().Info(), info)
	assert.Len(t, pkt.BTH, BTHLen)
	views := []struct {
		h Header
		n int
	}{
		{HdrDETH, len(pkt.DETH)}, {HdrXRCETH, len(pkt.XRCETH)}, {HdrRETH, len(pkt.RETH)}, {HdrAtomicETH, len(pkt.AtomicETH)},
		{HdrAETH, len(pkt.AETH)}, {HdrAtomicAckETH, len(pkt.AtomicAckETH)}, {HdrImmDt, len(pkt.ImmDt)}, {HdrIETH, len(pkt.IETH)},
	}
	for _, v := range views {
		if info.Has(v.h) {
			assert.Equal(t, v.h.Len(), v.n, "%v", v.h)
		} else {
			assert.Zero(t, v.n, "%v", v.h)
		}
	}
	// BTH, headers, payload, pad and ICRC account for every byte.
	assert.Equal(t, tlen, info.HeaderLen+len(pkt.Payload)+pkt.BTH.PadCount()+ICRCLen)
	if info.Flags&OpPayload == 0 {
		assert.Empty(t, pkt.Payload)
	}
}

func addSeeds(f *testing.F) {
	for _, v6 := range []bool{false, true} {
		for _, c := range goldenCases(v6) {
			f.Add(buildCase(f, c))
		}
	}
	for _, fr := range append(pickFrames(f), loadConnectXFrames(f)...) {
		f.Add(fr.frame)
	}
	f.Add([]byte{})
	f.Add(make([]byte, 14))
}

// FuzzParse: Parse never panics or reads outside the frame, and what it
// accepts is self-consistent and re-builds to the same fields.
func FuzzParse(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		in := confine(data)
		var pkt Packet
		if err := Parse(in, &pkt); err != nil {
			require.Error(t, err)
			return
		}
		udpPayload := int(pkt.UDP.Length()) - UDPHeaderLen
		checkPacket(t, &pkt, udpPayload)
		assert.Equal(t, data, in, "Parse does not write")

		// Rebuild and parse again: same fields.
		p, h := pkt.Path(), pkt.Headers()
		buf := make([]byte, MaxHeadroom+len(pkt.Payload)+MaxTailroom)
		copy(buf[MaxHeadroom:], pkt.Payload)
		out, err := p.Build(buf, MaxHeadroom, len(pkt.Payload), &h)
		require.NoError(t, err)
		var again Packet
		require.NoError(t, Parse(out, &again))
		assert.Equal(t, h, again.Headers())
		assert.Equal(t, pkt.Payload, again.Payload)
	})
}

// FuzzParseUDP: ParseUDP never panics; with the ICRC fixed up, accepted
// packets are self-consistent and round-trip through Build.
func FuzzParseUDP(f *testing.F) {
	for _, c := range goldenCases(false) {
		c.path.Mode = ModeUDP
		f.Add(buildCase(f, c))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		ps := Pseudo{}
		var pkt, rx Packet
		err := ParseUDP(confine(data), &ps, &pkt)
		r := NewPseudoRx(netip.AddrPort{})
		require.Equal(t, err, r.ParseUDP(confine(data), netip.AddrPort{}, &rx))
		if err == nil {
			require.Equal(t, pkt, rx)
		}
		if len(data) < BTHLen+ICRCLen {
			return
		}
		fixed := bytes.Clone(data)
		putICRC(fixed[len(fixed)-ICRCLen:], icrcPseudo(&ps, fixed[:len(fixed)-ICRCLen]))
		in := confine(fixed)
		if err := ParseUDP(in, &ps, &pkt); err != nil {
			require.NotErrorIs(t, err, ErrICRC)
			return
		}
		checkPacket(t, &pkt, len(in))
		p, h := Path{Mode: ModeUDP}, pkt.Headers()
		buf := make([]byte, MaxHeadroom+len(pkt.Payload)+MaxTailroom)
		copy(buf[MaxHeadroom:], pkt.Payload)
		out, err := p.Build(buf, MaxHeadroom, len(pkt.Payload), &h)
		require.NoError(t, err)
		var again Packet
		require.NoError(t, ParseUDP(out, &ps, &again))
		assert.Equal(t, h, again.Headers())
		assert.Equal(t, pkt.Payload, again.Payload)
	})
}

// FuzzBuildParse builds a packet from arbitrary fields and expects Parse
// to return every one of them.
func FuzzBuildParse(f *testing.F) {
	f.Add(uint8(OpRCWriteOnly), uint8(0), uint32(0x11), uint32(0xffffff), uint64(0x1000), uint32(7), uint64(5), uint16(100), uint8(0))
	f.Add(uint8(OpUDSendOnlyImm), uint8(0xff), uint32(0xffffff), uint32(0), uint64(1<<63), uint32(0xffffffff), uint64(0), uint16(4096), uint8(3))
	f.Add(uint8(OpRCAtomicAck), uint8(0x55), uint32(1), uint32(2), uint64(3), uint32(4), uint64(6), uint16(0), uint8(1))
	f.Add(uint8(OpCNP), uint8(0xaa), uint32(1), uint32(2), uint64(3), uint32(4), uint64(6), uint16(0), uint8(2))
	f.Add(uint8(0x15), uint8(0), uint32(1), uint32(2), uint64(3), uint32(4), uint64(6), uint16(0), uint8(2))
	f.Fuzz(func(t *testing.T, opb, flags uint8, qpn, psn uint32, va uint64, key uint32, data uint64, n uint16, variant uint8) {
		op := Opcode(opb)
		info := op.Info()
		qpn &= QPNMask // 24-bit fields: only representable values round-trip
		psn &= PSNMask
		mode, v6, vlan := ModeEthernet, variant&1 != 0, variant&2 != 0
		if variant&4 != 0 {
			mode = ModeUDP
		}
		p := Path{
			Mode: mode, SrcMAC: [6]byte{2, 0, 0, 0, 0, flags}, DstMAC: [6]byte{2, 0, 0, 0, 1, 0}, VLAN: vlan, VLANTCI: uint16(key),
			Src: netip.AddrFrom4([4]byte{10, 0, 0, 1}), Dst: netip.AddrFrom4([4]byte{10, 0, 0, byte(qpn)}),
			SrcPort: UDPSrcPort(qpn), TOS: flags, TTL: byte(psn), DontFragment: flags&1 != 0, UDPChecksum: flags&2 != 0,
		}
		if v6 {
			p.Src = netip.AddrFrom16([16]byte{0xfd, 15: 1})
			p.Dst = netip.AddrFrom16([16]byte{0xfd, 14: byte(qpn >> 8), 15: byte(qpn)})
			p.FlowLabel = key & 0xfffff
			p.DontFragment = false
		}
		if !vlan {
			p.VLANTCI = 0
		}
		h := Headers{
			BTH: BTHFields{Opcode: op, SE: flags&4 != 0, MigReq: flags&8 != 0, PKey: uint16(key >> 16),
				FECN: flags&16 != 0, BECN: flags&32 != 0, DestQP: qpn, AckReq: flags&64 != 0, PSN: psn},
			DETH:         DETHFields{QKey: key, SrcQP: qpn >> 8},
			RETH:         RETHFields{VA: va, RKey: key, DMALength: uint32(data)},
			AtomicETH:    AtomicETHFields{VA: va, RKey: key, SwapAdd: data, Compare: ^data},
			AETH:         AETHFields{Syndrome: Syndrome(flags), MSN: psn >> 4},
			AtomicAckETH: AtomicAckETHFields{OrigRemoteData: data},
			Imm:          uint32(data >> 32),
			InvRKey:      key + 1,
		}
		if mode == ModeEthernet && !v6 {
			h.IPID = uint16(data)
		}
		size := int(n) % 4097
		if info.Valid() && info.Flags&OpPayload == 0 {
			size = 0
		}
		payload := make([]byte, size)
		for i := range payload {
			payload[i] = byte(i) ^ flags
		}
		c := goldenCase{name: op.String(), path: p, h: h, payload: payload}
		hr := p.Headroom(op)
		buf := make([]byte, hr+size+MaxTailroom)
		copy(buf[hr:], payload)
		out, err := p.Build(buf, hr, size, &h)
		if !info.Valid() {
			require.ErrorIs(t, err, ErrUnknownOpcode)
			return
		}
		if info.Flags&(OpFirst|OpMiddle) != 0 && size%4 != 0 {
			require.ErrorIs(t, err, ErrOpcodeLength, "only LAST and ONLY packets are padded")
			return
		}
		require.NoError(t, err)
		var pkt Packet
		if mode == ModeUDP {
			ps := p.Pseudo()
			require.NoError(t, ParseUDP(confine(out), &ps, &pkt))
		} else {
			require.NoError(t, Parse(confine(out), &pkt))
		}
		h.BTH.Opcode = op
		c.h = h
		assertRoundTrip(t, c, &pkt)
	})
}
