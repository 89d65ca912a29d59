package cm

import "time"

// IBTA expresses CM and transport timeouts as an exponent t: 4.096 µs ×
// 2^t. Linux converts them to milliseconds with a power of two,
// 2^max(t-8, 0) ms (cm_convert_to_ms; 2^8 × 4.096 µs is 1.049 ms), and
// this package uses the same conversion so that its timers fire when a
// Linux peer's would.

// IBADuration returns the Linux approximation of 4.096 µs × 2^t.
func IBADuration(t uint8) time.Duration {
	if t > 31 {
		t = 31
	}
	shift := int(t) - 8
	if shift < 0 {
		shift = 0
	}
	return time.Duration(1<<shift) * time.Millisecond
}

// AckTimeout returns the QP local ACK timeout exponent for a CA ACK delay
// and a path packet life time, both exponents: 4.096 µs × 2^timeout =
// 4.096 µs × 2^ackDelay + 2 × 4.096 µs × 2^packetLifeTime, rounded as
// Linux cm_ack_timeout does (take the larger of ackDelay and
// packetLifeTime+1, add one when the other is within half of it), at most
// 31.
func AckTimeout(ackDelay, packetLifeTime uint8) uint8 {
	t := int(packetLifeTime) + 1
	ad := int(ackDelay)
	if t >= ad {
		if ad >= t-1 {
			t++
		}
	} else {
		if t >= ad-1 {
			t = ad + 1
		} else {
			t = ad
		}
	}
	return uint8(min(31, t))
}

// The timers of a connection, as Linux computes them (cm.c):
//
//   - REQ (active side): 2 × IBADuration(packet life time) +
//     IBADuration(remote CM response timeout), per attempt;
//   - REP and DREQ (passive side): IBADuration(the REQ's local CM
//     response timeout); the active side's DREQ uses its REQ timeout;
//   - after an MRA: IBADuration(service timeout) + IBADuration(ACK
//     timeout of the path);
//   - TimeWait: IBADuration(ACK timeout of the path).
//
// A message is sent once and retransmitted up to max CM retries times
// (from the REQ) with the same timeout, as the Linux MAD layer does.

func reqTimeout(packetLifeTime, remoteCMResponseTimeout uint8) time.Duration {
	return 2*IBADuration(packetLifeTime) + IBADuration(remoteCMResponseTimeout)
}

// What a peer may ask of this side's timers. A REQ's local CM response
// timeout and Max CM Retries set how long and how often the passive side
// repeats its REP (and its DREQ), an MRA's service timeout how long the
// side that sent the REP or REQ waits before repeating it, and the ACK
// timeout of the path (from the REQ's local ACK timeout, or the REP's
// target ACK delay) how long TimeWait lasts. Unclamped, a REQ from
// anywhere could keep a REP going for 16 × 2^23 ms (37 hours) and an entry
// in TimeWait for 2^23 ms. Linux takes them as they come; this CM clamps:
//
//   - response timeout at most MaxPeerResponseTimeout (23: 2^15 ms =
//     32.8 s per attempt: 8 times rdma_cm's 20, still beyond what any
//     peer needs to answer a REP with an RTU), and no more retries than
//     fit Config.MaxHalfOpenTime (2 minutes: 2 after 32.8 s, 15 after
//     rdma_cm's 4.1 s, so rdma_cm's values pass unchanged);
//   - service timeout at most MaxPeerServiceTimeout (24, the value
//     rdma_cm's own MRA carries: 67 s);
//   - ACK timeout, where it sets a CM timer (TimeWait, the MRA's round
//     trip), at most MaxPeerACKTimeout (21: 8.4 s; rxe's paths give 17,
//     hardware RoCE ports 18 or 19). The QP's own ACK timeout (QPAttr)
//     is the peers' business and is not clamped.
//
// Half-open connections also have an overall deadline (halfopen.go).
const (
	MaxPeerResponseTimeout = 23
	MaxPeerServiceTimeout  = 24
	MaxPeerACKTimeout      = 21
)

// peerResponse returns the per-attempt timeout and the retries this side
// uses for the requests it repeats on a peer's behalf (REP, passive
// DREQ): the REQ's local CM response timeout and Max CM Retries, clamped
// so that every attempt fits within life.
func peerResponse(responseTimeout, maxRetries uint8, life time.Duration) (time.Duration, uint8) {
	per := IBADuration(min(responseTimeout, MaxPeerResponseTimeout))
	fit := int(life/per) - 1
	return per, uint8(max(0, min(int(maxRetries), fit)))
}

// mraWait is how long an MRA makes the side that receives it wait before
// repeating its message: the service timeout plus the path's round trip
// (Linux cm_mra_handler), both clamped.
func mraWait(serviceTimeout, ackTimeout uint8) time.Duration {
	return IBADuration(min(serviceTimeout, MaxPeerServiceTimeout)) + IBADuration(min(ackTimeout, MaxPeerACKTimeout))
}
