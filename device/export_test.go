package device

import "time"

// StoreQPState stores s into QP qpn's state word, as the transport does
// when it moves a QP to ERR on its own (and as only a test does for other
// states, to reach SQE without a UD data path).
func (d *Device) StoreQPState(qpn uint32, s QPState) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.qps.get(qpn)
	ok := q != nil
	if ok {
		q.StateWord().TransportState(s)
	}
	return ok
}

// SetEventBacklogMax bounds the bytes of a context's events waiting for
// room in its socket until the returned function restores the bound.
func SetEventBacklogMax(n int) (restore func()) {
	old := eventBacklogMax
	eventBacklogMax = n
	return func() { eventBacklogMax = old }
}

// SetEventAfterSend makes the event sinks' flush goroutines call f after
// each send, with the sink's close, until the returned function restores
// the default.
func SetEventAfterSend(f func(closeSink func())) (restore func()) {
	eventAfterSend.Store(&f)
	return func() { eventAfterSend.Store(nil) }
}

// SetAcceptPause sets the pauses of Serve after accept errors (first and
// longest) until the returned function restores them.
func SetAcceptPause(first, longest time.Duration) (restore func()) {
	oldMin, oldMax := acceptPauseMin, acceptPauseMax
	acceptPauseMin, acceptPauseMax = first, longest
	return func() { acceptPauseMin, acceptPauseMax = oldMin, oldMax }
}
