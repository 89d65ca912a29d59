package dataplane

import (
	"context"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
)

// Peer resolution on INIT → RTR.
//
// A link that addresses peers by link-layer address (the TAP link) has to
// know the peer's MAC before the engine builds the QP's first frame: the
// engine's per-QP path is fixed when the QP goes to RTR, from a lookup in
// the link's neighbour cache that never waits (PathFixup). Resolution
// itself, which sends ARP requests or neighbour solicitations and waits
// for the answer, is done here, on the control path, by
// Config.Resolve, so that
//
//   - CheckModifyQP (called before the device applies a MODIFY_QP) fails
//     the INIT → RTR transition of a QP whose peer does not answer with
//     EHOSTUNREACH and a message naming the peer: the client gets an
//     error from ibv_modify_qp, not a QP that hangs;
//   - ModifyQP repeats the check (a hit in the neighbour cache when
//     CheckModifyQP ran) and moves the QP to ERR rather than hand the
//     engine an RTR QP it cannot address.
//
// Both run under the device lock: a peer that does not answer holds the
// device's control path for at most ResolveTimeout.

// unreachableError is an unresolved peer: its message names the QP and the
// peer, and it wraps EHOSTUNREACH, the errno the client gets.
type unreachableError struct{ msg string }

func (e *unreachableError) Error() string { return e.msg }
func (e *unreachableError) Unwrap() error { return unix.EHOSTUNREACH }

// CheckModifyQP checks a MODIFY_QP before the device applies it: for an
// RC or UC QP going from INIT (cur) to RTR (next) it resolves the peer address
// of the address vector (a's when mask has AttrAV, else the QP's) with
// Config.Resolve. The error wraps unix.EHOSTUNREACH.
func (dp *DataPlane) CheckModifyQP(q *device.QP, cur, next device.QPState, mask device.AttrMask, a *abi.QPAttr) error {
	if dp.cfg.Resolve == nil || q.Type() == abi.QPTUD || cur != device.StateInit || next != device.StateRTR {
		return nil
	}
	av := q.Attr().AHAttr
	if mask&device.AttrAV != 0 {
		av = a.AHAttr
	}
	return dp.resolvePeer(q.QPN(), &av)
}

// resolvePeer runs Resolve for the destination GID of av.
func (dp *DataPlane) resolvePeer(qpn uint32, av *abi.AHAttr) error {
	return dp.resolve(fmt.Sprintf("QP %d", qpn), netip.AddrFrom16(av.DGID).Unmap())
}

// resolve runs Resolve for peer, bounded by ResolveTimeout; who names the
// QP or AH in the error.
func (dp *DataPlane) resolve(who string, peer netip.Addr) error {
	if dp.cfg.Resolve == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), dp.cfg.ResolveTimeout)
	defer cancel()
	if err := dp.cfg.Resolve(ctx, peer); err != nil {
		return &unreachableError{fmt.Sprintf("%s: peer %v is unreachable (no ARP/neighbour reply): %v", who, peer, err)}
	}
	return nil
}
