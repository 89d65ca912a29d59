package roce

// AppendCaptureFrame appends to dst the Ethernet frame that carries tp, a
// UDP-link (ModeUDP) packet from BTH through ICRC, behind IP and UDP
// headers holding the pseudo header's values (see Pseudo) with TTL / hop
// limit 64: what a pcap tap on the UDP link writes, so that captures open
// in any RoCE v2 decoder and their ICRC verifies. The UDP checksum is 0
// over IPv4 and computed over IPv6. It allocates only when dst lacks
// capacity.
func AppendCaptureFrame(dst []byte, ps *Pseudo, srcMAC, dstMAC [6]byte, tp []byte) []byte {
	src, dst6 := ps.Src.Unmap(), ps.Dst.Unmap()
	v6 := src.Is6() || dst6.Is6()
	iphl := IPv4HeaderLen
	et := uint16(EtherTypeIPv4)
	if v6 {
		iphl, et = IPv6HeaderLen, EtherTypeIPv6
	}
	n := EthernetHeaderLen + iphl + UDPHeaderLen + len(tp)
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	f := dst[start:]
	Ethernet(f).Encode(&EthernetFields{Dst: dstMAC, Src: srcMAC, Type: et})
	ip := f[EthernetHeaderLen:]
	ul := uint16(UDPHeaderLen + len(tp))
	if v6 {
		IPv6(ip).Encode(&IPv6Fields{PayloadLength: ul, NextHeader: ProtocolUDP, HopLimit: 64, Src: addr16(src), Dst: addr16(dst6)})
	} else {
		IPv4(ip).Encode(&IPv4Fields{TotalLength: uint16(iphl) + ul, FlagsFragment: IPv4FlagDF, TTL: 64, Protocol: ProtocolUDP, Src: addr4(src), Dst: addr4(dst6)})
	}
	dport := ps.DstPort
	if dport == 0 {
		dport = UDPPort
	}
	u := UDP(ip[iphl:])
	u.Encode(&UDPFields{SrcPort: ps.SrcPort, DstPort: dport, Length: ul})
	copy(u[UDPHeaderLen:], tp)
	if v6 {
		u.SetChecksum(UDPChecksum(ip[ipv6Src:ipv6Src+16], ip[ipv6Dst:ipv6Dst+16], u[:ul]))
	}
	return dst
}
