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

	"github.com/vrnic/vrnic/roce"
)

// The raw UDP baseline of the UDP-link benchmarks: frames of one size
// moved from a socket on one address to a socket on another with the
// best batching the kernel offers, and no RDMA logic at all.
//
//   - rawMmsg: sendmmsg of 64 datagrams per call, recvmmsg of 64.
//   - rawGSO: sendmmsg of up to 8 messages per call (at most half the
//     window, below), each a UDP_SEGMENT super-datagram of as many
//     frames as fit 64 KiB (at most 64), and a receiver with UDP_GRO
//     that takes the super-datagrams whole (on
//     loopback the kernel hands a GSO datagram to a GRO socket without
//     segmenting it) and counts len / segment size frames in each.
//   - rawGSOWork: rawGSO plus the per-frame work no RoCE transport can
//     leave out, done with package roce as vrnicd does it: the sender
//     builds every frame (a WRITE Middle of 4096 bytes, or a WRITE Only
//     of 8) from a 1 MiB region, copying the payload and computing the
//     ICRC in one pass (roce.Framer); the receiver parses every frame,
//     checks its ICRC (roce.ParseUDP) and copies the payload into a
//     1 MiB region. No QP, no WQE, no acknowledgement: what is left of
//     rawGSO once the ICRC and the two copies to and from memory are
//     paid, the ceiling of a software RoCE link over these sockets.
//   - rawGSOCopy: rawGSOWork without the ICRC: the sender copies each
//     payload from the region into its frame, the receiver copies it
//     out, nothing is built, parsed or checked. What the ceiling would be
//     if the ICRC cost nothing.
//
// The sender stays at most rawWindow frames ahead of what the receiver
// counted, as a transport's window keeps it (RC: 512 PSNs), so the
// socket buffers (4 MiB, as vrnicd asks) never overflow; the rate is what
// the receiver counted.

type rawMode int

const (
	rawMmsg rawMode = iota
	rawGSO
	rawGSOWork
	rawGSOCopy
)

func (m rawMode) String() string { return [...]string{"mmsg", "gso", "gso+work", "gso+copy"}[m] }

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
	gso := mode >= rawGSO
	if gso {
		segs = min(64, maxUDP4/frameLen)
		require.NoError(tb, unix.SetsockoptInt(rfd, unix.SOL_UDP, unix.UDP_GRO, 1))
	}
	var work *rawWork
	if mode == rawGSOWork || mode == rawGSOCopy {
		work = newRawWork(tb, sfd, a, to, frameLen)
		work.copyOnly = mode == rawGSOCopy
	}
	var received atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // receiver
		defer wg.Done()
		rawReceive(rfd, frameLen*segs, &received, &stop, work)
	}()

	// Sender: nmsg messages of segs frames each per sendmmsg.
	// (At most half the window per call, so that one call is in flight
	// while the next is prepared.)
	nmsg := rawBatch
	if gso {
		nmsg = max(1, min(rawGSOMsg, rawWindow/(2*segs)))
	}
	payload := make([]byte, frameLen*segs)
	for i := range payload {
		payload[i] = byte(i)
	}
	name := rawSockaddr(to)
	var cmsg [unix.SizeofCmsghdr + 8]byte // UDP_SEGMENT, a uint16 padded
	if gso {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&cmsg[0]))
		h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		h.SetLen(unix.CmsgLen(2))
		binary.NativeEndian.PutUint16(cmsg[unix.SizeofCmsghdr:], uint16(frameLen))
	}
	// Every message sends payload, or with work one buffer of its own
	// that the sender fills before each call.
	iovs := make([]unix.Iovec, nmsg)
	bufs := make([][]byte, nmsg)
	for i := range iovs {
		bufs[i] = payload
		if work != nil {
			bufs[i] = make([]byte, len(payload))
		}
		iovs[i].Base = &bufs[i][0]
		iovs[i].SetLen(len(payload))
	}
	msgs := make([]unix.Mmsghdr, nmsg)
	for i := range msgs {
		h := &msgs[i].Hdr
		h.Name, h.Namelen = (*byte)(unsafe.Pointer(&name)), unix.SizeofSockaddrInet4
		h.Iov = &iovs[i]
		h.SetIovlen(1)
		if gso {
			h.Control = &cmsg[0]
			h.SetControllen(len(cmsg))
		}
	}
	sent := int64(0)
	start := time.Now()
	end := start.Add(d)
	built := false
	for time.Now().Before(end) {
		if work != nil && !built { // the next call's frames, while the last is in flight
			for _, buf := range bufs {
				work.build(tb, buf)
			}
			built = true
		}
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
		built = false
	}
	got := received.Load()
	elapsed := time.Since(start)
	stop.Store(true)
	wg.Wait()
	runtime.KeepAlive(bufs)
	runtime.KeepAlive(&cmsg)
	if work != nil {
		require.Zero(tb, work.bad.Load(), "frames that failed to parse or had a bad ICRC")
	}
	return float64(got) / elapsed.Seconds()
}

// rawReceive counts the frames arriving on fd (buffers of bufLen bytes;
// with UDP_GRO a datagram of n bytes and segment size s is ceil(n/s)
// frames) until stop; with work, it parses, checks and places every
// frame.
func rawReceive(fd int, bufLen int, received *atomic.Int64, stop *atomic.Bool, work *rawWork) {
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
			if work != nil {
				work.place(bufs[i][:m.Len], seg)
			}
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

// rawWork is the per-frame work of rawGSOWork: building frames from a
// source region on the sender's side, parsing, checking and placing them
// into a destination region on the receiver's (of rawGSOCopy: only the
// two copies). Each side's half is used
// by one goroutine.
type rawWork struct {
	path   roce.Path
	hdr    roce.Headers
	f      roce.Framer
	n      int // payload bytes per frame
	src    []byte
	srcOff int
	ps     roce.Pseudo
	pkt    roce.Packet
	dst    []byte
	dstOff int
	bad    atomic.Int64
	// copyOnly: only the copies, no header, no ICRC (rawGSOCopy).
	copyOnly bool
}

// newRawWork prepares the work for frames of frameLen bytes from the
// socket sfd on a to the receiver at to: WRITE Middle frames when a
// 4096-byte payload fits, else WRITE Only frames (BTH, RETH, ICRC).
func newRawWork(tb testing.TB, sfd int, a netip.Addr, to netip.AddrPort, frameLen int) *rawWork {
	sa, err := unix.Getsockname(sfd)
	require.NoError(tb, err)
	from := netip.AddrPortFrom(a, uint16(sa.(*unix.SockaddrInet4).Port))
	w := &rawWork{
		path: roce.Path{Mode: roce.ModeUDP, Src: a, Dst: to.Addr(), SrcPort: from.Port(), DstPort: to.Port()},
		src:  make([]byte, 1<<20),
		dst:  make([]byte, 1<<20),
	}
	w.ps = w.path.Pseudo() // what the receiving socket sees: the same pair
	w.hdr.BTH = roce.BTHFields{Opcode: roce.OpRCWriteMiddle, PKey: 0xffff, DestQP: 0x11}
	if frameLen < roce.BTHLen+4096+roce.ICRCLen {
		w.hdr.BTH.Opcode = roce.OpRCWriteOnly
		w.hdr.RETH = roce.RETHFields{VA: 0x1000, RKey: 0x22}
	}
	w.n = frameLen - w.hdr.BTH.Opcode.HeaderLen() - roce.ICRCLen
	require.Positive(tb, w.n)
	w.hdr.RETH.DMALength = uint32(w.n)
	for i := range w.src {
		w.src[i] = byte(i * 7)
	}
	return w
}

// build fills buf with frames, each from the next bytes of the source
// region.
func (w *rawWork) build(tb testing.TB, buf []byte) {
	hl := w.hdr.BTH.Opcode.HeaderLen()
	l := hl + w.n + roce.ICRCLen
	for at := 0; at+l <= len(buf); at += l {
		if w.srcOff+w.n > len(w.src) {
			w.srcOff = 0
		}
		if w.copyOnly {
			copy(buf[at+hl:at+hl+w.n], w.src[w.srcOff:w.srcOff+w.n])
			w.srcOff += w.n
			continue
		}
		w.hdr.BTH.PSN = (w.hdr.BTH.PSN + 1) & roce.PSNMask
		if err := w.path.Begin(&w.f, buf[at:at+l], hl, w.n, &w.hdr); err != nil {
			tb.Fatalf("building a frame: %v", err)
		}
		w.f.Put(w.src[w.srcOff : w.srcOff+w.n])
		if fr, err := w.f.Finish(); err != nil || len(fr) != l {
			tb.Fatalf("building a frame: %d bytes, %v", len(fr), err)
		}
		w.srcOff += w.n
	}
}

// place parses the frames of a datagram (segment size seg), checks their
// ICRC and copies their payloads into the destination region.
func (w *rawWork) place(d []byte, seg int) {
	hl := w.hdr.BTH.Opcode.HeaderLen()
	for at := 0; at < len(d); at += seg {
		f := d[at:min(at+seg, len(d))]
		payload := f[min(hl, len(f)):max(hl, len(f)-roce.ICRCLen)]
		if !w.copyOnly {
			if err := roce.ParseUDP(f, &w.ps, &w.pkt); err != nil {
				w.bad.Add(1)
				continue
			}
			payload = w.pkt.Payload
		}
		if w.dstOff+len(payload) > len(w.dst) {
			w.dstOff = 0
		}
		w.dstOff += copy(w.dst[w.dstOff:], payload)
	}
}
