// # UDP link
//
// NewUDP attaches a device to the host's network without privileges: one
// UDP socket per worker, all bound to the device's address and port (4791
// by default; 127.0.0.1:4791 and 127.0.0.2:4791 give two daemons on one
// host), in one SO_REUSEPORT group. The engine still builds and parses
// whole Ethernet frames (roce.ModeEthernet); the link is an adapter that
// sends and receives only the UDP payload (BTH .. ICRC) and lets the
// kernel write the real IP and UDP headers.
//
// Send: the Ethernet, IP and UDP headers in front of every frame are read
// at fixed offsets and must follow these conventions, or the frame is
// dropped and counted (UDPDrop, one counter per reason), never sent:
//
//	Ethernet  untagged, EtherType IPv4 (IPv4 link) or IPv6 (IPv6 link)
//	IPv4      version 4, IHL 5, Identification 0, flags DF, fragment
//	          offset 0, protocol 17, Src = the link's address, Dst unicast
//	IPv6      version 6, next header 17, Src = the link's address, Dst
//	          unicast (no extension headers)
//	UDP       SrcPort = the link's port; DstPort 4791 or the configured
//	          peer port; lengths consistent with the IP header
//	payload   at least a BTH and an ICRC
//
// UDPLink.ConformPath sets a roce.Path to these conventions. The payload
// goes out with sendmmsg to Dst and DstPort. TOS, TTL, flow
// label, hop limit and the checksums are not carried (the ICRC masks
// them); the kernel sets DF and never fragments (IP_PMTUDISC_DO).
//
// Receive: recvmmsg writes each datagram into the caller's buffer at
// offset UDPHeadroom4 (14+20+8) or UDPHeadroom6 (14+40+8), and the link
// writes in front of it the headers from the fixed values this mode
// documents:
//
//	Ethernet  Dst UDPLocalMAC, Src UDPRemoteMAC, EtherType IPv4 or IPv6
//	IPv4      version 4, IHL 5, TOS 0, Total Length 28 + payload,
//	          Identification 0, flags DF, fragment offset 0, TTL 64,
//	          protocol 17, correct header checksum, Src = the sender's
//	          address, Dst = the link's address
//	IPv6      version 6, traffic class 0, flow label 0, Payload Length
//	          8 + payload, next header 17, hop limit 64, Src, Dst as above
//	UDP       SrcPort = the sender's port, DstPort = the link's port,
//	          Length 8 + payload, checksum 0 over IPv4, computed over IPv6
//
// These are the values of roce.Pseudo with Src, SrcPort the sender's and
// Dst, DstPort the link's, and the frame is byte for byte what
// roce.AppendCaptureFrame(nil, &pseudo, UDPRemoteMAC, UDPLocalMAC,
// payload) builds (a test checks this). Every field the ICRC covers
// equals the field of the frame the sending engine built, as long as that
// frame followed the send conventions, so the receiving engine's
// roce.Parse verifies the sender's ICRC end to end and rejects a datagram
// damaged on the way (ErrICRC). The fields that may differ (TOS, TTL,
// checksums, flow label, hop limit) are the ones the ICRC masks. The
// receiving engine sees destination port 4791 only when the link is bound
// to 4791; links on other ports (tests) exchange frames whose ICRC
// verifies but that roce.Parse rejects by port.
//
// Buffers: the kernel copies on both sides, so SendBatch leaves the
// caller's buffers in place and RecvBatch fills the caller's buffers,
// moving them between slots only to close the gap of a dropped datagram.
// mmsghdr, iovec and sockaddr arrays are preallocated per port; neither
// call allocates.
//
// Steering: a classic BPF program attached to the reuseport group with
// SO_ATTACH_REUSEPORT_CBPF (allowed without privileges) returns
// roce.SteerQueue(BTH destination QP, workers) for every datagram at least
// a BTH and an ICRC long, 0 for shorter ones; socket i, bound i-th, is at
// index i of the group, so each datagram reaches the worker that owns its
// QP. See udp_steer.go and kernel-notes/udp-reuseport.md.
//
// Wake-ups: one goroutine per port waits on the Go netpoller and signals
// Ready; see UDPPort. Close stops them and closes every socket.
package link
