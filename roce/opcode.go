package roce

import (
	"math/bits"
	"strconv"
	"strings"
)

//go:generate go tool stringer -type=Service -trimprefix=Service
//go:generate go tool stringer -type=Header -trimprefix=Hdr

// Opcode is the BTH OpCode (IBTA vol. 1, 9.2.1, table 38): bits 7..5 are
// the transport service (RC 000, UC 001, RD 010, UD 011, CNP 100, XRC
// 101), bits 4..0 the operation.
type Opcode uint8

// Opcodes vrnic knows: every RC, UC, UD and XRC opcode of IBTA 1.4, the
// RC FLUSH and ATOMIC WRITE of the IBTA 1.5 Memory Placement Extensions,
// and the RoCE v2 Congestion Notification Packet. An XRC opcode is its RC
// twin plus XRCOpcodeOffset (IBTA 9.2.1 table 38, XRC 101xxxxx); its
// requests carry an XRCETH after the BTH.
const (
	OpRCSendFirst          Opcode = 0x00
	OpRCSendMiddle         Opcode = 0x01
	OpRCSendLast           Opcode = 0x02
	OpRCSendLastImm        Opcode = 0x03
	OpRCSendOnly           Opcode = 0x04
	OpRCSendOnlyImm        Opcode = 0x05
	OpRCWriteFirst         Opcode = 0x06
	OpRCWriteMiddle        Opcode = 0x07
	OpRCWriteLast          Opcode = 0x08
	OpRCWriteLastImm       Opcode = 0x09
	OpRCWriteOnly          Opcode = 0x0a
	OpRCWriteOnlyImm       Opcode = 0x0b
	OpRCReadRequest        Opcode = 0x0c
	OpRCReadResponseFirst  Opcode = 0x0d
	OpRCReadResponseMiddle Opcode = 0x0e
	OpRCReadResponseLast   Opcode = 0x0f
	OpRCReadResponseOnly   Opcode = 0x10
	OpRCAck                Opcode = 0x11
	OpRCAtomicAck          Opcode = 0x12
	OpRCCompareSwap        Opcode = 0x13
	OpRCFetchAdd           Opcode = 0x14
	OpRCSendLastInv        Opcode = 0x16
	OpRCSendOnlyInv        Opcode = 0x17
	OpRCFlush              Opcode = 0x1c // IBTA 1.5 Memory Placement Extensions
	OpRCAtomicWrite        Opcode = 0x1d // IBTA 1.5 Memory Placement Extensions

	OpUCSendFirst    Opcode = 0x20
	OpUCSendMiddle   Opcode = 0x21
	OpUCSendLast     Opcode = 0x22
	OpUCSendLastImm  Opcode = 0x23
	OpUCSendOnly     Opcode = 0x24
	OpUCSendOnlyImm  Opcode = 0x25
	OpUCWriteFirst   Opcode = 0x26
	OpUCWriteMiddle  Opcode = 0x27
	OpUCWriteLast    Opcode = 0x28
	OpUCWriteLastImm Opcode = 0x29
	OpUCWriteOnly    Opcode = 0x2a
	OpUCWriteOnlyImm Opcode = 0x2b
	OpUDSendOnly     Opcode = 0x64
	OpUDSendOnlyImm  Opcode = 0x65
	OpCNP            Opcode = 0x81

	OpXRCSendFirst   Opcode = 0xa0
	OpXRCSendOnly    Opcode = 0xa4
	OpXRCWriteOnly   Opcode = 0xaa
	OpXRCReadRequest Opcode = 0xac
	OpXRCAck         Opcode = 0xb1
	OpXRCAtomicAck   Opcode = 0xb2
	OpXRCFetchAdd    Opcode = 0xb4

	// XRCOpcodeOffset turns an RC opcode into its XRC twin.
	XRCOpcodeOffset = OpXRCSendFirst - OpRCSendFirst

	opServiceShift = 5
)

// Service is a transport service type, the top three bits of an opcode.
// Its String method is generated: the constant name less "Service".
type Service uint8

// Transport services.
const (
	ServiceRC  Service = 0 // Reliable Connection
	ServiceUC  Service = 1 // Unreliable Connection
	ServiceRD  Service = 2 // Reliable Datagram (not supported)
	ServiceUD  Service = 3 // Unreliable Datagram
	ServiceCNP Service = 4 // RoCE v2 congestion notification
	ServiceXRC Service = 5 // Extended Reliable Connected (IBTA 1.4 annex / ch. 9)
)

// Header names an extension header (or the CNP reserved block) that an
// opcode may carry after the BTH. They appear on the wire in this order.
// Its String method is generated: the constant name less "Hdr".
type Header uint8

// Extension headers in wire order.
const (
	HdrDETH Header = iota
	HdrXRCETH
	HdrFETH
	HdrRETH
	HdrAtomicETH
	HdrAETH
	HdrAtomicAckETH
	HdrImmDt
	HdrIETH
	HdrCNPReserved
	numHeaders = iota // untyped, so that the generated String does not name it
)

var headerLens = [numHeaders]int{
	HdrDETH:         DETHLen,
	HdrXRCETH:       XRCETHLen,
	HdrFETH:         FETHLen,
	HdrRETH:         RETHLen,
	HdrAtomicETH:    AtomicETHLen,
	HdrAETH:         AETHLen,
	HdrAtomicAckETH: AtomicAckETHLen,
	HdrImmDt:        ImmDtLen,
	HdrIETH:         IETHLen,
	HdrCNPReserved:  CNPReservedLen,
}

// Len is the header's length in bytes.
func (h Header) Len() int {
	if h < numHeaders {
		return headerLens[h]
	}
	return 0
}

// HeaderMask is a set of Headers (bit 1<<h).
type HeaderMask uint16

// Has reports whether h is in the set.
func (m HeaderMask) Has(h Header) bool { return m&(1<<h) != 0 }

// first returns the header of the lowest bit of a non-empty set: the
// first in wire order. Iterate with m &= m - 1.
func (m HeaderMask) first() Header { return Header(bits.TrailingZeros16(uint16(m))) }

// OpFlags describe what an opcode means to the transport.
type OpFlags uint32

// Opcode flags.
const (
	// OpPayload: the packet may carry a payload (possibly empty).
	OpPayload OpFlags = 1 << iota
	// OpFirst, OpMiddle, OpLast, OpOnly: position of the packet in its
	// message; exactly one is set. Single-packet operations (READ
	// REQUEST, atomics, ACKs, CNP) are OpOnly.
	OpFirst
	OpMiddle
	OpLast
	OpOnly
	// OpRequest: sent by a requester; OpResponse: sent by a responder
	// (ACK/NAK, READ RESPONSE, ATOMIC ACKNOWLEDGE).
	OpRequest
	OpResponse
	// OpSend, OpWrite, OpRead, OpAtomic: the operation.
	OpSend
	OpWrite
	OpRead
	OpAtomic
	// OpAck: an ACKNOWLEDGE or ATOMIC ACKNOWLEDGE.
	OpAck
	// OpImm: carries immediate data (ImmDt).
	OpImm
	// OpInvalidate: SEND with Invalidate (IETH).
	OpInvalidate
	// OpRecvWQE: the message consumes a receive WQE at the responder
	// (SEND, RDMA WRITE with immediate).
	OpRecvWQE
	// OpAcked: a request of a reliable service; the responder answers it
	// (ACK/NAK, read response or atomic acknowledge) and the requester
	// keeps it until then.
	OpAcked
	// OpCongestion: a RoCE v2 Congestion Notification Packet.
	OpCongestion
	// OpAtomicWrite: ATOMIC WRITE (IBTA 1.5 Memory Placement Extensions):
	// a RETH and exactly 8 bytes of payload, placed at once; answered
	// like a READ with a zero-length RDMA READ RESPONSE Only.
	OpAtomicWrite
	// OpFlush: FLUSH (IBTA 1.5 Memory Placement Extensions): a FETH and
	// a RETH, no payload; answered with a zero-length RDMA READ RESPONSE
	// Only once the memory it names is placed as its FETH asks.
	OpFlush
)

// OpInfo is one entry of the opcode table.
type OpInfo struct {
	// Name is the IBTA name, e.g. "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE".
	Name string
	// Service is the transport service.
	Service Service
	// Headers is the set of extension headers after the BTH.
	Headers HeaderMask
	// HeaderLen is the length of the BTH plus all extension headers: the
	// offset of the payload from the start of the BTH.
	HeaderLen int
	// Flags says what the opcode means.
	Flags OpFlags
	// offsets[h] is the offset of header h from the start of the BTH, or
	// 0 when absent.
	offsets [numHeaders]uint8
}

// Valid reports whether the entry describes a known opcode.
func (i *OpInfo) Valid() bool { return i.Name != "" }

// Has reports whether the opcode carries header h.
func (i *OpInfo) Has(h Header) bool { return i.Headers.Has(h) }

// Offset returns the offset of header h from the start of the BTH, or 0
// when the opcode does not carry it.
func (i *OpInfo) Offset(h Header) int {
	if h >= numHeaders {
		return 0
	}
	return int(i.offsets[h])
}

// ext returns the bytes of header h (which the opcode carries) in t, a
// transport packet from the BTH on at least HeaderLen bytes long.
func (i *OpInfo) ext(t []byte, h Header) []byte {
	o := int(i.offsets[h])
	return t[o : o+headerLens[h]]
}

// Is reports whether all of flags are set.
func (i *OpInfo) Is(flags OpFlags) bool { return i.Flags&flags == flags }

// opTable is the opcode table, computed once at init from opSpecs.
var opTable = buildOpTable()

// Info returns the table entry of op; Valid is false for opcodes vrnic does
// not know.
func (op Opcode) Info() *OpInfo {
	// The table is read-only after init; callers get a pointer to avoid
	// copying on the hot path and must not modify it.
	return &opTable[op]
}

// Valid reports whether op is a known opcode.
func (op Opcode) Valid() bool { return opTable[op].Name != "" }

// opByName maps the table's names to opcodes (OpcodeByName).
var opByName = func() map[string]Opcode {
	m := map[string]Opcode{}
	for i := range 256 {
		if op := Opcode(i); op.Valid() {
			m[op.Info().Name] = op
		}
	}
	return m
}()

// OpcodeByName returns the opcode whose IBTA name (OpInfo.Name, e.g.
// "RC_SEND_ONLY") is name, in any letter case.
func OpcodeByName(name string) (Opcode, bool) {
	op, ok := opByName[strings.ToUpper(name)]
	return op, ok
}

// Service returns the transport service bits of op.
func (op Opcode) Service() Service { return Service(op >> opServiceShift) }

// HeaderLen returns the length of the BTH and extension headers of op, 0
// for unknown opcodes.
func (op Opcode) HeaderLen() int { return opTable[op].HeaderLen }

func (op Opcode) String() string {
	if n := opTable[op].Name; n != "" {
		return n
	}
	return "Opcode(0x" + strconv.FormatUint(uint64(op), 16) + ")"
}

type opSpec struct {
	op    Opcode
	name  string
	hdrs  []Header
	flags OpFlags
}

const (
	sendF  = OpSend | OpRequest | OpPayload | OpRecvWQE
	writeF = OpWrite | OpRequest | OpPayload
	readRF = OpRead | OpResponse | OpPayload
)

// rcUCSpecs are the SEND and RDMA WRITE opcodes, common to RC and UC
// (operation bits only, service added by buildOpTable).
var rcUCSpecs = []opSpec{
	{0x00, "SEND_FIRST", nil, sendF | OpFirst},
	{0x01, "SEND_MIDDLE", nil, sendF | OpMiddle},
	{0x02, "SEND_LAST", nil, sendF | OpLast},
	{0x03, "SEND_LAST_WITH_IMMEDIATE", []Header{HdrImmDt}, sendF | OpLast | OpImm},
	{0x04, "SEND_ONLY", nil, sendF | OpOnly},
	{0x05, "SEND_ONLY_WITH_IMMEDIATE", []Header{HdrImmDt}, sendF | OpOnly | OpImm},
	{0x06, "RDMA_WRITE_FIRST", []Header{HdrRETH}, writeF | OpFirst},
	{0x07, "RDMA_WRITE_MIDDLE", nil, writeF | OpMiddle},
	{0x08, "RDMA_WRITE_LAST", nil, writeF | OpLast},
	{0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", []Header{HdrImmDt}, writeF | OpLast | OpImm | OpRecvWQE},
	{0x0a, "RDMA_WRITE_ONLY", []Header{HdrRETH}, writeF | OpOnly},
	{0x0b, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", []Header{HdrRETH, HdrImmDt}, writeF | OpOnly | OpImm | OpRecvWQE},
}

// rcOnlySpecs are the RC-only opcodes.
var rcOnlySpecs = []opSpec{
	{0x0c, "RDMA_READ_REQUEST", []Header{HdrRETH}, OpRead | OpRequest | OpOnly},
	{0x0d, "RDMA_READ_RESPONSE_FIRST", []Header{HdrAETH}, readRF | OpFirst},
	{0x0e, "RDMA_READ_RESPONSE_MIDDLE", nil, readRF | OpMiddle},
	{0x0f, "RDMA_READ_RESPONSE_LAST", []Header{HdrAETH}, readRF | OpLast},
	{0x10, "RDMA_READ_RESPONSE_ONLY", []Header{HdrAETH}, readRF | OpOnly},
	{0x11, "ACKNOWLEDGE", []Header{HdrAETH}, OpAck | OpResponse | OpOnly},
	{0x12, "ATOMIC_ACKNOWLEDGE", []Header{HdrAETH, HdrAtomicAckETH}, OpAck | OpAtomic | OpResponse | OpOnly},
	{0x13, "COMPARE_SWAP", []Header{HdrAtomicETH}, OpAtomic | OpRequest | OpOnly},
	{0x14, "FETCH_ADD", []Header{HdrAtomicETH}, OpAtomic | OpRequest | OpOnly},
	{0x16, "SEND_LAST_WITH_INVALIDATE", []Header{HdrIETH}, sendF | OpLast | OpInvalidate},
	{0x17, "SEND_ONLY_WITH_INVALIDATE", []Header{HdrIETH}, sendF | OpOnly | OpInvalidate},
	// IBTA 1.5, Memory Placement Extensions (as Linux rxe_opcode.c:
	// IB_OPCODE_RC_FLUSH is BTH, FETH, RETH; IB_OPCODE_RC_ATOMIC_WRITE
	// BTH, RETH and the 8-byte payload).
	{0x1c, "FLUSH", []Header{HdrFETH, HdrRETH}, OpFlush | OpRequest | OpOnly},
	{0x1d, "ATOMIC_WRITE", []Header{HdrRETH}, OpAtomicWrite | OpRequest | OpPayload | OpOnly},
}

// otherSpecs are UD and CNP, with their full opcodes.
var otherSpecs = []opSpec{
	{OpUDSendOnly, "UD_SEND_ONLY", []Header{HdrDETH}, sendF | OpOnly},
	{OpUDSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE", []Header{HdrDETH, HdrImmDt}, sendF | OpOnly | OpImm},
	{OpCNP, "CNP", []Header{HdrCNPReserved}, OpCongestion | OpOnly},
}

func buildOpTable() (t [256]OpInfo) {
	add := func(op Opcode, name string, hdrs []Header, flags OpFlags) {
		e := &t[op]
		e.Name = name
		e.Service = op.Service()
		e.Flags = flags
		for _, h := range hdrs {
			e.Headers |= 1 << h
		}
		off := BTHLen
		for h := Header(0); h < numHeaders; h++ {
			if e.Headers.Has(h) {
				e.offsets[h] = uint8(off)
				off += headerLens[h]
			}
		}
		e.HeaderLen = off
	}
	for _, s := range rcUCSpecs {
		add(s.op, "RC_"+s.name, s.hdrs, s.flags|OpAcked)
		add(s.op|Opcode(ServiceUC)<<opServiceShift, "UC_"+s.name, s.hdrs, s.flags)
	}
	for _, s := range rcOnlySpecs {
		f := s.flags
		if f&OpRequest != 0 {
			f |= OpAcked
		}
		add(s.op, "RC_"+s.name, s.hdrs, f)
	}
	for _, s := range otherSpecs {
		add(s.op, s.name, s.hdrs, s.flags)
	}
	// XRC (IBTA 9.2.1 table 38): every RC opcode of IBTA 1.4 (vrnic runs
	// the memory placement extensions over RC only); the requests carry
	// the XRCETH naming the XRC SRQ at the responder, the responses are
	// RC's with the XRC service bits.
	for _, specs := range [][]opSpec{rcUCSpecs, rcOnlySpecs} {
		for _, s := range specs {
			if s.flags&(OpFlush|OpAtomicWrite) != 0 {
				continue
			}
			f, hdrs := s.flags, s.hdrs
			if f&OpRequest != 0 {
				f |= OpAcked
				hdrs = append([]Header{HdrXRCETH}, hdrs...)
			}
			add(s.op+XRCOpcodeOffset, "XRC_"+s.name, hdrs, f)
		}
	}
	return t
}
