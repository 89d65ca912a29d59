package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/ebpf"
	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/tap"
)

// validate checks the TAP link's configuration (without touching the
// system).
func (c *TAPConfig) validate() error {
	if len(c.Addrs) == 0 {
		return errors.New("link tap needs at least one -tap-addr (address/prefix, e.g. 10.77.0.1/24)")
	}
	if _, err := c.routes(); err != nil {
		return err
	}
	if c.MAC != "" {
		if _, err := c.mac(); err != nil {
			return err
		}
	}
	if len(c.Name) >= 16 || strings.ContainsAny(c.Name, "/ %") {
		return fmt.Errorf("tap-name %q: not a valid interface name", c.Name)
	}
	if strings.ContainsAny(c.NetNS, "/\x00") {
		return fmt.Errorf("tap-netns %q: not a namespace name", c.NetNS)
	}
	if c.MTU != 0 && (c.MTU < 1280 || c.MTU > tap.DefaultMTU) {
		return fmt.Errorf("tap-mtu %d: want 1280..%d", c.MTU, tap.DefaultMTU)
	}
	return nil
}

// prefixes parses Addrs.
func (c *TAPConfig) prefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.Addrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("tap-addr %q: want address/prefix: %w", s, err)
		}
		a := p.Addr()
		if a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.Is4In6() {
			return nil, fmt.Errorf("tap-addr %q: want a unicast IPv4 or IPv6 address", s)
		}
		out = append(out, p)
	}
	if len(out) > 16 {
		return nil, fmt.Errorf("%d tap addresses: the GID table holds 16", len(out))
	}
	return out, nil
}

// routes is the TAP NIC's routing table, as NIC firmware keeps one: its
// on-link prefixes and a default gateway per address family (zero Addr:
// none).
type routes struct {
	prefixes []netip.Prefix
	gw4, gw6 netip.Addr
}

// routes parses Addrs and Gateways: each gateway is a unicast address on
// one of the prefixes of its family, at most one per family.
func (c *TAPConfig) routes() (routes, error) {
	prefixes, err := c.prefixes()
	if err != nil {
		return routes{}, err
	}
	r := routes{prefixes: prefixes}
	for _, s := range c.Gateways {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return routes{}, fmt.Errorf("tap-gateway %q: want an IP address: %w", s, err)
		}
		if a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.Is4In6() {
			return routes{}, fmt.Errorf("tap-gateway %q: want a unicast IPv4 or IPv6 address", s)
		}
		gw := &r.gw6
		if a.Is4() {
			gw = &r.gw4
		}
		if gw.IsValid() {
			return routes{}, fmt.Errorf("tap-gateway %q: a second gateway for the family of %v", s, *gw)
		}
		if !r.onLink(a) {
			return routes{}, fmt.Errorf("tap-gateway %q: not on any -tap-addr prefix %v (a gateway must be on the link)", s, prefixes)
		}
		if slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Addr() == a }) {
			return routes{}, fmt.Errorf("tap-gateway %q: the NIC's own address", s)
		}
		*gw = a
	}
	return r, nil
}

// onLink reports whether a is on one of the prefixes.
func (r *routes) onLink(a netip.Addr) bool {
	for _, p := range r.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// nextHop returns the address whose MAC frames to dst carry: dst itself
// on the link, else the gateway of its family; false when there is none.
// It never allocates (PathFixup calls it).
func (r *routes) nextHop(dst netip.Addr) (netip.Addr, bool) {
	dst = dst.Unmap()
	if r.onLink(dst) {
		return dst, true
	}
	gw := r.gw6
	if dst.Is4() {
		gw = r.gw4
	}
	return gw, gw.IsValid()
}

// mac parses MAC: a unicast Ethernet address.
func (c *TAPConfig) mac() ([6]byte, error) {
	hw, err := net.ParseMAC(c.MAC)
	if err != nil || len(hw) != 6 {
		return [6]byte{}, fmt.Errorf("tap-mac %q: want an Ethernet address aa:bb:cc:dd:ee:ff", c.MAC)
	}
	if hw[0]&1 != 0 {
		return [6]byte{}, fmt.Errorf("tap-mac %q: a multicast address", c.MAC)
	}
	return [6]byte(hw), nil
}

// tapIfName is the interface name: -tap-name, else the device name when it
// is a valid interface name, else empty (the kernel picks tapN).
func (c *Config) tapIfName() string {
	if c.Link.TAP.Name != "" {
		return c.Link.TAP.Name
	}
	if len(c.Name) < 16 && !strings.ContainsAny(c.Name, "/ %:") {
		return c.Name
	}
	return ""
}

// tapLink is the daemon's TAP link: the device with its queues (owned by
// the link), the eBPF programs, and what the engine and the data plane
// need from it.
type tapLink struct {
	link   *link.TAPLink
	progs  *ebpf.Programs
	dev    *tap.Device
	routes routes
	log    *slog.Logger
	// steerBase is the steering counters after the start-up
	// verification, subtracted from what Stats reports.
	steerBase ebpf.SteerStats
}

// openTAP creates the multi-queue TAP device (one queue per worker),
// loads and attaches the steering and filter programs, optionally
// verifies the steering, and attaches the link. Needs CAP_NET_ADMIN and
// CAP_BPF (root). Nothing stays on error.
func openTAP(cfg *Config, mac [6]byte, workers, frameCap int, log *slog.Logger) (_ *tapLink, err error) {
	tc := &cfg.Link.TAP
	rt, err := tc.routes()
	if err != nil {
		return nil, err
	}
	addrs := make([]netip.Addr, len(rt.prefixes))
	for i, p := range rt.prefixes {
		addrs[i] = p.Addr()
	}
	var ns netns.NsHandle
	if tc.NetNS != "" {
		if ns, err = netns.GetFromName(tc.NetNS); err != nil {
			return nil, fmt.Errorf("tap-netns %q: %w (create it with: ip netns add %s)", tc.NetNS, err, tc.NetNS)
		}
		defer ns.Close()
	}
	dev, err := tap.Create(tap.Config{Name: cfg.tapIfName(), Queues: workers, MAC: tap.MAC(mac), Addrs: addrs, NetNS: ns,
		MTU: tc.mtu()})
	if err != nil {
		return nil, fmt.Errorf("%w (the TAP link needs CAP_NET_ADMIN: run vrnicd as root)", err)
	}
	defer func() {
		if err != nil {
			dev.Close()
		}
	}()
	if err := setTxQueueLen(ns, dev.Index(), tapTxQueueLen); err != nil {
		return nil, err
	}
	progs, err := ebpf.Load(workers)
	if err != nil {
		return nil, fmt.Errorf("%w (the TAP link's steering needs CAP_BPF: run vrnicd as root)", err)
	}
	defer func() {
		if err != nil {
			progs.Close()
		}
	}()
	if err := progs.SetAddrs(addrs); err != nil {
		return nil, err
	}
	if err := dev.Control(progs.Attach); err != nil {
		return nil, err
	}
	t := &tapLink{progs: progs, dev: dev, routes: rt, log: log}
	if tc.VerifySteering {
		qpns := make([]uint32, 0, 4096)
		for q := uint32(1); q <= 4096; q++ {
			qpns = append(qpns, q)
		}
		if err := progs.VerifySteering(qpns); err != nil {
			return nil, err
		}
		if t.steerBase, err = progs.SteerStats(); err != nil {
			return nil, err
		}
		log.Info("tap: steering verified", "qpns", len(qpns), "queues", workers)
	}
	if t.link, err = link.NewTAP(dev, link.TAPConfig{FrameCap: frameCap, Logger: log}); err != nil {
		return nil, err
	}
	log.Info("tap link ready", "interface", dev.Name(), "netns", tc.NetNS, "mac", dev.MAC().String(), "addrs", tc.Addrs, "gateways", tc.Gateways, "queues", workers)
	return t, nil
}

// tapTxQueueLen is the length of each TAP queue (frames the kernel keeps
// for the daemon to read; the tun driver's default is 500). A burst of a
// full send window (512 frames per QP) from several QPs fits without
// drops while a worker is busy.
const tapTxQueueLen = 4096

// setTxQueueLen sets the queue length of interface index in namespace ns
// (0: the current one).
func setTxQueueLen(ns netns.NsHandle, index, n int) error {
	var (
		h   *netlink.Handle
		err error
	)
	if ns == 0 {
		h, err = netlink.NewHandle()
	} else {
		h, err = netlink.NewHandleAt(ns)
	}
	if err != nil {
		return fmt.Errorf("tap: netlink: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByIndex(index)
	if err != nil {
		return fmt.Errorf("tap: find interface %d: %w", index, err)
	}
	if err := h.LinkSetTxQLen(l, n); err != nil {
		return fmt.Errorf("tap: set queue length of %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// frameCapFor returns the buffer size for a TAP device of the default MTU:
// the engine's default or the largest frame the device delivers.
func frameCapFor() int {
	return max(engine.DefaultFrameCap, tap.DefaultMTU+18)
}

// links returns the engine's links, port i for worker i.
func (t *tapLink) links() []engine.Link {
	out := make([]engine.Link, 0, len(t.link.Ports()))
	for _, p := range t.link.Ports() {
		out = append(out, p)
	}
	return out
}

// fixPath is the engine's PathFixup: source MAC is the NIC's, the
// destination MAC the next hop's (the peer's on the link, else the
// gateway's) from the neighbour cache (resolved on the control path when
// the QP went to RTR; nextHop and Lookup never wait and never allocate).
// A next hop missing from the cache keeps the engine's default (broadcast
// would flood the bridge; a zero MAC is dropped by it). The IP addresses
// stay the peer's: a router forwards the frame on.
func (t *tapLink) fixPath(p *roce.Path) {
	p.SrcMAC = t.dev.MAC()
	hop, ok := t.routes.nextHop(p.Dst)
	if !ok {
		return
	}
	if mac, ok := t.dev.Neighbors().Lookup(hop); ok {
		p.DstMAC = mac
	}
}

// resolve is the data plane's Resolve hook: the peer's next hop (the
// peer on one of the NIC's prefixes, else the gateway of its family)
// must answer ARP or neighbour discovery.
func (t *tapLink) resolve(ctx context.Context, peer netip.Addr) error {
	peer = peer.Unmap()
	hop, ok := t.routes.nextHop(peer)
	if !ok {
		return fmt.Errorf("%v is not on the link (prefixes %v) and there is no IPv%d -tap-gateway", peer, t.routes.prefixes, map[bool]int{true: 4, false: 6}[peer.Is4()])
	}
	if hop != peer {
		if _, err := t.dev.Neighbors().Resolve(ctx, hop); err != nil {
			return fmt.Errorf("gateway %v of %v: %w", hop, peer, err)
		}
		return nil
	}
	_, err := t.dev.Neighbors().Resolve(ctx, peer)
	return err
}

// close closes the link (and the device, detaching the programs with it),
// then the programs' maps.
func (t *tapLink) close() error {
	return errors.Join(t.link.Close(), t.progs.Close())
}

// stats reads the counters (steering counters net of the start-up
// verification runs).
func (t *tapLink) stats() (admin.LinkStats, error) {
	st := admin.LinkStats{Link: "tap", Interface: t.dev.Name(), MAC: t.dev.MAC().String(), Offload: t.link.Offload(), Filter: map[string]uint64{}, Neighbors: counterMap(t.dev.Neighbors().Stats())}
	ss, err := t.progs.SteerStats()
	if err != nil {
		return admin.LinkStats{}, err
	}
	fs, err := t.progs.FilterStats()
	if err != nil {
		return admin.LinkStats{}, err
	}
	for i, q := range t.link.Stats() {
		s := ss.Steered[i]
		if i < len(t.steerBase.Steered) {
			s -= t.steerBase.Steered[i]
		}
		st.Queues = append(st.Queues, admin.QueueStats{Steered: s, TAPQueueStats: q})
	}
	st.SteerNonRoCE = ss.NonRoCE - t.steerBase.NonRoCE
	for r, c := range fs {
		st.Filter[ebpf.FilterReason(r).String()] = c
	}
	st.FilterDropped = fs.Dropped()
	return st, nil
}

// counterMap returns the uint64 fields of the struct v by field name (the
// neighbour counters as the stats JSON names them).
func counterMap(v any) map[string]uint64 {
	rv := reflect.ValueOf(v)
	m := make(map[string]uint64, rv.NumField())
	for i := range rv.NumField() {
		if f := rv.Field(i); f.Kind() == reflect.Uint64 {
			m[rv.Type().Field(i).Name] = f.Uint()
		}
	}
	return m
}
