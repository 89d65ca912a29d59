package link

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/roce"
	"golang.org/x/sys/unix"
)

// runCBPF interprets the classic BPF instructions the steering program
// uses, over data (the UDP payload, as the kernel presents it): a load
// beyond the data returns 0, as in the kernel.
func runCBPF(t *testing.T, prog []unix.SockFilter, data []byte) uint32 {
	t.Helper()
	var a uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_LEN:
			a = uint32(len(data))
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if int(in.K)+4 > len(data) {
				return 0
			}
			a = binary.BigEndian.Uint32(data[in.K:])
		case unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K:
			if a >= in.K {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			a &= in.K
		case unix.BPF_ALU | unix.BPF_MUL | unix.BPF_K:
			a *= in.K
		case unix.BPF_ALU | unix.BPF_RSH | unix.BPF_K:
			a >>= in.K
		case unix.BPF_ALU | unix.BPF_MOD | unix.BPF_K:
			a %= in.K
		case unix.BPF_RET | unix.BPF_A:
			return a
		case unix.BPF_RET | unix.BPF_K:
			return in.K
		default:
			t.Fatalf("instruction %d: unexpected code 0x%x", pc, in.Code)
		}
	}
	t.Fatal("program fell off its end")
	return 0
}

// bthPayload returns a minimal UDP payload (BTH and 4 bytes of ICRC
// room) addressed to qpn; the ICRC is not valid.
func bthPayload(qpn uint32) []byte {
	b := make([]byte, roce.BTHLen+roce.ICRCLen)
	roce.BTH(b).Encode(&roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: qpn})
	return b
}

// TestUDPSteerHashAllQPNs: the program's arithmetic (24-bit QPN times
// udpSteerMul in 32 bits, shifted right by 16) is roce.SteerHash for every
// QPN, so the program and the engine agree by construction.
func TestUDPSteerHashAllQPNs(t *testing.T) {
	for q := uint32(0); q < 1<<24; q++ {
		if (q*udpSteerMul)>>16 != roce.SteerHash(q) {
			t.Fatalf("qpn %#x: program hash %#x, roce.SteerHash %#x", q, (q*udpSteerMul)>>16, roce.SteerHash(q))
		}
	}
}

// TestUDPSteerProgram runs the program on BTHs for many QPNs and worker
// counts and compares with roce.SteerQueue; short datagrams go to 0; the
// result is always a valid socket index (never the kernel's fallback).
func TestUDPSteerProgram(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	qpns := []uint32{0, 1, 2, 0xffffff, 0x800000, 0x12345}
	for range 2000 {
		qpns = append(qpns, rng.Uint32()&0xffffff)
	}
	for _, n := range []int{1, 2, 3, 4, 7, 8, 64, 1024} {
		prog := udpSteerProgram(n)
		require.LessOrEqual(t, len(prog), unix.BPF_MAXINSNS)
		for _, q := range qpns {
			got := runCBPF(t, prog, bthPayload(q))
			require.Equal(t, uint32(roce.SteerQueue(q, n)), got, "qpn %#x, %d sockets", q, n)
			require.Less(t, got, uint32(n))
		}
		for _, l := range []int{0, 1, 7, 8, 15} {
			assert.Equal(t, uint32(0), runCBPF(t, prog, make([]byte, l)), "%d-byte datagram", l)
		}
		// Bytes other than the destination QP do not matter.
		b := bthPayload(0x54321)
		for i := range b {
			if i < 5 || i > 7 {
				b[i] = 0xff
			}
		}
		assert.Equal(t, uint32(roce.SteerQueue(0x54321, n)), runCBPF(t, prog, b))
	}
}

// TestUDPSteering sends datagrams for many QPNs from a separate socket
// to a link of N workers and checks that each lands on the socket of
// worker roce.SteerQueue(qpn, N): the kernel runs the program, and socket
// i (bound i-th) is index i of the reuseport group.
func TestUDPSteering(t *testing.T) {
	for _, tc := range []struct {
		fam string
		n   int
	}{{"ipv4", 1}, {"ipv4", 2}, {"ipv4", 4}, {"ipv6", 2}, {"ipv6", 4}} {
		n := tc.n
		t.Run(fmt.Sprintf("%s/workers=%d", tc.fam, n), func(t *testing.T) {
			var local netip.AddrPort
			if tc.fam == "ipv4" {
				local = loopback4(t)
			} else {
				local = loopback6(t)
			}
			l := newTestLink(t, local, n, nil)
			plain, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(local.Addr(), 0)))
			require.NoError(t, err)
			defer plain.Close()

			rng := rand.New(rand.NewPCG(uint64(n), 7))
			want := make([]int, n)
			qpns := []uint32{0, 1, 0xffffff}
			for range 125 {
				qpns = append(qpns, rng.Uint32()&0xffffff)
			}
			for _, q := range qpns {
				_, err := plain.WriteToUDPAddrPort(bthPayload(q), local)
				require.NoError(t, err)
				want[roce.SteerQueue(q, n)]++
			}
			// Short datagrams: socket 0.
			for range 3 {
				_, err := plain.WriteToUDPAddrPort([]byte{1, 2, 3, 4, 5, 6, 7, 8}, local)
				require.NoError(t, err)
			}
			want[0] += 3
			for i, p := range l.Ports() {
				got := recvN(t, p, want[i])
				short := 0
				for _, f := range got {
					payload := f.b
					if len(payload) < roce.BTHLen {
						short++
						continue
					}
					q := roce.BTH(payload).DestQP()
					assert.Equal(t, i, roce.SteerQueue(q, n), "qpn %#x on socket %d", q, i)
				}
				if i == 0 {
					assert.Equal(t, 3, short)
				} else {
					assert.Zero(t, short)
				}
				k, err := p.RecvBatch(newBufs(1), make([]netip.AddrPort, 1))
				require.NoError(t, err)
				assert.Zero(t, k, "socket %d: more datagrams than steered to it", i)
			}
		})
	}
}

// TestUDPSteeringBothDirections: two links of 2 workers exchange frames of
// QPs owned by different workers; each frame reaches the worker owning its
// destination QP and verifies.
func TestUDPSteeringBothDirections(t *testing.T) {
	aAddr, bAddr := loopback4(t), loopback4(t)
	la := newTestLink(t, aAddr, 2, nil)
	lb := newTestLink(t, bAddr, 2, nil)
	for _, dir := range []struct {
		from, to         *UDPLink
		fromAddr, toAddr netip.AddrPort
	}{{la, lb, aAddr, bAddr}, {lb, la, bAddr, aAddr}} {
		path := pathBetween(dir.fromAddr, dir.toAddr)
		want := make([]int, 2)
		for q := uint32(1); q <= 16; q++ {
			h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: q, PSN: q}}
			// Sent by the worker that owns the sending QP (any worker may send).
			sendAll(t, dir.from.Ports()[int(q)%2], [][]byte{buildFrame(t, path, &h, 8)}, dir.toAddr)
			want[roce.SteerQueue(q, 2)]++
		}
		for i, p := range dir.to.Ports() {
			for _, f := range recvN(t, p, want[i]) {
				var pkt roce.Packet
				require.NoError(t, parseFrom(f.b, f.from, dir.toAddr, &pkt))
				assert.Equal(t, i, roce.SteerQueue(pkt.BTH.DestQP(), 2))
			}
		}
	}
}

// TestUDPUnprivileged runs the steering and opcode tests again in a
// child process without any privilege (uid and gid nobody, no
// capabilities): the UDP link, its reuseport group and the classic BPF
// steering program need none. Run as root it re-executes the test binary
// as nobody; run as any other user the whole suite already is the proof.
func TestUDPUnprivileged(t *testing.T) {
	if os.Getenv("VRNIC_UDP_CHILD") != "" {
		t.Skip("in the unprivileged child")
	}
	if os.Getuid() != 0 {
		t.Skip("not root: every test of this package already runs unprivileged")
	}
	dir, err := os.MkdirTemp("", "vrnic-udp-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	self, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	bin := filepath.Join(dir, "link.test")
	require.NoError(t, os.WriteFile(bin, self, 0o755))

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run=^(TestUDPSteering|TestUDPOpcodes|TestUDPCorruptedDatagram)$", "-test.count=1", "-test.v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "VRNIC_UDP_CHILD=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, name := range []string{"TestUDPSteering", "TestUDPOpcodes", "TestUDPCorruptedDatagram"} {
		assert.Contains(t, string(out), "--- PASS: "+name+" ")
	}
}
