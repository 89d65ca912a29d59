package tap

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// GID is a RoCE v2 global identifier: an IPv6 address, or an IPv4 address
// in its IPv4-mapped form ::ffff:a.b.c.d (IBTA Annex A17, RoCE v2 GIDs).
type GID [16]byte

// ErrGIDIndex reports a GID table index out of range.
var ErrGIDIndex = errors.New("tap: GID index out of range")

// GIDFromAddr returns the GID of an IP address.
func GIDFromAddr(a netip.Addr) GID {
	return GID(a.Unmap().WithZone("").As16())
}

// Addr returns the IP address of g (IPv4 for an IPv4-mapped GID).
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// IsIPv4 tells whether g is an IPv4-mapped GID.
func (g GID) IsIPv4() bool { return netip.AddrFrom16(g).Is4In6() }

// String formats g as an IPv6 address (IPv4-mapped GIDs as ::ffff:a.b.c.d).
func (g GID) String() string { return netip.AddrFrom16(g).String() }

// GIDTable is a device's GID table: entry i is the GID of the device's i-th
// address. It is immutable after NewGIDTable.
type GIDTable struct {
	gids []GID
}

// NewGIDTable builds the table from the device addresses, in order,
// skipping duplicates. Invalid, unspecified and multicast addresses are
// rejected.
func NewGIDTable(addrs []netip.Addr) (*GIDTable, error) {
	t := &GIDTable{}
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
			return nil, fmt.Errorf("%w: device address %v", ErrConfig, a)
		}
		g := GIDFromAddr(a)
		if _, dup := t.Index(g); !dup {
			t.gids = append(t.gids, g)
		}
	}
	return t, nil
}

// Len returns the number of entries.
func (t *GIDTable) Len() int { return len(t.gids) }

// GID returns entry i.
func (t *GIDTable) GID(i int) (GID, error) {
	if i < 0 || i >= len(t.gids) {
		return GID{}, fmt.Errorf("%w: %d (table has %d)", ErrGIDIndex, i, len(t.gids))
	}
	return t.gids[i], nil
}

// Index returns the index of g.
func (t *GIDTable) Index(g GID) (int, bool) {
	for i, x := range t.gids {
		if x == g {
			return i, true
		}
	}
	return 0, false
}

// Report formats the table like show_gids: index, GID, address, type.
func (t *GIDTable) Report(dev string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "DEV\tINDEX\tGID\t\t\t\t\tIPv4/IPv6\tTYPE\n")
	for i, g := range t.gids {
		fam := "IPv6"
		if g.IsIPv4() {
			fam = "IPv4"
		}
		fmt.Fprintf(&b, "%s\t%d\t%-39s\t%s %s\tRoCE v2\n", dev, i, g.String(), fam, g.Addr())
	}
	return b.String()
}
