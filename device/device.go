package device

import (
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/dma"
	"github.com/vrnic/vrnic/roce"
)

// LinkInfo describes the device's port as QUERY_PORT and QUERY_GID report
// it.
type LinkInfo struct {
	Type      abi.LinkType
	MaxMTU    abi.MTU    // largest path MTU the link carries
	GIDs      [][16]byte // GID table, index 0 first (at most abi.GIDTableLen)
	MAC       [6]byte
	SpeedMbps uint64
}

// ResourceCounts, Limits and QPCounters are the operator's types (package
// admin), so that what the device enforces and counts is what vrnicctl
// reads.
type (
	ResourceCounts = admin.ResourceCounts
	Limits         = admin.Limits
	UIDLimits      = admin.UIDLimits
	QPCounters     = admin.QPCounters
	WireCounters   = admin.WireCounters
)

// DefaultLimits are the limits used for zero fields of Config.Limits. A
// device holds 131072 QPs by default: an idle QP costs the daemon about
// 3 KB whatever its queue depth (BENCHMARKS.md, "Idle QPs"), and a host
// carries many idle connections; one context still holds at most 1024
// (and its doorbell page 2047 records).
var DefaultLimits = Limits{
	PerClient:  ResourceCounts{HostMem: 4096, PD: 256, MR: 4096, CQ: 1024, QP: 1024, SRQ: 256, AH: 4096, MW: 4096},
	PerDevice:  ResourceCounts{Contexts: 256, HostMem: 16384, PD: 4096, MR: 65536, CQ: 16384, QP: 131072, SRQ: 4096, AH: 65536, MW: 65536},
	MaxMRPages: 1 << 20,
	// 64 MiB of page tables: 8 MRs of 1<<20 scattered pages, or any
	// number of MRs over contiguous memory.
	MRTableBytesPerUID: 64 << 20,
	PinnedBytesPerUID:  1 << 30,
}

func fillCounts(dst *ResourceCounts, def ResourceCounts) {
	pick := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	pick(&dst.Contexts, def.Contexts)
	pick(&dst.HostMem, def.HostMem)
	pick(&dst.PD, def.PD)
	pick(&dst.MR, def.MR)
	pick(&dst.CQ, def.CQ)
	pick(&dst.QP, def.QP)
	pick(&dst.SRQ, def.SRQ)
	pick(&dst.AH, def.AH)
	pick(&dst.MW, def.MW)
}

// Config configures a Device.
type Config struct {
	Name       string
	NumWorkers int
	Link       LinkInfo
	Limits     Limits
	Space      *dma.Space   // required: the device's physical address space
	DataPlane  DataPlane    // nil: no data path (QPs move through their states, no data moves)
	Logger     *slog.Logger // nil: slog.Default()
	// OperatorGroup, if set, is a group whose members may use the
	// operator commands besides root and the daemon's own uid.
	OperatorGroup *OperatorGroup
	// Capture, when set, starts a packet capture of the data plane's
	// frames written as pcapng to w (which it closes when the capture
	// ends): admin.CaptureCmd. Nil: the device has no capture.
	Capture func(w io.WriteCloser, req admin.CaptureRequest) error
	// Faults, when set, serves the fault-rule requests of admin.FaultCmd
	// (package faults: faults.Injector.Serve); nil: the device has no
	// fault layer and FaultCmd fails with EOPNOTSUPP.
	Faults func(admin.FaultRequest) (admin.FaultReply, error)
	// CM is the communication manager (cm.Service over the device's
	// QP1), to which the CM commands are routed (cmseam.go); nil: they
	// fail with EOPNOTSUPP.
	CM CM
	// MaxRdAtomic is how many RDMA READ and atomic operations a QP may
	// have outstanding as requester (max_qp_init_rd_atom, MODIFY_QP's
	// max_rd_atomic) and serve at once as responder (max_qp_rd_atom,
	// max_dest_rd_atomic); 0 means abi.MaxRdAtomic (16). Soft-RoCE
	// reports 128.
	MaxRdAtomic uint8
	// DMSize is the device memory (ibv_alloc_dm) the device has in all,
	// shared by its contexts; 0 means DefaultDMSize.
	DMSize uint64
	// NoECE switches vrnic's ECE transport options off (vrnicd
	// -ece=false): the device supports none (QUERY_DEVICE_EX), and
	// MODIFY_QP refuses to set one (ece.go).
	NoECE bool
}

// DeviceCounters are the device's control-path counters.
type DeviceCounters struct {
	Commands        atomic.Uint64
	CommandErrors   atomic.Uint64
	BadMessages     atomic.Uint64
	FdsClosed       atomic.Uint64
	ContextsOpened  atomic.Uint64
	ContextsClosed  atomic.Uint64
	ConnectionsOpen atomic.Int64
	// ConnectionsRefused counts the connections refused at the per-uid
	// connection limit.
	ConnectionsRefused atomic.Uint64
	// OperatorDenied counts the operator commands refused to a peer that
	// is not an operator (EPERM).
	OperatorDenied atomic.Uint64
	// AcceptErrors counts the failed accept(2) calls of Serve (EMFILE and
	// ENFILE above all), each followed by a pause.
	AcceptErrors atomic.Uint64
	// AsyncEvents counts the asynchronous events sent to contexts,
	// AsyncEventsDropped those a full event socket did not take.
	AsyncEvents        atomic.Uint64
	AsyncEventsDropped atomic.Uint64
}

// Listener is what Serve accepts control connections from
// (*net.UnixListener).
type Listener interface {
	AcceptUnix() (*net.UnixConn, error)
	Close() error
}

// Device is one emulated RNIC: its resources, their lifecycles and the
// control server that clients talk to.
//
// Locking: mu guards every resource table of every context and the
// device-wide tables; each control command runs entirely under it (the
// control path is not hot). The data plane is called with mu held and
// never waits for an engine worker (see DataPlane).
type Device struct {
	cfg   Config
	log   *slog.Logger
	mem   memory
	dp    DataPlane
	start time.Time

	counters DeviceCounters
	portDown atomic.Bool // the port is down (a port_flap fault; events.go)

	mu       sync.Mutex
	contexts map[uint32]*Context
	nextCtx  uint32
	qps      *qpTable[uint32] // by QPN, device-wide
	qpnRand  *rand.Rand       // allocQPN (ChaCha8 seeded from the OS CSPRNG)
	xrc      xrcDevice        // XRC domains and SRQ numbers (xrc.go)
	// peers holds, for every connected RC QP (RTR and after, until RESET
	// or destroy), the remote end it is connected to: one remote QP is
	// claimed by at most one local QP (connect.go).
	peers  *qpTable[peerKey] // by QP.peer
	totals ResourceCounts
	// dmUsed is the device memory allocated, in whole pages (mrdm.go).
	dmUsed uint64
	// dpRetired sums the engine counters of the QPs destroyed so far
	// (counters.go).
	dpRetired QPCounters
	closed    bool
	lns       map[Listener]struct{}
	conns     map[*net.UnixConn]struct{}
	// accounts holds the connections and contexts of each uid
	// (accounts.go).
	accounts map[uint32]*account

	// cmIDs counts the CM IDs of each uid (CMClient.CMChargeID). Its
	// own lock, never held across anything: the CM charges from its
	// goroutine without the device lock.
	cmIDs struct {
		mu    sync.Mutex
		byUID map[uint32]int
	}

	euid     uint32        // the daemon's effective uid: an operator
	done     chan struct{} // closed by Close
	refusing atomic.Int32  // refused connections waiting for their first command

	wg sync.WaitGroup
	// releases counts the awaitRelease goroutines still waiting for the
	// data plane: Close waits for them, so memory a destroyed QP pinned
	// is unpinned before Close returns (and before the owner closes the
	// DMA space under it).
	releases sync.WaitGroup
}

// ErrClosed is returned by Serve after Close.
var ErrClosed = errors.New("device closed")

// MaxRdAtomic returns the device's max_qp_rd_atom and max_qp_init_rd_atom
// (Config.MaxRdAtomic, or its default).
func (d *Device) MaxRdAtomic() int { return int(d.cfg.MaxRdAtomic) }

// New creates a device. It does not listen; call Serve with a listener.
func New(cfg Config) (*Device, error) {
	if cfg.Name == "" {
		return nil, errors.New("device: empty name")
	}
	if cfg.Space == nil {
		return nil, errors.New("device: Space is required")
	}
	if cfg.NumWorkers <= 0 {
		cfg.NumWorkers = 1
	}
	if cfg.Link.MaxMTU == 0 {
		cfg.Link.MaxMTU = abi.MTU4096
	}
	if cfg.Link.MaxMTU < abi.MTU256 || cfg.Link.MaxMTU > abi.MTU4096 {
		return nil, fmt.Errorf("device: invalid MTU %d", cfg.Link.MaxMTU)
	}
	if cfg.MaxRdAtomic == 0 {
		cfg.MaxRdAtomic = abi.MaxRdAtomic
	}
	if len(cfg.Link.GIDs) > abi.GIDTableLen {
		return nil, fmt.Errorf("device: %d GIDs, at most %d", len(cfg.Link.GIDs), abi.GIDTableLen)
	}
	fillCounts(&cfg.Limits.PerClient, DefaultLimits.PerClient)
	fillCounts(&cfg.Limits.PerDevice, DefaultLimits.PerDevice)
	if cfg.Limits.PerDevice.QP > roce.QPNMask-firstQPN {
		return nil, fmt.Errorf("device: at most %d QPs fit the 24-bit QPN space", roce.QPNMask-firstQPN)
	}
	fillUIDLimits(&cfg.Limits)
	if cfg.Limits.PerUID.Contexts < 0 || cfg.Limits.PerUID.Connections < 0 || cfg.Limits.PerUID.FDs < 0 {
		return nil, errors.New("device: per-uid limits must not be negative")
	}
	if cfg.Limits.MaxMRPages == 0 {
		cfg.Limits.MaxMRPages = DefaultLimits.MaxMRPages
	}
	if cfg.Limits.MRTableBytesPerUID == 0 {
		cfg.Limits.MRTableBytesPerUID = DefaultLimits.MRTableBytesPerUID
	}
	if cfg.Limits.PinnedBytesPerUID == 0 {
		cfg.Limits.PinnedBytesPerUID = DefaultLimits.PinnedBytesPerUID
	}
	if cfg.DataPlane == nil {
		cfg.DataPlane = noDataPlane{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var seed [32]byte
	crand.Read(seed[:])
	d := &Device{
		cfg:      cfg,
		log:      cfg.Logger.With("device", cfg.Name),
		mem:      memory{cfg.Space},
		dp:       cfg.DataPlane,
		start:    time.Now(),
		contexts: make(map[uint32]*Context),
		qps:      qpnTable(),
		qpnRand:  rand.New(rand.NewChaCha8(seed)),
		peers:    peerTable(),
		lns:      make(map[Listener]struct{}),
		conns:    make(map[*net.UnixConn]struct{}),
		accounts: make(map[uint32]*account),
		euid:     uint32(os.Geteuid()),
		done:     make(chan struct{}),
	}
	d.cmIDs.byUID = map[uint32]int{}
	return d, nil
}

// Name returns the device name.
func (d *Device) Name() string { return d.cfg.Name }

// Limits returns the effective limits.
func (d *Device) Limits() Limits { return d.cfg.Limits }

// Accept errors do not end Serve unless the listener was closed: a flood
// of connections exhausting the daemon's descriptors (EMFILE, ENFILE) or
// the kernel's memory must not stop the device. Serve pauses, 5 ms at the
// first error of a burst and twice as long at each next one up to 1 s, as
// net/http's server does, and tries again; a burst is logged when it
// starts and when it ends, and each error is counted (AcceptErrors).
// (Variables: a test makes the pause long enough that waiting it out
// cannot pass for not waiting.)
var (
	acceptPauseMin = 5 * time.Millisecond
	acceptPauseMax = time.Second
)

// Serve accepts control connections on l until Close; one goroutine serves
// each connection. It returns ErrClosed after Close, or the accept error
// when l was closed by someone else.
func (d *Device) Serve(l Listener) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return ErrClosed
	}
	d.lns[l] = struct{}{}
	d.wg.Add(1)
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.lns, l)
		d.mu.Unlock()
		d.wg.Done()
	}()
	var (
		pause      time.Duration // 0: not in a burst of errors
		burst      int
		burstStart time.Time
	)
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			d.mu.Lock()
			closed := d.closed
			d.mu.Unlock()
			if closed {
				return ErrClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accept: %w", err)
			}
			d.counters.AcceptErrors.Add(1)
			burst++
			if pause == 0 {
				pause, burstStart = acceptPauseMin, time.Now()
				d.log.Warn("accept failed; pausing and retrying while it fails", "err", err, "first_pause", pause, "max_pause", acceptPauseMax)
			} else {
				pause = min(2*pause, acceptPauseMax)
			}
			t := time.NewTimer(pause)
			select {
			case <-d.done:
				t.Stop()
				return ErrClosed
			case <-t.C:
			}
			continue
		}
		if pause != 0 {
			d.log.Info("accept works again", "failed_accepts", burst, "burst", time.Since(burstStart).Round(time.Millisecond))
			pause, burst = 0, 0
		}
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			c.Close()
			return ErrClosed
		}
		d.conns[c] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		go d.serveConn(c)
	}
}

// Close stops every listener and connection, releases every context's
// resources and waits for the connection goroutines to finish.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		d.wg.Wait()
		d.releases.Wait()
		return nil
	}
	d.closed = true
	close(d.done)
	for l := range d.lns {
		l.Close()
	}
	for c := range d.conns {
		c.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
	// The connections are gone, so their contexts' QPs are destroyed;
	// the data plane (still running: it closes after the device)
	// confirms each removal, then what the QPs pinned is released.
	d.releases.Wait()
	d.log.Info("device closed")
	return nil
}

// Counts returns the device-wide resource counts.
func (d *Device) Counts() ResourceCounts {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.totals
}

// Counters returns the device's control-path counters.
func (d *Device) Counters() *DeviceCounters { return &d.counters }
