package dataplane

import (
	"math/bits"
	"runtime"
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/doorbell"
)

// The doorbell poller's view of the pages it serves. A pass costs what the
// clients did since the last one, not what they hold: for every page it
// reads the client's doorbell summary (abi.DBFlagSummary, ABI 1.3) and
// reads only the QP records of the groups marked there; it never walks
// every QP of the data plane.
//
// A page whose client does not mark its posts (client_flags without
// abi.DBFlagSummary: any ABI 1.2 client) is read record by record, at most
// legacyBudget record slots per pass over all such pages together,
// resuming where the last pass stopped: the pass stays bounded, and a post
// to such a client's idle QP is noticed within ceil(slots / legacyBudget)
// passes. The re-check before the poller sleeps reads every slot of every
// such page (no wake-up may be lost), once per sleep. Either way a QP in
// use is on its worker's active list and its worker reads its SQ itself
// (package engine, active.go); the poller matters for a QP that had no
// work for a while.
//
// Creating or destroying a QP stores one pointer in its page's table: no
// copy of anything that grows with the number of QPs.

// legacyBudget is the number of record slots of pages without a summary
// read per poller pass.
const legacyBudget = 1024

// pageWatch is one served doorbell page.
type pageWatch struct {
	page    *doorbell.Page
	flags   *atomic.Uint32
	summary [abi.DBSummaryWords]*atomic.Uint32
	// qps are the page's QPs by doorbell record index (nil: none).
	qps [abi.DBRecords]atomic.Pointer[dpQP]
	// hi is one past the highest record index a QP of the page had.
	hi atomic.Uint32
	// n counts the page's QPs (guarded by DataPlane.mu).
	n int
	// cursor is where the next read without summary starts (poller only).
	cursor uint32
}

func newPageWatch(page *doorbell.Page) *pageWatch {
	pw := &pageWatch{page: page, flags: page.ClientFlags(), cursor: 1}
	for i := range pw.summary {
		pw.summary[i] = page.Summary(i)
	}
	return pw
}

// addQPLocked enters x in its page's table, adding the page to the
// watched set (and the poller) for its first QP.
func (dp *DataPlane) addQPLocked(x *dpQP, idx uint32) {
	pw := dp.pages[x.page]
	if pw == nil {
		pw = newPageWatch(x.page)
		dp.pages[x.page] = pw
		old := *dp.watch.Load()
		next := make([]*pageWatch, len(old), len(old)+1)
		copy(next, old)
		next = append(next, pw)
		dp.watch.Store(&next)
		if err := dp.poller.Add(x.page); err != nil {
			dp.log.Error("doorbell poller: add page", "err", err)
		}
	}
	x.dbIndex = idx
	pw.qps[idx].Store(x)
	if idx >= pw.hi.Load() {
		pw.hi.Store(idx + 1)
	}
	pw.n++
}

// qpLocked returns the data plane's QP of q (nil if it has none): the one
// in q's page's table at q's doorbell record.
func (dp *DataPlane) qpLocked(q *device.QP) *dpQP {
	pw := dp.pages[q.Doorbells()]
	if pw == nil || q.DBIndex() >= uint32(len(pw.qps)) {
		return nil
	}
	if x := pw.qps[q.DBIndex()].Load(); x != nil && x.qpn == q.QPN() {
		return x
	}
	return nil
}

// removeQPLocked takes x out of its page's table; it reports whether that
// was the page's last QP (the page is then out of the watched set, and
// the caller removes it from the poller).
func (dp *DataPlane) removeQPLocked(x *dpQP) bool {
	pw := dp.pages[x.page]
	if pw == nil {
		return false
	}
	pw.qps[x.dbIndex].Store(nil)
	if pw.n--; pw.n > 0 {
		return false
	}
	delete(dp.pages, x.page)
	old := *dp.watch.Load()
	next := make([]*pageWatch, 0, len(old))
	for _, p := range old {
		if p != pw {
			next = append(next, p)
		}
	}
	dp.watch.Store(&next)
	return true
}

// pollDoorbells is the doorbell poller's pass. It runs on the poller's
// goroutine only and allocates nothing.
func (dp *DataPlane) pollDoorbells() bool { return dp.poll(false) }

// recheckDoorbells is the pass after kick_needed was stored: every record
// of pages without a summary is read.
func (dp *DataPlane) recheckDoorbells() bool { return dp.poll(true) }

func (dp *DataPlane) poll(full bool) bool {
	found := false
	dp.passReads = 0
	defer func() { dp.recordReads.Add(dp.passReads) }()
	pages := *dp.watch.Load()
	for _, pw := range pages {
		if pw.flags.Load()&abi.DBFlagSummary != 0 && dp.pollSummary(pw) {
			found = true
		}
	}
	if dp.pollUnmarked(pages, full) {
		found = true
	}
	// Completions written since the last pass are traffic too: their
	// client is about to post again (a queue kept full posts as
	// completions free its slots), so the poller keeps polling and the
	// client keeps posting without kicks.
	if n := dp.completions(); n != dp.lastCQEs {
		dp.lastCQEs = n
		found = true
	}
	if !found {
		runtime.Gosched() // let the workers and clients run on busy cores
	}
	return found
}

// pollSummary takes the marked groups of pw's summary and checks their
// QP records.
func (dp *DataPlane) pollSummary(pw *pageWatch) bool {
	found := false
	for w, word := range pw.summary {
		if word.Load() == 0 {
			continue
		}
		for v := word.Swap(0); v != 0; v &= v - 1 {
			g := uint32(w*32 + bits.TrailingZeros32(v))
			for i := g * abi.DBSummaryGroup; i < (g+1)*abi.DBSummaryGroup; i++ {
				if x := pw.qps[i].Load(); x != nil && dp.checkQP(x) {
					found = true
				}
			}
		}
	}
	return found
}

// pollUnmarked reads the QP records of pages without a summary: all of
// them when full, else legacyBudget slots from where the last pass
// stopped.
func (dp *DataPlane) pollUnmarked(pages []*pageWatch, full bool) bool {
	found := false
	budget := legacyBudget
	n := len(pages)
	start := dp.unmarkedNext
	for k := 0; k < n && (full || budget > 0); k++ {
		p := (start + k) % n
		pw := pages[p]
		if pw.flags.Load()&abi.DBFlagSummary != 0 {
			continue
		}
		hi := min(pw.hi.Load(), abi.DBRecords)
		i := pw.cursor
		if full {
			i = 1
		}
		for ; i < hi && (full || budget > 0); i++ {
			budget--
			if x := pw.qps[i].Load(); x != nil && dp.checkQP(x) {
				found = true
			}
		}
		if i < hi {
			pw.cursor = i // budget spent: go on from here next pass
			dp.unmarkedNext = p
			return found
		}
		pw.cursor = 1
	}
	if n > 0 {
		dp.unmarkedNext = (start + 1) % n
	}
	return found
}

// checkQP kicks x's worker if a producer index of x moved since the
// poller last looked.
func (dp *DataPlane) checkQP(x *dpQP) bool {
	dp.passReads++
	sq, rq := x.rec.SQPI.Load(), x.rec.RQPI.Load()
	if sq == x.lastSQ && rq == x.lastRQ {
		return false
	}
	x.lastSQ, x.lastRQ = sq, rq
	dp.eng.Kick(x.qpn)
	return true
}

// completions is the number of CQEs the engine's workers wrote.
func (dp *DataPlane) completions() uint64 {
	var n uint64
	for i := range dp.eng.Workers() {
		n += dp.eng.WorkerCounters(i).CQEs.Load()
	}
	return n
}
