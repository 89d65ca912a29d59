package devview

import (
	"net"
	"net/netip"
)

// Namespace answers what a view needs to know of the network namespace
// its program runs in.
type Namespace interface {
	// AddrHome finds the interface holding addr: its name, whether it
	// is a loopback interface, and the prefix length of its network;
	// else the interface whose network contains addr (127.0.0.2 on lo,
	// held = false); else "", false, false, -1.
	AddrHome(addr netip.Addr) (name string, loopback, held bool, bits int)
	// IndexInUse reports whether an interface has index i.
	IndexInUse(i int) bool
}

// Local is the network namespace of this process.
var Local Namespace = localNS{}

// Foreign is a network namespace that holds none of the devices'
// addresses and whose own interfaces have indices below 1000, where the
// synthetic ones start (a pod's namespace seen from the node): every
// device address gets a synthetic interface.
var Foreign Namespace = foreignNS{}

type localNS struct{}

func (localNS) AddrHome(addr netip.Addr) (name string, loopback, held bool, bits int) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", false, false, -1
	}
	bits = -1
	for _, ifc := range ifs {
		as, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			pn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(pn.IP)
			if !ok {
				continue
			}
			ones, _ := pn.Mask.Size()
			if ip.Unmap() == addr {
				return ifc.Name, ifc.Flags&net.FlagLoopback != 0, true, ones
			}
			if pf, err := ip.Unmap().Prefix(ones); err == nil && pf.Contains(addr) && name == "" {
				name, loopback, bits = ifc.Name, ifc.Flags&net.FlagLoopback != 0, ones
			}
		}
	}
	return name, loopback, false, bits
}

func (localNS) IndexInUse(i int) bool {
	_, err := net.InterfaceByIndex(i)
	return err == nil
}

type foreignNS struct{}

func (foreignNS) AddrHome(netip.Addr) (string, bool, bool, int) { return "", false, false, -1 }
func (foreignNS) IndexInUse(int) bool                           { return false }
