package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// scaleConfig is the command line of scale.
type scaleConfig struct {
	devA, devB   string
	pidA, pidB   int
	pairs        int
	depth        int
	block        int
	perContext   int
	hold         bool
	json         bool
	stdin        io.Reader
	stdoutFlush  func()
	progressEach int
}

// scaleReport is what scale measured; -json prints it.
type scaleReport struct {
	Pairs      int `json:"pairs"` // connected QP pairs, one QP on each device
	Depth      int `json:"depth"` // max_send_wr = max_recv_wr of every QP
	Block      int `json:"block"`
	PerContext int `json:"per_context"`
	// Create[i] is the mean time to create and connect one pair (both
	// QPs RESET → RTS) over block i, in µs; Destroy[i] the mean time to
	// destroy one pair over the i-th block destroyed (the first block
	// destroyed is the one created last, with every other pair still
	// there).
	Create  []float64 `json:"create_us"`
	Destroy []float64 `json:"destroy_us"`
	// CreateRatio is the last block's create time per pair over the
	// first's; DestroyRatio the first destroyed block's over the last's
	// (both: the cost with every pair present over the cost with one
	// block present).
	CreateRatio  float64 `json:"create_ratio"`
	DestroyRatio float64 `json:"destroy_ratio"`
	// RSS: the daemons' anonymous resident memory (RssAnon, KiB) before
	// the first QP, with every pair created, and after they were all
	// destroyed; BytesPerQP is (with - before) / pairs, one QP per pair
	// on each daemon. Zero without -pid-a / -pid-b.
	RSSBeforeKiB [2]int64   `json:"rss_before_kib"`
	RSSWithKiB   [2]int64   `json:"rss_with_kib"`
	RSSAfterKiB  [2]int64   `json:"rss_after_kib"`
	BytesPerQP   [2]float64 `json:"bytes_per_qp"`
}

func parseScale(args []string, stderr io.Writer) (*scaleConfig, error) {
	fs := flag.NewFlagSet("vrnic-perf scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &scaleConfig{}
	fs.StringVar(&c.devA, "dev-a", "", "one device's control socket")
	fs.StringVar(&c.devB, "dev-b", "", "the other device's control socket (may be the same)")
	fs.IntVar(&c.pidA, "pid-a", 0, "vrnicd PID of -dev-a: its memory is reported")
	fs.IntVar(&c.pidB, "pid-b", 0, "vrnicd PID of -dev-b")
	fs.IntVar(&c.pairs, "qps", 10000, "QP pairs to create, connect and destroy (one QP on each device)")
	fs.IntVar(&c.depth, "depth", 16, "max_send_wr and max_recv_wr of every QP")
	fs.IntVar(&c.block, "block", 1000, "pairs per measured block")
	fs.IntVar(&c.perContext, "per-context", 1000, "QPs per context (one doorbell page holds 2047 records)")
	fs.BoolVar(&c.hold, "hold", false, "once every pair is connected, print \"ready\" and wait for a line or EOF on stdin before destroying them")
	fs.BoolVar(&c.json, "json", false, "print the report as JSON")
	fs.IntVar(&c.progressEach, "progress", 0, "print a line every N blocks (0: none)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	bad := func(format string, a ...any) error { return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...)) }
	switch {
	case fs.NArg() > 0:
		return nil, bad("unexpected arguments %q", fs.Args())
	case c.devA == "" || c.devB == "":
		return nil, bad("-dev-a and -dev-b are required")
	case c.pairs < 1 || c.pairs > 1<<20:
		return nil, bad("qps %d out of range", c.pairs)
	case c.depth < 1 || c.depth > abi.MaxQPWR:
		return nil, bad("depth %d out of range", c.depth)
	case c.block < 1 || c.block > c.pairs:
		return nil, bad("block %d out of range (1..qps)", c.block)
	case c.perContext < 1 || c.perContext > abi.DBRecords-2:
		return nil, bad("per-context %d out of range", c.perContext)
	}
	return c, nil
}

func scaleMain(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c, err := parseScale(args, stderr)
	if err != nil {
		return err
	}
	c.stdin = stdin
	r, err := runScale(c, stdout)
	if r == nil {
		return err
	}
	if c.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(r)
	} else {
		writeScale(stdout, r)
	}
	return err
}

// scaleSide is one device's contexts, each with a PD and a CQ shared by
// its QPs.
type scaleSide struct {
	dev  string
	per  int
	ctxs []*scaleCtx
	gid  [16]byte
}

type scaleCtx struct {
	ctx *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
}

// ctxFor returns the context of QP i, opening it for its first QP.
func (s *scaleSide) ctxFor(i int) (*scaleCtx, error) {
	k := i / s.per
	if k < len(s.ctxs) {
		return s.ctxs[k], nil
	}
	ctx, err := verbs.Open(s.dev, verbs.WithClientName("vrnic-perf-scale"))
	if err != nil {
		return nil, err
	}
	x := &scaleCtx{ctx: ctx}
	if x.pd, err = ctx.AllocPD(); err != nil {
		ctx.Close()
		return nil, err
	}
	if x.cq, err = ctx.CreateCQ(64, nil); err != nil {
		ctx.Close()
		return nil, err
	}
	if len(s.ctxs) == 0 {
		g, err := ctx.QueryGID(1, 0)
		if err != nil {
			ctx.Close()
			return nil, err
		}
		s.gid = g.GID
	}
	s.ctxs = append(s.ctxs, x)
	return x, nil
}

func (s *scaleSide) close() {
	for _, x := range s.ctxs {
		x.ctx.Close()
	}
}

// runScale creates c.pairs connected QP pairs in blocks, then destroys
// them, timing each block.
func runScale(c *scaleConfig, stdout io.Writer) (*scaleReport, error) {
	r := &scaleReport{Pairs: c.pairs, Depth: c.depth, Block: c.block, PerContext: c.perContext}
	a := &scaleSide{dev: c.devA, per: c.perContext}
	b := &scaleSide{dev: c.devB, per: c.perContext}
	defer a.close()
	defer b.close()
	pids := [2]int{c.pidA, c.pidB}
	r.RSSBeforeKiB = rssAnon(pids)
	qa := make([]*verbs.QP, 0, c.pairs)
	qb := make([]*verbs.QP, 0, c.pairs)
	cp := abi.QPCap{MaxSendWR: uint32(c.depth), MaxRecvWR: uint32(c.depth), MaxSendSGE: 1, MaxRecvSGE: 1}
	create := func(s *scaleSide, i int) (*verbs.QP, error) {
		x, err := s.ctxFor(i)
		if err != nil {
			return nil, err
		}
		return x.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: x.cq, RecvCQ: x.cq, Cap: cp})
	}
	for i := 0; i < c.pairs; {
		n := min(c.block, c.pairs-i)
		t0 := time.Now()
		for range n {
			p, err := create(a, i)
			if err != nil {
				return r, fmt.Errorf("create QP %d on %s: %w", i, c.devA, err)
			}
			q, err := create(b, i)
			if err != nil {
				return r, fmt.Errorf("create QP %d on %s: %w", i, c.devB, err)
			}
			if err := connectIdle(p, q, b.gid); err != nil {
				return r, err
			}
			if err := connectIdle(q, p, a.gid); err != nil {
				return r, err
			}
			qa, qb = append(qa, p), append(qb, q)
			i++
		}
		r.Create = append(r.Create, float64(time.Since(t0).Microseconds())/float64(n))
		if c.progressEach > 0 && len(r.Create)%c.progressEach == 0 {
			fmt.Fprintf(os.Stderr, "scale: %d pairs, %.1f µs per pair\n", i, r.Create[len(r.Create)-1])
		}
	}
	r.RSSWithKiB = rssAnon(pids)
	if c.hold {
		fmt.Fprintln(stdout, "ready")
		if c.stdoutFlush != nil {
			c.stdoutFlush()
		}
		bufio.NewReader(c.stdin).ReadString('\n')
	}
	for end := len(qa); end > 0; {
		n := min(c.block, end)
		t0 := time.Now()
		for j := end - 1; j >= end-n; j-- {
			if err := qa[j].Destroy(); err != nil {
				return r, fmt.Errorf("destroy QP %#x: %w", qa[j].QPN, err)
			}
			if err := qb[j].Destroy(); err != nil {
				return r, fmt.Errorf("destroy QP %#x: %w", qb[j].QPN, err)
			}
		}
		end -= n
		r.Destroy = append(r.Destroy, float64(time.Since(t0).Microseconds())/float64(n))
	}
	a.close()
	b.close()
	a.ctxs, b.ctxs = nil, nil
	// The daemons release a closed context's memory after their workers
	// confirmed its QPs gone: give them a moment.
	time.Sleep(200 * time.Millisecond)
	r.RSSAfterKiB = rssAnon(pids)
	if k := len(r.Create); k > 0 && r.Create[0] > 0 {
		r.CreateRatio = r.Create[k-1] / r.Create[0]
	}
	if k := len(r.Destroy); k > 0 && r.Destroy[k-1] > 0 {
		r.DestroyRatio = r.Destroy[0] / r.Destroy[k-1]
	}
	for i := range pids {
		if pids[i] > 0 {
			r.BytesPerQP[i] = float64(r.RSSWithKiB[i]-r.RSSBeforeKiB[i]) * 1024 / float64(c.pairs)
		}
	}
	return r, nil
}

// connectIdle moves p, in RESET, to RTS towards q (on the device of gid),
// PSN 0 both ways.
func connectIdle(p, q *verbs.QP, gid [16]byte) error {
	if err := p.ToInit(abi.AccessAll, 0); err != nil {
		return fmt.Errorf("QP %#x to INIT: %w", p.QPN, err)
	}
	if err := p.ToRTR(verbs.RTRAttr{AV: abi.AHAttr{DGID: gid, HopLimit: 64, PortNum: 1},
		PathMTU: abi.MTU4096, DestQPN: q.QPN, MaxDestRdAtomic: 1, MinRNRTimer: 1}); err != nil {
		return fmt.Errorf("QP %#x to RTR: %w", p.QPN, err)
	}
	if err := p.ToRTS(verbs.RTSAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}); err != nil {
		return fmt.Errorf("QP %#x to RTS: %w", p.QPN, err)
	}
	return nil
}

// rssAnon reads RssAnon (KiB) of each PID from /proc; 0 for PID 0 or an
// unreadable status.
func rssAnon(pids [2]int) [2]int64 {
	var r [2]int64
	for i, pid := range pids {
		if pid <= 0 {
			continue
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "RssAnon:"); ok {
				r[i], _ = strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			}
		}
	}
	return r
}

func writeScale(w io.Writer, r *scaleReport) {
	fmt.Fprintf(w, "%d QP pairs, depth %d, %d per context, blocks of %d\n", r.Pairs, r.Depth, r.PerContext, r.Block)
	fmt.Fprintf(w, "create+connect per pair: first block %.1f µs, last block %.1f µs, ratio %.2f\n",
		r.Create[0], r.Create[len(r.Create)-1], r.CreateRatio)
	if len(r.Destroy) > 0 {
		fmt.Fprintf(w, "destroy per pair: first block (all present) %.1f µs, last block %.1f µs, ratio %.2f\n",
			r.Destroy[0], r.Destroy[len(r.Destroy)-1], r.DestroyRatio)
	}
	for i, n := range []string{"a", "b"} {
		if r.RSSWithKiB[i] == 0 {
			continue
		}
		fmt.Fprintf(w, "daemon %s: RssAnon %d KiB before, %d KiB with the QPs, %d KiB after; %.0f bytes per idle QP\n",
			n, r.RSSBeforeKiB[i], r.RSSWithKiB[i], r.RSSAfterKiB[i], r.BytesPerQP[i])
	}
}
