package device

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/vrnic/vrnic/abi"
	"golang.org/x/sys/unix"
)

// memDoorbellPage is a context's doorbell page: a memfd of
// VRNIC_DB_PAGE_SIZE bytes mapped shared by the daemon and the client,
// record 0 initialised as the page header (magic, ABI version,
// kick_needed 0), records 1..N-1 handed out to QPs, CQs and SRQs; and the
// context's kick eventfd (EFD_NONBLOCK|EFD_CLOEXEC).
//
// fd ownership: the page owns both fds and closes them in Close; the
// control server passes them to the client with SCM_RIGHTS (the kernel
// duplicates them into the client).
//
// A freed record is zeroed before reuse so a new QP/CQ/SRQ starts from
// index 0 whatever the previous user left.
type memDoorbellPage struct {
	mu     sync.Mutex
	memfd  int
	kickfd int
	mem    []byte
	used   []bool
	next   uint32
	nfree  int
	closed bool
}

// NewDoorbellPage creates a doorbell page and kick eventfd. It is the
// default DoorbellFactory.
func NewDoorbellPage() (DoorbellPage, error) {
	fd, err := unix.MemfdCreate("vrnic-doorbell", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, abi.DBPageSize); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate doorbell page: %w", err)
	}
	// The client must not be able to shrink the page under the daemon.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("seal doorbell page: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, abi.DBPageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("map doorbell page: %w", err)
	}
	kfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Munmap(mem)
		unix.Close(fd)
		return nil, fmt.Errorf("kick eventfd: %w", err)
	}
	binary.LittleEndian.PutUint32(mem[abi.OffDBMagic:], abi.DBMagic)
	binary.LittleEndian.PutUint32(mem[abi.OffDBABIVersion:], abi.Version)
	return &memDoorbellPage{memfd: fd, kickfd: kfd, mem: mem, used: make([]bool, abi.DBRecords),
		next: 1, nfree: abi.DBRecords - 1}, nil
}

func (p *memDoorbellPage) MemFd() int      { return p.memfd }
func (p *memDoorbellPage) KickFd() int     { return p.kickfd }
func (p *memDoorbellPage) Size() uint32    { return abi.DBPageSize }
func (p *memDoorbellPage) Records() uint32 { return abi.DBRecords }
func (p *memDoorbellPage) Bytes() []byte   { return p.mem }

var errNoRecords = errors.New("no free doorbell record")

func (p *memDoorbellPage) Alloc() (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.nfree == 0 {
		return 0, errNoRecords
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
			return i, nil
		}
	}
}

func (p *memDoorbellPage) Free(i uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || i == 0 || i >= abi.DBRecords || !p.used[i] {
		return
	}
	clear(p.mem[i*abi.DBRecordSize : (i+1)*abi.DBRecordSize])
	p.used[i] = false
	p.nfree++
}

func (p *memDoorbellPage) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	err := unix.Munmap(p.mem)
	p.mem = nil
	unix.Close(p.memfd)
	unix.Close(p.kickfd)
	return err
}
