package device

import (
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/doorbell"
	"github.com/vrnic/vrnic/roce"
)

// XRC domains, XRC SRQs and XRC QPs (ABI 1.4, vrnic_abi.h "XRC").
//
// A domain (xrcd) is the device's; a context holds it through handles
// (xrcdRef, one per OPEN_XRCD). A domain opened with a file is named by
// the file's inode, as the kernel's ib_uverbs_open_xrcd names it (its
// xrcd_table_search by inode): every context that opens the same file gets
// the same domain, and the client proves it may by passing the open fd.
// The domain goes with its last handle; a handle cannot be closed while
// the context has XRC SRQs or target QPs in it (EBUSY).
//
// An XRC SRQ has a device-wide number (24 bits, drawn at random like
// QPNs) that initiators name in their WQEs; the data plane makes it
// resolvable by the engine's target QPs (XRCDataPlane).

// XRCDataPlane is what a data plane that carries XRC implements beside
// DataPlane; a device whose data plane does not (tests of the control
// plane) keeps the objects and moves no data.
type XRCDataPlane interface {
	// AddXRCSRQ makes the XRC SRQ s resolvable by target QPs of its
	// domain (after CREATE_XRC_SRQ validated it, before the client
	// learns its number).
	AddXRCSRQ(s *SRQ) error
	// RemoveXRCSRQ makes s unknown to target QPs; the channel is closed
	// once no engine worker touches its ring, record or CQ any more.
	RemoveXRCSRQ(s *SRQ) <-chan struct{}
}

type xrcdKey struct{ dev, ino uint64 }

// xrcd is an XRC domain.
type xrcd struct {
	num  uint32  // device-wide, never 0: what target QPs and SRQs compare
	key  xrcdKey // the inode naming it; zero for a context's own
	refs int     // handles held by contexts
}

// xrcdRef is a context's handle of a domain.
type xrcdRef struct {
	handle uint32
	x      *xrcd
	users  int // the context's XRC SRQs and target QPs in the domain
}

// xrcSRQ is what makes an SRQ an XRC SRQ.
type xrcSRQ struct {
	ref *xrcdRef
	cq  *CQ
	num uint32
}

// xrcDevice is the device's XRC state (under the device lock).
type xrcDevice struct {
	byInode map[xrcdKey]*xrcd
	next    uint32
	srqs    map[uint32]*SRQ // by XRC SRQ number
}

func (cn *conn) openXRCD(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdOpenXRCDReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if c.Reserved != 0 || c.OFlags&^uint32(abi.XRCDOCreat|abi.XRCDOExcl) != 0 {
		return reply{}, errorf(errInval, "oflags %#x: only O_CREAT and O_EXCL", c.OFlags)
	}
	if len(cx.xrcds) >= d.cfg.Limits.PerClient.SRQ {
		return reply{}, errorf(errAgain, "at most %d XRC domains per context", d.cfg.Limits.PerClient.SRQ)
	}
	var key xrcdKey
	if len(r.msg.fds) == 1 {
		var st unix.Stat_t
		if err := unix.Fstat(r.msg.fds[0], &st); err != nil {
			return reply{}, errorf(errBadFd, "fstat: %v", err)
		}
		key = xrcdKey{dev: st.Dev, ino: st.Ino}
	} else if c.OFlags != 0 {
		return reply{}, errorf(errInval, "oflags need a file")
	}
	x := d.xrc.byInode[key]
	switch {
	case key == (xrcdKey{}):
		x = nil
	case x != nil && c.OFlags&abi.XRCDOExcl != 0 && c.OFlags&abi.XRCDOCreat != 0:
		return reply{}, errorf(errExist, "the file names an XRC domain already (O_EXCL)")
	case x == nil && c.OFlags&abi.XRCDOCreat == 0:
		return reply{}, errorf(errNoEnt, "the file names no XRC domain (no O_CREAT)")
	}
	if x == nil {
		d.xrc.next++
		if d.xrc.next == 0 {
			d.xrc.next++
		}
		x = &xrcd{num: d.xrc.next, key: key}
		if key != (xrcdKey{}) {
			if d.xrc.byInode == nil {
				d.xrc.byInode = map[xrcdKey]*xrcd{}
			}
			d.xrc.byInode[key] = x
		}
	}
	x.refs++
	ref := &xrcdRef{handle: cx.newHandle(), x: x}
	cx.xrcds[ref.handle] = ref
	return reply{body: &abi.RespOpenXRCD{XRCDHandle: ref.handle}}, nil
}

func (cn *conn) closeXRCD(r *request) (reply, error) {
	ref, err := lookupArg(r, cn.ctx.xrcds, "XRC domain")
	if err != nil {
		return reply{}, err
	}
	if ref.users > 0 {
		return reply{}, errorf(errBusy, "XRC domain %d holds %d XRC SRQs and QPs", ref.handle, ref.users)
	}
	cn.d.dropXRCDLocked(cn.ctx, ref)
	return reply{}, nil
}

func (d *Device) dropXRCDLocked(cx *Context, ref *xrcdRef) {
	delete(cx.xrcds, ref.handle)
	if ref.x.refs--; ref.x.refs == 0 && ref.x.key != (xrcdKey{}) {
		delete(d.xrc.byInode, ref.x.key)
	}
}

// releaseXRCDsLocked drops a closing context's handles (after its SRQs
// and QPs are gone).
func (d *Device) releaseXRCDsLocked(cx *Context) {
	for _, ref := range cx.xrcds {
		d.dropXRCDLocked(cx, ref)
	}
}

func (cn *conn) createXRCSRQ(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdCreateXRCSRQReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	ref, err := lookup(cx.xrcds, "XRC domain", c.XRCDHandle)
	if err != nil {
		return reply{}, err
	}
	cq, err := lookup(cx.cqs, "CQ", c.CQHandle)
	if err != nil {
		return reply{}, err
	}
	num := d.allocXRCSRQNum()
	rep, s, err := cn.createSRQWith(&c.SRQ, &xrcSRQ{ref: ref, cq: cq, num: num})
	if err != nil {
		return reply{}, err
	}
	if xdp, ok := d.dp.(XRCDataPlane); ok {
		if err := xdp.AddXRCSRQ(s); err != nil {
			s.xrc = nil // nothing to remove from the data plane
			d.freeSRQ(cx, s)
			return reply{}, errorf(errNoMem, "data plane: %v", err)
		}
	}
	if d.xrc.srqs == nil {
		d.xrc.srqs = map[uint32]*SRQ{}
	}
	d.xrc.srqs[num] = s
	ref.users++
	cq.users++
	return reply{body: &abi.RespCreateXRCSRQ{SRQ: rep, SRQNum: num}}, nil
}

// allocXRCSRQNum draws an unused 24-bit XRC SRQ number.
func (d *Device) allocXRCSRQNum() uint32 {
	for {
		n := 1 + d.qpnRand.Uint32N(roce.QPNMask)
		if _, used := d.xrc.srqs[n]; !used {
			return n
		}
	}
}

// freeXRCSRQLocked undoes what createXRCSRQ added to an SRQ (freeSRQ does
// the rest); the ring and record wait for the data plane's workers.
func (d *Device) freeXRCSRQLocked(cx *Context, s *SRQ) {
	x := s.xrc
	delete(d.xrc.srqs, x.num)
	x.ref.users--
	x.cq.users--
	if xdp, ok := d.dp.(XRCDataPlane); ok {
		if done := xdp.RemoveXRCSRQ(s); done != nil {
			final := make(chan QPCounters, 1)
			go func() {
				<-done
				final <- QPCounters{}
			}()
			d.startRelease(cx, final, make(chan struct{}))
		}
	}
}

func (cn *conn) createXRCQP(r *request) (reply, error) {
	var c abi.CmdCreateXRCQPReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if c.Reserved != 0 {
		return reply{}, errorf(errInval, "reserved must be 0")
	}
	ref, err := lookup(cn.ctx.xrcds, "XRC domain", c.XRCDHandle)
	if err != nil {
		return reply{}, err
	}
	return cn.createQPWith(&c.QP, ref)
}

// XRCD returns the domain number of an XRC target QP (0 otherwise).
func (q *QP) XRCD() uint32 {
	if q.xrcd == nil {
		return 0
	}
	return q.xrcd.x.num
}

// XRC returns an XRC SRQ's number, domain number and CQ; ok is false for
// another SRQ.
func (s *SRQ) XRC() (num, xrcd uint32, cq *CQ, ok bool) {
	if s.xrc == nil {
		return 0, 0, nil, false
	}
	return s.xrc.num, s.xrc.ref.x.num, s.xrc.cq, true
}

// Doorbells returns the doorbell page of the SRQ's context.
func (s *SRQ) Doorbells() *doorbell.Page { return s.cx.db }

// Owner returns the SRQ's context (the owner of its PD's memory).
func (s *SRQ) Owner() Owner { return s.cx.owner }

// PDHandle returns the handle of the SRQ's PD.
func (s *SRQ) PDHandle() uint32 { return s.pd.handle }
