package link

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/fdwait"
	"github.com/vrnic/vrnic/roce"
	"golang.org/x/sys/unix"
)

// Errors of the UDP link.
var (
	// ErrUDPAddrInUse: the local address and port are taken (by another
	// daemon, or any socket not in this link's reuseport group).
	ErrUDPAddrInUse = errors.New("link: UDP address already in use")
	// ErrUDPSteering: the reuseport steering program could not be
	// attached; without it datagrams would reach the wrong workers.
	ErrUDPSteering = errors.New("link: cannot attach the reuseport steering program")
	// ErrUDPClosed: the link was closed.
	ErrUDPClosed = errors.New("link: UDP link closed")
)

// UDPConfig configures a UDP link.
type UDPConfig struct {
	// Local is the address and port every socket binds to: an IPv4 or
	// IPv6 address of this machine, not unspecified (the engine takes it
	// as the destination of every datagram received, and the source of
	// every one sent) and without zone. Port 0 means 4791.
	Local netip.AddrPort
	// Workers is the number of sockets, one per engine worker. Default 1.
	Workers int
	// FrameCap is the capacity of every buffer (must equal the
	// engine's); at least a BTH and an ICRC. Received datagrams longer
	// than FrameCap are dropped (RxTruncated).
	FrameCap int
	// SendBuffer and RecvBuffer set SO_SNDBUF and SO_RCVBUF (bytes);
	// 0 keeps the kernel default. With CAP_NET_ADMIN they are set with
	// SO_SNDBUFFORCE / SO_RCVBUFFORCE; without it the kernel caps them at
	// net.core.wmem_max and net.core.rmem_max, and the link logs a
	// warning saying so.
	SendBuffer, RecvBuffer int
	// Batch is the largest number of frames per sendmmsg or recvmmsg
	// call. Default 64.
	Batch int
	// NoOffload turns off UDP segmentation and receive offload
	// (UDP_SEGMENT, UDP_GRO; see udp_offload.go): one datagram per frame
	// both ways, as on a kernel without them.
	NoOffload bool
	// SegmentIPv4 says whether an IPv4 link sends with UDP_SEGMENT too
	// (IPv6 has no identification: an IPv6 link always does). The
	// kernel gives segment k of a message the IPv4 identification k,
	// which the ICRC covers, so a segment after the first that is cut
	// where a RoCE checker can read it (Soft-RoCE, a hardware RNIC,
	// tshark on a real interface) fails its ICRC; vrnic peers accept it
	// (they check the ICRC over identification 0). The default,
	// SegmentLoopback, segments when Local is a loopback address: every
	// datagram then crosses lo, which carries a message whole, and the
	// only place it is ever cut is inside the receiving socket, where no
	// identification is seen (kernel-notes/udp-offload.md).
	SegmentIPv4 SegmentPolicy
	// ECN marks every datagram sent ECN-capable (ECT(0)) and reads the
	// ECN field of every one received: a datagram marked Congestion
	// Experienced reaches the engine with its BTH FECN bit set
	// (udp_ecn.go). For congestion control; off, the IP header's ECN
	// field is the kernel's default (0) and not read.
	ECN bool
	// Logger gets lifecycle messages. Default slog.Default().
	Logger *slog.Logger
}

// SegmentPolicy is when an IPv4 UDP link sends a message's frames as one
// UDP_SEGMENT datagram (UDPConfig.SegmentIPv4).
type SegmentPolicy uint8

const (
	// SegmentLoopback segments when the link's address is a loopback
	// address (127.0.0.0/8): the default.
	SegmentLoopback SegmentPolicy = iota
	// SegmentAlways segments on any address: for links whose peers are
	// all vrnic daemons.
	SegmentAlways
	// SegmentNever sends one datagram per frame.
	SegmentNever
)

// String returns the policy's name as the -udp-segment-ipv4 flag spells
// it: auto, true or false.
func (s SegmentPolicy) String() string {
	switch s {
	case SegmentLoopback:
		return "auto"
	case SegmentAlways:
		return "true"
	case SegmentNever:
		return "false"
	}
	return fmt.Sprintf("SegmentPolicy(%d)", uint8(s))
}

// segments reports whether a link on local segments under s.
func (s SegmentPolicy) segments(local netip.Addr) bool {
	switch s {
	case SegmentAlways:
		return true
	case SegmentLoopback:
		return local.Unmap().IsLoopback()
	}
	return false
}

// UDPCounters count what a UDP port did. All are atomic: read them from
// any goroutine.
type UDPCounters struct {
	TxFrames     atomic.Uint64 // datagrams sent
	TxBytes      atomic.Uint64 // UDP payload bytes sent
	RxFrames     atomic.Uint64 // frames returned by RecvBatch
	RxBytes      atomic.Uint64 // UDP payload bytes received
	Backpressure atomic.Uint64 // SendBatch stopped early: EAGAIN or ENOBUFS
	SendErrors   atomic.Uint64 // datagrams the kernel refused (dropped)
	RecvErrors   atomic.Uint64 // recvmmsg errors other than EAGAIN
	RxTruncated  atomic.Uint64 // datagrams longer than the buffers (dropped)
	RxForeign    atomic.Uint64 // sender address of another family (dropped)
	// TxInvalid counts frames SendBatch dropped without sending them:
	// shorter than a BTH and an ICRC, or a destination that is not a
	// unicast address of the link's family (without zone) with a port.
	TxInvalid atomic.Uint64
	Wakeups   atomic.Uint64 // Ready signals from the poller
	TxGSO     atomic.Uint64 // datagrams sent with UDP_SEGMENT (two frames or more)
	RxGRO     atomic.Uint64 // datagrams received holding two frames or more (UDP_GRO)
	GSOOff    atomic.Uint64 // the kernel refused a segmented send: GSO turned off
	// System calls that moved data (sendmmsg that sent, recvmmsg that
	// received at least one datagram) and the datagrams they moved: the
	// frames per call are TxFrames/TxCalls and RxFrames/RxCalls.
	TxCalls     atomic.Uint64
	TxDatagrams atomic.Uint64
	RxCalls     atomic.Uint64
	RxDatagrams atomic.Uint64
	RxCE        atomic.Uint64 // datagrams received marked Congestion Experienced (UDPConfig.ECN)
	// Frames this port received for another port's QP and handed to
	// it, and those dropped because its inbox was full (udp_forward.go).
	RxForwarded    atomic.Uint64
	RxForwardDrops atomic.Uint64
	// LastSendErrno is the errno of the last send error (diagnosis).
	LastSendErrno atomic.Uint32
}

// UDPLink is a device's UDP attachment: one socket per worker, all bound
// to the same address and port in one SO_REUSEPORT group with the
// steering program attached. It owns the sockets; Close closes them.
type UDPLink struct {
	cfg   UDPConfig
	local netip.AddrPort
	ports []*UDPPort
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
	err   error
}

// udpBatch holds the preallocated arguments of one sendmmsg or recvmmsg
// call. On receive message i uses iovs[i] and names[i]; on send message k
// covers nfr[k] frames from frame first[k] with iovs[iov[k]:][:nfr[k]] (one
// iovec per frame), names[k] and, when it holds more than one frame, the
// UDP_SEGMENT control message ctl[k]. The Go pointers in msgs and iovs are
// cleared after every call so no caller buffer is retained.
type udpBatch struct {
	msgs    []unix.Mmsghdr
	iovs    []unix.Iovec
	names   [][sockaddrLen]byte
	invalid []bool // tx: frame i of the chunk is not sent (TxInvalid)
	// tx, per message:
	first, nfr, iov []int
	bytes, seg      []int // UDP payload bytes; segment size (first frame's length)
	nlen            []uint32
	ctl             [][gsoCmsgLen]byte
	// tos: rx, per message, room for its IP_TOS / IPV6_TCLASS control
	// message (UDPConfig.ECN only; nil otherwise).
	tos [][tosCmsgLen]byte
}

func newUDPBatch(n int) udpBatch {
	return udpBatch{
		msgs:    make([]unix.Mmsghdr, n),
		iovs:    make([]unix.Iovec, n),
		names:   make([][sockaddrLen]byte, n),
		invalid: make([]bool, n),
		first:   make([]int, n),
		nfr:     make([]int, n),
		iov:     make([]int, n),
		bytes:   make([]int, n),
		seg:     make([]int, n),
		nlen:    make([]uint32, n),
		ctl:     make([][gsoCmsgLen]byte, n),
	}
}

// clear drops the Go pointers of the first k messages and of every
// iovec they used.
func (b *udpBatch) clear(k int) {
	for j := range k {
		m := &b.msgs[j].Hdr
		m.Iov, m.Name, m.Control = nil, nil, nil
	}
	for j := range b.iovs {
		if b.iovs[j].Base == nil {
			break
		}
		b.iovs[j].Base = nil
	}
}

// UDPPort is one worker's socket; it implements the engine's Link.
// SendBatch and RecvBatch must be called by one goroutine at a time (the
// owning worker); Ready and Counters from any.
//
// Wake-ups: a goroutine per port waits on the Go netpoller for the socket
// to become readable and then signals Ready, once per arm. The worker arms
// it (ArmReady, engine.ReadyArmer) only when it is about to sleep, so a
// busy worker, which reads the socket itself every round, costs no
// waiter wake-up per datagram. The waiter re-checks readability (poll
// with timeout 0) after resetting the netpoller's readiness and before
// sleeping, so a datagram that arrives between the worker's last
// RecvBatch and the waiter sleeping still signals Ready.
type UDPPort struct {
	link  *UDPLink
	index int
	file  *os.File
	rc    syscall.RawConn
	v6    bool   // the link's family
	fcap  int    // cfg.FrameCap: the longest datagram RecvBatch returns
	gso   bool   // SendBatch packs frames into UDP_SEGMENT messages
	gso0  bool   // gso as the port started (Stats: on until GSOOff counts)
	ecn   bool   // UDPConfig.ECN: read each datagram's ECN field (udp_ecn.go)
	groRx *groRx // receive state with UDP_GRO on, else nil
	ready chan struct{}
	arm   chan struct{}

	// Method values made once, so the hot path does not allocate.
	sendFn, recvFn, recvGROFn func(uintptr)
	wait                      *fdwait.Waiter // waiter only

	// Arguments and results of sendFn and recvFn (owner goroutine).
	tx, rx   udpBatch
	txFrames [][]byte
	txPeers  []netip.AddrPort
	rxFrames [][]byte
	rxPeers  []netip.AddrPort
	txN, rxN int
	rxErr    error

	// inbox: frames other ports received for this port's QPs
	// (udp_forward.go).
	inbox udpInbox

	Counters UDPCounters
}

// NewUDP opens cfg.Workers sockets bound to cfg.Local in one reuseport
// group, attaches the steering program and starts one waiter goroutine
// per socket. Errors wrap ErrInvalid (configuration), ErrUDPAddrInUse or
// ErrUDPSteering; nothing stays open on error.
func NewUDP(cfg UDPConfig) (*UDPLink, error) {
	a := cfg.Local.Addr().Unmap()
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
		return nil, fmt.Errorf("%w: local address %v: need a specific unicast address without zone", ErrInvalid, cfg.Local.Addr())
	}
	port := cfg.Local.Port()
	if port == 0 {
		port = roce.UDPPort
	}
	if cfg.Workers == 0 {
		cfg.Workers = 1
	}
	if cfg.Workers < 0 || cfg.Workers > 1024 {
		return nil, fmt.Errorf("%w: %d workers", ErrInvalid, cfg.Workers)
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	v6 := a.Is6()
	if cfg.FrameCap < udpMinPayload {
		return nil, fmt.Errorf("%w: frame capacity %d, need at least %d", ErrInvalid, cfg.FrameCap, udpMinPayload)
	}
	if cfg.SegmentIPv4 > SegmentNever {
		return nil, fmt.Errorf("%w: segmentation policy %v", ErrInvalid, cfg.SegmentIPv4)
	}
	if cfg.SendBuffer < 0 || cfg.RecvBuffer < 0 {
		return nil, fmt.Errorf("%w: socket buffer sizes %d, %d", ErrInvalid, cfg.SendBuffer, cfg.RecvBuffer)
	}
	local := netip.AddrPortFrom(a, port)
	sa := sockaddrOf(local)

	// A socket of another reuseport group owner (same user) would join
	// the group silently and take traffic: make sure nobody holds the
	// address by binding it once without SO_REUSEPORT.
	if err := probeFree(v6, sa); err != nil {
		return nil, fmt.Errorf("%w: %v: %v", ErrUDPAddrInUse, local, err)
	}

	l := &UDPLink{cfg: cfg, local: local, done: make(chan struct{})}
	fds := make([]int, 0, cfg.Workers)
	closeFDs := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	for i := range cfg.Workers {
		fd, err := udpSocket(v6, &cfg, true)
		if err != nil {
			closeFDs()
			return nil, fmt.Errorf("link: UDP socket %d: %w", i, err)
		}
		fds = append(fds, fd)
		if cfg.ECN {
			if err := setECN(fd, v6); err != nil {
				closeFDs()
				return nil, fmt.Errorf("link: UDP socket %d: %w", i, err)
			}
		}
		if err := unix.Bind(fd, sa); err != nil {
			closeFDs()
			if errors.Is(err, unix.EADDRINUSE) {
				return nil, fmt.Errorf("%w: %v (socket %d): %v", ErrUDPAddrInUse, local, i, err)
			}
			return nil, fmt.Errorf("link: bind %v (socket %d): %w", local, i, err)
		}
	}
	if err := udpAttach(fds[0], cfg.Workers); err != nil {
		closeFDs()
		return nil, fmt.Errorf("%w: %v: %v", ErrUDPSteering, local, err)
	}

	for i, fd := range fds {
		p := &UDPPort{
			link: l, index: i, v6: v6, fcap: cfg.FrameCap, ecn: cfg.ECN,
			ready: make(chan struct{}, 1), arm: make(chan struct{}, 1),
			tx: newUDPBatch(cfg.Batch), rx: newUDPBatch(cfg.Batch),
		}
		if cfg.ECN {
			p.rx.tos = make([][tosCmsgLen]byte, cfg.Batch)
		}
		if !cfg.NoOffload {
			var gro bool
			if p.gso, gro = setOffload(fd, cfg.Workers == 1); gro {
				p.groRx = newGRORx(cfg.Batch)
			}
			p.gso = p.gso && (v6 || cfg.SegmentIPv4.segments(a))
			p.gso0 = p.gso
		}
		p.file = os.NewFile(uintptr(fd), fmt.Sprintf("udp:%v#%d", local, i))
		rc, err := p.file.SyscallConn()
		if err != nil { // only for a nil *os.File
			p.file.Close()
			for _, q := range l.ports {
				q.file.Close()
			}
			for _, fd := range fds[i+1:] {
				unix.Close(fd)
			}
			return nil, fmt.Errorf("link: %v: %w", local, err)
		}
		p.rc = rc
		p.sendFn, p.recvFn, p.recvGROFn, p.wait = p.send, p.recv, p.recvGRO, fdwait.New(rc)
		p.arm <- struct{}{}
		l.ports = append(l.ports, p)
	}
	for _, p := range l.ports {
		l.wg.Add(1)
		go p.waiter(l.done)
	}
	snd, rcv := sockBuffers(fds[0])
	cfg.Logger.Info("link: UDP link up", "local", local, "workers", cfg.Workers, "frame_cap", cfg.FrameCap,
		"gso", l.ports[0].gso, "gro", l.ports[0].groRx != nil, "sndbuf", snd, "rcvbuf", rcv)
	if rcv < cfg.RecvBuffer || snd < cfg.SendBuffer {
		// A receive buffer smaller than a burst drops frames in the
		// kernel: RC retransmits them (go-back-N), UC loses the message.
		cfg.Logger.Warn("link: the kernel capped the UDP socket buffers; without CAP_NET_ADMIN raise net.core.rmem_max and net.core.wmem_max for fewer drops under load",
			"rcvbuf", rcv, "rcvbuf_asked", cfg.RecvBuffer, "sndbuf", snd, "sndbuf_asked", cfg.SendBuffer)
	}
	return l, nil
}

// udpAttach attaches the steering program; a variable so that a unit test
// can make it fail.
var udpAttach = attachSteering

// udpSocket creates a non-blocking UDP socket with the link's options.
func udpSocket(v6 bool, cfg *UDPConfig, reuse bool) (int, error) {
	family := unix.AF_INET
	if v6 {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return -1, err
	}
	type opt struct {
		level, name, val int
		what             string
	}
	opts := make([]opt, 0, 3)
	if reuse {
		opts = append(opts, opt{unix.SOL_SOCKET, unix.SO_REUSEPORT, 1, "SO_REUSEPORT"})
	}
	if v6 {
		opts = append(opts,
			opt{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1, "IPV6_V6ONLY"},
			opt{unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO, "IPV6_MTU_DISCOVER"})
	} else {
		// DF on every datagram, never fragment locally: RoCE v2
		// packets are never fragmented (the path MTU bounds them).
		opts = append(opts, opt{unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO, "IP_MTU_DISCOVER"})
	}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.name, o.val); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("%s: %w", o.what, err)
		}
	}
	if cfg != nil {
		for _, b := range []struct {
			size, force, name int
			what              string
		}{
			{cfg.SendBuffer, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, "SO_SNDBUF"},
			{cfg.RecvBuffer, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, "SO_RCVBUF"},
		} {
			if err := setSockBuffer(fd, b.size, b.force, b.name); err != nil {
				unix.Close(fd)
				return -1, fmt.Errorf("%s: %w", b.what, err)
			}
		}
	}
	return fd, nil
}

// setSockBuffer sets a socket buffer (SO_SNDBUF or SO_RCVBUF, name) to
// size bytes; 0 keeps the kernel's default. With CAP_NET_ADMIN the
// *BUFFORCE option (force) sets it past net.core.wmem_max / rmem_max;
// without it the plain option does, and the kernel caps it there (the
// link reports what it got: sockBuffers).
func setSockBuffer(fd, size, force, name int) error {
	if size <= 0 {
		return nil
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, force, size); err == nil {
		return nil
	} else if !errors.Is(err, unix.EPERM) {
		return err
	}
	return unix.SetsockoptInt(fd, unix.SOL_SOCKET, name, size)
}

// sockBuffers returns the send and receive buffer sizes the kernel gave
// fd, in bytes the application asked for (the kernel reports twice the
// value set, its bookkeeping overhead included).
func sockBuffers(fd int) (snd, rcv int) {
	snd, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
	rcv, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	return snd / 2, rcv / 2
}

// probeFree binds a socket without SO_REUSEPORT to sa and closes it.
func probeFree(v6 bool, sa unix.Sockaddr) error {
	fd, err := udpSocket(v6, nil, false)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Bind(fd, sa)
}

func sockaddrOf(ap netip.AddrPort) unix.Sockaddr {
	a := ap.Addr().Unmap()
	if a.Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
}

// Ports returns the ports, port i for worker i.
func (l *UDPLink) Ports() []*UDPPort { return l.ports }

// Stats returns a snapshot of every port's counters, by port.
func (l *UDPLink) Stats() []admin.UDPPortStats {
	out := make([]admin.UDPPortStats, len(l.ports))
	for i, p := range l.ports {
		c := &p.Counters
		out[i] = admin.UDPPortStats{
			Port: i, TxFrames: c.TxFrames.Load(), TxBytes: c.TxBytes.Load(), TxDatagrams: c.TxDatagrams.Load(), TxCalls: c.TxCalls.Load(),
			RxFrames: c.RxFrames.Load(), RxBytes: c.RxBytes.Load(), RxDatagrams: c.RxDatagrams.Load(), RxCalls: c.RxCalls.Load(),
			Backpressure: c.Backpressure.Load(), SendErrors: c.SendErrors.Load(), RecvErrors: c.RecvErrors.Load(),
			RxTruncated: c.RxTruncated.Load(), RxForeign: c.RxForeign.Load(), TxInvalid: c.TxInvalid.Load(), Wakeups: c.Wakeups.Load(),
			TxGSO: c.TxGSO.Load(), RxGRO: c.RxGRO.Load(), GSOOff: c.GSOOff.Load(), LastSendErrno: c.LastSendErrno.Load(),
			RxForwarded: c.RxForwarded.Load(), RxForwardDrops: c.RxForwardDrops.Load(),
			GRO: p.groRx != nil,
		}
		out[i].GSO = p.gso0 && out[i].GSOOff == 0
	}
	return out
}

// LocalAddr returns the bound address and port: the source of every
// datagram sent and the destination of every one received.
func (l *UDPLink) LocalAddr() netip.AddrPort { return l.local }

// Close stops the waiters and closes the sockets. It waits for a
// SendBatch or RecvBatch in progress; later calls fail with ErrUDPClosed.
func (l *UDPLink) Close() error {
	l.once.Do(func() {
		close(l.done)
		var errs []error
		for _, p := range l.ports {
			errs = append(errs, p.file.Close())
		}
		l.wg.Wait()
		l.err = errors.Join(errs...)
		l.cfg.Logger.Info("link: UDP link closed", "local", l.local)
	})
	return l.err
}

// Index returns the worker index of the port.
func (p *UDPPort) Index() int { return p.index }

// Ready is signalled when frames may be waiting.
func (p *UDPPort) Ready() <-chan struct{} { return p.ready }

func (p *UDPPort) signal() {
	select {
	case p.ready <- struct{}{}:
	default:
	}
}

// ArmReady asks for one Ready signal when a datagram is queued (see
// UDPPort): the worker calls it right before it sleeps on Ready.
func (p *UDPPort) ArmReady() {
	select {
	case p.arm <- struct{}{}:
	default:
	}
}

// waiter signals Ready when the socket becomes readable, once per arm.
func (p *UDPPort) waiter(done <-chan struct{}) {
	defer p.link.wg.Done()
	for {
		select {
		case <-p.arm:
		case <-done:
			return
		}
		if err := p.wait.Wait(); err != nil {
			return // closed
		}
		p.Counters.Wakeups.Add(1)
		p.signal()
	}
}

// SendBatch implements the engine's Link: it sends every frame, a UDP
// payload (BTH through ICRC), to peers[i] (len(peers) >= len(frames)),
// from the link's address and port. The caller keeps its buffers (the
// kernel copies). A frame shorter than a BTH and an ICRC, or for a
// destination that is not a unicast address of the link's family with a
// port, is dropped and counted (TxInvalid). It returns fewer than
// len(frames) only on backpressure (EAGAIN, ENOBUFS); a datagram the
// kernel refuses for another reason is dropped and counted in
// SendErrors.
func (p *UDPPort) SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	if len(frames) == 0 {
		return 0, nil
	}
	if len(peers) < len(frames) {
		return 0, fmt.Errorf("%w: %d frames, %d peers", ErrInvalid, len(frames), len(peers))
	}
	p.txFrames, p.txPeers, p.txN = frames, peers, 0
	err := p.rc.Control(p.sendFn)
	p.txFrames, p.txPeers = nil, nil
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrUDPClosed, err)
	}
	return p.txN, nil
}

// send is SendBatch on the socket fd: frames in chunks of at most one
// call's worth, each chunk as messages of one datagram or, with UDP_SEGMENT,
// of several frames (buildTx).
func (p *UDPPort) send(fd uintptr) {
	frames := p.txFrames
	b := &p.tx
	c := &p.Counters
	for i := 0; i < len(frames); {
		end := min(len(frames), i+len(b.msgs))
		k := p.buildTx(i, end)
		stop := end // first frame not accepted
		retry := false
		for s := 0; s < k; {
			r, e := sendmmsg(fd, b.msgs[s:k], unix.MSG_DONTWAIT)
			if r > 0 {
				c.TxCalls.Add(1)
				c.TxDatagrams.Add(uint64(r))
				for j := s; j < s+r; j++ {
					c.TxBytes.Add(uint64(b.bytes[j]))
					c.TxFrames.Add(uint64(b.nfr[j]))
					if b.nfr[j] > 1 {
						c.TxGSO.Add(1)
					}
				}
				s += r
				continue
			}
			if e == unix.EINTR {
				continue
			}
			if e == unix.EAGAIN || e == unix.ENOBUFS {
				c.Backpressure.Add(1)
				stop = b.first[s]
				break
			}
			if b.nfr[s] > 1 && (e == unix.EIO || e == unix.EINVAL) {
				// The path cannot segment (IPsec, no checksum
				// offload, ...): send one datagram per frame from
				// now on, starting with this message's.
				p.gso = false
				c.GSOOff.Add(1)
				p.link.cfg.Logger.Warn("link: UDP segmentation offload refused; sending one datagram per frame", "local", p.link.local, "port", p.index, "errno", e)
				stop, retry = b.first[s], true
				break
			}
			c.SendErrors.Add(uint64(b.nfr[s]))
			c.LastSendErrno.Store(uint32(e))
			s++ // drop this datagram, go on with the next
		}
		for f := i; f < stop; f++ {
			if b.invalid[f-i] {
				c.TxInvalid.Add(1)
			}
		}
		b.clear(k)
		if retry {
			i = stop
			continue
		}
		if stop < end {
			p.txN = stop
			return
		}
		i = end
	}
	p.txN = len(frames)
}

// RecvBatch implements the engine's Link: it fills frames with received
// datagrams (UDP payloads, BTH through ICRC, as sent) in the caller's
// buffers and peers[i] with the sender of frames[i] (len(peers) >=
// len(frames)); frames[i] is resliced, and buffers may change places
// when a datagram is dropped. It never blocks. Frames are at most
// UDPConfig.FrameCap bytes (longer datagrams are dropped, RxTruncated);
// each buffer needs a capacity of at least a BTH and an ICRC, and
// normally has FrameCap.
func (p *UDPPort) RecvBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	if len(frames) == 0 {
		return 0, nil
	}
	if len(peers) < len(frames) {
		return 0, fmt.Errorf("%w: %d frames, %d peers", ErrInvalid, len(frames), len(peers))
	}
	k := p.takeInbox(frames, peers)
	if k == len(frames) {
		return k, nil
	}
	p.rxFrames, p.rxPeers, p.rxN, p.rxErr = frames[k:], peers[k:], 0, nil
	recv := p.recvFn
	if p.groRx != nil {
		recv = p.recvGROFn
	}
	err := p.rc.Control(recv)
	p.rxFrames, p.rxPeers = nil, nil
	if err != nil {
		return k, fmt.Errorf("%w: %v", ErrUDPClosed, err)
	}
	return k + p.rxN, p.rxErr
}

// recv is RecvBatch on the socket fd.
func (p *UDPPort) recv(fd uintptr) {
	frames, peers := p.rxFrames, p.rxPeers
	b := &p.rx
	c := &p.Counters
	total, drained, short := 0, false, false
	for total < len(frames) && !drained && !short {
		k := min(len(frames)-total, len(b.msgs))
		for i := range k {
			buf := frames[total+i]
			buf = buf[:min(cap(buf), p.fcap)]
			if len(buf) < udpMinPayload {
				p.rxErr = fmt.Errorf("%w: receive buffer of capacity %d", ErrInvalid, cap(buf))
				k, short = i, true
				break
			}
			frames[total+i] = buf
			b.iovs[i].Base = &buf[0]
			b.iovs[i].SetLen(len(buf))
			m := &b.msgs[i]
			m.Hdr = unix.Msghdr{Name: &b.names[i][0], Namelen: sockaddrLen, Iov: &b.iovs[i]}
			m.Hdr.SetIovlen(1)
			if p.ecn {
				m.Hdr.Control = &b.tos[i][0]
				m.Hdr.SetControllen(tosCmsgLen)
			}
			m.Len = 0
		}
		if k == 0 {
			break
		}
		got := recvNow(fd, b.msgs[:k], c)
		if got < k {
			drained = true
		}
		j := total
		for i := range got {
			m := &b.msgs[i]
			slot := total + i
			if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
				c.RxTruncated.Add(1)
				continue
			}
			from, ok := sockaddrAddrPort(&b.names[i], m.Hdr.Namelen, p.v6)
			if !ok {
				c.RxForeign.Add(1)
				continue
			}
			n := int(m.Len)
			frames[slot] = frames[slot][:n]
			if p.ecn && n >= udpMinPayload && markCE(frames[slot], b.tos[i][:min(int(m.Hdr.Controllen), tosCmsgLen)]) {
				c.RxCE.Add(1)
			}
			if n >= udpMinPayload {
				if dst, other := p.steersElsewhere(frames[slot]); other {
					p.forward(dst, frames[slot], from)
					continue
				}
			}
			if j != slot {
				frames[j], frames[slot] = frames[slot], frames[j]
			}
			peers[j] = from
			j++
			c.RxFrames.Add(1)
			c.RxBytes.Add(uint64(n))
		}
		for i := range k {
			b.iovs[i].Base, b.msgs[i].Hdr.Iov, b.msgs[i].Hdr.Name, b.msgs[i].Hdr.Control = nil, nil, nil, nil
		}
		total = j
	}
	p.rxN = total
	switch {
	case short:
	case drained:
		// The socket was empty; the worker arms the waiter (ArmReady)
		// if it goes to sleep.
	default:
		// A full batch: more may be waiting.
		p.signal()
	}
}

// recvNow is one recvmmsg into msgs that does not wait (EINTR retried): the
// datagrams received; 0 when none is queued or on an error (counted).
func recvNow(fd uintptr, msgs []unix.Mmsghdr, c *UDPCounters) int {
	for {
		r, e := recvmmsg(fd, msgs, unix.MSG_DONTWAIT)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			if e != unix.EAGAIN {
				c.RecvErrors.Add(1)
			}
			return 0
		}
		if r > 0 {
			c.RxCalls.Add(1)
			c.RxDatagrams.Add(uint64(r))
		}
		return r
	}
}
