package doorbell

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

// Sentinel errors.
var (
	ErrNoRecords = errors.New("doorbell: no free doorbell record")
	ErrRecord    = errors.New("doorbell: record index out of range")
	ErrBadPage   = errors.New("doorbell: not a vrnic doorbell page")
	ErrClosed    = errors.New("doorbell: page closed")
)

// QPRecord is a QP's doorbell words.
type QPRecord struct {
	SQPI, RQPI *atomic.Uint32 // client
	SQCI, RQCI *atomic.Uint32 // daemon
}

// CQRecord is a CQ's doorbell words.
type CQRecord struct {
	CI, Arm                 *atomic.Uint32 // client
	PI, ArmSNDone, Overflow *atomic.Uint32 // daemon
}

// SRQRecord is an SRQ's doorbell words.
type SRQRecord struct {
	PI *atomic.Uint32 // client
	CI *atomic.Uint32 // daemon
}

// Page is a context's doorbell page and kick eventfd, on the daemon side
// (New) or the client side (Map).
type Page struct {
	mem   []byte // the mapping, abi.DBPageSize bytes
	memfd int
	kick  *EventFD

	mu     sync.Mutex // guards the allocator and closed
	used   []bool
	next   uint32
	nfree  uint32
	closed bool
}

// New creates a daemon-side page: a sealed memfd of abi.DBPageSize bytes,
// mapped shared, with the header initialised (magic, ABI version,
// kick_needed 0), and a kick eventfd (EFD_NONBLOCK|EFD_CLOEXEC).
func New() (*Page, error) {
	fd, err := unix.MemfdCreate("vrnic-doorbell", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("doorbell: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, abi.DBPageSize); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("doorbell: ftruncate: %w", err)
	}
	// The client cannot shrink the page under the daemon's mapping (SIGBUS).
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("doorbell: seal: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, abi.DBPageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("doorbell: mmap: %w", err)
	}
	kick, err := NewEventFD()
	if err != nil {
		unix.Munmap(mem)
		unix.Close(fd)
		return nil, err
	}
	p := &Page{mem: mem, memfd: fd, kick: kick, used: make([]bool, abi.DBRecords), next: 1, nfree: abi.DBRecords - 1}
	word(mem, abi.OffDBMagic).Store(abi.DBMagic)
	word(mem, abi.OffDBABIVersion).Store(abi.Version)
	word(mem, abi.OffDBDaemonFlags).Store(abi.DBDaemonKickGen)
	p.KickNeeded().Store(0)
	return p, nil
}

// Map maps a doorbell page received from the daemon (client side) and
// checks its size, magic and ABI major version. On success the Page owns
// memfd and kickfd (Close closes them); on error the caller still owns
// them. Alloc and Free are not for clients.
func Map(memfd, kickfd int) (*Page, error) {
	var st unix.Stat_t
	if err := unix.Fstat(memfd, &st); err != nil {
		return nil, fmt.Errorf("doorbell: fstat: %w", err)
	}
	if st.Size < abi.DBPageSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadPage, st.Size)
	}
	kick, err := EventFDFrom(kickfd)
	if err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(memfd, 0, abi.DBPageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("doorbell: mmap: %w", err)
	}
	if m, v := word(mem, abi.OffDBMagic).Load(), word(mem, abi.OffDBABIVersion).Load(); m != abi.DBMagic || v>>16 != abi.VersionMajor {
		unix.Munmap(mem)
		return nil, fmt.Errorf("%w: magic %#x, ABI version %#x", ErrBadPage, m, v)
	}
	return &Page{mem: mem, memfd: memfd, kick: kick}, nil
}

// MemFd is the page's memfd (owned by the page).
func (p *Page) MemFd() int { return p.memfd }

// KickFd is the kick eventfd's descriptor (owned by the page).
func (p *Page) KickFd() int { return p.kick.Fd() }

// Kick is the context's kick eventfd.
func (p *Page) Kick() *EventFD { return p.kick }

// Size is the page size in bytes.
func (p *Page) Size() uint32 { return abi.DBPageSize }

// Records is the number of records, the header included.
func (p *Page) Records() uint32 { return abi.DBRecords }

// KickNeeded is the header's kick_needed word.
func (p *Page) KickNeeded() *atomic.Uint32 { return word(p.mem, abi.OffDBKickNeeded) }

// ClientFlags is the header's client_flags word (ABI 1.3, client-written:
// abi.DBFlagSummary).
func (p *Page) ClientFlags() *atomic.Uint32 { return word(p.mem, abi.OffDBClientFlags) }

// Summary is word i (0 <= i < abi.DBSummaryWords) of the header's
// doorbell summary (ABI 1.3): bit b marks the records of group 32*i+b,
// abi.DBSummaryGroup records each.
func (p *Page) Summary(i int) *atomic.Uint32 { return word(p.mem, abi.OffDBSummary+4*uint32(i)) }

// Mark sets the summary bit of record i, as a client of ABI 1.3 does
// after it stored a producer index of the record (tests, the daemon's
// own clients).
func (p *Page) Mark(i uint32) {
	g := i / abi.DBSummaryGroup
	w, bit := p.Summary(int(g/32)), uint32(1)<<(g%32)
	if w.Load()&bit == 0 {
		w.Or(bit)
	}
}

// Alloc hands out a free record (never 0), zeroed.
func (p *Page) Alloc() (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	if p.nfree == 0 {
		return 0, ErrNoRecords
	}
	for {
		i := p.next
		p.next++
		if p.next >= abi.DBRecords {
			p.next = 1
		}
		if !p.used[i] {
			p.used[i] = true
			p.nfree--
			clear(p.mem[i*abi.DBRecordSize : (i+1)*abi.DBRecordSize])
			return i, nil
		}
	}
}

// Free returns record i; unknown or free indices are ignored.
func (p *Page) Free(i uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || i == 0 || i >= abi.DBRecords || !p.used[i] {
		return
	}
	clear(p.mem[i*abi.DBRecordSize : (i+1)*abi.DBRecordSize])
	p.used[i] = false
	p.nfree++
}

func (p *Page) record(i uint32) (uint32, error) {
	if i == 0 || i >= abi.DBRecords {
		return 0, fmt.Errorf("%w: %d", ErrRecord, i)
	}
	return i * abi.DBRecordSize, nil
}

// QP returns the words of QP record i.
func (p *Page) QP(i uint32) (QPRecord, error) {
	o, err := p.record(i)
	if err != nil {
		return QPRecord{}, err
	}
	return QPRecord{
		SQPI: word(p.mem, o+abi.OffDBSQPI), RQPI: word(p.mem, o+abi.OffDBRQPI),
		SQCI: word(p.mem, o+abi.OffDBSQCI), RQCI: word(p.mem, o+abi.OffDBRQCI),
	}, nil
}

// CQ returns the words of CQ record i.
func (p *Page) CQ(i uint32) (CQRecord, error) {
	o, err := p.record(i)
	if err != nil {
		return CQRecord{}, err
	}
	return CQRecord{
		CI: word(p.mem, o+abi.OffDBCQCI), Arm: word(p.mem, o+abi.OffDBCQArm),
		PI: word(p.mem, o+abi.OffDBCQPI), ArmSNDone: word(p.mem, o+abi.OffDBArmSNDone),
		Overflow: word(p.mem, o+abi.OffDBOverflow),
	}, nil
}

// SRQ returns the words of SRQ record i.
func (p *Page) SRQ(i uint32) (SRQRecord, error) {
	o, err := p.record(i)
	if err != nil {
		return SRQRecord{}, err
	}
	return SRQRecord{PI: word(p.mem, o+abi.OffDBSRQPI), CI: word(p.mem, o+abi.OffDBSRQCI)}, nil
}

// Ring is the client's doorbell: store v to the producer index pi (a word
// of this page), then, only if the daemon advertised kick_needed, write the
// kick eventfd. It reports whether it kicked (made a system call).
func (p *Page) Ring(pi *atomic.Uint32, v uint32) (bool, error) {
	pi.Store(v)
	if p.KickNeeded().Load() == 0 {
		return false, nil
	}
	return true, p.kick.Signal()
}

// Close unmaps the page and closes the memfd and the kick eventfd.
func (p *Page) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	err := unix.Munmap(p.mem)
	p.mem = nil
	unix.Close(p.memfd)
	p.kick.Close()
	return err
}
