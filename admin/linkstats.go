package admin

// StatsSuffix names a daemon's link statistics socket, beside its control
// socket: device "vr0" serves them on "vr0.stats" (a unix stream socket
// that writes one JSON LinkStats document per connection, then closes).
const StatsSuffix = ".stats"

// LinkStats is the JSON a daemon serves on its stats socket (the TAP and
// UDP links). A reader keeps fields unknown to its version in raw JSON
// output.
type LinkStats struct {
	Link      string `json:"link"`
	Interface string `json:"interface,omitempty"`
	MAC       string `json:"mac,omitempty"`
	// Local is the UDP link's address.
	Local string `json:"local,omitempty"`
	// Ports: the UDP link's counters, per port (socket; one per worker).
	Ports []UDPPortStats `json:"ports,omitempty"`
	// Offload is the TAP link's UDP segmentation offload: "uso", or
	// "off: " and why.
	Offload string `json:"offload,omitempty"`
	// The TAP link's. Queues: per queue, the frames the steering
	// program put there and what the link did with them.
	Queues []QueueStats `json:"queues"`
	// SteerNonRoCE counts frames the steering program saw that were not
	// RoCE v2 (they go to queue 0).
	SteerNonRoCE uint64 `json:"steer_non_roce"`
	// Filter counts the filter program's verdicts by reason;
	// FilterDropped sums the dropping ones.
	Filter        map[string]uint64 `json:"filter"`
	FilterDropped uint64            `json:"filter_dropped"`
	// Neighbors counts the NIC's ARP and neighbour discovery activity by
	// counter name.
	Neighbors map[string]uint64 `json:"neighbors"`
}

// UDPPortStats is a snapshot of one UDP link port's counters (package
// link's UDPCounters): frames and datagrams, the system calls that moved
// them (frames per call: TxFrames/TxCalls), segmentation offload, and
// what was dropped and why.
type UDPPortStats struct {
	Port        int    `json:"port"`
	TxFrames    uint64 `json:"tx_frames"`
	TxBytes     uint64 `json:"tx_bytes"`
	TxDatagrams uint64 `json:"tx_datagrams"`
	TxCalls     uint64 `json:"tx_calls"` // sendmmsg calls that sent
	RxFrames    uint64 `json:"rx_frames"`
	RxBytes     uint64 `json:"rx_bytes"`
	RxDatagrams uint64 `json:"rx_datagrams"`
	RxCalls     uint64 `json:"rx_calls"` // recvmmsg calls that received
	// UDP segmentation offload: on now (GSO, GRO); datagrams sent with
	// UDP_SEGMENT holding two frames or more, received holding two or
	// more (UDP_GRO); times the kernel refused a segmented send (GSO
	// then off).
	GSO    bool   `json:"gso"`
	GRO    bool   `json:"gro"`
	TxGSO  uint64 `json:"tx_gso"`
	RxGRO  uint64 `json:"rx_gro"`
	GSOOff uint64 `json:"gso_off"`
	// Backpressure: sends stopped early (EAGAIN, ENOBUFS), the frames
	// kept for later. The rest are frames lost: refused by the kernel
	// (SendErrors, LastSendErrno the newest errno), failed receive calls,
	// datagrams longer than a frame, of another address family, frames
	// not sendable (too short, a bad destination).
	Backpressure  uint64 `json:"backpressure"`
	SendErrors    uint64 `json:"send_errors"`
	LastSendErrno uint32 `json:"last_send_errno,omitempty"`
	RecvErrors    uint64 `json:"recv_errors"`
	RxTruncated   uint64 `json:"rx_truncated"`
	RxForeign     uint64 `json:"rx_foreign"`
	TxInvalid     uint64 `json:"tx_invalid"`
	Wakeups       uint64 `json:"wakeups"`
	// Frames received for another port's QP and handed to it, and those
	// dropped because its inbox was full (a link of several workers).
	RxForwarded    uint64 `json:"rx_forwarded,omitempty"`
	RxForwardDrops uint64 `json:"rx_forward_drops,omitempty"`
}

// QueueStats is one queue's line of LinkStats: what the steering program
// put on the queue, then the link's own counters of the queue.
type QueueStats struct {
	Steered uint64 `json:"steered"`
	TAPQueueStats
}

// TAPQueueStats is a snapshot of one TAP queue's counters as the link keeps
// them (package link's TAPQueueStats is this type).
type TAPQueueStats struct {
	Queue       int    `json:"queue"`
	RxFrames    uint64 `json:"rx_frames"`
	RxBytes     uint64 `json:"rx_bytes"`
	RxNeighbor  uint64 `json:"rx_neighbor"`
	RxOther     uint64 `json:"rx_other"`
	RxMisqueued uint64 `json:"rx_misqueued"`
	ReadErrors  uint64 `json:"read_errors"`
	TxFrames    uint64 `json:"tx_frames"`
	TxBytes     uint64 `json:"tx_bytes"`
	TxErrors    uint64 `json:"tx_errors"`
	Wakeups     uint64 `json:"wakeups"`
	// UDP segmentation offload: segmented writes and the frames they
	// carried, segmented packets read and the frames cut from them, reads
	// dropped as bad input (virtio-net header or segmented packet).
	TxGSO       uint64 `json:"tx_gso"`
	TxGSOFrames uint64 `json:"tx_gso_frames"`
	RxGSO       uint64 `json:"rx_gso"`
	RxGSOFrames uint64 `json:"rx_gso_frames"`
	RxBad       uint64 `json:"rx_bad"`
	// Frames the device sent to its own MAC (one of its QPs to another),
	// delivered inside the link, and those dropped for a full queue.
	LoopFrames  uint64 `json:"loop_frames"`
	LoopDropped uint64 `json:"loop_dropped"`
}
