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
