package roce

import "encoding/binary"

// Extension transport headers (IBTA vol. 1, 9.3). Each is a view with an
// IsValid gate; Parse hands out views of exactly the header's length.

// Lengths of the extension headers, the CNP's reserved block and the ICRC.
const (
	RETHLen         = 16
	AETHLen         = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	ImmDtLen        = 4
	IETHLen         = 4
	DETHLen         = 8
	XRCETHLen       = 4
	FETHLen         = 4
	// CNPReservedLen is the reserved block that follows the BTH of a RoCE
	// v2 Congestion Notification Packet (IBTA Annex A17.9.2).
	CNPReservedLen = 16
	// ICRCLen is the length of the invariant CRC at the end of a packet.
	ICRCLen = 4
	// GRHLen is the length of the Global Route Header (IBTA 8.3). RoCE
	// v2 carries the GRH as the IP header, but a UD receive buffer still
	// starts with 40 bytes for it (IBTA 11.4.1.2): the IPv6 header, or 20
	// zero bytes and the IPv4 header (annex A17.4.5.1, as Linux writes
	// them).
	GRHLen = 40
)

// RETH is a view of the RDMA Extended Transport Header (IBTA 9.3.3):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                   Virtual Address (63..32)                    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                   Virtual Address (31..0)                     |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                           R_Key                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                         DMA Length                            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type RETH []byte

const (
	rethVA     = 0
	rethRKey   = 8
	rethDMALen = 12
)

// IsValid reports whether b holds a whole RETH.
func (b RETH) IsValid() bool { return len(b) >= RETHLen }

// VA returns the Virtual Address field.
func (b RETH) VA() uint64 { return binary.BigEndian.Uint64(b[rethVA:]) }

// SetVA sets the Virtual Address field.
func (b RETH) SetVA(v uint64) { binary.BigEndian.PutUint64(b[rethVA:], v) }

// RKey returns the R_Key field.
func (b RETH) RKey() uint32 { return binary.BigEndian.Uint32(b[rethRKey:]) }

// SetRKey sets the R_Key field.
func (b RETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(b[rethRKey:], v) }

// DMALength returns the DMA Length field.
func (b RETH) DMALength() uint32 { return binary.BigEndian.Uint32(b[rethDMALen:]) }

// SetDMALength sets the DMA Length field.
func (b RETH) SetDMALength(v uint32) { binary.BigEndian.PutUint32(b[rethDMALen:], v) }

// RETHFields is a RETH in host form.
type RETHFields struct {
	VA        uint64
	RKey      uint32
	DMALength uint32
}

// Encode writes the header from f.
func (b RETH) Encode(f *RETHFields) {
	_ = b[RETHLen-1]
	b.SetVA(f.VA)
	b.SetRKey(f.RKey)
	b.SetDMALength(f.DMALength)
}

// Fields decodes the header.
func (b RETH) Fields() RETHFields {
	return RETHFields{VA: b.VA(), RKey: b.RKey(), DMALength: b.DMALength()}
}

// AETH is a view of the ACK Extended Transport Header (IBTA 9.3.5):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|   Syndrome    |             Message Sequence Number           |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// See Syndrome for the syndrome's encoding.
type AETH []byte

const (
	aethSyndrome = 0
	aethMSN      = 0 // 24 bits in the word at 0
)

// IsValid reports whether b holds a whole AETH.
func (b AETH) IsValid() bool { return len(b) >= AETHLen }

// Syndrome returns the Syndrome field.
func (b AETH) Syndrome() Syndrome { return Syndrome(b[aethSyndrome]) }

// SetSyndrome sets the Syndrome field.
func (b AETH) SetSyndrome(v Syndrome) { b[aethSyndrome] = uint8(v) }

// MSN returns the 24-bit Message Sequence Number field.
func (b AETH) MSN() uint32 { return binary.BigEndian.Uint32(b[aethMSN:]) & 0xffffff }

// SetMSN sets the MSN field.
func (b AETH) SetMSN(v uint32) { put24(b[aethMSN:], v) }

// AETHFields is an AETH in host form.
type AETHFields struct {
	Syndrome Syndrome
	MSN      uint32
}

// Encode writes the header from f.
func (b AETH) Encode(f *AETHFields) {
	binary.BigEndian.PutUint32(b[aethMSN:], uint32(f.Syndrome)<<24|f.MSN&0xffffff)
}

// Fields decodes the header.
func (b AETH) Fields() AETHFields { return AETHFields{Syndrome: b.Syndrome(), MSN: b.MSN()} }

// AtomicETH is a view of the Atomic Extended Transport Header (IBTA
// 9.3.4):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                 Virtual Address (64 bits)                     |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                           R_Key                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|               Swap (or Add) Data (64 bits)                    |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                  Compare Data (64 bits)                       |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type AtomicETH []byte

const (
	atomicVA      = 0
	atomicRKey    = 8
	atomicSwapAdd = 12
	atomicCompare = 20
)

// IsValid reports whether b holds a whole AtomicETH.
func (b AtomicETH) IsValid() bool { return len(b) >= AtomicETHLen }

// VA returns the Virtual Address field.
func (b AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(b[atomicVA:]) }

// SetVA sets the Virtual Address field.
func (b AtomicETH) SetVA(v uint64) { binary.BigEndian.PutUint64(b[atomicVA:], v) }

// RKey returns the R_Key field.
func (b AtomicETH) RKey() uint32 { return binary.BigEndian.Uint32(b[atomicRKey:]) }

// SetRKey sets the R_Key field.
func (b AtomicETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(b[atomicRKey:], v) }

// SwapAdd returns the Swap (or Add) Data field.
func (b AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(b[atomicSwapAdd:]) }

// SetSwapAdd sets the Swap (or Add) Data field.
func (b AtomicETH) SetSwapAdd(v uint64) { binary.BigEndian.PutUint64(b[atomicSwapAdd:], v) }

// Compare returns the Compare Data field.
func (b AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(b[atomicCompare:]) }

// SetCompare sets the Compare Data field.
func (b AtomicETH) SetCompare(v uint64) { binary.BigEndian.PutUint64(b[atomicCompare:], v) }

// AtomicETHFields is an AtomicETH in host form.
type AtomicETHFields struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64
	Compare uint64
}

// Encode writes the header from f.
func (b AtomicETH) Encode(f *AtomicETHFields) {
	_ = b[AtomicETHLen-1]
	b.SetVA(f.VA)
	b.SetRKey(f.RKey)
	b.SetSwapAdd(f.SwapAdd)
	b.SetCompare(f.Compare)
}

// Fields decodes the header.
func (b AtomicETH) Fields() AtomicETHFields {
	return AtomicETHFields{VA: b.VA(), RKey: b.RKey(), SwapAdd: b.SwapAdd(), Compare: b.Compare()}
}

// AtomicAckETH is a view of the Atomic Acknowledge Extended Transport
// Header (IBTA 9.3.6):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|               Original Remote Data (64 bits)                  |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type AtomicAckETH []byte

// IsValid reports whether b holds a whole AtomicAckETH.
func (b AtomicAckETH) IsValid() bool { return len(b) >= AtomicAckETHLen }

// OrigRemoteData returns the Original Remote Data field.
func (b AtomicAckETH) OrigRemoteData() uint64 { return binary.BigEndian.Uint64(b) }

// SetOrigRemoteData sets the Original Remote Data field.
func (b AtomicAckETH) SetOrigRemoteData(v uint64) { binary.BigEndian.PutUint64(b, v) }

// AtomicAckETHFields is an AtomicAckETH in host form.
type AtomicAckETHFields struct {
	OrigRemoteData uint64
}

// Encode writes the header from f.
func (b AtomicAckETH) Encode(f *AtomicAckETHFields) { b.SetOrigRemoteData(f.OrigRemoteData) }

// Fields decodes the header.
func (b AtomicAckETH) Fields() AtomicAckETHFields {
	return AtomicAckETHFields{OrigRemoteData: b.OrigRemoteData()}
}

// ImmDt is a view of the Immediate Data Extended Transport Header (IBTA
// 9.3.7):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                       Immediate Data                          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The verbs hand immediate data around in network byte order; Imm returns
// the big-endian value of the four bytes.
type ImmDt []byte

// IsValid reports whether b holds a whole ImmDt.
func (b ImmDt) IsValid() bool { return len(b) >= ImmDtLen }

// Imm returns the Immediate Data field.
func (b ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(b) }

// SetImm sets the Immediate Data field.
func (b ImmDt) SetImm(v uint32) { binary.BigEndian.PutUint32(b, v) }

// IETH is a view of the Invalidate Extended Transport Header (IBTA
// 9.3.8), carried by SEND with Invalidate:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                           R_Key                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type IETH []byte

// IsValid reports whether b holds a whole IETH.
func (b IETH) IsValid() bool { return len(b) >= IETHLen }

// RKey returns the R_Key field: the key to invalidate.
func (b IETH) RKey() uint32 { return binary.BigEndian.Uint32(b) }

// SetRKey sets the R_Key field.
func (b IETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(b, v) }

// DETH is a view of the Datagram Extended Transport Header (IBTA 9.3.2),
// carried by UD packets:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                        Queue Key                              |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|    Reserved   |            Source QP                          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type DETH []byte

const (
	dethQKey  = 0
	dethSrcQP = 4 // 24 bits in the word at 4
)

// IsValid reports whether b holds a whole DETH.
func (b DETH) IsValid() bool { return len(b) >= DETHLen }

// QKey returns the Queue Key field.
func (b DETH) QKey() uint32 { return binary.BigEndian.Uint32(b[dethQKey:]) }

// SetQKey sets the Queue Key field.
func (b DETH) SetQKey(v uint32) { binary.BigEndian.PutUint32(b[dethQKey:], v) }

// SrcQP returns the 24-bit Source QP field.
func (b DETH) SrcQP() uint32 { return binary.BigEndian.Uint32(b[dethSrcQP:]) & QPNMask }

// SetSrcQP sets the Source QP field.
func (b DETH) SetSrcQP(v uint32) { put24(b[dethSrcQP:], v) }

// DETHFields is a DETH in host form.
type DETHFields struct {
	QKey  uint32
	SrcQP uint32
}

// Encode writes the header from f (Reserved written as zero).
func (b DETH) Encode(f *DETHFields) {
	_ = b[DETHLen-1]
	b.SetQKey(f.QKey)
	binary.BigEndian.PutUint32(b[dethSrcQP:], f.SrcQP&QPNMask)
}

// Fields decodes the header.
func (b DETH) Fields() DETHFields { return DETHFields{QKey: b.QKey(), SrcQP: b.SrcQP()} }

// XRCETH is a view of the XRC Extended Transport Header (IBTA vol. 1
// 9.3, added with XRC in release 1.2.1), carried after the BTH by every XRC request: the
// XRC SRQ at the responder that the request is for.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|    Reserved   |            XRC SRQ Number                     |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type XRCETH []byte

const xrcethSRQN = 0 // 24 bits in the word at 0

// IsValid reports whether b holds a whole XRCETH.
func (b XRCETH) IsValid() bool { return len(b) >= XRCETHLen }

// SRQN returns the 24-bit XRC SRQ Number field.
func (b XRCETH) SRQN() uint32 { return binary.BigEndian.Uint32(b[xrcethSRQN:]) & QPNMask }

// SetSRQN sets the XRC SRQ Number field (Reserved written as zero).
func (b XRCETH) SetSRQN(v uint32) { binary.BigEndian.PutUint32(b[xrcethSRQN:], v&QPNMask) }

// extCodec is what the parser and the builder do with one extension
// header (or the CNP's reserved block), given exactly its bytes: view
// points the parsed packet's view at them (Parse, ParseUDP), encode
// writes them from Headers (Build), decode reads them into Headers
// (Packet.Headers). The opcode table says which headers an opcode carries
// and at which offsets; this table says what each one is, once.
type extCodec struct {
	view   func(pkt *Packet, b []byte)
	encode func(b []byte, h *Headers)
	decode func(b []byte, h *Headers)
}

var extCodecs = [numHeaders]extCodec{
	HdrDETH: {
		view:   func(pkt *Packet, b []byte) { pkt.DETH = b },
		encode: func(b []byte, h *Headers) { DETH(b).Encode(&h.DETH) },
		decode: func(b []byte, h *Headers) { h.DETH = DETH(b).Fields() },
	},
	HdrXRCETH: {
		view:   func(pkt *Packet, b []byte) { pkt.XRCETH = b },
		encode: func(b []byte, h *Headers) { XRCETH(b).SetSRQN(h.XRCSRQN) },
		decode: func(b []byte, h *Headers) { h.XRCSRQN = XRCETH(b).SRQN() },
	},
	HdrFETH: {
		view:   func(pkt *Packet, b []byte) { pkt.FETH = b },
		encode: func(b []byte, h *Headers) { FETH(b).Encode(&h.FETH) },
		decode: func(b []byte, h *Headers) { h.FETH = FETH(b).Fields() },
	},
	HdrRETH: {
		view:   func(pkt *Packet, b []byte) { pkt.RETH = b },
		encode: func(b []byte, h *Headers) { RETH(b).Encode(&h.RETH) },
		decode: func(b []byte, h *Headers) { h.RETH = RETH(b).Fields() },
	},
	HdrAtomicETH: {
		view:   func(pkt *Packet, b []byte) { pkt.AtomicETH = b },
		encode: func(b []byte, h *Headers) { AtomicETH(b).Encode(&h.AtomicETH) },
		decode: func(b []byte, h *Headers) { h.AtomicETH = AtomicETH(b).Fields() },
	},
	HdrAETH: {
		view:   func(pkt *Packet, b []byte) { pkt.AETH = b },
		encode: func(b []byte, h *Headers) { AETH(b).Encode(&h.AETH) },
		decode: func(b []byte, h *Headers) { h.AETH = AETH(b).Fields() },
	},
	HdrAtomicAckETH: {
		view:   func(pkt *Packet, b []byte) { pkt.AtomicAckETH = b },
		encode: func(b []byte, h *Headers) { AtomicAckETH(b).Encode(&h.AtomicAckETH) },
		decode: func(b []byte, h *Headers) { h.AtomicAckETH = AtomicAckETH(b).Fields() },
	},
	HdrImmDt: {
		view:   func(pkt *Packet, b []byte) { pkt.ImmDt = b },
		encode: func(b []byte, h *Headers) { ImmDt(b).SetImm(h.Imm) },
		decode: func(b []byte, h *Headers) { h.Imm = ImmDt(b).Imm() },
	},
	HdrIETH: {
		view:   func(pkt *Packet, b []byte) { pkt.IETH = b },
		encode: func(b []byte, h *Headers) { IETH(b).SetRKey(h.InvRKey) },
		decode: func(b []byte, h *Headers) { h.InvRKey = IETH(b).RKey() },
	},
	HdrCNPReserved: { // reserved: written as zeros, no view, no field
		view:   func(*Packet, []byte) {},
		encode: func(b []byte, _ *Headers) { clear(b) },
		decode: func([]byte, *Headers) {},
	},
}
