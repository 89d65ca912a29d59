package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/rcpair"
)

// testKind is one of the benchmark types, named as perftest names its
// programs (ib_write_bw is write_bw).
type testKind string

const (
	writeBW  testKind = "write_bw"
	readBW   testKind = "read_bw"
	sendBW   testKind = "send_bw"
	atomicBW testKind = "atomic_bw"
	writeLat testKind = "write_lat"
	sendLat  testKind = "send_lat"
	readLat  testKind = "read_lat"
)

func (k *testKind) String() string     { return string(*k) }
func (k *testKind) Set(s string) error { *k = testKind(s); return nil }

var testKinds = []testKind{writeBW, readBW, sendBW, atomicBW, writeLat, sendLat, readLat}

// latency reports whether k is a latency (one operation in flight) test.
func (k testKind) latency() bool { return k == writeLat || k == sendLat || k == readLat }

// pingPong reports whether k is measured as a round trip between the two
// sides; its one-way latency is half the round trip, as perftest reports.
func (k testKind) pingPong() bool { return k == writeLat || k == sendLat }

// Atomic operations of atomic_bw.
const (
	atomicFetchAdd = "fetch_add"
	atomicCmpSwap  = "cmp_swap"
)

// Limits of the options.
const (
	maxSize = 8 << 20
	maxQPs  = 4096
	// maxAreas and maxAreaBytes bound -areas and the buffer it makes.
	maxAreas     = 65536
	maxAreaBytes = 1 << 30
	maxDepth     = 4096
	// sweepBytes bounds the bytes moved per QP for one size of a -a sweep
	// without -duration: large sizes run fewer iterations.
	sweepBytes = 256 << 20
	minSweepIt = 16
)

// options are the parameters of a benchmark, chosen by the client and
// sent to the server in the hello message.
type options struct {
	Test      testKind      `json:"test"`
	Atomic    string        `json:"atomic"`
	Size      int           `json:"size"`
	Sweep     bool          `json:"sweep"`
	Iters     int           `json:"iters"`
	Duration  time.Duration `json:"duration"`
	Depth     int           `json:"depth"`
	QPs       int           `json:"qps"`
	MTU       int           `json:"mtu"`
	Inline    int           `json:"inline"`
	CQMod     int           `json:"cq_mod"`
	Events    bool          `json:"events"`
	Verify    bool          `json:"verify"`
	JSON      bool          `json:"-"`
	RecvDepth int           `json:"recv_depth"`
	// TotalDepth bounds the WRs outstanding over all QPs together (0:
	// QPs × Depth); the client posts to the QPs in turn.
	TotalDepth int `json:"total_depth,omitempty"`
	// Areas is the number of message areas of each QP's buffer on both
	// sides (0 or 1: one); write_bw and read_bw WRs use them in turn, so
	// that one QP can touch as much memory as Areas QPs of one area each.
	Areas int `json:"areas,omitempty"`
	// Transport is the QP type: rc (default), uc or ud.
	Transport string `json:"transport"`
	// ECE are the ECE options (abi.ECE* bits) the client offers the
	// server for its RC QPs (-ece, -selective-repeat): over the control
	// connection it sends those its device supports, and both sides set
	// those the server also wants and supports (server.go), as the CM's
	// REQ and REP would agree on them.
	ECE uint32 `json:"ece,omitempty"`
	// eceFlags are -ece and -selective-repeat, which finish turns into
	// ECE.
	eceFlags eceFlags
}

// eceFlags are the ECE options one side asks for on its command line.
type eceFlags struct {
	list            string
	selectiveRepeat bool
}

func (f *eceFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&f.list, "ece", "", "vrnic's ECE transport options to negotiate with the peer (RC): sr, rto, all or none, comma-separated; both sides must ask for an option for it to be used")
	fs.BoolVar(&f.selectiveRepeat, "selective-repeat", false, "negotiate selective repeat with the peer (the ECE option sr; RC, both sides)")
}

// options returns the options asked for; given reports whether any flag
// was.
func (f *eceFlags) options() (opts uint32, given bool, err error) {
	if f.list != "" {
		if opts, err = abi.ParseECE(f.list); err != nil {
			return 0, true, err
		}
		given = true
	}
	if f.selectiveRepeat {
		opts |= abi.ECESelectiveRepeat
		given = true
	}
	return opts, given, nil
}

// Transports of -transport.
const (
	transportRC = "rc"
	transportUC = "uc"
	transportUD = "ud"
)

// qpType is the QP type of the transport.
func (o *options) qpType() abi.QPType {
	switch o.Transport {
	case transportUC:
		return abi.QPTUC
	case transportUD:
		return abi.QPTUD
	}
	return abi.QPTRC
}

// unreliable reports whether messages may be lost without an error (UC,
// UD): the server counts what arrived instead of waiting for every one.
func (o *options) unreliable() bool { return o.Transport == transportUC || o.Transport == transportUD }

// addFlags registers the benchmark options on fs.
func (o *options) addFlags(fs *flag.FlagSet) {
	fs.Var(&o.Test, "test", "write_bw, read_bw, send_bw, atomic_bw, write_lat, send_lat or read_lat (default write_bw)")
	fs.StringVar(&o.Atomic, "atomic", atomicFetchAdd, "atomic_bw operation: fetch_add or cmp_swap")
	fs.IntVar(&o.Size, "size", 0, "message size in bytes, 1..8388608 (default 65536 for bandwidth, 8 for latency tests)")
	fs.BoolVar(&o.Sweep, "a", false, "sweep all message sizes 2^0 .. 2^23")
	fs.IntVar(&o.Iters, "iters", 0, "iterations per QP (default 5000 for bandwidth, 1000 for latency tests)")
	fs.DurationVar(&o.Duration, "duration", 0, "run each size for this long instead of a number of iterations")
	fs.IntVar(&o.Depth, "depth", 128, "outstanding work requests per QP (bandwidth tests)")
	fs.IntVar(&o.QPs, "qps", 1, "number of QPs (bandwidth tests)")
	fs.IntVar(&o.TotalDepth, "total-depth", 0, "outstanding work requests over all QPs together, posted to the QPs in turn (bandwidth tests; default qps × depth)")
	fs.IntVar(&o.Areas, "areas", 1, "message areas per QP buffer, used in turn by successive WRs of a QP (write_bw, read_bw): the memory one QP touches, as that many QPs would")
	fs.IntVar(&o.RecvDepth, "rx-depth", 0, "receives posted per QP (send tests; default max(4 × depth, 512))")
	fs.IntVar(&o.MTU, "mtu", 4096, "path MTU: 256, 512, 1024, 2048 or 4096")
	fs.IntVar(&o.Inline, "inline", 0, "SEND and RDMA WRITE messages up to this size are posted inline (0..512)")
	fs.IntVar(&o.CQMod, "cq-mod", 0, "request a completion every N work requests (default min(depth, 64))")
	fs.BoolVar(&o.Events, "events", false, "wait for completion events instead of busy polling")
	fs.BoolVar(&o.Verify, "verify", true, "verify the data moved (checksums, atomic words) after each size")
	fs.BoolVar(&o.JSON, "json", false, "print the results as JSON")
	fs.StringVar(&o.Transport, "transport", transportRC, "QP type: rc, uc (write_bw, send_bw, write_lat, send_lat) or ud (send_bw, send_lat; messages up to -mtu)")
	o.eceFlags.add(fs)
}

var errOption = errors.New("bad option")

// finish fills defaults and checks the options.
func (o *options) finish() error {
	if o.Test == "" {
		o.Test = writeBW
	}
	if o.Transport == "" {
		o.Transport = transportRC
	}
	known := false
	for _, k := range testKinds {
		known = known || k == o.Test
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errOption, fmt.Sprintf(format, args...))
	}
	if !known {
		return bad("test %q: want one of %v", o.Test, testKinds)
	}
	if o.Test.latency() {
		o.Depth = 1
	}
	if o.Size == 0 {
		o.Size = 65536
		if o.Test.latency() {
			o.Size = 8
		}
	}
	if o.Test == atomicBW {
		o.Size = 8
		o.Sweep = false
		o.Inline = 0
	}
	if o.Iters == 0 && o.Duration == 0 {
		o.Iters = 5000
		if o.Test.latency() {
			o.Iters = 1000
		}
	}
	if o.CQMod == 0 {
		o.CQMod = min(o.Depth, 64)
		if o.TotalDepth > 0 {
			o.CQMod = 1 // a WR waiting for later ones on its QP would hold a share of the total
		}
	}
	if o.RecvDepth == 0 {
		o.RecvDepth = min(max(4*o.Depth, 512), abi.MaxQPWR)
	}
	if o.Areas == 0 {
		o.Areas = 1
	}
	// The flags give the options (the client); options received keep
	// theirs (the server).
	if ece, given, err := o.eceFlags.options(); err != nil {
		return bad("%v", err)
	} else if given {
		o.ECE = ece
	}
	switch {
	case o.Atomic != atomicFetchAdd && o.Atomic != atomicCmpSwap:
		return bad("atomic %q: want fetch_add or cmp_swap", o.Atomic)
	case o.Size < 1 || o.Size > maxSize:
		return bad("size %d out of range (1..%d)", o.Size, maxSize)
	case o.Iters < 0 || o.Iters > 1<<30:
		return bad("iters %d out of range", o.Iters)
	case o.Duration < 0 || o.Duration > time.Hour:
		return bad("duration %v out of range", o.Duration)
	case o.Iters > 0 && o.Duration > 0:
		return bad("give -iters or -duration, not both")
	case o.Depth < 1 || o.Depth > maxDepth:
		return bad("depth %d out of range (1..%d)", o.Depth, maxDepth)
	case o.QPs < 1 || o.QPs > maxQPs:
		return bad("qps %d out of range (1..%d)", o.QPs, maxQPs)
	case o.Test.latency() && o.QPs != 1:
		return bad("%s runs on one QP", o.Test)
	case o.Test == writeLat && o.Events:
		return bad("write_lat waits by polling the memory the peer writes; -events does not apply")
	case rcpair.MTU(o.MTU) == 0:
		return bad("mtu %d: want 256, 512, 1024, 2048 or 4096", o.MTU)
	case o.Inline < 0 || o.Inline > abi.MaxInline:
		return bad("inline %d out of range (0..%d)", o.Inline, abi.MaxInline)
	case o.CQMod < 1 || o.CQMod > o.Depth:
		return bad("cq-mod %d out of range (1..depth %d)", o.CQMod, o.Depth)
	case o.RecvDepth < 1 || o.RecvDepth > abi.MaxQPWR:
		return bad("recv depth %d out of range", o.RecvDepth)
	case o.TotalDepth < 0 || o.TotalDepth > o.QPs*o.Depth || o.TotalDepth > 0 && o.Test.latency():
		return bad("total-depth %d out of range (0..qps × depth %d, bandwidth tests)", o.TotalDepth, o.QPs*o.Depth)
	case o.TotalDepth > 0 && o.CQMod != 1:
		return bad("total-depth needs cq-mod 1 (every WR signaled)")
	case o.Areas < 1 || o.Areas > maxAreas:
		return bad("areas %d out of range (1..%d)", o.Areas, maxAreas)
	case o.Areas > 1 && o.Test != writeBW && o.Test != readBW:
		return bad("areas: write_bw and read_bw only")
	case o.Areas > 1 && int64(o.Areas)*int64(o.maxMsg()) > maxAreaBytes:
		return bad("areas %d of %d bytes: more than %d bytes per QP", o.Areas, o.maxMsg(), maxAreaBytes)
	case o.cqEntries() > abi.MaxCQE:
		return bad("qps × depth too large for one CQ (%d entries)", abi.MaxCQE)
	}
	switch o.Transport {
	case transportRC:
	case transportUC:
		if o.Test != writeBW && o.Test != sendBW && o.Test != writeLat && o.Test != sendLat {
			return bad("%s over UC: UC carries SEND and RDMA WRITE only", o.Test)
		}
	case transportUD:
		if o.Test != sendBW && o.Test != sendLat {
			return bad("%s over UD: UD carries SEND only", o.Test)
		}
		if o.maxMsg() > o.MTU {
			return bad("size %d over UD: a UD message is one packet of at most -mtu %d bytes", o.maxMsg(), o.MTU)
		}
	default:
		return bad("transport %q: want rc, uc or ud", o.Transport)
	}
	switch {
	case o.ECE&^abi.ECEOptions != 0:
		return bad("ECE options %#x: unknown bits", o.ECE)
	case o.ECE != 0 && o.Transport != transportRC:
		return bad("ECE options (%s) over %s: they are options of RC QPs", abi.ECEString(o.ECE), strings.ToUpper(o.Transport))
	}
	return nil
}

// receives reports whether the test posts receives (SEND tests).
func (o *options) receives() bool { return o.Test == sendBW || o.Test == sendLat }

// recvWR is the receive queue size of each QP: RecvDepth for the tests
// that receive, 1 for the others.
func (o *options) recvWR() int {
	if o.receives() {
		return o.RecvDepth
	}
	return 1
}

// sendOutstanding is the most send WRs outstanding over all QPs.
func (o *options) sendOutstanding() int {
	if o.TotalDepth > 0 {
		return o.TotalDepth
	}
	return o.QPs * o.Depth
}

// cqEntries is the size of each side's one CQ: every outstanding send
// and every posted receive fits.
func (o *options) cqEntries() int {
	n := o.sendOutstanding() + 2
	if o.receives() {
		n += o.QPs * o.RecvDepth
	}
	return n
}

// sizes are the message sizes to run, smallest first.
func (o *options) sizes() []int {
	if !o.Sweep {
		return []int{o.Size}
	}
	var s []int
	for n := 1; n <= o.maxMsg(); n <<= 1 {
		s = append(s, n)
	}
	return s
}

// maxMsg is the largest message size of the run.
func (o *options) maxMsg() int {
	switch {
	case o.Sweep && o.Transport == transportUD:
		return o.MTU // one packet
	case o.Sweep:
		return maxSize
	}
	return o.Size
}

// itersFor is the number of iterations per QP for one size (0: run for
// the duration).
func (o *options) itersFor(size int) int {
	if o.Duration > 0 {
		return 0
	}
	if o.Sweep {
		return min(o.Iters, max(minSweepIt, sweepBytes/size))
	}
	return o.Iters
}

// inline reports whether messages of size bytes are posted inline.
func (o *options) inline(size int) bool {
	return size <= o.Inline && (o.Test == writeBW || o.Test == sendBW || o.Test == writeLat || o.Test == sendLat)
}
