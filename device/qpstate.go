package device

import (
	"fmt"
	"github.com/vrnic/vrnic/abi"
	"math/bits"
	"strings"
)

// QP state machine (IBTA Vol. 1 chapter 10.3, "Queue pair and EE context
// states"), as tables.
//
//	                     modify                modify               modify
//	   ┌───────┐ ──────────────────► ┌──────┐ ───────► ┌─────┐ ───────────► ┌─────┐
//	   │ RESET │                     │ INIT │          │ RTR │              │ RTS │◄──┐
//	   └───────┘ ◄── any (modify) ── └──────┘          └─────┘              └─────┘   │ modify
//	       ▲                                                                  │  ▲    │ (SQD→RTS)
//	       │ any                                                 modify (RTS→SQD) │ ┌─────┐
//	   ┌───────┐ ◄── any (modify, or a transport error) ─────────────────────────┘  └─│ SQD │
//	   │  ERR  │                                                                       └─────┘
//	   └───────┘      UD/UC only: RTS → SQE on a send error, SQE → RTS by modify
//
// Every transition a client may request is a row of qpTransitions: for each
// (current, next) pair and QP type, the attributes that must be in the mask
// (required) and the attributes that may be (optional). Anything else in the
// mask is an error naming the attribute. The tables follow the IBTA
// (Table 91 "QP State Transition Properties") and the qp_state_table of the
// Linux kernel (ib_modify_qp_is_ok), row for row, including ALT_PATH and
// PATH_MIG_STATE where that table has them, so that a mask Linux refuses
// fails here with EINVAL too. CAP is in no row (Linux's table has it in none
// either). Values are checked afterwards (checkAttrValues): vrnic keeps no
// alternate path, so an ALT_PATH the table allows, or a PATH_MIG_STATE other
// than MIGRATED, then fails with EOPNOTSUPP. Any state may go to ERR (IBTA
// 10.3.1: "Any state to Error"), including RESET; any state may go to RESET.

// QPState is a QP state (enum vrnic_qp_state = enum ibv_qp_state).
type QPState = abi.QPState

// The seven QP states.
const (
	StateReset = abi.QPSReset
	StateInit  = abi.QPSInit
	StateRTR   = abi.QPSRTR
	StateRTS   = abi.QPSRTS
	StateSQD   = abi.QPSSQD
	StateSQE   = abi.QPSSQE
	StateErr   = abi.QPSErr

	numStates = 7
)

func validState(s QPState) bool { return s < numStates }

// AttrMask is a MODIFY_QP attribute mask; bit values are those of enum
// vrnic_qp_attr_mask (= enum ibv_qp_attr_mask).
type AttrMask uint32

const (
	AttrState           AttrMask = AttrMask(abi.QPAttrState)
	AttrCurState        AttrMask = AttrMask(abi.QPAttrCurState)
	AttrEnSQDAsync      AttrMask = AttrMask(abi.QPAttrEnSQDAsyncNotify)
	AttrAccessFlags     AttrMask = AttrMask(abi.QPAttrAccessFlags)
	AttrPKeyIndex       AttrMask = AttrMask(abi.QPAttrPKeyIndex)
	AttrPort            AttrMask = AttrMask(abi.QPAttrPort)
	AttrQKey            AttrMask = AttrMask(abi.QPAttrQKey)
	AttrAV              AttrMask = AttrMask(abi.QPAttrAV)
	AttrPathMTU         AttrMask = AttrMask(abi.QPAttrPathMTU)
	AttrTimeout         AttrMask = AttrMask(abi.QPAttrTimeout)
	AttrRetryCnt        AttrMask = AttrMask(abi.QPAttrRetryCnt)
	AttrRNRRetry        AttrMask = AttrMask(abi.QPAttrRNRRetry)
	AttrRQPSN           AttrMask = AttrMask(abi.QPAttrRQPSN)
	AttrMaxQPRdAtomic   AttrMask = AttrMask(abi.QPAttrMaxQPRdAtomic)
	AttrAltPath         AttrMask = AttrMask(abi.QPAttrAltPath)
	AttrMinRNRTimer     AttrMask = AttrMask(abi.QPAttrMinRNRTimer)
	AttrSQPSN           AttrMask = AttrMask(abi.QPAttrSQPSN)
	AttrMaxDestRdAtomic AttrMask = AttrMask(abi.QPAttrMaxDestRdAtomic)
	AttrPathMigState    AttrMask = AttrMask(abi.QPAttrPathMigState)
	AttrCap             AttrMask = AttrMask(abi.QPAttrCap)
	AttrDestQPN         AttrMask = AttrMask(abi.QPAttrDestQPN)

	numAttrBits = 21
	attrAll     = AttrMask(abi.QPAttrAll)
)

var attrNames = [numAttrBits]string{
	"STATE", "CUR_STATE", "EN_SQD_ASYNC_NOTIFY", "ACCESS_FLAGS", "PKEY_INDEX",
	"PORT", "QKEY", "AV", "PATH_MTU", "TIMEOUT", "RETRY_CNT", "RNR_RETRY",
	"RQ_PSN", "MAX_QP_RD_ATOMIC", "ALT_PATH", "MIN_RNR_TIMER", "SQ_PSN",
	"MAX_DEST_RD_ATOMIC", "PATH_MIG_STATE", "CAP", "DEST_QPN",
}

// String lists the attribute names of m joined by "|", e.g. "AV|PATH_MTU".
func (m AttrMask) String() string {
	if m == 0 {
		return "0"
	}
	var sb strings.Builder
	for m != 0 {
		i := bits.TrailingZeros32(uint32(m))
		m &^= 1 << i
		if sb.Len() > 0 {
			sb.WriteByte('|')
		}
		if i < numAttrBits {
			sb.WriteString(attrNames[i])
		} else if 1<<i == abi.QPAttrECE {
			sb.WriteString("ECE")
		} else {
			fmt.Fprintf(&sb, "bit%d", i)
		}
	}
	return sb.String()
}

// QPType is a QP transport type (enum vrnic_qp_type).
type QPType = abi.QPType

// QP types.
const (
	QPTypeRC = abi.QPTRC
	QPTypeUC = abi.QPTUC
	QPTypeUD = abi.QPTUD
)

// qpTypeIndex maps the supported QP types to a column of the tables.
func qpTypeIndex(t QPType) (int, bool) {
	switch t {
	case QPTypeRC:
		return 0, true
	case abi.QPTXRCSend:
		return 3, true
	case abi.QPTXRCRecv:
		return 4, true
	case QPTypeUD:
		return 1, true
	case QPTypeUC:
		return 2, true
	}
	return 0, false
}

const numQPTypes = 5 // RC, UD, UC, XRC_INI, XRC_TGT (the XRC columns: xrcColumns)

// xrcColumns fills the XRC columns of qpTransitions from RC's, with the
// kernel's differences (qp_state_table, IB_QPT_XRC_INI and
// IB_QPT_XRC_TGT): an initiator has no responder (INIT→RTR needs no
// max_dest_rd_atomic or min_rnr_timer), a target no requester (RTR→RTS
// needs only timeout and sq_psn).
func xrcColumns() bool {
	const ini, tgt = 3, 4
	for cur := range qpTransitions {
		for next := range qpTransitions[cur] {
			t := &qpTransitions[cur][next]
			t.required[ini], t.required[tgt] = t.required[0], t.required[0]
			t.optional[ini], t.optional[tgt] = t.optional[0], t.optional[0]
		}
	}
	rtr := &qpTransitions[StateInit][StateRTR]
	rtr.required[ini] &^= AttrMaxDestRdAtomic | AttrMinRNRTimer
	rts := &qpTransitions[StateRTR][StateRTS]
	rts.optional[ini] &^= AttrMinRNRTimer
	rts.required[tgt] = AttrTimeout | AttrSQPSN
	return true
}

var _ = xrcColumns()

// transition is one legal (current, next) pair: the attributes required and
// allowed besides STATE and CUR_STATE, per QP type (index from qpTypeIndex).
type transition struct {
	valid    bool
	required [numQPTypes]AttrMask
	optional [numQPTypes]AttrMask
}

// rcSQDOpt is what an RC QP may change while drained (SQD→SQD).
const rcSQDOpt = AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry |
	AttrMaxQPRdAtomic | AttrMaxDestRdAtomic | AttrAccessFlags | AttrPKeyIndex | AttrMinRNRTimer |
	apm

// apm is the pair of path migration attributes, optional for RC and UC
// where a connected QP may load or switch paths.
const apm = AttrAltPath | AttrPathMigState

// qpTransitions[cur][next] is the transition table. Columns: {RC, UD, UC}.
// UC takes what RC takes less what only the reliable service has (no
// RNR timer, retries, timeout or read/atomic depths), as in libibverbs'
// and the kernel's qp_state_table.
// CUR_STATE is accepted where IBTA allows it; elsewhere it is also
// accepted if it equals the current state (see checkTransition).
var qpTransitions = [numStates][numStates]transition{
	StateReset: {
		StateReset: {valid: true},
		StateInit: {valid: true,
			required: [numQPTypes]AttrMask{
				AttrPKeyIndex | AttrPort | AttrAccessFlags,
				AttrPKeyIndex | AttrPort | AttrQKey,
				AttrPKeyIndex | AttrPort | AttrAccessFlags,
			}},
		StateErr: {valid: true},
	},
	StateInit: {
		StateReset: {valid: true},
		StateErr:   {valid: true},
		StateInit: {valid: true,
			optional: [numQPTypes]AttrMask{
				AttrPKeyIndex | AttrPort | AttrAccessFlags,
				AttrPKeyIndex | AttrPort | AttrQKey,
				AttrPKeyIndex | AttrPort | AttrAccessFlags,
			}},
		StateRTR: {valid: true,
			required: [numQPTypes]AttrMask{
				AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
				0,
				AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			},
			optional: [numQPTypes]AttrMask{
				AttrAltPath | AttrAccessFlags | AttrPKeyIndex,
				AttrPKeyIndex | AttrQKey,
				AttrAltPath | AttrAccessFlags | AttrPKeyIndex,
			}},
	},
	StateRTR: {
		StateReset: {valid: true},
		StateErr:   {valid: true},
		StateRTS: {valid: true,
			required: [numQPTypes]AttrMask{
				AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRdAtomic,
				AttrSQPSN,
				AttrSQPSN,
			},
			optional: [numQPTypes]AttrMask{
				apm | AttrAccessFlags | AttrMinRNRTimer,
				AttrQKey,
				apm | AttrAccessFlags,
			}},
	},
	StateRTS: {
		StateReset: {valid: true},
		StateErr:   {valid: true},
		StateRTS: {valid: true,
			optional: [numQPTypes]AttrMask{
				apm | AttrAccessFlags | AttrMinRNRTimer,
				AttrQKey,
				apm | AttrAccessFlags,
			}},
		StateSQD: {valid: true,
			optional: [numQPTypes]AttrMask{AttrEnSQDAsync, AttrEnSQDAsync, AttrEnSQDAsync}},
	},
	StateSQD: {
		StateReset: {valid: true},
		StateErr:   {valid: true},
		StateRTS: {valid: true,
			optional: [numQPTypes]AttrMask{
				apm | AttrAccessFlags | AttrMinRNRTimer,
				AttrQKey,
				apm | AttrAccessFlags,
			}},
		StateSQD: {valid: true,
			optional: [numQPTypes]AttrMask{
				rcSQDOpt,
				AttrPKeyIndex | AttrQKey,
				apm | AttrAV | AttrAccessFlags | AttrPKeyIndex,
			}},
	},
	StateSQE: {
		StateReset: {valid: true},
		StateErr:   {valid: true},
		// UD and UC only: an RC QP never enters SQE (a send error moves
		// it to ERR).
		StateRTS: {valid: true,
			optional: [numQPTypes]AttrMask{0, AttrQKey, AttrAccessFlags}},
	},
	StateErr: {
		StateReset: {valid: true},
		StateErr:   {valid: true},
	},
}

// curStateAllowed marks the transitions where IBTA lists CUR_STATE as an
// optional attribute (RTR→RTS, RTS→RTS, SQD→RTS, SQE→RTS).
func curStateAllowed(cur, next QPState) bool {
	return next == StateRTS && cur != StateInit && cur != StateReset
}

// checkTransition validates the mask of a MODIFY_QP on a QP of type t in
// state cur that asks for next (next == cur when the mask has no STATE).
// It returns the error to report (EINVAL class) or nil. The values of the
// attributes are checked separately (checkAttrValues).
func checkTransition(t QPType, cur, next QPState, mask AttrMask) error {
	col, ok := qpTypeIndex(t)
	if !ok {
		return errorf(errInval, "QP type %s not supported", t.String())
	}
	if !validState(cur) || !validState(next) {
		return errorf(errInval, "invalid QP state %v -> %v", cur, next)
	}
	if mask&^attrAll != 0 {
		return errorf(errInval, "unknown attribute mask bits %#x", uint32(mask&^attrAll))
	}
	tr := qpTransitions[cur][next]
	if !tr.valid || (t != QPTypeUD && t != QPTypeUC && cur == StateSQE) { // an RC (XRC) QP is never in SQE
		return errorf(errInval, "illegal QP state transition %v -> %v for %s QP", cur, next, t.String())
	}
	req := tr.required[col]
	opt := tr.optional[col] | AttrState
	if curStateAllowed(cur, next) {
		opt |= AttrCurState
	}
	if missing := req &^ mask; missing != 0 {
		return errorf(errInval, "%v -> %v on %s QP: missing required attribute %v", cur, next, t.String(), missing)
	}
	if extra := mask &^ (req | opt); extra != 0 {
		return errorf(errInval, "%v -> %v on %s QP: attribute %v not allowed", cur, next, t.String(), extra)
	}
	return nil
}
