package device

// MemErrOf exposes the dma → engine error mapping to the external tests.
var MemErrOf = memErrOf

// DrainKicks drains the kick eventfd of every doorbell page the data plane
// serves and returns the sum of the counts (what clients wrote since the
// last drain).
func (dp *DataPlane) DrainKicks() uint64 {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	var n uint64
	for p := range dp.pages {
		c, _ := p.Kick().Drain()
		n += c
	}
	return n
}
