package roce

// StoreICRC recomputes the ICRC of ip, an IP packet (IPv4 or IPv6) that
// carries UDP and a RoCE v2 transport packet through its ICRC, and
// stores it in the packet's last four bytes: what a sender does after
// building a packet, offered to code that changes a built packet on
// purpose (the fault injector's corrupt-and-fix). ip ends at the end of
// the IP packet (no Ethernet padding). It reports false when ip is too
// short or not IP.
func StoreICRC(ip []byte) bool {
	if len(ip) < 1 {
		return false
	}
	v6 := ip[0]>>4 == 6
	iphl := IPv6HeaderLen
	if !v6 {
		iphl = int(ip[0]&0xf) * 4
	}
	if ip[0]>>4 != 4 && !v6 || iphl < IPv4HeaderLen || len(ip) < iphl+UDPHeaderLen+BTHLen+ICRCLen {
		return false
	}
	n := len(ip) - ICRCLen
	putICRC(ip[n:], icrcIP(ip[:n], v6, iphl))
	return true
}

// StoreICRCUDP is StoreICRC for a UDP-link packet b (ModeUDP: BTH
// through ICRC) under the pseudo header ps (see Pseudo).
func StoreICRCUDP(b []byte, ps *Pseudo) bool {
	if len(b) < BTHLen+ICRCLen {
		return false
	}
	n := len(b) - ICRCLen
	putICRC(b[n:], icrcPseudo(ps, b[:n]))
	return true
}
