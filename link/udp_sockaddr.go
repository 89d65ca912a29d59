package link

import (
	"encoding/binary"
	"net/netip"

	"github.com/vrnic/vrnic/roce"
	"golang.org/x/sys/unix"
)

// The addresses beside the UDP link's datagrams, as the kernel reads and
// writes them in msghdr.msg_name: a sockaddr_in or sockaddr_in6.
// putSockaddr writes the destination of a datagram to send,
// sockaddrAddrPort reads the sender of one received. Both are pure
// functions of bytes, fuzzed directly, and never allocate.

const (
	// udpMinPayload is the shortest UDP payload sent: a BTH and an ICRC.
	udpMinPayload = roce.BTHLen + roce.ICRCLen

	// sockaddrLen holds a sockaddr_in6 (28 bytes) or a sockaddr_in (16).
	sockaddrLen  = unix.SizeofSockaddrInet6
	sockaddr4Len = unix.SizeofSockaddrInet4
)

// putSockaddr writes ap into name as a sockaddr_in (v6 false) or
// sockaddr_in6 (v6 true) and returns its length. ok is false, and name
// unspecified, when ap is not a destination of such a link: an address
// of the other family (an IPv4-mapped IPv6 address counts as IPv4), one
// with a zone, the unspecified address, multicast, IPv4 0/8, 240/4 or
// broadcast, or port 0.
func putSockaddr(name *[sockaddrLen]byte, ap netip.AddrPort, v6 bool) (namelen uint32, ok bool) {
	a := ap.Addr().Unmap()
	if ap.Port() == 0 || !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
		return 0, false
	}
	if v6 {
		if !a.Is6() {
			return 0, false
		}
		clear(name[:])
		binary.NativeEndian.PutUint16(name[0:], unix.AF_INET6)
		binary.BigEndian.PutUint16(name[2:], ap.Port())
		a16 := a.As16()
		copy(name[8:24], a16[:])
		return sockaddrLen, true
	}
	if !a.Is4() {
		return 0, false
	}
	a4 := a.As4()
	if a4[0] == 0 || a4[0] >= 240 { // 0/8, reserved, broadcast (multicast above)
		return 0, false
	}
	clear(name[:sockaddr4Len])
	binary.NativeEndian.PutUint16(name[0:], unix.AF_INET)
	binary.BigEndian.PutUint16(name[2:], ap.Port())
	copy(name[4:8], a4[:])
	return sockaddr4Len, true
}

// sockaddrAddrPort decodes the sender of a received datagram from the
// sockaddr_in or sockaddr_in6 in name[:namelen]. ok is false for another
// family than the link's (v6) or a short name.
func sockaddrAddrPort(name *[sockaddrLen]byte, namelen uint32, v6 bool) (ap netip.AddrPort, ok bool) {
	fam := binary.NativeEndian.Uint16(name[0:])
	port := binary.BigEndian.Uint16(name[2:])
	if v6 {
		if fam != unix.AF_INET6 || namelen < sockaddrLen {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(name[8:24])), port), true
	}
	if fam != unix.AF_INET || namelen < sockaddr4Len {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(name[4:8])), port), true
}
