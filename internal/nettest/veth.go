// Package nettest builds what tests of kernel-side packet handling need
// (root only): two network namespaces joined by a veth pair, UDP sockets
// in them, and RoCE v2 traffic between them whose every frame is checked
// on arrival (PSN, ICRC, IP ECN field).
package nettest

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/roce"
)

// VethPair is two network namespaces joined by a veth pair: IfA in A
// (AddrA) and IfB in B (AddrB). NewVethPair removes both at cleanup.
type VethPair struct {
	NameA, NameB string // namespace names (ip netns)
	NsA, NsB     netns.NsHandle
	IfA, IfB     string
	AddrA, AddrB netip.Addr
}

// NewVethPair makes the namespaces (named after prefix and the process)
// and the pair, 10.81.0.1/24 on tfa in A, 10.81.0.2/24 on tfb in B. It
// skips the test without root or ip(8).
func NewVethPair(t *testing.T, prefix string) *VethPair {
	t.Helper()
	testenv.NeedRoot(t, "needs root (network namespaces, veth, tc programs)")
	testenv.NeedTool(t, "ip")
	p := &VethPair{NameA: fmt.Sprintf("%sa%d", prefix, os.Getpid()), NameB: fmt.Sprintf("%sb%d", prefix, os.Getpid()),
		IfA: "tfa", IfB: "tfb", AddrA: netip.MustParseAddr("10.81.0.1"), AddrB: netip.MustParseAddr("10.81.0.2")}
	ip := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	for _, n := range []string{p.NameA, p.NameB} {
		ip("netns", "add", n)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", n).Run() })
	}
	ip("-n", p.NameA, "link", "add", p.IfA, "type", "veth", "peer", "name", p.IfB, "netns", p.NameB)
	ip("-n", p.NameA, "addr", "add", p.AddrA.String()+"/24", "dev", p.IfA)
	ip("-n", p.NameB, "addr", "add", p.AddrB.String()+"/24", "dev", p.IfB)
	ip("-n", p.NameA, "link", "set", p.IfA, "up")
	ip("-n", p.NameB, "link", "set", p.IfB, "up")
	var err error
	p.NsA, err = netns.GetFromName(p.NameA)
	require.NoError(t, err)
	t.Cleanup(func() { p.NsA.Close() })
	p.NsB, err = netns.GetFromName(p.NameB)
	require.NoError(t, err)
	t.Cleanup(func() { p.NsB.Close() })
	return p
}

// Flow is RoCE v2 traffic from a UDP socket in A to one in B: RC
// SEND_ONLY frames of 64 bytes to QP QPN, PSN 0, 1, ... per Send.
type Flow struct {
	p      *VethPair
	QPN    uint32
	tx, rx int
}

// SrcPort is the UDP source port of a Flow's frames.
const SrcPort = 50000

// NewFlow opens the flow's sockets (closed at cleanup).
func (p *VethPair) NewFlow(t *testing.T, qpn uint32) *Flow {
	t.Helper()
	return &Flow{p: p, QPN: qpn, tx: udpSocketIn(t, p.NsA, p.AddrA, SrcPort), rx: udpSocketIn(t, p.NsB, p.AddrB, roce.UDPPort)}
}

// udpSocketIn returns a UDP socket created in ns and bound to addr:port
// (closed at cleanup), with a 4 MiB receive buffer and IP_RECVTOS.
func udpSocketIn(t *testing.T, ns netns.NsHandle, addr netip.Addr, port uint16) int {
	t.Helper()
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread dies with the goroutine
		if err := netns.Set(ns); err != nil {
			ch <- result{-1, err}
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
		}
		if err == nil {
			err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVTOS, 1)
		}
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.As4(), Port: int(port)})
		}
		ch <- result{fd, err}
	}()
	r := <-ch
	require.NoError(t, r.err)
	t.Cleanup(func() { unix.Close(r.fd) })
	return r.fd
}

// Send sends n frames, PSN 0 to n-1, with the ICRC over the UDP pseudo
// header.
func (f *Flow) Send(t *testing.T, n int) {
	t.Helper()
	p := f.p
	path := &roce.Path{Mode: roce.ModeUDP, Src: p.AddrA, Dst: p.AddrB, SrcPort: SrcPort, DstPort: roce.UDPPort}
	to := &unix.SockaddrInet4{Addr: p.AddrB.As4(), Port: roce.UDPPort}
	buf := make([]byte, 512)
	for psn := range uint32(n) {
		h := &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: f.QPN, PSN: psn}}
		off := path.Headroom(h.BTH.Opcode)
		for i := range 64 {
			buf[off+i] = byte(psn) + byte(i)
		}
		fr, err := path.Build(buf, off, 64, h)
		require.NoError(t, err)
		require.NoError(t, unix.Sendto(f.tx, fr, 0, to))
	}
}

// Received is one datagram B got: its PSN, whether its ICRC held, and
// its IP ECN field.
type Received struct {
	PSN   uint32
	Valid bool
	ECN   byte
}

// Recv reads datagrams until want arrived or 10 s passed, then any more
// that come within 100 ms (so that too many are seen), at most want+1000.
func (f *Flow) Recv(t *testing.T, want int) []Received {
	t.Helper()
	p := f.p
	ps := &roce.Pseudo{Src: p.AddrA, SrcPort: SrcPort, Dst: p.AddrB, DstPort: roce.UDPPort}
	buf, oob := make([]byte, 2048), make([]byte, 256)
	var got []Received
	deadline := time.Now().Add(10 * time.Second)
	for len(got) <= want+1000 {
		wait := time.Until(deadline)
		if len(got) >= want {
			wait = 100 * time.Millisecond
		}
		if wait <= 0 {
			break
		}
		tv := unix.NsecToTimeval(wait.Nanoseconds())
		require.NoError(t, unix.SetsockoptTimeval(f.rx, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
		n, oobn, _, _, err := unix.Recvmsg(f.rx, buf, oob, 0)
		if err == unix.EAGAIN || err == unix.EWOULDBLOCK {
			break
		}
		require.NoError(t, err)
		r := Received{ECN: 0xff}
		cms, err := unix.ParseSocketControlMessage(oob[:oobn])
		require.NoError(t, err)
		for _, c := range cms {
			if c.Header.Level == unix.IPPROTO_IP && c.Header.Type == unix.IP_TOS && len(c.Data) > 0 {
				r.ECN = c.Data[0] & 3
			}
		}
		require.GreaterOrEqual(t, n, roce.BTHLen)
		var pkt roce.Packet
		r.Valid = roce.ParseUDP(buf[:n], ps, &pkt) == nil
		r.PSN = roce.BTH(buf[:n]).PSN()
		got = append(got, r)
	}
	return got
}

// PSNs returns the sorted PSNs of the frames keep accepts (all if nil).
func PSNs(rs []Received, keep func(Received) bool) []uint32 {
	var out []uint32
	for _, r := range rs {
		if keep == nil || keep(r) {
			out = append(out, r.PSN)
		}
	}
	slices.Sort(out)
	return out
}

// Seq returns 0, 1, ..., n-1.
func Seq(n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(i)
	}
	return s
}
