package device

import (
	"net/netip"

	"github.com/vrnic/vrnic/abi"
)

// Connections and who holds them.
//
// RoCE carries no authentication: an RC request is accepted by the
// responder because it comes from the QP's path (the peer's address) with
// the PSN the responder expects; nothing in the packet says which QP of
// the peer sent it. Two QPs of one daemon send from the same address, so
// if a daemon let a second local QP connect to a remote QP that one of its
// QPs is already connected to, that second QP (any client of the daemon)
// could inject requests into the first one's connection: write into the
// remote client's memory with the rkeys the connection was given, or
// break it. The daemon is the only party that can tell its QPs apart, so
// it enforces that a remote QP (destination GID and QPN) is claimed by at
// most one local RC or UC QP (a UC QP accepts requests from its path the
// same way): the claim is taken when the QP goes to RTR with
// its address vector and destination QPN, and released when it returns to
// RESET or is destroyed (a QP in ERR keeps it: the remote end may still be
// sending to it). A second claim fails MODIFY_QP with EADDRINUSE.

// peerKey names a remote QP: its GID and QP number.
type peerKey struct {
	gid [16]byte
	qpn uint32
}

// claimPeer takes the claim of q on the remote QP its attributes name,
// for a transition to next (cur is the state before). Called with d.mu
// held, before the change is applied; a applies its AV and DEST_QPN when
// mask has them.
func (d *Device) claimPeer(q *QP, cur, next QPState, mask AttrMask, a *abi.QPAttr) error {
	if q.typ == QPTypeUD || cur != StateInit || next != StateRTR {
		return nil
	}
	k := peerKey{gid: q.attr.AHAttr.DGID, qpn: q.attr.DestQPNum}
	if mask&AttrAV != 0 {
		k.gid = a.AHAttr.DGID
	}
	if mask&AttrDestQPN != 0 {
		k.qpn = a.DestQPNum
	}
	if h := d.peers.get(k); h != nil && h != q {
		return errorf(errAddrInUse, "remote QP %#x at %v is connected to QP %#x of this device already", k.qpn, netip.AddrFrom16(k.gid).Unmap(), h.qpn)
	}
	if q.claimed {
		// Claimed already (the table is keyed by q.peer): drop the
		// old claim first.
		d.releasePeer(q)
	}
	q.peer, q.claimed = k, true
	d.peers.put(q)
	return nil
}

// releasePeer drops q's claim (RESET, destroy).
func (d *Device) releasePeer(q *QP) {
	if q.claimed && d.peers.get(q.peer) == q {
		d.peers.delete(q.peer)
	}
	q.claimed = false
}
