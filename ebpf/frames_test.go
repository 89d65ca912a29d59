package ebpf

import (
	"encoding/binary"
	"net/netip"
)

// arpFrame returns an Ethernet/IPv4 ARP frame (op 1 request, 2 reply) from
// src4 asking for or answering about target.
func arpFrame(op uint16, target netip.Addr, vlan bool) []byte {
	b := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 0x01}
	if vlan {
		b = append(b, 0x81, 0x00, 0, 7)
	}
	b = append(b, 0x08, 0x06)
	b = append(b, 0, 1, 0x08, 0x00, 6, 4)
	b = binary.BigEndian.AppendUint16(b, op)
	b = append(b, 0x02, 0, 0, 0, 0, 0x01)
	s := src4.As4()
	b = append(b, s[:]...)
	b = append(b, 0, 0, 0, 0, 0, 0)
	t := target.As4()
	return append(b, t[:]...)
}

// ndFrame returns an ICMPv6 neighbour solicitation (135) or advertisement
// (136) for target, without options unless withOption.
func ndFrame(typ uint8, src, dst, target netip.Addr, hopLimit uint8, withOption bool) []byte {
	d := dst.As16()
	b := []byte{0x33, 0x33, d[12], d[13], d[14], d[15], 0x02, 0, 0, 0, 0, 0x01, 0x86, 0xdd}
	plen := 24
	if withOption {
		plen += 8
	}
	b = append(b, 0x60, 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(plen))
	b = append(b, 58, hopLimit)
	s := src.As16()
	b = append(b, s[:]...)
	b = append(b, d[:]...)
	b = append(b, typ, 0, 0, 0, 0, 0, 0, 0)
	tg := target.As16()
	b = append(b, tg[:]...)
	if withOption {
		b = append(b, 1, 1, 0x02, 0, 0, 0, 0, 0x01)
	}
	return b
}

// solicitedNode returns the solicited-node multicast address of a.
func solicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 11: 0x01, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
}
