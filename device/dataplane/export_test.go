package dataplane

import "github.com/vrnic/vrnic/doorbell"

// MemErrOf exposes the dma → engine error mapping to the external tests.
var MemErrOf = memErrOf

// CountersOf exposes the engine → operator counter copy.
var CountersOf = countersOf

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

// Armed reports whether the poller advertises kick_needed in every page
// it serves (it is going to sleep or asleep) and serves at least one.
func (dp *DataPlane) Armed() bool {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	for p := range dp.pages {
		if p.KickNeeded().Load() == 0 {
			return false
		}
	}
	return len(dp.pages) > 0
}

// QPRings returns the doorbell record and the send ring of QP qpn as the
// daemon maps them: the same memory the client writes, so a test can
// write there what a broken or hostile client would.
func (dp *DataPlane) QPRings(qpn uint32) (doorbell.QPRecord, []byte, bool) {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	for _, pw := range dp.pages {
		for i := range pw.qps {
			if x := pw.qps[i].Load(); x != nil && x.qpn == qpn {
				return x.rec, x.sq.q.Ring(), true
			}
		}
	}
	return doorbell.QPRecord{}, nil, false
}

// KickQP wakes the worker that owns qpn, as a client's kick does.
func (dp *DataPlane) KickQP(qpn uint32) { dp.eng.Kick(qpn) }

// RecordReads is the number of QP doorbell records the poller has read.
func (dp *DataPlane) RecordReads() uint64 { return dp.recordReads.Load() }

// PageReads is the number of doorbell pages the poller read.
func (dp *DataPlane) PageReads() uint64 { return dp.pageReads.Load() }

// PollerPasses is the number of doorbell poller passes so far.
func (dp *DataPlane) PollerPasses() uint64 { return dp.poller.Stats().Passes }

// HotPasses is how many passes without a post a doorbell page stays hot.
const HotPasses = hotPasses
