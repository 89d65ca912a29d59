package abi

// Memory windows (ABI 1.4): the commands, types and flags of vrnic_abi.h's
// "Memory windows" section. A BIND_MW send WQE reuses the fields of
// SendWQE as the header lists (BindMWOf).

// Memory window commands.
const (
	CmdAllocMW   Cmd = 40
	CmdDeallocMW Cmd = 41 // CmdHandleReq: the MW handle
)

// MWType is enum vrnic_mw_type (IBV_MW_TYPE_*).
type MWType uint32

// Memory window types.
const (
	MWType1 MWType = 1
	MWType2 MWType = 2
)

// Access flags of ABI 1.4 (enum vrnic_access).
const (
	AccessMWBind    uint32 = 1 << 4 // REG_MR: windows may be bound to the MR
	AccessZeroBased uint32 = 1 << 5 // BIND_MW of a type 2 window
	// AccessMRAll is every bit REG_MR accepts.
	AccessMRAll = AccessDefined | AccessMWBind
	// AccessMWAll is every bit a BIND_MW WQE accepts (LOCAL_WRITE is
	// ignored, as Linux rxe does).
	AccessMWAll = AccessDefined | AccessZeroBased
)

// Device capability flags (enum vrnic_device_cap, DeviceAttr.DeviceCapFlags).
const (
	DeviceMemWindow       uint32 = 1 << 0
	DeviceMemWindowType2B uint32 = 1 << 1
)

// CmdAllocMWReq is struct vrnic_cmd_alloc_mw.
type CmdAllocMWReq struct {
	PDHandle uint32 `c:"pd_handle"`
	Type     MWType `c:"type"`
}

// RespAllocMW is struct vrnic_resp_alloc_mw.
type RespAllocMW struct {
	MWHandle uint32 `c:"mw_handle"`
	RKey     uint32 `c:"rkey"`
}

// BindMW is a BIND_MW WQE's arguments, named.
type BindMW struct {
	MWHandle uint32 // invalidate_rkey
	RKey     uint32 // rkey: the window's rkey after the bind
	MRLKey   uint32 // imm_data
	Addr     uint64 // remote_addr
	Length   uint64 // compare_add
	Access   uint32 // swap (low 32 bits; the rest must be 0)
}

// BindMWOf reads the bind arguments of a BIND_MW WQE; ok is false when
// the access word has bits above 32.
func BindMWOf(w *SendWQE) (b BindMW, ok bool) {
	return BindMW{MWHandle: w.InvalidateRKey, RKey: w.RKey, MRLKey: w.ImmData, Addr: w.RemoteAddr,
		Length: w.CompareAdd, Access: uint32(w.Swap)}, w.Swap>>32 == 0
}

// Put writes b into the BIND_MW WQE w (opcode and control fields are the
// caller's).
func (b BindMW) Put(w *SendWQE) {
	w.InvalidateRKey, w.RKey, w.ImmData, w.RemoteAddr, w.CompareAdd, w.Swap =
		b.MWHandle, b.RKey, b.MRLKey, b.Addr, b.Length, uint64(b.Access)
}
