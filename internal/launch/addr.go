package launch

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
)

// RoCEPort is the UDP port of RoCE v2, on which vrnicd's UDP link listens.
const RoCEPort = 4791

// ErrNoFreeAddress: no loopback address with a free RoCE v2 UDP port was
// found.
var ErrNoFreeAddress = errors.New("no free loopback addresses with UDP port 4791")

// UDPFree reports whether UDP port 4791 of a can be bound (false for
// the zero Addr, which would bind every address).
func UDPFree(a netip.Addr) bool {
	if !a.IsValid() || a.IsUnspecified() {
		return false
	}
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, RoCEPort)))
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// FreeLoopback returns a random 127.0.0.0/8 address (all loopback on
// Linux) outside 127.0.0.0/16, whose UDP port 4791 is free.
func FreeLoopback() (netip.Addr, error) {
	for range 100 {
		a := netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(250)), byte(rand.IntN(256)), byte(1 + rand.IntN(250))})
		if UDPFree(a) {
			return a, nil
		}
	}
	return netip.Addr{}, ErrNoFreeAddress
}

// LoopbackPair returns a and b if UDP port 4791 of both is free, else two
// other distinct addresses from FreeLoopback (zero Addrs: always those).
func LoopbackPair(a, b netip.Addr) (netip.Addr, netip.Addr, error) {
	if UDPFree(a) && UDPFree(b) {
		return a, b, nil
	}
	a, errA := FreeLoopback()
	b, errB := FreeLoopback()
	if errA != nil || errB != nil || a == b {
		return netip.Addr{}, netip.Addr{}, ErrNoFreeAddress
	}
	return a, b, nil
}

// FreeTCPPort returns a TCP port nobody listens on now on 127.0.0.1.
func FreeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// TCPListening reports whether some socket of this network namespace
// listens on TCP port (IPv4 or IPv6), from /proc/net/tcp{,6}: probing with
// a connection would be taken by a server that serves one client (a
// pingpong, perftest) as its client.
func TCPListening(port int) bool { return tcpListeningUnder("/proc/net", port) }

// TCPListeningIn is TCPListening in the network namespace of process pid
// (its /proc/PID/net).
func TCPListeningIn(pid, port int) bool {
	return tcpListeningUnder(fmt.Sprintf("/proc/%d/net", pid), port)
}

func tcpListeningUnder(dir string, port int) bool {
	want := fmt.Sprintf(":%04X", port)
	for _, f := range []string{dir + "/tcp", dir + "/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) > 3 && strings.HasSuffix(fs[1], want) && fs[3] == "0A" {
				return true
			}
		}
	}
	return false
}
