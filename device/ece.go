package device

import "github.com/vrnic/vrnic/abi"

// Enhanced Connection Establishment (ECE, ABI 1.5): vrnic's own transport
// options of an RC or XRC QP (abi.ECEOptions: selective repeat, the
// adaptive retransmission timer), which the engine runs only on QPs whose
// peer agreed on them (vrnic_abi.h "Enhanced Connection Establishment").
// The device keeps a QP's options with its attributes and hands them to
// the data plane like the others; it does not negotiate them (the CM does,
// or the client over its own channel).

// AttrECE is MODIFY_QP's VRNIC_QP_ECE: the command's ece_options.
const AttrECE = AttrMask(abi.QPAttrECE)

// ECEOptions returns the ECE options the device supports: every option,
// or none when the operator switched ECE off (Config.NoECE).
func (d *Device) ECEOptions() uint32 {
	if d.cfg.NoECE {
		return 0
	}
	return abi.ECEOptions
}

// ECE returns the ECE options in force on the QP (abi.ECEOptions bits;
// 0 for none).
func (q *QP) ECE() uint32 { return q.ece }

// eceQPType reports whether ECE options apply to QPs of type t: the
// reliable connected ones.
func eceQPType(t QPType) bool {
	return t == QPTypeRC || t == abi.QPTXRCSend || t == abi.QPTXRCRecv
}

// checkECE validates the ECE part of a MODIFY_QP (the rest of the mask
// was checked): VRNIC_QP_ECE on an RC or XRC QP, moving from RESET to
// INIT, staying in INIT or moving to RTR, with known options the device
// supports.
func (d *Device) checkECE(q *QP, cur, next QPState, mask AttrMask, ece uint32) error {
	if mask&AttrECE == 0 {
		return nil
	}
	if !eceQPType(q.typ) {
		return errorf(errInval, "ECE on a %s QP: the ECE options apply to RC and XRC QPs only", q.typ.String())
	}
	if !(cur == StateReset && next == StateInit || cur == StateInit && (next == StateInit || next == StateRTR)) {
		return errorf(errInval, "ECE in %v -> %v: the ECE options are set in RESET -> INIT, INIT -> INIT or INIT -> RTR only", cur, next)
	}
	if unknown := ece &^ abi.ECEOptions; unknown != 0 {
		return errorf(errInval, "ece_options %#x: unknown bits %#x (the options are %#x: %s)", ece, unknown, abi.ECEOptions, abi.ECEString(abi.ECEOptions))
	}
	if off := ece &^ d.ECEOptions(); off != 0 {
		return errorf(errNotSup, "ECE option %s: switched off on this device (vrnicd -ece=false)", abi.ECEString(off))
	}
	return nil
}
