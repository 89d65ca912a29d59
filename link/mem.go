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
	// Mode is what the network carries: whole Ethernet frames
	// (roce.ModeEthernet, the zero value) routed by their IP header, or
	// UDP payloads (roce.ModeUDP, BTH through ICRC) routed by the
	// destination beside each one, as the UDP link carries them.
	Mode roce.Mode
	// FrameCap is the capacity of every buffer (must equal the engines').
	FrameCap int
	// QueueLen is the receive queue length of every port. Default 1024.
	QueueLen int
	// Buffers is the number of the network's buffers (in the pool at
	// first; queued frames and the receivers' parked empty buffers use
	// them). Default 4096.
	Buffers int
	// Logger gets lifecycle messages (fault seeds). Default slog.Default().
	Logger *slog.Logger
}

// Network is an in-memory Ethernet segment for RoCE v2 frames, or in
// roce.ModeUDP an in-memory stand-in for UDP between hosts.
type Network struct {
	cfg    Config
	pool   *frameQueue // empty buffers
	mu     sync.Mutex  // serialises Attach
	routes atomic.Pointer[map[netip.Addr][]*Port]
}

// NewNetwork creates a network and its buffer pool.
func NewNetwork(cfg Config) (*Network, error) {
	if cfg.FrameCap < 64 {
		return nil, fmt.Errorf("%w: frame capacity %d", ErrInvalid, cfg.FrameCap)
	}
	if cfg.Mode != roce.ModeEthernet && cfg.Mode != roce.ModeUDP {
		return nil, fmt.Errorf("%w: mode %v", ErrInvalid, cfg.Mode)
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
	n := &Network{cfg: cfg, pool: newFrameQueue(cfg.Buffers)}
	for range cfg.Buffers {
		n.pool.push(make([]byte, cfg.FrameCap), netip.AddrPort{})
	}
	m := map[netip.Addr][]*Port{}
	n.routes.Store(&m)
	return n, nil
}

// PortCounters count what a port did.
type PortCounters struct {
	Sent       atomic.Uint64 // frames taken by SendBatch
	Received   atomic.Uint64 // frames returned by RecvBatch
	NoRoute    atomic.Uint64 // no device at the destination address (and port 4791 in ModeUDP; dropped)
	Malformed  atomic.Uint64 // not an IPv4/IPv6 UDP frame with a BTH, or in ModeUDP shorter than a BTH (dropped)
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
	udp   bool           // the network's mode is roce.ModeUDP
	local netip.AddrPort // the device's address, port 4791: the sender of its UDP payloads
	index int
	q     *portQueue // received frames
	ready chan struct{}
	f     *faultState

	// Owner's cache of the last route (a QP's frames all go one way):
	// valid while the routing table is the one it was read from.
	lastTable *map[netip.Addr][]*Port
	lastDst   netip.Addr
	lastPorts []*Port

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
	local := netip.AddrPortFrom(addr, roce.UDPPort)
	n.mu.Lock()
	defer n.mu.Unlock()
	old := *n.routes.Load()
	if _, ok := old[addr]; ok {
		return nil, fmt.Errorf("%w: %v", ErrExists, addr)
	}
	ports := make([]*Port, workers)
	for i := range ports {
		p := &Port{net: n, udp: n.cfg.Mode == roce.ModeUDP, local: local, index: i,
			q: newPortQueue(n.cfg.QueueLen), ready: make(chan struct{}, 1)}
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

// LocalAddr returns the device's address with port 4791: in ModeUDP the
// source of everything the port sends and the destination it receives
// on (what an engine in roce.ModeUDP takes as its local address).
func (p *Port) LocalAddr() netip.AddrPort { return p.local }

// route finds the destination port of frames[i]: by destination IP (of
// the IP header, or in ModeUDP of peers[i]), then by the BTH destination
// QP. ok is false for frames that cannot be routed (counted).
func (p *Port) route(frames [][]byte, peers []netip.AddrPort, i int) (*Port, bool) {
	if p.udp {
		return p.routeUDP(frames[i], peers[i])
	}
	frame := frames[i]
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
	ports := p.lookup(dst)
	if ports == nil {
		p.Counters.NoRoute.Add(1)
		return nil, false
	}
	bth := roce.BTH(ip[ihl+roce.UDPHeaderLen:])
	return ports[roce.SteerQueue(bth.DestQP(), len(ports))], true
}

// routeUDP is route in ModeUDP: payload (BTH on) goes to the device at
// to, which must be on port 4791, to the port owning its BTH destination
// QP.
func (p *Port) routeUDP(payload []byte, to netip.AddrPort) (*Port, bool) {
	if len(payload) < roce.BTHLen {
		p.Counters.Malformed.Add(1)
		return nil, false
	}
	var ports []*Port
	if to.Port() == roce.UDPPort {
		ports = p.lookup(to.Addr().Unmap())
	}
	if ports == nil {
		p.Counters.NoRoute.Add(1)
		return nil, false
	}
	return ports[roce.SteerQueue(roce.BTH(payload).DestQP(), len(ports))], true
}

// from is the sender recorded beside the frames the port delivers: its
// address and port in ModeUDP, nothing for Ethernet frames (which carry
// it).
func (p *Port) from() netip.AddrPort {
	if p.udp {
		return p.local
	}
	return netip.AddrPort{}
}

// lookup returns the ports of the device at dst, nil if none.
func (p *Port) lookup(dst netip.Addr) []*Port {
	t := p.net.routes.Load()
	if t == p.lastTable && dst == p.lastDst {
		return p.lastPorts
	}
	ports := (*t)[dst]
	p.lastTable, p.lastDst, p.lastPorts = t, dst, ports
	return ports
}

// deliverOwned moves buf (an empty buffer of the network's, now holding a
// frame), sent by from, to dst's queue; false when the queue is full (buf
// stays the caller's).
func (dst *Port) deliverOwned(buf []byte, from netip.AddrPort) bool {
	displaced, ok := dst.q.pushOwned(buf, from)
	if !ok {
		return false
	}
	if displaced != nil {
		dst.net.pool.push(displaced[:cap(displaced)], netip.AddrPort{})
	}
	dst.signal()
	return true
}

// deliver copies frame, sent by from, to dst's queue; false when the
// queue is full or no empty buffer is to be had.
func (dst *Port) deliver(frame []byte, from netip.AddrPort) bool {
	for reclaimed := false; ; reclaimed = true {
		dst.q.mu.Lock()
		ok, full := dst.q.pushLocked(&frame, from, dst.net.pool, false)
		dst.q.mu.Unlock()
		if ok {
			dst.signal()
			return true
		}
		if full || reclaimed {
			return false
		}
		dst.net.reclaim()
	}
}

func (dst *Port) signal() {
	select {
	case dst.ready <- struct{}{}:
	default:
	}
}

// SendBatch implements the engine's Link: in ModeUDP frames[i] goes to
// peers[i] (len(peers) >= len(frames)); Ethernet frames go where their IP
// header says (peers is not read and may be nil). A perfect port queues
// the batch with one lock per run of frames to the same receiver, using
// the empty buffers the receiver parked in its queue (the pool's while it
// has none): a short frame is copied into one, and the sender keeps its
// buffer, still in its cache, for its next frames (building them in the
// receiver's buffers instead made the sender wait for each of their cache
// lines, about a third of its time for 8-byte WRITEs); a longer one moves
// and the sender gets the empty buffer in its slot (see copyMax).
func (p *Port) SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	if p.udp && len(peers) < len(frames) {
		return 0, fmt.Errorf("%w: %d frames, %d peers", ErrInvalid, len(frames), len(peers))
	}
	from := p.from()
	if p.f != nil {
		p.releaseHeld(false)
		for i := range frames {
			dst, ok := p.route(frames, peers, i)
			if !ok {
				p.Counters.Sent.Add(1)
				continue // dropped
			}
			if !p.sendFaulty(dst, frames[i], from) {
				return i, nil
			}
			p.Counters.Sent.Add(1)
		}
		return len(frames), nil
	}
	var cur *Port // receiver whose queue lock is held
	pushed := false
	reclaimed := false
	i := 0
	for i < len(frames) {
		dst, ok := p.route(frames, peers, i)
		if !ok {
			i++
			continue // dropped (counted)
		}
		if dst != cur {
			if cur != nil {
				cur.q.mu.Unlock()
				if pushed {
					cur.signal()
				}
			}
			cur, pushed = dst, false
			cur.q.mu.Lock()
		}
		ok, full := cur.q.pushLocked(&frames[i], from, p.net.pool, true)
		if !ok {
			if full || reclaimed {
				break // receiver full, or no empty buffer: backpressure
			}
			// Other ports' queues may have the empty buffers parked:
			// back to the pool with them (no queue lock held), then
			// this frame again.
			cur.q.mu.Unlock()
			if pushed {
				cur.signal()
			}
			cur, pushed = nil, false
			p.net.reclaim()
			reclaimed = true
			continue
		}
		pushed = true
		i++
	}
	if cur != nil {
		cur.q.mu.Unlock()
		if pushed {
			cur.signal()
		}
	}
	// Counted once a batch (an atomic add waits for the stores before it).
	p.Counters.Sent.Add(uint64(i))
	return i, nil
}

// RecvBatch implements the engine's Link: one lock of the receive queue
// per batch; the caller's empty buffers stay parked in the queue. In
// ModeUDP peers[i] gets the sender of frames[i] (len(peers) >=
// len(frames)); for Ethernet frames peers is not written and may be nil.
func (p *Port) RecvBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	if p.f != nil {
		p.releaseHeld(false)
	}
	var froms []netip.AddrPort
	if p.udp {
		if len(peers) < len(frames) {
			return 0, fmt.Errorf("%w: %d frames, %d peers", ErrInvalid, len(frames), len(peers))
		}
		froms = peers
	}
	k := p.q.exchange(frames, froms)
	if k > 0 {
		p.Counters.Received.Add(uint64(k))
	}
	return k, nil
}

// Mode returns what the network carries (Config.Mode).
func (n *Network) Mode() roce.Mode { return n.cfg.Mode }

// FreeBuffers returns the number of empty buffers in the pool and parked
// in the ports' queues.
func (n *Network) FreeBuffers() int {
	k := n.pool.length()
	for _, ports := range *n.routes.Load() {
		for _, p := range ports {
			k += p.q.parked()
		}
	}
	return k
}

// reclaim moves the empty buffers parked in every port's queue to the
// pool. A sender that found none in its receiver's queue nor in the pool
// takes them back from ports that no longer receive (rare: a queue parks
// at most its length).
func (n *Network) reclaim() {
	var bs [][]byte
	for _, ports := range *n.routes.Load() {
		for _, p := range ports {
			bs = p.q.drainParked(bs)
		}
	}
	if len(bs) > 0 {
		n.pool.pushAll(bs)
	}
}

// Queued returns the number of frames waiting in the port's receive queue.
func (p *Port) Queued() int { return p.q.length() }

// Held returns the number of frames a lossy port holds back.
func (p *Port) Held() int {
	if p.f == nil {
		return 0
	}
	return len(p.f.held)
}
