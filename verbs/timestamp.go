package verbs

import (
	"encoding/binary"
	"fmt"

	"github.com/vrnic/vrnic/abi"
	"golang.org/x/sys/unix"
)

// Completion timestamps (ABI 1.4, abi.CQFlagTimestamp).
//
// A CQ created with timestamps has, after its cqe_count CQEs, an array of
// cqe_count little-endian u64: the daemon writes the time a completion
// was generated into entry i before it publishes CQE i (owner byte last),
// so a reader that saw the CQE ready reads its timestamp too. The
// device's clock is the host's CLOCK_REALTIME in nanoseconds: its
// hca_core_clock is 1 GHz and a raw timestamp is also the wall-clock time
// (ibv_wc_read_completion_ts and ibv_wc_read_completion_wallclock_ns give
// the same number).

// HCACoreClockKHz is the device clock's frequency in kHz as
// QueryDeviceEx reports it (ibv_device_attr_ex.hca_core_clock): 1 GHz, a
// nanosecond per tick.
const HCACoreClockKHz = 1_000_000

// cqSlots is the ring size CreateCQ and Resize give a CQ of at least cqe
// entries: a power of two, at least 2.
func cqSlots(cqe int) uint32 {
	n := uint32(2)
	for int(n) < cqe {
		n <<= 1
	}
	return n
}

// cqRingBytes is the host memory of a ring of n CQEs, with its timestamp
// array if ts.
func cqRingBytes(n uint32, ts bool) int {
	if ts {
		return int(n) * (abi.SizeofCQE + 8)
	}
	return int(n) * abi.SizeofCQE
}

// setRing makes ring, of n CQEs and their timestamps if ts, the CQ's ring
// (CreateCQ, Resize).
func (cq *CQ) setRing(ring *Buffer, n uint32, ts bool) {
	cq.ring, cq.n, cq.mask, cq.ts = ring, n, n-1, nil
	if ts {
		cq.ts = ring.Bytes[int(n)*abi.SizeofCQE : cqRingBytes(n, true)]
	}
}

// timestamp reads the completion timestamp of CQE i (free-running), 0
// for a CQ without timestamps. The CQE's tail word was loaded first: the
// daemon wrote the timestamp before it.
func (cq *CQ) timestamp(i uint32) uint64 {
	if cq.ts == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(cq.ts[(i&cq.mask)*8:])
}

// CreateCQWithTimestamps is CreateCQ for a CQ whose completions carry the
// time the device generated them (ibv_create_cq_ex with
// IBV_WC_EX_WITH_COMPLETION_TIMESTAMP): read them with PollTS.
func (c *Context) CreateCQWithTimestamps(cqe int, ch *CompChannel) (*CQ, error) {
	return c.createCQ(cqe, ch, abi.CQFlagTimestamp)
}

// Timestamps reports whether the CQ's completions carry timestamps.
func (cq *CQ) Timestamps() bool { return cq.ts != nil }

// PollTS is Poll that also stores the completion timestamp of wc[i] in
// ts[i] (nanoseconds of CLOCK_REALTIME; 0 on a CQ created without
// timestamps). It reads at most min(len(wc), len(ts)) completions.
func (cq *CQ) PollTS(wc []abi.CQE, ts []uint64) int {
	if ts == nil {
		return 0
	}
	return cq.poll(wc, ts)
}

// QueryRTValues returns the device clock now, in the units of completion
// timestamps (ibv_query_rt_values_ex with IBV_VALUES_MASK_RAW_CLOCK): the
// host's CLOCK_REALTIME in nanoseconds, which is the device's clock.
func (c *Context) QueryRTValues() (uint64, error) {
	var t unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &t); err != nil {
		return 0, fmt.Errorf("verbs: clock_gettime: %w", err)
	}
	return uint64(t.Nano()), nil
}
