package tap

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/internal/nsrun"
)

// ErrConfig reports an invalid configuration or argument.
var ErrConfig = errors.New("tap: invalid configuration")

const (
	// MaxQueues is the largest queue count (the kernel's MAX_TAP_QUEUES
	// is 256).
	MaxQueues = 256

	// DefaultMTU fits a RoCE v2 packet of path MTU 4096 in one frame:
	// IPv6 header 40 (IPv4 with options: up to 60) + UDP 8 + BTH 12 +
	// the longest extension headers on a 4096-byte payload (RETH 16 +
	// ImmDt 4 on RDMA WRITE Only with Immediate) + 4096 + ICRC 4 = 4180
	// (IPv4 with 40 option bytes: 4200). Hardware RoCE NICs ask for the
	// same 4200 for 4096-byte RoCE MTU.
	DefaultMTU = 4200

	minMTU = 1280 // IPv6 minimum link MTU (RFC 8200 5)
	maxMTU = 65521
)

// Config describes a TAP device.
type Config struct {
	// Name of the interface; empty lets the kernel pick tapN.
	Name string
	// Queues is the number of queues (one per worker), 1..MaxQueues.
	Queues int
	// MAC is the emulated NIC's Ethernet address: the source of its
	// frames and the address it answers ARP/ND with. Zero picks a random
	// locally administered unicast address.
	MAC MAC
	// LinkMAC, when non-zero, is set as the kernel interface's address
	// (the kernel's end of the link); otherwise the kernel's random one
	// stays.
	LinkMAC MAC
	// MTU of the interface; 0 means DefaultMTU.
	MTU int
	// Addrs are the NIC's own IPv4/IPv6 addresses (its GIDs); they are not
	// configured on the kernel interface.
	Addrs []netip.Addr
	// NetNS, when not zero, is the network namespace to create the
	// interface in (it is not closed by the Device).
	NetNS netns.NsHandle
	// Neighbor sets ARP/ND timing.
	Neighbor NeighborConfig
	// NoOffload creates the device without a virtio-net header (each
	// read and write exactly one frame, no checksum or segmentation
	// offload), as before the offload existed. By default the device has
	// IFF_VNET_HDR and asks for TUN_F_CSUM|TUN_F_USO4|TUN_F_USO6
	// (Device.Offload says what it got).
	NoOffload bool
}

// Device is a multi-queue TAP device and the emulated NIC's view of it.
type Device struct {
	name   string
	index  int
	mtu    int
	mac    MAC
	queues []*Queue
	gids   *GIDTable
	neigh  *Neighbors

	vnet       int    // VnetHdrLen with IFF_VNET_HDR, else 0
	uso        bool   // TUNSETOFFLOAD took the checksum and USO offloads
	offloadMsg string // what Offload reports

	closeOnce sync.Once
	closeErr  error
}

// Create creates the TAP device: opens one fd per queue (non-blocking,
// on the Go poller), checks the flags, sets MTU and MAC, brings the link
// up. Needs CAP_NET_ADMIN.
func Create(cfg Config) (*Device, error) {
	if cfg.Queues < 1 || cfg.Queues > MaxQueues {
		return nil, fmt.Errorf("%w: %d queues (want 1..%d)", ErrConfig, cfg.Queues, MaxQueues)
	}
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	if cfg.MTU < minMTU || cfg.MTU > maxMTU {
		return nil, fmt.Errorf("%w: MTU %d (want %d..%d)", ErrConfig, cfg.MTU, minMTU, maxMTU)
	}
	if len(cfg.Name) >= unix.IFNAMSIZ || strings.ContainsAny(cfg.Name, "/ %") {
		return nil, fmt.Errorf("%w: interface name %q", ErrConfig, cfg.Name)
	}
	if cfg.MAC == (MAC{}) {
		if _, err := rand.Read(cfg.MAC[:]); err != nil {
			return nil, err
		}
		cfg.MAC[0] = cfg.MAC[0]&^1 | 2 // unicast, locally administered
	}
	if cfg.MAC[0]&1 != 0 || (cfg.LinkMAC != MAC{} && cfg.LinkMAC[0]&1 != 0) {
		return nil, fmt.Errorf("%w: multicast MAC", ErrConfig)
	}
	gids, err := NewGIDTable(cfg.Addrs)
	if err != nil {
		return nil, err
	}

	var (
		files []*os.File
		name  string
		index int
		vnet  bool
	)
	err = nsrun.Run(cfg.NetNS, func(h *netlink.Handle) error {
		var err error
		files, name, index, err = createLink(h, cfg, !cfg.NoOffload)
		vnet = !cfg.NoOffload
		if err != nil && !cfg.NoOffload {
			// A kernel that refuses IFF_VNET_HDR: the plain device.
			files, name, index, err = createLink(h, cfg, false)
			vnet = false
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	d := &Device{name: name, index: index, mtu: cfg.MTU, mac: cfg.MAC, gids: gids}
	switch {
	case cfg.NoOffload:
		d.offloadMsg = "off (not asked for)"
	case !vnet:
		d.offloadMsg = "off: the kernel refused IFF_VNET_HDR"
	default:
		d.vnet = VnetHdrLen
		if oerr := setOffload(files[0]); oerr != nil {
			d.offloadMsg = "off: " + oerr.Error()
		} else {
			d.uso = true
			d.offloadMsg = "uso"
		}
	}
	for i, f := range files {
		q, err := newQueue(i, f, d.vnet)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, err
		}
		d.queues = append(d.queues, q)
	}
	d.neigh = NewNeighbors(cfg.MAC, cfg.Addrs, cfg.Neighbor, d.queues[0].WriteFrame)
	slog.Info("tap device created", "name", name, "queues", cfg.Queues, "mtu", cfg.MTU, "mac", cfg.MAC.String(), "offload", d.offloadMsg)
	return d, nil
}

// createLink runs in the target namespace: creates the non-persistent
// multi-queue TAP, verifies its flags and configures the link. On error
// the fds are closed, which removes the device.
func createLink(h *netlink.Handle, cfg Config, vnet bool) (files []*os.File, name string, index int, err error) {
	tt := &netlink.Tuntap{
		LinkAttrs:  netlink.LinkAttrs{Name: cfg.Name},
		Mode:       netlink.TUNTAP_MODE_TAP,
		Flags:      netlink.TUNTAP_MULTI_QUEUE_DEFAULTS | netlink.TUNTAP_NO_PI,
		Queues:     cfg.Queues,
		NonPersist: true,
	}
	if vnet {
		tt.Flags |= netlink.TUNTAP_VNET_HDR
	}
	if err := h.LinkAdd(tt); err != nil {
		return nil, "", 0, fmt.Errorf("tap: create %q: %w", cfg.Name, err)
	}
	files = tt.Fds
	defer func() {
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			files = nil
		}
	}()
	if len(files) != cfg.Queues {
		return nil, "", 0, fmt.Errorf("tap: create: got %d fds for %d queues", len(files), cfg.Queues)
	}
	name = tt.Name
	if err := checkFlags(files[0], vnet); err != nil {
		return nil, "", 0, err
	}
	link, err := h.LinkByName(name)
	if err != nil {
		return nil, "", 0, fmt.Errorf("tap: find %s: %w", name, err)
	}
	if err := h.LinkSetMTU(link, cfg.MTU); err != nil {
		return nil, "", 0, fmt.Errorf("tap: set MTU of %s: %w", name, err)
	}
	if cfg.LinkMAC != (MAC{}) {
		if err := h.LinkSetHardwareAddr(link, net.HardwareAddr(cfg.LinkMAC[:])); err != nil {
			return nil, "", 0, fmt.Errorf("tap: set MAC of %s: %w", name, err)
		}
	}
	if err := h.LinkSetUp(link); err != nil {
		return nil, "", 0, fmt.Errorf("tap: bring %s up: %w", name, err)
	}
	return files, name, link.Attrs().Index, nil
}

// checkFlags reads the device flags back (TUNGETIFF): a TAP, multi-queue,
// no packet-information header, and a virtio-net header exactly when vnet,
// so each read or write is one Ethernet frame, after the header if any.
func checkFlags(f *os.File, vnet bool) error {
	var flags uint16
	var ierr error
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	if err := rc.Control(func(fd uintptr) {
		var ifr *unix.Ifreq
		ifr, ierr = unix.NewIfreq("")
		if ierr != nil {
			return
		}
		if ierr = unix.IoctlIfreq(int(fd), unix.TUNGETIFF, ifr); ierr == nil {
			flags = ifr.Uint16()
		}
	}); err != nil {
		return err
	}
	if ierr != nil {
		return fmt.Errorf("tap: TUNGETIFF: %w", ierr)
	}
	const want = unix.IFF_TAP | unix.IFF_MULTI_QUEUE | unix.IFF_NO_PI
	if flags&want != want || (flags&unix.IFF_VNET_HDR != 0) != vnet || flags&unix.IFF_TUN != 0 {
		return fmt.Errorf("tap: unexpected device flags %#x", flags)
	}
	return nil
}

// setOffload configures the virtio-net header of a device created with
// IFF_VNET_HDR (any queue's fd configures the device): little-endian
// fields, VnetHdrLen bytes, and the checksum and UDP segmentation
// offloads (offloadFlags; USO needs Linux 6.2). An error means the frames
// keep the header but are never segmented (the kernel refused).
func setOffload(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		if ierr = unix.IoctlSetPointerInt(int(fd), unix.TUNSETVNETLE, 1); ierr != nil {
			ierr = fmt.Errorf("TUNSETVNETLE: %w", ierr)
			return
		}
		if ierr = unix.IoctlSetPointerInt(int(fd), unix.TUNSETVNETHDRSZ, VnetHdrLen); ierr != nil {
			ierr = fmt.Errorf("TUNSETVNETHDRSZ: %w", ierr)
			return
		}
		var sz int
		if sz, ierr = unix.IoctlGetInt(int(fd), unix.TUNGETVNETHDRSZ); ierr == nil && sz != VnetHdrLen {
			ierr = fmt.Errorf("virtio-net header of %d bytes, want %d", sz, VnetHdrLen)
		}
		if ierr != nil {
			return
		}
		if ierr = unix.IoctlSetInt(int(fd), unix.TUNSETOFFLOAD, offloadFlags); ierr != nil {
			ierr = fmt.Errorf("TUNSETOFFLOAD csum+uso4+uso6: %w", ierr)
			// Leave no offload half on: the kernel finishes every frame.
			unix.IoctlSetInt(int(fd), unix.TUNSETOFFLOAD, 0)
		}
	}); err != nil {
		return err
	}
	return ierr
}

// Offload reports whether the device takes and gives UDP packets still to
// be segmented (USO) with a virtio-net header in front of every frame,
// and a word for the log and the stats: "uso", or "off: " and why.
func (d *Device) Offload() (bool, string) { return d.uso, d.offloadMsg }

// Name returns the interface name.
func (d *Device) Name() string { return d.name }

// Index returns the interface index (in its namespace).
func (d *Device) Index() int { return d.index }

// MAC returns the emulated NIC's MAC address.
func (d *Device) MAC() MAC { return d.mac }

// MTU returns the interface MTU.
func (d *Device) MTU() int { return d.mtu }

// MaxFrameSize is the largest frame a queue read returns: MTU plus the
// Ethernet header and one 802.1Q tag.
func (d *Device) MaxFrameSize() int { return d.mtu + ethHLen + vlanHLen }

// NumQueues returns the number of queues.
func (d *Device) NumQueues() int { return len(d.queues) }

// Queue returns queue i (0 <= i < NumQueues).
func (d *Device) Queue(i int) *Queue { return d.queues[i] }

// GIDs returns the GID table.
func (d *Device) GIDs() *GIDTable { return d.gids }

// Neighbors returns the ARP/ND engine (its replies go out on queue 0).
func (d *Device) Neighbors() *Neighbors { return d.neigh }

// Control calls fn with queue 0's fd, valid during the call, e.g. to
// attach eBPF programs with TUNSETSTEERINGEBPF/TUNSETFILTEREBPF (any
// queue's fd configures the whole device).
func (d *Device) Control(fn func(fd int) error) error {
	var ferr error
	rc, err := d.queues[0].file.SyscallConn()
	if err != nil {
		return err
	}
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// Close closes every queue fd, which removes the (non-persistent)
// interface, and ends pending resolutions. Blocked reads return an error
// matching os.ErrClosed. Close is idempotent.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		d.neigh.Close()
		var errs []error
		for _, q := range d.queues {
			if err := q.close(); err != nil {
				errs = append(errs, err)
			}
		}
		d.closeErr = errors.Join(errs...)
		slog.Info("tap device closed", "name", d.name)
	})
	return d.closeErr
}
