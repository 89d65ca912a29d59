package abi

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Control-path structs. Field tags name the C field; a test checks every
// field's offset and size against the header. Marshal and Unmarshal encode
// them (encoding/binary, little-endian); they are not on the data path.

// MsgHdr is struct vrnic_msg_hdr, the first 16 bytes of every datagram.
type MsgHdr struct {
	Opcode Cmd    `c:"opcode"`
	Flags  uint16 `c:"flags"`
	Length uint32 `c:"length"` // bytes in the datagram, header included
	Seq    uint32 `c:"seq"`
	Status uint32 `c:"status"` // replies: 0 or a positive errno value
}

// CmdOpenContextReq is struct vrnic_cmd_open_context.
type CmdOpenContextReq struct {
	ABIVersion uint32   `c:"abi_version"`
	Flags      uint32   `c:"flags"`
	ClientName [32]byte `c:"client_name"`
}

// RespOpenContext is struct vrnic_resp_open_context.
type RespOpenContext struct {
	ABIVersion uint32 `c:"abi_version"`
	CtxHandle  uint32 `c:"ctx_handle"`
	DBPageSize uint32 `c:"db_page_size"`
	DBRecords  uint32 `c:"db_records"`
}

// DeviceAttr is struct vrnic_device_attr (QUERY_DEVICE reply).
type DeviceAttr struct {
	FWVer           [32]byte `c:"fw_ver"`
	NodeGUID        uint64   `c:"node_guid"`
	SysImageGUID    uint64   `c:"sys_image_guid"`
	MaxMRSize       uint64   `c:"max_mr_size"`
	PageSizeCap     uint64   `c:"page_size_cap"`
	VendorID        uint32   `c:"vendor_id"`
	VendorPartID    uint32   `c:"vendor_part_id"`
	HWVer           uint32   `c:"hw_ver"`
	MaxQP           uint32   `c:"max_qp"`
	MaxQPWR         uint32   `c:"max_qp_wr"`
	DeviceCapFlags  uint32   `c:"device_cap_flags"`
	MaxSGE          uint32   `c:"max_sge"`
	MaxInline       uint32   `c:"max_inline"`
	MaxCQ           uint32   `c:"max_cq"`
	MaxCQE          uint32   `c:"max_cqe"`
	MaxMR           uint32   `c:"max_mr"`
	MaxPD           uint32   `c:"max_pd"`
	MaxQPRdAtom     uint32   `c:"max_qp_rd_atom"`
	MaxQPInitRdAtom uint32   `c:"max_qp_init_rd_atom"`
	MaxSRQ          uint32   `c:"max_srq"`
	MaxSRQWR        uint32   `c:"max_srq_wr"`
	MaxSRQSGE       uint32   `c:"max_srq_sge"`
	MaxAH           uint32   `c:"max_ah"`
	MaxHostMem      uint32   `c:"max_host_mem"`
	NumWorkers      uint32   `c:"num_workers"`
	AtomicCap       uint8    `c:"atomic_cap"`
	PhysPortCnt     uint8    `c:"phys_port_cnt"`
	PlacementCaps   uint8    `c:"placement_caps"` // ABI 1.4: PlacementCaps bits
	Reserved        [1]byte  `c:"reserved"`
	MaxMW           uint32   `c:"max_mw"` // ABI 1.4
}

// CmdQueryPortReq is struct vrnic_cmd_query_port.
type CmdQueryPortReq struct {
	PortNum  uint32 `c:"port_num"`
	Reserved uint32 `c:"reserved"`
}

// PortAttr is struct vrnic_port_attr (QUERY_PORT reply).
type PortAttr struct {
	State           uint32   `c:"state"`
	MaxMTU          MTU      `c:"max_mtu"`
	ActiveMTU       MTU      `c:"active_mtu"`
	GIDTblLen       uint32   `c:"gid_tbl_len"`
	MaxMsgSz        uint32   `c:"max_msg_sz"`
	LinkLayer       uint32   `c:"link_layer"`
	LinkType        LinkType `c:"link_type"`
	Reserved        uint32   `c:"reserved"`
	MAC             [6]byte  `c:"mac"`
	Reserved2       [2]byte  `c:"reserved2"`
	ActiveSpeedMbps uint64   `c:"active_speed_mbps"`
}

// CmdQueryGIDReq is struct vrnic_cmd_query_gid.
type CmdQueryGIDReq struct {
	PortNum uint32 `c:"port_num"`
	Index   uint32 `c:"index"`
}

// RespQueryGID is struct vrnic_resp_query_gid.
type RespQueryGID struct {
	GID     [16]byte `c:"gid"`
	GIDType uint32   `c:"gid_type"`
	Valid   uint32   `c:"valid"`
}

// CmdAddHostMemReq is struct vrnic_cmd_add_host_mem (one fd attached).
type CmdAddHostMemReq struct {
	Length   uint64 `c:"length"`
	Flags    uint32 `c:"flags"`
	Reserved uint32 `c:"reserved"`
}

// RespAddHostMem is struct vrnic_resp_add_host_mem.
type RespAddHostMem struct {
	PABase uint64 `c:"pa_base"`
	Handle uint32 `c:"handle"`
	Locked uint32 `c:"locked"`
}

// CmdHandleReq is struct vrnic_cmd_handle (commands taking one handle).
type CmdHandleReq struct {
	Handle   uint32 `c:"handle"`
	Reserved uint32 `c:"reserved"`
}

// RespAllocPD is struct vrnic_resp_alloc_pd.
type RespAllocPD struct {
	PDHandle uint32 `c:"pd_handle"`
	Reserved uint32 `c:"reserved"`
}

// CmdRegMRReq is struct vrnic_cmd_reg_mr. With PBLPA == 0, NPages u64
// physical addresses follow it in the datagram.
type CmdRegMRReq struct {
	IOVA      uint64 `c:"iova"`
	Length    uint64 `c:"length"`
	PBLPA     uint64 `c:"pbl_pa"`
	PDHandle  uint32 `c:"pd_handle"`
	Access    uint32 `c:"access"`
	PageShift uint32 `c:"page_shift"`
	NPages    uint32 `c:"npages"`
}

// RespRegMR is struct vrnic_resp_reg_mr.
type RespRegMR struct {
	MRHandle uint32 `c:"mr_handle"`
	LKey     uint32 `c:"lkey"`
	RKey     uint32 `c:"rkey"`
	Reserved uint32 `c:"reserved"`
}

// CmdCreateCQReq is struct vrnic_cmd_create_cq.
type CmdCreateCQReq struct {
	RingPA   uint64 `c:"ring_pa"`
	CQECount uint32 `c:"cqe_count"`
	Flags    uint32 `c:"flags"` // CQFlag* (ABI 1.4)
}

// CQFlagTimestamp is VRNIC_CQ_F_TIMESTAMP: the ring carries a timestamp
// (nanoseconds of CLOCK_REALTIME) per CQE after the CQEs (ABI 1.4).
const CQFlagTimestamp = 1 << 0

// RespCreateCQ is struct vrnic_resp_create_cq.
type RespCreateCQ struct {
	CQHandle uint32 `c:"cq_handle"`
	DBIndex  uint32 `c:"db_index"`
}

// QPCap is struct vrnic_qp_cap.
type QPCap struct {
	MaxSendWR     uint32 `c:"max_send_wr"`
	MaxRecvWR     uint32 `c:"max_recv_wr"`
	MaxSendSGE    uint32 `c:"max_send_sge"`
	MaxRecvSGE    uint32 `c:"max_recv_sge"`
	MaxInlineData uint32 `c:"max_inline_data"`
	Reserved      uint32 `c:"reserved"`
}

// CmdCreateQPReq is struct vrnic_cmd_create_qp.
type CmdCreateQPReq struct {
	SQPA      uint64 `c:"sq_pa"`
	RQPA      uint64 `c:"rq_pa"`
	QPType    QPType `c:"qp_type"`
	PDHandle  uint32 `c:"pd_handle"`
	SendCQ    uint32 `c:"send_cq"`
	RecvCQ    uint32 `c:"recv_cq"`
	SRQHandle uint32 `c:"srq_handle"` // NoSRQ for none
	SQSigAll  uint32 `c:"sq_sig_all"`
	Cap       QPCap  `c:"cap"`
}

// RespCreateQP is struct vrnic_resp_create_qp.
type RespCreateQP struct {
	QPN         uint32 `c:"qpn"`
	DBIndex     uint32 `c:"db_index"`
	SQWQEBlocks uint32 `c:"sq_wqe_blocks"`
	RQWQESize   uint32 `c:"rq_wqe_size"`
	Cap         QPCap  `c:"cap"`
}

// AHAttr is struct vrnic_ah_attr.
type AHAttr struct {
	DGID         [16]byte `c:"dgid"`
	FlowLabel    uint32   `c:"flow_label"`
	SGIDIndex    uint8    `c:"sgid_index"`
	HopLimit     uint8    `c:"hop_limit"`
	TrafficClass uint8    `c:"traffic_class"`
	SL           uint8    `c:"sl"`
	PortNum      uint8    `c:"port_num"`
	Reserved     [7]byte  `c:"reserved"`
}

// QPAttr is struct vrnic_qp_attr.
type QPAttr struct {
	QPState          QPState `c:"qp_state"`
	CurQPState       QPState `c:"cur_qp_state"`
	PathMTU          MTU     `c:"path_mtu"`
	QKey             uint32  `c:"qkey"`
	RQPSN            uint32  `c:"rq_psn"`
	SQPSN            uint32  `c:"sq_psn"`
	DestQPNum        uint32  `c:"dest_qp_num"`
	QPAccessFlags    uint32  `c:"qp_access_flags"`
	PKeyIndex        uint16  `c:"pkey_index"`
	MaxRdAtomic      uint8   `c:"max_rd_atomic"`
	MaxDestRdAtomic  uint8   `c:"max_dest_rd_atomic"`
	MinRNRTimer      uint8   `c:"min_rnr_timer"`
	Timeout          uint8   `c:"timeout"`
	RetryCnt         uint8   `c:"retry_cnt"`
	RNRRetry         uint8   `c:"rnr_retry"`
	SQDraining       uint8   `c:"sq_draining"`
	PortNum          uint8   `c:"port_num"`
	EnSQDAsyncNotify uint8   `c:"en_sqd_async_notify"`
	PathMigState     uint8   `c:"path_mig_state"` // enum ibv_mig_state; 0 (MIGRATED) unless QPAttrPathMigState is in the mask
	AHAttr           AHAttr  `c:"ah_attr"`
	Cap              QPCap   `c:"cap"`
}

// CmdModifyQPReq is struct vrnic_cmd_modify_qp. A client of ABI 1.4
// sends its first OffModifyQPECE bytes (no ECE).
type CmdModifyQPReq struct {
	QPN        uint32 `c:"qpn"`
	AttrMask   uint32 `c:"attr_mask"`
	Attr       QPAttr `c:"attr"`
	ECEOptions uint32 `c:"ece_options"` // ABI 1.5, with QPAttrECE: ECE* bits
	Reserved   uint32 `c:"reserved"`    // ABI 1.5
}

// OffModifyQPECE is where ABI 1.5 extended MODIFY_QP: the length of the
// command of a 1.4 client, which the daemon still takes.
const OffModifyQPECE = 108

// RespQueryQP is struct vrnic_resp_query_qp.
type RespQueryQP struct {
	Attr            QPAttr `c:"attr"`
	QPType          QPType `c:"qp_type"`
	SQSigAll        uint32 `c:"sq_sig_all"`
	SendCQ          uint32 `c:"send_cq"`
	RecvCQ          uint32 `c:"recv_cq"`
	SRQHandle       uint32 `c:"srq_handle"`
	PDHandle        uint32 `c:"pd_handle"`
	ECEOptions      uint32 `c:"ece_options"` // ABI 1.5: the ECE options in force
	PacketsSent     uint64 `c:"packets_sent"`
	PacketsReceived uint64 `c:"packets_received"`
	Retransmits     uint64 `c:"retransmits"`
	RNRNAKsReceived uint64 `c:"rnr_naks_received"`
}

// CmdCreateSRQReq is struct vrnic_cmd_create_srq.
type CmdCreateSRQReq struct {
	RingPA   uint64 `c:"ring_pa"`
	PDHandle uint32 `c:"pd_handle"`
	MaxWR    uint32 `c:"max_wr"`
	MaxSGE   uint32 `c:"max_sge"`
	SRQLimit uint32 `c:"srq_limit"`
}

// RespCreateSRQ is struct vrnic_resp_create_srq.
type RespCreateSRQ struct {
	SRQHandle uint32 `c:"srq_handle"`
	DBIndex   uint32 `c:"db_index"`
	RQWQESize uint32 `c:"rq_wqe_size"`
	Reserved  uint32 `c:"reserved"`
}

// CmdModifySRQReq is struct vrnic_cmd_modify_srq.
type CmdModifySRQReq struct {
	SRQHandle uint32 `c:"srq_handle"`
	SRQLimit  uint32 `c:"srq_limit"`
}

// RespQuerySRQ is struct vrnic_resp_query_srq.
type RespQuerySRQ struct {
	MaxWR    uint32 `c:"max_wr"`
	MaxSGE   uint32 `c:"max_sge"`
	SRQLimit uint32 `c:"srq_limit"`
	Reserved uint32 `c:"reserved"`
}

// CmdCreateAHReq is struct vrnic_cmd_create_ah.
type CmdCreateAHReq struct {
	PDHandle uint32 `c:"pd_handle"`
	Reserved uint32 `c:"reserved"`
	Attr     AHAttr `c:"attr"`
}

// RespCreateAH is struct vrnic_resp_create_ah.
type RespCreateAH struct {
	AHHandle uint32 `c:"ah_handle"`
	Reserved uint32 `c:"reserved"`
}

// Sizes of the control structs in bytes (checked against the header).
const (
	SizeofMsgHdr = 16
)

// ErrShort is returned when a buffer is too small for the struct.
var ErrShort = errors.New("abi: buffer too short")

// Marshal encodes the fixed-size control struct v (a pointer to or value of
// one of this package's structs) little-endian into b and returns the bytes
// written.
func Marshal(b []byte, v any) (int, error) {
	n, err := binary.Encode(b, binary.LittleEndian, v)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrShort, err)
	}
	return n, nil
}

// Unmarshal decodes the fixed-size control struct pointed to by v from b and
// returns the bytes read.
func Unmarshal(b []byte, v any) (int, error) {
	n, err := binary.Decode(b, binary.LittleEndian, v)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrShort, err)
	}
	return n, nil
}

// Sizeof returns the encoded size of control struct v, or -1.
func Sizeof(v any) int { return binary.Size(v) }

// Byte offsets in struct vrnic_msg_hdr.
const (
	offHdrOpcode = 0  // opcode, u16
	offHdrFlags  = 2  // flags, u16
	offHdrLength = 4  // length, u32
	offHdrSeq    = 8  // seq, u32
	offHdrStatus = 12 // status, u32
)

// Put encodes h into b[:16]; b must be at least SizeofMsgHdr bytes.
func (h *MsgHdr) Put(b []byte) {
	_ = b[SizeofMsgHdr-1]
	binary.LittleEndian.PutUint16(b[offHdrOpcode:], uint16(h.Opcode))
	binary.LittleEndian.PutUint16(b[offHdrFlags:], h.Flags)
	binary.LittleEndian.PutUint32(b[offHdrLength:], h.Length)
	binary.LittleEndian.PutUint32(b[offHdrSeq:], h.Seq)
	binary.LittleEndian.PutUint32(b[offHdrStatus:], h.Status)
}

// Decode reads h from b, which must hold at least SizeofMsgHdr bytes.
func (h *MsgHdr) Decode(b []byte) error {
	if len(b) < SizeofMsgHdr {
		return fmt.Errorf("%w: message header needs %d bytes, have %d", ErrShort, SizeofMsgHdr, len(b))
	}
	h.Opcode = Cmd(binary.LittleEndian.Uint16(b[offHdrOpcode:]))
	h.Flags = binary.LittleEndian.Uint16(b[offHdrFlags:])
	h.Length = binary.LittleEndian.Uint32(b[offHdrLength:])
	h.Seq = binary.LittleEndian.Uint32(b[offHdrSeq:])
	h.Status = binary.LittleEndian.Uint32(b[offHdrStatus:])
	return nil
}
