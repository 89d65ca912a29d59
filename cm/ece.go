package cm

import "github.com/vrnic/vrnic/abi"

// Enhanced Connection Establishment (ECE): vrnic's own transport options
// of an RC connection (abi.ECEOptions), agreed in the REQ and REP as
// Linux's CM carries struct ib_cm_ece (drivers/infiniband/core/cm.c,
// cm_format_req, cm_format_rep, cm_format_mad_ece_hdr): the vendor ID in
// the message's Vendor ID field (REQ: 24 bits at byte 5; REP: three
// bytes, at 15, 19 and 23) and the options in the MAD header's attribute
// modifier.
//
//	active (Connect: ConnectParams.ECE)        passive (Listen)
//	REQ  Vendor ID 0x1ded, AttrMod = offer ──►
//	                                           agreed = offer ∩ Config.ECE
//	                                           (none: another vendor ID,
//	                                           no ECE, UC)
//	                                           Accept: AcceptParams.ECE, the
//	                                           options the QP took
//	     ◄── REP  Vendor ID 0x1ded, AttrMod = agreed ∩ AcceptParams.ECE
//	                                           (no ECE at all when that is
//	                                           none: the REP without ECE)
//	agreed = REP's options ∩ offer
//	(none: another vendor ID, no ECE)
//
// Each side's QPAttr(RTR) carries its agreed options (QPAttr.ECE). A REQ
// without ECE (every Linux peer's: Linux sends one only for a provider
// with ECE, mlx5, and then with its own vendor ID) gets the REP it got
// before ECE existed, byte for byte; a peer's REP that carries no ECE, or
// another vendor's, agrees on none.

// ECE is the ECE a REQ or REP carries.
type ECE struct {
	// VendorID is the message's Vendor ID field (24 bits); 0: none.
	VendorID uint32
	// Options is the MAD header's attribute modifier.
	Options uint32
}

// vrnicECE reports the options of e if it is vrnic's (abi.ECEVendorID),
// else 0.
func vrnicECE(e ECE) uint32 {
	if e.VendorID != abi.ECEVendorID {
		return 0
	}
	return e.Options & abi.ECEOptions
}

// ConnECE returns the ECE options agreed on connection id (so far: on the
// passive side before Accept, those of the REQ this side supports).
func (m *Manager) ConnECE(id ConnID) uint32 {
	if c := m.conns[uint32(id)]; c != nil {
		return c.ece
	}
	return 0
}
