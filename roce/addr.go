package roce

import "net/netip"

// addr4 returns the 4 bytes of an IPv4 (or IPv4-mapped) address, zero for
// anything else.
func addr4(a netip.Addr) [4]byte {
	a = a.Unmap()
	if !a.Is4() {
		return [4]byte{}
	}
	return a.As4()
}

// addr16 returns the 16 bytes of an IPv6 address (IPv4 mapped), zero for
// an invalid address.
func addr16(a netip.Addr) [16]byte {
	if !a.IsValid() {
		return [16]byte{}
	}
	return a.As16()
}
