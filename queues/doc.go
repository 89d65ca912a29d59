// Package queues implements the daemon's views of the client's work rings
// (SQ, RQ, SRQ) and completion rings (CQ) in shared host memory.
//
// A ring is a []byte the daemon gets from package dma (a slice of a mapped
// memfd) plus a slot count and stride the daemon keeps in private memory and
// never re-reads from shared memory:
//
//	SQ   slots x SQWQEBlocks(max_sge, max_inline)*64 bytes
//	     slot: SendWQE (64) | SGE x num_sge (16 each) or inline_len bytes
//	RQ   slots x RQWQESize(max_sge) bytes
//	SRQ  slot: RecvWQE (16) | SGE x num_sge
//	CQ   count x 32-byte CQE; owner byte (bit 0: phase) written last
//
// Indices are free-running u32 counters in the doorbell record (package
// doorbell hands them out as *atomic.Uint32 over the mapped page); the slot
// of index i is i & (slots-1).
//
// Work queues (consumer side): Poll loads the client's producer index once
// (atomic) and rejects impossible values (pi - ci > slots: a hostile or
// broken client; the caller moves the QP to ERROR). Next copies one slot
// into private memory before decoding it, so the client cannot change a WQE
// between check and use, and validates it; a malformed WQE is consumed and
// reported as a *WQEError carrying its wr_id and the Reason it was rejected
// for (the transport maps the Reason to a completion status). Publish
// stores the consumer index once per batch.
//
// Completion queue (producer side): Push writes the CQE body, then the last
// 32-bit word (pkey_index, sl, owner) with one atomic store, so a client
// that reads the owner byte with acquire semantics sees a complete entry. A
// full CQ is an error (ErrCQFull), never an overwrite of unread entries.
//
// Nothing here allocates per WQE or CQE.
package queues
