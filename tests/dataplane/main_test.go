package dataplane

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// bin holds the binaries built by TestMain.
var bin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "vrnic-dataplane-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, pkg := range []string{"vrnicd", "vrnic-demo"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(dir, pkg), "github.com/vrnic/vrnic/cmd/"+pkg)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				fmt.Fprintf(os.Stderr, "build %s: %v\n", pkg, err)
				return 1
			}
		}
		bin = dir
		return m.Run()
	}())
}

// freeLoopback returns a 127.0.0.0/8 address whose UDP port 4791 is free.
func freeLoopback(t testing.TB) netip.Addr {
	t.Helper()
	for range 100 {
		a := netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(250)), byte(rand.IntN(256)), byte(1 + rand.IntN(250))})
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 4791)))
		if err == nil {
			c.Close()
			return a
		}
	}
	t.Fatal("no free 127.0.0.0/8 address with UDP port 4791")
	return netip.Addr{}
}

// syncBuf is a strings.Builder safe for a process's output goroutine and
// the test reading it.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
