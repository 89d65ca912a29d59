package verbs

import (
	"fmt"
	"os"
	"runtime"

	"github.com/vrnic/vrnic/abi"
	"golang.org/x/sys/unix"
)

// XRC (ABI 1.4): domains, XRC SRQs and XRC QPs, with the semantics the
// project's C library gives libibverbs programs (ibverbs/src/xrc.c). An
// initiator QP (QPInitAttr.Type abi.QPTXRCSend, created with CreateQP)
// sends to any XRC SRQ of the target's domain, naming its number
// (SRQ.XRCNum) in SendWR.RemoteQPN; the target QP (CreateTargetQP) takes
// the connection, and the message lands in that SRQ, whose CQ gets the
// completion with the target QP's number.

// XRCD is an XRC domain (ibv_xrcd).
type XRCD struct {
	ctx    *Context
	Handle uint32
	// The PD and CQ a target QP's command names (a target QP has no
	// queues of its own; as the C library does).
	pd *PD
	cq *CQ
}

// OpenXRCD opens an XRC domain (ibv_open_xrcd). With f nil it is a new
// domain of this context alone (oflags must be 0). With a file, the
// domain the file names, shared with every context that opens it: oflags
// os.O_CREATE makes one if the file names none (else ENOENT), with
// os.O_EXCL too it must make one (else EEXIST). Other flags: EINVAL.
func (c *Context) OpenXRCD(f *os.File, oflags int) (*XRCD, error) {
	if oflags&^(os.O_CREATE|os.O_EXCL) != 0 || (f == nil && oflags != 0) {
		return nil, fmt.Errorf("verbs: OpenXRCD oflags %#x: O_CREATE and O_EXCL, with a file: %w", oflags, unix.EINVAL)
	}
	var req abi.CmdOpenXRCDReq
	if oflags&os.O_CREATE != 0 {
		req.OFlags |= abi.XRCDOCreat
	}
	if oflags&os.O_EXCL != 0 {
		req.OFlags |= abi.XRCDOExcl
	}
	var fds []int
	if f != nil {
		fds = []int{int(f.Fd())}
	}
	pd, err := c.AllocPD()
	if err != nil {
		return nil, err
	}
	cq, err := c.CreateCQ(1, nil)
	if err != nil {
		pd.Dealloc()
		return nil, err
	}
	var r abi.RespOpenXRCD
	if _, _, err := c.k.call(abi.CmdOpenXRCD, &req, nil, fds, &r); err != nil {
		cq.Destroy()
		pd.Dealloc()
		return nil, err
	}
	runtime.KeepAlive(f) // its descriptor went over the socket
	return &XRCD{ctx: c, Handle: r.XRCDHandle, pd: pd, cq: cq}, nil
}

// Close closes the domain (ibv_close_xrcd): EBUSY while this context has
// XRC SRQs or target QPs in it.
func (x *XRCD) Close() error {
	if err := x.ctx.destroy(abi.CmdCloseXRCD, x.Handle); err != nil {
		return err
	}
	x.cq.Destroy()
	x.pd.Dealloc()
	return nil
}

// CreateXRCSRQ creates an XRC SRQ of the domain x in pd (ibv_create_srq_ex
// with IBV_SRQT_XRC): its receive completions go to cq. Its number is
// SRQ.XRCNum. x, pd and cq must be this context's (else EINVAL).
func (pd *PD) CreateXRCSRQ(x *XRCD, cq *CQ, maxWR, maxSGE, limit uint32) (*SRQ, error) {
	if x == nil || cq == nil || x.ctx != pd.ctx || cq.ctx != pd.ctx {
		return nil, fmt.Errorf("verbs: CreateXRCSRQ needs a domain and a CQ of the PD's context: %w", unix.EINVAL)
	}
	return pd.createSRQ(maxWR, maxSGE, limit, x, cq)
}

// CreateTargetQP creates an XRC target QP of the domain (ibv_create_qp_ex
// with IBV_QPT_XRC_RECV): it has no queues; once connected to an
// initiator, what the initiator sends lands in the XRC SRQ of the domain
// its WR names.
func (x *XRCD) CreateTargetQP() (*QP, error) {
	return x.pd.createQP(QPInitAttr{Type: abi.QPTXRCRecv, SendCQ: x.cq, Cap: abi.QPCap{MaxSendWR: 1, MaxSendSGE: 1}}, x)
}
