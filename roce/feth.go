package roce

import "encoding/binary"

// FETH is a view of the FLUSH Extended Transport Header of the IBTA 1.5
// Memory Placement Extensions (the header Linux rxe_hdr.h calls FETH). It
// follows the BTH of a FLUSH request, before its RETH:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Reserved                       | SEL | PLT   |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// PLT (bits 3..0 of the big-endian word) is the Placement Type, a set:
// FlushGlobal (global visibility) and FlushPersistent (persistence).
// SEL (bits 5..4) is the Selectivity Level: FlushRange (the RETH's
// range of the memory region) or FlushRegion (the whole region the
// R_Key names; the RETH's address and length are then ignored). The
// reserved bits are sent as zeros and ignored on receipt.
type FETH []byte

const (
	fethWord     = 0
	fethPLTMask  = 0x0f
	fethSELShift = 4
	fethSELMask  = 0x3 << fethSELShift
)

// Placement types (FETH PLT bits; IBV_FLUSH_GLOBAL, IBV_FLUSH_PERSISTENT).
const (
	FlushGlobal     uint8 = 1 << 0
	FlushPersistent uint8 = 1 << 1
	// FlushPlacementTypes is every placement type bit the IBTA defines.
	FlushPlacementTypes = FlushGlobal | FlushPersistent
)

// Selectivity levels (FETH SEL; IBV_FLUSH_RANGE, IBV_FLUSH_MR).
const (
	FlushRange  uint8 = 0 // the RETH's range
	FlushRegion uint8 = 1 // the whole memory region of the R_Key
)

// IsValid reports whether b holds a whole FETH.
func (b FETH) IsValid() bool { return len(b) >= FETHLen }

// PlacementType returns the PLT field.
func (b FETH) PlacementType() uint8 {
	return uint8(binary.BigEndian.Uint32(b[fethWord:]) & fethPLTMask)
}

// SelectivityLevel returns the SEL field.
func (b FETH) SelectivityLevel() uint8 {
	return uint8(binary.BigEndian.Uint32(b[fethWord:]) & fethSELMask >> fethSELShift)
}

// FETHFields is a FETH in host form.
type FETHFields struct {
	PlacementType    uint8 // 4 bits
	SelectivityLevel uint8 // 2 bits
}

// Encode writes the header from f (the reserved bits as zeros).
func (b FETH) Encode(f *FETHFields) {
	v := uint32(f.PlacementType)&fethPLTMask | uint32(f.SelectivityLevel)<<fethSELShift&fethSELMask
	binary.BigEndian.PutUint32(b[fethWord:], v)
}

// Fields decodes the header.
func (b FETH) Fields() FETHFields {
	return FETHFields{PlacementType: b.PlacementType(), SelectivityLevel: b.SelectivityLevel()}
}
