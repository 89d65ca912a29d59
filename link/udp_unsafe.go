package link

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The only unsafe code of the UDP link: the two batched socket calls. The
// mmsghdr, iovec and sockaddr arrays they point to are preallocated per
// port (udpBatch) and hold ordinary Go pointers, so the buffers they name
// stay alive and in place during the call.

// sendmmsg sends msgs on fd (sendmmsg(2)): the number of datagrams sent,
// or -1 and the error of the first one.
func sendmmsg(fd uintptr, msgs []unix.Mmsghdr, flags int) (int, unix.Errno) {
	r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), uintptr(flags), 0, 0)
	return int(r), e
}

// recvmmsg receives up to len(msgs) datagrams from fd (recvmmsg(2), no
// timeout): the number received, or -1 and the error.
func recvmmsg(fd uintptr, msgs []unix.Mmsghdr, flags int) (int, unix.Errno) {
	r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), uintptr(flags), 0, 0)
	return int(r), e
}

// The control messages of UDP segmentation and receive offload: a
// cmsghdr and its data, UDP_SEGMENT's a uint16 segment size (send),
// UDP_GRO's an int (receive).
const (
	gsoCmsgLen = unix.SizeofCmsghdr + 8 // CMSG_SPACE(sizeof(uint16))
	groCmsgLen = unix.SizeofCmsghdr + 8 // CMSG_SPACE(sizeof(int))
)

// putGSOCmsg writes a UDP_SEGMENT control message of segment size size.
func putGSOCmsg(b *[gsoCmsgLen]byte, size uint16) {
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&b[unix.SizeofCmsghdr])) = size
}

// groSegSize returns the segment size of a UDP_GRO control message in
// b[:n], or 0 when b holds none.
func groSegSize(b *[groCmsgLen]byte, n int) int {
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	if n < unix.CmsgLen(4) || h.Level != unix.SOL_UDP || h.Type != unix.UDP_GRO || int(h.Len) < unix.CmsgLen(4) {
		return 0
	}
	return int(*(*int32)(unsafe.Pointer(&b[unix.SizeofCmsghdr])))
}

// tosCmsgLen is room for the IP_TOS (one byte) or IPV6_TCLASS (an int)
// control message a socket with IP_RECVTOS or IPV6_RECVTCLASS receives:
// CMSG_SPACE(sizeof(int)).
const tosCmsgLen = unix.SizeofCmsghdr + 8

// cmsgECN returns the ECN field of the IP_TOS or IPV6_TCLASS control
// message among the control messages in b (as recvmsg filled it; in
// order, so after a UDP_GRO one), and whether there is one.
func cmsgECN(b []byte) (byte, bool) {
	for len(b) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(b) {
			return 0, false
		}
		if l > unix.SizeofCmsghdr &&
			(h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TOS || h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_TCLASS) {
			// IP_TOS carries a byte; IPV6_TCLASS an int in host
			// order, whose low byte is first on a little-endian host.
			d := b[unix.SizeofCmsghdr:l]
			if h.Type == unix.IPV6_TCLASS && len(d) >= 4 {
				return byte(*(*int32)(unsafe.Pointer(&d[0]))) & 3, true
			}
			return d[0] & 3, true
		}
		sp := unix.CmsgSpace(l - unix.SizeofCmsghdr)
		if sp > len(b) {
			return 0, false
		}
		b = b[sp:]
	}
	return 0, false
}
