package queues_test

// An exact count of the system calls one thread makes over a stretch of
// code: a perf event on the tracepoint raw_syscalls:sys_enter, attached to
// that thread only (pid = its tid, cpu = -1), counts every system call the
// thread enters. A second event on the same tracepoint samples every call
// except write(2) (PERF_SAMPLE_RAW, period 1, tracepoint filter) into a
// ring buffer the kernel fills without any help from the thread, so the
// other calls in the window can be named: writes, the kicks, are the
// expected calls; anything else needs explaining. The window is delimited
// in the sample stream by the counter's own read(2) calls, recognised by
// their fd, so the named calls are exactly the counted ones.
//
// The daemon side of the test finds the tracepoint id in tracefs (mounting
// a private tracefs instance on a temporary directory, and unmounting it,
// when none is mounted and the process may mount) and hands it to the
// client process, which opens the events on its posting thread.

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tracepoint identifies raw_syscalls:sys_enter for perf_event_open.
type tracepoint struct {
	ID       uint64 // 0: unavailable
	IDOffset uint32 // offset of "long id" in the raw record
	Where    string // where the id was read, or why it is unavailable
}

var (
	sysEnterOnce sync.Once
	sysEnterTP   tracepoint
)

// sysEnterTracepoint returns the tracepoint of raw_syscalls:sys_enter,
// looked up once per process.
func sysEnterTracepoint() tracepoint {
	sysEnterOnce.Do(func() { sysEnterTP = findSysEnter() })
	return sysEnterTP
}

func findSysEnter() tracepoint {
	var why []string
	for _, root := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		tp, err := readSysEnter(root)
		if err == nil {
			return tp
		}
		why = append(why, err.Error())
	}
	// No tracefs mounted: mount a private instance, read the id and
	// unmount it again (the id is the kernel's, not the mount's).
	dir, err := os.MkdirTemp("", "vrnic-tracefs-")
	if err != nil {
		return tracepoint{Where: strings.Join(append(why, err.Error()), "; ")}
	}
	defer os.Remove(dir)
	if err := unix.Mount("nodev", dir, "tracefs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		why = append(why, fmt.Sprintf("mount tracefs on %s: %v", dir, err))
		return tracepoint{Where: strings.Join(why, "; ")}
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	tp, err := readSysEnter(dir)
	if err != nil {
		return tracepoint{Where: strings.Join(append(why, err.Error()), "; ")}
	}
	tp.Where += " (tracefs mounted for the lookup, then unmounted)"
	return tp
}

func readSysEnter(root string) (tracepoint, error) {
	dir := filepath.Join(root, "events/raw_syscalls/sys_enter")
	b, err := os.ReadFile(filepath.Join(dir, "id"))
	if err != nil {
		return tracepoint{}, err
	}
	id, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return tracepoint{}, fmt.Errorf("%s/id: %w", dir, err)
	}
	tp := tracepoint{ID: id, IDOffset: 8, Where: dir}
	// The offset of the system call number in the raw record, from the
	// event's format ("field:long id;	offset:8;	size:8;	signed:1;").
	if f, err := os.ReadFile(filepath.Join(dir, "format")); err == nil {
		for line := range strings.SplitSeq(string(f), "\n") {
			if !strings.Contains(line, "field:long id;") {
				continue
			}
			for part := range strings.SplitSeq(line, ";") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(part), "offset:"); ok {
					if o, err := strconv.ParseUint(v, 10, 32); err == nil {
						tp.IDOffset = uint32(o)
					}
				}
			}
		}
	}
	return tp, nil
}

// syscallReport is what the client reports about its posting thread.
type syscallReport struct {
	Exact  bool   // Count is the exact number of system calls in the window
	Count  uint64 // system calls the posting thread entered in the window
	TID    int    // the posting thread
	Note   string // how it was measured, or why it could not be
	Named  bool   // Others holds every call in the window but write(2)
	Others map[string]uint64
	// Writes is Count minus the calls in Others (when Named).
	Writes uint64
}

// syscallCounter counts the system calls of the thread that opened it.
// Begin and End bracket the measured code; everything from the open to
// End must run on that thread (runtime.LockOSThread).
type syscallCounter struct {
	tid      int
	count    int // counting event: every call
	calib    uint64
	c0       uint64
	sample   int    // sampling event: every call but write(2); -1: none
	ring     []byte // its mmap: metadata page + data pages
	head     *atomic.Uint64
	h0       uint64
	idOffset uint32
	note     string
}

const perfRingPages = 16 // data pages; a sample takes 80 bytes

// openSyscallCounter opens the events on the calling thread.
func openSyscallCounter(tp tracepoint) (*syscallCounter, error) {
	if tp.ID == 0 {
		return nil, fmt.Errorf("no id for the tracepoint raw_syscalls:sys_enter")
	}
	c := &syscallCounter{tid: unix.Gettid(), sample: -1, idOffset: tp.IDOffset}
	attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_TRACEPOINT, Config: tp.ID}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, c.tid, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("perf_event_open(tracepoint %d, tid %d, cpu -1): %w", tp.ID, c.tid, err)
	}
	c.count = fd
	if err := c.openSampler(attr); err != nil {
		c.note = "calls not named: " + err.Error()
	}
	// Each read(2) of the counter is a system call of the thread, counted
	// at its entry: measure what back-to-back reads add (1; the least of a
	// few tries, in case the runtime slipped a call in between).
	c.calib = ^uint64(0)
	for range 3 {
		a, err := c.read()
		if err != nil {
			c.Close()
			return nil, err
		}
		b, err := c.read()
		if err != nil {
			c.Close()
			return nil, err
		}
		c.calib = min(c.calib, b-a)
	}
	return c, nil
}

func (c *syscallCounter) openSampler(attr unix.PerfEventAttr) error {
	attr.Sample = 1 // sample_period: every call that passes the filter
	attr.Sample_type = unix.PERF_SAMPLE_RAW
	fd, err := unix.PerfEventOpen(&attr, c.tid, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("sampling perf_event_open: %w", err)
	}
	if err := unix.IoctlSetString(fd, unix.PERF_EVENT_IOC_SET_FILTER, fmt.Sprintf("id != %d", unix.SYS_WRITE)); err != nil {
		unix.Close(fd)
		return fmt.Errorf("tracepoint filter: %w", err)
	}
	ring, err := unix.Mmap(fd, 0, (1+perfRingPages)*os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("mmap perf ring: %w", err)
	}
	c.sample, c.ring = fd, ring
	c.head = (*atomic.Uint64)(unsafe.Pointer(&ring[unsafe.Offsetof(unix.PerfEventMmapPage{}.Data_head)]))
	return nil
}

func (c *syscallCounter) read() (uint64, error) {
	var b [8]byte
	n, err := unix.Read(c.count, b[:])
	if err != nil {
		return 0, fmt.Errorf("read perf counter: %w", err)
	}
	if n != 8 {
		return 0, fmt.Errorf("read perf counter: %d bytes", n)
	}
	return binary.NativeEndian.Uint64(b[:]), nil
}

// Begin opens the window: it runs from the entry of Begin's read(2) of the
// counter to the entry of End's.
func (c *syscallCounter) Begin() error {
	if c.head != nil {
		c.h0 = c.head.Load() // before the read's own sample
	}
	v, err := c.read()
	if err != nil {
		return err
	}
	c.c0 = v
	return nil
}

// End closes the window and reports the calls made in it.
func (c *syscallCounter) End() (syscallReport, error) {
	v, err := c.read()
	if err != nil {
		return syscallReport{}, err
	}
	var h1 uint64
	if c.head != nil {
		h1 = c.head.Load() // after the read's own sample
	}
	d := v - c.c0
	if d < c.calib {
		return syscallReport{}, fmt.Errorf("perf counter went from %d to %d (calibration %d)", c.c0, v, c.calib)
	}
	r := syscallReport{Exact: true, Count: d - c.calib, TID: c.tid,
		Note: fmt.Sprintf("perf event on raw_syscalls:sys_enter attached to tid %d, cpu -1 (%d subtracted for its own read)", c.tid, c.calib)}
	if c.note != "" {
		r.Note += "; " + c.note
	}
	if c.head != nil {
		others, err := c.samples(c.h0, h1)
		var n uint64
		for _, k := range others {
			n += k
		}
		switch {
		case err != nil:
			r.Note += "; calls not named: " + err.Error()
		case n > r.Count:
			r.Note += fmt.Sprintf("; calls not named: %d samples for %d calls", n, r.Count)
		default:
			r.Named, r.Others, r.Writes = true, others, r.Count-n
		}
	}
	return r, nil
}

// samples decodes the ring between two data_head values and returns the
// calls between the first and the last read(2) of the counter there,
// by name. Nothing consumes the ring, so it holds the first size bytes of
// samples since the open; a ring that may have dropped some is an error.
func (c *syscallCounter) samples(from, to uint64) (map[string]uint64, error) {
	meta := (*unix.PerfEventMmapPage)(unsafe.Pointer(&c.ring[0]))
	off, size := meta.Data_offset, meta.Data_size
	if size == 0 { // kernels before 4.1
		off, size = uint64(os.Getpagesize()), uint64(len(c.ring)-os.Getpagesize())
	}
	if to+512 > size {
		return nil, fmt.Errorf("sample ring full")
	}
	data := c.ring[off : off+size]
	ne := binary.NativeEndian
	type call struct{ nr, arg0 uint64 }
	var calls []call
	for pos := from; pos+8 <= to; {
		typ, recSize := ne.Uint32(data[pos:]), uint64(ne.Uint16(data[pos+6:])) // struct perf_event_header
		if recSize < 8 || pos+recSize > to {
			return nil, fmt.Errorf("bad sample record at %d", pos)
		}
		switch typ {
		case unix.PERF_RECORD_SAMPLE:
			// u32 size, then the raw record: long id, unsigned long args[6].
			rec := data[pos+8 : pos+recSize]
			o := 4 + uint64(c.idOffset)
			if uint64(len(rec)) < o+16 || uint64(ne.Uint32(rec)) < uint64(c.idOffset)+16 {
				return nil, fmt.Errorf("short sample at %d", pos)
			}
			calls = append(calls, call{ne.Uint64(rec[o:]), ne.Uint64(rec[o+8:])})
		case unix.PERF_RECORD_LOST:
			return nil, fmt.Errorf("samples lost")
		}
		pos += recSize
	}
	first, last := -1, -1
	for i, k := range calls {
		if k.nr == unix.SYS_READ && k.arg0 == uint64(c.count) {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 || first == last {
		return nil, fmt.Errorf("the counter's reads are not in the samples")
	}
	out := map[string]uint64{}
	for _, k := range calls[first+1 : last] {
		out[syscallName(k.nr)]++
	}
	return out, nil
}

// Close releases the events.
func (c *syscallCounter) Close() error {
	if c.ring != nil {
		unix.Munmap(c.ring)
		c.ring = nil
	}
	if c.sample >= 0 {
		unix.Close(c.sample)
	}
	return unix.Close(c.count)
}

var syscallNames = map[uint64]string{
	unix.SYS_READ:           "read",
	unix.SYS_WRITE:          "write",
	unix.SYS_FUTEX:          "futex",
	unix.SYS_CLONE:          "clone",
	unix.SYS_MMAP:           "mmap",
	unix.SYS_MUNMAP:         "munmap",
	unix.SYS_MADVISE:        "madvise",
	unix.SYS_MPROTECT:       "mprotect",
	unix.SYS_NANOSLEEP:      "nanosleep",
	unix.SYS_SCHED_YIELD:    "sched_yield",
	unix.SYS_RT_SIGRETURN:   "rt_sigreturn",
	unix.SYS_RT_SIGPROCMASK: "rt_sigprocmask",
	unix.SYS_SIGALTSTACK:    "sigaltstack",
	unix.SYS_GETTID:         "gettid",
	unix.SYS_TGKILL:         "tgkill",
	unix.SYS_GETPID:         "getpid",
	unix.SYS_RECVMSG:        "recvmsg",
	unix.SYS_SENDMSG:        "sendmsg",
	unix.SYS_EPOLL_PWAIT:    "epoll_pwait",
}

func syscallName(nr uint64) string {
	if s, ok := syscallNames[nr]; ok {
		return s
	}
	return "nr " + strconv.FormatUint(nr, 10)
}

// String formats a report for a log line.
func (r syscallReport) String() string {
	if !r.Exact {
		return "exact count unavailable (" + r.Note + ")"
	}
	s := fmt.Sprintf("%d", r.Count)
	if r.Named {
		parts := []string{fmt.Sprintf("write×%d", r.Writes)}
		names := make([]string, 0, len(r.Others))
		for n := range r.Others {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			parts = append(parts, fmt.Sprintf("%s×%d", n, r.Others[n]))
		}
		s += " [" + strings.Join(parts, " ") + "]"
	}
	return s + " (" + r.Note + ")"
}
