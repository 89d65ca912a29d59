// Package dma owns a device's physical address space: the host memory
// clients share with the daemon, the pinned page tables (MTTs) of their
// memory regions, lkey/rkey lookup with protection checks, and every copy
// between client memory and the transport.
//
// # Host memory and the physical address space
//
// A client hands the device memfds (ADD_HOST_MEM). AddRegion checks each
// is a memfd sealed against shrinking and long enough, maps it MAP_SHARED
// read/write (populating and locking nothing: see "Pinning") and gives it
// a range of the device physical address space (PA), as a VMM places
// guest RAM:
//
//	PA 0 ........ 1 GiB: never assigned (a zero PA always fails)
//	[pa0, pa0+len0)     region 1 (owner A)   pa0 = 1 GiB
//	2 MiB-aligned gap   (at least 2 MiB, unmapped)
//	[pa1, pa1+len1)     region 2 (owner B)   pa1 2 MiB aligned
//	...
//
// PA base+x is byte x of the memfd. Bases are 2 MiB aligned so 2 MiB pages
// map to 2 MiB-aligned file offsets; ranges are handed out in increasing
// order and never reused, so a stale PA can never reach a later region.
// Rings are named by PA: Slice returns the bytes of a PA range inside one
// region of the caller's owner and pins the region.
//
// # Memory registration
//
// RegisterMR (or RegisterMRList, reading the list from host memory)
// receives what a kernel driver would build after pinning user pages:
// IOVA, length, access flags and the PA of every page (4 KiB or 2 MiB).
// Every page must lie wholly inside a region of the same owner. The MR
// stores, per page, a 64-bit entry
//
//	bits 63..48: index into the MR's list of regions (each pinned once)
//	bits 47..0 : byte offset of the page in that region's mapping
//
// either flat (one entry a page) or as runs of pages contiguous in a
// region (table.go): an MR over contiguous memory costs 16 bytes however
// long it is. Translation is arithmetic plus one slice expression (and a
// binary search over the runs in the runs form), and a region cannot be
// removed while an MR pins it (ErrBusy).
//
// # Keys
//
// A key is index<<8 | variant: the index selects a slot in a fixed table,
// and a lookup compares the whole key. Keys are not guessable from one
// another (keys.go): indices are drawn at random from the free ones (not
// from those freed most recently), the lkey and the rkey of an MR carry
// two different random variants from a CSPRNG-seeded stream, and both
// differ from the variants the index had at its previous registration, so
// a stale key never matches the MR that reuses its index. Local accesses
// match only lkeys and remote ones only rkeys. Every MR has an rkey, as
// on Linux rxe and mlx5: a remote access to an MR without the remote right
// fails its access check; key 0 never names an MR (index 0 is never
// used).
//
// # Pinning and accounts
//
// What MRs and ring views cover is pinned in 2 MiB chunks of a region,
// with reference counts, and locked by a background pinner one chunk at a
// time with mlock2(MLOCK_ONFAULT), populating only the pages the memfd
// holds (pin.go); a sparse memfd is never filled in. Pinned chunks and
// page tables are charged to the owner's account (SetAccount; the device
// uses the client's uid) and refused with ErrQuota beyond its limits or
// the device's MaxPinnedBytes. Page tables of 256 KiB or more have
// mappings of their own, unmapped when the MR goes; the Go heap is
// returned to the system after large frees of smaller ones.

// # Concurrency
//
// Worker goroutines translate and copy while the control plane registers
// and removes. The hot path takes no lock:
//
//   - The key table is a fixed array of atomic pointers to immutable MR
//     descriptors. Registration builds the descriptor, then publishes it
//     with one atomic store; deregistration stores nil. Invalidation sets
//     an atomic flag in the descriptor.
//   - Unmapping is deferred by a grace period (epoch-based, like RCU).
//     Each worker owns an Accessor with a padded atomic state word: 0 when
//     idle, otherwise the global epoch it saw on Enter. A copy runs inside
//     Enter/Exit. To unmap a region that is already unpublished (no MR
//     pins it, so no key slot leads to it), the control plane increments
//     the epoch and waits until every accessor's state is 0 or at least the
//     new epoch; any accessor that could still hold a pointer into the
//     mapping entered earlier and is waited for. Then munmap and close.
//     Sections last one WQE or packet, so the wait is microseconds.
//   - Ring views (Slice) are pinned instead, since rings live as long as
//     their queue: the region outlives every Pin.
//
// Go's sync/atomic operations are sequentially consistent, which this
// argument relies on. Control-plane calls serialize on one mutex; a
// registration's PA lookups reuse the last region hit (libvfio-user
// style). The hot path needs no region cache: MR entries point into the
// region directly.
//
// # Errors
//
// Control-path errors wrap the sentinels with %w and context; hot-path
// methods return bare sentinels (no allocation). Each sentinel unwraps to
// the errno of a control reply (errors.Is(ErrBusy, unix.EBUSY); Errno and
// abi.ErrnoOf find it). The copy methods say which SGE failed so the
// engine picks the completion status: ErrBadKey, ErrWrongPD, ErrAccess and
// ErrBounds on a local SGE are LOC_PROT_ERR, ErrLength is LOC_LEN_ERR,
// any failure of the (rkey, va) side is REM_ACCESS_ERR (a NAK on the
// responder), ErrMisaligned on an atomic is REM_INV_REQ_ERR.
//
// # fd ownership
//
// AddRegion duplicates the fd it is given; the Space owns and closes the
// duplicate, the caller keeps its own.
package dma
