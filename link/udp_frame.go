package link

import (
	"encoding/binary"
	"fmt"

	"github.com/vrnic/vrnic/roce"
	"golang.org/x/sys/unix"
)

// The frame conventions of the UDP link (see the package documentation,
// "UDP link"): conform checks a frame the engine built and finds the UDP
// payload and destination to send; synth4 and synth6 rebuild a frame in
// front of a received payload. Both sides are pure functions of bytes, so
// they are fuzzed directly.

// Fixed values of the headers the UDP link synthesizes on receive.
var (
	// UDPLocalMAC is the Ethernet destination of every frame a UDP link
	// receives (the device itself). Locally administered; the low bytes
	// spell 4791.
	UDPLocalMAC = [6]byte{0x02, 0x00, 0x00, 0x00, 0x12, 0xb7}
	// UDPRemoteMAC is the Ethernet source of every frame a UDP link
	// receives (any peer).
	UDPRemoteMAC = [6]byte{0x02, 0x00, 0x00, 0x00, 0x12, 0xb6}
)

const (
	// UDPTTL is the IPv4 TTL / IPv6 hop limit of received frames.
	UDPTTL = 64

	// UDPHeadroom4 and UDPHeadroom6 are the bytes RecvBatch leaves in
	// front of a received payload for the synthesized Ethernet, IP and
	// UDP headers.
	UDPHeadroom4 = roce.EthernetHeaderLen + roce.IPv4HeaderLen + roce.UDPHeaderLen
	UDPHeadroom6 = roce.EthernetHeaderLen + roce.IPv6HeaderLen + roce.UDPHeaderLen

	// udpMinPayload is the shortest UDP payload sent: a BTH and an ICRC.
	udpMinPayload = roce.BTHLen + roce.ICRCLen

	// sockaddrLen holds a sockaddr_in6 (28 bytes) or a sockaddr_in (16).
	sockaddrLen  = unix.SizeofSockaddrInet6
	sockaddr4Len = unix.SizeofSockaddrInet4
)

// UDPDrop is the reason a UDP link dropped a frame instead of sending it.
type UDPDrop uint8

// Reasons for dropping a frame on send, each with its own counter.
const (
	// UDPDropMalformed: shorter than its headers, unknown EtherType, IP
	// version not matching the EtherType, IP protocol not UDP (IPv6
	// extension headers included), or inconsistent IP and UDP lengths.
	UDPDropMalformed UDPDrop = iota
	// UDPDropVLAN: the frame carries an 802.1Q tag (not used on this link).
	UDPDropVLAN
	// UDPDropFamily: IPv4 frame on an IPv6 link or the reverse.
	UDPDropFamily
	// UDPDropIPv4Header: IPv4 IHL not 5 (options), Identification not 0,
	// DF clear or a fragment: the receiver synthesizes IHL 5, ID 0 and DF,
	// so the ICRC would not verify.
	UDPDropIPv4Header
	// UDPDropSrcAddr: source IP not the link's local address (the kernel
	// sends from the bound address).
	UDPDropSrcAddr
	// UDPDropDstAddr: destination unspecified, multicast or broadcast.
	UDPDropDstAddr
	// UDPDropSrcPort: UDP source port not the link's local port (the
	// kernel sends from the bound port).
	UDPDropSrcPort
	// UDPDropDstPort: UDP destination port neither 4791 nor the
	// configured peer port.
	UDPDropDstPort
	// UDPDropShort: UDP payload shorter than a BTH and an ICRC.
	UDPDropShort

	numUDPDrops
)

var udpDropNames = [numUDPDrops]string{
	"malformed", "vlan", "family", "ipv4-header", "src-addr", "dst-addr", "src-port", "dst-port", "short",
}

func (d UDPDrop) String() string {
	if d < numUDPDrops {
		return udpDropNames[d]
	}
	return fmt.Sprintf("UDPDrop(%d)", uint8(d))
}

// udpLocal is what conform compares a frame against: the link's bound
// address and port, its family and the extra accepted destination port.
type udpLocal struct {
	v6       bool
	addr     [16]byte // IPv4 in the first 4 bytes
	port     uint16
	peerPort uint16 // 0: only 4791
}

// conform checks that frame, a whole Ethernet frame built by the engine,
// follows the UDP-link conventions, writes the destination into name (a
// sockaddr_in or sockaddr_in6) and returns the UDP payload (BTH..ICRC, a
// view into frame) and the sockaddr length. ok is false when the frame
// must be dropped, for reason. frame is only read.
func (l *udpLocal) conform(frame []byte, name *[sockaddrLen]byte) (payload []byte, namelen uint32, reason UDPDrop, ok bool) {
	if len(frame) < UDPHeadroom4 {
		return nil, 0, UDPDropMalformed, false
	}
	et := binary.BigEndian.Uint16(frame[12:])
	var (
		ip   []byte
		iphl int
		ul   int // UDP length as the IP header says
	)
	switch et {
	case roce.EtherTypeIPv4:
		if l.v6 {
			return nil, 0, UDPDropFamily, false
		}
		h := roce.IPv4(frame[roce.EthernetHeaderLen:])
		if h.Version() != 4 {
			return nil, 0, UDPDropMalformed, false
		}
		if h.HeaderLen() != roce.IPv4HeaderLen || h.ID() != 0 || h.FlagsFragment() != roce.IPv4FlagDF {
			return nil, 0, UDPDropIPv4Header, false
		}
		tl := int(h.TotalLength())
		if tl < roce.IPv4HeaderLen+roce.UDPHeaderLen || tl > len(h) || h.Protocol() != roce.ProtocolUDP {
			return nil, 0, UDPDropMalformed, false
		}
		ip, iphl, ul = h[:tl], roce.IPv4HeaderLen, tl-roce.IPv4HeaderLen
		src, dst := h[12:16], h[16:20]
		if [4]byte(src) != [4]byte(l.addr[:4]) {
			return nil, 0, UDPDropSrcAddr, false
		}
		if dst[0] == 0 || dst[0] >= 224 { // 0/8, multicast, reserved, broadcast
			return nil, 0, UDPDropDstAddr, false
		}
		sa := name[:sockaddr4Len]
		clear(sa)
		binary.NativeEndian.PutUint16(sa[0:], unix.AF_INET)
		copy(sa[4:8], dst)
		namelen = sockaddr4Len
	case roce.EtherTypeIPv6:
		if !l.v6 {
			return nil, 0, UDPDropFamily, false
		}
		h := roce.IPv6(frame[roce.EthernetHeaderLen:])
		if !h.IsValid() || h.Version() != 6 || h.NextHeader() != roce.ProtocolUDP {
			return nil, 0, UDPDropMalformed, false
		}
		pl := int(h.PayloadLength())
		if pl < roce.UDPHeaderLen || roce.IPv6HeaderLen+pl > len(h) {
			return nil, 0, UDPDropMalformed, false
		}
		ip, iphl, ul = h[:roce.IPv6HeaderLen+pl], roce.IPv6HeaderLen, pl
		src, dst := h[8:24], h[24:40]
		if [16]byte(src) != l.addr {
			return nil, 0, UDPDropSrcAddr, false
		}
		if dst[0] == 0xff || [16]byte(dst) == ([16]byte{}) {
			return nil, 0, UDPDropDstAddr, false
		}
		sa := name[:]
		clear(sa)
		binary.NativeEndian.PutUint16(sa[0:], unix.AF_INET6)
		copy(sa[8:24], dst)
		namelen = sockaddrLen
	case roce.EtherTypeVLAN:
		return nil, 0, UDPDropVLAN, false
	default:
		return nil, 0, UDPDropMalformed, false
	}
	u := roce.UDP(ip[iphl:])
	if int(u.Length()) != ul {
		return nil, 0, UDPDropMalformed, false
	}
	if u.SrcPort() != l.port {
		return nil, 0, UDPDropSrcPort, false
	}
	dport := u.DstPort()
	if dport != roce.UDPPort && (l.peerPort == 0 || dport != l.peerPort) {
		return nil, 0, UDPDropDstPort, false
	}
	payload = ip[iphl+roce.UDPHeaderLen:]
	if len(payload) < udpMinPayload {
		return nil, 0, UDPDropShort, false
	}
	binary.BigEndian.PutUint16(name[2:], dport)
	return payload, namelen, 0, true
}

// synthEthernet writes the fixed Ethernet header of a received frame.
func synthEthernet(f []byte, et uint16) {
	roce.Ethernet(f).Encode(&roce.EthernetFields{Dst: UDPLocalMAC, Src: UDPRemoteMAC, Type: et})
}

// synth4 writes Ethernet, IPv4 and UDP headers into f[:UDPHeadroom4] in
// front of the n-byte payload at f[UDPHeadroom4:] received from src:sport
// on the link bound to dst:dport (IPv4 addresses in the first 4 bytes).
func synth4(f []byte, n int, src *[16]byte, sport uint16, dst *[16]byte, dport uint16) {
	synthEthernet(f, roce.EtherTypeIPv4)
	ul := uint16(roce.UDPHeaderLen + n)
	roce.IPv4(f[roce.EthernetHeaderLen:]).Encode(&roce.IPv4Fields{
		TotalLength: roce.IPv4HeaderLen + ul, FlagsFragment: roce.IPv4FlagDF, TTL: UDPTTL,
		Protocol: roce.ProtocolUDP, Src: [4]byte(src[:4]), Dst: [4]byte(dst[:4]),
	})
	roce.UDP(f[roce.EthernetHeaderLen+roce.IPv4HeaderLen:]).Encode(&roce.UDPFields{SrcPort: sport, DstPort: dport, Length: ul})
}

// synth6 is synth4 for IPv6 (f[:UDPHeadroom6]); the UDP checksum is
// computed, as IPv6 requires.
func synth6(f []byte, n int, src *[16]byte, sport uint16, dst *[16]byte, dport uint16) {
	synthEthernet(f, roce.EtherTypeIPv6)
	ul := uint16(roce.UDPHeaderLen + n)
	roce.IPv6(f[roce.EthernetHeaderLen:]).Encode(&roce.IPv6Fields{
		PayloadLength: ul, NextHeader: roce.ProtocolUDP, HopLimit: UDPTTL, Src: *src, Dst: *dst,
	})
	dgram := f[roce.EthernetHeaderLen+roce.IPv6HeaderLen : UDPHeadroom6+n]
	u := roce.UDP(dgram)
	u.Encode(&roce.UDPFields{SrcPort: sport, DstPort: dport, Length: ul})
	u.SetChecksum(roce.UDPChecksum(src[:], dst[:], dgram))
}

// sockaddrPeer decodes the sender of a received datagram from a
// sockaddr_in or sockaddr_in6: its address (IPv4 in the first 4 bytes)
// and port. ok is false for another family than the link's.
func sockaddrPeer(name *[sockaddrLen]byte, namelen uint32, v6 bool, addr *[16]byte) (port uint16, ok bool) {
	fam := binary.NativeEndian.Uint16(name[0:])
	port = binary.BigEndian.Uint16(name[2:])
	if v6 {
		if fam != unix.AF_INET6 || namelen < sockaddrLen {
			return 0, false
		}
		copy(addr[:], name[8:24])
		return port, true
	}
	if fam != unix.AF_INET || namelen < sockaddr4Len {
		return 0, false
	}
	copy(addr[:4], name[4:8])
	return port, true
}
