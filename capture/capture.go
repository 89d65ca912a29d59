// Package capture records the frames a daemon's engine sends and receives,
// as pcapng that tshark and Wireshark open: vrnicctl capture.
//
// A Tap wraps each of the engine's links (Wrap). While no capture runs, a
// wrapped link costs one atomic load per batch. While one runs, the
// worker copies each frame it sends or receives into the session's
// bounded queue under a mutex held for the copy; a writer goroutine turns
// the queue into pcapng blocks on the operator's stream. The worker never
// waits for the writer: when the queue is full the frame is not captured
// and is counted (Stats.Dropped), so a slow reader loses frames of its
// capture, and the data path loses nothing.
//
// Frames of the UDP link (roce.ModeUDP) are UDP payloads with the peer
// beside them; the capture writes them as the Ethernet/IP/UDP frames a tap
// on the wire would see (roce.AppendCaptureFrame, zero MACs), so their
// ICRC verifies in any RoCE v2 decoder. TAP and in-memory (Ethernet) frames
// are written as they are.
//
// One capture runs at a time (Start fails with ErrBusy otherwise).
//
// In the daemon the links are wrapped by the fault layer (package
// faults), which reports to the Tap (Capturing, Observe) instead: sent
// frames as the engine built them, before any fault rule, and received
// frames as the link delivered them, before any rule, each with a pcapng
// comment saying what the rules did to it ("fault rule 3: drop"). A
// frame a rule drops is in the capture with its comment.
package capture

import (
	"errors"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/roce"
)

// ErrBusy: a capture is running already.
var ErrBusy = errors.New("capture: a capture is running already")

// Options bound a capture.
type Options struct {
	// Count ends the capture after this many frames (0: no bound).
	Count int
	// Duration ends it after this long (0: no bound).
	Duration time.Duration
	// Snaplen truncates each frame to this many bytes (0: whole frames).
	Snaplen int
	// Queue is how many frames may wait for the writer (default 4096).
	Queue int
	// WriteTimeout ends the capture when one write to the reader takes
	// longer (default 5 s), where the writer has SetWriteDeadline.
	WriteTimeout time.Duration
}

// Stats are a capture's counts.
type Stats struct {
	Captured uint64 // frames written
	Dropped  uint64 // frames not captured: the queue was full
}

// Tap is the capture point of one daemon: the links it wraps and the
// running capture.
type Tap struct {
	mode  roce.Mode
	local netip.AddrPort // the UDP link's address (ModeUDP)

	mu  sync.Mutex
	cur atomic.Pointer[session]
}

// New returns a Tap for links of mode; local is the UDP link's address
// (ModeUDP only).
func New(mode roce.Mode, local netip.AddrPort) *Tap { return &Tap{mode: mode, local: local} }

// Wrap returns l with the tap on it. The result implements
// engine.ReadyArmer when l does.
func (t *Tap) Wrap(l engine.Link) engine.Link {
	w := &tapLink{Link: l, t: t}
	if a, ok := l.(engine.ReadyArmer); ok {
		return &armLink{tapLink: w, a: a}
	}
	return w
}

type tapLink struct {
	engine.Link
	t       *Tap
	scratch [][]byte // copies of the frames being sent while a capture runs
}

// SendBatch captures what the link takes. A link may hand the buffers it
// takes on and leave empty ones in their slots (engine.Link; the
// in-memory link moves long frames), so with a capture running the frames
// are copied before the send.
func (l *tapLink) SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	s := l.t.cur.Load()
	if s == nil {
		return l.Link.SendBatch(frames, peers)
	}
	for len(l.scratch) < len(frames) {
		l.scratch = append(l.scratch, nil)
	}
	for i, f := range frames {
		l.scratch[i] = append(l.scratch[i][:0], f...)
	}
	n, err := l.Link.SendBatch(frames, peers)
	if n > 0 {
		s.add(l.scratch[:n], peers, nil, true)
	}
	return n, err
}

func (l *tapLink) RecvBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	n, err := l.Link.RecvBatch(frames, peers)
	if s := l.t.cur.Load(); s != nil && n > 0 {
		s.add(frames[:n], peers, nil, false)
	}
	return n, err
}

// Capturing reports whether a capture runs (one atomic load): the fault
// layer (package faults) asks before it calls Observe.
func (t *Tap) Capturing() bool { return t.cur.Load() != nil }

// Observe captures frames (sent, or received, with their peers in
// ModeUDP) if a capture runs, each with its comment notes[i] (none when
// notes is nil or notes[i] is empty): the fault layer reports here what
// the engine sent and what arrived, with what its rules did to each
// frame. It never waits for the writer.
func (t *Tap) Observe(frames [][]byte, peers []netip.AddrPort, notes []string, sent bool) {
	if s := t.cur.Load(); s != nil && len(frames) > 0 {
		s.add(frames, peers, notes, sent)
	}
}

type armLink struct {
	*tapLink
	a engine.ReadyArmer
}

func (l *armLink) ArmReady() { l.a.ArmReady() }

// record is one captured frame waiting for the writer.
type record struct {
	at      int64 // unix nanoseconds
	frame   []byte
	comment string
}

// session is one running capture.
type session struct {
	t     *Tap
	opt   Options
	mu    sync.Mutex
	queue []record // waiting for the writer
	spare [][]byte // frame buffers to reuse
	wake  chan struct{}
	taken int // frames accepted (bounded by Count)
	full  bool
	stats struct{ captured, dropped atomic.Uint64 }
}

// add copies frames (sent, or received, with their peers in ModeUDP) and
// their comments (notes may be nil) into the queue; it never waits for
// the writer.
func (s *session) add(frames [][]byte, peers []netip.AddrPort, notes []string, sent bool) {
	now := time.Now().UnixNano()
	s.mu.Lock()
	for i, f := range frames {
		if s.full || s.opt.Count > 0 && s.taken >= s.opt.Count {
			s.full = true
			break
		}
		if len(s.queue) >= s.opt.Queue {
			s.stats.dropped.Add(1)
			continue
		}
		var b []byte
		if n := len(s.spare); n > 0 {
			b, s.spare = s.spare[n-1][:0], s.spare[:n-1]
		}
		if s.t.mode == roce.ModeUDP {
			ps := roce.Pseudo{Src: peers[i].Addr(), SrcPort: peers[i].Port(), Dst: s.t.local.Addr(), DstPort: s.t.local.Port()}
			if sent {
				ps = roce.Pseudo{Src: s.t.local.Addr(), SrcPort: s.t.local.Port(), Dst: peers[i].Addr(), DstPort: peers[i].Port()}
			}
			b = roce.AppendCaptureFrame(b, &ps, [6]byte{}, [6]byte{}, f)
		} else {
			b = append(b, f...)
		}
		if s.opt.Snaplen > 0 && len(b) > s.opt.Snaplen {
			b = b[:s.opt.Snaplen]
		}
		r := record{at: now, frame: b}
		if i < len(notes) {
			r.comment = notes[i]
		}
		s.queue = append(s.queue, r)
		s.taken++
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Start runs a capture to w (closed when the capture ends) and returns at
// once; done is closed, with the capture's counts, when it ended: Count
// frames written, Duration over, stop closed, or w failing (the reader
// went away).
func (t *Tap) Start(w io.WriteCloser, opt Options, stop <-chan struct{}) (done <-chan Stats, err error) {
	if opt.Queue <= 0 {
		opt.Queue = 4096
	}
	if opt.WriteTimeout <= 0 {
		opt.WriteTimeout = 5 * time.Second
	}
	if d, ok := w.(interface{ SetWriteDeadline(time.Time) error }); ok {
		w = &deadlineWriter{WriteCloser: w, d: d, after: opt.WriteTimeout}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cur.Load() != nil {
		return nil, ErrBusy
	}
	s := &session{t: t, opt: opt, wake: make(chan struct{}, 1)}
	pw, err := newPcapngWriter(w)
	if err != nil {
		w.Close()
		return nil, err
	}
	t.cur.Store(s)
	out := make(chan Stats, 1)
	go func() {
		st := s.run(pw, stop)
		t.mu.Lock()
		t.cur.Store(nil)
		t.mu.Unlock()
		w.Close()
		out <- st
		close(out)
	}()
	return out, nil
}

// deadlineWriter bounds each write.
type deadlineWriter struct {
	io.WriteCloser
	d     interface{ SetWriteDeadline(time.Time) error }
	after time.Duration
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.d.SetWriteDeadline(time.Now().Add(w.after))
	return w.WriteCloser.Write(p)
}

// run writes the queue until the capture ends.
func (s *session) run(pw *pcapngWriter, stop <-chan struct{}) Stats {
	var deadline <-chan time.Time
	if s.opt.Duration > 0 {
		tm := time.NewTimer(s.opt.Duration)
		defer tm.Stop()
		deadline = tm.C
	}
	var batch []record
	for {
		ended := false
		select {
		case <-s.wake:
		case <-stop:
			ended = true
		case <-deadline:
			ended = true
		}
		s.mu.Lock()
		batch, s.queue = s.queue, batch[:0]
		full := s.full
		s.mu.Unlock()
		for _, r := range batch {
			if err := pw.packet(r.at, r.frame, r.comment); err != nil {
				return s.statsNow()
			}
			s.stats.captured.Add(1)
		}
		s.mu.Lock()
		for _, r := range batch {
			s.spare = append(s.spare, r.frame)
		}
		s.mu.Unlock()
		if ended || full {
			return s.statsNow()
		}
	}
}

func (s *session) statsNow() Stats {
	return Stats{Captured: s.stats.captured.Load(), Dropped: s.stats.dropped.Load()}
}
