package ebpf

import (
	"encoding/binary"
	"net/netip"
)

// Wire constants the programs parse (see bpf/vrnic_bpf.h).
const (
	ethHLen     = 14
	vlanHLen    = 4
	etherTypeV4 = 0x0800
	etherTypeV6 = 0x86DD
	etherType1Q = 0x8100
	udpHLen     = 8
	bthLen      = 12
	roceV2Port  = 4791
)

// roceFrame describes a RoCE v2 frame for buildRoCEFrame.
type roceFrame struct {
	src, dst  netip.Addr // both IPv4 or both IPv6
	vlan      bool       // one 802.1Q tag (VID 7)
	ipOptions int        // IPv4 options length, multiple of 4, at most 40
	dport     uint16     // UDP destination port; 0 means 4791
	qpn       uint32     // BTH destination QP
	payload   int        // bytes after the BTH
}

// buildRoCEFrame returns an Ethernet frame carrying a RoCE v2 packet with
// the BTH opcode SEND_ONLY (RC). Checksums and ICRC are left zero: the
// programs do not check them.
func buildRoCEFrame(f roceFrame) []byte {
	dport := f.dport
	if dport == 0 {
		dport = roceV2Port
	}
	b := make([]byte, 0, 128+f.payload)
	b = append(b, 0x02, 0, 0, 0, 0, 0x02) // destination MAC
	b = append(b, 0x02, 0, 0, 0, 0, 0x01) // source MAC
	if f.vlan {
		b = binary.BigEndian.AppendUint16(b, etherType1Q)
		b = binary.BigEndian.AppendUint16(b, 7)
	}
	udpLen := udpHLen + bthLen + f.payload
	if f.dst.Is4() {
		b = binary.BigEndian.AppendUint16(b, etherTypeV4)
		ihl := 20 + f.ipOptions
		b = append(b, byte(0x40|ihl/4), 0)
		b = binary.BigEndian.AppendUint16(b, uint16(ihl+udpLen))
		b = append(b, 0, 0, 0x40, 0, 64, 17, 0, 0) // id, DF, TTL, UDP, csum
		s, d := f.src.As4(), f.dst.As4()
		b = append(b, s[:]...)
		b = append(b, d[:]...)
		for range f.ipOptions {
			b = append(b, 1) // NOP options
		}
	} else {
		b = binary.BigEndian.AppendUint16(b, etherTypeV6)
		b = append(b, 0x60, 0, 0, 0)
		b = binary.BigEndian.AppendUint16(b, uint16(udpLen))
		b = append(b, 17, 64)
		s, d := f.src.As16(), f.dst.As16()
		b = append(b, s[:]...)
		b = append(b, d[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, 0xc000|uint16(f.qpn&0x3fff)) // source port
	b = binary.BigEndian.AppendUint16(b, dport)
	b = binary.BigEndian.AppendUint16(b, uint16(udpLen))
	b = append(b, 0, 0)
	// BTH: opcode, SE/M/pad/tver, P_Key, reserved, dest QP, A/reserved, PSN.
	b = append(b, 0x04, 0x40, 0xff, 0xff, 0)
	b = append(b, byte(f.qpn>>16), byte(f.qpn>>8), byte(f.qpn))
	b = append(b, 0x80, 0, 0, 1)
	for i := range f.payload {
		b = append(b, byte(i))
	}
	return b
}
