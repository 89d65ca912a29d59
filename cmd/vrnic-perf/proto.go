package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/rcpair"
)

// The control connection: like perftest, the client connects to the
// server over TCP (or a unix stream socket) before any RDMA traffic and
// both exchange what the other needs to address them. Messages are
// newline-delimited JSON, one message per line, at most maxLine bytes.
//
//	client → server  hello{options, qps[]}      the client's QPs (RESET); options.ece: the ECE offer
//	server → client  hello{qps[], ece}          the server's QPs, in RTS; ece: the options it took
//	                 (client moves its QPs to RTS)
//	for each message size:
//	client → server  start{size, iters}
//	server → client  started{checksum}          read_bw: checksum of the data to read
//	                 (the client runs the test; the server serves it)
//	client → server  done{size, sent[], checksum}
//	server → client  verdict{ok, error, counters}
//	client → server  bye
//
// Either side sends error{error} instead of its next message when it
// fails; the other side reports it and exits non-zero.
type message struct {
	Kind     string        `json:"kind"`
	Options  *options      `json:"options,omitempty"`
	QPs      []rcpair.Info `json:"qps,omitempty"`
	Size     int           `json:"size,omitempty"`
	Iters    int           `json:"iters,omitempty"`
	Sent     []uint64      `json:"sent,omitempty"`
	Checksum uint32        `json:"checksum,omitempty"`
	// Areas (done, write_bw and read_bw) is how many message areas of
	// each QP's buffer the test wrote (-areas: all of them once every QP
	// posted that many WRs); Checksum covers those.
	Areas    int       `json:"areas,omitempty"`
	Counters *counters `json:"counters,omitempty"`
	Lost     uint64    `json:"lost,omitempty"` // verdict, UC/UD send tests: messages that never arrived
	Error    string    `json:"error,omitempty"`
	// ECE (the server's hello) are the ECE options the server took of
	// the client's offer (options.ece) and set on its QPs.
	ECE uint32 `json:"ece,omitempty"`
}

// counters are the transport counters of one side's QPs over one size
// (QUERY_QP, difference between the end and the start).
type counters struct {
	PacketsSent     uint64 `json:"packets_sent"`
	PacketsReceived uint64 `json:"packets_received"`
	Retransmits     uint64 `json:"retransmits"`
	RNRNAKs         uint64 `json:"rnr_naks"`
}

func (c *counters) sub(o counters) counters {
	return counters{c.PacketsSent - o.PacketsSent, c.PacketsReceived - o.PacketsReceived,
		c.Retransmits - o.Retransmits, c.RNRNAKs - o.RNRNAKs}
}

const maxLine = 4 << 20 // the hello of maxQPs QPs

var errProtocol = errors.New("control protocol")

// decodeMessage parses and checks one line from the peer.
func decodeMessage(line []byte) (message, error) {
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		return m, fmt.Errorf("%w: %w", errProtocol, err)
	}
	switch m.Kind {
	case "hello", "start", "started", "done", "verdict", "bye", "error":
	default:
		return m, fmt.Errorf("%w: unknown message %q", errProtocol, m.Kind)
	}
	if len(m.QPs) > maxQPs || len(m.Sent) > maxQPs {
		return m, fmt.Errorf("%w: %d QPs", errProtocol, max(len(m.QPs), len(m.Sent)))
	}
	if m.Size < 0 || m.Size > maxSize || m.Iters < 0 {
		return m, fmt.Errorf("%w: size %d, iters %d", errProtocol, m.Size, m.Iters)
	}
	for _, q := range m.QPs {
		if q.QPN >= 1<<24 || q.PSN >= 1<<24 {
			return m, fmt.Errorf("%w: QPN %#x or PSN %#x out of 24 bits", errProtocol, q.QPN, q.PSN)
		}
	}
	if m.ECE&^abi.ECEOptions != 0 {
		return m, fmt.Errorf("%w: ECE options %#x: unknown bits", errProtocol, m.ECE)
	}
	if m.Options != nil {
		if err := m.Options.finish(); err != nil {
			return m, fmt.Errorf("%w: %w", errProtocol, err)
		}
	}
	return m, nil
}

// ctrlConn is one end of the control connection.
type ctrlConn struct {
	c  net.Conn
	rd *bufio.Reader
}

func newCtrlConn(c net.Conn) *ctrlConn {
	return &ctrlConn{c: c, rd: bufio.NewReaderSize(c, maxLine)}
}

func (p *ctrlConn) send(m message) error {
	b, err := json.Marshal(&m)
	if err != nil {
		return err
	}
	p.c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	_, err = p.c.Write(append(b, '\n'))
	return err
}

// recv reads the next message within timeout (0: no limit); want, if not
// empty, is the kind expected. A peer's error message is returned as an
// error.
func (p *ctrlConn) recv(want string, timeout time.Duration) (message, error) {
	var dl time.Time
	if timeout > 0 {
		dl = time.Now().Add(timeout)
	}
	p.c.SetReadDeadline(dl)
	line, err := p.rd.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return message{}, fmt.Errorf("%w: message longer than %d bytes", errProtocol, maxLine)
	}
	if err != nil {
		return message{}, fmt.Errorf("control connection: %w", err)
	}
	m, err := decodeMessage(line)
	if err != nil {
		return m, err
	}
	if m.Kind == "error" {
		return m, errors.New(m.Error)
	}
	if want != "" && m.Kind != want {
		return m, fmt.Errorf("%w: got message %q, want %q", errProtocol, m.Kind, want)
	}
	return m, nil
}

// splitAddr turns a control address into a network and an address:
// "unix:/path" is a unix stream socket, anything else TCP host:port.
func splitAddr(a string) (network, addr string) {
	if p, ok := strings.CutPrefix(a, "unix:"); ok {
		return "unix", p
	}
	return "tcp", a
}
