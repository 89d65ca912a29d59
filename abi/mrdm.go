package abi

// Rereg MR, resize CQ and device memory (ABI 1.4): see vrnic_abi.h,
// "Rereg MR, resize CQ, device memory".

// Commands (ABI 1.4).
const (
	CmdReregMR       Cmd = 45
	CmdResizeCQ      Cmd = 46
	CmdAllocDM       Cmd = 47
	CmdFreeDM        Cmd = 48
	CmdRegDMMR       Cmd = 49
	CmdQueryDeviceEx Cmd = 50
)

// Rereg flags (enum vrnic_rereg_flags = enum ibv_rereg_mr_flags).
const (
	ReregChangeTranslation uint32 = 1 << 0
	ReregChangePD          uint32 = 1 << 1
	ReregChangeAccess      uint32 = 1 << 2
	// ReregAll is every defined rereg flag.
	ReregAll = ReregChangeTranslation | ReregChangePD | ReregChangeAccess
)

// DMMRZeroBased is VRNIC_DM_MR_ZERO_BASED (IBV_ACCESS_ZERO_BASED), the
// access bit REG_DM_MR requires.
const DMMRZeroBased uint32 = 1 << 5

// DMMaxLogAlign is VRNIC_DM_MAX_LOG_ALIGN: the largest ALLOC_DM
// log_align (device memory starts on a page).
const DMMaxLogAlign = 12

// CmdReregMRReq is struct vrnic_cmd_rereg_mr. With ReregChangeTranslation
// and PBLPA == 0, NPages u64 physical addresses follow it.
type CmdReregMRReq struct {
	MRHandle  uint32 `c:"mr_handle"`
	Flags     uint32 `c:"flags"`
	IOVA      uint64 `c:"iova"`
	Length    uint64 `c:"length"`
	PBLPA     uint64 `c:"pbl_pa"`
	PDHandle  uint32 `c:"pd_handle"`
	Access    uint32 `c:"access"`
	PageShift uint32 `c:"page_shift"`
	NPages    uint32 `c:"npages"`
}

// CmdResizeCQReq is struct vrnic_cmd_resize_cq.
type CmdResizeCQReq struct {
	RingPA   uint64 `c:"ring_pa"`
	CQHandle uint32 `c:"cq_handle"`
	CQECount uint32 `c:"cqe_count"`
}

// RespResizeCQ is struct vrnic_resp_resize_cq.
type RespResizeCQ struct {
	CQECount    uint32 `c:"cqe_count"`
	Outstanding uint32 `c:"outstanding"`
}

// CmdAllocDMReq is struct vrnic_cmd_alloc_dm.
type CmdAllocDMReq struct {
	Length   uint64 `c:"length"`
	LogAlign uint32 `c:"log_align"`
	Flags    uint32 `c:"flags"`
}

// RespAllocDM is struct vrnic_resp_alloc_dm (one fd: the DM's memfd).
type RespAllocDM struct {
	DMHandle  uint32 `c:"dm_handle"`
	Reserved  uint32 `c:"reserved"`
	MapLength uint64 `c:"map_length"`
}

// CmdRegDMMRReq is struct vrnic_cmd_reg_dm_mr.
type CmdRegDMMRReq struct {
	Offset   uint64 `c:"offset"`
	Length   uint64 `c:"length"`
	DMHandle uint32 `c:"dm_handle"`
	PDHandle uint32 `c:"pd_handle"`
	Access   uint32 `c:"access"`
	Reserved uint32 `c:"reserved"`
}

// DeviceAttrEx is struct vrnic_device_attr_ex (QUERY_DEVICE_EX reply).
type DeviceAttrEx struct {
	MaxDMSize     uint64 `c:"max_dm_size"`
	DMMaxLogAlign uint32 `c:"dm_max_log_align"`
	// ECEOptions (ABI 1.5) are the ECE options the device supports:
	// 0 when the operator switched ECE off (vrnicd -ece=false).
	ECEOptions uint32 `c:"ece_options"`
}
