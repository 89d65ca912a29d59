package tap

import (
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/tap"
	"github.com/vrnic/vrnic/verbs"
)

// Benchmarks over the TAP link: RDMA WRITE between two daemons (one
// worker each) through the bridge, against a raw-TAP baseline measured in
// the same run through the same bridge: two more TAPs on br0, frames of
// the size the RDMA traffic puts on the wire written on one and read on
// the other, no RDMA logic. Reported: the RDMA figure, the baseline and
// their ratio. With VRNIC_TAP_BENCH_PROFILE=DIR the daemons write CPU
// profiles to DIR (a.prof, b.prof).

// benchEnv is the topology, the two daemons and a connected QP pair
// (clients in this process).
type benchEnv struct {
	tp     *topo
	da, db *daemon
	a, b   *benchSide
	rawA   *tap.Device
	rawB   *tap.Device
	rawMAC [2]tap.MAC
	// The batched baseline: two more TAPs with the offload, the writer
	// putting 64 frames (at most 64 KiB) in one segmented write, the
	// reader reading them whole.
	gsoA, gsoB *tap.Device
	gsoMAC     [2]tap.MAC
}

type benchSide struct {
	ctx *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	buf *verbs.Buffer
	mr  *verbs.MR
	gid [16]byte
}

func newBenchEnv(b *testing.B) *benchEnv {
	tp := newTopo(b)
	prof := os.Getenv("VRNIC_TAP_BENCH_PROFILE")
	var extraA, extraB []string
	if prof != "" {
		extraA = []string{"-cpuprofile", filepath.Join(prof, "a.prof")}
		extraB = []string{"-cpuprofile", filepath.Join(prof, "b.prof")}
	}
	da := tp.startDaemon(b, tp.nsA, "ba", "vba", 1, extraA, addrA+"/24")
	db := tp.startDaemon(b, tp.nsB, "bb", "vbb", 1, extraB, addrB+"/24")
	env := &benchEnv{tp: tp, da: da, db: db, a: newBenchSide(b, da.sock), b: newBenchSide(b, db.sock)}
	for _, p := range [][2]*benchSide{{env.a, env.b}, {env.b, env.a}} {
		l, r := p[0], p[1]
		require.NoError(b, l.qp.ToInit(abi.AccessAll, 0))
		require.NoError(b, l.qp.ToRTR(verbs.RTRAttr{AV: abi.AHAttr{DGID: r.gid, HopLimit: 64, PortNum: 1}, PathMTU: abi.MTU4096,
			DestQPN: r.qp.QPN, RQPSN: 1, MaxDestRdAtomic: 4}))
		require.NoError(b, l.qp.ToRTS(verbs.RTSAttr{SQPSN: 1, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}))
	}

	// The raw pair, on the same bridge.
	ns, err := netns.GetFromName(tp.nsBr)
	require.NoError(b, err)
	defer ns.Close()
	for i, name := range []string{"vra", "vrb", "vga", "vgb"} {
		mac := tap.MAC{2, 0x52, 0, 0, 0, byte(i + 1)}
		// vra, vrb: the baseline as it always was, one frame per write
		// and read, no virtio-net header.
		d, err := tap.Create(tap.Config{Name: name, Queues: 1, MAC: mac, NetNS: ns, NoOffload: i < 2})
		require.NoError(b, err)
		if i >= 2 {
			uso, msg := d.Offload()
			require.True(b, uso, "offload: %s", msg)
			env.gsoMAC[i-2] = mac
			if i == 2 {
				env.gsoA = d
			} else {
				env.gsoB = d
			}
			b.Cleanup(func() { d.Close() })
			ipCmd(b, "-n", tp.nsBr, "link", "set", "dev", name, "txqueuelen", "4096", "master", "br0")
			continue
		}
		env.rawMAC[i] = mac
		b.Cleanup(func() { d.Close() })
		ipCmd(b, "-n", tp.nsBr, "link", "set", "dev", name, "txqueuelen", "4096", "master", "br0")
		if i == 0 {
			env.rawA = d
		} else {
			env.rawB = d
		}
	}
	return env
}

func newBenchSide(b *testing.B, sock string) *benchSide {
	s := &benchSide{}
	var err error
	s.ctx, err = verbs.Open(sock, verbs.WithClientName("bench"))
	require.NoError(b, err)
	b.Cleanup(func() { s.ctx.Close() })
	g, err := s.ctx.QueryGID(1, 0)
	require.NoError(b, err)
	s.gid = g.GID
	s.pd, err = s.ctx.AllocPD()
	require.NoError(b, err)
	s.cq, err = s.ctx.CreateCQ(1024, nil)
	require.NoError(b, err)
	s.qp, err = s.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: abi.QPCap{MaxSendWR: 256, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(b, err)
	s.buf, err = s.ctx.Alloc(4<<20, 4096)
	require.NoError(b, err)
	s.mr, err = s.pd.RegMR(s.buf, abi.AccessAll)
	require.NoError(b, err)
	return s
}

// writes posts n RDMA WRITEs of size bytes from a to b, at most depth in
// flight, and waits for all completions.
func (e *benchEnv) writes(b *testing.B, n, size, depth int) {
	a := e.a
	wr := verbs.SendWR{Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(0, uint32(size))},
		RemoteAddr: e.b.buf.Addr(), RKey: e.b.mr.RKey}
	wc := make([]abi.CQE, 64)
	posted, done := 0, 0
	deadline := time.Now().Add(5 * time.Minute)
	for done < n {
		for posted < n && posted-done < depth {
			wr.WrID = uint64(posted)
			if err := a.qp.PostSend(&wr); err != nil {
				break
			}
			posted++
		}
		k := a.cq.Poll(wc)
		for i := range k {
			if wc[i].Status != abi.WCSuccess {
				b.Fatalf("WRITE completion status %v\n%s\n%s\n%+v\n%+v", wc[i].Status, e.da.proc.out, e.db.proc.out, linkStats(b, e.da), linkStats(b, e.db))
			}
		}
		done += k
		if k == 0 {
			// Nothing completed: give the CPU away for 20 us rather than
			// spin. The baseline has no client at all; on a 2-core
			// machine a client spinning on its CQ (even with sched_yield)
			// takes a third of it from the two daemons. With 8 or 64 WRs
			// in flight the pause costs the pipeline nothing.
			ts := unix.Timespec{Nsec: 20_000}
			unix.Nanosleep(&ts, nil)
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d WRITEs completed", done, n)
		}
	}
}

// benchFrames builds the raw benchmarks' frame, a RoCE v2 request of op
// with payload bytes from macs[0] at src to macs[1] at dst, and hello, an
// ACK the other way that teaches the bridge where macs[1] is. Real
// frames (valid IP and UDP headers: a bridge may pass IPv4 through
// netfilter, which drops malformed headers).
func benchFrames(b *testing.B, macs [2]tap.MAC, src, dst string, srcPort uint16, op roce.Opcode, payload int) (frame, hello []byte) {
	path := roce.Path{Mode: roce.ModeEthernet, SrcMAC: macs[0], DstMAC: macs[1],
		Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), SrcPort: srcPort, TTL: 64, DontFragment: true}
	h := &roce.Headers{BTH: roce.BTHFields{Opcode: op, PKey: 0xffff, DestQP: 0x11}, RETH: roce.RETHFields{VA: 0x1000, RKey: 1, DMALength: uint32(payload)}}
	frame, err := path.Build(make([]byte, 8192), path.Headroom(op), payload, h)
	require.NoError(b, err)
	hp := path
	hp.SrcMAC, hp.DstMAC, hp.Src, hp.Dst = macs[1], macs[0], path.Dst, path.Src
	hello, err = hp.Build(make([]byte, 512), hp.Headroom(roce.OpRCAck), 0, &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCAck, PKey: 0xffff}})
	require.NoError(b, err)
	return frame, hello
}

// rawForward writes RoCE frames (op, payload bytes) on rawA until rawB read
// count of them (the kernel may drop some at a full queue: the writer
// keeps going), and returns the time it took.
func (e *benchEnv) rawForward(b *testing.B, count int, op roce.Opcode, payload int) time.Duration {
	frame, hello := benchFrames(b, e.rawMAC, "10.77.0.201", "10.77.0.202", 0xc001, op, payload)
	frameLen := len(frame)
	// Teach the bridge where rawB is.
	require.NoError(b, e.rawB.Queue(0).WriteFrame(hello))
	time.Sleep(10 * time.Millisecond)
	drain(e.rawA)
	drainAll(b, e.rawB) // what an earlier run left queued must not count

	var got atomic.Int64
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		bufs := make([][]byte, 64)
		for i := range bufs {
			bufs[i] = make([]byte, frameLen+64)
		}
		sizes := make([]int, 64)
		q := e.rawB.Queue(0)
		for got.Load() < int64(count) {
			n, err := q.ReadBatch(bufs, sizes, 0)
			if err != nil {
				return
			}
			for i := range n {
				if sizes[i] == frameLen {
					got.Add(1)
				}
			}
		}
	}()
	batch := make([][]byte, 32)
	for i := range batch {
		batch[i] = frame
	}
	q := e.rawA.Queue(0)
	return e.timeForward(b, "raw forwarding", count, &got, readDone, func() error {
		_, err := q.WriteBatch(batch, 0)
		return err
	})
}

// timeForward calls write in a loop, from the time it is called until
// the reader has counted count frames in got and closed readDone, and
// returns that time; what names the run when the frames do not all
// arrive within a minute.
func (e *benchEnv) timeForward(b *testing.B, what string, count int, got *atomic.Int64, readDone <-chan struct{}, write func() error) time.Duration {
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if write() != nil {
				return
			}
		}
	}()
	select {
	case <-readDone:
	case <-time.After(time.Minute):
		b.Fatalf("%s: %d of %d frames\n%s", what, got.Load(), count, ipCmd(b, "-n", e.tp.nsBr, "-s", "link"))
	}
	return time.Since(start)
}

// rawForwardGSO is rawForward with segmented writes and reads: the
// writer puts runs of frames (64, at most a 64 KiB datagram) in one write
// on gsoA, as the TAP link does, and a reader counts the frames of what
// it reads on gsoB (whole runs: gsoB takes USO).
func (e *benchEnv) rawForwardGSO(b *testing.B, count int, op roce.Opcode, payload int) time.Duration {
	frame, hello := benchFrames(b, e.gsoMAC, "10.77.0.203", "10.77.0.204", 0xc002, op, payload)
	const hl = roce.EthernetHeaderLen + roce.IPv4HeaderLen + roce.UDPHeaderLen
	seg := len(frame) - hl
	per := min(64, (0xffff-hl+roce.EthernetHeaderLen)/seg)
	require.NoError(b, e.gsoB.Queue(0).WriteFrame(hello))
	time.Sleep(10 * time.Millisecond)
	drainAll(b, e.gsoA)
	drainAll(b, e.gsoB)

	// The segmented packet: virtio-net header, the frame's headers with
	// the whole datagram's lengths, per payloads.
	head := make([]byte, tap.VnetHdrLen+hl)
	(&tap.VnetHdr{Flags: tap.VnetFlagNeedsCsum, GSOType: tap.VnetGSOUDPL4, HdrLen: hl, GSOSize: uint16(seg),
		CsumStart: hl - roce.UDPHeaderLen, CsumOffset: 6}).Encode(head)
	copy(head[tap.VnetHdrLen:], frame[:hl])
	ip := roce.IPv4(head[tap.VnetHdrLen+roce.EthernetHeaderLen:])
	ip.SetTotalLength(uint16(roce.IPv4HeaderLen + roce.UDPHeaderLen + per*seg))
	ip.SetChecksum(ip.CalculateChecksum())
	u := roce.UDP(head[tap.VnetHdrLen+hl-roce.UDPHeaderLen:])
	u.SetLength(uint16(roce.UDPHeaderLen + per*seg))
	var ps uint32 // pseudo-header sum
	for i := 12; i < 20; i += 2 {
		ps += uint32(ip[i])<<8 | uint32(ip[i+1])
	}
	ps += roce.ProtocolUDP + uint32(roce.UDPHeaderLen+per*seg)
	for ps > 0xffff {
		ps = ps>>16 + ps&0xffff
	}
	u.SetChecksum(uint16(ps))
	parts := [][]byte{head}
	for range per {
		parts = append(parts, frame[hl:])
	}

	var got atomic.Int64
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		rbuf := make([]byte, 1<<17)
		rparts := [][]byte{rbuf}
		q := e.gsoB.Queue(0)
		for got.Load() < int64(count) {
			n, err := q.TryReadPacket(rparts)
			if err != nil {
				return
			}
			if n == 0 {
				if q.WaitReadable() != nil {
					return
				}
				continue
			}
			var vh tap.VnetHdr
			vh.Decode(rbuf)
			n -= tap.VnetHdrLen
			switch {
			case vh.GSOType == tap.VnetGSOUDPL4 && vh.GSOSize == uint16(seg):
				got.Add(int64((n - hl + seg - 1) / seg))
			case n == len(frame):
				got.Add(1)
			}
		}
	}()
	q := e.gsoA.Queue(0)
	return e.timeForward(b, "raw segmented forwarding", count, &got, readDone, func() error { return q.WritePacket(parts) })
}

// drainAll reads d's queue 0 until it is empty.
func drainAll(b *testing.B, d *tap.Device) {
	bufs := [][]byte{make([]byte, 1<<17)}
	sizes := []int{0}
	for {
		n, err := d.Queue(0).TryReadBatch(bufs, sizes, 0)
		require.NoError(b, err)
		if n == 0 {
			return
		}
	}
}

// drain reads what is queued on d's queue 0 without waiting long.
func drain(d *tap.Device) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		bufs := [][]byte{make([]byte, d.MaxFrameSize())}
		d.Queue(0).ReadBatch(bufs, make([]int, 1), 0)
	}()
	select {
	case <-done:
	case <-time.After(50 * time.Millisecond):
	}
}

// BenchmarkTAPWrite1MiB: 1 MiB RDMA WRITE goodput (path MTU 4096, 8 in
// flight) against raw forwarding of as many 4096-byte-payload frames.
func BenchmarkTAPWrite1MiB(b *testing.B) {
	e := newBenchEnv(b)
	const size = 1 << 20
	e.writes(b, 4, size, 8) // warm up
	frames := b.N * (size / 4096)
	// The baseline runs before and after the RDMA run and the mean rate
	// counts, so that a drift of the shared machine during the run does
	// not land on one side of the ratio.
	raw1 := e.rawForward(b, frames, roce.OpRCWriteMiddle, 4096)
	gso1 := e.rawForwardGSO(b, frames, roce.OpRCWriteMiddle, 4096)
	b.ReportAllocs()
	b.SetBytes(size)
	b.ResetTimer()
	e.writes(b, b.N, size, 8)
	b.StopTimer()
	rdma := b.Elapsed()
	raw2 := e.rawForward(b, frames, roce.OpRCWriteMiddle, 4096)
	gso2 := e.rawForwardGSO(b, frames, roce.OpRCWriteMiddle, 4096)
	rdmaMBs := float64(b.N) * size / rdma.Seconds() / 1e6
	rawMBs := (rate(frames, raw1) + rate(frames, raw2)) / 2 * 4096 / 1e6
	gsoMBs := (rate(frames, gso1) + rate(frames, gso2)) / 2 * 4096 / 1e6
	e.reportRetrans(b)
	b.ReportMetric(rdmaMBs, "MB/s")
	b.ReportMetric(rawMBs, "raw-MB/s")
	b.ReportMetric(rdmaMBs/rawMBs, "ratio")
	b.ReportMetric(gsoMBs, "rawgso-MB/s")
	b.ReportMetric(rdmaMBs/gsoMBs, "ratio-gso")
}

// BenchmarkTAPWrite8B: 8-byte RDMA WRITE message rate (64 in flight)
// against raw forwarding of as many frames of that size (before and
// after, as above).
func BenchmarkTAPWrite8B(b *testing.B) {
	e := newBenchEnv(b)
	e.writes(b, 1000, 8, 64) // warm up
	raw1 := e.rawForward(b, b.N, roce.OpRCWriteOnly, 8)
	gso1 := e.rawForwardGSO(b, b.N, roce.OpRCWriteOnly, 8)
	b.ReportAllocs()
	b.ResetTimer()
	e.writes(b, b.N, 8, 64)
	b.StopTimer()
	rdma := b.Elapsed()
	raw2 := e.rawForward(b, b.N, roce.OpRCWriteOnly, 8)
	gso2 := e.rawForwardGSO(b, b.N, roce.OpRCWriteOnly, 8)
	rdmaRate := float64(b.N) / rdma.Seconds()
	rawRate := (rate(b.N, raw1) + rate(b.N, raw2)) / 2
	gsoRate := (rate(b.N, gso1) + rate(b.N, gso2)) / 2
	e.reportRetrans(b)
	b.ReportMetric(rdmaRate/1e6, "Mmsg/s")
	b.ReportMetric(rawRate/1e6, "raw-Mframes/s")
	b.ReportMetric(rdmaRate/rawRate, "ratio")
	b.ReportMetric(gsoRate/1e6, "rawgso-Mframes/s")
	b.ReportMetric(rdmaRate/gsoRate, "ratio-gso")
}

// rate is n per d, per second.
func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// reportRetrans reports the requester's retransmissions (go-back-N
// restarts after a frame was lost, e.g. at a full TAP queue).
func (e *benchEnv) reportRetrans(b *testing.B) {
	r, err := e.a.qp.Query()
	require.NoError(b, err)
	b.ReportMetric(float64(r.Retransmits), "retrans")
	// Frames the responder sent (ACKs) per frame the requester sent,
	// over the whole run.
	var ta, tb, wa, wb, ga, gfa uint64
	for _, q := range linkStats(b, e.da).Queues {
		ta += q.TxFrames
		wa += q.Wakeups
		ga += q.TxGSO
		gfa += q.TxGSOFrames
	}
	for _, q := range linkStats(b, e.db).Queues {
		tb += q.TxFrames
		wb += q.Wakeups
	}
	if ta > 0 {
		b.ReportMetric(float64(tb)/float64(ta), "acks/frame")
		// Times a sleeping worker was woken by a frame, per request
		// frame: how often the requester (a) and responder (b) slept.
		b.ReportMetric(float64(wa)/float64(ta), "a-wakeups/frame")
		b.ReportMetric(float64(wb)/float64(ta), "b-wakeups/frame")
		// Request frames per write(2) of the requester (segmented
		// writes carry several).
		b.ReportMetric(float64(ta)/float64(ta-gfa+ga), "a-frames/write")
	}
}
