package cm

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/vrnic/vrnic/roce"
)

// rdma_cm (Linux drivers/infiniband/core/cma.c) conventions over the IB
// CM: how it forms service IDs from IP ports, the header it puts in front
// of the consumer's private data, and the values it fills into a REQ for
// a RoCE path.

// PortSpace is an rdma_cm port space (enum rdma_ucm_port_space).
type PortSpace uint16

// rdma_cm port spaces.
const (
	PortSpaceIPoIB PortSpace = 0x0002
	PortSpaceTCP   PortSpace = 0x0106
	PortSpaceUDP   PortSpace = 0x0111
	PortSpaceIB    PortSpace = 0x013f
)

// ServiceIDMask covers the port space part of an rdma_cm service ID
// (RDMA_IB_IP_PS_MASK).
const ServiceIDMask = 0xffffffffffff0000

// ServiceID returns the service ID rdma_cm uses for port in port space ps
// (cma_get_service_id): ps << 16 | port. For TCP that is
// 0x0000000001060000 | port.
func ServiceID(ps PortSpace, port uint16) uint64 { return uint64(ps)<<16 | uint64(port) }

// ParseServiceID splits an rdma_cm service ID into port space and port;
// ok is false when the ID is not one of the IP port spaces.
func ParseServiceID(id uint64) (ps PortSpace, port uint16, ok bool) {
	ps, port = PortSpace(id>>16), uint16(id)
	if id>>32 != 0 {
		return 0, 0, false
	}
	switch ps {
	case PortSpaceIPoIB, PortSpaceTCP, PortSpaceUDP, PortSpaceIB:
		return ps, port, true
	}
	return 0, 0, false
}

// rdma_cm defaults (cma.c).
const (
	// CMAResponseTimeout is CMA_CM_RESPONSE_TIMEOUT: the local and
	// remote CM response timeouts of rdma_cm's REQ.
	CMAResponseTimeout = 20
	// CMAMaxCMRetries is CMA_MAX_CM_RETRIES.
	CMAMaxCMRetries = 15
	// CMAMRAServiceTimeout is the service timeout of the MRA rdma_cm
	// answers a repeated REQ with while the consumer has not decided
	// (CMA_CM_MRA_SETTING, sent delayed).
	CMAMRAServiceTimeout = 24
	// CMAIBoEPacketLifeTime is CMA_IBOE_PACKET_LIFETIME, the packet life
	// time rdma_cm gives a RoCE path.
	CMAIBoEPacketLifeTime = 16
	// CMASIDRTimeout is the SIDR_REQ timeout rdma_cm uses,
	// 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms.
	CMASIDRTimeoutMS = 1 << (CMAResponseTimeout - 8)
	// CMAUDPQKey is RDMA_UDP_QKEY, the Q_Key of rdma_cm UD QPs.
	CMAUDPQKey = 0x01234567
	// RXEAckDelay is the local CA ACK delay Linux Soft-RoCE (rxe)
	// reports (RXE_LOCAL_CA_ACK_DELAY).
	RXEAckDelay = 15
)

// CMAHeaderLen is the size of struct cma_hdr, the header rdma_cm puts in
// front of the consumer's private data in REQ and SIDR_REQ.
const CMAHeaderLen = 36

// CMAVersion is the cma_hdr version (CMA_VERSION).
const CMAVersion = 0x00

// CMAHeader is rdma_cm's struct cma_hdr:
//
//	byte 0      cma_version (0x00)
//	byte 1      ip_version << 4 (4 or 6)
//	bytes 2-3   port: the active side's source port, big-endian
//	bytes 4-19  source IP: IPv6, or IPv4 in bytes 16-19 with 12 zero bytes before it
//	bytes 20-35 destination IP, the same way
//
// An IPv4 address is not IPv4-mapped here: union cma_ip_addr puts it
// after three zero words.
type CMAHeader struct {
	// Src and Dst are both IPv4 or both IPv6.
	Src, Dst netip.Addr
	// SrcPort is the port of the active side.
	SrcPort uint16
}

// Marshal writes the header into b (at least CMAHeaderLen bytes).
func (h *CMAHeader) Marshal(b []byte) error {
	if len(b) < CMAHeaderLen {
		return fmt.Errorf("%w: cma_hdr needs %d bytes, have %d", ErrInvalidParam, CMAHeaderLen, len(b))
	}
	src, dst := h.Src.Unmap(), h.Dst.Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return fmt.Errorf("%w: cma_hdr addresses %v and %v", ErrInvalidParam, h.Src, h.Dst)
	}
	clear(b[:CMAHeaderLen])
	b[0] = CMAVersion
	binary.BigEndian.PutUint16(b[2:], h.SrcPort)
	if src.Is4() {
		b[1] = 4 << 4
		s, d := src.As4(), dst.As4()
		copy(b[16:20], s[:])
		copy(b[32:36], d[:])
	} else {
		b[1] = 6 << 4
		s, d := src.As16(), dst.As16()
		copy(b[4:20], s[:])
		copy(b[20:36], d[:])
	}
	return nil
}

// ParseCMAHeader reads a cma_hdr from the start of a REQ's or SIDR_REQ's
// private data. It fails on another version or an IP version other than
// 4 and 6 (cma_save_ip_info refuses those too).
func ParseCMAHeader(b []byte) (CMAHeader, error) {
	if len(b) < CMAHeaderLen {
		return CMAHeader{}, fmt.Errorf("%w: cma_hdr of %d bytes", ErrBadField, len(b))
	}
	if b[0] != CMAVersion {
		return CMAHeader{}, fmt.Errorf("%w: cma_hdr version %d", ErrBadField, b[0])
	}
	h := CMAHeader{SrcPort: binary.BigEndian.Uint16(b[2:])}
	switch b[1] >> 4 {
	case 4:
		h.Src = netip.AddrFrom4([4]byte(b[16:20]))
		h.Dst = netip.AddrFrom4([4]byte(b[32:36]))
	case 6:
		h.Src = netip.AddrFrom16([16]byte(b[4:20]))
		h.Dst = netip.AddrFrom16([16]byte(b[20:36]))
	default:
		return CMAHeader{}, fmt.Errorf("%w: cma_hdr IP version %d", ErrBadField, b[1]>>4)
	}
	return h, nil
}

// RoCEPath returns the path rdma_cm resolves for RoCE v2 from the local
// address src to the peer dst (cma_resolve_iboe_route): GIDs from the
// IPs, P_Key 0xFFFF, packet life time 16, the route's hop limit (64 on
// Linux by default), traffic class = the type of service, SL 0 (no VLAN
// priority map), the net device's MTU and rate (enum ib_rate), and the
// flow label rdma_cm derives from the ports (cma_get_roce_udp_flow_label:
// (sport × 31 + dport) mod 2^20).
func RoCEPath(src, dst netip.AddrPort, mtu roce.MTU, rate, hopLimit, tos uint8) PathParams {
	return PathParams{
		SGID: GIDFromIP(src.Addr()), DGID: GIDFromIP(dst.Addr()),
		FlowLabel: (uint32(src.Port())*31 + uint32(dst.Port())) & 0xfffff,
		PKey:      DefaultPKey, MTU: mtu, Rate: rate, HopLimit: hopLimit,
		TrafficClass: tos, PacketLifeTime: CMAIBoEPacketLifeTime,
	}
}

// CMAPrivateData returns the private data of an rdma_cm REQ or SIDR_REQ:
// the cma_hdr, then the consumer's bytes.
func CMAPrivateData(h CMAHeader, consumer []byte) ([]byte, error) {
	if len(consumer) > REQPrivateDataLen-CMAHeaderLen {
		return nil, fmt.Errorf("%w: %d bytes after the cma_hdr", ErrPrivateDataLen, len(consumer))
	}
	b := make([]byte, CMAHeaderLen+len(consumer))
	if err := h.Marshal(b); err != nil {
		return nil, err
	}
	copy(b[CMAHeaderLen:], consumer)
	return b, nil
}
