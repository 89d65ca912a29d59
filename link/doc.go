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
// A short frame (up to copyMax bytes) is copied once, as through a socket:
// the sender keeps its buffer, still in its CPU's cache, and the receiver
// gets the frame in a buffer of the network's, all of the same capacity as
// the engines' buffers, in exchange for its empty one. A longer frame
// moves without a copy, and the sender gets an empty buffer in its slot:
//
//	SendBatch: short frame ──copy──► the empty buffer parked in the
//	                                destination queue's next entry (or
//	                                one of the pool's)
//	           long frame  ──────► that entry; its empty buffer ► sender's slot
//	RecvBatch: queued frame ─────► receiver's slot
//	           receiver's empty buffer ► parked in the frame's entry
//
// The number of buffers in the pool and the queues is constant, so neither
// side allocates; a stream between two ports cycles through the
// receiver's buffers and leaves the pool alone. A sender that finds no
// empty buffer takes the ports' parked ones back into the pool before it
// gives up. When a destination queue is full or no empty buffer
// is left the send stops early and reports how many frames it took; the
// engine keeps the rest and retries (backpressure instead of loss).
//
// (Until short frames were copied, every frame moved: the sender got an
// empty buffer for each frame it handed over. On two CPUs that made the
// sender write every short frame into cache lines the receiver had just
// read, and its ICRC pass over the frame waited for each of them: at 8
// bytes a third of the requester's time, which the daemon's real links,
// whose kernel copies, never pay.)
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
