package link

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/vrnic/vrnic/roce"
)

// Errors.
var (
	ErrInvalid = errors.New("link: invalid argument")
	ErrExists  = errors.New("link: address already attached")
)

// Config configures a Network.
type Config struct {
	// FrameCap is the capacity of every buffer (must equal the engines').
	FrameCap int
	// QueueLen is the receive queue length of every port. Default 1024.
	QueueLen int
	// Buffers is the number of buffers in the pool. Default 4096.
	Buffers int
	// Logger gets lifecycle messages (fault seeds). Default slog.Default().
	Logger *slog.Logger
}

// Network is an in-memory Ethernet segment for RoCE v2 frames.
type Network struct {
	cfg    Config
	free   chan []byte
	mu     sync.Mutex // serialises Attach
	routes atomic.Pointer[map[netip.Addr][]*Port]
}

// NewNetwork creates a network and its buffer pool.
func NewNetwork(cfg Config) (*Network, error) {
	if cfg.FrameCap < 64 {
		return nil, fmt.Errorf("%w: frame capacity %d", ErrInvalid, cfg.FrameCap)
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 1024
	}
	if cfg.Buffers <= 0 {
		cfg.Buffers = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	n := &Network{cfg: cfg, free: make(chan []byte, cfg.Buffers)}
	for range cfg.Buffers {
		n.free <- make([]byte, cfg.FrameCap)
	}
	m := map[netip.Addr][]*Port{}
	n.routes.Store(&m)
	return n, nil
}

// PortCounters count what a port did.
type PortCounters struct {
	Sent       atomic.Uint64 // frames taken by SendBatch
	Received   atomic.Uint64 // frames returned by RecvBatch
	NoRoute    atomic.Uint64 // no device at the destination address (dropped)
	Malformed  atomic.Uint64 // not an IPv4/IPv6 UDP frame with a BTH (dropped)
	Dropped    atomic.Uint64 // fault: dropped
	Duplicated atomic.Uint64 // fault: sent twice
	Reordered  atomic.Uint64 // fault: held back behind later frames
	Delayed    atomic.Uint64 // fault: held back for a time
	Corrupted  atomic.Uint64 // fault: one byte flipped
}

// Port is one worker's attachment: it implements the engine's Link.
// SendBatch and RecvBatch must be called by one goroutine at a time (the
// owning worker).
type Port struct {
	net   *Network
	addr  netip.Addr
	index int
	q     chan []byte
	ready chan struct{}
	f     *faultState

	Counters PortCounters
}

// Attach adds a device with address addr and returns one port per worker.
// faults may be nil (a perfect link); otherwise each port gets its own
// fault state seeded from faults.Seed and its index.
func (n *Network) Attach(addr netip.Addr, workers int, faults *Faults) ([]*Port, error) {
	if !addr.IsValid() || workers <= 0 {
		return nil, fmt.Errorf("%w: address %v, %d workers", ErrInvalid, addr, workers)
	}
	addr = addr.Unmap()
	n.mu.Lock()
	defer n.mu.Unlock()
	old := *n.routes.Load()
	if _, ok := old[addr]; ok {
		return nil, fmt.Errorf("%w: %v", ErrExists, addr)
	}
	ports := make([]*Port, workers)
	for i := range ports {
		p := &Port{net: n, addr: addr, index: i, q: make(chan []byte, n.cfg.QueueLen), ready: make(chan struct{}, 1)}
		if faults != nil {
			p.f = newFaultState(*faults, i, n.cfg.Logger, addr)
		}
		ports[i] = p
	}
	m := make(map[netip.Addr][]*Port, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[addr] = ports
	n.routes.Store(&m)
	return ports, nil
}

// Ready is signalled when frames were queued to the port.
func (p *Port) Ready() <-chan struct{} { return p.ready }

// route finds the destination port of frame: by destination IP, then by
// the BTH destination QP. ok is false for frames that cannot be routed
// (counted).
func (p *Port) route(frame []byte) (*Port, bool) {
	eth := roce.Ethernet(frame)
	if !eth.IsValid() {
		p.Counters.Malformed.Add(1)
		return nil, false
	}
	ip := frame[eth.HeaderLen():]
	var dst netip.Addr
	var ihl int
	switch eth.Type() {
	case roce.EtherTypeIPv4:
		h := roce.IPv4(ip)
		if !h.IsValid() || h.HeaderLen() < roce.IPv4HeaderLen {
			p.Counters.Malformed.Add(1)
			return nil, false
		}
		dst, ihl = h.Dst(), h.HeaderLen()
	case roce.EtherTypeIPv6:
		h := roce.IPv6(ip)
		if !h.IsValid() {
			p.Counters.Malformed.Add(1)
			return nil, false
		}
		dst, ihl = h.Dst().Unmap(), roce.IPv6HeaderLen
	default:
		p.Counters.Malformed.Add(1)
		return nil, false
	}
	if len(ip) < ihl+roce.UDPHeaderLen+roce.BTHLen {
		p.Counters.Malformed.Add(1)
		return nil, false
	}
	ports := (*p.net.routes.Load())[dst]
	if ports == nil {
		p.Counters.NoRoute.Add(1)
		return nil, false
	}
	bth := roce.BTH(ip[ihl+roce.UDPHeaderLen:])
	return ports[roce.SteerQueue(bth.DestQP(), len(ports))], true
}

// deliver moves frame (owned by the link from now on) to dst's queue.
func (dst *Port) deliver(frame []byte) bool {
	select {
	case dst.q <- frame:
	default:
		return false
	}
	select {
	case dst.ready <- struct{}{}:
	default:
	}
	return true
}

// SendBatch implements the engine's Link.
func (p *Port) SendBatch(frames [][]byte) (int, error) {
	if p.f != nil {
		p.releaseHeld(false)
	}
	for i, fr := range frames {
		dst, ok := p.route(fr)
		if !ok {
			p.Counters.Sent.Add(1)
			continue // dropped; the sender keeps its buffer
		}
		if p.f != nil {
			if !p.sendFaulty(dst, &frames[i]) {
				return i, nil
			}
			p.Counters.Sent.Add(1)
			continue
		}
		var empty []byte
		select {
		case empty = <-p.net.free:
		default:
			return i, nil // pool empty: backpressure
		}
		if !dst.deliver(fr) {
			p.net.free <- empty
			return i, nil // receiver full: backpressure
		}
		frames[i] = empty[:cap(empty)]
		p.Counters.Sent.Add(1)
	}
	return len(frames), nil
}

// RecvBatch implements the engine's Link.
func (p *Port) RecvBatch(frames [][]byte) (int, error) {
	if p.f != nil {
		p.releaseHeld(false)
	}
	for i := range frames {
		select {
		case fr := <-p.q:
			empty := frames[i]
			frames[i] = fr
			p.net.free <- empty[:cap(empty)]
			p.Counters.Received.Add(1)
		default:
			return i, nil
		}
	}
	return len(frames), nil
}

// FreeBuffers returns the number of empty buffers in the pool.
func (n *Network) FreeBuffers() int { return len(n.free) }

// Queued returns the number of frames waiting in the port's receive queue.
func (p *Port) Queued() int { return len(p.q) }

// Held returns the number of frames a lossy port holds back.
func (p *Port) Held() int {
	if p.f == nil {
		return 0
	}
	return len(p.f.held)
}
