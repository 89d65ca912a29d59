package routed

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/rcpair"
	"github.com/vrnic/vrnic/verbs"
)

// The helper role: the test binary run again, in a host's namespace, with
// helperEnv set to a JSON helperArgs. It is one host's verbs client: a
// context on the host's daemon, one registered buffer, and per peer host
// an RC QP with its own send and receive CQs. The test drives it with
// JSON requests on stdin, one per line, each answered on stdout by a
// reply with the same ID; requests are served concurrently (each in its
// own goroutine), and the test never has two requests in flight that
// touch one CQ or one memory area.

const helperEnv = "VRNIC_ROUTED_HELPER"

type helperArgs struct {
	Socket string `json:"socket"` // the daemon's control socket
	Host   int    `json:"host"`   // this host's index
}

// Memory: one slot of slotSize bytes per peer host j, in which this
// host's QP to j sends from src and reads into readDst, and j's QP to
// this host writes into writeDst, sends into recvDst and reads from
// readSrc.
const (
	offSrc      = 0
	offReadDst  = 64 << 10
	offWriteDst = 128 << 10
	offRecvDst  = 192 << 10
	offReadSrc  = 256 << 10
	areaSize    = 64 << 10
	slotSize    = 320 << 10
	maxMsg      = areaSize - 64 // the largest message; 64 bytes after it stay untouched
)

// Connection parameters of every QP: path MTU 1024 (the 1500-byte
// links), ACK timeout code 16 (4.096 µs × 2^16 ≈ 268 ms) and 3 retries,
// so a QP whose peer is gone fails with RETRY_EXC_ERR after about a
// second, while a live peer slowed down by a loaded machine has to stall
// for four timeouts in a row to fail.
const (
	qpTimeout  = 16
	qpRetryCnt = 3
)

// request is one line from the test.
type request struct {
	ID   int          `json:"id"`
	Op   string       `json:"op"`
	Peer int          `json:"peer"`
	GID  int          `json:"gid"` // source GID index (create), 0: IPv4, 1: IPv6 (TAP)
	Info rcpair.Info  `json:"info"`
	Kind abi.WROpcode `json:"kind"`
	Seed uint32       `json:"seed"`
	Size int          `json:"size"`
}

// reply answers a request: Err for a failure of the helper (a bad
// request, a verbs call failing, a data mismatch), Status for the
// completion of a posted work request.
type reply struct {
	ID     int          `json:"id"`
	Err    string       `json:"err,omitempty"`
	Status abi.WCStatus `json:"status"`
	Info   rcpair.Info  `json:"info"`
	State  abi.QPState  `json:"state"`
	// A stream's WRITEs that completed successfully, and of those
	// after its first failure (Status), the ones flushed.
	OK, Flushed int
}

// peerQP is this host's QP to one peer.
type peerQP struct {
	mu       sync.Mutex // posting to the QP: sends and receives come from two requests
	qp       *verbs.QP
	scq, rcq *verbs.CQ
	psn      uint32
	gid      int
	peer     rcpair.Info

	// streamed counts the successful WRITEs of a running stream,
	// streamFailed says it saw its failure; streamMu and streamCond wake
	// waitstream requests.
	streamMu     sync.Mutex
	streamCond   *sync.Cond
	streamed     int
	streamFailed bool
}

type helper struct {
	args helperArgs
	ctx  *verbs.Context
	pd   *verbs.PD
	buf  *verbs.Buffer
	mr   *verbs.MR

	mu    sync.Mutex
	peers [nHosts]*peerQP

	outMu sync.Mutex
	out   *json.Encoder
}

func helperMain() int {
	var a helperArgs
	if err := json.Unmarshal([]byte(os.Getenv(helperEnv)), &a); err != nil || a.Host < 0 || a.Host >= nHosts {
		fmt.Fprintln(os.Stderr, "helper: bad arguments:", err)
		return 2
	}
	h := &helper{args: a, out: json.NewEncoder(os.Stdout)}
	if err := h.open(); err != nil {
		fmt.Fprintf(os.Stderr, "helper h%d: %v\n", a.Host, err)
		return 1
	}
	var wg sync.WaitGroup
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var r request
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			fmt.Fprintf(os.Stderr, "helper h%d: bad request %q: %v\n", a.Host, sc.Text(), err)
			return 2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep := h.serve(&r)
			rep.ID = r.ID
			h.outMu.Lock()
			defer h.outMu.Unlock()
			h.out.Encode(rep)
		}()
	}
	wg.Wait()
	return 0
}

func (h *helper) open() error {
	var err error
	if h.ctx, err = verbs.Open(h.args.Socket, verbs.WithClientName(fmt.Sprintf("routed-h%d", h.args.Host))); err != nil {
		return err
	}
	if h.pd, err = h.ctx.AllocPD(); err != nil {
		return err
	}
	if h.buf, err = h.ctx.Alloc(nHosts*slotSize, 4096); err != nil {
		return err
	}
	h.mr, err = h.pd.RegMR(h.buf, abi.AccessAll)
	return err
}

// area returns n bytes at off in the slot of peer j.
func (h *helper) area(j, off, n int) []byte {
	return h.buf.Bytes[j*slotSize+off:][:n]
}

func (h *helper) serve(r *request) reply {
	if r.Peer < 0 || r.Peer >= nHosts || r.Peer == h.args.Host || r.Size < 0 || r.Size > maxMsg {
		return reply{Err: fmt.Sprintf("bad request %+v", *r)}
	}
	var rep reply
	var err error
	switch r.Op {
	case "create":
		rep.Info, err = h.create(r.Peer, r.GID)
	case "connect":
		err = h.connect(r.Peer, r.Info)
	case "state":
		rep.State, err = h.state(r.Peer)
	case "fill":
		pattern(h.area(r.Peer, offReadSrc, r.Size), r.Seed)
	case "checkwrite":
		// Checked, then cleared for the next WRITE.
		err = patternOK(h.area(r.Peer, offWriteDst, r.Size+64), r.Size, r.Seed)
		clear(h.area(r.Peer, offWriteDst, areaSize))
	case "postrecv":
		err = h.postRecv(r.Peer)
	case "checkrecv":
		err = h.checkRecv(r.Peer, r.Size, r.Seed)
	case "post":
		rep.Status, err = h.post(r.Peer, r.Kind, r.Size, r.Seed)
	case "stream":
		rep.OK, rep.Status, rep.Flushed, err = h.stream(r.Peer)
	case "waitstream":
		err = h.waitStream(r.Peer, r.Size)
	default:
		err = fmt.Errorf("unknown request %q", r.Op)
	}
	if err != nil {
		rep.Err = fmt.Sprintf("h%d %s peer h%d: %v", h.args.Host, r.Op, r.Peer, err)
	}
	return rep
}

// create makes a new QP to peer j (destroying the previous one with its
// CQs) and describes it, sending from GID index gid.
func (h *helper) create(j, gid int) (rcpair.Info, error) {
	h.mu.Lock()
	old := h.peers[j]
	h.peers[j] = nil
	h.mu.Unlock()
	if old != nil {
		if err := errors.Join(old.qp.Destroy(), old.scq.Destroy(), old.rcq.Destroy()); err != nil {
			return rcpair.Info{}, fmt.Errorf("destroy the old QP: %w", err)
		}
	}
	p := &peerQP{gid: gid}
	p.streamCond = sync.NewCond(&p.streamMu)
	var err error
	if p.scq, err = h.ctx.CreateCQ(16, nil); err != nil {
		return rcpair.Info{}, err
	}
	if p.rcq, err = h.ctx.CreateCQ(16, nil); err != nil {
		return rcpair.Info{}, err
	}
	if p.qp, err = h.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: p.scq, RecvCQ: p.rcq,
		Cap: abi.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return rcpair.Info{}, err
	}
	g, err := h.ctx.QueryGID(1, uint32(gid))
	if err != nil {
		return rcpair.Info{}, err
	}
	p.psn = (p.qp.QPN*2654435761 + uint32(time.Now().UnixNano())) & 0xffffff
	h.mu.Lock()
	h.peers[j] = p
	h.mu.Unlock()
	return rcpair.Local(p.qp, p.psn, g.GID, h.mr), nil
}

func (h *helper) peer(j int) (*peerQP, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.peers[j] == nil {
		return nil, errors.New("no QP")
	}
	return h.peers[j], nil
}

// connect moves the QP to peer j to RTS towards info.
func (h *helper) connect(j int, info rcpair.Info) error {
	p, err := h.peer(j)
	if err != nil {
		return err
	}
	p.peer = info
	qp := p.qp
	if err := qp.ToInit(abi.AccessAll, 0); err != nil {
		return fmt.Errorf("QP %#x to INIT: %w", qp.QPN, err)
	}
	if err := qp.ToRTR(verbs.RTRAttr{AV: abi.AHAttr{DGID: info.GID, SGIDIndex: uint8(p.gid), HopLimit: 64, PortNum: 1},
		PathMTU: abi.MTU1024, DestQPN: info.QPN, RQPSN: info.PSN, MaxDestRdAtomic: 4, MinRNRTimer: 1}); err != nil {
		return fmt.Errorf("QP %#x to RTR: %w", qp.QPN, err)
	}
	if err := qp.ToRTS(verbs.RTSAttr{SQPSN: p.psn, Timeout: qpTimeout, RetryCnt: qpRetryCnt, RNRRetry: 7, MaxRdAtomic: 4}); err != nil {
		return fmt.Errorf("QP %#x to RTS: %w", qp.QPN, err)
	}
	return nil
}

func (h *helper) state(j int) (abi.QPState, error) {
	p, err := h.peer(j)
	if err != nil {
		return 0, err
	}
	r, err := p.qp.Query()
	return r.Attr.QPState, err
}

// postRecv posts a receive of up to areaSize bytes into recvDst of j's slot.
func (h *helper) postRecv(j int) error {
	p, err := h.peer(j)
	if err != nil {
		return err
	}
	clear(h.area(j, offRecvDst, areaSize))
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.qp.PostRecv(&verbs.RecvWR{WrID: uint64(j), SGL: []abi.SGE{h.mr.SGE(uint32(j*slotSize+offRecvDst), areaSize)}})
}

// checkRecv waits for one receive completion from peer j and checks it
// and the data.
func (h *helper) checkRecv(j, size int, seed uint32) error {
	p, err := h.peer(j)
	if err != nil {
		return err
	}
	wc, err := poll1(p.rcq)
	if err != nil {
		return err
	}
	switch {
	case wc.Status != abi.WCSuccess:
		return fmt.Errorf("receive completion status %v", wc.Status)
	case wc.Opcode != abi.WCRecv || wc.QPNum != p.qp.QPN || wc.WrID != uint64(j):
		return fmt.Errorf("receive completion %+v, want a RECV of QP %#x", wc, p.qp.QPN)
	case wc.ByteLen != uint32(size):
		return fmt.Errorf("received %d bytes, want %d", wc.ByteLen, size)
	}
	return patternOK(h.area(j, offRecvDst, size+64), size, seed)
}

// post posts one signalled WRITE, SEND or READ of size bytes on the QP to
// j and waits for its completion. WRITE and SEND send pattern seed from
// src; WRITE lands in the peer's writeDst for this host, READ reads the
// peer's readSrc for this host into readDst and checks it is pattern
// seed. It returns the completion's status.
func (h *helper) post(j int, kind abi.WROpcode, size int, seed uint32) (abi.WCStatus, error) {
	p, err := h.peer(j)
	if err != nil {
		return 0, err
	}
	me := h.args.Host
	wr := &verbs.SendWR{WrID: uint64(seed), Opcode: kind, Flags: abi.SendSignaled, RKey: p.peer.RKey}
	switch kind {
	case abi.WRRDMAWrite, abi.WRSend:
		pattern(h.area(j, offSrc, size), seed)
		wr.SGL = []abi.SGE{h.mr.SGE(uint32(j*slotSize+offSrc), uint32(size))}
		wr.RemoteAddr = p.peer.Addr + uint64(me*slotSize+offWriteDst)
	case abi.WRRDMARead:
		clear(h.area(j, offReadDst, size+64))
		wr.SGL = []abi.SGE{h.mr.SGE(uint32(j*slotSize+offReadDst), uint32(size))}
		wr.RemoteAddr = p.peer.Addr + uint64(me*slotSize+offReadSrc)
	default:
		return 0, fmt.Errorf("operation %v not used here", kind)
	}
	p.mu.Lock()
	err = p.qp.PostSend(wr)
	p.mu.Unlock()
	if err != nil {
		return 0, err
	}
	wc, err := poll1(p.scq)
	if err != nil {
		return 0, err
	}
	if wc.WrID != uint64(seed) || wc.QPNum != p.qp.QPN {
		return wc.Status, fmt.Errorf("completion %+v, want WR %d of QP %#x", wc, seed, p.qp.QPN)
	}
	if wc.Status == abi.WCSuccess && kind == abi.WRRDMARead {
		if wc.ByteLen != uint32(size) {
			return wc.Status, fmt.Errorf("READ completion byte_len %d, want %d", wc.ByteLen, size)
		}
		return wc.Status, patternOK(h.area(j, offReadDst, size+64), size, seed)
	}
	return wc.Status, nil
}

// streamDepth is how many WRITEs a stream keeps outstanding.
const streamDepth = 4

// stream keeps streamDepth signalled 4 KiB WRITEs outstanding on the QP
// to j, posting one for each that completes, until a completion is not
// successful; then it posts no more and collects the outstanding ones.
// It returns the successful WRITEs, the first failure's status and how
// many of the WRITEs outstanding behind it were flushed (WR_FLUSH_ERR);
// any other status behind the first failure is an error.
func (h *helper) stream(j int) (ok int, first abi.WCStatus, flushed int, err error) {
	p, err := h.peer(j)
	if err != nil {
		return 0, 0, 0, err
	}
	const size = 4096
	pattern(h.area(j, offSrc, size), 0x5eed)
	wr := &verbs.SendWR{Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: []abi.SGE{h.mr.SGE(uint32(j*slotSize+offSrc), size)},
		RemoteAddr: p.peer.Addr + uint64(h.args.Host*slotSize+offWriteDst), RKey: p.peer.RKey}
	wc := make([]abi.CQE, streamDepth)
	outstanding, failed := 0, false
	deadline := time.Now().Add(time.Minute)
	for {
		for !failed && outstanding < streamDepth {
			wr.WrID++
			p.mu.Lock()
			err := p.qp.PostSend(wr)
			p.mu.Unlock()
			if err != nil {
				return ok, first, flushed, fmt.Errorf("post WRITE %d: %w", wr.WrID, err)
			}
			outstanding++
		}
		if outstanding == 0 {
			return ok, first, flushed, nil
		}
		n := p.scq.Poll(wc)
		for _, c := range wc[:n] {
			outstanding--
			switch {
			case !failed && c.Status == abi.WCSuccess:
				ok++
				p.streamMu.Lock()
				p.streamed = ok
				p.streamCond.Broadcast()
				p.streamMu.Unlock()
			case !failed:
				failed, first = true, c.Status
				p.streamMu.Lock()
				p.streamFailed = true
				p.streamCond.Broadcast()
				p.streamMu.Unlock()
			case c.Status == abi.WCWRFlushErr:
				flushed++
			default:
				return ok, first, flushed, fmt.Errorf("WRITE %d after the failure (%v): status %v", c.WrID, first, c.Status)
			}
		}
		if n == 0 {
			if time.Now().After(deadline) {
				return ok, first, flushed, fmt.Errorf("%d WRITEs outstanding for a minute", outstanding)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// waitStream waits until the stream on the QP to j has had n successful
// WRITEs (a minute at most); a stream that fails first is an error.
func (h *helper) waitStream(j, n int) error {
	p, err := h.peer(j)
	if err != nil {
		return err
	}
	timedOut := false
	stop := time.AfterFunc(time.Minute, func() {
		p.streamMu.Lock()
		timedOut = true
		p.streamCond.Broadcast()
		p.streamMu.Unlock()
	})
	defer stop.Stop()
	p.streamMu.Lock()
	defer p.streamMu.Unlock()
	for !timedOut && !p.streamFailed && p.streamed < n {
		p.streamCond.Wait()
	}
	switch {
	case p.streamed >= n:
		return nil
	case p.streamFailed:
		return fmt.Errorf("the stream failed after %d WRITEs, before %d", p.streamed, n)
	}
	return fmt.Errorf("the stream did not reach %d WRITEs in a minute", n)
}

// poll1 waits up to a minute for one completion on cq.
func poll1(cq *verbs.CQ) (abi.CQE, error) {
	wc := make([]abi.CQE, 1)
	deadline := time.Now().Add(time.Minute)
	for cq.Poll(wc) == 0 {
		if time.Now().After(deadline) {
			return abi.CQE{}, errors.New("no completion in a minute")
		}
		time.Sleep(50 * time.Microsecond)
	}
	return wc[0], nil
}

// pattern fills b with bytes derived from seed.
func pattern(b []byte, seed uint32) {
	x := seed*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

// patternOK checks that b's first size bytes are pattern seed and the
// rest is zero (nothing written past the message).
func patternOK(b []byte, size int, seed uint32) error {
	want := make([]byte, size)
	pattern(want, seed)
	for i := range b {
		w := byte(0)
		if i < size {
			w = want[i]
		}
		if b[i] != w {
			if i >= size {
				return fmt.Errorf("byte %d past the %d-byte message is %#x", i-size, size, b[i])
			}
			return fmt.Errorf("byte %d of %d is %#x, want %#x", i, size, b[i], w)
		}
	}
	return nil
}
