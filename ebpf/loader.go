package ebpf

import (
	"errors"
	"fmt"
	"github.com/cilium/ebpf/rlimit"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// MaxQueues is the largest queue count the steering counters cover.
const MaxQueues = 256

// MaxAddrs is the number of IPv4 and of IPv6 device addresses the filter
// maps hold (max_entries in filter.c).
const MaxAddrs = 64

// ErrConfig reports an invalid argument to Load or SetAddrs.
var ErrConfig = errors.New("ebpf: invalid configuration")

// Programs is the loaded steering and filter programs of one TAP device
// and their maps. Methods may be called from several goroutines.
type Programs struct {
	queues int
	steer  steerObjects
	filter filterObjects
}

// Load loads both programs for a TAP device with the given number of
// queues (1..MaxQueues). It needs CAP_BPF (or root).
func Load(queues int) (*Programs, error) {
	if queues < 1 || queues > MaxQueues {
		return nil, fmt.Errorf("%w: %d queues (want 1..%d)", ErrConfig, queues, MaxQueues)
	}
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; newer ones
	// account it to the memory cgroup and this is a no-op.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("ebpf: raise memlock limit: %w", err)
	}
	p := &Programs{queues: queues}
	if err := loadSteerObjects(&p.steer, nil); err != nil {
		return nil, fmt.Errorf("ebpf: load steering program: %w", err)
	}
	if err := loadFilterObjects(&p.filter, nil); err != nil {
		p.steer.Close()
		return nil, fmt.Errorf("ebpf: load filter program: %w", err)
	}
	if err := p.steer.SteerConf.Put(uint32(0), steerSteerConfig{Queues: uint32(queues)}); err != nil {
		p.Close()
		return nil, fmt.Errorf("ebpf: set queue count: %w", err)
	}
	return p, nil
}

// Queues returns the queue count given to Load.
func (p *Programs) Queues() int { return p.queues }

// SteerProgram returns the steering program (owned by p).
func (p *Programs) SteerProgram() *ebpf.Program { return p.steer.VrnicSteer }

// FilterProgram returns the filter program (owned by p).
func (p *Programs) FilterProgram() *ebpf.Program { return p.filter.VrnicFilter }

// SetAddrs replaces the device addresses the filter accepts. IPv4-mapped
// IPv6 addresses count as IPv4. Zones are ignored.
func (p *Programs) SetAddrs(addrs []netip.Addr) error {
	want4 := map[[4]byte]bool{}
	want6 := map[[16]byte]bool{}
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		switch {
		case a.Is4():
			want4[a.As4()] = true
		case a.Is6():
			want6[a.As16()] = true
		default:
			return fmt.Errorf("%w: invalid address %v", ErrConfig, a)
		}
	}
	if len(want4) > MaxAddrs || len(want6) > MaxAddrs {
		return fmt.Errorf("%w: more than %d addresses of one family", ErrConfig, MaxAddrs)
	}
	if err := syncSet(p.filter.DevAddrs4, want4); err != nil {
		return fmt.Errorf("ebpf: set IPv4 addresses: %w", err)
	}
	if err := syncSet(p.filter.DevAddrs6, want6); err != nil {
		return fmt.Errorf("ebpf: set IPv6 addresses: %w", err)
	}
	return nil
}

// syncSet makes the keys of the hash map m equal to want: new keys are
// added before stale ones are removed, so an address kept across the call
// is never missing.
func syncSet[K comparable](m *ebpf.Map, want map[K]bool) error {
	for k := range want {
		if err := m.Put(k, uint8(1)); err != nil {
			return err
		}
	}
	var (
		k     K
		v     uint8
		stale []K
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// Attach attaches both programs to the TAP device behind tapFD (any of its
// queue fds): TUNSETSTEERINGEBPF and TUNSETFILTEREBPF, each taking a
// pointer to the program fd. The caller keeps ownership of tapFD.
func (p *Programs) Attach(tapFD int) error {
	if err := unix.IoctlSetPointerInt(tapFD, unix.TUNSETSTEERINGEBPF, p.steer.VrnicSteer.FD()); err != nil {
		return fmt.Errorf("ebpf: TUNSETSTEERINGEBPF: %w", err)
	}
	if err := unix.IoctlSetPointerInt(tapFD, unix.TUNSETFILTEREBPF, p.filter.VrnicFilter.FD()); err != nil {
		_ = unix.IoctlSetPointerInt(tapFD, unix.TUNSETSTEERINGEBPF, -1)
		return fmt.Errorf("ebpf: TUNSETFILTEREBPF: %w", err)
	}
	return nil
}

// Detach removes the steering and filter programs from the TAP device
// behind tapFD (a program fd of -1 detaches).
func Detach(tapFD int) error {
	errS := unix.IoctlSetPointerInt(tapFD, unix.TUNSETSTEERINGEBPF, -1)
	errF := unix.IoctlSetPointerInt(tapFD, unix.TUNSETFILTEREBPF, -1)
	if err := errors.Join(errS, errF); err != nil {
		return fmt.Errorf("ebpf: detach: %w", err)
	}
	return nil
}

// Close frees the programs and maps held by p. Programs attached to a TAP
// device stay attached (the kernel holds a reference).
func (p *Programs) Close() error {
	return errors.Join(p.steer.Close(), p.filter.Close())
}
