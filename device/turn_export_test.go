package device

// TakeTurn takes uid's turn on the control path (uidTurn), as a command
// of one of its connections would, and returns the function that gives it
// back; false if uid has no connection.
func (d *Device) TakeTurn(uid uint32) (func(), bool) {
	d.mu.Lock()
	a := d.accounts[uid]
	d.mu.Unlock()
	if a == nil {
		return nil, false
	}
	a.turn.take()
	return a.turn.release, true
}
