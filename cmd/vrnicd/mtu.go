package main

import (
	"net"
	"net/netip"

	"github.com/vrnic/vrnic/tap"
)

// The port's active MTU comes from the link, as Soft-RoCE derives its own
// from its net device (rxe_set_mtu, eth_mtu_int_to_enum): the largest IB
// path MTU whose packets, with the longest RoCE v2 headers, fit the
// link's MTU. A 1500-byte Ethernet link gives 1024, the TAP device's
// default of 4200 gives 4096, loopback (65536) gives 4096. The -mtu
// setting caps it. rdma_cm programs connect with it (the route's MTU and
// the REQ's offer), and the CM bounds its QPs by it.

// roceHdrRoom is Soft-RoCE's RXE_MAX_HDR_LENGTH: the room eth_mtu_int_to_enum
// leaves for the headers of a packet (IP, UDP, BTH, the longest extension
// headers, ICRC).
const roceHdrRoom = 80

// ibMTUFor returns the largest path MTU code (1 = 256 .. 5 = 4096) whose
// packets fit a link of ifMTU bytes, 0 when not even 256 does.
func ibMTUFor(ifMTU int) uint32 {
	room := ifMTU - roceHdrRoom
	for code := uint32(5); code >= 1; code-- {
		if 128<<code <= room {
			return code
		}
	}
	return 0
}

// localIfMTU returns the MTU of the interface that holds ip (for a
// loopback address, the loopback interface's); false when no interface
// holds it (an unspecified address, or one of another host).
func localIfMTU(ip netip.Addr) (int, bool) {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsUnspecified() {
		return 0, false
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return 0, false
	}
	for _, ifc := range ifs {
		if ip.IsLoopback() {
			if ifc.Flags&net.FlagLoopback != 0 {
				return ifc.MTU, true
			}
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if x, ok := netip.AddrFromSlice(n.IP); ok && x.Unmap() == ip {
					return ifc.MTU, true
				}
			}
		}
	}
	return 0, false
}

// activeMTU returns the port's MTU code: the link's (udp: of the
// interface holding the local address; tap: of the TAP device), at most
// max, the -mtu setting's code.
func activeMTU(cfg *Config, max uint32) uint32 {
	ifMTU := 0
	switch cfg.Link.Type {
	case "udp":
		if ap, err := netip.ParseAddrPort(cfg.Link.Local); err == nil {
			ifMTU, _ = localIfMTU(ap.Addr())
		}
	case "tap":
		ifMTU = cfg.Link.TAP.mtu()
	}
	if ifMTU == 0 {
		return max
	}
	if c := ibMTUFor(ifMTU); c != 0 && c < max {
		return c
	}
	return max
}

// mtu is the TAP device's MTU: MTU, else tap.DefaultMTU.
func (c *TAPConfig) mtu() int {
	if c.MTU == 0 {
		return tap.DefaultMTU
	}
	return c.MTU
}
