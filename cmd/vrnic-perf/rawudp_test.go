package main

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The raw UDP baseline of the UDP-link benchmarks: frames of one size
// moved from a socket on one address to a socket on another with the
// best batching the kernel offers, and no RDMA logic at all.
//
//   - rawMmsg: sendmmsg of 64 datagrams per call, recvmmsg of 64.
//   - rawGSO: sendmmsg of 8 messages per call, each a UDP_SEGMENT
//     super-datagram of as many frames as fit 64 KiB (at most 64), and a
//     receiver with UDP_GRO that takes the super-datagrams whole (on
//     loopback the kernel hands a GSO datagram to a GRO socket without
//     segmenting it) and counts len / segment size frames in each.
//
// The sender stays at most rawWindow frames ahead of what the receiver
// counted, as a transport's window keeps it (RC: 512 PSNs), so the
// socket buffers (4 MiB, as vrnicd asks) never overflow; the rate is what
// the receiver counted.

type rawMode int

const (
	rawMmsg rawMode = iota
	rawGSO
)

func (m rawMode) String() string { return [...]string{"mmsg", "gso"}[m] }

const (
	rawWindow = 512
	rawBuffer = 4 << 20
	rawBatch  = 64
	rawGSOMsg = 8
	maxUDP4   = 65507 // the largest UDP payload over IPv4
)

// rawSocket is a blocking UDP socket bound to a (port chosen by the
// kernel) with 4 MiB buffers and a 50 ms receive timeout.
func rawSocket(tb testing.TB, a netip.Addr) (int, netip.AddrPort) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	require.NoError(tb, err)
	tb.Cleanup(func() { unix.Close(fd) })
	require.NoError(tb, unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, rawBuffer))
	require.NoError(tb, unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rawBuffer))
	require.NoError(tb, unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO))
	require.NoError(tb, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50_000}))
	require.NoError(tb, unix.Bind(fd, &unix.SockaddrInet4{Addr: a.As4()}))
	sa, err := unix.Getsockname(fd)
	require.NoError(tb, err)
	return fd, netip.AddrPortFrom(a, uint16(sa.(*unix.SockaddrInet4).Port))
}

// rawUDP moves frames of frameLen bytes from a to b for d and returns the
// frames per second the receiver counted.
func rawUDP(tb testing.TB, a, b netip.Addr, frameLen int, mode rawMode, d time.Duration) float64 {
	sfd, _ := rawSocket(tb, a)
	rfd, to := rawSocket(tb, b)
	segs := 1
	if mode == rawGSO {
		segs = min(64, maxUDP4/frameLen)
		require.NoError(tb, unix.SetsockoptInt(rfd, unix.SOL_UDP, unix.UDP_GRO, 1))
	}
	var received atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // receiver
		defer wg.Done()
		rawReceive(rfd, frameLen*segs, &received, &stop)
	}()

	// Sender: nmsg messages of segs frames each per sendmmsg.
	nmsg := rawBatch
	if mode == rawGSO {
		nmsg = rawGSOMsg
	}
	payload := make([]byte, frameLen*segs)
	for i := range payload {
		payload[i] = byte(i)
	}
	name := rawSockaddr(to)
	var cmsg [unix.SizeofCmsghdr + 8]byte // UDP_SEGMENT, a uint16 padded
	if mode == rawGSO {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&cmsg[0]))
		h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		h.SetLen(unix.CmsgLen(2))
		binary.NativeEndian.PutUint16(cmsg[unix.SizeofCmsghdr:], uint16(frameLen))
	}
	iov := unix.Iovec{Base: &payload[0]}
	iov.SetLen(len(payload))
	msgs := make([]unix.Mmsghdr, nmsg)
	for i := range msgs {
		h := &msgs[i].Hdr
		h.Name, h.Namelen = (*byte)(unsafe.Pointer(&name)), unix.SizeofSockaddrInet4
		h.Iov = &iov
		h.SetIovlen(1)
		if mode == rawGSO {
			h.Control = &cmsg[0]
			h.SetControllen(len(cmsg))
		}
	}
	sent := int64(0)
	start := time.Now()
	end := start.Add(d)
	for time.Now().Before(end) {
		if sent-received.Load() > rawWindow-int64(nmsg*segs) {
			runtime.Gosched()
			continue
		}
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(sfd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(nmsg), 0, 0, 0)
		if e != 0 {
			if e == unix.EINTR || e == unix.EAGAIN || e == unix.ENOBUFS {
				continue
			}
			tb.Fatalf("sendmmsg: %v", e)
		}
		sent += int64(r) * int64(segs)
	}
	got := received.Load()
	elapsed := time.Since(start)
	stop.Store(true)
	wg.Wait()
	runtime.KeepAlive(payload)
	runtime.KeepAlive(&cmsg)
	return float64(got) / elapsed.Seconds()
}

// rawReceive counts the frames arriving on fd (buffers of bufLen bytes;
// with UDP_GRO a datagram of n bytes and segment size s is ceil(n/s)
// frames) until stop.
func rawReceive(fd int, bufLen int, received *atomic.Int64, stop *atomic.Bool) {
	n := rawBatch
	bufs := make([][]byte, n)
	iovs := make([]unix.Iovec, n)
	ctl := make([][unix.SizeofCmsghdr + 8]byte, n)
	msgs := make([]unix.Mmsghdr, n)
	for i := range n {
		bufs[i] = make([]byte, bufLen)
		iovs[i].Base = &bufs[i][0]
		iovs[i].SetLen(bufLen)
	}
	for !stop.Load() {
		for i := range msgs {
			h := &msgs[i].Hdr
			h.Iov = &iovs[i]
			h.SetIovlen(1)
			h.Control = &ctl[i][0]
			h.SetControllen(len(ctl[i]))
			h.Flags = 0
		}
		r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(n), unix.MSG_WAITFORONE, 0, 0)
		if e != 0 {
			continue // timeout (EAGAIN) or EINTR: check stop
		}
		frames := int64(0)
		for i := range int(r) {
			m := &msgs[i]
			seg := int(m.Len)
			if m.Hdr.Controllen >= unix.SizeofCmsghdr {
				h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[i][0]))
				if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO {
					seg = int(int32(binary.NativeEndian.Uint32(ctl[i][unix.SizeofCmsghdr:])))
				}
			}
			frames += int64((int(m.Len) + seg - 1) / seg)
		}
		received.Add(frames)
	}
	runtime.KeepAlive(bufs)
}

// rawSockaddr is the kernel's sockaddr_in of ap.
func rawSockaddr(ap netip.AddrPort) unix.RawSockaddrInet4 {
	sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ap.Addr().As4()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], ap.Port())
	return sa
}
