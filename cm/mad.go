package cm

import (
	"encoding/binary"
	"fmt"
)

// A CM MAD is 256 bytes: the 24-byte common MAD header, then 232 bytes of
// CM data laid out per attribute (IBTA vol. 1, 12.6 and 13.4.3):
//
//	 0               1               2               3
//	+---------------+---------------+---------------+---------------+
//	| BaseVersion   | MgmtClass     | ClassVersion  | R | Method    |  0
//	+---------------+---------------+---------------+---------------+
//	| Status                        | ClassSpecific                 |  4
//	+---------------+---------------+---------------+---------------+
//	| TransactionID                                                 |  8
//	|                                                               |
//	+---------------+---------------+---------------+---------------+
//	| AttributeID                   | Reserved                      | 16
//	+---------------+---------------+---------------+---------------+
//	| AttributeModifier                                             | 20
//	+---------------+---------------+---------------+---------------+
//	| CM data (232 bytes)                                           | 24
//
// All fields are big-endian. Inside the CM data a field is named by its
// byte offset and its bit offset from the most significant bit of that
// byte, as the IBTA tables do (Linux include/rdma/ibta_vol1_c12.h).

// MAD sizes.
const (
	MADLen       = 256
	MADHeaderLen = 24
	DataLen      = MADLen - MADHeaderLen
)

// Values of the common MAD header of every CM MAD.
const (
	BaseVersion  = 1    // IB_MGMT_BASE_VERSION
	MgmtClassCM  = 0x07 // IB_MGMT_CLASS_CM
	ClassVersion = 2    // IB_CM_CLASS_VERSION
	MethodSend   = 0x03 // IB_MGMT_METHOD_SEND
)

// QP1 addressing of CM datagrams (include/rdma/ib_mad.h).
const (
	// QP1QKey is the Q_Key of the general services QP (IB_QP1_QKEY).
	QP1QKey = 0x80010000
	// QP1 is the QPN of the general services interface.
	QP1 = 1
	// DefaultPKey is the full-membership default partition key, the
	// only one RoCE uses.
	DefaultPKey = 0xffff
)

// AttrID is a CM attribute ID: which message the MAD carries.
type AttrID uint16

// CM attribute IDs (IBTA Table 102).
const (
	AttrClassPortInfo AttrID = 0x0001
	AttrREQ           AttrID = 0x0010
	AttrMRA           AttrID = 0x0011
	AttrREJ           AttrID = 0x0012
	AttrREP           AttrID = 0x0013
	AttrRTU           AttrID = 0x0014
	AttrDREQ          AttrID = 0x0015
	AttrDREP          AttrID = 0x0016
	AttrSIDRREQ       AttrID = 0x0017
	AttrSIDRREP       AttrID = 0x0018
	AttrLAP           AttrID = 0x0019
	AttrAPR           AttrID = 0x001a
)

func (a AttrID) String() string {
	switch a {
	case AttrClassPortInfo:
		return "ClassPortInfo"
	case AttrREQ:
		return "REQ"
	case AttrMRA:
		return "MRA"
	case AttrREJ:
		return "REJ"
	case AttrREP:
		return "REP"
	case AttrRTU:
		return "RTU"
	case AttrDREQ:
		return "DREQ"
	case AttrDREP:
		return "DREP"
	case AttrSIDRREQ:
		return "SIDR_REQ"
	case AttrSIDRREP:
		return "SIDR_REP"
	case AttrLAP:
		return "LAP"
	case AttrAPR:
		return "APR"
	}
	return fmt.Sprintf("AttrID(0x%04x)", uint16(a))
}

// Header is the common MAD header.
type Header struct {
	BaseVersion   uint8
	MgmtClass     uint8
	ClassVersion  uint8
	Method        uint8
	Status        uint16
	ClassSpecific uint16
	TID           uint64
	AttrID        AttrID
	AttrModifier  uint32
}

func (h *Header) encode(b []byte) {
	b[0] = h.BaseVersion
	b[1] = h.MgmtClass
	b[2] = h.ClassVersion
	b[3] = h.Method
	binary.BigEndian.PutUint16(b[4:], h.Status)
	binary.BigEndian.PutUint16(b[6:], h.ClassSpecific)
	binary.BigEndian.PutUint64(b[8:], h.TID)
	binary.BigEndian.PutUint16(b[16:], uint16(h.AttrID))
	binary.BigEndian.PutUint16(b[18:], 0)
	binary.BigEndian.PutUint32(b[20:], h.AttrModifier)
}

func decodeHeader(b []byte) Header {
	return Header{
		BaseVersion:   b[0],
		MgmtClass:     b[1],
		ClassVersion:  b[2],
		Method:        b[3],
		Status:        binary.BigEndian.Uint16(b[4:]),
		ClassSpecific: binary.BigEndian.Uint16(b[6:]),
		TID:           binary.BigEndian.Uint64(b[8:]),
		AttrID:        AttrID(binary.BigEndian.Uint16(b[16:])),
		AttrModifier:  binary.BigEndian.Uint32(b[20:]),
	}
}

// Message is one CM message: *REQ, *MRA, *REJ, *REP, *RTU, *DREQ, *DREP,
// *SIDRReq or *SIDRRep.
type Message interface {
	// Attr returns the attribute ID of the message.
	Attr() AttrID
	encode(e *encoder)
	decode(d *decoder)
}

// Encode writes a whole CM MAD into b (at least MADLen bytes): the common
// header with the CM's fixed values, tid and attrMod, and m's fields. The
// bytes of b not covered by a field (reserved bits) are zeroed. It fails
// with ErrFieldRange when a value does not fit its field.
func Encode(b []byte, tid uint64, attrMod uint32, m Message) error {
	if len(b) < MADLen {
		return fmt.Errorf("%w: buffer of %d bytes", ErrShortMAD, len(b))
	}
	b = b[:MADLen]
	clear(b)
	h := Header{
		BaseVersion: BaseVersion, MgmtClass: MgmtClassCM, ClassVersion: ClassVersion,
		Method: MethodSend, TID: tid, AttrID: m.Attr(), AttrModifier: attrMod,
	}
	h.encode(b)
	e := encoder{b: b[MADHeaderLen:]}
	m.encode(&e)
	if e.err != nil {
		return fmt.Errorf("%v: %w", m.Attr(), e.err)
	}
	return nil
}

// Marshal returns m encoded as a new MAD (see Encode).
func Marshal(tid uint64, attrMod uint32, m Message) ([]byte, error) {
	b := make([]byte, MADLen)
	if err := Encode(b, tid, attrMod, m); err != nil {
		return nil, err
	}
	return b, nil
}

// Decode parses a CM MAD. It accepts exactly MADLen bytes with the CM's
// base version, class, class version and method Send, an attribute this
// package implements and fields with defined values; anything else is an
// error (ErrShortMAD, ErrBadHeader, ErrUnsupportedAttribute, ErrBadField),
// never a panic. Reserved bits are ignored, as IBTA asks of receivers.
func Decode(b []byte) (Header, Message, error) {
	if len(b) != MADLen {
		return Header{}, nil, fmt.Errorf("%w: %d bytes", ErrShortMAD, len(b))
	}
	h := decodeHeader(b)
	if h.BaseVersion != BaseVersion || h.MgmtClass != MgmtClassCM || h.ClassVersion != ClassVersion || h.Method != MethodSend {
		return h, nil, fmt.Errorf("%w: base version %d, class 0x%02x, class version %d, method 0x%02x",
			ErrBadHeader, h.BaseVersion, h.MgmtClass, h.ClassVersion, h.Method)
	}
	var m Message
	switch h.AttrID {
	case AttrREQ:
		m = new(REQ)
	case AttrMRA:
		m = new(MRA)
	case AttrREJ:
		m = new(REJ)
	case AttrREP:
		m = new(REP)
	case AttrRTU:
		m = new(RTU)
	case AttrDREQ:
		m = new(DREQ)
	case AttrDREP:
		m = new(DREP)
	case AttrSIDRREQ:
		m = new(SIDRReq)
	case AttrSIDRREP:
		m = new(SIDRRep)
	default:
		return h, nil, fmt.Errorf("%w: %v", ErrUnsupportedAttribute, h.AttrID)
	}
	d := decoder{b: b[MADHeaderLen:]}
	m.decode(&d)
	if d.err != nil {
		return h, nil, fmt.Errorf("%v: %w", h.AttrID, d.err)
	}
	return h, m, nil
}

// field is a bit field of the CM data: it starts bit bits (counted from
// the most significant bit of byte 0) into the data and is width bits
// wide (1 to 64).
type field struct {
	name       string
	bit, width int
}

// fld names the field at byte off, bit offset bit (from the byte's most
// significant bit), width bits wide: the IBTA tables' notation.
func fld(name string, off, bit, width int) field { return field{name, off*8 + bit, width} }

type encoder struct {
	b   []byte
	err error
}

func (e *encoder) put(fl field, v uint64) {
	if fl.width < 64 && v>>fl.width != 0 {
		if e.err == nil {
			e.err = fmt.Errorf("%w: %s = %#x (%d bits)", ErrFieldRange, fl.name, v, fl.width)
		}
		return
	}
	for i := fl.width - 1; i >= 0; i-- {
		p := fl.bit + fl.width - 1 - i
		if v>>i&1 != 0 {
			e.b[p>>3] |= 0x80 >> (p & 7)
		}
	}
}

func (e *encoder) bool(fl field, v bool) {
	if v {
		e.put(fl, 1)
	}
}

// bytes copies src into the byte-aligned region at off, n bytes long.
func (e *encoder) bytes(off int, dst []byte) { copy(e.b[off:], dst) }

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) get(fl field) uint64 {
	var v uint64
	for p := fl.bit; p < fl.bit+fl.width; p++ {
		v = v<<1 | uint64(d.b[p>>3]>>(7-p&7)&1)
	}
	return v
}

func (d *decoder) bool(fl field) bool { return d.get(fl) != 0 }

func (d *decoder) bytes(off int, dst []byte) { copy(dst, d.b[off:off+len(dst)]) }

// fail records the first invalid field.
func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrBadField}, args...)...)
	}
}
