package engine

import (
	"fmt"
	"net/netip"

	"github.com/vrnic/vrnic/roce"
)

// Address handles (UD).
//
// A UD WQE names its destination by an address handle of the QP's
// context (ah_handle, IBTA 10.2.2.2 / 11.2.2 "Address Handle"). The
// control path creates and destroys AHs; the worker that sends the WQE
// resolves the handle without a lock in the context's AHTable
// (ahtable.go), and an AH is immutable once built (NewAH). The worker
// keeps the *AH of a WQE it fetched, so a DESTROY_AH racing with the
// WQE's send is harmless (the IBTA leaves that case undefined; here the
// WQE goes to the address the AH had).

// AHAttr is an address vector as the control path validated it.
type AHAttr struct {
	// PD is the AH's protection domain handle; a WQE may use it only on
	// a QP of the same PD.
	PD uint32
	// Local is the source GID (the device's address at the AV's
	// sgid_index), Remote the destination GID; IPv4-mapped GIDs as IPv4.
	Local, Remote netip.Addr
	FlowLabel     uint32 // IPv6 flow label: the low 20 bits (the AV's u32 as given)
	TrafficClass  uint8  // IPv4 TOS / IPv6 traffic class
	HopLimit      uint8  // IPv4 TTL / IPv6 hop limit; 0 means 64
	SL            uint8  // service level (RoCE: no VLAN, so not on the wire)
}

// AH is a resolved address handle: the path (less the QP's own UDP source
// port) and the peer beside frames in ModeUDP. Immutable.
type AH struct {
	attr AHAttr
	path roce.Path
	peer netip.AddrPort
}

// Attr returns the attributes the AH was built from.
func (a *AH) Attr() AHAttr { return a.attr }

// NewAH builds an address handle for the engine's links: the path UD
// WQEs naming it are sent on (Ethernet, IP and UDP headers, or the peer of
// ModeUDP), fixed up by Config.PathFixup (the TAP link writes the
// destination MAC from its neighbour cache: resolve the peer before). In
// ModeUDP the kernel builds the IP header: the hop limit, traffic class
// and flow label are not used there.
func (e *Engine) NewAH(a AHAttr) (*AH, error) {
	if !a.Local.IsValid() || !a.Remote.IsValid() || a.Local.Unmap().Is4() != a.Remote.Unmap().Is4() {
		return nil, fmt.Errorf("%w: address vector %v -> %v", ErrInvalid, a.Local, a.Remote)
	}
	ttl := a.HopLimit
	if ttl == 0 {
		ttl = 64
	}
	ah := &AH{attr: a}
	cfg := &e.cfg
	// The AV keeps the caller's u32 flow label (rdma_ah_set_grh stores it
	// as is); the IPv6 header takes the low 20 bits, as Linux's
	// ip6_flow_hdr (IPV6_FLOWLABEL_MASK) does.
	ah.path = roce.Path{
		Mode:         cfg.Mode,
		SrcMAC:       cfg.MAC,
		Src:          a.Local,
		Dst:          a.Remote,
		TTL:          ttl,
		TOS:          a.TrafficClass,
		FlowLabel:    a.FlowLabel & 0xfffff,
		DontFragment: true,
	}
	ah.peer = pathPeer(&ah.path, cfg)
	return ah, nil
}

// pathPeer completes a path for the engine's mode (ModeUDP: the links'
// source address and port, destination port 4791), applies PathFixup and
// returns the destination beside the path's frames.
func pathPeer(p *roce.Path, cfg *Config) netip.AddrPort {
	if cfg.Mode == roce.ModeUDP {
		p.Src, p.SrcPort = cfg.Local.Addr(), cfg.Local.Port()
		p.DstPort = roce.UDPPort
	}
	if f := cfg.PathFixup; f != nil {
		f(p)
	}
	return peerOf(p)
}

// peerOf is the destination beside the frames of path p, once pathPeer
// set it up: the QP keeps no copy (it depends on p.Dst and p.DstPort only,
// which useAH copies from the AH's path).
func peerOf(p *roce.Path) netip.AddrPort {
	port := p.DstPort
	if port == 0 {
		port = roce.UDPPort
	}
	return netip.AddrPortFrom(p.Dst.Unmap(), port)
}
