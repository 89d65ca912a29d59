package abi

// XRC (ABI 1.4): domains, XRC SRQs and XRC QPs (vrnic_abi.h, "XRC").

// XRC commands.
const (
	CmdOpenXRCD     Cmd = 57
	CmdCloseXRCD    Cmd = 58
	CmdCreateXRCSRQ Cmd = 59
	CmdCreateXRCQP  Cmd = 60
)

// XRC QP types (IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV).
const (
	QPTXRCSend QPType = 9
	QPTXRCRecv QPType = 10
)

// DeviceXRC is the device_cap_flags bit of XRC (IBV_DEVICE_XRC).
const DeviceXRC = 1 << 20

// OPEN_XRCD oflags (O_CREAT, O_EXCL).
const (
	XRCDOCreat = 0x40
	XRCDOExcl  = 0x80
)

// CmdOpenXRCDReq is struct vrnic_cmd_open_xrcd.
type CmdOpenXRCDReq struct {
	OFlags   uint32 `c:"oflags"`
	Reserved uint32 `c:"reserved"`
}

// RespOpenXRCD is struct vrnic_resp_open_xrcd.
type RespOpenXRCD struct {
	XRCDHandle uint32 `c:"xrcd_handle"`
	Reserved   uint32 `c:"reserved"`
}

// CmdCreateXRCSRQReq is struct vrnic_cmd_create_xrc_srq.
type CmdCreateXRCSRQReq struct {
	SRQ        CmdCreateSRQReq `c:"srq"`
	XRCDHandle uint32          `c:"xrcd_handle"`
	CQHandle   uint32          `c:"cq_handle"`
}

// RespCreateXRCSRQ is struct vrnic_resp_create_xrc_srq.
type RespCreateXRCSRQ struct {
	SRQ      RespCreateSRQ `c:"srq"`
	SRQNum   uint32        `c:"srq_num"`
	Reserved uint32        `c:"reserved"`
}

// CmdCreateXRCQPReq is struct vrnic_cmd_create_xrc_qp.
type CmdCreateXRCQPReq struct {
	QP         CmdCreateQPReq `c:"qp"`
	XRCDHandle uint32         `c:"xrcd_handle"`
	Reserved   uint32         `c:"reserved"`
}
