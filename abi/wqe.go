package abi

import "encoding/binary"

// Sizes of the data-path structs in bytes.
const (
	SizeofSendWQE = 64
	SizeofSGE     = 16
	SizeofRecvWQE = 16
	SizeofCQE     = 32
)

// SGE is struct vrnic_sge: one scatter/gather entry.
type SGE struct {
	Addr   uint64 `c:"addr"` // virtual address inside the MR of LKey
	Length uint32 `c:"length"`
	LKey   uint32 `c:"lkey"`
}

// Put encodes s into b[:16].
func (s *SGE) Put(b []byte) {
	_ = b[15]
	binary.LittleEndian.PutUint64(b[0:], s.Addr)
	binary.LittleEndian.PutUint32(b[8:], s.Length)
	binary.LittleEndian.PutUint32(b[12:], s.LKey)
}

// Decode reads s from b[:16].
func (s *SGE) Decode(b []byte) {
	_ = b[15]
	s.Addr = binary.LittleEndian.Uint64(b[0:])
	s.Length = binary.LittleEndian.Uint32(b[8:])
	s.LKey = binary.LittleEndian.Uint32(b[12:])
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
	_ = b[63]
	binary.LittleEndian.PutUint64(b[0:], w.WrID)
	b[8] = byte(w.Opcode)
	b[9] = byte(w.Flags)
	b[10] = w.NumSGE
	b[11] = w.Reserved0
	binary.LittleEndian.PutUint32(b[12:], w.ImmData)
	binary.LittleEndian.PutUint32(b[16:], w.InvalidateRKey)
	binary.LittleEndian.PutUint32(b[20:], w.InlineLen)
	binary.LittleEndian.PutUint64(b[24:], w.RemoteAddr)
	binary.LittleEndian.PutUint32(b[32:], w.RKey)
	binary.LittleEndian.PutUint32(b[36:], w.RemoteQPN)
	binary.LittleEndian.PutUint32(b[40:], w.RemoteQKey)
	binary.LittleEndian.PutUint32(b[44:], w.AHHandle)
	binary.LittleEndian.PutUint64(b[48:], w.CompareAdd)
	binary.LittleEndian.PutUint64(b[56:], w.Swap)
}

// Decode reads w from b[:64]. It does not validate; see package queues.
func (w *SendWQE) Decode(b []byte) {
	_ = b[63]
	w.WrID = binary.LittleEndian.Uint64(b[0:])
	w.Opcode = WROpcode(b[8])
	w.Flags = SendFlags(b[9])
	w.NumSGE = b[10]
	w.Reserved0 = b[11]
	w.ImmData = binary.LittleEndian.Uint32(b[12:])
	w.InvalidateRKey = binary.LittleEndian.Uint32(b[16:])
	w.InlineLen = binary.LittleEndian.Uint32(b[20:])
	w.RemoteAddr = binary.LittleEndian.Uint64(b[24:])
	w.RKey = binary.LittleEndian.Uint32(b[32:])
	w.RemoteQPN = binary.LittleEndian.Uint32(b[36:])
	w.RemoteQKey = binary.LittleEndian.Uint32(b[40:])
	w.AHHandle = binary.LittleEndian.Uint32(b[44:])
	w.CompareAdd = binary.LittleEndian.Uint64(b[48:])
	w.Swap = binary.LittleEndian.Uint64(b[56:])
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
	_ = b[15]
	binary.LittleEndian.PutUint64(b[0:], r.WrID)
	binary.LittleEndian.PutUint32(b[8:], r.NumSGE)
	binary.LittleEndian.PutUint32(b[12:], r.Reserved)
}

// Decode reads r from b[:16].
func (r *RecvWQE) Decode(b []byte) {
	_ = b[15]
	r.WrID = binary.LittleEndian.Uint64(b[0:])
	r.NumSGE = binary.LittleEndian.Uint32(b[8:])
	r.Reserved = binary.LittleEndian.Uint32(b[12:])
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

// Byte offsets inside a CQE used by producers and consumers.
const (
	OffCQETail  = 28 // pkey_index, sl, owner: the word stored last
	OffCQEOwner = 31
)

// PutBody encodes every field but the tail word (pkey_index, sl, owner)
// into b[:28].
func (c *CQE) PutBody(b []byte) {
	_ = b[27]
	binary.LittleEndian.PutUint64(b[0:], c.WrID)
	binary.LittleEndian.PutUint32(b[8:], c.ByteLen)
	binary.LittleEndian.PutUint32(b[12:], c.ImmOrInv)
	binary.LittleEndian.PutUint32(b[16:], c.QPNum)
	binary.LittleEndian.PutUint32(b[20:], c.SrcQP)
	b[24] = byte(c.Status)
	b[25] = byte(c.Opcode)
	b[26] = byte(c.WCFlags)
	b[27] = c.VendorErr
}

// TailWord is the little-endian value of bytes 28..31: pkey_index, sl and
// owner.
func (c *CQE) TailWord() uint32 {
	return uint32(c.PKeyIndex) | uint32(c.SL)<<16 | uint32(c.Owner)<<24
}

// Put encodes c into b[:32] (all fields, no ordering guarantee).
func (c *CQE) Put(b []byte) {
	_ = b[31]
	c.PutBody(b)
	binary.LittleEndian.PutUint32(b[28:], c.TailWord())
}

// Decode reads c from b[:32].
func (c *CQE) Decode(b []byte) {
	_ = b[31]
	c.WrID = binary.LittleEndian.Uint64(b[0:])
	c.ByteLen = binary.LittleEndian.Uint32(b[8:])
	c.ImmOrInv = binary.LittleEndian.Uint32(b[12:])
	c.QPNum = binary.LittleEndian.Uint32(b[16:])
	c.SrcQP = binary.LittleEndian.Uint32(b[20:])
	c.Status = WCStatus(b[24])
	c.Opcode = WCOpcode(b[25])
	c.WCFlags = WCFlags(b[26])
	c.VendorErr = b[27]
	c.PKeyIndex = binary.LittleEndian.Uint16(b[28:])
	c.SL = b[30]
	c.Owner = b[31]
}

// CQEPhase is the owner bit value that marks entry index (free-running) as
// valid in a ring of count entries: 1 on the first pass, 0 on the second,
// and so on. count must be a power of two.
func CQEPhase(index, count uint32) uint8 {
	return uint8(1 - (index/count)&1)
}
