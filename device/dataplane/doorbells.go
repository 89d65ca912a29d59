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
// clients did lately, not what they hold: it reads the pages that had a
// post lately and a few of the others, and in a page it reads the
// client's doorbell summary (abi.DBFlagSummary, ABI 1.3) and only the QP
// records of the groups marked there; it never walks every QP of the data
// plane, nor every page.
//
// Pages are hot or cold. A page is hot from its first QP and from any pass
// that finds a post in it, and turns cold after hotPasses passes that find
// none. A pass reads every hot page and coldBatch(len(cold)) of the cold
// ones, in turn, so that a cold page is read at least every coldEvery
// passes: a post to a QP of a page idle for a while is found within that
// many passes, and a host with thousands of idle contexts costs a pass a
// few dozen page reads, not thousands (each a cache line of another
// client's memory, each a TLB miss likely). The re-check before the poller
// sleeps, and the first pass after it wakes, read every page (no wake-up
// may be lost; a kick is a post to find at once).
//
// A page whose client does not mark its posts (client_flags without
// abi.DBFlagSummary: any ABI 1.2 client) is read record by record, at most
// legacyBudget record slots per pass over all such pages together,
// resuming where the last read of the page stopped: the pass stays
// bounded. Either way a QP in use is on its worker's active list and its
// worker reads its SQ itself (package engine, active.go); the poller
// matters for a QP that had no work for a while.
//
// Creating or destroying a QP stores one pointer in its page's table: no
// copy of anything that grows with the number of QPs.

// legacyBudget is the number of record slots of pages without a summary
// read per poller pass.
const legacyBudget = 1024

// hotPasses is how many passes without a post a page stays hot; coldEvery
// bounds how many passes go by between two reads of a cold page.
const (
	hotPasses = 4096
	coldEvery = 64
)

// coldBatch is how many cold pages a pass reads: at least 8, and enough
// that each is read every coldEvery passes.
func coldBatch(cold int) int { return max(8, (cold+coldEvery-1)/coldEvery) }

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
	// quiet counts the passes since the page last had a post, while it
	// is hot (poller only).
	quiet int
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
// goroutine only and allocates nothing (but when the served pages change).
func (dp *DataPlane) pollDoorbells() bool { return dp.poll(false) }

// recheckDoorbells is the pass after kick_needed was stored: every record
// of every page is read.
func (dp *DataPlane) recheckDoorbells() bool { return dp.poll(true) }

func (dp *DataPlane) poll(full bool) bool {
	found := false
	dp.passReads, dp.passPages = 0, 0
	dp.budget = legacyBudget
	dp.retier()
	if full || dp.slept {
		// Before a sleep, and on the first pass after one (a kick woke
		// the poller: its page may be cold), every page.
		dp.slept = full
		for _, pw := range dp.hot {
			if dp.readPage(pw, full) {
				found = true
				pw.quiet = 0
			}
		}
		for i := 0; i < len(dp.cold); {
			if dp.readPage(dp.cold[i], full) {
				found = true
				dp.warm(i)
				continue // another page took its place
			}
			i++
		}
	} else {
		for i := 0; i < len(dp.hot); {
			pw := dp.hot[i]
			if dp.readPage(pw, false) {
				found = true
				pw.quiet = 0
			} else if pw.quiet++; pw.quiet >= hotPasses {
				dp.hot[i] = dp.hot[len(dp.hot)-1]
				dp.hot[len(dp.hot)-1] = nil
				dp.hot = dp.hot[:len(dp.hot)-1]
				dp.cold = append(dp.cold, pw)
				continue
			}
			i++
		}
		for k := min(coldBatch(len(dp.cold)), len(dp.cold)); k > 0; k-- {
			if dp.coldNext >= len(dp.cold) {
				dp.coldNext = 0
			}
			pw := dp.cold[dp.coldNext]
			if dp.readPage(pw, false) {
				found = true
				dp.warm(dp.coldNext)
				continue // another page took its place
			}
			dp.coldNext++
		}
	}
	dp.recordReads.Add(dp.passReads)
	dp.pageReads.Add(dp.passPages)
	// Completions written since the last pass are traffic too: their
	// client is about to post again (a queue kept full posts as
	// completions free its slots), so the poller keeps polling and the
	// client keeps posting without kicks.
	if n := dp.completions(); n != dp.lastCQEs {
		dp.lastCQEs = n
		found = true
	}
	if !found {
		// Let the workers (which share the poller's P) run. The poller
		// does not give its CPU away as an idle worker does
		// (osyield): tried, send_lat's p99 went from 0.58 to 2.5 ms,
		// the CPU going to another polling thread for its whole slice.
		runtime.Gosched()
	}
	return found
}

// retier brings the hot and cold lists up to the served pages when they
// changed: a page new to the poller is hot, a page gone leaves its list.
func (dp *DataPlane) retier() {
	list := dp.watch.Load()
	if list == dp.tiered {
		return
	}
	dp.tiered = list
	fresh := make(map[*pageWatch]bool, len(*list))
	for _, pw := range *list {
		fresh[pw] = true
	}
	keep := func(l []*pageWatch) []*pageWatch {
		out := l[:0]
		for _, pw := range l {
			if fresh[pw] {
				out = append(out, pw)
				delete(fresh, pw) // known: not new
			}
		}
		clear(l[len(out):])
		return out
	}
	dp.hot, dp.cold = keep(dp.hot), keep(dp.cold)
	for _, pw := range *list {
		if fresh[pw] {
			pw.quiet = 0
			dp.hot = append(dp.hot, pw)
		}
	}
	if dp.coldNext >= len(dp.cold) {
		dp.coldNext = 0
	}
}

// warm moves cold page i to the hot list.
func (dp *DataPlane) warm(i int) {
	pw := dp.cold[i]
	last := len(dp.cold) - 1
	dp.cold[i] = dp.cold[last]
	dp.cold[last] = nil
	dp.cold = dp.cold[:last]
	pw.quiet = 0
	dp.hot = append(dp.hot, pw)
}

// readPage reads pw: its marked groups, or, without a summary, its
// records (all of them when full, else from its cursor while the pass's
// legacy budget lasts). It reports whether it found a post.
func (dp *DataPlane) readPage(pw *pageWatch, full bool) bool {
	dp.passPages++
	if pw.flags.Load()&abi.DBFlagSummary != 0 {
		return dp.pollSummary(pw)
	}
	return dp.pollRecords(pw, full)
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

// pollRecords reads the QP records of a page without a summary: all of
// them when full, else from where its last read stopped while the pass's
// legacy budget lasts.
func (dp *DataPlane) pollRecords(pw *pageWatch, full bool) bool {
	found := false
	hi := min(pw.hi.Load(), abi.DBRecords)
	i := pw.cursor
	if full {
		i = 1
	}
	for ; i < hi && (full || dp.budget > 0); i++ {
		dp.budget--
		if x := pw.qps[i].Load(); x != nil && dp.checkQP(x) {
			found = true
		}
	}
	if i >= hi {
		i = 1
	}
	pw.cursor = i
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
