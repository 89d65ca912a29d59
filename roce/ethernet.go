package roce

import "encoding/binary"

// Ethernet is a view of an Ethernet II header, with or without one IEEE
// 802.1Q tag:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Destination MAC address                    |
//	+                               +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                               |                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+                               +
//	|                      Source MAC address                       |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  EtherType or TPID 0x8100     | (tagged) PCP |D|     VID      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	| (tagged) EtherType            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// IsValid is the gate: after it, every accessor is in bounds.
type Ethernet []byte

const (
	ethDst     = 0
	ethSrc     = 6
	ethType    = 12
	ethTCI     = 14
	ethTagType = 16

	// EthernetHeaderLen is the length of an untagged Ethernet header.
	EthernetHeaderLen = 14
	// VLANTagLen is the length of one 802.1Q tag.
	VLANTagLen = 4

	// EtherTypeIPv4 is the EtherType of IPv4.
	EtherTypeIPv4 = 0x0800
	// EtherTypeIPv6 is the EtherType of IPv6.
	EtherTypeIPv6 = 0x86dd
	// EtherTypeVLAN is the 802.1Q tag protocol identifier (TPID).
	EtherTypeVLAN = 0x8100
	// EtherTypeRoCEv1 is the EtherType of RoCE v1 (IB GRH over Ethernet).
	EtherTypeRoCEv1 = 0x8915
	// EtherTypeARP is the EtherType of ARP.
	EtherTypeARP = 0x0806
)

// IsValid reports whether e holds a whole header, including the 802.1Q
// tag when the TPID says one is present.
func (e Ethernet) IsValid() bool {
	if len(e) < EthernetHeaderLen {
		return false
	}
	return !e.Tagged() || len(e) >= EthernetHeaderLen+VLANTagLen
}

// HeaderLen is 14, or 18 with an 802.1Q tag.
func (e Ethernet) HeaderLen() int {
	if e.Tagged() {
		return EthernetHeaderLen + VLANTagLen
	}
	return EthernetHeaderLen
}

// Dst returns the destination MAC address.
func (e Ethernet) Dst() (a [6]byte) { copy(a[:], e[ethDst:]); return a }

// Src returns the source MAC address.
func (e Ethernet) Src() (a [6]byte) { copy(a[:], e[ethSrc:]); return a }

// SetDst sets the destination MAC address.
func (e Ethernet) SetDst(a [6]byte) { copy(e[ethDst:], a[:]) }

// SetSrc sets the source MAC address.
func (e Ethernet) SetSrc(a [6]byte) { copy(e[ethSrc:], a[:]) }

// Tagged reports whether the header carries an 802.1Q tag (TPID 0x8100).
func (e Ethernet) Tagged() bool {
	return binary.BigEndian.Uint16(e[ethType:]) == EtherTypeVLAN
}

// TCI returns the 802.1Q tag control information (PCP, DEI, VID); 0 when
// untagged.
func (e Ethernet) TCI() uint16 {
	if !e.Tagged() {
		return 0
	}
	return binary.BigEndian.Uint16(e[ethTCI:])
}

// Type returns the EtherType of the payload (after the tag, if any).
func (e Ethernet) Type() uint16 {
	if e.Tagged() {
		return binary.BigEndian.Uint16(e[ethTagType:])
	}
	return binary.BigEndian.Uint16(e[ethType:])
}

// EthernetFields is an Ethernet header in host form.
type EthernetFields struct {
	Dst, Src [6]byte
	// VLAN selects an 802.1Q tag carrying TCI.
	VLAN bool
	TCI  uint16
	// Type is the payload EtherType.
	Type uint16
}

// Len is the encoded length: 14, or 18 with VLAN.
func (f *EthernetFields) Len() int {
	if f.VLAN {
		return EthernetHeaderLen + VLANTagLen
	}
	return EthernetHeaderLen
}

// Encode writes the header; e must be at least f.Len() bytes.
func (e Ethernet) Encode(f *EthernetFields) {
	copy(e[ethDst:ethDst+6], f.Dst[:])
	copy(e[ethSrc:ethSrc+6], f.Src[:])
	if f.VLAN {
		binary.BigEndian.PutUint16(e[ethType:], EtherTypeVLAN)
		binary.BigEndian.PutUint16(e[ethTCI:], f.TCI)
		binary.BigEndian.PutUint16(e[ethTagType:], f.Type)
		return
	}
	binary.BigEndian.PutUint16(e[ethType:], f.Type)
}

// Fields decodes the header.
func (e Ethernet) Fields() EthernetFields {
	return EthernetFields{Dst: e.Dst(), Src: e.Src(), VLAN: e.Tagged(), TCI: e.TCI(), Type: e.Type()}
}
