package tap

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// The client role: the test binary run again with clientEnv set to a
// JSON clientArgs. Client "a" is the requester, "b" the responder; they
// talk JSON lines to each other through the test's relay socket. Every
// operation is lock-step: a posts it and waits for its completion, then
// asks b to check what b can see (received data, immediate, memory).

const clientEnv = "VRNIC_TAP_TEST_CLIENT"

type clientArgs struct {
	Role   string `json:"role"`   // "a" or "b"
	Socket string `json:"socket"` // daemon control socket
	Relay  string `json:"relay"`  // relay unix socket
	QPs    int    `json:"qps"`    // QP pairs
	MTUs   []int  `json:"mtus"`   // path MTU of the op-matrix QPs 0..len-1
	Big    int    `json:"big"`    // largest message (1 MiB)
}

// Memory layout of each client's registered buffer.
const (
	offSrc    = 0                  // message source (a) / READ source (b)
	offDst    = 2 << 20            // RECV and WRITE target (b) / READ target (a)
	offSlots  = 4 << 20            // phase 2: one 64-byte RECV slot per QP (b)
	offAtom   = 5 << 20            // the atomic word (b) / atomic results (a)
	offWrites = 6 << 20            // phase 2: 8 KiB WRITE target per QP (b)
	bufSize   = offWrites + 64<<13 // 6.5 MiB
)

// peerInfo is what the clients exchange to connect their QPs.
type peerInfo struct {
	GIDs [2][16]byte `json:"gids"` // IPv4 (GID 0) and IPv6 (GID 1)
	QPNs []uint32    `json:"qpns"`
	Addr uint64      `json:"addr"`
	RKey uint32      `json:"rkey"`
}

// msg is one line between the clients.
type msg struct {
	Op    string `json:"op"`
	QP    int    `json:"qp"`
	Size  int    `json:"size"`
	Seed  uint32 `json:"seed"`
	Imm   bool   `json:"imm"`
	Value uint64 `json:"value"`
	Err   string `json:"err,omitempty"`
}

// QPReport is one QP's counters, printed by each client at the end.
type QPReport struct {
	QPN     uint32 `json:"qpn"`
	Rx      uint64 `json:"rx"`
	Tx      uint64 `json:"tx"`
	Retrans uint64 `json:"retrans"`
}

// clientReport is the client's last stdout line.
type clientReport struct {
	Ops int        `json:"ops"`
	QPs []QPReport `json:"qps"`
}

func pattern(b []byte, seed uint32) {
	x := seed*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

func patternOK(b []byte, seed uint32) error {
	want := make([]byte, len(b))
	pattern(want, seed)
	if i := firstDiff(b, want); i >= 0 {
		return fmt.Errorf("byte %d of %d is %#x, want %#x", i, len(b), b[i], want[i])
	}
	return nil
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

type client struct {
	args  clientArgs
	ctx   *verbs.Context
	pd    *verbs.PD
	scq   *verbs.CQ
	rcq   *verbs.CQ
	qps   []*verbs.QP
	buf   *verbs.Buffer
	mr    *verbs.MR
	peer  peerInfo
	enc   *json.Encoder
	dec   *json.Decoder
	ops   int
	index map[uint32]int // QPN → index
}

func clientMain() int {
	var a clientArgs
	if err := json.Unmarshal([]byte(os.Getenv(clientEnv)), &a); err != nil {
		fmt.Fprintln(os.Stderr, "client: bad arguments:", err)
		return 2
	}
	c := &client{args: a}
	if err := c.run(); err != nil {
		fmt.Fprintf(os.Stderr, "client %s: %v\n", a.Role, err)
		return 1
	}
	return 0
}

func (c *client) run() error {
	var err error
	if c.ctx, err = verbs.Open(c.args.Socket, verbs.WithClientName("tap-test-"+c.args.Role)); err != nil {
		return err
	}
	defer c.ctx.Close()
	var gids [2][16]byte
	for i := range gids {
		g, err := c.ctx.QueryGID(1, uint32(i))
		if err != nil {
			return err
		}
		gids[i] = g.GID
	}
	if c.pd, err = c.ctx.AllocPD(); err != nil {
		return err
	}
	if c.scq, err = c.ctx.CreateCQ(1024, nil); err != nil {
		return err
	}
	if c.rcq, err = c.ctx.CreateCQ(1024, nil); err != nil {
		return err
	}
	if c.buf, err = c.ctx.Alloc(bufSize, 4096); err != nil {
		return err
	}
	if c.mr, err = c.pd.RegMR(c.buf, abi.AccessAll); err != nil {
		return err
	}
	c.index = map[uint32]int{}
	me := peerInfo{GIDs: gids, Addr: c.buf.Addr(), RKey: c.mr.RKey}
	for i := range c.args.QPs {
		qp, err := c.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: c.scq, RecvCQ: c.rcq,
			Cap: abi.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return fmt.Errorf("create QP %d: %w", i, err)
		}
		c.qps = append(c.qps, qp)
		c.index[qp.QPN] = i
		me.QPNs = append(me.QPNs, qp.QPN)
	}

	conn, err := net.Dial("unix", c.args.Relay)
	if err != nil {
		return err
	}
	defer conn.Close()
	c.enc, c.dec = json.NewEncoder(conn), json.NewDecoder(bufio.NewReader(conn))
	if err := c.enc.Encode(me); err != nil {
		return err
	}
	if err := c.dec.Decode(&c.peer); err != nil {
		return fmt.Errorf("peer info: %w", err)
	}
	if len(c.peer.QPNs) != len(c.qps) {
		return fmt.Errorf("peer has %d QPs, want %d", len(c.peer.QPNs), len(c.qps))
	}
	for i, qp := range c.qps {
		mtu := 1024
		if i < len(c.args.MTUs) {
			mtu = c.args.MTUs[i]
		}
		if err := qp.ToInit(abi.AccessAll, 0); err != nil {
			return err
		}
		// The op-matrix QPs use IPv4; of the others, every second one
		// IPv6 (GID 1).
		gid := 0
		if i >= len(c.args.MTUs) && i%2 == 1 {
			gid = 1
		}
		if err := qp.ToRTR(verbs.RTRAttr{AV: abi.AHAttr{DGID: c.peer.GIDs[gid], SGIDIndex: uint8(gid), HopLimit: 64, PortNum: 1}, PathMTU: mtuCode(mtu),
			DestQPN: c.peer.QPNs[i], RQPSN: c.peer.QPNs[i] & 0xfff, MaxDestRdAtomic: 4, MinRNRTimer: 1}); err != nil {
			return fmt.Errorf("QP %d to RTR: %w", i, err)
		}
		if err := qp.ToRTS(verbs.RTSAttr{SQPSN: qp.QPN & 0xfff, Timeout: 18, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}); err != nil {
			return err
		}
	}
	if c.args.Role == "a" {
		err = c.requester()
	} else {
		err = c.responder()
	}
	if err != nil {
		return err
	}
	rep := clientReport{Ops: c.ops}
	for _, qp := range c.qps {
		r, err := qp.Query()
		if err != nil {
			return err
		}
		if r.Attr.QPState != abi.QPSRTS {
			return fmt.Errorf("QP %d in state %v at the end", qp.QPN, r.Attr.QPState)
		}
		rep.QPs = append(rep.QPs, QPReport{QPN: qp.QPN, Rx: r.PacketsReceived, Tx: r.PacketsSent, Retrans: r.Retransmits})
	}
	return json.NewEncoder(os.Stdout).Encode(rep)
}

func mtuCode(n int) abi.MTU {
	for c := abi.MTU(1); c <= 5; c++ {
		if 128<<c == n {
			return c
		}
	}
	return abi.MTU1024
}

// poll waits for n completions on cq (20 s at most) and checks them.
func poll(cq *verbs.CQ, n int) ([]abi.CQE, error) {
	out := make([]abi.CQE, 0, n)
	wc := make([]abi.CQE, 16)
	deadline := time.Now().Add(20 * time.Second)
	for len(out) < n {
		k := cq.Poll(wc[:min(len(wc), n-len(out))])
		for i := range k {
			if wc[i].Status != abi.WCSuccess {
				return out, fmt.Errorf("completion %+v: status %v", wc[i], wc[i].Status)
			}
			out = append(out, wc[i])
		}
		if k == 0 {
			if time.Now().After(deadline) {
				return out, fmt.Errorf("%d of %d completions before the deadline", len(out), n)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	return out, nil
}

func (c *client) mem(off, n int) []byte { return c.buf.Bytes[off : off+n] }

// call sends m to b and waits for its answer.
func (c *client) call(m msg) (msg, error) {
	if err := c.enc.Encode(m); err != nil {
		return msg{}, err
	}
	var r msg
	if err := c.dec.Decode(&r); err != nil {
		return msg{}, err
	}
	if r.Err != "" {
		return r, fmt.Errorf("responder: %s: %s", m.Op, r.Err)
	}
	return r, nil
}

// post posts one signalled WR on QP i and waits for its completion.
func (c *client) post(i int, wr *verbs.SendWR) (abi.CQE, error) {
	wr.Flags |= abi.SendSignaled
	if err := c.qps[i].PostSend(wr); err != nil {
		return abi.CQE{}, err
	}
	wcs, err := poll(c.scq, 1)
	if err != nil {
		return abi.CQE{}, fmt.Errorf("QP %d op %v: %w", i, wr.Opcode, err)
	}
	c.ops++
	return wcs[0], nil
}

// requester runs the operations (client a).
func (c *client) requester() error {
	seed := uint32(1)
	for i, mtu := range c.args.MTUs {
		for _, size := range []int{0, 1, mtu - 1, mtu, mtu + 1, c.args.Big} {
			for _, op := range []abi.WROpcode{abi.WRSend, abi.WRSendWithImm, abi.WRRDMAWrite, abi.WRRDMAWriteWithImm, abi.WRRDMARead} {
				seed++
				if err := c.sized(i, op, size, seed); err != nil {
					return fmt.Errorf("QP %d (MTU %d) %v of %d bytes: %w", i, mtu, op, size, err)
				}
			}
		}
		if err := c.atomics(i, seed); err != nil {
			return fmt.Errorf("QP %d (MTU %d) atomics: %w", i, mtu, err)
		}
	}
	if err := c.everyQP(); err != nil {
		return err
	}
	_, err := c.call(msg{Op: "done"})
	return err
}

func (c *client) sized(i int, op abi.WROpcode, size int, seed uint32) error {
	remote := c.peer.Addr
	wr := &verbs.SendWR{WrID: uint64(seed), Opcode: op, RKey: c.peer.RKey}
	switch op {
	case abi.WRSend, abi.WRSendWithImm, abi.WRRDMAWrite, abi.WRRDMAWriteWithImm:
		pattern(c.mem(offSrc, size), seed)
		wr.SGL = []abi.SGE{c.mr.SGE(offSrc, uint32(size))}
		wr.RemoteAddr = remote + offDst
		wr.ImmData = seed ^ 0xa5a5a5a5
	case abi.WRRDMARead:
		if _, err := c.call(msg{Op: "fill", Size: size, Seed: seed}); err != nil {
			return err
		}
		clear(c.mem(offDst, size+8))
		wr.SGL = []abi.SGE{c.mr.SGE(offDst, uint32(size))}
		wr.RemoteAddr = remote + offSrc
	}
	if size == 0 {
		wr.SGL = nil
	}
	if op == abi.WRSend || op == abi.WRSendWithImm || op == abi.WRRDMAWriteWithImm {
		if _, err := c.call(msg{Op: "postrecv", QP: i}); err != nil {
			return err
		}
	}
	wc, err := c.post(i, wr)
	if err != nil {
		return err
	}
	if wc.WrID != uint64(seed) {
		return fmt.Errorf("completion of WR %d, want %d", wc.WrID, seed)
	}
	imm := op == abi.WRSendWithImm || op == abi.WRRDMAWriteWithImm
	switch op {
	case abi.WRSend, abi.WRSendWithImm:
		_, err = c.call(msg{Op: "recv", QP: i, Size: size, Seed: seed, Imm: imm})
	case abi.WRRDMAWrite:
		_, err = c.call(msg{Op: "mem", QP: i, Size: size, Seed: seed})
	case abi.WRRDMAWriteWithImm:
		_, err = c.call(msg{Op: "writeimm", QP: i, Size: size, Seed: seed})
	case abi.WRRDMARead:
		if wc.ByteLen != uint32(size) {
			return fmt.Errorf("READ completion byte_len %d", wc.ByteLen)
		}
		if err = patternOK(c.mem(offDst, size), seed); err == nil && !bytes.Equal(c.mem(offDst+size, 8), make([]byte, 8)) {
			err = errors.New("READ wrote past the message")
		}
	}
	return err
}

// atomics runs compare-and-swap (hit and miss) and fetch-and-add on b's
// word and checks the original values returned and the word's value.
func (c *client) atomics(i int, seed uint32) error {
	v0 := uint64(seed)<<32 | 0x1234
	if _, err := c.call(msg{Op: "setatom", Value: v0}); err != nil {
		return err
	}
	steps := []struct {
		op            abi.WROpcode
		compare, swap uint64
		wantOrig      uint64
		wantWord      uint64
	}{
		{abi.WRAtomicCmpAndSwp, v0, 0xfeed, v0, 0xfeed},               // hit
		{abi.WRAtomicCmpAndSwp, v0, 0xbad, 0xfeed, 0xfeed},            // miss
		{abi.WRAtomicFetchAdd, 5, 0, 0xfeed, 0xfeed + 5},              // add
		{abi.WRAtomicFetchAdd, ^uint64(0), 0, 0xfeed + 5, 0xfeed + 4}, // add -1 (wraps)
	}
	for k, s := range steps {
		res := c.mem(offAtom+8*k, 8)
		clear(res)
		wc, err := c.post(i, &verbs.SendWR{WrID: uint64(k), Opcode: s.op, SGL: []abi.SGE{c.mr.SGE(uint32(offAtom+8*k), 8)},
			RemoteAddr: c.peer.Addr + offAtom, RKey: c.peer.RKey, CompareAdd: s.compare, Swap: s.swap})
		if err != nil {
			return err
		}
		if wc.Opcode != map[abi.WROpcode]abi.WCOpcode{abi.WRAtomicCmpAndSwp: abi.WCCompSwap, abi.WRAtomicFetchAdd: abi.WCFetchAdd}[s.op] {
			return fmt.Errorf("atomic %d: completion opcode %v", k, wc.Opcode)
		}
		if got := le64(res); got != s.wantOrig {
			return fmt.Errorf("atomic %d (%v): original %#x, want %#x", k, s.op, got, s.wantOrig)
		}
		if _, err := c.call(msg{Op: "atom", Value: s.wantWord}); err != nil {
			return err
		}
	}
	return nil
}

// everyQP sends one SEND and one WRITE on every QP (phase 2: traffic on
// all workers' queues).
func (c *client) everyQP() error {
	if _, err := c.call(msg{Op: "post64"}); err != nil {
		return err
	}
	n := 0
	for i := range c.qps {
		seed := uint32(5000 + i)
		size := 1 + (i*997)%8192
		pattern(c.mem(offSrc+i*8192, size), seed)
		pattern(c.mem(offSlots+i*64, 64), seed+1)
		for _, wr := range []*verbs.SendWR{
			{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: []abi.SGE{c.mr.SGE(uint32(offSrc+i*8192), uint32(size))},
				RemoteAddr: c.peer.Addr + offWrites + uint64(i)*8192, RKey: c.peer.RKey},
			{WrID: uint64(i), Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{c.mr.SGE(uint32(offSlots+i*64), 64)}},
		} {
			if err := c.qps[i].PostSend(wr); err != nil {
				return err
			}
			n++
		}
	}
	if _, err := poll(c.scq, n); err != nil {
		return fmt.Errorf("phase 2: %w", err)
	}
	c.ops += n
	_, err := c.call(msg{Op: "check64"})
	return err
}

func le64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

func putLE64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

// responder serves a's requests (client b).
func (c *client) responder() error {
	for {
		var m msg
		if err := c.dec.Decode(&m); err != nil {
			return fmt.Errorf("requester gone: %w", err)
		}
		if m.Op == "done" {
			return c.enc.Encode(msg{Op: "ok"})
		}
		r := msg{Op: "ok"}
		if err := c.serve(m); err != nil {
			r.Err = err.Error()
		}
		if err := c.enc.Encode(r); err != nil {
			return err
		}
		if r.Err != "" {
			return fmt.Errorf("%s: %s", m.Op, r.Err)
		}
	}
}

func (c *client) postRecv(i, off, n int) error {
	// The work request ID says where the data goes.
	return c.qps[i].PostRecv(&verbs.RecvWR{WrID: uint64(off)<<16 | uint64(i), SGL: []abi.SGE{c.mr.SGE(uint32(off), uint32(n))}})
}

func (c *client) serve(m msg) error {
	switch m.Op {
	case "fill":
		pattern(c.mem(offSrc, m.Size), m.Seed)
	case "recv", "writeimm":
		wcs, err := poll(c.rcq, 1)
		if err != nil {
			return err
		}
		wc := wcs[0]
		wantOp, imm := abi.WCRecv, m.Imm
		if m.Op == "writeimm" {
			wantOp, imm = abi.WCRecvRDMAWithImm, true
		}
		switch {
		case wc.QPNum != c.qps[m.QP].QPN:
			return fmt.Errorf("receive completion on QP %d, want %d", wc.QPNum, c.qps[m.QP].QPN)
		case wc.Opcode != wantOp:
			return fmt.Errorf("receive completion opcode %v, want %v", wc.Opcode, wantOp)
		case wc.ByteLen != uint32(m.Size):
			return fmt.Errorf("receive byte_len %d, want %d", wc.ByteLen, m.Size)
		case imm != (wc.WCFlags&abi.WCWithImm != 0):
			return fmt.Errorf("receive flags %v (immediate expected: %v)", wc.WCFlags, imm)
		case imm && wc.ImmOrInv != m.Seed^0xa5a5a5a5:
			return fmt.Errorf("immediate %#x, want %#x", wc.ImmOrInv, m.Seed^0xa5a5a5a5)
		}
		if wc.WrID != uint64(offDst)<<16|uint64(m.QP) {
			return fmt.Errorf("receive completion of WR %#x", wc.WrID)
		}
		return patternOK(c.mem(offDst, m.Size), m.Seed)
	case "postrecv":
		return c.postRecv(m.QP, offDst, c.args.Big+4096)
	case "mem":
		return patternOK(c.mem(offDst, m.Size), m.Seed)
	case "setatom":
		putLE64(c.mem(offAtom, 8), m.Value)
	case "atom":
		if got := le64(c.mem(offAtom, 8)); got != m.Value {
			return fmt.Errorf("atomic word %#x, want %#x", got, m.Value)
		}
	case "post64":
		for i := range c.qps {
			if err := c.postRecv(i, offSlots+i*64, 64); err != nil {
				return err
			}
		}
	case "check64":
		wcs, err := poll(c.rcq, len(c.qps))
		if err != nil {
			return err
		}
		seen := map[int]bool{}
		for _, wc := range wcs {
			i, ok := c.index[wc.QPNum]
			if !ok || seen[i] || wc.ByteLen != 64 || wc.Opcode != abi.WCRecv {
				return fmt.Errorf("phase 2: unexpected completion %+v", wc)
			}
			seen[i] = true
			if err := patternOK(c.mem(int(wc.WrID>>16), 64), uint32(5000+i)+1); err != nil {
				return fmt.Errorf("phase 2 QP %d SEND: %w", i, err)
			}
			if err := patternOK(c.mem(offWrites+i*8192, 1+(i*997)%8192), uint32(5000+i)); err != nil {
				return fmt.Errorf("phase 2 QP %d WRITE: %w", i, err)
			}
		}
	default:
		return fmt.Errorf("unknown request %q", m.Op)
	}
	return nil
}
