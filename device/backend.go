package device

import "github.com/vrnic/vrnic/dma"

// The device's control path drives three collaborators, declared here where
// they are used: the physical address space and MR table (package dma), the
// per-context doorbell pages (package doorbell), and the transport engine
// (package device/engine). Adapters to the concrete packages live in
// backend_*.go; unit tests of the control path use the same adapters.

// Owner identifies the client (context) that owns memory in the address
// space; dead-client cleanup releases everything of one owner at once.
type Owner = dma.Owner

// HostRegion is the result of registering a host memory fd.
type HostRegion struct {
	Handle uint32
	PABase uint64
	Length uint64
	Locked bool
}

// MRInfo is the result of registering a memory region.
type MRInfo struct {
	Handle uint32
	LKey   uint32
	RKey   uint32
}

// Pin holds a range of host memory (a ring) in place: while it is held the
// region cannot be removed. Release is idempotent.
type Pin interface {
	// Bytes is the pinned range as mapped in the daemon.
	Bytes() []byte
	Release()
}

// MemorySpace is what the control path needs from the device physical
// address space.
type MemorySpace interface {
	// AddRegion registers the memfd fd (length bytes) for owner. The space
	// duplicates fd; the caller still owns (and closes) fd.
	AddRegion(owner Owner, fd int, length uint64) (HostRegion, error)
	// RemoveRegion unregisters a region; it fails (EBUSY class) while an MR
	// or a ring pins it.
	RemoveRegion(owner Owner, handle uint32) error
	// PinRange pins [pa, pa+length), which must lie in one region of owner.
	PinRange(owner Owner, pa, length uint64) (Pin, error)
	// RegisterMR registers an MR from a page list.
	RegisterMR(owner Owner, pd uint32, iova, length uint64, access uint32, pageShift uint32, pages []uint64) (MRInfo, error)
	// DeregisterMR drops an MR and its pins.
	DeregisterMR(owner Owner, handle uint32) error
	// ReadPageList copies n u64 page addresses from pa (REG_MR pbl_pa).
	ReadPageList(owner Owner, pa uint64, n uint32) ([]uint64, error)
	// ReleaseOwner drops every MR and region of owner (client death).
	ReleaseOwner(owner Owner)
}

// DoorbellPage is one context's doorbell page and kick eventfd.
type DoorbellPage interface {
	// MemFd is the page's memfd, sent to the client (still owned by the page).
	MemFd() int
	// KickFd is the kick eventfd, sent to the client (owned by the page).
	KickFd() int
	// Size and Records describe the page (OPEN_CONTEXT reply).
	Size() uint32
	Records() uint32
	// Alloc hands out a free record index (never 0); Free returns it.
	Alloc() (uint32, error)
	Free(index uint32)
	// Close unmaps the page and closes its fds.
	Close() error
}

// DoorbellFactory creates the doorbell page of a new context.
type DoorbellFactory func() (DoorbellPage, error)
