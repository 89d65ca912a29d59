package link

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// ECN on the UDP link (UDPConfig.ECN): the kernel writes the IP header of
// every datagram, so the link asks it to. Every socket sets the ECN field
// of what it sends to ECT(0) (IP_TOS, IPV6_TCLASS: an ECN-capable
// transport, so a congested queue on the way marks Congestion Experienced
// instead of dropping) and asks for the field of what it receives
// (IP_RECVTOS, IPV6_RECVTCLASS: one control message per datagram, read
// with the datagram in the same recvmmsg). A datagram that arrives marked
// CE has its frames' BTH FECN bit set before the engine sees them: the
// engine's one sign of congestion on both links (on the TAP link it reads
// the IP header itself). The ICRC does not cover the FECN bit (IBTA
// annex A17.4: the BTH byte holding FECN and BECN counts as all ones),
// nor the IP ECN field.
//
// UDP_GRO: the kernel coalesces only datagrams whose IP headers agree in
// everything but length and checksum (inet_gro_receive flushes on a TOS
// difference), so the frames of one coalesced datagram share its one
// control message's ECN field.

const (
	ecnECT0 = 0x2
	ecnCE   = 0x3
	bthFECN = 0x80 // BTH byte 4
)

// setECN makes fd send ECT(0) and receive the ECN field of each datagram.
func setECN(fd int, v6 bool) error {
	opts := []struct {
		level, name int
		val         int
		what        string
	}{
		{unix.IPPROTO_IP, unix.IP_TOS, ecnECT0, "IP_TOS"},
		{unix.IPPROTO_IP, unix.IP_RECVTOS, 1, "IP_RECVTOS"},
	}
	if v6 {
		opts[0] = struct {
			level, name int
			val         int
			what        string
		}{unix.IPPROTO_IPV6, unix.IPV6_TCLASS, ecnECT0, "IPV6_TCLASS"}
		opts[1].level, opts[1].name, opts[1].what = unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, "IPV6_RECVTCLASS"
	}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.name, o.val); err != nil {
			return fmt.Errorf("%s: %w", o.what, err)
		}
	}
	return nil
}

// markCE sets the FECN bit of frame (at least a BTH long) when ctl, the
// control messages of its datagram, say it arrived marked CE; it reports
// whether it did.
func markCE(frame, ctl []byte) bool {
	if e, ok := cmsgECN(ctl); !ok || e != ecnCE {
		return false
	}
	frame[4] |= bthFECN
	return true
}
