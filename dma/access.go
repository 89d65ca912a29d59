package dma

import (
	"fmt"

	"github.com/vrnic/vrnic/abi"
)

// Access is a set of MR access flags, numbered as libibverbs' IBV_ACCESS_*
// and enum vrnic_access in abi/vrnic_abi.h. Local read is always granted.
type Access uint32

// Access flags.
const (
	AccessLocalWrite   = Access(abi.AccessLocalWrite)   // 1 << 0
	AccessRemoteWrite  = Access(abi.AccessRemoteWrite)  // 1 << 1
	AccessRemoteRead   = Access(abi.AccessRemoteRead)   // 1 << 2
	AccessRemoteAtomic = Access(abi.AccessRemoteAtomic) // 1 << 3
	// AccessMWBind lets memory windows be bound to an MR (IBTA C10-73).
	AccessMWBind = Access(abi.AccessMWBind) // 1 << 4
	// AccessZeroBased: a window's remote addresses are offsets into it
	// (binds of type 2 windows only).
	AccessZeroBased = Access(abi.AccessZeroBased) // 1 << 5
	// FLUSH targets (IBTA 1.5 Memory Placement Extensions), ABI 1.4.
	AccessFlushGlobal     = Access(abi.AccessFlushGlobal)     // 1 << 8
	AccessFlushPersistent = Access(abi.AccessFlushPersistent) // 1 << 9

	// AccessRemote is every remote flag: an MR with none of them has no
	// rkey (0, which never names an MR).
	AccessRemote = AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic | AccessFlushGlobal | AccessFlushPersistent
	accessAll    = AccessLocalWrite | AccessRemote | AccessMWBind
)

// Page shifts accepted by RegisterMR (VRNIC_PAGE_SHIFT_4K, _2M).
const (
	PageShift4K = abi.PageShift4K
	PageShift2M = abi.PageShift2M
	// RegionAlign is the PA alignment of every region (a 2 MiB page).
	RegionAlign = 1 << PageShift2M
	// MinPage is the granule of region lengths and the smallest page.
	MinPage = 1 << PageShift4K
)

// validateAccess checks a registration's flags: no unknown bits, and
// remote write or remote atomic only together with local write (IBTA
// 10.6.3.1, C10-83: "remote write or remote atomic access requires local
// write access").
func validateAccess(a Access) error {
	if a&^accessAll != 0 {
		return fmt.Errorf("%w: unknown bits %#x", ErrAccessFlags, uint32(a&^accessAll))
	}
	if a&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && a&AccessLocalWrite == 0 {
		return fmt.Errorf("%w: remote write/atomic requires local write", ErrAccessFlags)
	}
	return nil
}

func (a Access) String() string {
	s := ""
	for _, f := range []struct {
		bit  Access
		name string
	}{{AccessLocalWrite, "LOCAL_WRITE"}, {AccessRemoteWrite, "REMOTE_WRITE"}, {AccessRemoteRead, "REMOTE_READ"}, {AccessRemoteAtomic, "REMOTE_ATOMIC"},
		{AccessFlushGlobal, "FLUSH_GLOBAL"}, {AccessFlushPersistent, "FLUSH_PERSISTENT"}} {
		if a&f.bit != 0 {
			if s != "" {
				s += "|"
			}
			s += f.name
		}
	}
	if rest := a &^ accessAll; rest != 0 {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("%#x", uint32(rest))
	}
	if s == "" {
		return "LOCAL_READ"
	}
	return s
}
