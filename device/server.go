package device

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"golang.org/x/sys/unix"
)

// conn is the state of one control connection.
type conn struct {
	d   *Device
	c   *net.UnixConn
	ctx *Context // nil until OPEN_CONTEXT
	// The peer's credentials (SO_PEERCRED) and whether it may use the
	// operator commands, decided when the connection is accepted.
	pid      int32
	uid, gid uint32
	operator bool

	wait <-chan struct{} // the pending reply's reply.wait

	bufs *connBufs // buf and rbuf, from connBufPool until the connection ends
	buf  []byte    // receive buffer: MaxMsgSize+1 to detect oversize datagrams
	oob  []byte
	rbuf []byte // reply buffer
	// out and outOOB are the reply to send, built while the uid's turn is
	// held (uidTurn) and written once it is given back; out is nil when
	// there is none.
	out, outOOB []byte
	outClose    []int // closed once out was sent (reply.handOff)
	// notSupLogged: the connection's first command refused as an
	// unsupported feature (EOPNOTSUPP) was logged at Info; later ones go
	// to Debug, so that a client retrying in a loop does not flood the log.
	notSupLogged bool
}

// connBufs are a connection's receive and reply buffers (128 KiB),
// reused from one connection to the next: a flood of short connections
// does not allocate them anew for each (it grew the daemon's RSS by tens
// of MiB that the runtime gives back only slowly).
type connBufs struct {
	buf  [abi.MaxMsgSize + 1]byte // MaxMsgSize+1 to detect oversize datagrams
	rbuf [abi.MaxMsgSize]byte
}

var connBufPool = sync.Pool{New: func() any { return new(connBufs) }}

// request is one decoded command.
type request struct {
	hdr     abi.MsgHdr
	payload []byte
	msg     *rawMsg
}

// reply is what a handler returns on success: the reply struct (nil for an
// empty reply) or raw bytes, and fds to pass (not closed by the sender).
type reply struct {
	body any
	raw  []byte
	fds  []int
	// handOff: fds are the client's (the daemon made them for it, e.g.
	// the client's end of a socket pair) and are closed here once the
	// reply was sent, or dropped.
	handOff bool
	// wait, when not nil, is closed when the command has taken effect in
	// the data plane; the reply is sent only then (or after
	// dataPlaneWaitMax: a stuck worker), outside the device lock
	// (DESTROY_QP: no completion of the QP is written after the client's
	// ibv_destroy_qp returns, as on the kernel's devices).
	wait <-chan struct{}
}

// cmdSpec describes a command: the exact payload size (or -1 when the
// handler checks a variable length), the number of fds it takes and
// whether it needs an open context.
type cmdSpec struct {
	size           int
	minFds, maxFds int
	needCtx        bool
	handle         func(*conn, *request) (reply, error)
}

var cmdTable map[abi.Cmd]cmdSpec

func init() {
	sz := func(v any) int { return abi.Sizeof(v) }
	handle := sz(&abi.CmdHandleReq{})
	cmdTable = map[abi.Cmd]cmdSpec{
		abi.CmdOpenContext:   {sz(&abi.CmdOpenContextReq{}), 0, 0, false, (*conn).openContext},
		abi.CmdQueryDevice:   {0, 0, 0, true, (*conn).queryDevice},
		abi.CmdQueryPort:     {sz(&abi.CmdQueryPortReq{}), 0, 0, true, (*conn).queryPort},
		abi.CmdQueryGID:      {sz(&abi.CmdQueryGIDReq{}), 0, 0, true, (*conn).queryGID},
		abi.CmdAddHostMem:    {sz(&abi.CmdAddHostMemReq{}), 1, 1, true, (*conn).addHostMem},
		abi.CmdRemoveHostMem: {handle, 0, 0, true, (*conn).removeHostMem},
		abi.CmdAllocPD:       {0, 0, 0, true, (*conn).allocPD},
		abi.CmdDeallocPD:     {handle, 0, 0, true, (*conn).deallocPD},
		abi.CmdRegMR:         {-1, 0, 0, true, (*conn).regMR},
		abi.CmdDeregMR:       {handle, 0, 0, true, (*conn).deregMR},
		abi.CmdCreateCQ:      {sz(&abi.CmdCreateCQReq{}), 0, 1, true, (*conn).createCQ},
		abi.CmdDestroyCQ:     {handle, 0, 0, true, (*conn).destroyCQ},
		// ABI 1.4 (mrdm.go)
		abi.CmdReregMR:       {-1, 0, 0, true, (*conn).reregMR},
		abi.CmdResizeCQ:      {sz(&abi.CmdResizeCQReq{}), 0, 0, true, (*conn).resizeCQ},
		abi.CmdAllocDM:       {sz(&abi.CmdAllocDMReq{}), 0, 0, true, (*conn).allocDM},
		abi.CmdFreeDM:        {handle, 0, 0, true, (*conn).freeDM},
		abi.CmdRegDMMR:       {sz(&abi.CmdRegDMMRReq{}), 0, 0, true, (*conn).regDMMR},
		abi.CmdQueryDeviceEx: {0, 0, 0, true, (*conn).queryDeviceEx},
		abi.CmdCreateQP:      {sz(&abi.CmdCreateQPReq{}), 0, 0, true, (*conn).createQP},
		abi.CmdModifyQP:      {-1, 0, 0, true, (*conn).modifyQP}, // ABI 1.5 or 1.4 length (ece.go)
		abi.CmdQueryQP:       {handle, 0, 0, true, (*conn).queryQP},
		abi.CmdDestroyQP:     {handle, 0, 0, true, (*conn).destroyQP},
		abi.CmdCreateSRQ:     {sz(&abi.CmdCreateSRQReq{}), 0, 0, true, (*conn).createSRQ},
		abi.CmdModifySRQ:     {sz(&abi.CmdModifySRQReq{}), 0, 0, true, (*conn).modifySRQ},
		abi.CmdQuerySRQ:      {handle, 0, 0, true, (*conn).querySRQ},
		abi.CmdOpenEvents:    {0, 0, 0, true, (*conn).openEvents},
		abi.CmdDestroySRQ:    {handle, 0, 0, true, (*conn).destroySRQ},
		abi.CmdCreateAH:      {sz(&abi.CmdCreateAHReq{}), 0, 0, true, (*conn).createAH},
		abi.CmdDestroyAH:     {handle, 0, 0, true, (*conn).destroyAH},
		abi.CmdOpenXRCD:      {sz(&abi.CmdOpenXRCDReq{}), 0, 1, true, (*conn).openXRCD},
		abi.CmdCloseXRCD:     {handle, 0, 0, true, (*conn).closeXRCD},
		abi.CmdCreateXRCSRQ:  {sz(&abi.CmdCreateXRCSRQReq{}), 0, 0, true, (*conn).createXRCSRQ},
		abi.CmdCreateXRCQP:   {sz(&abi.CmdCreateXRCQPReq{}), 0, 0, true, (*conn).createXRCQP},
		abi.CmdAllocMW:       {sz(&abi.CmdAllocMWReq{}), 0, 0, true, (*conn).allocMW},
		abi.CmdDeallocMW:     {handle, 0, 0, true, (*conn).deallocMW},
		abi.CmdCMCreateID:    {sz(&abi.CmdCMCreateIDReq{}), 0, 0, true, (*conn).cmCommand},
		abi.CmdCMDestroyID:   {handle, 0, 0, true, (*conn).cmCommand},
		abi.CmdCMListen:      {sz(&abi.CmdCMListenReq{}), 0, 0, true, (*conn).cmCommand},
		abi.CmdCMConnect:     {sz(&abi.CmdCMConnectReq{}), 0, 0, true, (*conn).cmCommand},
		abi.CmdCMAccept:      {-1, 0, 0, true, (*conn).cmCommand}, // ABI 1.5 or 1.4 length (package cm)
		abi.CmdCMReject:      {sz(&abi.CmdCMPrivateReq{}), 0, 0, true, (*conn).cmCommand},
		abi.CmdCMEstablish:   {handle, 0, 0, true, (*conn).cmCommand},
		abi.CmdCMDisconnect:  {sz(&abi.CmdCMPrivateReq{}), 0, 0, true, (*conn).cmCommand},
		abi.CmdCMInitQPAttr:  {sz(&abi.CmdCMInitQPAttrReq{}), 0, 0, true, (*conn).cmCommand},
		abi.CmdODPAttach:     {sz(&abi.CmdODPAttachReq{}), 0, 0, true, (*conn).odpAttach},
		abi.CmdRegMRODP:      {sz(&abi.CmdRegMRODPReq{}), 0, 0, true, (*conn).regMRODP},
		abi.CmdAdviseMR:      {-1, 0, 0, true, (*conn).adviseMR},
	}
	for op := range adminTable {
		cmdTable[op] = cmdSpec{-1, 0, 0, false, (*conn).admin}
	}
}

func (d *Device) serveConn(c *net.UnixConn) {
	defer d.wg.Done()
	forget := func() {
		c.Close()
		d.mu.Lock()
		delete(d.conns, c)
		d.mu.Unlock()
	}
	p, err := peerCred(c)
	if err != nil {
		d.log.Warn("control connection closed: no peer credentials", "err", err)
		forget()
		return
	}
	d.mu.Lock()
	turn, err := d.admitLocked(p)
	d.mu.Unlock()
	if err != nil {
		d.refuse(c, err)
		forget()
		return
	}
	operator := d.isOperator(p)
	d.counters.ConnectionsOpen.Add(1)
	cn := &conn{
		d:        d,
		c:        c,
		pid:      p.pid,
		uid:      p.uid,
		gid:      p.gid,
		operator: operator,
		bufs:     connBufPool.Get().(*connBufs),
		oob:      make([]byte, unix.CmsgSpace(maxOOBFds*4)),
	}
	cn.buf, cn.rbuf = cn.bufs.buf[:], cn.bufs.rbuf[:]
	held := false // the turn, while a message is handled
	defer func() {
		c.Close()
		// A handler that panicked holds the turn: taking it again would
		// hang every connection of the uid instead of letting the panic
		// through.
		if !held {
			turn.take()
		}
		if cn.ctx != nil && d.cfg.CM != nil {
			// The CM IDs first, without the device lock (the CM has
			// its own owner; rdma_destroy_id's REJs and DREQs go out).
			d.cfg.CM.Release(cn.ctx)
		}
		d.mu.Lock()
		delete(d.conns, c)
		if cn.ctx != nil {
			d.releaseContextLocked(cn.ctx, "connection closed")
			cn.ctx = nil
		}
		d.leaveLocked(p.uid)
		d.mu.Unlock()
		turn.release()
		d.counters.ConnectionsOpen.Add(-1)
		cn.buf, cn.rbuf = nil, nil
		connBufPool.Put(cn.bufs)
	}()
	for {
		m, err := readMsg(c, cn.buf, cn.oob)
		var re *recvError
		if err != nil && !errors.As(err, &re) {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) && !errors.Is(err, net.ErrClosed) {
				d.log.Debug("control connection read", "err", err)
			}
			return
		}
		turn.take()
		held = true
		if re != nil {
			d.counters.BadMessages.Add(1)
			cn.replyRawError(m.data, unix.EMSGSIZE, re.Error())
		} else {
			cn.handle(&m)
			for _, fd := range m.fds {
				if fd >= 0 {
					d.counters.FdsClosed.Add(1)
				}
			}
			m.closeFds()
		}
		held = false
		turn.release()
		if cn.wait != nil {
			cn.awaitDataPlane()
			cn.wait = nil
		}
		if !cn.flush() {
			return
		}
	}
}

// logRefusal logs a failed command: at Debug, except the connection's
// first refusal of a feature vrnic does not implement (EOPNOTSUPP, e.g. an
// alternate path), which is logged at Info with its reason, as the
// operator's clue to a program that works on other RDMA devices only.
func (cn *conn) logRefusal(hdr *abi.MsgHdr, err error) {
	if errors.Is(err, errNotSup) && !cn.notSupLogged {
		cn.notSupLogged = true
		cn.d.log.Info("command refused: feature not supported", "op", hdr.Opcode.String(), "pid", cn.pid, "reason", err.Error())
		return
	}
	cn.d.log.Debug("command failed", "op", hdr.Opcode.String(), "pid", cn.pid, "errno", unix.ErrnoName(errnoOf(err)), "reason", err.Error())
}

// handle processes one datagram and builds the reply (flush sends it).
func (cn *conn) handle(m *rawMsg) {
	d := cn.d
	var hdr abi.MsgHdr
	if err := hdr.Decode(m.data); err != nil {
		d.counters.BadMessages.Add(1)
		cn.replyRawError(m.data, unix.EMSGSIZE, fmt.Sprintf("datagram of %d bytes is shorter than the %d-byte header", len(m.data), abi.SizeofMsgHdr))
		return
	}
	d.counters.Commands.Add(1)
	rep, err := cn.dispatch(&hdr, m)
	if err != nil {
		d.counters.CommandErrors.Add(1)
		cn.logRefusal(&hdr, err)
		cn.sendError(&hdr, errnoOf(err), err.Error())
		return
	}
	cn.wait = rep.wait
	cn.sendReply(&hdr, rep)
}

// dataPlaneWaitMax bounds how long a reply waits for the data plane
// (reply.wait): a worker that is stuck must not hold its clients'
// control path; past the bound the reply goes out and the removal stays
// queued.
const dataPlaneWaitMax = 2 * time.Second

// awaitDataPlane waits for cn.wait, at most dataPlaneWaitMax.
func (cn *conn) awaitDataPlane() {
	t := time.NewTimer(dataPlaneWaitMax)
	defer t.Stop()
	select {
	case <-cn.wait:
	case <-t.C:
		cn.d.log.Warn("data plane did not confirm a command in time; replying anyway", "pid", cn.pid, "after", dataPlaneWaitMax)
	}
}

func (cn *conn) dispatch(hdr *abi.MsgHdr, m *rawMsg) (reply, error) {
	if int(hdr.Length) != len(m.data) {
		return reply{}, errorf(errMsgSize, "header length %d, datagram has %d bytes", hdr.Length, len(m.data))
	}
	if hdr.Flags != 0 {
		return reply{}, errorf(errInval, "header flags %#x must be 0 in a command", hdr.Flags)
	}
	if hdr.Status != 0 {
		return reply{}, errorf(errInval, "header status %d must be 0 in a command", hdr.Status)
	}
	spec, ok := cmdTable[hdr.Opcode]
	if !ok {
		return reply{}, errorf(errBadOpcode, "unknown command opcode %#x", uint16(hdr.Opcode))
	}
	payload := m.data[abi.SizeofMsgHdr:]
	if spec.size >= 0 && len(payload) != spec.size {
		return reply{}, errorf(errMsgSize, "%v: payload is %d bytes, want %d", hdr.Opcode, len(payload), spec.size)
	}
	if n := len(m.fds); n < spec.minFds || n > spec.maxFds {
		if spec.minFds == spec.maxFds {
			return reply{}, errorf(errBadFd, "%v: %d fds attached, want %d", hdr.Opcode, n, spec.minFds)
		}
		return reply{}, errorf(errBadFd, "%v: %d fds attached, want %d to %d", hdr.Opcode, n, spec.minFds, spec.maxFds)
	}
	// The CM has its own owner and never takes the device lock: its
	// commands and its operator view are served without it.
	if hdr.Opcode >= abi.CmdCMCreateID && hdr.Opcode <= abi.CmdCMInitQPAttr {
		return cn.cmCommand(&request{hdr: *hdr, payload: payload, msg: m})
	}
	if hdr.Opcode == admin.CMCmd {
		return cn.cmAdmin(&request{hdr: *hdr, payload: payload, msg: m})
	}
	if hdr.Opcode == abi.CmdAdviseMR && cn.ctx != nil {
		return cn.adviseMR(&request{hdr: *hdr, payload: payload, msg: m}) // takes the lock itself
	}
	cn.d.mu.Lock()
	defer cn.d.mu.Unlock()
	if cn.d.closed {
		return reply{}, errorf(errBusy, "device is shutting down")
	}
	if spec.needCtx && cn.ctx == nil {
		return reply{}, errorf(errInval, "%v before OPEN_CONTEXT", hdr.Opcode)
	}
	return spec.handle(cn, &request{hdr: *hdr, payload: payload, msg: m})
}

// sendReply, sendError and replyRawError build a reply for flush; they
// return false when there is none to send (an error reply that cannot be
// encoded).
func (cn *conn) sendReply(req *abi.MsgHdr, rep reply) bool {
	if rep.handOff {
		cn.outClose = rep.fds
	}
	b := cn.rbuf
	n := abi.SizeofMsgHdr
	if rep.body != nil {
		k, err := abi.Marshal(b[n:], rep.body)
		if err != nil {
			return cn.sendError(req, unix.EIO, "encoding reply: "+err.Error())
		}
		n += k
	}
	if rep.raw != nil {
		if len(rep.raw) > len(b)-n {
			return cn.sendError(req, unix.EMSGSIZE, "reply too large")
		}
		n += copy(b[n:], rep.raw)
	}
	h := abi.MsgHdr{Opcode: req.Opcode, Flags: abi.MsgFlagReply, Length: uint32(n), Seq: req.Seq}
	h.Put(b)
	var oob []byte
	if len(rep.fds) > 0 {
		oob = unix.UnixRights(rep.fds...)
	}
	return cn.write(b[:n], oob)
}

func (cn *conn) sendError(req *abi.MsgHdr, errno unix.Errno, msg string) bool {
	n, err := abi.PutErrorReply(cn.rbuf, req, errno, msg)
	if err != nil {
		return false
	}
	return cn.write(cn.rbuf[:n], nil)
}

// replyRawError answers a datagram that could not be decoded; it echoes
// opcode and seq if the header is there.
func (cn *conn) replyRawError(data []byte, errno unix.Errno, msg string) bool {
	var h abi.MsgHdr
	if len(data) >= abi.SizeofMsgHdr {
		_ = h.Decode(data)
	}
	return cn.sendError(&h, errno, msg)
}

// write keeps the datagram b (and the control message oob) for flush.
func (cn *conn) write(b, oob []byte) bool {
	cn.out, cn.outOOB = b, oob
	return true
}

// flush sends the reply built for the last datagram, if any; it returns
// false when the connection must be closed: there was no reply (the error
// reply could not be encoded) or it could not be sent within 5 s.
func (cn *conn) flush() bool {
	b, oob, fds := cn.out, cn.outOOB, cn.outClose
	cn.out, cn.outOOB, cn.outClose = nil, nil, nil
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if b == nil {
		return false
	}
	cn.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _, err := cn.c.WriteMsgUnix(b, oob, nil)
	return err == nil
}

// cString returns the printable part of a NUL-padded name field.
func cString(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) && r < unicode.MaxASCII {
			return r
		}
		return '?'
	}, string(b))
}
