package verbs

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
	"golang.org/x/sys/unix"
)

// Context is an open device context: the control connection, the doorbell
// page mapped from the daemon's memfd and the kick eventfd. Everything
// created through a Context belongs to it; closing the Context (or the
// process dying) makes the daemon destroy all of it.
//
// Control calls (Alloc*, Create*, Modify, Query, Destroy) are safe for
// concurrent use. Posting and polling on one QP or CQ must be done by one
// goroutine at a time (like libibverbs without its internal locks).
type Context struct {
	k         *ctrl
	handle    uint32
	dbPage    []byte // the doorbell page, shared with the daemon
	dbRecords uint32
	kickFd    int
	kickVal   [8]byte // the eventfd value 1, kept here so a kick allocates nothing
	// summary: the daemon reads the doorbell summary (ABI 1.3) and this
	// context marks every post there (DBFlagSummary set).
	summary bool
	// kickGen: kick_needed is a generation (abi.DBDaemonKickGen), and
	// kicked the value this context last kicked for (0: none).
	kickGen bool
	kicked  atomic.Uint32

	mu     sync.Mutex
	arenas []*HostMem // the default allocator's host memory
	closed bool

	odp odpState // on-demand paging (odp.go)
}

// Option configures Open.
type Option func(*openConfig)

type openConfig struct {
	name      string
	noSummary bool
}

// WithoutDoorbellSummary makes the context leave the doorbell summary
// (ABI 1.3, abi.DBFlagSummary) unused, as a client of ABI 1.2 does: the
// daemon then finds its posts without it, more slowly when the context
// has many QPs.
func WithoutDoorbellSummary() Option { return func(c *openConfig) { c.noSummary = true } }

// WithClientName sets the name the daemon shows for this context (at most
// 32 bytes are sent). The default is the program name.
func WithClientName(name string) Option { return func(c *openConfig) { c.name = name } }

// Open connects to the daemon's control socket at socketPath and opens a
// context (VRNIC_CMD_OPEN_CONTEXT): it checks the ABI version and maps the
// doorbell page.
func Open(socketPath string, opts ...Option) (*Context, error) {
	cfg := openConfig{name: filepath.Base(os.Args[0])}
	for _, o := range opts {
		o(&cfg)
	}
	k, err := dialCtrl(socketPath)
	if err != nil {
		return nil, fmt.Errorf("verbs: open %s: %w", socketPath, err)
	}
	req := abi.CmdOpenContextReq{ABIVersion: abi.Version}
	copy(req.ClientName[:], cfg.name)
	var resp abi.RespOpenContext
	fds, _, err := k.call(abi.CmdOpenContext, &req, nil, nil, &resp)
	if err != nil {
		k.close()
		return nil, err
	}
	if len(fds) != 2 {
		closeAll(fds)
		k.close()
		return nil, fmt.Errorf("%w: OPEN_CONTEXT reply carried %d fds, want 2", ErrProtocol, len(fds))
	}
	dbFd, kickFd := fds[0], fds[1]
	if resp.DBPageSize == 0 || resp.DBPageSize%4096 != 0 || resp.DBRecords == 0 ||
		uint64(resp.DBRecords)*abi.DBRecordSize > uint64(resp.DBPageSize) {
		closeAll(fds)
		k.close()
		return nil, fmt.Errorf("%w: doorbell page of %d bytes with %d records", ErrProtocol, resp.DBPageSize, resp.DBRecords)
	}
	page, err := unix.Mmap(dbFd, 0, int(resp.DBPageSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(dbFd)
	if err != nil {
		unix.Close(kickFd)
		k.close()
		return nil, fmt.Errorf("verbs: map doorbell page: %w", err)
	}
	if m := binary.LittleEndian.Uint32(page[abi.OffDBMagic:]); m != abi.DBMagic {
		unix.Munmap(page)
		unix.Close(kickFd)
		k.close()
		return nil, fmt.Errorf("%w: doorbell page magic %#x", ErrProtocol, m)
	}
	c := &Context{k: k, handle: resp.CtxHandle, dbPage: page, dbRecords: resp.DBRecords, kickFd: kickFd}
	binary.LittleEndian.PutUint64(c.kickVal[:], 1)
	if resp.ABIVersion>>16 == abi.VersionMajor && resp.ABIVersion&0xffff >= 3 && !cfg.noSummary {
		// The daemon reads the summary: promise to mark every post.
		or32(page[abi.OffDBClientFlags:], abi.DBFlagSummary)
		c.summary = true
	}
	c.kickGen = load32(page[abi.OffDBDaemonFlags:])&abi.DBDaemonKickGen != 0
	return c, nil
}

// Handle returns the daemon's handle of this context.
func (c *Context) Handle() uint32 { return c.handle }

// Close closes the control connection (the daemon then destroys every
// object of the context) and unmaps the doorbell page and host memory.
// Objects of the context must not be used afterwards.
func (c *Context) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	arenas := c.arenas
	c.arenas = nil
	c.mu.Unlock()
	err := c.k.close()
	for _, h := range arenas {
		h.unmap()
	}
	unix.Munmap(c.dbPage)
	unix.Close(c.kickFd)
	return err
}

// record returns the 128-byte doorbell record idx.
func (c *Context) record(idx uint32) ([]byte, error) {
	if idx == 0 || idx >= c.dbRecords {
		return nil, fmt.Errorf("%w: doorbell record %d out of range", ErrProtocol, idx)
	}
	off := int(idx) * abi.DBRecordSize
	return c.dbPage[off : off+abi.DBRecordSize : off+abi.DBRecordSize], nil
}

// createdRecord returns the doorbell record idx of an object the daemon
// has just created (handle h, destroyed by op). If idx is out of range it
// destroys the object and frees rings, the object's host memory.
func (c *Context) createdRecord(idx uint32, op abi.Cmd, h uint32, rings ...*Buffer) ([]byte, error) {
	rec, err := c.record(idx)
	if err != nil {
		c.destroy(op, h)
		freeBuffers(rings...)
	}
	return rec, err
}

// freeBuffers frees every non-nil buffer of bufs.
func freeBuffers(bufs ...*Buffer) {
	for _, b := range bufs {
		if b != nil {
			b.Free()
		}
	}
}

// summaryBit is a record's bit in the doorbell summary: word nil when
// the context does not mark its posts.
type summaryBit struct {
	word []byte
	bit  uint32
}

// summaryOf returns the summary bit of record idx (see abi.DBFlagSummary).
func (c *Context) summaryOf(idx uint32) summaryBit {
	if !c.summary || idx >= abi.DBSummaryWords*32*abi.DBSummaryGroup {
		return summaryBit{}
	}
	g := idx / abi.DBSummaryGroup
	return summaryBit{word: c.dbPage[abi.OffDBSummary+4*(g/32):], bit: 1 << (g % 32)}
}

// kick wakes the daemon if it asked for it (kick_needed set). Called after
// the producer index store; both are sequentially consistent. With a
// daemon that numbers its sleeps (kickGen) it writes once per value: the
// daemon clears kick_needed only after it woke and before it reads the
// records again, so a post that still finds the value kicked for is read.
func (c *Context) kick() {
	k := load32(c.dbPage[abi.OffDBKickNeeded:])
	if k == 0 {
		if c.kickGen && c.kicked.Load() != 0 {
			c.kicked.Store(0)
		}
		return
	}
	if c.kickGen && c.kicked.Load() == k {
		return
	}
	unix.Write(c.kickFd, c.kickVal[:])
	if c.kickGen {
		c.kicked.Store(k)
	}
}

// QueryDevice returns the device attributes.
func (c *Context) QueryDevice() (abi.DeviceAttr, error) {
	var a abi.DeviceAttr
	_, _, err := c.k.call(abi.CmdQueryDevice, nil, nil, nil, &a)
	return a, err
}

// QueryPort returns the attributes of port (1).
func (c *Context) QueryPort(port uint32) (abi.PortAttr, error) {
	var a abi.PortAttr
	_, _, err := c.k.call(abi.CmdQueryPort, &abi.CmdQueryPortReq{PortNum: port}, nil, nil, &a)
	return a, err
}

// QueryGID returns entry index of the GID table of port.
func (c *Context) QueryGID(port, index uint32) (abi.RespQueryGID, error) {
	var g abi.RespQueryGID
	_, _, err := c.k.call(abi.CmdQueryGID, &abi.CmdQueryGIDReq{PortNum: port, Index: index}, nil, nil, &g)
	return g, err
}

// destroy sends a one-handle command.
func (c *Context) destroy(op abi.Cmd, h uint32) error {
	_, _, err := c.k.call(op, &abi.CmdHandleReq{Handle: h}, nil, nil, nil)
	return err
}

// Destroy sends a one-handle command (DESTROY_*, DEALLOC_PD, DEREG_MR,
// REMOVE_HOST_MEM) by opcode: a low-level escape hatch for tools and tests
// that need to name a handle directly.
func (c *Context) Destroy(op abi.Cmd, handle uint32) error { return c.destroy(op, handle) }
