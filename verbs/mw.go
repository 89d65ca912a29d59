package verbs

import "github.com/vrnic/vrnic/abi"

// MW is a memory window (ABI 1.4, IBTA 10.6.7): a type 1 or type 2
// window of a PD, bound to a range of an MR registered with
// abi.AccessMWBind by a BIND_MW work request (BindWR), after which
// remote peers reach that range through RKey.
type MW struct {
	ctx    *Context
	Handle uint32
	RKey   uint32 // the key of the last bind this library built, else the first
	Type   abi.MWType
}

// AllocMW allocates a memory window of type t (abi.MWType1 or
// abi.MWType2; another type fails with EINVAL).
func (pd *PD) AllocMW(t abi.MWType) (*MW, error) {
	var r abi.RespAllocMW
	if _, _, err := pd.ctx.k.call(abi.CmdAllocMW, &abi.CmdAllocMWReq{PDHandle: pd.Handle, Type: t}, nil, nil, &r); err != nil {
		return nil, err
	}
	return &MW{ctx: pd.ctx, Handle: r.MWHandle, RKey: r.RKey, Type: t}, nil
}

// Dealloc frees the window; a bound window is unbound first.
func (mw *MW) Dealloc() error { return mw.ctx.destroy(abi.CmdDeallocMW, mw.Handle) }

// NextRKey is the window's rkey with the next 8-bit key (ibv_inc_rkey).
func (mw *MW) NextRKey() uint32 { return mw.RKey&^0xff | (mw.RKey+1)&0xff }

// BindWR returns a BIND_MW work request that binds the window to
// [addr, addr+length) of mr with access (abi.AccessRemote* and
// abi.AccessZeroBased) under rkey, and records rkey as the window's key.
// Length 0 (mr nil) unbinds a type 1 window.
func (mw *MW) BindWR(wrID uint64, flags abi.SendFlags, rkey uint32, mr *MR, addr, length uint64, access uint32) SendWR {
	b := abi.BindMW{MWHandle: mw.Handle, RKey: rkey, Addr: addr, Length: length, Access: access}
	if mr != nil {
		b.MRLKey = mr.LKey
	}
	mw.RKey = rkey
	return SendWR{WrID: wrID, Opcode: abi.WRBindMW, Flags: flags, InvRKey: b.MWHandle, RKey: b.RKey,
		ImmData: b.MRLKey, RemoteAddr: b.Addr, CompareAdd: b.Length, Swap: uint64(b.Access)}
}
