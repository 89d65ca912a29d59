package verbs

import "github.com/vrnic/vrnic/abi"

// Raw views of the shared memory the library writes for its QPs and CQs:
// for tools and tests of the daemon's defences against a client that
// writes anything there (garbage indices, garbage WQEs). Writing through
// them bypasses every invariant the library keeps; the daemon must cope,
// the QP or CQ written need not.

// RawDoorbellRecord returns the QP's doorbell record as mapped (the
// abi.OffDB* offsets).
func (q *QP) RawDoorbellRecord() []byte { return q.rec }

// RawSQ returns the QP's send queue ring as mapped: slots of
// abi.WQEBlock-sized blocks, as the ABI lays them out.
func (q *QP) RawSQ() []byte { return q.sq.ring.Bytes }

// RawMark marks the QP's doorbell record in the page's summary (ABI 1.3),
// as the library does after it stores a producer index: a producer index
// written through RawDoorbellRecord is read by the daemon only once marked
// (when the context uses the summary).
func (q *QP) RawMark() {
	q.sq.mark()
	q.rq.mark()
}

// RawDoorbellRecord returns the CQ's doorbell record as mapped.
func (cq *CQ) RawDoorbellRecord() []byte { return cq.rec }

// RawKick wakes the daemon's doorbell poller if it sleeps, as the library
// does after it stores a producer index.
func (c *Context) RawKick() { c.kick() }

// RawPD returns a PD value naming handle on this context, whatever the
// daemon holds under it: for tests of the daemon's checks of PD handles
// (another context's, a stale one).
func (c *Context) RawPD(handle uint32) *PD { return &PD{ctx: c, Handle: handle} }

// RawCommand sends command op with payload as its body, whatever it
// holds, and waits for the reply (without a body): for tests of how the
// daemon takes commands of other lengths (an older ABI's) or contents.
func (c *Context) RawCommand(op abi.Cmd, payload []byte) error {
	_, _, err := c.k.call(op, nil, payload, nil, nil)
	return err
}
