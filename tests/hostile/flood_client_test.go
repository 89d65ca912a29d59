package hostile

// The hostile client of the flood probe (flood_test.go) and of the
// fairness probe: a process of another uid that sends every kind of bad
// control datagram it can think of, as fast as the daemon takes them, on
// a few connections, while it opens and closes connections and throws
// random datagrams at the daemon's UDP link. Everything it sends follows
// from one seed.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"reflect"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

// floodEnv carries the flood's floodConfig (JSON) to the helper.
const floodEnv = "VRNIC_FLOOD"

// floodConfig is what the flood client does.
type floodConfig struct {
	Seed uint64
	// Senders connections each send Msgs bad datagrams, pipelined (the
	// replies are read as they come); the odd ones open a context (and
	// allocate a PD) first, the even ones never do.
	Senders, Msgs int
	// Deaf datagrams go on a connection that never reads its replies.
	Deaf int
	// Churn connections are opened and closed, Parallel at a time, each
	// doing a little (nothing, a command left unread, a partial datagram,
	// a context opened and dropped) before it closes.
	Churn, Parallel int
	// UDP is the daemon's UDP link address; UDPMsgs random datagrams go
	// to it.
	UDP     string
	UDPMsgs int
	// VictimQPNs are QPs of another client: commands naming them must
	// all fail.
	VictimQPNs []uint32
}

// floodReport is what the flood client saw, printed as one JSON OPS line.
type floodReport struct {
	floodCounts
	// Churn: connections opened, refused (EAGAIN reply) and not opened
	// (connect failed).
	ChurnOpened, ChurnRefused, ChurnFailed int
	DeafSent                               int
	UDPSent                                int
	Errors                                 []string
	Millis                                 int64
}

// floodCounts is what the senders sent and got.
type floodCounts struct {
	// Datagrams sent; those the daemon must count as bad messages (no
	// header, truncated, too many fds); those with a header (commands,
	// good or bad); fds attached to commands that take none (the daemon
	// closes each); operator commands.
	Sent, Bad, Cmds, FdsOnNoFd, Operator int
	// Replies received, error replies among them, and error replies to
	// the datagrams with a header.
	Replies, ErrReplies, CmdErrReplies int
	// Commands naming the victim's QPs, and how many succeeded.
	Foreign, ForeignOK int
}

// add adds every count of o to c.
func (c *floodCounts) add(o floodCounts) {
	dst, src := reflect.ValueOf(c).Elem(), reflect.ValueOf(o)
	for i := range dst.NumField() {
		f := dst.Field(i)
		f.SetInt(f.Int() + src.Field(i).Int())
	}
}

// floodMsg is one datagram and what the daemon must do with it.
type floodMsg struct {
	data  []byte
	fds   []int
	class floodClass
	// closed: fds the daemon must close and count (attached to a
	// command that takes none); operator: an operator command.
	closed   int
	operator bool
}

type floodClass uint8

const (
	floodBad     floodClass = iota // no usable datagram: a bad message
	floodCmd                       // a command: any reply
	floodForeign                   // a command on the victim's QP: an error reply
)

// floodSizes are the payload sizes of the client commands (REG_MR's
// fixed part).
var floodSizes = func() map[abi.Cmd]int {
	h := abi.Sizeof(&abi.CmdHandleReq{})
	return map[abi.Cmd]int{
		abi.CmdOpenContext: abi.Sizeof(&abi.CmdOpenContextReq{}), abi.CmdQueryDevice: 0,
		abi.CmdQueryPort: abi.Sizeof(&abi.CmdQueryPortReq{}), abi.CmdQueryGID: abi.Sizeof(&abi.CmdQueryGIDReq{}),
		abi.CmdAddHostMem: abi.Sizeof(&abi.CmdAddHostMemReq{}), abi.CmdRemoveHostMem: h,
		abi.CmdAllocPD: 0, abi.CmdDeallocPD: h, abi.CmdRegMR: abi.Sizeof(&abi.CmdRegMRReq{}), abi.CmdDeregMR: h,
		abi.CmdCreateCQ: abi.Sizeof(&abi.CmdCreateCQReq{}), abi.CmdDestroyCQ: h,
		abi.CmdCreateQP: abi.Sizeof(&abi.CmdCreateQPReq{}), abi.CmdModifyQP: abi.Sizeof(&abi.CmdModifyQPReq{}),
		abi.CmdQueryQP: h, abi.CmdDestroyQP: h, abi.CmdCreateSRQ: abi.Sizeof(&abi.CmdCreateSRQReq{}),
		abi.CmdModifySRQ: abi.Sizeof(&abi.CmdModifySRQReq{}), abi.CmdDestroySRQ: h,
		abi.CmdCreateAH: abi.Sizeof(&abi.CmdCreateAHReq{}), abi.CmdDestroyAH: h, abi.CmdQuerySRQ: h,
	}
}()

// floodGen makes the bad datagrams of one connection.
type floodGen struct {
	r      *rand.Rand
	cfg    *floodConfig
	fdPool []int // descriptors of every kind, attached at random
	seq    uint32
}

// floodFdPool opens descriptors of many kinds: none is what a command
// wants (an unsealed or empty memfd, not a sealed one of the right size).
func floodFdPool() ([]int, error) {
	var fds []int
	add := func(fd int, err error) error {
		if err == nil {
			fds = append(fds, fd)
		}
		return err
	}
	if err := add(unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)); err != nil {
		return nil, err
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, err
	}
	fds = append(fds, p[0], p[1])
	if err := add(unix.Eventfd(0, unix.EFD_CLOEXEC)); err != nil {
		return nil, err
	}
	mfd, err := unix.MemfdCreate("flood", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, err
	}
	fds = append(fds, mfd) // empty
	mfd, err = unix.MemfdCreate("flood", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	unix.Ftruncate(mfd, 1<<20) // unsealed
	fds = append(fds, mfd)
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	fds = append(fds, sp[0], sp[1])
	if err := add(unix.Open("/proc/self", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)); err != nil {
		return nil, err
	}
	if err := add(unix.Open("/", unix.O_PATH|unix.O_CLOEXEC, 0)); err != nil {
		return nil, err
	}
	return fds, nil
}

func (g *floodGen) fds(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = g.fdPool[g.r.IntN(len(g.fdPool))]
	}
	return out
}

func (g *floodGen) bytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.r.Uint32())
	}
	return b
}

// msg is a datagram with a header: opcode op, payload p; length is the
// header's length field (-1: the true one).
func (g *floodGen) msg(op abi.Cmd, p []byte, length int, flags uint16, status uint32) []byte {
	b := make([]byte, abi.SizeofMsgHdr+len(p))
	if length < 0 {
		length = len(b)
	}
	g.seq++
	h := abi.MsgHdr{Opcode: op, Flags: flags, Length: uint32(length), Seq: g.seq, Status: status}
	h.Put(b)
	copy(b[abi.SizeofMsgHdr:], p)
	return b
}

// clientOp returns a random client opcode and its payload size.
func (g *floodGen) clientOp() (abi.Cmd, int) {
	op := abi.Cmd(1 + g.r.IntN(int(abi.CmdQuerySRQ)))
	return op, floodSizes[op]
}

// next makes one bad datagram.
func (g *floodGen) next() floodMsg {
	r := g.r
	switch k := r.IntN(13); k {
	case 0: // shorter than a header
		return floodMsg{data: g.bytes(r.IntN(abi.SizeofMsgHdr)), class: floodBad}
	case 1: // a length that lies
		op, n := g.clientOp()
		p := g.bytes(n)
		l := abi.SizeofMsgHdr + n + 1 + r.IntN(1<<16)
		if r.IntN(2) == 0 {
			l = r.IntN(abi.SizeofMsgHdr + n)
		}
		return floodMsg{data: g.msg(op, p, l, 0, 0), class: floodCmd}
	case 2: // an unknown opcode (not a client, operator or fault command)
		op := abi.Cmd(0x300 + r.IntN(0xfd00))
		if r.IntN(4) == 0 {
			op = abi.CmdQuerySRQ + 1 + abi.Cmd(r.IntN(int(abi.CmdAdminBase-abi.CmdQuerySRQ-1)))
		}
		if r.IntN(8) == 0 {
			op = 0
		}
		return floodMsg{data: g.msg(op, g.bytes(r.IntN(256)), -1, 0, 0), class: floodCmd}
	case 3, 4: // a client command with garbage of the right size, too short, too long
		op, n := g.clientOp()
		switch r.IntN(3) {
		case 1:
			n = r.IntN(n + 1)
		case 2:
			n += 1 + r.IntN(4096)
		}
		return floodMsg{data: g.msg(op, g.bytes(n), -1, 0, 0), class: floodCmd}
	case 5: // REG_MR with an inline page list that is not what npages says
		n := floodSizes[abi.CmdRegMR]
		req := abi.CmdRegMRReq{IOVA: r.Uint64(), Length: uint64(r.IntN(1 << 30)), PDHandle: uint32(r.IntN(4)),
			Access: r.Uint32(), PageShift: uint32(r.IntN(40)), NPages: uint32(r.IntN(1 << 21))}
		p := make([]byte, n+8*r.IntN(512))
		abi.Marshal(p, &req)
		copy(p[n:], g.bytes(len(p)-n))
		return floodMsg{data: g.msg(abi.CmdRegMR, p, -1, 0, 0), class: floodCmd}
	case 6: // flags or status set in a command
		op, n := g.clientOp()
		return floodMsg{data: g.msg(op, g.bytes(n), -1, uint16(1+r.IntN(0xffff)), r.Uint32()), class: floodCmd}
	case 7: // descriptors on a command that takes none
		op, n := g.clientOp()
		for op == abi.CmdAddHostMem || op == abi.CmdCreateCQ {
			op, n = g.clientOp()
		}
		fds := g.fds(1 + r.IntN(16))
		return floodMsg{data: g.msg(op, g.bytes(n), -1, 0, 0), fds: fds, class: floodCmd, closed: len(fds)}
	case 8: // more descriptors than the daemon takes (MSG_CTRUNC)
		op, n := g.clientOp()
		return floodMsg{data: g.msg(op, g.bytes(n), -1, 0, 0), fds: g.fds(17 + r.IntN(48)), class: floodBad}
	case 9: // a descriptor of the wrong kind where one is taken
		if r.IntN(2) == 0 {
			req := abi.CmdAddHostMemReq{Length: uint64(r.IntN(4)) << 20}
			p := make([]byte, floodSizes[abi.CmdAddHostMem])
			abi.Marshal(p, &req)
			return floodMsg{data: g.msg(abi.CmdAddHostMem, p, -1, 0, 0), fds: g.fds(1), class: floodCmd}
		}
		return floodMsg{data: g.msg(abi.CmdCreateCQ, g.bytes(floodSizes[abi.CmdCreateCQ]), -1, 0, 0), fds: g.fds(1), class: floodCmd}
	case 10: // larger than the largest message (MSG_TRUNC)
		op, _ := g.clientOp()
		return floodMsg{data: g.msg(op, g.bytes(abi.MaxMsgSize+r.IntN(4096)), -1, 0, 0), class: floodBad}
	case 11: // the victim's QPs
		if len(g.cfg.VictimQPNs) > 0 {
			qpn := g.cfg.VictimQPNs[r.IntN(len(g.cfg.VictimQPNs))]
			var p []byte
			op := []abi.Cmd{abi.CmdQueryQP, abi.CmdDestroyQP, abi.CmdModifyQP}[r.IntN(3)]
			if op == abi.CmdModifyQP {
				req := abi.CmdModifyQPReq{QPN: qpn, AttrMask: 1, Attr: abi.QPAttr{QPState: abi.QPSErr}}
				p = make([]byte, floodSizes[op])
				abi.Marshal(p, &req)
			} else {
				p = make([]byte, floodSizes[op])
				binary.LittleEndian.PutUint32(p, qpn)
			}
			return floodMsg{data: g.msg(op, p, -1, 0, 0), class: floodForeign}
		}
		fallthrough
	default: // an operator command, with garbage
		op := abi.CmdAdminBase + abi.Cmd(r.IntN(10))
		return floodMsg{data: g.msg(op, g.bytes(r.IntN(64)), -1, 0, 0), class: floodCmd, operator: true}
	}
}

// floodHelper runs the flood described by $VRNIC_FLOOD against sock and
// prints its floodReport.
func floodHelper(say func(string, ...any), sock string) {
	var cfg floodConfig
	if err := json.Unmarshal([]byte(os.Getenv(floodEnv)), &cfg); err != nil {
		say("error %s: %v", floodEnv, err)
		return
	}
	pool, err := floodFdPool()
	if err != nil {
		say("error fd pool: %v", err)
		return
	}
	var (
		mu  sync.Mutex
		rep floodReport
		wg  sync.WaitGroup
	)
	fail := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(rep.Errors) < 20 {
			rep.Errors = append(rep.Errors, fmt.Sprintf(format, a...))
		}
	}
	start := time.Now()
	// The churn starts once the senders are connected: it must not take
	// their place under the uid's connection limit.
	var ready sync.WaitGroup
	ready.Add(cfg.Senders)
	for i := range cfg.Senders {
		wg.Go(func() {
			g := &floodGen{r: rand.New(rand.NewPCG(cfg.Seed, uint64(i))), cfg: &cfg, fdPool: pool}
			s, err := floodSend(g, sock, i%2 == 1, cfg.Msgs, ready.Done)
			if err != nil {
				fail("sender %d: %v", i, err)
			}
			mu.Lock()
			rep.add(s)
			mu.Unlock()
		})
	}
	if cfg.Deaf > 0 {
		wg.Go(func() {
			g := &floodGen{r: rand.New(rand.NewPCG(cfg.Seed, 1000)), cfg: &cfg, fdPool: pool}
			n := floodDeaf(g, sock, cfg.Deaf)
			mu.Lock()
			rep.DeafSent = n
			mu.Unlock()
		})
	}
	for w := range cfg.Parallel {
		wg.Go(func() {
			ready.Wait()
			r := rand.New(rand.NewPCG(cfg.Seed, 2000+uint64(w)))
			for i := w; i < cfg.Churn; i += cfg.Parallel {
				opened, refused := floodChurnOne(r, sock)
				mu.Lock()
				switch {
				case !opened:
					rep.ChurnFailed++
				case refused:
					rep.ChurnOpened++
					rep.ChurnRefused++
				default:
					rep.ChurnOpened++
				}
				mu.Unlock()
			}
		})
	}
	if cfg.UDP != "" && cfg.UDPMsgs > 0 {
		wg.Go(func() {
			n, err := floodUDP(rand.New(rand.NewPCG(cfg.Seed, 3000)), cfg.UDP, cfg.UDPMsgs, cfg.VictimQPNs)
			if err != nil {
				fail("udp: %v", err)
			}
			mu.Lock()
			rep.UDPSent = n
			mu.Unlock()
		})
	}
	wg.Wait()
	rep.Millis = time.Since(start).Milliseconds()
	b, _ := json.Marshal(&rep)
	say("report %s", b)
}

// floodDial connects to the control socket.
func floodDial(sock string) (*net.UnixConn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.Dial("unixpacket", sock)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// floodRecv reads one reply, closing any descriptor that comes with it;
// it returns the reply's status.
func floodRecv(c *net.UnixConn, buf, oob []byte) (uint32, error) {
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, err
	}
	closeRights(oob[:oobn])
	var h abi.MsgHdr
	if err := h.Decode(buf[:n]); err != nil {
		return 0, fmt.Errorf("reply of %d bytes: %w", n, err)
	}
	return h.Status, nil
}

// floodOpen opens a context on c and allocates a PD in it.
func floodOpen(c *net.UnixConn, buf, oob []byte) error {
	req := abi.CmdOpenContextReq{ABIVersion: abi.Version}
	copy(req.ClientName[:], "flood")
	p := make([]byte, abi.Sizeof(&req))
	abi.Marshal(p, &req)
	g := floodGen{}
	for _, m := range [][]byte{g.msg(abi.CmdOpenContext, p, -1, 0, 0), g.msg(abi.CmdAllocPD, nil, -1, 0, 0)} {
		if _, err := c.Write(m); err != nil {
			return err
		}
		st, err := floodRecv(c, buf, oob)
		if err != nil {
			return err
		}
		if st != 0 {
			return fmt.Errorf("%w", unix.Errno(st))
		}
	}
	return nil
}

// floodSend sends n bad datagrams on one connection (opening a context
// first when ctx), reading the replies as they come, and counts them. It
// calls ready once connected (or failed to).
func floodSend(g *floodGen, sock string, ctx bool, n int, ready func()) (floodCounts, error) {
	var s floodCounts
	c, err := floodDial(sock)
	if err != nil {
		ready()
		return s, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	buf, oob := make([]byte, abi.MaxMsgSize+1), make([]byte, unix.CmsgSpace(16*4))
	if ctx {
		if err := floodOpen(c, buf, oob); err != nil {
			ready()
			return s, fmt.Errorf("open context: %w", err)
		}
	}
	ready()
	classes := make(chan floodClass, n)
	readErr := make(chan error, 1)
	go func() {
		for cl := range classes {
			st, err := floodRecv(c, buf, oob)
			if err != nil {
				readErr <- fmt.Errorf("reply %d: %w", s.Replies+1, err)
				return
			}
			s.Replies++
			if st != 0 {
				s.ErrReplies++
				if cl != floodBad {
					s.CmdErrReplies++
				}
			} else if cl == floodBad {
				readErr <- fmt.Errorf("reply %d: a malformed datagram succeeded", s.Replies)
				return
			}
			if cl == floodForeign && st == 0 {
				s.ForeignOK++
			}
		}
		readErr <- nil
	}()
	var werr error
	for range n {
		m := g.next()
		var rights []byte
		if len(m.fds) > 0 {
			rights = unix.UnixRights(m.fds...)
		}
		if _, _, err := c.WriteMsgUnix(m.data, rights, nil); err != nil {
			werr = fmt.Errorf("datagram %d (%d bytes, %d fds): %w", s.Sent+1, len(m.data), len(m.fds), err)
			break
		}
		s.Sent++
		switch m.class {
		case floodBad:
			s.Bad++
		case floodForeign:
			s.Foreign++
			s.Cmds++
		default:
			s.Cmds++
			s.FdsOnNoFd += m.closed
			if m.operator {
				s.Operator++
			}
		}
		classes <- m.class
	}
	close(classes)
	rerr := <-readErr
	return s, errors.Join(werr, rerr)
}

// floodDeaf sends n bad datagrams on a connection that never reads a
// reply, until a write blocks for a second; it returns how many went.
func floodDeaf(g *floodGen, sock string, n int) int {
	c, err := floodDial(sock)
	if err != nil {
		return 0
	}
	defer c.Close()
	sent := 0
	for range n {
		m := g.next()
		var rights []byte
		if len(m.fds) > 0 {
			rights = unix.UnixRights(m.fds...)
		}
		c.SetWriteDeadline(time.Now().Add(time.Second))
		if _, _, err := c.WriteMsgUnix(m.data, rights, nil); err != nil {
			break
		}
		sent++
	}
	return sent
}

// floodChurnOne opens one connection, does a little on it and closes it.
// opened: the connection was made; refused: the daemon answered its
// first command with EAGAIN (the uid's connection limit).
func floodChurnOne(r *rand.Rand, sock string) (opened, refused bool) {
	c, err := floodDial(sock)
	if err != nil {
		return false, false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	g := floodGen{r: r}
	switch r.IntN(5) {
	case 0: // nothing
	case 1: // a command whose reply is never read
		c.Write(g.msg(abi.CmdQueryDevice, nil, -1, 0, 0))
	case 2: // a header cut short
		c.Write(g.bytes(1 + r.IntN(abi.SizeofMsgHdr-1)))
	case 3: // shut down the writing side, then go
		c.CloseWrite()
	case 4: // a context opened and dropped
		buf, oob := make([]byte, abi.SizeofMsgHdr+abi.MaxErrMsg+256), make([]byte, unix.CmsgSpace(16*4))
		if err := floodOpen(c, buf, oob); errors.Is(err, unix.EAGAIN) {
			return true, true
		}
	}
	return true, false
}

// floodUDP sends n random datagrams to addr: random bytes, and packets
// that look like RoCE v2 (a BTH with a random or the victim's QPN, a
// payload, a random ICRC).
func floodUDP(r *rand.Rand, addr string, n int, victim []uint32) (int, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	sent := 0
	for range n {
		var b []byte
		if r.IntN(2) == 0 {
			b = make([]byte, r.IntN(1500))
		} else {
			b = make([]byte, 12+r.IntN(1100)+4)
		}
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if len(b) >= 12 && r.IntN(2) == 0 {
			// RC SEND/WRITE ONLY, READ request and response, ACK;
			// transport version 0, the default P_Key.
			b[0] = []byte{0x04, 0x0a, 0x0c, 0x10, 0x11}[r.IntN(5)]
			b[1] &^= 0x0f
			b[2], b[3] = 0xff, 0xff
			if len(victim) > 0 && r.IntN(2) == 0 {
				qpn := victim[r.IntN(len(victim))]
				b[5], b[6], b[7] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
			}
		}
		if _, err := c.Write(b); err == nil {
			sent++
		}
	}
	return sent, nil
}
