package main

import (
	"encoding/json"
	"fmt"
	"net"
	"time"

	"github.com/vrnic/vrnic/internal/rcpair"
)

// The demo's processes talk over one unix stream socket in the demo's
// private directory: each client connects to the demo and exchanges
// newline-delimited JSON messages with it. The demo relays each client's
// QP information to the other (so the clients never need to know each
// other), says when to start and stop, and collects progress and results.
//
//	client → demo   hello{role, qp}         after its QP exists (RESET)
//	demo → client   peer{qp}                the other side's QP
//	client → demo   ready                   QP in RTS
//	demo → client   go                      both are ready
//	client → demo   progress{...}           once a second (role a)
//	demo → client   stop                    role b: stop serving
//	client → demo   result{...}             final figures and checks
type message struct {
	Kind     string       `json:"kind"`
	Role     string       `json:"role,omitempty"`
	QP       *rcpair.Info `json:"qp,omitempty"`
	Progress *progress    `json:"progress,omitempty"`
	Result   *result      `json:"result,omitempty"`
	Error    string       `json:"error,omitempty"`
}

// progress is the requester's running count.
type progress struct {
	Elapsed time.Duration `json:"elapsed"`
	Ops     uint64        `json:"ops"`
	Bytes   uint64        `json:"bytes"`
}

// opStats are the figures of one operation type.
type opStats struct {
	Name  string        `json:"name"`
	Ops   uint64        `json:"ops"`
	Bytes uint64        `json:"bytes"`
	P50   time.Duration `json:"p50"`
	P99   time.Duration `json:"p99"`
	P999  time.Duration `json:"p999"`
}

// result is a client's final report.
type result struct {
	Role     string        `json:"role"`
	Elapsed  time.Duration `json:"elapsed"`
	Ops      []opStats     `json:"ops,omitempty"`
	All      opStats       `json:"all"`
	Failures []string      `json:"failures,omitempty"`
	// Requester: counts the responder's memory must reflect.
	Sends     uint64 `json:"sends"`
	FetchAdds uint64 `json:"fetch_adds"`
	CmpSwaps  uint64 `json:"cmp_swaps"`
	SendBytes uint64 `json:"send_bytes"`
	// Responder: what it received and verified, and its atomic words.
	RecvVerified uint64 `json:"recv_verified"`
	RecvBytes    uint64 `json:"recv_bytes"`
	AddWord      uint64 `json:"add_word"`
	SwapWord     uint64 `json:"swap_word"`
	// Both: the QP's transport counters (QUERY_QP).
	PacketsSent     uint64 `json:"packets_sent"`
	PacketsReceived uint64 `json:"packets_received"`
	Retransmits     uint64 `json:"retransmits"`
	RNRNAKs         uint64 `json:"rnr_naks"`
}

// peerConn is one side of the message stream.
type peerConn struct {
	c   net.Conn
	enc *json.Encoder
	dec *json.Decoder
}

func newPeerConn(c net.Conn) *peerConn {
	return &peerConn{c: c, enc: json.NewEncoder(c), dec: json.NewDecoder(c)}
}

func (p *peerConn) send(m message) error { return p.enc.Encode(&m) }

// recv reads the next message; want, if not empty, is the kind expected.
func (p *peerConn) recv(want string) (message, error) {
	var m message
	if err := p.dec.Decode(&m); err != nil {
		return m, err
	}
	if m.Kind == "error" {
		return m, fmt.Errorf("peer failed: %s", m.Error)
	}
	if want != "" && m.Kind != want {
		return m, fmt.Errorf("got message %q, want %q", m.Kind, want)
	}
	return m, nil
}
