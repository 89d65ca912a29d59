package roce

import (
	"fmt"
	"net/netip"
)

// Packet is a parsed RoCE v2 packet: views into the received bytes, valid
// as long as those bytes are. Views of headers the packet does not carry
// are nil. Parse and ParseUDP fill a caller-owned Packet and allocate
// nothing.
type Packet struct {
	Mode Mode
	// Eth is the Ethernet header including any 802.1Q tag (ModeEthernet).
	Eth Ethernet
	// IPv4 or IPv6 is the IP header (ModeEthernet); the other is nil.
	IPv4 IPv4
	IPv6 IPv6
	// UDP is the UDP header (ModeEthernet).
	UDP UDP
	// BTH is the base transport header; Info its opcode's table entry.
	BTH  BTH
	Info *OpInfo
	// Extension headers, each exactly its header's length, or nil.
	DETH         DETH
	XRCETH       XRCETH
	FETH         FETH
	RETH         RETH
	AtomicETH    AtomicETH
	AETH         AETH
	AtomicAckETH AtomicAckETH
	ImmDt        ImmDt
	IETH         IETH
	// Payload is the data after the headers, without the pad.
	Payload []byte
	// ICRC is the ICRC as read from the packet (verified by the parser).
	ICRC uint32

	// transport is the BTH and the extension headers (Info.HeaderLen
	// bytes), for Headers.
	transport []byte
}

// Opcode returns the BTH opcode.
func (pkt *Packet) Opcode() Opcode { return pkt.BTH.Opcode() }

// Src returns the source IP address (invalid in ModeUDP).
func (pkt *Packet) Src() netip.Addr {
	switch {
	case pkt.IPv4 != nil:
		return pkt.IPv4.Src()
	case pkt.IPv6 != nil:
		return pkt.IPv6.Src()
	}
	return netip.Addr{}
}

// Dst returns the destination IP address (invalid in ModeUDP).
func (pkt *Packet) Dst() netip.Addr {
	switch {
	case pkt.IPv4 != nil:
		return pkt.IPv4.Dst()
	case pkt.IPv6 != nil:
		return pkt.IPv6.Dst()
	}
	return netip.Addr{}
}

// Headers returns the per-packet fields of pkt in the form Build takes.
func (pkt *Packet) Headers() Headers {
	var h Headers
	h.BTH = pkt.BTH.Fields()
	for m := pkt.Info.Headers; m != 0; m &= m - 1 {
		x := m.first()
		extCodecs[x].decode(pkt.Info.ext(pkt.transport, x), &h)
	}
	if pkt.IPv4 != nil {
		h.IPID = pkt.IPv4.ID()
	}
	return h
}

// Path returns the path fields of a packet parsed in ModeEthernet: what
// Build needs, with Headers, to produce the same frame again.
func (pkt *Packet) Path() Path {
	p := Path{Mode: pkt.Mode}
	if pkt.Eth != nil {
		p.SrcMAC, p.DstMAC = pkt.Eth.Src(), pkt.Eth.Dst()
		p.VLAN, p.VLANTCI = pkt.Eth.Tagged(), pkt.Eth.TCI()
	}
	switch {
	case pkt.IPv4 != nil:
		p.Src, p.Dst = pkt.IPv4.Src(), pkt.IPv4.Dst()
		p.TOS, p.TTL = pkt.IPv4.TOS(), pkt.IPv4.TTL()
		p.DontFragment = pkt.IPv4.FlagsFragment()&IPv4FlagDF != 0
		p.UDPChecksum = pkt.UDP.Checksum() != 0
	case pkt.IPv6 != nil:
		p.Src, p.Dst = pkt.IPv6.Src(), pkt.IPv6.Dst()
		p.TOS, p.TTL = pkt.IPv6.TrafficClass(), pkt.IPv6.HopLimit()
		p.FlowLabel = pkt.IPv6.FlowLabel()
		p.UDPChecksum = true
	}
	if pkt.UDP != nil {
		p.SrcPort, p.DstPort = pkt.UDP.SrcPort(), pkt.UDP.DstPort()
	}
	return p
}

// Parse validates frame, a whole Ethernet frame (ModeEthernet, without
// FCS), and fills pkt with views into it. Bytes after the IP packet
// (Ethernet padding) are ignored. On error pkt holds what was parsed so
// far and must not be used.
//
// Checks, in order, each with its own sentinel error: Ethernet type
// (ErrTruncated, ErrRoCEv1, ErrNotIP), IP version and header
// (ErrBadIPVersion, ErrBadIPHeaderLen, ErrBadIPChecksum, ErrFragment,
// ErrNotUDP), lengths (ErrTruncated, ErrBadLength), UDP port (ErrNotRoCE),
// then the transport checks of ParseUDP and the ICRC (ErrICRC).
//
// The UDP checksum is not verified: the ICRC covers the same bytes end to
// end except the variant fields, and hashing the packet a second time
// would double the cost. frame is only read. Only the rejection of a
// corrupt ICRC is free of allocation among the error paths (a flood of
// damaged frames must not cost garbage); the others wrap their sentinel
// with detail.
func Parse(frame []byte, pkt *Packet) error {
	*pkt = Packet{Mode: ModeEthernet}
	eth := Ethernet(frame)
	if !eth.IsValid() {
		return fmt.Errorf("%w: %d-byte Ethernet frame", ErrTruncated, len(frame))
	}
	ehl := eth.HeaderLen()
	pkt.Eth = eth[:ehl]
	ip := frame[ehl:]
	var (
		v6   bool
		iphl int
	)
	switch et := eth.Type(); et {
	case EtherTypeIPv4:
		h := IPv4(ip)
		if !h.IsValid() {
			return fmt.Errorf("%w: %d bytes of IPv4 header", ErrTruncated, len(ip))
		}
		if v := h.Version(); v != 4 {
			return fmt.Errorf("%w: %d in an IPv4 frame", ErrBadIPVersion, v)
		}
		iphl = h.HeaderLen()
		if iphl < IPv4HeaderLen {
			return fmt.Errorf("%w: IHL %d", ErrBadIPHeaderLen, iphl/4)
		}
		if iphl > len(h) {
			return fmt.Errorf("%w: IHL %d beyond the %d-byte packet", ErrBadIPHeaderLen, iphl/4, len(h))
		}
		tl := int(h.TotalLength())
		if tl < iphl+UDPHeaderLen {
			return fmt.Errorf("%w: IPv4 total length %d", ErrBadLength, tl)
		}
		if tl > len(h) {
			return fmt.Errorf("%w: IPv4 total length %d, %d bytes present", ErrTruncated, tl, len(h))
		}
		var sum uint16
		if iphl == IPv4HeaderLen {
			sum = ^ipv4Sum(h) // CalculateChecksum without options
		} else {
			sum = h.CalculateChecksum()
		}
		if sum != h.Checksum() {
			return ErrBadIPChecksum
		}
		if h.IsFragment() {
			return ErrFragment
		}
		if pr := h.Protocol(); pr != ProtocolUDP {
			return fmt.Errorf("%w: IP protocol %d", ErrNotUDP, pr)
		}
		ip = ip[:tl]
		pkt.IPv4 = IPv4(ip[:iphl])
	case EtherTypeIPv6:
		h := IPv6(ip)
		if !h.IsValid() {
			return fmt.Errorf("%w: %d bytes of IPv6 header", ErrTruncated, len(ip))
		}
		if v := h.Version(); v != 6 {
			return fmt.Errorf("%w: %d in an IPv6 frame", ErrBadIPVersion, v)
		}
		if nh := h.NextHeader(); nh != ProtocolUDP {
			return fmt.Errorf("%w: IPv6 next header %d", ErrNotUDP, nh)
		}
		tl := IPv6HeaderLen + int(h.PayloadLength())
		if tl < IPv6HeaderLen+UDPHeaderLen {
			return fmt.Errorf("%w: IPv6 payload length %d", ErrBadLength, tl-IPv6HeaderLen)
		}
		if tl > len(h) {
			return fmt.Errorf("%w: IPv6 payload length %d, %d bytes present", ErrTruncated, tl-IPv6HeaderLen, len(h)-IPv6HeaderLen)
		}
		v6, iphl = true, IPv6HeaderLen
		ip = ip[:tl]
		pkt.IPv6 = IPv6(ip[:iphl])
	case EtherTypeRoCEv1:
		return ErrRoCEv1
	default:
		return fmt.Errorf("%w: EtherType 0x%04x", ErrNotIP, et)
	}
	u := UDP(ip[iphl:])
	if ul := int(u.Length()); ul != len(u) {
		return fmt.Errorf("%w: UDP length %d, IP says %d", ErrBadLength, ul, len(u))
	}
	if dp := u.DstPort(); dp != UDPPort {
		return fmt.Errorf("%w: port %d", ErrNotRoCE, dp)
	}
	pkt.UDP = u[:UDPHeaderLen]
	t := u[UDPHeaderLen:]
	if err := parseTransport(t, pkt); err != nil {
		return err
	}
	if pkt.ICRC != icrcIP(ip[:len(ip)-ICRCLen], v6, iphl) {
		return ErrICRC // bare: dropping corrupt frames must not allocate
	}
	return nil
}

// ParseUDP validates b, the payload of a UDP datagram received on the
// UDP link (ModeUDP: BTH through ICRC), checking the ICRC over the pseudo
// header ps (see Pseudo), and fills pkt with views into b.
//
// Errors: ErrTruncated, ErrBadLength (too long for the pseudo header's
// length fields), ErrBadBTHVersion, ErrUnknownOpcode, ErrOpcodeLength,
// ErrBadPad, ErrICRC.
func ParseUDP(b []byte, ps *Pseudo, pkt *Packet) error {
	// Cleared, then the mode set: a literal with a nonzero field is
	// copied from a static template instead, twice the instructions.
	*pkt = Packet{}
	pkt.Mode = ModeUDP
	if len(b) > maxDatagram {
		return datagramLenError(len(b))
	}
	if err := parseTransport(b, pkt); err != nil {
		return err
	}
	if pkt.ICRC != icrcPseudo(ps, b[:len(b)-ICRCLen]) {
		return ErrICRC
	}
	return nil
}

// ParseUDP is the package's ParseUDP for a datagram from source from to
// the address r was made for: the same checks, errors and result as
// ParseUDP with Pseudo{Src: from.Addr(), SrcPort: from.Port(), Dst:
// local.Addr(), DstPort: local.Port()}, without composing the local half
// of the pseudo header again.
func (r *PseudoRx) ParseUDP(b []byte, from netip.AddrPort, pkt *Packet) error {
	*pkt = Packet{}
	pkt.Mode = ModeUDP
	if len(b) > maxDatagram {
		return datagramLenError(len(b))
	}
	if err := parseTransport(b, pkt); err != nil {
		return err
	}
	if pkt.ICRC != ^r.crc(from, b[:len(b)-ICRCLen], len(b)) {
		return ErrICRC
	}
	return nil
}

// maxDatagram is the longest transport packet the pseudo header's length
// fields hold (over IPv6, the larger headers).
const maxDatagram = 0xffff - IPv6HeaderLen - UDPHeaderLen

// datagramLenError is ParseUDP's error for an n-byte datagram.
func datagramLenError(n int) error {
	return fmt.Errorf("%w: %d-byte datagram", ErrBadLength, n)
}

// parseTransport checks t (BTH through ICRC) against the opcode table
// and fills the transport views and ICRC of pkt. The ICRC is not checked.
func parseTransport(t []byte, pkt *Packet) error {
	if len(t) < BTHLen+ICRCLen {
		return fmt.Errorf("%w: %d bytes of transport packet", ErrTruncated, len(t))
	}
	bth := BTH(t[:BTHLen])
	pkt.BTH = bth
	if v := bth.TVer(); v != 0 {
		return fmt.Errorf("%w: %d", ErrBadBTHVersion, v)
	}
	op := bth.Opcode()
	info := op.Info()
	if !info.Valid() {
		return fmt.Errorf("%w: 0x%02x", ErrUnknownOpcode, uint8(op))
	}
	pkt.Info = info
	hl := info.HeaderLen
	if len(t) < hl+ICRCLen {
		return fmt.Errorf("%w: %v needs %d bytes, packet has %d", ErrOpcodeLength, op, hl+ICRCLen, len(t))
	}
	data := len(t) - hl - ICRCLen // payload and pad
	pad := bth.PadCount()
	if info.Flags&OpPayload == 0 {
		if data != 0 {
			return fmt.Errorf("%w: %v with %d payload bytes", ErrOpcodeLength, op, data)
		}
		if pad != 0 {
			return fmt.Errorf("%w: %d on %v, which has no payload", ErrBadPad, pad, op)
		}
	} else {
		if data&3 != 0 {
			return fmt.Errorf("%w: payload and pad of %d bytes, not a multiple of 4", ErrBadPad, data)
		}
		if pad > data {
			return fmt.Errorf("%w: %d with %d payload bytes", ErrBadPad, pad, data)
		}
		if pad != 0 && info.Flags&(OpFirst|OpMiddle) != 0 {
			return fmt.Errorf("%w: %d on %v", ErrBadPad, pad, op)
		}
	}
	pkt.transport = t[:hl]
	for m := info.Headers; m != 0; m &= m - 1 {
		h := m.first()
		extCodecs[h].view(pkt, info.ext(t, h))
	}
	pkt.Payload = t[hl : hl+data-pad]
	pkt.ICRC = getICRC(t[len(t)-ICRCLen:])
	return nil
}
