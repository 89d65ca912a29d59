package dma

import (
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/abi"
)

// Owner names the client (device context) that owns regions and MRs. The
// device allocates owners; the Space never lets an owner's page list, ring
// or key reach memory of another owner.
type Owner uint32

// PD is a protection domain: the owner and the PD handle the device gave
// it. MR lookups compare the whole pair, so equal PD handles of two
// clients never match each other's keys.
type PD struct {
	Owner  Owner
	Handle uint32
}

// Config bounds a Space. Zero fields take the defaults.
type Config struct {
	// MaxMRs is the number of MR key indices (default 65536, at most
	// 1<<24: a key is index<<8 | variant). Index 0 is never used, so
	// key 0 never names an MR.
	MaxMRs int
	// MaxRegionsPerOwner bounds host memory regions per owner (default 4096).
	MaxRegionsPerOwner int
	// MaxRegionBytes bounds one region (default and maximum 1<<40).
	MaxRegionBytes uint64
	// MaxMRBytes bounds one MR's length (default VRNIC_MAX_MR_SIZE, 1<<40).
	MaxMRBytes uint64
	// MaxPagesPerMR bounds an MR's page list (default 1<<20: an 8 MiB
	// table, 4 GiB of 4 KiB pages or 2 TiB of 2 MiB pages), so a client
	// cannot make the daemon allocate page tables as large as its memory.
	MaxPagesPerMR int
	// MaxPinnedBytes bounds the host memory pinned (locked) by MRs and
	// rings of all owners together, in 2 MiB chunks (default 16 GiB).
	// Each account has its own bound too (SetAccount). Besides RAM it
	// bounds the daemon's mappings: every isolated locked chunk splits a
	// region's mapping, and a process has a limited number of them
	// (vm.max_map_count).
	MaxPinnedBytes uint64
	// NoMlock skips mlock: pins are accounted but nothing is locked, and
	// regions report locked=false.
	NoMlock bool
	// Logger receives lifecycle messages (nil: slog.Default()).
	Logger *slog.Logger
}

const (
	defaultMaxMRs     = 1 << 16
	maxMRs            = 1 << 24
	defaultMaxRegions = 4096
	defaultMaxPages   = 1 << 20
	maxRegionBytes    = 1 << 40
	maxMRBytes        = abi.MaxMRSize
	defaultMaxPinned  = 16 << 30
	// paStart is the first PA handed out (PA 0 is never valid, so a zeroed
	// ring or page address fails cleanly); guardGap separates regions so a
	// page or ring running off the end of one region never lands in the
	// next; paLimit bounds the space. PA ranges are never reused.
	paStart  = 1 << 30
	guardGap = RegionAlign
	paLimit  = 1 << 62
)

// Space is the physical address space of one device: the host memory
// regions of its clients and the MR key table. See the package comment for
// the layout and the concurrency scheme.
//
// Control-plane methods (AddRegion, RemoveRegion, Slice, RegisterMR,
// DeregisterMR, ReleaseOwner, Close) serialize on one mutex. Invalidate and
// the Accessor methods take no lock.
type Space struct {
	cfg Config
	log *slog.Logger

	// Hot path: read with atomics only.
	epoch     atomic.Uint64               // grace-period epoch, >= 1
	slots     []atomic.Pointer[memRegion] // key index -> live MR or nil
	accessors atomic.Pointer[[]*Accessor] // copy-on-write under mu

	// odpAtomic serializes atomics on on-demand paging MRs, a read and a
	// write of the client's word each (odp.go).
	odpAtomic sync.Mutex
	// mwMu guards memory window bindings (mw.go); taken after mu.
	mwMu sync.Mutex

	mu         sync.Mutex // guards everything below
	closed     bool
	owners     map[Owner]*ownerState
	byPA       []*region // live (published) regions sorted by pa
	lastHit    *region   // last region found by findPA (registration cache)
	nextHandle uint32
	nextPA     uint64
	keys       *keyAlloc
	accounts   map[AccountID]*account
	pinned     uint64 // bytes of chunks pinned, all accounts

	// The pinner (pin.go) locks and unlocks chunks off every lock but
	// the region's own; these are guarded by mu.
	pinq        []*region // regions with dirty chunks
	pinRunning  bool
	pinWG       sync.WaitGroup
	lockFails   uint64
	lockChunkFn func(b []byte) error // mlock2(MLOCK_ONFAULT); tests replace it

	scratch []byte // MR tables are built here (table.go); guarded by mu

	heapFreed atomic.Uint64 // page-table bytes freed to the Go heap since the last release to the OS
	bgRunning atomic.Bool
}

type ownerState struct {
	regions map[uint32]*region
	mrs     map[uint32]*memRegion // by lkey
	mws     map[uint32]*memWindow // by handle
	acct    *account
}

// NewSpace returns an empty Space.
func NewSpace(cfg Config) (*Space, error) {
	if cfg.MaxMRs == 0 {
		cfg.MaxMRs = defaultMaxMRs
	}
	if cfg.MaxMRs < 2 || cfg.MaxMRs > maxMRs {
		return nil, fmt.Errorf("%w: MaxMRs %d not in [2, %d]", ErrInvalid, cfg.MaxMRs, maxMRs)
	}
	if cfg.MaxRegionsPerOwner <= 0 {
		cfg.MaxRegionsPerOwner = defaultMaxRegions
	}
	if cfg.MaxPagesPerMR <= 0 {
		cfg.MaxPagesPerMR = defaultMaxPages
	}
	if cfg.MaxRegionBytes == 0 || cfg.MaxRegionBytes > maxRegionBytes {
		cfg.MaxRegionBytes = maxRegionBytes
	}
	if cfg.MaxMRBytes == 0 || cfg.MaxMRBytes > maxMRBytes {
		cfg.MaxMRBytes = maxMRBytes
	}
	if cfg.MaxPinnedBytes == 0 {
		cfg.MaxPinnedBytes = defaultMaxPinned
	}
	s := &Space{
		cfg:         cfg,
		log:         cfg.Logger,
		slots:       make([]atomic.Pointer[memRegion], cfg.MaxMRs),
		owners:      make(map[Owner]*ownerState),
		nextPA:      paStart,
		keys:        newKeyAlloc(cfg.MaxMRs),
		accounts:    make(map[AccountID]*account),
		lockChunkFn: lockOnFault,
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.epoch.Store(1)
	s.accessors.Store(new([]*Accessor))
	return s, nil
}

func (s *Space) owner(o Owner) *ownerState {
	st := s.owners[o]
	if st == nil {
		// Until SetAccount binds it, an owner is its own account, without
		// limits of its own (the Space's MaxPinnedBytes still applies).
		st = &ownerState{regions: make(map[uint32]*region), mrs: make(map[uint32]*memRegion),
			mws:  make(map[uint32]*memWindow),
			acct: &account{id: AccountID(o), u: AccountUsage{Owners: 1}}}
		s.owners[o] = st
	}
	return st
}

// findPA returns the live region containing [pa, pa+n), or ErrPAOutside
// or ErrNotOwner. n > 0. Caller holds mu. The last hit is cached, as
// libvfio-user does, because page lists walk one region in order.
func (s *Space) findPA(o Owner, pa, n uint64) (*region, error) {
	r := s.lastHit
	if r == nil || !r.contains(pa, n) {
		i := sort.Search(len(s.byPA), func(i int) bool { return s.byPA[i].pa+s.byPA[i].length > pa })
		if i == len(s.byPA) || !s.byPA[i].contains(pa, n) {
			return nil, fmt.Errorf("%w: [%#x, +%#x)", ErrPAOutside, pa, n)
		}
		r = s.byPA[i]
		s.lastHit = r
	}
	if r.owner != o {
		return nil, fmt.Errorf("%w: [%#x, +%#x)", ErrNotOwner, pa, n)
	}
	return r, nil
}

// unpublish removes r from the PA index and its owner's table, so no new
// Slice or registration can find it. Caller holds mu.
func (s *Space) unpublish(r *region) {
	i := sort.Search(len(s.byPA), func(i int) bool { return s.byPA[i].pa >= r.pa })
	if i < len(s.byPA) && s.byPA[i] == r {
		s.byPA = append(s.byPA[:i], s.byPA[i+1:]...)
	}
	if s.lastHit == r {
		s.lastHit = nil
	}
	if st := s.owners[r.owner]; st != nil {
		delete(st.regions, r.handle)
	}
	r.dead = true
}

// synchronize waits for a grace period: until every Accessor that may
// have loaded a pointer published before this call has left its section.
// It bumps the epoch, then waits for each accessor's state to be 0 (idle)
// or at least the new epoch (entered after the bump, so it can only see
// tables stored before the bump, which no longer reference what is being
// retired). Go atomics are sequentially consistent, which is what makes
// the "state is 0" observation safe: an accessor that stores its state
// after we read 0 loads the tables after our unpublishing stores.
// Caller does not hold mu.
func (s *Space) synchronize() {
	e := s.epoch.Add(1)
	for _, a := range *s.accessors.Load() {
		start := time.Now()
		warned := false
		for spins := 0; ; spins++ {
			st := a.state.Load()
			if st == 0 || st >= e {
				break
			}
			if !warned && spins&1023 == 1023 && time.Since(start) > time.Second {
				// A section should last one WQE; this is a stuck worker.
				s.log.Warn("dma: unmapping waits for a worker inside a copy section", "waited", time.Since(start))
				warned = true
			}
			backoff(spins)
		}
	}
}

// retireList is what a deregistration or removal leaves to free once no
// accessor can reach it: regions unpublished with no pins left, and MR
// page tables in mmap'd storage; heapBytes counts page tables left to the
// Go heap.
type retireList struct {
	regions   []*region
	tables    [][]byte
	heapBytes uint64
}

// retire frees what rl holds after a grace period. Caller does not hold
// mu.
func (s *Space) retire(rl *retireList) {
	if len(rl.regions)+len(rl.tables) > 0 {
		s.synchronize()
	}
	for _, r := range rl.regions {
		s.releaseRegion(r)
		s.log.Debug("dma: host memory unmapped", "owner", r.owner, "handle", r.handle, "pa", r.pa, "length", r.length)
	}
	for _, b := range rl.tables {
		freeStore(b)
	}
	s.heapFreed.Add(rl.heapBytes)
	s.maybeReturnHeap()
}

// ReleaseOwner drops every MR and region of owner (a client that went
// away). Regions still pinned by ring views (Slice) are unpublished now and
// unmapped when the last Pin is released. It returns how many MRs and
// regions were dropped.
func (s *Space) ReleaseOwner(o Owner) (mrs, regions int) {
	s.mu.Lock()
	st := s.owners[o]
	if st == nil {
		s.mu.Unlock()
		return 0, 0
	}
	var rl retireList
	for _, w := range st.mws { // first: they hold their MRs
		s.dropMW(st, w)
	}
	for _, m := range st.mrs {
		s.dropMR(st, m, &rl)
		mrs++
	}
	for _, r := range st.regions {
		s.unpublish(r)
		if r.pins == 0 {
			rl.regions = append(rl.regions, r)
		}
		regions++
	}
	delete(s.owners, o)
	st.acct.u.Owners--
	s.maybeDropAccount(st.acct)
	s.mu.Unlock()
	s.retire(&rl)
	if mrs+regions > 0 {
		s.log.Info("dma: owner released", "owner", o, "mrs", mrs, "regions", regions)
	}
	return mrs, regions
}

// Close releases every owner. Ring views still pinned keep their region
// mapped until released. Accessors stay usable and fail every lookup.
func (s *Space) Close() {
	s.mu.Lock()
	s.closed = true
	owners := make([]Owner, 0, len(s.owners))
	for o := range s.owners {
		owners = append(owners, o)
	}
	s.mu.Unlock()
	for _, o := range owners {
		s.ReleaseOwner(o)
	}
	s.pinWG.Wait()
	s.mu.Lock()
	freeStore(s.scratch)
	s.scratch = nil
	s.mu.Unlock()
}
