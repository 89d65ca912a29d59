// # UDP link
//
// NewUDP attaches a device to the host's network without privileges: one
// UDP socket per worker, all bound to the device's address and port (4791
// by default; 127.0.0.1:4791 and 127.0.0.2:4791 give two daemons on one
// host), in one SO_REUSEPORT group. The engine runs in roce.ModeUDP: it
// builds and parses UDP payloads only (BTH through ICRC, the ICRC over
// the pseudo header of the two sockets' addresses and ports,
// roce.Pseudo), and the kernel writes and strips the real IP and UDP
// headers. The link builds, checks and strips no header of its own.
//
// Send: SendBatch(frames, peers) sends frames[i] with sendmmsg to
// peers[i]; the only bytes it writes besides the kernel's are the
// sockaddr of each destination (16 bytes for IPv4, 28 for IPv6). A frame
// shorter than a BTH and an ICRC, or for a destination that is not a
// unicast address of the link's family (IPv4-mapped IPv6 counts as IPv4;
// no zone) with a nonzero port, is dropped and counted (TxInvalid), never
// sent. The kernel sets DF and never fragments (IP_PMTUDISC_DO).
//
// Receive: recvmmsg writes each datagram at the start of the caller's
// buffer and its sender into a preallocated sockaddr, which RecvBatch
// decodes into peers[i]: the engine computes the pseudo header from it
// and the link's address (LocalAddr), so it verifies the sender's ICRC
// end to end and rejects a datagram damaged on the way (roce.ErrICRC),
// and it accepts an RC packet only from its QP's peer address. The IP and
// UDP fields the ICRC would mask (TOS, TTL, checksums, flow label, hop
// limit) are not part of the pseudo header at all. Datagrams longer than
// FrameCap are dropped (RxTruncated), as are senders of another family
// (RxForeign).
//
// Buffers: the kernel copies on both sides, so SendBatch leaves the
// caller's buffers in place and RecvBatch fills the caller's buffers,
// moving them (and their peers) between slots only to close the gap of a
// dropped datagram. mmsghdr, iovec and sockaddr arrays are preallocated
// per port; neither call allocates.
//
// Steering: a classic BPF program attached to the reuseport group with
// SO_ATTACH_REUSEPORT_CBPF (allowed without privileges) returns
// roce.SteerQueue(BTH destination QP, workers) for every datagram at least
// a BTH and an ICRC long, 0 for shorter ones; socket i, bound i-th, is at
// index i of the group, so each datagram reaches the worker that owns its
// QP. A segmented datagram goes where its first frame's QP steers; a port
// of a link of several workers hands a frame of it for another port's QP
// to that port (udp_forward.go). See udp_steer.go and
// kernel-notes/udp-reuseport.md.
//
// Offload: SendBatch packs runs of equal frames for one peer and QP (or
// plain ACKs for any QPs) into UDP_SEGMENT messages (over IPv6, and over
// IPv4 as UDPConfig.SegmentIPv4 says: by default on a loopback address
// only), and a one-worker link receives with UDP_GRO; see udp_offload.go
// and kernel-notes/udp-offload.md (UDPConfig.NoOffload turns both off).
//
// Wake-ups: one goroutine per port waits on the Go netpoller and signals
// Ready; see UDPPort. Close stops them and closes every socket.
package link
