package tap

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// ErrUnresolved reports a peer whose link-layer address could not be
// resolved: it did not answer any ARP request or neighbour solicitation.
var ErrUnresolved = errors.New("tap: peer address unresolved")

// ErrClosed reports use of a closed Device or Neighbors.
var ErrClosed = errors.New("tap: closed")

// NeighborConfig sets the NIC's ARP/ND timing. Zero fields take defaults.
type NeighborConfig struct {
	// RetryInterval is the wait after the first request; each further
	// wait doubles (default 100ms).
	RetryInterval time.Duration
	// Attempts is the number of requests before ErrUnresolved (default 4,
	// so 100+200+400+800 ms = 1.5 s with the default interval).
	Attempts int
	// Expiry is how long a resolved entry is used (default 30s), then it
	// is resolved again.
	Expiry time.Duration
	// MaxEntries bounds the cache (default 4096); entries learnt from
	// peers' requests are not added when it is full of live entries.
	MaxEntries int
}

func (c *NeighborConfig) setDefaults() {
	if c.RetryInterval <= 0 {
		c.RetryInterval = 100 * time.Millisecond
	}
	if c.Attempts <= 0 {
		c.Attempts = 4
	}
	if c.Expiry <= 0 {
		c.Expiry = 30 * time.Second
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = 4096
	}
}

// Timeout returns how long Resolve waits at most for a silent peer.
func (c NeighborConfig) Timeout() time.Duration {
	c.setDefaults()
	var d time.Duration
	for i := range c.Attempts {
		d += c.RetryInterval << i
	}
	return d
}

// NeighborStats counts ARP/ND activity.
type NeighborStats struct {
	ARPRequestsIn, ARPRepliesOut, ARPRequestsOut, ARPRepliesIn uint64
	NSIn, NAOut, NSOut, NAIn                                   uint64
	Malformed, Ignored, Unresolved                             uint64
}

type neighEntry struct {
	mac      MAC
	valid    bool // mac is known
	expires  time.Time
	lastSent time.Time
	done     chan struct{} // closed when a pending resolution completes
	waiters  int           // Resolve calls using the entry
}

// Neighbors is the NIC's ARP and IPv6 neighbour discovery, as NIC firmware
// does it: it answers ARP requests and neighbour solicitations for the
// device's own addresses, resolves peers' MAC addresses (request, retries
// with doubling waits, ErrUnresolved, never a hang), caches them with an
// expiry, and learns from requests addressed to it and from replies.
//
// It starts no goroutine: frames come in through HandleFrame (called by
// the worker reading queue 0) and go out through the send function.
type Neighbors struct {
	cfg   NeighborConfig
	mac   MAC
	addr4 []netip.Addr // device IPv4 addresses
	addr6 []netip.Addr // device IPv6 addresses
	send  func(frame []byte) error

	mu      sync.RWMutex
	cache   map[netip.Addr]*neighEntry
	stats   NeighborStats
	closed  bool
	closing chan struct{}
}

// NewNeighbors returns the ARP/ND engine of a NIC with the given MAC and
// addresses; send writes one Ethernet frame to the link (it must not
// retain the slice).
func NewNeighbors(mac MAC, addrs []netip.Addr, cfg NeighborConfig, send func(frame []byte) error) *Neighbors {
	cfg.setDefaults()
	n := &Neighbors{cfg: cfg, mac: mac, send: send, cache: map[netip.Addr]*neighEntry{}, closing: make(chan struct{})}
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if a.Is4() {
			n.addr4 = append(n.addr4, a)
		} else if a.Is6() {
			n.addr6 = append(n.addr6, a)
		}
	}
	return n
}

// Close makes pending and future Resolve calls return ErrClosed.
func (n *Neighbors) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.closed {
		n.closed = true
		close(n.closing)
	}
}

// Stats returns a snapshot of the counters.
func (n *Neighbors) Stats() NeighborStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

func (n *Neighbors) isOurs(a netip.Addr) bool {
	list := n.addr6
	if a.Is4() {
		list = n.addr4
	}
	for _, x := range list {
		if x == a {
			return true
		}
	}
	return false
}

// Lookup returns the cached MAC of ip if it is resolved and not expired.
// It never sends and never allocates.
//
// One of the device's own addresses is its own MAC: a QP may address
// another QP of the same device, as on any RNIC, and the link delivers
// frames to its own MAC itself (link.TAPPort).
func (n *Neighbors) Lookup(ip netip.Addr) (MAC, bool) {
	ip = ip.Unmap()
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.isOurs(ip.WithZone("")) {
		return n.mac, true
	}
	e := n.cache[ip]
	if e == nil || !e.valid || time.Now().After(e.expires) {
		return MAC{}, false
	}
	return e.mac, true
}

// Resolve returns the MAC of the on-link peer ip, from the cache or by
// sending ARP requests (IPv4) or neighbour solicitations (IPv6) until it
// answers. A peer silent after cfg.Attempts requests gives ErrUnresolved;
// ctx can end the wait sooner. Concurrent calls for one peer share the
// requests; an entry nobody resolved is removed when its last caller
// gives up, so unanswered peers do not accumulate.
func (n *Neighbors) Resolve(ctx context.Context, ip netip.Addr) (MAC, error) {
	ip = ip.Unmap().WithZone("")
	if !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() {
		return MAC{}, fmt.Errorf("%w: cannot resolve %v", ErrConfig, ip)
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return MAC{}, fmt.Errorf("tap: resolve %v: %w", ip, ErrClosed)
	}
	if n.isOurs(ip) {
		n.mu.Unlock()
		return n.mac, nil // our own: no request (Lookup)
	}
	e := n.cache[ip]
	if e != nil && e.valid && time.Now().Before(e.expires) {
		n.mu.Unlock()
		return e.mac, nil
	}
	if e == nil {
		e = &neighEntry{}
		n.cache[ip] = e
	}
	e.waiters++
	n.mu.Unlock()
	defer n.leave(ip, e)

	wait := n.cfg.RetryInterval
	for attempt := 0; attempt < n.cfg.Attempts; attempt++ {
		done, mac, resolved, err := n.request(ip, e, wait)
		if err != nil || resolved {
			return mac, err
		}
		t := time.NewTimer(wait)
		select {
		case <-done:
			t.Stop()
			n.mu.RLock()
			mac, ok := e.mac, e.valid
			n.mu.RUnlock()
			if ok {
				return mac, nil
			}
			continue
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return MAC{}, fmt.Errorf("tap: resolve %v: %w", ip, ctx.Err())
		case <-n.closing:
			t.Stop()
			return MAC{}, fmt.Errorf("tap: resolve %v: %w", ip, ErrClosed)
		}
		wait *= 2
	}
	if mac, ok := n.Lookup(ip); ok {
		return mac, nil
	}
	n.mu.Lock()
	n.stats.Unresolved++
	n.mu.Unlock()
	return MAC{}, fmt.Errorf("%w: %v did not answer %d requests in %v", ErrUnresolved, ip, n.cfg.Attempts, n.cfg.Timeout())
}

// leave drops a Resolve caller from e; the last one removes an entry that
// never resolved.
func (n *Neighbors) leave(ip netip.Addr, e *neighEntry) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e.waiters--
	if e.waiters == 0 && !e.valid && n.cache[ip] == e {
		delete(n.cache, ip)
	}
}

// request returns the MAC if e is resolved, or the channel closed when it
// is, sending a request unless one went out less than half a wait ago.
func (n *Neighbors) request(ip netip.Addr, e *neighEntry, wait time.Duration) (done <-chan struct{}, mac MAC, resolved bool, err error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, MAC{}, false, fmt.Errorf("tap: resolve %v: %w", ip, ErrClosed)
	}
	now := time.Now()
	if e.valid && now.Before(e.expires) {
		n.mu.Unlock()
		return nil, e.mac, true, nil
	}
	if e.done == nil {
		e.done = make(chan struct{})
	}
	done = e.done
	if now.Sub(e.lastSent) < wait/2 {
		n.mu.Unlock()
		return done, MAC{}, false, nil
	}
	e.lastSent = now
	frame, err := n.buildRequest(ip)
	if err == nil {
		if ip.Is4() {
			n.stats.ARPRequestsOut++
		} else {
			n.stats.NSOut++
		}
	}
	n.mu.Unlock()
	if err != nil {
		return nil, MAC{}, false, err
	}
	if err := n.send(frame); err != nil {
		return nil, MAC{}, false, fmt.Errorf("tap: send neighbour request for %v: %w", ip, err)
	}
	return done, MAC{}, false, nil
}

// buildRequest returns an ARP request or a neighbour solicitation for ip
// from the device's first address of the same family.
func (n *Neighbors) buildRequest(ip netip.Addr) ([]byte, error) {
	b := make([]byte, 0, 128)
	if ip.Is4() {
		if len(n.addr4) == 0 {
			return nil, fmt.Errorf("%w: no IPv4 address to resolve %v from", ErrConfig, ip)
		}
		b = appendEth(b, ethHeader{dst: broadcastMAC, src: n.mac, etherType: etherTypeARP})
		return appendARP(b, arpPacket{op: 1, sha: n.mac, spa: n.addr4[0], tpa: ip}), nil
	}
	if len(n.addr6) == 0 {
		return nil, fmt.Errorf("%w: no IPv6 address to resolve %v from", ErrConfig, ip)
	}
	group, gmac := solicitedNode(ip)
	b = appendEth(b, ethHeader{dst: gmac, src: n.mac, etherType: etherTypeIPv6})
	return appendND(b, ndMessage{typ: icmpNS, src: n.addr6[0], dst: group, target: ip, ll: n.mac, hasLL: true}), nil
}

// learn records ip at mac. create adds an entry for a peer not being
// resolved (learning from a request addressed to the device, as Linux
// does); otherwise only existing entries are updated.
func (n *Neighbors) learn(ip netip.Addr, mac MAC, create bool) {
	if !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() || mac[0]&1 != 0 {
		return
	}
	now := time.Now()
	e := n.cache[ip]
	if e == nil {
		if !create {
			n.stats.Ignored++
			return
		}
		if len(n.cache) >= n.cfg.MaxEntries {
			for k, x := range n.cache {
				if x.waiters == 0 && now.After(x.expires) {
					delete(n.cache, k)
				}
			}
			if len(n.cache) >= n.cfg.MaxEntries {
				return
			}
		}
		e = &neighEntry{}
		n.cache[ip] = e
	}
	e.mac, e.valid, e.expires = mac, true, now.Add(n.cfg.Expiry)
	if e.done != nil {
		close(e.done)
		e.done = nil
	}
}

// HandleFrame processes a received ARP or neighbour discovery frame:
// learns, and answers requests for the device's addresses through send.
// It returns whether the frame was ARP/ND (false: give it to someone
// else). Malformed frames are counted and dropped, never trusted.
func (n *Neighbors) HandleFrame(frame []byte) bool {
	eth, err := parseEth(frame)
	if err != nil {
		return false
	}
	switch eth.etherType {
	case etherTypeARP:
		n.handleARP(eth, frame[eth.hlen:])
		return true
	case etherTypeIPv6:
		ip := frame[eth.hlen:]
		if len(ip) < ipv6HLen+1 || ip[6] != protoICMPv6 ||
			(ip[ipv6HLen] != icmpNS && ip[ipv6HLen] != icmpNA) {
			return false
		}
		n.handleND(eth, ip)
		return true
	}
	return false
}

func (n *Neighbors) handleARP(eth ethHeader, b []byte) {
	p, err := parseARP(b)
	n.mu.Lock()
	if err != nil {
		n.stats.Malformed++
		n.mu.Unlock()
		return
	}
	var reply []byte
	switch {
	case p.op == 1 && n.isOurs(p.tpa):
		n.stats.ARPRequestsIn++
		n.learn(p.spa, p.sha, true) // skips an ARP probe's 0.0.0.0
		n.stats.ARPRepliesOut++
		reply = appendEth(make([]byte, 0, 64), ethHeader{dst: p.sha, src: n.mac, vlan: eth.vlan, tci: eth.tci, etherType: etherTypeARP})
		reply = appendARP(reply, arpPacket{op: 2, sha: n.mac, spa: p.tpa, tha: p.sha, tpa: p.spa})
	case p.op == 2:
		n.stats.ARPRepliesIn++
		n.learn(p.spa, p.sha, false)
	default:
		n.stats.Ignored++
	}
	n.mu.Unlock()
	if reply != nil {
		_ = n.send(reply) // a lost reply is recovered by the peer's retry
	}
}

func (n *Neighbors) handleND(eth ethHeader, b []byte) {
	m, err := parseND(b)
	n.mu.Lock()
	if err != nil {
		n.stats.Malformed++
		n.mu.Unlock()
		return
	}
	var reply []byte
	switch m.typ {
	case icmpNS:
		if !n.isOurs(m.target) {
			n.stats.Ignored++
			break
		}
		n.stats.NSIn++
		dad := m.src.IsUnspecified()
		if m.hasLL && !dad {
			n.learn(m.src, m.ll, true)
		}
		na := ndMessage{typ: icmpNA, src: m.target, dst: m.src, target: m.target, flags: naFlagSolicit | naFlagOverr, ll: n.mac, hasLL: true}
		dstMAC := eth.src
		if m.hasLL {
			dstMAC = m.ll
		}
		if dad { // RFC 4861 7.2.4: answer a DAD probe to all-nodes
			na.dst, na.flags = netip.MustParseAddr("ff02::1"), naFlagOverr
			dstMAC = MAC{0x33, 0x33, 0, 0, 0, 1}
		}
		n.stats.NAOut++
		reply = appendEth(make([]byte, 0, 96), ethHeader{dst: dstMAC, src: n.mac, vlan: eth.vlan, tci: eth.tci, etherType: etherTypeIPv6})
		reply = appendND(reply, na)
	case icmpNA:
		n.stats.NAIn++
		if m.hasLL {
			n.learn(m.target, m.ll, false)
		} else {
			n.stats.Ignored++
		}
	}
	n.mu.Unlock()
	if reply != nil {
		_ = n.send(reply)
	}
}
