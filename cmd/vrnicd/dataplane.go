package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"time"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/capture"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/dataplane"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/dma"
	"github.com/vrnic/vrnic/faults"
	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/roce"
)

// dataPlane is the daemon's transport: the links, the engine over them and
// the device's data plane. stop releases everything in order.
type dataPlane struct {
	dp    *dataplane.DataPlane
	close func() error // the links
	// stats reads the link's counters for the stats socket and the
	// metrics (nil: the link has none to serve).
	stats func() (admin.LinkStats, error)
	// tap captures the engine's frames (vrnicctl capture).
	tap         *capture.Tap
	stopCapture chan struct{} // closed by stop
	// faults holds the fault rules every link passes through (vrnicctl
	// fault).
	faults *faults.Injector
}

// newDataPlane builds the engine with workers workers over the link the
// configuration names:
//
//   - mem: an in-memory network private to the daemon, with this device
//     as its only member at its GID 0 address. Frames to the device's own
//     address come back to it, so QPs of two clients of the same daemon
//     can be connected to each other; frames to any other address are
//     dropped (counted as no route). It needs nothing from the host.
//   - udp: the UDP link (package link): one socket per worker bound to the
//     -local address (port 4791), steered by QPN in the kernel; peers are
//     the QPs' destination GIDs, port 4791. The engine runs in
//     roce.ModeUDP: it builds and parses the UDP payloads only, with the
//     peer's address and port beside each, and the link's address as
//     its own.
//   - tap: a multi-queue TAP device, queue i for worker i, with the eBPF
//     steering and filter programs attached (tap.go). PathFixup writes the
//     NIC's MAC and the peer's, looked up in the NIC's neighbour cache; the
//     data plane's Resolve hook fills that cache (ARP/ND) when a QP goes to
//     RTR.
func newDataPlane(cfg *Config, li device.LinkInfo, space *dma.Space, workers int, log *slog.Logger) (*dataPlane, error) {
	var (
		links    []engine.Link
		close    = func() error { return nil }
		fixup    func(*roce.Path)
		resolve  func(context.Context, netip.Addr) error
		stats    func() (admin.LinkStats, error)
		frameCap = engine.DefaultFrameCap
		mode     = roce.ModeEthernet
		udpLocal netip.AddrPort // the UDP link's address, in ModeUDP
		batch    int            // frames per engine batch (0: the engine's default)
	)
	ccp, err := cfg.CC.params() // nil: congestion control off
	if err != nil {
		return nil, err
	}
	if ccp != nil {
		log.Info("congestion control: DCQCN", "params", ccp.String())
	}
	switch cfg.Link.Type {
	case "mem":
		nw, err := link.NewNetwork(link.Config{FrameCap: engine.DefaultFrameCap, Logger: log})
		if err != nil {
			return nil, err
		}
		addr := netip.AddrFrom16(li.GIDs[0]).Unmap()
		ports, err := nw.Attach(addr, workers, nil)
		if err != nil {
			return nil, err
		}
		for _, p := range ports {
			links = append(links, p)
		}
	case "udp":
		local, err := netip.ParseAddrPort(cfg.Link.Local)
		if err != nil {
			return nil, err
		}
		ul, err := link.NewUDP(link.UDPConfig{
			Local: local, Workers: workers, FrameCap: engine.DefaultFrameCap, Batch: udpBatch, Logger: log,
			// Congestion control: ECT(0) on what the sockets send, the
			// ECN field of what they receive (link/udp_ecn.go).
			ECN: ccp != nil,
			// The kernel default (about 208 KiB) holds only some 50
			// 4 KiB frames per worker; a burst beyond it is dropped
			// silently on loopback and costs a go-back-N retransmission.
			// The kernel caps these at net.core.[rw]mem_max.
			SendBuffer: udpSocketBuffer, RecvBuffer: udpSocketBuffer,
			SegmentIPv4: segmentPolicy(cfg.Link.SegmentIPv4),
		})
		if err != nil {
			return nil, err
		}
		for _, p := range ul.Ports() {
			links = append(links, p)
		}
		close, mode, udpLocal = ul.Close, roce.ModeUDP, ul.LocalAddr()
		// A pass sends as many frames as one sendmmsg takes (the UDP
		// link's batch, and its segments per datagram): 8-byte WRITEs
		// at depth 128 between two daemons moved 1.2-1.9x the messages
		// of the engine's default 32 (BENCHMARKS.md, per-message cost).
		batch = udpBatch
		stats = func() (admin.LinkStats, error) {
			return admin.LinkStats{Link: "udp", Local: udpLocal.String(), Ports: ul.Stats()}, nil
		}
	case "tap":
		frameCap = frameCapFor()
		tl, err := openTAP(cfg, li.MAC, workers, frameCap, log)
		if err != nil {
			return nil, err
		}
		links = tl.links()
		close, fixup, resolve, stats = tl.close, tl.fixPath, tl.resolve, tl.stats
	default:
		return nil, fmt.Errorf("link type %q has no data path", cfg.Link.Type)
	}
	// Each link is wrapped by the fault layer, which reports to the
	// capture: sent frames as the engine built them (a frame a rule drops
	// is captured, with the rule in its comment), received frames as the
	// link delivered them, before any rule.
	tap := capture.New(mode, udpLocal)
	var sc admin.FaultScenario
	if cfg.Faults != nil {
		sc = *cfg.Faults
	}
	inj := faults.New(faults.Config{Mode: mode, Local: udpLocal, Seed: sc.Seed, Logger: log})
	if _, err := inj.Add(sc.Rules); err != nil {
		close()
		return nil, fmt.Errorf("faults: %w", err)
	}
	if len(sc.Rules) > 0 || sc.Seed != 0 {
		log.Info("fault rules installed", "rules", len(sc.Rules), "seed", inj.Seed(), "file", cfg.FaultsFile)
	}
	for i, l := range links {
		links[i] = inj.Wrap(l, tap)
	}
	eng, err := engine.New(engine.Config{Links: links, Mode: mode, Local: udpLocal, MAC: li.MAC, FrameCap: frameCap, Batch: batch, PathFixup: fixup, Logger: log, CC: ccp})
	if err != nil {
		close()
		return nil, err
	}
	inj.AttachEngine(eng) // the verb-level faults
	spin, err := cfg.pollSpin()
	if err != nil {
		eng.Close()
		close()
		return nil, err
	}
	dp, err := dataplane.New(dataplane.Config{Engine: eng, Space: space, Resolve: resolve, Logger: log, SpinFor: spin})
	if err != nil {
		eng.Close()
		close()
		return nil, err
	}
	return &dataPlane{dp: dp, close: close, stats: stats, tap: tap, stopCapture: make(chan struct{}), faults: inj}, nil
}

// capture starts a packet capture for the operator (admin.CaptureCmd);
// stop ends a running one.
func (p *dataPlane) capture(log *slog.Logger) func(io.WriteCloser, admin.CaptureRequest) error {
	return func(w io.WriteCloser, req admin.CaptureRequest) error {
		opt := capture.Options{Count: req.Count, Duration: time.Duration(req.Seconds * float64(time.Second)), Snaplen: req.Snaplen}
		done, err := p.tap.Start(w, opt, p.stopCapture)
		if err != nil {
			return err
		}
		log.Info("capture started", "count", req.Count, "seconds", req.Seconds, "snaplen", req.Snaplen)
		go func() {
			st := <-done
			log.Info("capture ended", "captured", st.Captured, "dropped", st.Dropped)
		}()
		return nil
	}
}

// stop closes the data plane (after the device: its QPs are gone) and
// the links.
func (p *dataPlane) stop() error {
	close(p.stopCapture)
	return errors.Join(p.dp.Close(), p.close())
}

// udpBatch is the UDP link's frames per sendmmsg or recvmmsg and the
// engine's per batch over it.
const udpBatch = 64

// udpSocketBuffer is the SO_SNDBUF/SO_RCVBUF asked for each UDP link socket.
const udpSocketBuffer = 4 << 20

// segmentPolicy is the UDP link's IPv4 segmentation policy for the
// config's segment_ipv4: absent is the link's default (on a loopback
// address).
func segmentPolicy(v *bool) link.SegmentPolicy {
	switch {
	case v == nil:
		return link.SegmentLoopback
	case *v:
		return link.SegmentAlways
	}
	return link.SegmentNever
}
