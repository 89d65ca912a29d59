package link

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/tap"
)

// ErrTAPClosed reports use of a closed TAP link.
var ErrTAPClosed = errors.New("link: TAP link closed")

// tapQueue is what a TAP port needs from its queue (tap.Queue): batched
// reads that never wait, a wait for the next frame, batched writes.
type tapQueue interface {
	TryReadBatch(bufs [][]byte, sizes []int, offset int) (int, error)
	WaitReadable() error
	WriteBatch(bufs [][]byte, offset int) (int, error)
}

// neighborHandler takes ARP and neighbour discovery frames
// (tap.Neighbors).
type neighborHandler interface {
	HandleFrame(frame []byte) bool
}

// TAPConfig configures a TAP link.
type TAPConfig struct {
	// FrameCap is the capacity of every buffer; it must equal the
	// engine's and be at least the device's MaxFrameSize (longer frames
	// would be truncated by the kernel and fail their ICRC).
	FrameCap int
	// Batch is the most frames one RecvBatch reads. Default 64.
	Batch int
	// Logger gets lifecycle messages. Default slog.Default().
	Logger *slog.Logger
}

// TAPCounters count what a TAP port did. All are atomic.
type TAPCounters struct {
	RxFrames    atomic.Uint64 // RoCE v2 frames returned by RecvBatch
	RxBytes     atomic.Uint64 // their bytes (whole frames)
	RxNeighbor  atomic.Uint64 // ARP/ND frames given to the neighbour engine
	RxOther     atomic.Uint64 // neither RoCE v2 nor ARP/ND (dropped)
	RxMisqueued atomic.Uint64 // RoCE v2 for a QP another queue owns (dropped)
	ReadErrors  atomic.Uint64 // failed queue reads
	TxFrames    atomic.Uint64 // frames written
	TxBytes     atomic.Uint64 // their bytes
	TxErrors    atomic.Uint64 // frames the kernel refused (dropped)
	Wakeups     atomic.Uint64 // Ready signals (a sleeping worker woken by a frame)
	TxGSO       atomic.Uint64 // segmented writes (several frames in one write)
	TxGSOFrames atomic.Uint64 // the frames they carried
	RxGSO       atomic.Uint64 // segmented packets read
	RxGSOFrames atomic.Uint64 // the frames cut from them
	RxBad       atomic.Uint64 // reads dropped: bad virtio-net header or segmented packet
	LoopFrames  atomic.Uint64 // frames to the device's own MAC, delivered by the link itself
	LoopDropped atomic.Uint64 // of those, dropped: the owning port's loopback queue was full
}

// TAPQueueStats is a snapshot of one port's counters: the operator's type
// (the stats socket serves it inside admin.LinkStats).
type TAPQueueStats = admin.TAPQueueStats

// TAPLink is a device's TAP attachment: port i reads and writes queue i of
// a multi-queue TAP device for worker i. It owns the device: Close closes
// it (the interface disappears).
type TAPLink struct {
	cfg   TAPConfig
	dev   *tap.Device // nil in unit tests over fake queues
	ports []*TAPPort
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
	err   error
	close func() error // closes the queues (ends blocked reads)

	offload   atomic.Pointer[string] // the offload's state, for the stats
	refusedMu sync.Once              // logs the first refused segmented write

	// mac is the device's MAC (hasMAC false over fake queues): a frame
	// sent to it is for one of the device's own QPs and never reaches
	// the kernel (loopback).
	mac    tap.MAC
	hasMAC bool
}

// loopCap bounds a port's loopback queue, as a NIC's internal loopback
// path has a bounded buffer: beyond it a frame is dropped (and counted),
// and RC retransmits it.
const loopCap = 512

// loopQueue is a port's queue of frames another port (or itself) sent to
// the device's own MAC, in the order sent, with the empty buffers it
// reuses (allocated on first use, at most loopCap in all).
type loopQueue struct {
	mu     sync.Mutex
	frames [][]byte
	free   [][]byte
	bufs   int // buffers allocated
}

// TAPPort is one worker's queue; it implements the engine's Link.
// SendBatch and RecvBatch must be called by one goroutine at a time (the
// owning worker); Ready, ArmReady and Counters from any.
//
// Receive path: RecvBatch reads the queue itself, non-blocking, straight
// into the worker's buffers (one read(2) per frame, none of them waits),
// classifies what it read, hands ARP/ND to the neighbour engine and
// returns the RoCE v2 frames. No goroutine sits between the queue and the
// worker while it is busy, so a frame costs no goroutine hand-off, and
// nothing is copied or exchanged. When the worker runs out of work it
// calls ArmReady before it sleeps on Ready: the port's waiter goroutine
// then waits for the queue to become readable (Queue.WaitReadable, on the
// Go poller) and signals Ready once. When the worker does not keep up,
// frames wait in the kernel's queue (which drops beyond its length, like
// a NIC ring).
//
// No lost wake-ups: a frame queued before the waiter's wait begins is
// found by the wait's first check (poll(2)); one queued later raises the
// edge the wait is parked on. Either way Ready is signalled after the
// frame was queued, and the worker re-reads before it sleeps again.
type TAPPort struct {
	link  *TAPLink
	index int
	nq    int
	q     tapQueue
	neigh neighborHandler
	fcap  int
	ready chan struct{}
	arm   chan struct{}

	// Owner-private.
	sizes []int
	gso   *tapGSO // nil without the offload

	loop loopQueue

	Counters TAPCounters
}

// NewTAP attaches the engine's workers to the queues of dev, one port per
// queue, and starts one waiter goroutine per queue. It takes ownership of
// dev: Close closes it. Frames of other kinds than RoCE v2 and ARP/ND are
// counted and dropped; ARP/ND go to dev.Neighbors().
func NewTAP(dev *tap.Device, cfg TAPConfig) (*TAPLink, error) {
	if dev == nil {
		return nil, fmt.Errorf("%w: nil TAP device", ErrInvalid)
	}
	if cfg.FrameCap < dev.MaxFrameSize() {
		return nil, fmt.Errorf("%w: frame capacity %d below the device's largest frame %d (MTU %d)",
			ErrInvalid, cfg.FrameCap, dev.MaxFrameSize(), dev.MTU())
	}
	qs := make([]tapQueue, dev.NumQueues())
	for i := range qs {
		qs[i] = dev.Queue(i)
	}
	l, err := newTAPLink(qs, dev.Neighbors(), cfg, dev.Close)
	if err != nil {
		return nil, err
	}
	l.dev = dev
	l.mac, l.hasMAC = dev.MAC(), true
	uso, msg := dev.Offload()
	if uso {
		for i, p := range l.ports {
			p.gso = newTapGSO(dev.Queue(i), cfg.FrameCap)
		}
	}
	l.offload.Store(&msg)
	l.cfg.Logger.Info("link: TAP link up", "device", dev.Name(), "queues", dev.NumQueues(), "frame_cap", cfg.FrameCap,
		"offload", msg)
	return l, nil
}

// Offload says whether the link moves runs of frames as segmented packets
// (UDP segmentation offload): "uso", or "off: " and why (the device has no
// offload, or the kernel refused a segmented write).
func (l *TAPLink) Offload() string {
	if s := l.offload.Load(); s != nil {
		return *s
	}
	return "off (no device)"
}

// gsoRefused records that the kernel refused a segmented write on a port
// (which then writes one frame per write).
func (l *TAPLink) gsoRefused(port int, err error) {
	l.refusedMu.Do(func() {
		msg := "off: the kernel refused a segmented write: " + err.Error()
		l.offload.Store(&msg)
		l.cfg.Logger.Warn("link: TAP segmentation offload refused; one frame per write", "queue", port, "err", err)
	})
}

func errTAPClosed(err error) error { return fmt.Errorf("%w: %v", ErrTAPClosed, err) }

// newTAPLink builds the ports over qs; closeQueues must make blocked
// ReadBatch calls return an error.
func newTAPLink(qs []tapQueue, neigh neighborHandler, cfg TAPConfig, closeQueues func() error) (*TAPLink, error) {
	if len(qs) == 0 || len(qs) > tap.MaxQueues {
		return nil, fmt.Errorf("%w: %d queues", ErrInvalid, len(qs))
	}
	if cfg.FrameCap < roce.MaxHeadroom+roce.MaxTailroom {
		return nil, fmt.Errorf("%w: frame capacity %d", ErrInvalid, cfg.FrameCap)
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	l := &TAPLink{cfg: cfg, done: make(chan struct{}), close: closeQueues}
	for i, q := range qs {
		p := &TAPPort{
			link: l, index: i, nq: len(qs), q: q, neigh: neigh, fcap: cfg.FrameCap,
			ready: make(chan struct{}, 1),
			arm:   make(chan struct{}, 1),
			sizes: make([]int, cfg.Batch),
		}
		l.ports = append(l.ports, p)
	}
	for _, p := range l.ports {
		l.wg.Add(1)
		go p.waiter()
	}
	return l, nil
}

// Ports returns the ports, port i for worker i.
func (l *TAPLink) Ports() []*TAPPort { return l.ports }

// Device returns the TAP device (nil for a link over fake queues).
func (l *TAPLink) Device() *tap.Device { return l.dev }

// Stats returns a snapshot of every port's counters.
func (l *TAPLink) Stats() []TAPQueueStats {
	out := make([]TAPQueueStats, len(l.ports))
	for i, p := range l.ports {
		c := &p.Counters
		out[i] = TAPQueueStats{
			Queue: i, RxFrames: c.RxFrames.Load(), RxBytes: c.RxBytes.Load(), RxNeighbor: c.RxNeighbor.Load(),
			RxOther: c.RxOther.Load(), RxMisqueued: c.RxMisqueued.Load(), ReadErrors: c.ReadErrors.Load(),
			TxFrames: c.TxFrames.Load(), TxBytes: c.TxBytes.Load(), TxErrors: c.TxErrors.Load(), Wakeups: c.Wakeups.Load(),
			TxGSO: c.TxGSO.Load(), TxGSOFrames: c.TxGSOFrames.Load(), RxGSO: c.RxGSO.Load(), RxGSOFrames: c.RxGSOFrames.Load(),
			RxBad: c.RxBad.Load(), LoopFrames: c.LoopFrames.Load(), LoopDropped: c.LoopDropped.Load(),
		}
	}
	return out
}

// Close stops the waiters and closes the device (its queues). Call it
// after the engine stopped: a SendBatch or RecvBatch after Close fails
// with ErrTAPClosed or returns nothing.
func (l *TAPLink) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.err = l.close()
		l.wg.Wait()
		l.cfg.Logger.Info("link: TAP link closed")
	})
	return l.err
}

// Index returns the queue (worker) index of the port.
func (p *TAPPort) Index() int { return p.index }

// Ready is signalled when frames may be waiting.
func (p *TAPPort) Ready() <-chan struct{} { return p.ready }

func (p *TAPPort) signal() {
	select {
	case p.ready <- struct{}{}:
		p.Counters.Wakeups.Add(1)
	default:
	}
}

// ArmReady asks for a Ready signal when a frame is queued: the worker
// calls it when it is about to sleep on Ready, after a RecvBatch that
// found nothing. Without it Ready is not signalled (a busy worker reads
// the queue anyway, and a waiter woken by every frame would cost a
// goroutine hand-off per frame).
func (p *TAPPort) ArmReady() {
	select {
	case p.arm <- struct{}{}:
	default:
	}
}

// waiter is the port's wake-up goroutine (see TAPPort).
func (p *TAPPort) waiter() {
	defer p.link.wg.Done()
	done := p.link.done
	for {
		select {
		case <-p.arm:
		case <-done:
			return
		}
		if err := p.q.WaitReadable(); err != nil {
			select {
			case <-done:
				return
			default:
			}
			if errors.Is(err, os.ErrClosed) {
				return
			}
			p.Counters.ReadErrors.Add(1)
			time.Sleep(time.Millisecond) // a failing queue must not spin
		}
		p.signal()
	}
}

// accept tells whether frame is RoCE v2 for a QP of this queue; it hands
// ARP/ND to the neighbour engine and counts everything it drops.
func (p *TAPPort) accept(frame []byte) bool {
	qpn, ok := roceDestQP(frame)
	if !ok {
		if tap.IsNeighborFrame(frame) && p.neigh != nil && p.neigh.HandleFrame(frame) {
			p.Counters.RxNeighbor.Add(1)
		} else {
			p.Counters.RxOther.Add(1)
		}
		return false
	}
	if roce.SteerQueue(qpn, p.nq) != p.index {
		p.Counters.RxMisqueued.Add(1)
		return false
	}
	p.Counters.RxFrames.Add(1)
	p.Counters.RxBytes.Add(uint64(len(frame)))
	return true
}

// roceDestQP returns the BTH destination QP of a RoCE v2 frame: Ethernet
// (optionally one 802.1Q tag), IPv4 without fragmentation or IPv6 without
// extension headers, UDP to port 4791, room for a BTH. It reads headers
// in place and never allocates; everything else is checked by the
// engine's parser.
func roceDestQP(frame []byte) (uint32, bool) {
	eth := roce.Ethernet(frame)
	if !eth.IsValid() {
		return 0, false
	}
	ip := frame[eth.HeaderLen():]
	var ihl int
	switch eth.Type() {
	case roce.EtherTypeIPv4:
		h := roce.IPv4(ip)
		if !h.IsValid() || h.Version() != 4 || h.HeaderLen() < roce.IPv4HeaderLen || h.Protocol() != roce.ProtocolUDP || h.IsFragment() {
			return 0, false
		}
		ihl = h.HeaderLen()
	case roce.EtherTypeIPv6:
		h := roce.IPv6(ip)
		if !h.IsValid() || h.NextHeader() != roce.ProtocolUDP {
			return 0, false
		}
		ihl = roce.IPv6HeaderLen
	default:
		return 0, false
	}
	if len(ip) < ihl+roce.UDPHeaderLen+roce.BTHLen {
		return 0, false
	}
	if roce.UDP(ip[ihl:]).DstPort() != roce.UDPPort {
		return 0, false
	}
	return roce.BTH(ip[ihl+roce.UDPHeaderLen:]).DestQP(), true
}

// RecvBatch implements the engine's Link: it returns the frames waiting
// in the port's loopback queue (sent by the device to itself, see
// SendBatch), then reads up to len(frames) queued frames (at most Batch)
// into the slots' own buffers and returns the RoCE v2 frames of this
// queue's QPs in frames[:n], in arrival order; the other slots keep their
// buffers at full length. It never blocks. Frames are whole Ethernet
// frames: peers is not written (may be nil).
func (p *TAPPort) RecvBatch(frames [][]byte, _ []netip.AddrPort) (int, error) {
	k := p.recvLoop(frames)
	if k == len(frames) {
		return k, nil
	}
	n, err := p.recvKernel(frames[k:])
	return k + n, err
}

// recvLoop moves up to len(frames) frames of the loopback queue into
// frames[:k] by exchange (each slot's empty buffer goes to the queue's
// free list) and returns k.
func (p *TAPPort) recvLoop(frames [][]byte) int {
	q := &p.loop
	q.mu.Lock()
	defer q.mu.Unlock()
	k := min(len(frames), len(q.frames))
	for i := range k {
		f := q.frames[i]
		q.free = append(q.free, frames[i][:cap(frames[i])])
		frames[i] = f
		p.Counters.RxFrames.Add(1)
		p.Counters.RxBytes.Add(uint64(len(f)))
	}
	n := copy(q.frames, q.frames[k:])
	clear(q.frames[n:])
	q.frames = q.frames[:n]
	return k
}

// recvKernel reads the queue (RecvBatch).
func (p *TAPPort) recvKernel(frames [][]byte) (int, error) {
	want := min(len(frames), len(p.sizes))
	for i := range want {
		if cap(frames[i]) < p.fcap {
			return 0, fmt.Errorf("%w: receive buffer of capacity %d, want %d", ErrInvalid, cap(frames[i]), p.fcap)
		}
		frames[i] = frames[i][:cap(frames[i])]
	}
	if p.gso != nil {
		return p.recvOffload(frames, want)
	}
	n, err := p.q.TryReadBatch(frames[:want], p.sizes, 0)
	if err != nil {
		if errors.Is(err, os.ErrClosed) {
			return 0, nil // closed: nothing more to receive
		}
		p.Counters.ReadErrors.Add(1)
	}
	k := 0
	for i := range n {
		f := frames[i][:p.sizes[i]]
		if !p.accept(f) {
			continue // the slot keeps its buffer (restored below)
		}
		frames[i] = frames[k]
		frames[k] = f
		k++
	}
	for i := k; i < n; i++ {
		frames[i] = frames[i][:cap(frames[i])]
	}
	return k, err // not os.ErrClosed: returned above
}

// SendBatch implements the engine's Link: it writes every frame to the
// queue (the kernel copies; the caller keeps its buffers). A frame the
// kernel refuses is dropped and counted (TxErrors) so one bad frame cannot
// stall the worker; after Close it fails with ErrTAPClosed. Frames are
// whole Ethernet frames: peers is not read (may be nil).
//
// A frame to the device's own MAC (a QP sending to another QP of the same
// device, which Neighbors resolves to that MAC) never reaches the kernel:
// a bridge does not send a frame back out of the port it came in on. It
// is copied into the loopback queue of the port that owns its destination
// QP (the queue the steering program would have chosen), whose worker is
// woken, as an RNIC loops such packets back inside the adapter.
func (p *TAPPort) SendBatch(frames [][]byte, _ []netip.AddrPort) (int, error) {
	if !p.link.hasMAC {
		return p.sendKernel(frames)
	}
	sent := 0
	for sent < len(frames) {
		if p.isOwn(frames[sent]) {
			p.loopback(frames[sent])
			sent++
			continue
		}
		j := sent + 1
		for j < len(frames) && !p.isOwn(frames[j]) {
			j++
		}
		n, err := p.sendKernel(frames[sent:j])
		sent += n
		if err != nil || sent < j {
			return sent, err
		}
	}
	return sent, nil
}

// isOwn tells whether frame is addressed to the device's own MAC.
func (p *TAPPort) isOwn(frame []byte) bool {
	return len(frame) >= len(p.link.mac) && tap.MAC(frame[:len(p.link.mac)]) == p.link.mac
}

// loopback queues a copy of frame on the port owning its destination QP
// and wakes that port's worker; a frame that is not RoCE v2, or finds the
// queue full, is dropped and counted.
func (p *TAPPort) loopback(frame []byte) {
	p.Counters.LoopFrames.Add(1)
	qpn, ok := roceDestQP(frame)
	if !ok || len(frame) > p.fcap {
		p.Counters.LoopDropped.Add(1)
		return
	}
	dst := p.link.ports[roce.SteerQueue(qpn, p.nq)]
	q := &dst.loop
	q.mu.Lock()
	var b []byte
	switch {
	case len(q.free) > 0:
		b = q.free[len(q.free)-1]
		q.free = q.free[:len(q.free)-1]
	case q.bufs < loopCap:
		b = make([]byte, dst.fcap)
		q.bufs++
	default:
		q.mu.Unlock()
		p.Counters.LoopDropped.Add(1)
		return
	}
	b = b[:copy(b[:cap(b)], frame)]
	q.frames = append(q.frames, b)
	q.mu.Unlock()
	dst.signal()
}

// sendKernel writes frames to the queue (SendBatch).
func (p *TAPPort) sendKernel(frames [][]byte) (int, error) {
	if p.gso != nil {
		return p.sendOffload(frames)
	}
	sent := 0
	for sent < len(frames) {
		n, err := p.q.WriteBatch(frames[sent:], 0)
		for _, f := range frames[sent : sent+n] {
			p.Counters.TxBytes.Add(uint64(len(f)))
		}
		p.Counters.TxFrames.Add(uint64(n))
		sent += n
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrClosed) {
			return sent, fmt.Errorf("%w: %v", ErrTAPClosed, err)
		}
		p.Counters.TxErrors.Add(1)
		sent++ // drop the refused frame
	}
	return sent, nil
}
