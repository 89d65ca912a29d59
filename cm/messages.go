package cm

import "github.com/vrnic/vrnic/roce"

// The CM messages. Field positions are those of IBTA vol. 1 chapter 12
// (Tables 106 to 121) as Linux encodes them (include/rdma/ibta_vol1_c12.h),
// written fld(name, byte, bit, width): byte offset in the CM data (after the
// 24-byte MAD header), bit offset from that byte's most significant bit,
// width in bits. Private data sizes are fixed per message.

// Private data sizes (IB_CM_*_PRIVATE_DATA_SIZE).
const (
	REQPrivateDataLen     = 92
	MRAPrivateDataLen     = 222
	REJPrivateDataLen     = 148
	REPPrivateDataLen     = 196
	RTUPrivateDataLen     = 224
	DREQPrivateDataLen    = 220
	DREPPrivateDataLen    = 224
	SIDRReqPrivateDataLen = 216
	SIDRRepPrivateDataLen = 136
	// ARILen is the room for a REJ's additional reject information and a
	// SIDR_REP's additional information.
	ARILen = 72
	// PermissiveLID is the LID a RoCE REQ carries (IB_LID_PERMISSIVE).
	PermissiveLID = 0xffff
)

// Path is the primary or alternate path of a REQ.
type Path struct {
	LocalLID, RemoteLID uint16
	LocalGID, RemoteGID GID
	FlowLabel           uint32 // 20 bits
	PacketRate          uint8  // 6 bits, enum ib_rate
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8 // 4 bits
	SubnetLocal         bool
	LocalACKTimeout     uint8 // 5 bits: 4.096 µs × 2^t
}

// pathFields are a REQ path's fields at base (52 primary, 96 alternate).
type pathFields struct {
	localLID, remoteLID, flowLabel, rate, tclass, hopLimit, sl, subnetLocal, ackTimeout field
	localGID, remoteGID                                                                 int
}

func mkPath(base int) pathFields {
	return pathFields{
		localLID:    fld("LocalPortLID", base, 0, 16),
		remoteLID:   fld("RemotePortLID", base+2, 0, 16),
		localGID:    base + 4,
		remoteGID:   base + 20,
		flowLabel:   fld("FlowLabel", base+36, 0, 20),
		rate:        fld("PacketRate", base+39, 2, 6),
		tclass:      fld("TrafficClass", base+40, 0, 8),
		hopLimit:    fld("HopLimit", base+41, 0, 8),
		sl:          fld("SL", base+42, 0, 4),
		subnetLocal: fld("SubnetLocal", base+42, 4, 1),
		ackTimeout:  fld("LocalACKTimeout", base+43, 0, 5),
	}
}

var (
	reqPrimary   = mkPath(52)
	reqAlternate = mkPath(96)
)

func (p *Path) encode(e *encoder, pf *pathFields) {
	e.put(pf.localLID, uint64(p.LocalLID))
	e.put(pf.remoteLID, uint64(p.RemoteLID))
	e.bytes(pf.localGID, p.LocalGID[:])
	e.bytes(pf.remoteGID, p.RemoteGID[:])
	e.put(pf.flowLabel, uint64(p.FlowLabel))
	e.put(pf.rate, uint64(p.PacketRate))
	e.put(pf.tclass, uint64(p.TrafficClass))
	e.put(pf.hopLimit, uint64(p.HopLimit))
	e.put(pf.sl, uint64(p.SL))
	e.bool(pf.subnetLocal, p.SubnetLocal)
	e.put(pf.ackTimeout, uint64(p.LocalACKTimeout))
}

func (p *Path) decode(d *decoder, pf *pathFields) {
	p.LocalLID = uint16(d.get(pf.localLID))
	p.RemoteLID = uint16(d.get(pf.remoteLID))
	d.bytes(pf.localGID, p.LocalGID[:])
	d.bytes(pf.remoteGID, p.RemoteGID[:])
	p.FlowLabel = uint32(d.get(pf.flowLabel))
	p.PacketRate = uint8(d.get(pf.rate))
	p.TrafficClass = uint8(d.get(pf.tclass))
	p.HopLimit = uint8(d.get(pf.hopLimit))
	p.SL = uint8(d.get(pf.sl))
	p.SubnetLocal = d.bool(pf.subnetLocal)
	p.LocalACKTimeout = uint8(d.get(pf.ackTimeout))
}

// REQ is a connection request (IBTA Table 106).
type REQ struct {
	LocalCommID             uint32
	VendorID                uint32 // 24 bits (ECE)
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                uint32 // 24 bits
	ResponderResources      uint8
	LocalEECN               uint32 // 24 bits
	InitiatorDepth          uint8
	RemoteEECN              uint32 // 24 bits
	RemoteCMResponseTimeout uint8  // 5 bits
	TransportServiceType    TransportType
	EndToEndFlowControl     bool
	StartingPSN             uint32 // 24 bits
	LocalCMResponseTimeout  uint8  // 5 bits
	RetryCount              uint8  // 3 bits
	PKey                    uint16
	PathMTU                 roce.MTU // 4 bits
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtendedTransportType   uint8 // 3 bits
	Primary                 Path
	Alternate               Path
	SAPSupported            bool
	PrivateData             [REQPrivateDataLen]byte
}

var (
	reqLocalCommID     = fld("LocalCommID", 0, 0, 32)
	reqVendorID        = fld("VendorID", 5, 0, 24)
	reqServiceID       = fld("ServiceID", 8, 0, 64)
	reqLocalCAGUID     = fld("LocalCAGUID", 16, 0, 64)
	reqLocalQKey       = fld("LocalQKey", 28, 0, 32)
	reqLocalQPN        = fld("LocalQPN", 32, 0, 24)
	reqRespResources   = fld("ResponderResources", 35, 0, 8)
	reqLocalEECN       = fld("LocalEECN", 36, 0, 24)
	reqInitDepth       = fld("InitiatorDepth", 39, 0, 8)
	reqRemoteEECN      = fld("RemoteEECN", 40, 0, 24)
	reqRemoteRespTO    = fld("RemoteCMResponseTimeout", 43, 0, 5)
	reqTransport       = fld("TransportServiceType", 43, 5, 2)
	reqE2EFlowCtl      = fld("EndToEndFlowControl", 43, 7, 1)
	reqStartingPSN     = fld("StartingPSN", 44, 0, 24)
	reqLocalRespTO     = fld("LocalCMResponseTimeout", 47, 0, 5)
	reqRetryCount      = fld("RetryCount", 47, 5, 3)
	reqPKey            = fld("PKey", 48, 0, 16)
	reqPathMTU         = fld("PathMTU", 50, 0, 4)
	reqRDCExists       = fld("RDCExists", 50, 4, 1)
	reqRNRRetry        = fld("RNRRetryCount", 50, 5, 3)
	reqMaxCMRetries    = fld("MaxCMRetries", 51, 0, 4)
	reqSRQ             = fld("SRQ", 51, 4, 1)
	reqExtTransport    = fld("ExtendedTransportType", 51, 5, 3)
	reqSAPSupported    = fld("SAPSupported", 139, 5, 1)
	reqPrivateDataOff  = 140
	mraPrivateDataOff  = 10
	rejARIOff          = 12
	rejPrivateDataOff  = 84
	repPrivateDataOff  = 36
	rtuPrivateDataOff  = 8
	dreqPrivateDataOff = 12
	drepPrivateDataOff = 8
	sreqPrivateDataOff = 16
	srepInfoOff        = 24
	srepPrivateDataOff = 96
)

// Attr returns AttrREQ.
func (*REQ) Attr() AttrID { return AttrREQ }

func (m *REQ) encode(e *encoder) {
	e.put(reqLocalCommID, uint64(m.LocalCommID))
	e.put(reqVendorID, uint64(m.VendorID))
	e.put(reqServiceID, m.ServiceID)
	e.put(reqLocalCAGUID, m.LocalCAGUID)
	e.put(reqLocalQKey, uint64(m.LocalQKey))
	e.put(reqLocalQPN, uint64(m.LocalQPN))
	e.put(reqRespResources, uint64(m.ResponderResources))
	e.put(reqLocalEECN, uint64(m.LocalEECN))
	e.put(reqInitDepth, uint64(m.InitiatorDepth))
	e.put(reqRemoteEECN, uint64(m.RemoteEECN))
	e.put(reqRemoteRespTO, uint64(m.RemoteCMResponseTimeout))
	e.put(reqTransport, uint64(m.TransportServiceType))
	e.bool(reqE2EFlowCtl, m.EndToEndFlowControl)
	e.put(reqStartingPSN, uint64(m.StartingPSN))
	e.put(reqLocalRespTO, uint64(m.LocalCMResponseTimeout))
	e.put(reqRetryCount, uint64(m.RetryCount))
	e.put(reqPKey, uint64(m.PKey))
	e.put(reqPathMTU, uint64(m.PathMTU))
	e.bool(reqRDCExists, m.RDCExists)
	e.put(reqRNRRetry, uint64(m.RNRRetryCount))
	e.put(reqMaxCMRetries, uint64(m.MaxCMRetries))
	e.bool(reqSRQ, m.SRQ)
	e.put(reqExtTransport, uint64(m.ExtendedTransportType))
	m.Primary.encode(e, &reqPrimary)
	m.Alternate.encode(e, &reqAlternate)
	e.bool(reqSAPSupported, m.SAPSupported)
	e.bytes(reqPrivateDataOff, m.PrivateData[:])
}

func (m *REQ) decode(d *decoder) {
	m.LocalCommID = uint32(d.get(reqLocalCommID))
	m.VendorID = uint32(d.get(reqVendorID))
	m.ServiceID = d.get(reqServiceID)
	m.LocalCAGUID = d.get(reqLocalCAGUID)
	m.LocalQKey = uint32(d.get(reqLocalQKey))
	m.LocalQPN = uint32(d.get(reqLocalQPN))
	m.ResponderResources = uint8(d.get(reqRespResources))
	m.LocalEECN = uint32(d.get(reqLocalEECN))
	m.InitiatorDepth = uint8(d.get(reqInitDepth))
	m.RemoteEECN = uint32(d.get(reqRemoteEECN))
	m.RemoteCMResponseTimeout = uint8(d.get(reqRemoteRespTO))
	m.TransportServiceType = TransportType(d.get(reqTransport))
	m.EndToEndFlowControl = d.bool(reqE2EFlowCtl)
	m.StartingPSN = uint32(d.get(reqStartingPSN))
	m.LocalCMResponseTimeout = uint8(d.get(reqLocalRespTO))
	m.RetryCount = uint8(d.get(reqRetryCount))
	m.PKey = uint16(d.get(reqPKey))
	m.PathMTU = roce.MTU(d.get(reqPathMTU))
	m.RDCExists = d.bool(reqRDCExists)
	m.RNRRetryCount = uint8(d.get(reqRNRRetry))
	m.MaxCMRetries = uint8(d.get(reqMaxCMRetries))
	m.SRQ = d.bool(reqSRQ)
	m.ExtendedTransportType = uint8(d.get(reqExtTransport))
	m.Primary.decode(d, &reqPrimary)
	m.Alternate.decode(d, &reqAlternate)
	m.SAPSupported = d.bool(reqSAPSupported)
	d.bytes(reqPrivateDataOff, m.PrivateData[:])
	if !m.PathMTU.Valid() {
		d.fail("REQ path MTU code %d", m.PathMTU)
	}
}

// HasAlternatePath reports whether the REQ carries an alternate path
// (Linux cm_req_has_alt_path: a nonzero alternate local LID).
func (m *REQ) HasAlternatePath() bool { return m.Alternate.LocalLID != 0 }

// MRA is a message receipt acknowledgement (IBTA Table 107).
type MRA struct {
	LocalCommID    uint32
	RemoteCommID   uint32
	MessageMRAed   MsgType // 2 bits
	ServiceTimeout uint8   // 5 bits
	PrivateData    [MRAPrivateDataLen]byte
}

var (
	mraLocalCommID  = fld("LocalCommID", 0, 0, 32)
	mraRemoteCommID = fld("RemoteCommID", 4, 0, 32)
	mraMessageMRAed = fld("MessageMRAed", 8, 0, 2)
	mraServiceTO    = fld("ServiceTimeout", 9, 0, 5)
)

// Attr returns AttrMRA.
func (*MRA) Attr() AttrID { return AttrMRA }

func (m *MRA) encode(e *encoder) {
	e.put(mraLocalCommID, uint64(m.LocalCommID))
	e.put(mraRemoteCommID, uint64(m.RemoteCommID))
	e.put(mraMessageMRAed, uint64(m.MessageMRAed))
	e.put(mraServiceTO, uint64(m.ServiceTimeout))
	e.bytes(mraPrivateDataOff, m.PrivateData[:])
}

func (m *MRA) decode(d *decoder) {
	m.LocalCommID = uint32(d.get(mraLocalCommID))
	m.RemoteCommID = uint32(d.get(mraRemoteCommID))
	m.MessageMRAed = MsgType(d.get(mraMessageMRAed))
	m.ServiceTimeout = uint8(d.get(mraServiceTO))
	d.bytes(mraPrivateDataOff, m.PrivateData[:])
	if m.MessageMRAed > MsgOther {
		d.fail("MRA message MRAed %d", m.MessageMRAed)
	}
}

// REJ is a reject (IBTA Table 108).
type REJ struct {
	LocalCommID     uint32
	RemoteCommID    uint32
	MessageRejected MsgType // 2 bits
	RejectInfoLen   uint8   // 7 bits, bytes of ARI used
	Reason          RejectReason
	ARI             [ARILen]byte
	PrivateData     [REJPrivateDataLen]byte
}

var (
	rejLocalCommID  = fld("LocalCommID", 0, 0, 32)
	rejRemoteCommID = fld("RemoteCommID", 4, 0, 32)
	rejMsgRejected  = fld("MessageRejected", 8, 0, 2)
	rejInfoLen      = fld("RejectedInfoLength", 9, 0, 7)
	rejReason       = fld("Reason", 10, 0, 16)
)

// Attr returns AttrREJ.
func (*REJ) Attr() AttrID { return AttrREJ }

func (m *REJ) encode(e *encoder) {
	e.put(rejLocalCommID, uint64(m.LocalCommID))
	e.put(rejRemoteCommID, uint64(m.RemoteCommID))
	e.put(rejMsgRejected, uint64(m.MessageRejected))
	e.put(rejInfoLen, uint64(m.RejectInfoLen))
	e.put(rejReason, uint64(m.Reason))
	e.bytes(rejARIOff, m.ARI[:])
	e.bytes(rejPrivateDataOff, m.PrivateData[:])
	if m.RejectInfoLen > ARILen && e.err == nil {
		e.err = ErrFieldRange
	}
}

func (m *REJ) decode(d *decoder) {
	m.LocalCommID = uint32(d.get(rejLocalCommID))
	m.RemoteCommID = uint32(d.get(rejRemoteCommID))
	m.MessageRejected = MsgType(d.get(rejMsgRejected))
	m.RejectInfoLen = uint8(d.get(rejInfoLen))
	m.Reason = RejectReason(d.get(rejReason))
	d.bytes(rejARIOff, m.ARI[:])
	d.bytes(rejPrivateDataOff, m.PrivateData[:])
	switch {
	case m.MessageRejected > MsgOther:
		d.fail("REJ message rejected %d", m.MessageRejected)
	case m.RejectInfoLen > ARILen:
		d.fail("REJ rejected info length %d", m.RejectInfoLen)
	case m.Reason == 0:
		d.fail("REJ reason 0")
	}
}

// REP is a reply to a connection request (IBTA Table 110).
type REP struct {
	LocalCommID         uint32
	RemoteCommID        uint32
	LocalQKey           uint32
	LocalQPN            uint32 // 24 bits
	VendorID            uint32 // 24 bits (ECE), spread over three bytes
	LocalEECN           uint32 // 24 bits
	StartingPSN         uint32 // 24 bits
	ResponderResources  uint8
	InitiatorDepth      uint8
	TargetACKDelay      uint8 // 5 bits
	FailoverAccepted    uint8 // 2 bits
	EndToEndFlowControl bool
	RNRRetryCount       uint8 // 3 bits
	SRQ                 bool
	LocalCAGUID         uint64
	PrivateData         [REPPrivateDataLen]byte
}

var (
	repLocalCommID  = fld("LocalCommID", 0, 0, 32)
	repRemoteCommID = fld("RemoteCommID", 4, 0, 32)
	repLocalQKey    = fld("LocalQKey", 8, 0, 32)
	repLocalQPN     = fld("LocalQPN", 12, 0, 24)
	repVendorIDH    = fld("VendorID", 15, 0, 8)
	repLocalEECN    = fld("LocalEECN", 16, 0, 24)
	repVendorIDM    = fld("VendorID", 19, 0, 8)
	repStartingPSN  = fld("StartingPSN", 20, 0, 24)
	repVendorIDL    = fld("VendorID", 23, 0, 8)
	repRespRes      = fld("ResponderResources", 24, 0, 8)
	repInitDepth    = fld("InitiatorDepth", 25, 0, 8)
	repTargetACK    = fld("TargetACKDelay", 26, 0, 5)
	repFailover     = fld("FailoverAccepted", 26, 5, 2)
	repE2EFlowCtl   = fld("EndToEndFlowControl", 26, 7, 1)
	repRNRRetry     = fld("RNRRetryCount", 27, 0, 3)
	repSRQ          = fld("SRQ", 27, 3, 1)
	repLocalCAGUID  = fld("LocalCAGUID", 28, 0, 64)
)

// Attr returns AttrREP.
func (*REP) Attr() AttrID { return AttrREP }

func (m *REP) encode(e *encoder) {
	e.put(repLocalCommID, uint64(m.LocalCommID))
	e.put(repRemoteCommID, uint64(m.RemoteCommID))
	e.put(repLocalQKey, uint64(m.LocalQKey))
	e.put(repLocalQPN, uint64(m.LocalQPN))
	if m.VendorID>>24 != 0 && e.err == nil {
		e.err = ErrFieldRange
	}
	e.put(repVendorIDH, uint64(m.VendorID>>16&0xff))
	e.put(repLocalEECN, uint64(m.LocalEECN))
	e.put(repVendorIDM, uint64(m.VendorID>>8&0xff))
	e.put(repStartingPSN, uint64(m.StartingPSN))
	e.put(repVendorIDL, uint64(m.VendorID&0xff))
	e.put(repRespRes, uint64(m.ResponderResources))
	e.put(repInitDepth, uint64(m.InitiatorDepth))
	e.put(repTargetACK, uint64(m.TargetACKDelay))
	e.put(repFailover, uint64(m.FailoverAccepted))
	e.bool(repE2EFlowCtl, m.EndToEndFlowControl)
	e.put(repRNRRetry, uint64(m.RNRRetryCount))
	e.bool(repSRQ, m.SRQ)
	e.put(repLocalCAGUID, m.LocalCAGUID)
	e.bytes(repPrivateDataOff, m.PrivateData[:])
}

func (m *REP) decode(d *decoder) {
	m.LocalCommID = uint32(d.get(repLocalCommID))
	m.RemoteCommID = uint32(d.get(repRemoteCommID))
	m.LocalQKey = uint32(d.get(repLocalQKey))
	m.LocalQPN = uint32(d.get(repLocalQPN))
	m.VendorID = uint32(d.get(repVendorIDH)<<16 | d.get(repVendorIDM)<<8 | d.get(repVendorIDL))
	m.LocalEECN = uint32(d.get(repLocalEECN))
	m.StartingPSN = uint32(d.get(repStartingPSN))
	m.ResponderResources = uint8(d.get(repRespRes))
	m.InitiatorDepth = uint8(d.get(repInitDepth))
	m.TargetACKDelay = uint8(d.get(repTargetACK))
	m.FailoverAccepted = uint8(d.get(repFailover))
	m.EndToEndFlowControl = d.bool(repE2EFlowCtl)
	m.RNRRetryCount = uint8(d.get(repRNRRetry))
	m.SRQ = d.bool(repSRQ)
	m.LocalCAGUID = d.get(repLocalCAGUID)
	d.bytes(repPrivateDataOff, m.PrivateData[:])
}

// RTU is ready to use (IBTA Table 111).
type RTU struct {
	LocalCommID  uint32
	RemoteCommID uint32
	PrivateData  [RTUPrivateDataLen]byte
}

var (
	commLocal  = fld("LocalCommID", 0, 0, 32)
	commRemote = fld("RemoteCommID", 4, 0, 32)
)

// Attr returns AttrRTU.
func (*RTU) Attr() AttrID { return AttrRTU }

func (m *RTU) encode(e *encoder) {
	e.put(commLocal, uint64(m.LocalCommID))
	e.put(commRemote, uint64(m.RemoteCommID))
	e.bytes(rtuPrivateDataOff, m.PrivateData[:])
}

func (m *RTU) decode(d *decoder) {
	m.LocalCommID = uint32(d.get(commLocal))
	m.RemoteCommID = uint32(d.get(commRemote))
	d.bytes(rtuPrivateDataOff, m.PrivateData[:])
}

// DREQ is a disconnection request (IBTA Table 112).
type DREQ struct {
	LocalCommID  uint32
	RemoteCommID uint32
	RemoteQPN    uint32 // 24 bits: the receiver's QPN
	PrivateData  [DREQPrivateDataLen]byte
}

var dreqRemoteQPN = fld("RemoteQPN", 8, 0, 24)

// Attr returns AttrDREQ.
func (*DREQ) Attr() AttrID { return AttrDREQ }

func (m *DREQ) encode(e *encoder) {
	e.put(commLocal, uint64(m.LocalCommID))
	e.put(commRemote, uint64(m.RemoteCommID))
	e.put(dreqRemoteQPN, uint64(m.RemoteQPN))
	e.bytes(dreqPrivateDataOff, m.PrivateData[:])
}

func (m *DREQ) decode(d *decoder) {
	m.LocalCommID = uint32(d.get(commLocal))
	m.RemoteCommID = uint32(d.get(commRemote))
	m.RemoteQPN = uint32(d.get(dreqRemoteQPN))
	d.bytes(dreqPrivateDataOff, m.PrivateData[:])
}

// DREP is a reply to a disconnection request (IBTA Table 113).
type DREP struct {
	LocalCommID  uint32
	RemoteCommID uint32
	PrivateData  [DREPPrivateDataLen]byte
}

// Attr returns AttrDREP.
func (*DREP) Attr() AttrID { return AttrDREP }

func (m *DREP) encode(e *encoder) {
	e.put(commLocal, uint64(m.LocalCommID))
	e.put(commRemote, uint64(m.RemoteCommID))
	e.bytes(drepPrivateDataOff, m.PrivateData[:])
}

func (m *DREP) decode(d *decoder) {
	m.LocalCommID = uint32(d.get(commLocal))
	m.RemoteCommID = uint32(d.get(commRemote))
	d.bytes(drepPrivateDataOff, m.PrivateData[:])
}

// SIDRReq is a service ID resolution request (IBTA Table 119).
type SIDRReq struct {
	RequestID   uint32
	PKey        uint16
	ServiceID   uint64
	PrivateData [SIDRReqPrivateDataLen]byte
}

var (
	sreqRequestID = fld("RequestID", 0, 0, 32)
	sreqPKey      = fld("PKey", 4, 0, 16)
	sreqServiceID = fld("ServiceID", 8, 0, 64)
)

// Attr returns AttrSIDRREQ.
func (*SIDRReq) Attr() AttrID { return AttrSIDRREQ }

func (m *SIDRReq) encode(e *encoder) {
	e.put(sreqRequestID, uint64(m.RequestID))
	e.put(sreqPKey, uint64(m.PKey))
	e.put(sreqServiceID, m.ServiceID)
	e.bytes(sreqPrivateDataOff, m.PrivateData[:])
}

func (m *SIDRReq) decode(d *decoder) {
	m.RequestID = uint32(d.get(sreqRequestID))
	m.PKey = uint16(d.get(sreqPKey))
	m.ServiceID = d.get(sreqServiceID)
	d.bytes(sreqPrivateDataOff, m.PrivateData[:])
}

// SIDRRep is a service ID resolution reply (IBTA Table 120).
type SIDRRep struct {
	RequestID   uint32
	Status      SIDRStatus
	InfoLen     uint8  // bytes of Info used
	VendorID    uint32 // 24 bits (ECE)
	QPN         uint32 // 24 bits
	ServiceID   uint64
	QKey        uint32
	Info        [ARILen]byte
	PrivateData [SIDRRepPrivateDataLen]byte
}

var (
	srepRequestID = fld("RequestID", 0, 0, 32)
	srepStatus    = fld("Status", 4, 0, 8)
	srepInfoLen   = fld("AdditionalInformationLength", 5, 0, 8)
	srepVendorIDH = fld("VendorID", 6, 0, 16)
	srepQPN       = fld("QPN", 8, 0, 24)
	srepVendorIDL = fld("VendorID", 11, 0, 8)
	srepServiceID = fld("ServiceID", 12, 0, 64)
	srepQKey      = fld("QKey", 20, 0, 32)
)

// Attr returns AttrSIDRREP.
func (*SIDRRep) Attr() AttrID { return AttrSIDRREP }

func (m *SIDRRep) encode(e *encoder) {
	e.put(srepRequestID, uint64(m.RequestID))
	e.put(srepStatus, uint64(m.Status))
	e.put(srepInfoLen, uint64(m.InfoLen))
	if m.VendorID>>24 != 0 && e.err == nil {
		e.err = ErrFieldRange
	}
	e.put(srepVendorIDH, uint64(m.VendorID>>8&0xffff))
	e.put(srepQPN, uint64(m.QPN))
	e.put(srepVendorIDL, uint64(m.VendorID&0xff))
	e.put(srepServiceID, m.ServiceID)
	e.put(srepQKey, uint64(m.QKey))
	e.bytes(srepInfoOff, m.Info[:])
	e.bytes(srepPrivateDataOff, m.PrivateData[:])
	if m.InfoLen > ARILen && e.err == nil {
		e.err = ErrFieldRange
	}
}

func (m *SIDRRep) decode(d *decoder) {
	m.RequestID = uint32(d.get(srepRequestID))
	m.Status = SIDRStatus(d.get(srepStatus))
	m.InfoLen = uint8(d.get(srepInfoLen))
	m.VendorID = uint32(d.get(srepVendorIDH)<<8 | d.get(srepVendorIDL))
	m.QPN = uint32(d.get(srepQPN))
	m.ServiceID = d.get(srepServiceID)
	m.QKey = uint32(d.get(srepQKey))
	d.bytes(srepInfoOff, m.Info[:])
	d.bytes(srepPrivateDataOff, m.PrivateData[:])
	switch {
	case m.Status > SIDRUnsupportedVersion:
		d.fail("SIDR_REP status %d", m.Status)
	case m.InfoLen > ARILen:
		d.fail("SIDR_REP additional information length %d", m.InfoLen)
	}
}
