package cm

import (
	"fmt"
	"net/netip"
)

// GID is a 128-bit InfiniBand global identifier. On RoCE v2 it is the
// port's IP address: an IPv6 address, or an IPv4 address IPv4-mapped
// (::ffff:a.b.c.d), as Linux rdma_ip2gid builds it.
type GID [16]byte

// GIDFromIP returns the RoCE v2 GID of ip (IPv4 addresses IPv4-mapped).
func GIDFromIP(ip netip.Addr) GID { return GID(ip.As16()) }

// IP returns the address the GID stands for on RoCE v2: the IPv4 address
// of an IPv4-mapped GID, else the IPv6 address.
func (g GID) IP() netip.Addr { return netip.AddrFrom16(g).Unmap() }

func (g GID) String() string { return netip.AddrFrom16(g).String() }

// TransportType is the REQ's Transport Service Type.
type TransportType uint8

// Transport service types (IBTA Table 106; XRC is 3 with an extended
// transport type of 1).
const (
	TransportRC TransportType = 0
	TransportUC TransportType = 1
	TransportRD TransportType = 2
	// TransportExtended says the REQ's Extended Transport Type names the
	// service (1 = XRC).
	TransportExtended TransportType = 3
)

func (t TransportType) String() string {
	switch t {
	case TransportRC:
		return "RC"
	case TransportUC:
		return "UC"
	case TransportRD:
		return "RD"
	case TransportExtended:
		return "extended"
	}
	return fmt.Sprintf("TransportType(%d)", uint8(t))
}

// MsgType says which message an MRA or a REJ answers (enum
// cm_msg_response).
type MsgType uint8

// Messages an MRA or REJ refers to.
const (
	MsgREQ   MsgType = 0
	MsgREP   MsgType = 1
	MsgOther MsgType = 2
)

func (m MsgType) String() string {
	switch m {
	case MsgREQ:
		return "REQ"
	case MsgREP:
		return "REP"
	case MsgOther:
		return "other"
	}
	return fmt.Sprintf("MsgType(%d)", uint8(m))
}

// RejectReason is a REJ reason code (IBTA Table 109, Linux enum
// ib_cm_rej_reason).
type RejectReason uint16

// REJ reasons.
const (
	RejectNoQP                      RejectReason = 1
	RejectNoEEC                     RejectReason = 2
	RejectNoResources               RejectReason = 3
	RejectTimeout                   RejectReason = 4
	RejectUnsupported               RejectReason = 5
	RejectInvalidCommID             RejectReason = 6
	RejectInvalidCommInstance       RejectReason = 7
	RejectInvalidServiceID          RejectReason = 8
	RejectInvalidTransportType      RejectReason = 9
	RejectStaleConn                 RejectReason = 10
	RejectRDCNotExist               RejectReason = 11
	RejectInvalidGID                RejectReason = 12
	RejectInvalidLID                RejectReason = 13
	RejectInvalidSL                 RejectReason = 14
	RejectInvalidTrafficClass       RejectReason = 15
	RejectInvalidHopLimit           RejectReason = 16
	RejectInvalidPacketRate         RejectReason = 17
	RejectInvalidAltGID             RejectReason = 18
	RejectInvalidAltLID             RejectReason = 19
	RejectInvalidAltSL              RejectReason = 20
	RejectInvalidAltTrafficClass    RejectReason = 21
	RejectInvalidAltHopLimit        RejectReason = 22
	RejectInvalidAltPacketRate      RejectReason = 23
	RejectPortCMRedirect            RejectReason = 24
	RejectPortRedirect              RejectReason = 25
	RejectInvalidMTU                RejectReason = 26
	RejectInsufficientRespResources RejectReason = 27
	RejectConsumerDefined           RejectReason = 28
	RejectInvalidRNRRetry           RejectReason = 29
	RejectDuplicateLocalCommID      RejectReason = 30
	RejectInvalidClassVersion       RejectReason = 31
	RejectInvalidFlowLabel          RejectReason = 32
	RejectInvalidAltFlowLabel       RejectReason = 33
	RejectVendorOptionNotSupported  RejectReason = 35
)

var rejectNames = map[RejectReason]string{
	RejectNoQP: "no QP", RejectNoEEC: "no EEC", RejectNoResources: "no resources",
	RejectTimeout: "timeout", RejectUnsupported: "unsupported",
	RejectInvalidCommID: "invalid comm ID", RejectInvalidCommInstance: "invalid comm instance",
	RejectInvalidServiceID: "invalid service ID", RejectInvalidTransportType: "invalid transport type",
	RejectStaleConn: "stale conn", RejectRDCNotExist: "RDC not exist",
	RejectInvalidGID: "invalid GID", RejectInvalidLID: "invalid LID", RejectInvalidSL: "invalid SL",
	RejectInvalidTrafficClass: "invalid traffic class", RejectInvalidHopLimit: "invalid hop limit",
	RejectInvalidPacketRate: "invalid packet rate", RejectInvalidAltGID: "invalid alt GID",
	RejectInvalidAltLID: "invalid alt LID", RejectInvalidAltSL: "invalid alt SL",
	RejectInvalidAltTrafficClass: "invalid alt traffic class", RejectInvalidAltHopLimit: "invalid alt hop limit",
	RejectInvalidAltPacketRate: "invalid alt packet rate", RejectPortCMRedirect: "port CM redirect",
	RejectPortRedirect: "port redirect", RejectInvalidMTU: "invalid MTU",
	RejectInsufficientRespResources: "insufficient resp resources", RejectConsumerDefined: "consumer defined",
	RejectInvalidRNRRetry: "invalid RNR retry", RejectDuplicateLocalCommID: "duplicate local comm ID",
	RejectInvalidClassVersion: "invalid class version", RejectInvalidFlowLabel: "invalid flow label",
	RejectInvalidAltFlowLabel: "invalid alt flow label", RejectVendorOptionNotSupported: "vendor option not supported",
}

// String returns the reason as Linux ibcm_reject_msg words it.
func (r RejectReason) String() string {
	if s, ok := rejectNames[r]; ok {
		return s
	}
	return fmt.Sprintf("RejectReason(%d)", uint16(r))
}

// SIDRStatus is the status of a SIDR_REP (IBTA Table 121, enum
// ib_cm_sidr_status).
type SIDRStatus uint8

// SIDR_REP statuses.
const (
	SIDRSuccess            SIDRStatus = 0
	SIDRUnsupported        SIDRStatus = 1 // service ID not supported
	SIDRReject             SIDRStatus = 2 // rejected by the service
	SIDRNoQP               SIDRStatus = 3 // no QP available
	SIDRRedirect           SIDRStatus = 4 // redirect (GID in the additional information)
	SIDRUnsupportedVersion SIDRStatus = 5 // class version not supported
)

func (s SIDRStatus) String() string {
	switch s {
	case SIDRSuccess:
		return "success"
	case SIDRUnsupported:
		return "unsupported"
	case SIDRReject:
		return "reject"
	case SIDRNoQP:
		return "no QP"
	case SIDRRedirect:
		return "redirect"
	case SIDRUnsupportedVersion:
		return "unsupported version"
	}
	return fmt.Sprintf("SIDRStatus(%d)", uint8(s))
}
