package roce

// MTU is the IB path MTU enumeration (IBTA 7.7.2, ibv_mtu): 1 = 256 bytes
// up to 5 = 4096 bytes of payload per packet.
type MTU uint8

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Valid reports whether m is one of MTU256..MTU4096.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

// Bytes returns the payload bytes per packet, 0 for an invalid value.
func (m MTU) Bytes() int {
	if !m.Valid() {
		return 0
	}
	return 128 << m
}

// MTUFromBytes returns the enum value of n (256, 512, 1024, 2048, 4096).
func MTUFromBytes(n int) (MTU, bool) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, true
		}
	}
	return 0, false
}

// MTUForLinkMTU returns the largest path MTU whose packets fit a link
// (IP) MTU of linkMTU bytes with IPv4 or IPv6 headers, or 0 and false if
// not even 256 fits.
func MTUForLinkMTU(linkMTU int, ipv6 bool) (MTU, bool) {
	ip := IPv4HeaderLen
	if ipv6 {
		ip = IPv6HeaderLen
	}
	// Largest transport headers with payload: BTH+RETH+ImmDt; plus ICRC.
	over := ip + UDPHeaderLen + BTHLen + RETHLen + ImmDtLen + ICRCLen
	for m := MTU4096; m >= MTU256; m-- {
		if m.Bytes()+over <= linkMTU {
			return m, true
		}
	}
	return 0, false
}
