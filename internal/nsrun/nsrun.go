// Package nsrun runs netlink work in a network namespace. Calls that name
// an interface by index or create one (TUNSETIFF, BPF_LINK_CREATE for
// tcx) act in the namespace of the calling OS thread, so the work runs on
// a thread switched into the namespace; that thread is never returned to
// the Go scheduler (it exits with its goroutine), so no other goroutine
// runs in a namespace it did not ask for.
package nsrun

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Run runs fn with a netlink handle for ns (0: the caller's namespace,
// on the calling goroutine) and returns its error.
func Run(ns netns.NsHandle, fn func(*netlink.Handle) error) error {
	if ns == 0 {
		h, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("netns: netlink handle: %w", err)
		}
		defer h.Close()
		return fn(h)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread dies with the goroutine
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("netns: enter: %w", err)
			return
		}
		h, err := netlink.NewHandle()
		if err != nil {
			errc <- fmt.Errorf("netns: netlink handle: %w", err)
			return
		}
		defer h.Close()
		errc <- fn(h)
	}()
	return <-errc
}
