package roce

// Packet sequence numbers are 24-bit counters that wrap (IBTA 9.7.1).
// Comparisons are only meaningful between PSNs less than 2^23 apart; the
// sign of the 24-bit difference decides, as in Linux rxe's psn_compare:
// int32((a-b)<<8).

// PSNMask masks a 24-bit PSN.
const PSNMask = 0xffffff

// PSNAdd returns psn+n modulo 2^24.
func PSNAdd(psn, n uint32) uint32 { return (psn + n) & PSNMask }

// PSNDiff returns a-b as a signed 24-bit distance in [-2^23, 2^23).
func PSNDiff(a, b uint32) int32 { return int32((a-b)<<8) >> 8 }

// PSNCompare returns -1, 0 or +1 as a is before, equal to or after b in
// 24-bit serial number order.
func PSNCompare(a, b uint32) int {
	d := int32((a - b) << 8)
	switch {
	case d < 0:
		return -1
	case d > 0:
		return 1
	}
	return 0
}

// PSNBefore reports whether a comes before b.
func PSNBefore(a, b uint32) bool { return int32((a-b)<<8) < 0 }

// PSNAfter reports whether a comes after b.
func PSNAfter(a, b uint32) bool { return int32((a-b)<<8) > 0 }
