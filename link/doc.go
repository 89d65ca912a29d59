// Package link moves RoCE v2 frames between vrnic engines.
//
// A link is attached to an engine worker by worker: port i of a device is
// read and written only by the device's worker i (as TAP queue i is), so a
// port needs no locks. Every port implements the engine's Link:
//
//	SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error)
//	RecvBatch(frames [][]byte, peers []netip.AddrPort) (int, error)
//
// What a frame is depends on the link (the engine's roce.Mode):
//
//   - roce.ModeEthernet (TAP link, in-memory link by default): whole
//     Ethernet frames built by package roce (Ethernet, IPv4/IPv6, UDP
//     4791, BTH, extension headers, payload, pad, ICRC). A frame names
//     its own source and destination; peers is neither read nor written.
//   - roce.ModeUDP (UDP link, in-memory link in ModeUDP): UDP payloads,
//     BTH through ICRC, and beside frames[i] its peer in peers[i], the
//     destination on send and the sender on receive (as wireguard-go's
//     bind returns each packet's endpoint beside it). No header is built
//     for the link or parsed by it: the kernel writes and strips the IP
//     and UDP headers, and the ICRC covers the pseudo header of the two
//     addresses (roce.Pseudo).
//
// The receiving engine verifies the ICRC of every frame.
//
// # In-memory link
//
// A Network connects any number of devices, each attached with an IP
// address and a number of workers. Sending a frame routes it by its
// destination IP address (of its IP header; in ModeUDP the address beside
// it, which must have port 4791) to a device and by the BTH destination
// QP (roce.SteerQueue) to that device's port, exactly like the eBPF
// steering of the TAP link and the reuseport steering of the UDP link. In
// ModeUDP the receiver gets the sender's address and port 4791
// (Port.LocalAddr) beside each payload, as from a UDP socket.
//
// Buffers move by exchange, never by copy: the network owns a bounded pool
// of empty buffers, all of the same capacity as the engines' buffers.
//
//	SendBatch: sender's filled buffer ──► receive queue of the destination port
//	           pool's empty buffer     ──► sender's slot
//	RecvBatch: queued filled buffer    ──► receiver's slot
//	           receiver's empty buffer ──► pool
//
// The number of buffers in the pool plus the queues is constant, so
// neither side allocates. When the pool or a destination queue is empty or
// full the send stops early and reports how many frames it took; the
// engine keeps the rest and retries (backpressure instead of loss).
//
// # Lossy variant
//
// A port created with Faults applies seeded drop, duplicate, reorder (hold
// a frame back until N later frames passed), delay and corrupt decisions to
// every frame it sends, in either mode (a held or duplicated UDP payload
// keeps its sender beside it). A held frame goes out with the port's next
// send or receive once it is due (a delayed frame after DelayFor, a
// reordered one after ReorderDepth later frames or at most ReorderMaxAge); the
// port signals its Ready channel when the earliest held frame is due, so
// an owner that went idle (an engine worker asleep until its next ACK
// timeout) is woken to release it, and a delay stays a delay instead of
// becoming a loss. The seed is logged when the port is created; with the
// same seed and the same sequence of frames the same decisions are made,
// so a failing run replays.
package link
