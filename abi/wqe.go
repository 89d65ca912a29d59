package abi

import "encoding/binary"

// Sizes of the data-path structs in bytes.
const (
	SizeofSendWQE = 64
	SizeofSGE     = 16
	SizeofRecvWQE = 16
	SizeofCQE     = 32
)

// Each field of the data-path structs has one byte-offset constant below,
// which both Put and Decode use; TestLayoutAgainstC compares every one with
// offsetof of the same member in vrnic_abi.h.

// Byte offsets in struct vrnic_sge.
const (
	offSGEAddr   = 0  // addr, u64
	offSGELength = 8  // length, u32
	offSGELKey   = 12 // lkey, u32
)

// Byte offsets in struct vrnic_send_wqe.
const (
	offSendWrID       = 0  // wr_id, u64
	offSendOpcode     = 8  // opcode, u8
	offSendFlags      = 9  // flags, u8
	offSendNumSGE     = 10 // num_sge, u8
	offSendReserved0  = 11 // reserved0, u8
	offSendImmData    = 12 // imm_data, u32
	offSendInvRKey    = 16 // invalidate_rkey, u32
	offSendInlineLen  = 20 // inline_len, u32
	offSendRemoteAddr = 24 // remote_addr, u64
	offSendRKey       = 32 // rkey, u32
	offSendRemoteQPN  = 36 // remote_qpn, u32
	offSendRemoteQKey = 40 // remote_qkey, u32
	offSendAHHandle   = 44 // ah_handle, u32
	offSendCompareAdd = 48 // compare_add, u64
	offSendSwap       = 56 // swap, u64
)

// Byte offsets in struct vrnic_recv_wqe.
const (
	offRecvWrID     = 0  // wr_id, u64
	offRecvNumSGE   = 8  // num_sge, u32
	offRecvReserved = 12 // reserved, u32
)

// Byte offsets in struct vrnic_cqe. pkey_index, sl and owner form the tail
// word at OffCQETail; they are encoded and decoded as that one u32 (see
// TailWord), at the bit shifts below.
const (
	offCQEWrID      = 0  // wr_id, u64
	offCQEByteLen   = 8  // byte_len, u32
	offCQEImmOrInv  = 12 // imm_or_inv, u32
	offCQEQPNum     = 16 // qp_num, u32
	offCQESrcQP     = 20 // src_qp, u32
	offCQEStatus    = 24 // status, u8
	offCQEOpcode    = 25 // opcode, u8
	offCQEWCFlags   = 26 // wc_flags, u8
	offCQEVendorErr = 27 // vendor_err, u8

	// OffCQETail is the offset of the tail word (pkey_index, sl, owner),
	// the word a producer stores last.
	OffCQETail = 28
	// OffCQEOwner is the offset of the owner byte.
	OffCQEOwner = OffCQETail + tailOwnerShift/8

	tailSLShift    = 16 // sl: bits 16..23 of the tail word (pkey_index: 0..15)
	tailOwnerShift = 24 // owner: bits 24..31
)

// SGE is struct vrnic_sge: one scatter/gather entry.
type SGE struct {
	Addr   uint64 `c:"addr"` // virtual address inside the MR of LKey
	Length uint32 `c:"length"`
	LKey   uint32 `c:"lkey"`
}

// Put encodes s into b[:16].
func (s *SGE) Put(b []byte) {
	_ = b[SizeofSGE-1]
	binary.LittleEndian.PutUint64(b[offSGEAddr:], s.Addr)
	binary.LittleEndian.PutUint32(b[offSGELength:], s.Length)
	binary.LittleEndian.PutUint32(b[offSGELKey:], s.LKey)
}

// Decode reads s from b[:16].
func (s *SGE) Decode(b []byte) {
	_ = b[SizeofSGE-1]
	s.Addr = binary.LittleEndian.Uint64(b[offSGEAddr:])
	s.Length = binary.LittleEndian.Uint32(b[offSGELength:])
	s.LKey = binary.LittleEndian.Uint32(b[offSGELKey:])
}

// SendWQE is struct vrnic_send_wqe: block 0 of a send WQE slot. The SGEs
// (four per 64-byte block) or the inline data follow from byte 64 of the
// slot.
type SendWQE struct {
	WrID           uint64    `c:"wr_id"`
	Opcode         WROpcode  `c:"opcode"`
	Flags          SendFlags `c:"flags"`
	NumSGE         uint8     `c:"num_sge"` // 0 with SendInline
	Reserved0      uint8     `c:"reserved0"`
	ImmData        uint32    `c:"imm_data"`
	InvalidateRKey uint32    `c:"invalidate_rkey"`
	InlineLen      uint32    `c:"inline_len"`
	RemoteAddr     uint64    `c:"remote_addr"`
	RKey           uint32    `c:"rkey"`
	RemoteQPN      uint32    `c:"remote_qpn"`
	RemoteQKey     uint32    `c:"remote_qkey"`
	AHHandle       uint32    `c:"ah_handle"`
	CompareAdd     uint64    `c:"compare_add"`
	Swap           uint64    `c:"swap"`
}

// Put encodes w into b[:64].
func (w *SendWQE) Put(b []byte) {
	_ = b[SizeofSendWQE-1]
	binary.LittleEndian.PutUint64(b[offSendWrID:], w.WrID)
	b[offSendOpcode] = byte(w.Opcode)
	b[offSendFlags] = byte(w.Flags)
	b[offSendNumSGE] = w.NumSGE
	b[offSendReserved0] = w.Reserved0
	binary.LittleEndian.PutUint32(b[offSendImmData:], w.ImmData)
	binary.LittleEndian.PutUint32(b[offSendInvRKey:], w.InvalidateRKey)
	binary.LittleEndian.PutUint32(b[offSendInlineLen:], w.InlineLen)
	binary.LittleEndian.PutUint64(b[offSendRemoteAddr:], w.RemoteAddr)
	binary.LittleEndian.PutUint32(b[offSendRKey:], w.RKey)
	binary.LittleEndian.PutUint32(b[offSendRemoteQPN:], w.RemoteQPN)
	binary.LittleEndian.PutUint32(b[offSendRemoteQKey:], w.RemoteQKey)
	binary.LittleEndian.PutUint32(b[offSendAHHandle:], w.AHHandle)
	binary.LittleEndian.PutUint64(b[offSendCompareAdd:], w.CompareAdd)
	binary.LittleEndian.PutUint64(b[offSendSwap:], w.Swap)
}

// Decode reads w from b[:64]. It does not validate; see package queues.
func (w *SendWQE) Decode(b []byte) {
	_ = b[SizeofSendWQE-1]
	w.WrID = binary.LittleEndian.Uint64(b[offSendWrID:])
	w.Opcode = WROpcode(b[offSendOpcode])
	w.Flags = SendFlags(b[offSendFlags])
	w.NumSGE = b[offSendNumSGE]
	w.Reserved0 = b[offSendReserved0]
	w.ImmData = binary.LittleEndian.Uint32(b[offSendImmData:])
	w.InvalidateRKey = binary.LittleEndian.Uint32(b[offSendInvRKey:])
	w.InlineLen = binary.LittleEndian.Uint32(b[offSendInlineLen:])
	w.RemoteAddr = binary.LittleEndian.Uint64(b[offSendRemoteAddr:])
	w.RKey = binary.LittleEndian.Uint32(b[offSendRKey:])
	w.RemoteQPN = binary.LittleEndian.Uint32(b[offSendRemoteQPN:])
	w.RemoteQKey = binary.LittleEndian.Uint32(b[offSendRemoteQKey:])
	w.AHHandle = binary.LittleEndian.Uint32(b[offSendAHHandle:])
	w.CompareAdd = binary.LittleEndian.Uint64(b[offSendCompareAdd:])
	w.Swap = binary.LittleEndian.Uint64(b[offSendSwap:])
}

// RecvWQE is struct vrnic_recv_wqe: the 16-byte header of a receive WQE
// slot (RQ and SRQ); NumSGE SGEs follow it.
type RecvWQE struct {
	WrID     uint64 `c:"wr_id"`
	NumSGE   uint32 `c:"num_sge"`
	Reserved uint32 `c:"reserved"`
}

// Put encodes r into b[:16].
func (r *RecvWQE) Put(b []byte) {
	_ = b[SizeofRecvWQE-1]
	binary.LittleEndian.PutUint64(b[offRecvWrID:], r.WrID)
	binary.LittleEndian.PutUint32(b[offRecvNumSGE:], r.NumSGE)
	binary.LittleEndian.PutUint32(b[offRecvReserved:], r.Reserved)
}

// Decode reads r from b[:16].
func (r *RecvWQE) Decode(b []byte) {
	_ = b[SizeofRecvWQE-1]
	r.WrID = binary.LittleEndian.Uint64(b[offRecvWrID:])
	r.NumSGE = binary.LittleEndian.Uint32(b[offRecvNumSGE:])
	r.Reserved = binary.LittleEndian.Uint32(b[offRecvReserved:])
}

// CQE is struct vrnic_cqe. Owner bit 0 is the phase; it lives in the last
// 32-bit word of the entry (OffCQETail) together with PKeyIndex and SL, so a
// producer writes bytes 0..27 first (PutBody) and then that word with one
// atomic store (TailWord).
type CQE struct {
	WrID      uint64   `c:"wr_id"`
	ByteLen   uint32   `c:"byte_len"`
	ImmOrInv  uint32   `c:"imm_or_inv"`
	QPNum     uint32   `c:"qp_num"`
	SrcQP     uint32   `c:"src_qp"`
	Status    WCStatus `c:"status"`
	Opcode    WCOpcode `c:"opcode"`
	WCFlags   WCFlags  `c:"wc_flags"`
	VendorErr uint8    `c:"vendor_err"`
	PKeyIndex uint16   `c:"pkey_index"`
	SL        uint8    `c:"sl"`
	Owner     uint8    `c:"owner"`
}

// PutBody encodes every field but the tail word (pkey_index, sl, owner)
// into b[:28].
func (c *CQE) PutBody(b []byte) {
	_ = b[OffCQETail-1]
	binary.LittleEndian.PutUint64(b[offCQEWrID:], c.WrID)
	binary.LittleEndian.PutUint32(b[offCQEByteLen:], c.ByteLen)
	binary.LittleEndian.PutUint32(b[offCQEImmOrInv:], c.ImmOrInv)
	binary.LittleEndian.PutUint32(b[offCQEQPNum:], c.QPNum)
	binary.LittleEndian.PutUint32(b[offCQESrcQP:], c.SrcQP)
	b[offCQEStatus] = byte(c.Status)
	b[offCQEOpcode] = byte(c.Opcode)
	b[offCQEWCFlags] = byte(c.WCFlags)
	b[offCQEVendorErr] = c.VendorErr
}

// TailWord is the little-endian value of bytes 28..31: pkey_index, sl and
// owner.
func (c *CQE) TailWord() uint32 { return c.TailWordWith(c.Owner) }

// TailWordWith is TailWord with owner in place of c.Owner: a producer
// computes the phase when it writes the entry.
func (c *CQE) TailWordWith(owner uint8) uint32 {
	return uint32(c.PKeyIndex) | uint32(c.SL)<<tailSLShift | uint32(owner)<<tailOwnerShift
}

// setTail sets PKeyIndex, SL and Owner from tail word w.
func (c *CQE) setTail(w uint32) {
	c.PKeyIndex = uint16(w)
	c.SL = uint8(w >> tailSLShift)
	c.Owner = uint8(w >> tailOwnerShift)
}

// Put encodes c into b[:32] (all fields, no ordering guarantee).
func (c *CQE) Put(b []byte) {
	_ = b[SizeofCQE-1]
	c.PutBody(b)
	binary.LittleEndian.PutUint32(b[OffCQETail:], c.TailWord())
}

// Decode reads c from b[:32].
func (c *CQE) Decode(b []byte) {
	_ = b[SizeofCQE-1]
	c.WrID = binary.LittleEndian.Uint64(b[offCQEWrID:])
	c.ByteLen = binary.LittleEndian.Uint32(b[offCQEByteLen:])
	c.ImmOrInv = binary.LittleEndian.Uint32(b[offCQEImmOrInv:])
	c.QPNum = binary.LittleEndian.Uint32(b[offCQEQPNum:])
	c.SrcQP = binary.LittleEndian.Uint32(b[offCQESrcQP:])
	c.Status = WCStatus(b[offCQEStatus])
	c.Opcode = WCOpcode(b[offCQEOpcode])
	c.WCFlags = WCFlags(b[offCQEWCFlags])
	c.VendorErr = b[offCQEVendorErr]
	c.setTail(binary.LittleEndian.Uint32(b[OffCQETail:]))
}

// CQEPhase is the owner bit value that marks entry index (free-running) as
// valid in a ring of count entries: 1 on the first pass, 0 on the second,
// and so on. count must be a power of two.
func CQEPhase(index, count uint32) uint8 {
	return uint8(1 - (index/count)&1)
}

// CQEReady reports whether tail, the tail word of entry index
// (free-running) of a ring of count entries, carries the owner bit of the
// current pass: the entry is written and not yet consumed.
func CQEReady(tail, index, count uint32) bool {
	return uint8(tail>>tailOwnerShift)&1 == CQEPhase(index, count)
}
