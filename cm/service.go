package cm

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/roce"
)

// GSI is the device's QP1 as the CM uses it (dataplane.QP1).
type GSI interface {
	// SendMAD sends a 256-byte MAD to QP1 of the port with GID dst. It
	// never blocks.
	SendMAD(dst [16]byte, mad []byte) error
	// Stats returns QP1's counters.
	Stats() admin.QP1Stats
}

// Client is a context of the device as the Service sees it: whose CM IDs
// they are, where their events go, what its uid may hold. The device's
// Context implements it. It is an alias of an unnamed interface type, so
// that the device can name the same type without importing this package.
//
// None of its methods may block or call the Service: they run on the
// Service's goroutine.
type Client = interface {
	// CMContext is the context's handle (operator listings).
	CMContext() uint32
	// CMEventsOpen reports whether the context has its event socket.
	CMEventsOpen() bool
	// CMPostEvent queues one encoded struct vrnic_cm_event on the
	// context's event socket; it never blocks.
	CMPostEvent(ev []byte)
	// CMMayBindPrivileged reports whether the client may listen on a
	// port below 1024 (CAP_NET_BIND_SERVICE, as Linux cma_check_port).
	CMMayBindPrivileged() bool
	// CMChargeID adds delta CM IDs to the client's uid account; an
	// error (wrapping EAGAIN) refuses a positive delta at the limit.
	CMChargeID(delta int) error
}

// ServiceConfig configures a Service.
type ServiceConfig struct {
	// CM configures the Manager; the Service sets its Sender, Clock,
	// Handler and Logger, and its PortMTU to MaxMTU if it has none.
	CM Config
	// GSI carries the MADs. Required.
	GSI GSI
	// GIDs is the port's GID table (index 0 first), MaxMTU the largest
	// path MTU the port's link carries.
	GIDs   [][16]byte
	MaxMTU roce.MTU
	// MaxIDsPerClient bounds the CM IDs of one context (default 4096).
	MaxIDsPerClient int
	// InboxMADs is how many received MADs wait for the Service at most
	// (default 4096); beyond it QP1's MADs are dropped and counted (the
	// peers retransmit).
	InboxMADs int
	Logger    *slog.Logger
}

// Service is the communication manager of one device: one goroutine and
// one inbox own the Manager and the CM IDs of every client, so neither
// needs a lock and everything happens in the order of the inbox:
//
//	client commands (Command, Release, Info)  ──┐
//	MADs from QP1 (HandleMAD, never blocks)   ──┼──► inbox ──► run ──► Manager
//	timer expiries (the Manager's Clock)      ──┘                 └──► events to the clients
//
// The device routes the CM_* commands of the ABI to Command and calls
// Release when a context goes; QP1 hands each received CM MAD to
// HandleMAD from its engine worker.
type Service struct {
	cfg   ServiceConfig
	log   *slog.Logger
	mgr   *Manager
	inbox chan func()
	mads  chan rxMAD

	// timers: expiries queued by the clock's goroutines, run by run.
	tmu     sync.Mutex
	tq      []func()
	tick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	closing sync.Once

	// madDrops counts MADs the full inbox refused.
	madDrops atomic.Uint64

	// Owned by run.
	clients   map[Client]*clientIDs
	byConn    map[ConnID]*cmID
	listeners map[uint64]*cmID // by service ID
}

type rxMAD struct {
	src [16]byte
	mad [MADLen]byte
}

// ErrServiceClosed is returned by the Service's calls after Close.
var ErrServiceClosed = errors.New("cm: communication manager closed")

// NewService starts a Service.
func NewService(cfg ServiceConfig) (*Service, error) {
	if cfg.GSI == nil {
		return nil, fmt.Errorf("%w: ServiceConfig.GSI is required", ErrInvalidParam)
	}
	if cfg.MaxIDsPerClient <= 0 {
		cfg.MaxIDsPerClient = 4096
	}
	if cfg.InboxMADs <= 0 {
		cfg.InboxMADs = 4096
	}
	if cfg.MaxMTU == 0 {
		cfg.MaxMTU = roce.MTU4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{
		cfg: cfg, log: cfg.Logger,
		inbox: make(chan func()), mads: make(chan rxMAD, cfg.InboxMADs),
		tick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		clients: map[Client]*clientIDs{}, byConn: map[ConnID]*cmID{}, listeners: map[uint64]*cmID{},
	}
	mc := cfg.CM
	if mc.PortMTU == 0 {
		mc.PortMTU = cfg.MaxMTU
	}
	clock := mc.Clock
	if clock == nil {
		clock = SystemClock{}
	}
	mc.Clock = ownerClock{Clock: clock, s: s}
	mc.Sender = SenderFunc(func(dst GID, mad []byte) error { return cfg.GSI.SendMAD(dst, mad) })
	mc.Handler = s.handle
	mc.Logger = cfg.Logger
	mgr, err := NewManager(mc)
	if err != nil {
		return nil, err
	}
	s.mgr = mgr
	go s.run()
	return s, nil
}

// ownerClock runs a Clock's callbacks on the Service's goroutine.
type ownerClock struct {
	Clock
	s *Service
}

func (c ownerClock) AfterFunc(d time.Duration, f func()) Timer {
	return c.Clock.AfterFunc(d, func() { c.s.timerFired(f) })
}

// timerFired queues an expiry for run; it never blocks the clock.
func (s *Service) timerFired(f func()) {
	s.tmu.Lock()
	s.tq = append(s.tq, f)
	s.tmu.Unlock()
	select {
	case s.tick <- struct{}{}:
	default:
	}
}

// run is the Service's goroutine: the one owner of the Manager and the
// CM IDs.
func (s *Service) run() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			s.mgr.Close()
			return
		case f := <-s.inbox:
			f()
		case m := <-s.mads:
			_ = s.mgr.HandleMAD(GID(m.src), m.mad[:])
		case <-s.tick:
			s.tmu.Lock()
			q := s.tq
			s.tq = nil
			s.tmu.Unlock()
			for _, f := range q {
				f()
			}
		}
	}
}

// call runs f on the Service's goroutine and returns its result.
func (s *Service) call(f func() error) error {
	done := make(chan error, 1)
	select {
	case s.inbox <- func() { done <- f() }:
	case <-s.done:
		return ErrServiceClosed
	}
	return <-done
}

// Close stops the Service: its timers, its goroutine; later calls fail
// with ErrServiceClosed. Nothing is sent for the connections it held (the
// daemon is going away; the peers time out).
func (s *Service) Close() {
	s.closing.Do(func() { close(s.stop) })
	<-s.done
}

// HandleMAD queues a MAD QP1 received from the port whose GID is src. It
// never blocks (it runs on an engine worker): when the inbox is full the
// MAD is dropped and counted, and the peer retransmits.
func (s *Service) HandleMAD(src [16]byte, mad []byte) {
	if len(mad) != MADLen {
		return
	}
	m := rxMAD{src: src, mad: [MADLen]byte(mad)}
	select {
	case s.mads <- m:
	default:
		s.madDrops.Add(1)
	}
}

// Errors keep their cause: cmdErr carries the errno the client gets
// beside the error that says why (a Manager sentinel, a limit).
type cmdErr struct {
	errno unix.Errno
	err   error
}

func (e *cmdErr) Error() string   { return e.err.Error() }
func (e *cmdErr) Unwrap() []error { return []error{e.err, e.errno} }

func errnoErr(errno unix.Errno, format string, args ...any) error {
	return &cmdErr{errno: errno, err: fmt.Errorf(format, args...)}
}

// errnoTable maps the Manager's sentinels to the errno a client gets.
var errnoTable = []struct {
	err   error
	errno unix.Errno
}{
	{ErrListening, unix.EADDRINUSE},
	{ErrUnknownConn, unix.EINVAL},
	{ErrState, unix.EINVAL},
	{ErrQPNInTimeWait, unix.EBUSY},
	{ErrPrivateDataLen, unix.EINVAL},
	{ErrInvalidParam, unix.EINVAL},
	{ErrClosed, unix.ESHUTDOWN},
	{ErrServiceClosed, unix.ESHUTDOWN},
}

// withErrno gives err the errno of its sentinel (EINVAL for the others),
// keeping err itself as the cause.
func withErrno(err error) error {
	if err == nil {
		return nil
	}
	var ce *cmdErr
	if errors.As(err, &ce) {
		return err
	}
	for _, e := range errnoTable {
		if errors.Is(err, e.err) {
			return &cmdErr{errno: e.errno, err: err}
		}
	}
	return &cmdErr{errno: unix.EINVAL, err: err}
}

// Command serves one CM_* command of the ABI for client c (payload: the
// command's body after the message header) and returns the reply body
// (nil when the reply has none). Errors wrap the errno the client gets.
func (s *Service) Command(c Client, op abi.Cmd, payload []byte) (any, error) {
	h, ok := commands[op]
	if !ok {
		return nil, errnoErr(unix.ENOSYS, "%v is not a CM command", op)
	}
	var out any
	err := s.call(func() error {
		var err error
		out, err = h(s, c, payload)
		return err
	})
	return out, withErrno(err)
}

// Release ends every CM ID of client c, as rdma_destroy_id would (its
// context is going).
func (s *Service) Release(c Client) {
	_ = s.call(func() error {
		cl := s.clients[c]
		if cl == nil {
			return nil
		}
		for _, id := range cl.ids {
			s.destroy(id)
		}
		delete(s.clients, c)
		return nil
	})
}
