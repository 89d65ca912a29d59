package roce

//go:generate go tool stringer -type=SyndromeKind,NAKCode -linecomment -output=syndrome_string.go

import (
	"strconv"
	"time"
)

// Syndrome is the AETH Syndrome byte (IBTA vol. 1, 9.7.5.2.2, table 42):
//
//	  7   6 5   4 3 2 1 0
//	+---+-----+-----------+
//	| 0 | op  |   value   |
//	+---+-----+-----------+
//
//	op 00: ACK,      value = credit count code (31: invalid / no credits)
//	op 01: RNR NAK,  value = RNR timer code (RNRTimer)
//	op 10: reserved
//	op 11: NAK,      value = NAK code (NAKCode)
type Syndrome uint8

// SyndromeKind is the op field of a Syndrome. Its String method is
// generated from the line comments of the constants, as is NAKCode's.
type SyndromeKind uint8

// Syndrome kinds.
const (
	SyndromeACK      SyndromeKind = 0 // ACK
	SyndromeRNRNAK   SyndromeKind = 1 // RNR_NAK
	SyndromeReserved SyndromeKind = 2 // RESERVED
	SyndromeNAK      SyndromeKind = 3 // NAK
)

// NAKCode is the value of a NAK syndrome.
type NAKCode uint8

// NAK codes (IBTA table 43).
const (
	NAKPSNSequenceError     NAKCode = 0 // PSN_SEQUENCE_ERROR
	NAKInvalidRequest       NAKCode = 1 // INVALID_REQUEST
	NAKRemoteAccessError    NAKCode = 2 // REMOTE_ACCESS_ERROR
	NAKRemoteOperationalErr NAKCode = 3 // REMOTE_OPERATIONAL_ERROR
	NAKInvalidRDRequest     NAKCode = 4 // INVALID_RD_REQUEST
)

// CreditsInvalid is the ACK credit count code meaning "no end-to-end flow
// control": the requester ignores credits.
const CreditsInvalid uint8 = 0x1f

const (
	nakCodeCount        = 5
	creditCodeCount     = 31
	rnrTimerCodeCount   = 32
	maxRNRTimerCode     = 31
	syndromeValueMask   = 0x1f
	syndromeKindShift   = 5
	syndromeKindMask    = 3
	syndromeReservedBit = 0x80
)

// ACKSyndrome returns the syndrome of an ACK with the 5-bit credit count
// code credits (CreditsInvalid when the responder does no flow control,
// which is what Linux rxe sends: 0x1f).
func ACKSyndrome(credits uint8) Syndrome {
	return Syndrome(credits & syndromeValueMask)
}

// RNRNAKSyndrome returns the syndrome of an RNR NAK with the 5-bit RNR
// timer code timer.
func RNRNAKSyndrome(timer RNRTimer) Syndrome {
	return Syndrome(uint8(SyndromeRNRNAK)<<syndromeKindShift | uint8(timer)&syndromeValueMask)
}

// NAKSyndrome returns the syndrome of a NAK with code c.
func NAKSyndrome(c NAKCode) Syndrome {
	return Syndrome(uint8(SyndromeNAK)<<syndromeKindShift | uint8(c)&syndromeValueMask)
}

// Kind returns the op field.
func (s Syndrome) Kind() SyndromeKind {
	return SyndromeKind(s>>syndromeKindShift) & syndromeKindMask
}

// Value returns the 5-bit value field.
func (s Syndrome) Value() uint8 { return uint8(s) & syndromeValueMask }

// Credits returns the credit count code of an ACK.
func (s Syndrome) Credits() uint8 { return s.Value() }

// Timer returns the RNR timer code of an RNR NAK.
func (s Syndrome) Timer() RNRTimer { return RNRTimer(s.Value()) }

// NAK returns the NAK code of a NAK.
func (s Syndrome) NAK() NAKCode { return NAKCode(s.Value()) }

// Valid reports whether s is a syndrome a responder may send: reserved bit
// clear, op not reserved, and a defined NAK code for NAKs.
func (s Syndrome) Valid() bool {
	if s&syndromeReservedBit != 0 {
		return false
	}
	switch s.Kind() {
	case SyndromeReserved:
		return false
	case SyndromeNAK:
		return s.Value() < nakCodeCount
	}
	return true
}

func (s Syndrome) String() string {
	switch s.Kind() {
	case SyndromeACK:
		return "ACK(credits=" + strconv.Itoa(int(s.Credits())) + ")"
	case SyndromeRNRNAK:
		return "RNR_NAK(" + s.Timer().Duration().String() + ")"
	case SyndromeNAK:
		return "NAK(" + s.NAK().String() + ")"
	}
	return "Syndrome(0x" + strconv.FormatUint(uint64(s), 16) + ")"
}

// creditCounts decodes the ACK credit count code (IBTA table 44): code 0
// is 0 credits, 1..4 are 1..4, then the series 6, 8, 12, 16, ... 32768
// alternating ×1.5 and ×4/3; code 31 is invalid.
var creditCounts = [creditCodeCount]uint32{
	0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384,
	512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384,
	24576, 32768,
}

// CreditCount returns the number of receive WQEs an ACK credit code
// advertises and false for CreditsInvalid.
func CreditCount(code uint8) (uint32, bool) {
	if int(code) >= creditCodeCount {
		return 0, false
	}
	return creditCounts[code], true
}

// RNRTimer is the 5-bit RNR NAK timer code (IBTA table 45): the minimum
// time the requester waits before retrying after an RNR NAK.
type RNRTimer uint8

// rnrTimerTable is IBTA table 45 in microseconds (code 0 is the longest,
// 655.36 ms).
var rnrTimerTable = [rnrTimerCodeCount]time.Duration{
	655360 * time.Microsecond,
	10 * time.Microsecond, 20 * time.Microsecond, 30 * time.Microsecond,
	40 * time.Microsecond, 60 * time.Microsecond, 80 * time.Microsecond,
	120 * time.Microsecond, 160 * time.Microsecond, 240 * time.Microsecond,
	320 * time.Microsecond, 480 * time.Microsecond, 640 * time.Microsecond,
	960 * time.Microsecond, 1280 * time.Microsecond, 1920 * time.Microsecond,
	2560 * time.Microsecond, 3840 * time.Microsecond, 5120 * time.Microsecond,
	7680 * time.Microsecond, 10240 * time.Microsecond, 15360 * time.Microsecond,
	20480 * time.Microsecond, 30720 * time.Microsecond, 40960 * time.Microsecond,
	61440 * time.Microsecond, 81920 * time.Microsecond, 122880 * time.Microsecond,
	163840 * time.Microsecond, 245760 * time.Microsecond, 327680 * time.Microsecond,
	491520 * time.Microsecond,
}

// Duration returns the wait time the code stands for (only the low 5 bits
// of t count).
func (t RNRTimer) Duration() time.Duration { return rnrTimerTable[t&maxRNRTimerCode] }

// RNRTimerFor returns the smallest code whose duration is at least d
// (code 0, 655.36 ms, for anything longer than 491.52 ms).
func RNRTimerFor(d time.Duration) RNRTimer {
	for c := RNRTimer(1); c <= maxRNRTimerCode; c++ {
		if rnrTimerTable[c] >= d {
			return c
		}
	}
	return 0
}
