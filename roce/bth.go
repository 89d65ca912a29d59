package roce

import "encoding/binary"

// BTH is a view of the InfiniBand Base Transport Header (IBTA vol. 1,
// 9.2), 12 bytes, first header of every RoCE v2 packet:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|    OpCode     |S|M|Pad|  TVer |        Partition Key          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|F|B|  Resv6a   |            Destination QP                     |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|A|   Resv7     |         Packet Sequence Number                |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// S = SE (solicited event), M = MigReq, Pad = PadCnt, F = FECN and
// B = BECN (RoCE v2 congestion bits in the IB Resv8a byte), A = AckReq.
// Byte 4 (FECN, BECN, Resv6a) is taken as all ones by the ICRC.
type BTH []byte

const (
	bthOpcode = 0
	bthFlags  = 1
	bthPKey   = 2
	bthFB     = 4
	bthDestQP = 4 // 24 bits in the word at 4
	bthAck    = 8
	bthPSN    = 8 // 24 bits in the word at 8

	bthSE       = 0x80
	bthMigReq   = 0x40
	bthPadShift = 4
	bthPadMask  = 0x30
	bthTVerMask = 0x0f
	bthFECN     = 0x80
	bthBECN     = 0x40
	bthAckReq   = 0x80

	// BTHLen is the length of the BTH.
	BTHLen = 12
	// QPNMask masks a 24-bit QP number.
	QPNMask = 0xffffff
	// DefaultPKey is the default partition key (full membership).
	DefaultPKey = 0xffff
)

// IsValid reports whether b holds a whole BTH.
func (b BTH) IsValid() bool { return len(b) >= BTHLen }

// Opcode returns the OpCode field.
func (b BTH) Opcode() Opcode { return Opcode(b[bthOpcode]) }

// SetOpcode sets the OpCode field.
func (b BTH) SetOpcode(v Opcode) { b[bthOpcode] = uint8(v) }

// SE returns the Solicited Event bit.
func (b BTH) SE() bool { return b[bthFlags]&bthSE != 0 }

// SetSE sets the Solicited Event bit.
func (b BTH) SetSE(v bool) { b[bthFlags] = setBit(b[bthFlags], bthSE, v) }

// MigReq returns the MigReq bit.
func (b BTH) MigReq() bool { return b[bthFlags]&bthMigReq != 0 }

// SetMigReq sets the MigReq bit.
func (b BTH) SetMigReq(v bool) { b[bthFlags] = setBit(b[bthFlags], bthMigReq, v) }

// PadCount returns the PadCnt field: pad bytes after the payload (0..3).
func (b BTH) PadCount() int { return int(b[bthFlags]&bthPadMask) >> bthPadShift }

// SetPadCount sets the PadCnt field (low 2 bits of v).
func (b BTH) SetPadCount(v int) {
	b[bthFlags] = b[bthFlags]&^bthPadMask | uint8(v<<bthPadShift)&bthPadMask
}

// TVer returns the Transport Header Version field (0 today).
func (b BTH) TVer() uint8 { return b[bthFlags] & bthTVerMask }

// SetTVer sets the Transport Header Version field.
func (b BTH) SetTVer(v uint8) { b[bthFlags] = b[bthFlags]&^bthTVerMask | v&bthTVerMask }

// PKey returns the Partition Key field.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[bthPKey:]) }

// SetPKey sets the Partition Key field.
func (b BTH) SetPKey(v uint16) { binary.BigEndian.PutUint16(b[bthPKey:], v) }

// FECN returns the Forward Explicit Congestion Notification bit.
func (b BTH) FECN() bool { return b[bthFB]&bthFECN != 0 }

// SetFECN sets the FECN bit.
func (b BTH) SetFECN(v bool) { b[bthFB] = setBit(b[bthFB], bthFECN, v) }

// BECN returns the Backward Explicit Congestion Notification bit.
func (b BTH) BECN() bool { return b[bthFB]&bthBECN != 0 }

// SetBECN sets the BECN bit.
func (b BTH) SetBECN(v bool) { b[bthFB] = setBit(b[bthFB], bthBECN, v) }

// DestQP returns the 24-bit Destination QP field.
func (b BTH) DestQP() uint32 { return binary.BigEndian.Uint32(b[bthDestQP:]) & QPNMask }

// SetDestQP sets the Destination QP field, keeping FECN/BECN/Resv6a.
func (b BTH) SetDestQP(v uint32) { put24(b[bthDestQP:], v) }

// AckReq returns the AckReq bit.
func (b BTH) AckReq() bool { return b[bthAck]&bthAckReq != 0 }

// SetAckReq sets the AckReq bit.
func (b BTH) SetAckReq(v bool) { b[bthAck] = setBit(b[bthAck], bthAckReq, v) }

// PSN returns the 24-bit Packet Sequence Number field.
func (b BTH) PSN() uint32 { return binary.BigEndian.Uint32(b[bthPSN:]) & PSNMask }

// SetPSN sets the PSN field, keeping AckReq and Resv7.
func (b BTH) SetPSN(v uint32) { put24(b[bthPSN:], v) }

// BTHFields is a BTH in host form. Resv6a and Resv7 are written as zero.
type BTHFields struct {
	Opcode   Opcode
	SE       bool
	MigReq   bool
	PadCount int // 0..3; Build computes it
	TVer     uint8
	PKey     uint16
	FECN     bool
	BECN     bool
	DestQP   uint32
	AckReq   bool
	PSN      uint32
}

// Encode writes the 12-byte header from f.
func (b BTH) Encode(f *BTHFields) {
	_ = b[BTHLen-1]
	b[bthOpcode] = uint8(f.Opcode)
	b[bthFlags] = boolBit(f.SE, bthSE) | boolBit(f.MigReq, bthMigReq) |
		uint8(f.PadCount<<bthPadShift)&bthPadMask | f.TVer&bthTVerMask
	binary.BigEndian.PutUint16(b[bthPKey:], f.PKey)
	binary.BigEndian.PutUint32(b[bthDestQP:], f.DestQP&QPNMask)
	b[bthFB] = boolBit(f.FECN, bthFECN) | boolBit(f.BECN, bthBECN)
	binary.BigEndian.PutUint32(b[bthPSN:], f.PSN&PSNMask)
	b[bthAck] = boolBit(f.AckReq, bthAckReq)
}

// Fields decodes the header.
func (b BTH) Fields() BTHFields {
	return BTHFields{
		Opcode: b.Opcode(), SE: b.SE(), MigReq: b.MigReq(), PadCount: b.PadCount(),
		TVer: b.TVer(), PKey: b.PKey(), FECN: b.FECN(), BECN: b.BECN(),
		DestQP: b.DestQP(), AckReq: b.AckReq(), PSN: b.PSN(),
	}
}

func setBit(b, mask uint8, v bool) uint8 {
	if v {
		return b | mask
	}
	return b &^ mask
}

func boolBit(v bool, mask uint8) uint8 {
	if v {
		return mask
	}
	return 0
}

// put24 writes the low 24 bits of v big-endian into b[1:4], keeping b[0].
func put24(b []byte, v uint32) {
	_ = b[3]
	b[1] = uint8(v >> 16)
	b[2] = uint8(v >> 8)
	b[3] = uint8(v)
}
