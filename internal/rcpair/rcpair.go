// Package rcpair connects an RC QP to its peer the way perftest-style
// tools do: each side describes its QP and the memory the peer may
// address in an Info (QPN, starting PSN, GID, rkey and the MR's IOVA and
// length), the two Infos are exchanged out of band (vrnic-demo relays
// them over a unix socket, vrnic-perf sends them over its control
// connection, both as JSON), and then each side moves its QP
// RESET → INIT → RTR → RTS towards the other with Connect.
//
// Connection parameters fixed here, the same for every user: all access
// rights, P_Key index 0, port 1, hop limit 64, minimum RNR timer code 1,
// ACK timeout code 14 (4.096 µs × 2^14, about 67 ms), retry count 7 and
// infinite RNR retries (7).
package rcpair

import (
	"fmt"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// Info is what one side needs of the other to connect its QP and address
// the peer's memory. Its JSON form is what vrnic-demo and vrnic-perf
// exchange.
type Info struct {
	QPN  uint32   `json:"qpn"`
	PSN  uint32   `json:"psn"`  // first PSN the QP sends
	GID  [16]byte `json:"gid"`  // the QP's source GID
	RKey uint32   `json:"rkey"` // rkey of the peer-addressable MR
	Addr uint64   `json:"addr"` // IOVA of that MR
	Len  uint64   `json:"len"`  // its length
}

// Local describes qp, which starts sending at PSN psn from GID gid, and
// the MR mr its peer may address.
func Local(qp *verbs.QP, psn uint32, gid [16]byte, mr *verbs.MR) Info {
	return Info{QPN: qp.QPN, PSN: psn, GID: gid, RKey: mr.RKey, Addr: mr.Addr, Len: mr.Length}
}

// MTU returns the path MTU code of a size in bytes (256 ... 4096), or 0
// for any other size.
func MTU(bytes int) abi.MTU {
	for m := abi.MTU256; m <= abi.MTU4096; m++ {
		if m.Bytes() == bytes {
			return m
		}
	}
	return 0
}

// Attr are the connection parameters that differ between users.
type Attr struct {
	MTU abi.MTU // path MTU
	// MaxRdAtomic is both the READ/atomic operations this side may have
	// outstanding (max_rd_atomic) and those it accepts from the peer
	// (max_dest_rd_atomic).
	MaxRdAtomic uint8
	// ECE are vrnic's ECE options both sides agreed on over their own
	// channel (abi.ECE* bits), set at RTR; 0: none.
	ECE uint32
}

// Connect moves qp, in RESET, to INIT, to RTR towards peer and to RTS,
// sending from PSN psn (the PSN of this side's Info). An error names the
// QP and the state it did not reach.
func Connect(qp *verbs.QP, psn uint32, peer Info, a Attr) error {
	if err := qp.ToInit(abi.AccessAll, 0); err != nil {
		return fmt.Errorf("QP %#x to INIT: %w", qp.QPN, err)
	}
	if err := qp.ToRTR(verbs.RTRAttr{AV: abi.AHAttr{DGID: peer.GID, HopLimit: 64, PortNum: 1},
		PathMTU: a.MTU, DestQPN: peer.QPN, RQPSN: peer.PSN,
		MaxDestRdAtomic: a.MaxRdAtomic, MinRNRTimer: 1, ECE: a.ECE}); err != nil {
		return fmt.Errorf("QP %#x to RTR: %w", qp.QPN, err)
	}
	if err := qp.ToRTS(verbs.RTSAttr{SQPSN: psn, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
		MaxRdAtomic: a.MaxRdAtomic}); err != nil {
		return fmt.Errorf("QP %#x to RTS: %w", qp.QPN, err)
	}
	return nil
}
