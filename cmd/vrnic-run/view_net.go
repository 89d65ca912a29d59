package main

// The device's parent and its network interfaces in the sysfs view
// (kernel-notes/vrnic-run-view.md, "The device and its interface"): the
// files are internal/devview's (WriteDeviceSysfs); here the synthetic
// interfaces that belong to the program's namespace are added to its
// /sys/class/net:
//
//	/sys/class/net/NDEV -> ../infiniband/DEV/device/net/NDEV

import (
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/vrnic/vrnic/internal/devview"
	"golang.org/x/sys/unix"
)

// mountNetClass makes class/net the real /sys/class/net with the entries
// of netAdd added: an overlay whose lower layers are netAdd and the real
// class (it stays live: interfaces created later appear, removed ones
// go). Without overlayfs the real class is bound alone, as before.
func mountNetClass(class, netAdd string) error {
	dst := filepath.Join(class, "net")
	if netAdd != "" {
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		opts := "lowerdir=" + escapeOverlay(netAdd) + ":" + escapeOverlay("/sys/class/net")
		if err := unix.Mount("overlay", dst, "overlay", unix.MS_RDONLY, opts); err == nil {
			return nil
		}
		if err := os.Remove(dst); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	return unix.Mount("/sys/class/net", dst, "", unix.MS_BIND|unix.MS_REC, "")
}

// escapeOverlay escapes the characters overlayfs's option parser splits
// on.
func escapeOverlay(p string) string {
	r := strings.NewReplacer(`\`, `\\`, `:`, `\:`, `,`, `\,`)
	return r.Replace(p)
}

// bindable reports whether every address of nd can be bound here (a
// UDP socket on it, port 0): the address belongs to this network
// namespace.
func bindable(nd devview.NetDev) bool {
	for _, p := range nd.Addrs {
		c, err := net.ListenPacket("udp", net.JoinHostPort(p.Addr().String(), "0"))
		if err != nil {
			return false
		}
		c.Close()
	}
	return true
}
