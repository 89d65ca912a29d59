package tap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/tap"
)

// A capture that sees the wire as a device without offloads would carry
// it. With the TAP offload the daemons write runs of frames as segmented
// packets (UDP GSO) and the bridge forwards them whole to a peer TAP that
// takes them, so a capture on a bridge port (tshark, any AF_PACKET tap)
// sees one large packet holding several RoCE packets, which is not what
// goes on a wire: the kernel cuts it into frames wherever the next device
// cannot take it whole (a NIC without USO, a veth to Soft-RoCE's stack).
// vnetCapture captures with an AF_PACKET socket that asks for
// PACKET_VNET_HDR, so each segmented packet comes with its segment size,
// and writes two pcaps: raw, as captured, and wire, where each segmented
// packet is cut as the kernel's segmentation cuts it (refSegment, written
// here independently of the link's code) and partial checksums are
// completed. The test's checks (roce.Parse with the ICRC, tshark) then
// run on the wire pcap: what every receiver sees.
type vnetCapture struct {
	fd       int
	stopped  chan struct{}
	done     chan error
	mu       sync.Mutex
	packets  int // captured
	gso      int // of them segmented
	segments int // frames cut from those
}

// startVnetCapture captures iface in namespace ns to the pcaps rawFile
// and wireFile.
func startVnetCapture(t *testing.T, ns, iface, rawFile, wireFile string) *vnetCapture {
	t.Helper()
	c := &vnetCapture{fd: -1, stopped: make(chan struct{}), done: make(chan error, 1)}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread ends with the goroutine
		h, err := netns.GetFromName(ns)
		if err == nil {
			err = netns.Set(h)
			h.Close()
		}
		if err != nil {
			ready <- err
			c.done <- nil
			return
		}
		fd, err := openVnetSocket(iface)
		if err != nil {
			ready <- err
			c.done <- nil
			return
		}
		c.fd = fd
		ready <- nil
		c.done <- c.loop(fd, rawFile, wireFile)
	}()
	require.NoError(t, <-ready, "capture socket on %s", iface)
	t.Cleanup(func() { c.stop() })
	return c
}

func openVnetSocket(iface string) (int, error) {
	proto := int(htons(unix.ETH_P_ALL))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return -1, err
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
		return fail("PACKET_VNET_HDR", err)
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000}); err != nil {
		return fail("SO_RCVTIMEO", err)
	}
	ifi, err := netIfIndex(iface)
	if err != nil {
		return fail("interface", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi}); err != nil {
		return fail("bind", err)
	}
	return fd, nil
}

func netIfIndex(name string) (int, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, err
	}
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(s)
	if err := unix.IoctlIfreq(s, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, err
	}
	return int(ifr.Uint32()), nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (c *vnetCapture) loop(fd int, rawFile, wireFile string) error {
	defer unix.Close(fd)
	rf, err := os.Create(rawFile)
	if err != nil {
		return err
	}
	defer rf.Close()
	wf, err := os.Create(wireFile)
	if err != nil {
		return err
	}
	defer wf.Close()
	raw, err := roce.NewPcapWriter(rf, true)
	if err != nil {
		return err
	}
	wire, err := roce.NewPcapWriter(wf, true)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<18)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			select {
			case <-c.stopped:
				return nil
			default:
				continue
			}
		}
		if err != nil {
			return err
		}
		if n < tap.VnetHdrLen {
			continue
		}
		ts := time.Now()
		var vh tap.VnetHdr
		vh.Decode(buf)
		frame := buf[tap.VnetHdrLen:n]
		if err := raw.WritePacket(ts, frame); err != nil {
			return err
		}
		segs, err := refSegment(&vh, frame)
		if err != nil {
			return fmt.Errorf("captured packet %d: %w", c.packets+1, err)
		}
		c.mu.Lock()
		c.packets++
		if len(segs) > 1 || vh.GSOType != tap.VnetGSONone {
			c.gso++
			c.segments += len(segs)
		}
		c.mu.Unlock()
		for _, s := range segs {
			if err := wire.WritePacket(ts, s); err != nil {
				return err
			}
		}
	}
}

// stop ends the capture (after what was queued) and returns its error.
func (c *vnetCapture) stop() error {
	select {
	case <-c.stopped:
	default:
		close(c.stopped)
	}
	err, ok := <-c.done
	if ok {
		close(c.done)
	}
	return err
}

// counts returns the packets captured, those of them segmented and the
// frames cut from them.
func (c *vnetCapture) counts() (packets, gso, segments int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.packets, c.gso, c.segments
}

// refSegment returns the frames a captured packet (virtio-net header vh)
// becomes on a wire: a segmented UDP packet (GSO_UDP_L4) is cut as
// inet_gso_segment / ipv6_gso_segment and __udp_gso_segment cut it
// (segment k: the first segment's headers, IPv4 identification + k, its
// own IP and UDP lengths, a fresh IPv4 header checksum, the full UDP
// checksum); a packet with a partial checksum gets it completed
// (skb_checksum_help); anything else is returned as is.
func refSegment(vh *tap.VnetHdr, p []byte) ([][]byte, error) {
	sum := func(s uint32, b []byte) uint32 {
		for i := 0; i+1 < len(b); i += 2 {
			s += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			s += uint32(b[len(b)-1]) << 8
		}
		return s
	}
	fold := func(s uint32) uint16 {
		for s > 0xffff {
			s = s>>16 + s&0xffff
		}
		return uint16(s)
	}
	if vh.GSOType == tap.VnetGSONone {
		f := bytes.Clone(p)
		if vh.Flags&tap.VnetFlagNeedsCsum != 0 {
			start, off := int(vh.CsumStart), int(vh.CsumOffset)
			if start+off+2 > len(f) {
				return nil, fmt.Errorf("partial checksum at %d+%d in %d bytes", start, off, len(f))
			}
			c := ^fold(sum(0, f[start:]))
			if c == 0 {
				c = 0xffff
			}
			binary.BigEndian.PutUint16(f[start+off:], c)
		}
		return [][]byte{f}, nil
	}
	if vh.GSOType != tap.VnetGSOUDPL4 {
		return [][]byte{bytes.Clone(p)}, nil // TCP: none of ours
	}
	l3 := 14
	et := binary.BigEndian.Uint16(p[12:])
	if et == 0x8100 {
		l3, et = 18, binary.BigEndian.Uint16(p[16:])
	}
	l4, gso := int(vh.CsumStart), int(vh.GSOSize)
	v6 := et == 0x86dd
	if gso == 0 || l4+8 > len(p) || (v6 && l4 != l3+40) || (!v6 && (et != 0x0800 || l4 != l3+int(p[l3]&0xf)*4)) {
		return nil, fmt.Errorf("segmented packet with csum_start %d, gso_size %d, ethertype %#x", l4, gso, et)
	}
	hl := l4 + 8
	var out [][]byte
	for k, off := 0, hl; off < len(p); k, off = k+1, off+gso {
		s := append(bytes.Clone(p[:hl]), p[off:min(off+gso, len(p))]...)
		ulen := len(s) - l4
		binary.BigEndian.PutUint16(s[l4+4:], uint16(ulen))
		s[l4+6], s[l4+7] = 0, 0
		var ps uint32
		if v6 {
			binary.BigEndian.PutUint16(s[l3+4:], uint16(ulen))
			ps = sum(0, s[l3+8:l3+40])
		} else {
			binary.BigEndian.PutUint16(s[l3+2:], uint16(len(s)-l3))
			binary.BigEndian.PutUint16(s[l3+4:], binary.BigEndian.Uint16(p[l3+4:])+uint16(k))
			s[l3+10], s[l3+11] = 0, 0
			binary.BigEndian.PutUint16(s[l3+10:], ^fold(sum(0, s[l3:l4])))
			ps = sum(0, s[l3+12:l3+20])
		}
		c := ^fold(sum(ps+17+uint32(ulen), s[l4:]))
		if c == 0 {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(s[l4+6:], c)
		out = append(out, s)
	}
	return out, nil
}
