package device

import (
	"fmt"
	"net/netip"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

// Value ranges of the QP attributes (IBTA 9.7.5.2, 10.2.4 and the
// attribute definitions of chapter 11).
const (
	maxPSN       = 1<<24 - 1
	maxQPN24     = 1<<24 - 1
	maxTimer5    = 31 // TIMEOUT, MIN_RNR_TIMER: 5-bit codes
	maxRetry3    = 7  // RETRY_CNT, RNR_RETRY: 3 bits
	pkeyTableLen = 1  // one P_Key (0xffff, the default)
	devicePort   = 1
)

// checkAH validates an address vector (CREATE_AH and the AV attribute of
// MODIFY_QP) as Linux does for a RoCE port of rdma_rxe, field by field:
//
//   - port_num: rdma_check_ah_attr refuses a port the device does not
//     have (rdma_is_port_valid): EINVAL.
//   - sgid_index: rdma_fill_sgid_attr takes the GID entry through
//     rdma_get_gid_attr, which fails with EINVAL for an index past the
//     table (gid_tbl_len) and ENODATA for an empty entry within it.
//   - flow_label, hop_limit, traffic_class: ib_uverbs_create_ah and
//     copy_ah_attr_from_uverbs (MODIFY_QP) store them through
//     rdma_ah_set_grh unchecked (flow_label is a u32 there). On the wire
//     the flow label is the low 20 bits (ip6_flow_hdr; engine.NewAH masks
//     it); QUERY_QP gives back the value stored, as Linux does.
//   - sl: rdma_ah_set_sl stores the u8 unchecked; rxe ignores it (RoCE
//     without VLANs carries no SL), and so does vrnic.
//   - static_rate: not in vrnic's AV (the library drops it); rxe ignores
//     it too.
//
// rxe_av_chk_attr adds only the sgid_index and the GID's network type,
// both covered above. Not from Linux: the ABI's reserved bytes must be 0,
// and an all-zero DGID is refused (Linux fails its route lookup in
// ib_resolve_eth_dmac instead).
func (d *Device) checkAH(a *abi.AHAttr) error {
	for _, b := range a.Reserved {
		if b != 0 {
			return errorf(errInval, "ah_attr.reserved must be 0")
		}
	}
	if a.PortNum != devicePort {
		return errorf(errInval, "ah_attr.port_num %d: the device has port 1 only", a.PortNum)
	}
	if a.SGIDIndex >= abi.GIDTableLen {
		return errorf(errInval, "ah_attr.sgid_index %d: past the GID table (gid_tbl_len %d)", a.SGIDIndex, abi.GIDTableLen)
	}
	if int(a.SGIDIndex) >= len(d.cfg.Link.GIDs) {
		return errorf(unix.ENODATA, "ah_attr.sgid_index %d: no such GID (table has %d valid entries)", a.SGIDIndex, len(d.cfg.Link.GIDs))
	}
	if a.DGID == ([16]byte{}) {
		return errorf(errInval, "ah_attr.dgid is all zero")
	}
	return nil
}

// checkAttrValues checks the values of the attributes in mask (the mask
// itself was checked against the transition table).
//
// Where Linux's rxe accepts a value and vrnic does not, the README's
// "Where vrnic differs from the kernel's checks" says why. Accepted as
// rxe does: any EN_SQD_ASYNC_NOTIFY (stored, given back by QUERY_QP).
// Refused with EOPNOTSUPP, as a feature vrnic does not implement: ALT_PATH
// and a PATH_MIG_STATE other than MIGRATED (rxe stores them; vrnic keeps
// no alternate path).
func (d *Device) checkAttrValues(q *QP, cur QPState, mask AttrMask, a *abi.QPAttr) error {
	if mask&AttrPathMigState == 0 && a.PathMigState != 0 {
		return errorf(errInval, "attr.path_mig_state must be 0 without PATH_MIG_STATE in the mask")
	}
	if a.Cap.Reserved != 0 {
		return errorf(errInval, "attr.cap.reserved must be 0")
	}
	type check struct {
		bit AttrMask
		bad bool
		msg string
		arg any
	}
	rdAtom := strconv.Itoa(int(d.cfg.MaxRdAtomic))
	checks := [...]check{
		{AttrCurState, a.CurQPState != cur, "CUR_STATE %v does not match the QP's state", a.CurQPState},
		{AttrAccessFlags, a.QPAccessFlags&^abi.AccessAll != 0, "ACCESS_FLAGS %#x: unknown bits", a.QPAccessFlags},
		{AttrPKeyIndex, a.PKeyIndex >= pkeyTableLen, "PKEY_INDEX %d out of range (P_Key table has 1 entry)", a.PKeyIndex},
		{AttrPort, a.PortNum != devicePort, "PORT %d: the device has port 1 only", a.PortNum},
		{AttrPathMTU, a.PathMTU < abi.MTU256 || a.PathMTU > d.cfg.Link.MaxMTU, "PATH_MTU %d out of range", uint32(a.PathMTU)},
		{AttrTimeout, a.Timeout > maxTimer5, "TIMEOUT %d out of range (5 bits)", a.Timeout},
		{AttrRetryCnt, a.RetryCnt > maxRetry3, "RETRY_CNT %d out of range (0..7)", a.RetryCnt},
		{AttrRNRRetry, a.RNRRetry > maxRetry3, "RNR_RETRY %d out of range (0..7)", a.RNRRetry},
		{AttrRQPSN, a.RQPSN > maxPSN, "RQ_PSN %#x out of range (24 bits)", a.RQPSN},
		{AttrSQPSN, a.SQPSN > maxPSN, "SQ_PSN %#x out of range (24 bits)", a.SQPSN},
		{AttrMaxQPRdAtomic, a.MaxRdAtomic > d.cfg.MaxRdAtomic, "MAX_QP_RD_ATOMIC %d out of range (at most max_qp_init_rd_atom, " + rdAtom + ")", a.MaxRdAtomic},
		{AttrMaxDestRdAtomic, a.MaxDestRdAtomic > d.cfg.MaxRdAtomic, "MAX_DEST_RD_ATOMIC %d out of range (at most max_qp_rd_atom, " + rdAtom + ")", a.MaxDestRdAtomic},
		{AttrMinRNRTimer, a.MinRNRTimer > maxTimer5, "MIN_RNR_TIMER %d out of range (5 bits)", a.MinRNRTimer},
		{AttrDestQPN, a.DestQPNum > maxQPN24, "DEST_QPN %#x out of range (24 bits)", a.DestQPNum},
		{AttrPathMigState, a.PathMigState > abi.MigArmed, "PATH_MIG_STATE %d: not a migration state (0 MIGRATED, 1 REARM, 2 ARMED)", a.PathMigState},
	}
	for _, c := range checks {
		if mask&c.bit != 0 && c.bad {
			return errorf(errInval, c.msg, c.arg)
		}
	}
	if mask&AttrAltPath != 0 {
		return errorf(errNotSup, "ALT_PATH: alternate paths (automatic path migration) are not implemented")
	}
	if mask&AttrPathMigState != 0 && a.PathMigState != abi.MigMigrated {
		name := "REARM"
		if a.PathMigState == abi.MigArmed {
			name = "ARMED"
		}
		return errorf(errNotSup, "PATH_MIG_STATE %s: needs an alternate path, which vrnic does not implement (only MIGRATED)", name)
	}
	if mask&AttrAV != 0 {
		if err := d.checkAH(&a.AHAttr); err != nil {
			// The AV's own errno (EINVAL, or ENODATA for an empty GID
			// entry), as ib_modify_qp passes on rdma_fill_sgid_attr's.
			return fmt.Errorf("AV: %w", err)
		}
	}
	return nil
}

// applyAttr stores the attributes of mask (the state word already holds
// next) and, with an address vector, the QP's path addresses.
func (d *Device) applyAttr(q *QP, next QPState, mask AttrMask, a *abi.QPAttr) {
	t := &q.attr
	if next == StateReset {
		// RESET returns the QP to its state after creation (IBTA 10.3.1:
		// the QP's attributes are reset to their initial values).
		*t = abi.QPAttr{PortNum: devicePort, Cap: t.Cap}
		q.local = netip.Addr{}
		return
	}
	if mask&AttrAccessFlags != 0 {
		t.QPAccessFlags = a.QPAccessFlags
	}
	if mask&AttrPKeyIndex != 0 {
		t.PKeyIndex = a.PKeyIndex
	}
	if mask&AttrPort != 0 {
		t.PortNum = a.PortNum
	}
	if mask&AttrQKey != 0 {
		t.QKey = a.QKey
	}
	if mask&AttrAV != 0 {
		t.AHAttr = a.AHAttr
		// checkAH made sure the source GID index is in the table.
		q.local = netip.AddrFrom16(d.cfg.Link.GIDs[a.AHAttr.SGIDIndex]).Unmap()
	}
	if mask&AttrPathMTU != 0 {
		t.PathMTU = a.PathMTU
	}
	if mask&AttrTimeout != 0 {
		t.Timeout = a.Timeout
	}
	if mask&AttrRetryCnt != 0 {
		t.RetryCnt = a.RetryCnt
	}
	if mask&AttrRNRRetry != 0 {
		t.RNRRetry = a.RNRRetry
	}
	if mask&AttrRQPSN != 0 {
		t.RQPSN = a.RQPSN
	}
	if mask&AttrSQPSN != 0 {
		t.SQPSN = a.SQPSN
	}
	if mask&AttrMaxQPRdAtomic != 0 {
		t.MaxRdAtomic = a.MaxRdAtomic
	}
	if mask&AttrMaxDestRdAtomic != 0 {
		t.MaxDestRdAtomic = a.MaxDestRdAtomic
	}
	if mask&AttrMinRNRTimer != 0 {
		t.MinRNRTimer = a.MinRNRTimer
	}
	if mask&AttrDestQPN != 0 {
		t.DestQPNum = a.DestQPNum
	}
	if mask&AttrEnSQDAsync != 0 {
		t.EnSQDAsyncNotify = a.EnSQDAsyncNotify
	}
	// Without a data path there is nothing to drain: SQD is reached with
	// the send queue already drained (sq_draining 0).
	t.SQDraining = 0
	t.QPState = next
	t.CurQPState = next
}
