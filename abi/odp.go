package abi

// On-demand paging (ABI 1.4): the commands and structs of vrnic_abi.h's
// "On-demand paging" section.

// ODP commands.
const (
	CmdODPAttach Cmd = 53
	CmdRegMRODP  Cmd = 54
	CmdAdviseMR  Cmd = 55
)

// ODP capabilities (struct ibv_odp_caps).
const (
	ODPSupport         = 1 << 0 // VRNIC_ODP_SUPPORT
	ODPSupportImplicit = 1 << 1 // VRNIC_ODP_SUPPORT_IMPLICIT

	ODPSupportSend    = 1 << 0
	ODPSupportRecv    = 1 << 1
	ODPSupportWrite   = 1 << 2
	ODPSupportRead    = 1 << 3
	ODPSupportAtomic  = 1 << 4
	ODPSupportSRQRecv = 1 << 5
)

// Flags.
const (
	ODPFlagImplicit    = 0x1 // VRNIC_ODP_F_IMPLICIT
	AdviseMRFlagFlush  = 0x1 // VRNIC_ADVISE_MR_F_FLUSH
	ODPNonceLen        = 16
	AdvicePrefetch     = 0
	AdvicePrefetchW    = 1
	AdvicePrefetchNoPF = 2
)

// CmdODPAttachReq is struct vrnic_cmd_odp_attach.
type CmdODPAttachReq struct {
	NonceAddr uint64             `c:"nonce_addr"`
	Nonce     [ODPNonceLen]uint8 `c:"nonce"`
	Flags     uint32             `c:"flags"`
	Reserved  uint32             `c:"reserved"`
}

// RespODPAttach is struct vrnic_resp_odp_attach.
type RespODPAttach struct {
	GeneralCaps uint64 `c:"general_caps"`
	RCODPCaps   uint32 `c:"rc_odp_caps"`
	UCODPCaps   uint32 `c:"uc_odp_caps"`
	UDODPCaps   uint32 `c:"ud_odp_caps"`
	XRCODPCaps  uint32 `c:"xrc_odp_caps"`
}

// CmdRegMRODPReq is struct vrnic_cmd_reg_mr_odp.
type CmdRegMRODPReq struct {
	Addr     uint64 `c:"addr"`
	IOVA     uint64 `c:"iova"`
	Length   uint64 `c:"length"`
	PDHandle uint32 `c:"pd_handle"`
	Access   uint32 `c:"access"`
	Flags    uint32 `c:"flags"`
	Reserved uint32 `c:"reserved"`
}

// CmdAdviseMRReq is struct vrnic_cmd_advise_mr; NumSGE SGEs follow.
type CmdAdviseMRReq struct {
	PDHandle uint32 `c:"pd_handle"`
	Advice   uint32 `c:"advice"`
	Flags    uint32 `c:"flags"`
	NumSGE   uint32 `c:"num_sge"`
}
