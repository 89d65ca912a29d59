package abi

// Doorbell page records. Each is 128 bytes: the first 64-byte line is
// written only by the client, the second only by the daemon. Indices are
// free-running u32 counters. Access them in shared memory with 32-bit
// atomics at the Off* byte offsets below (relative to the record start).

// DBHeader is struct vrnic_db_header, record 0 of the doorbell page.
type DBHeader struct {
	Magic      uint32 `c:"magic"`
	ABIVersion uint32 `c:"abi_version"`
	KickNeeded uint32 `c:"kick_needed"`
	// DaemonFlags (ABI 1.4): DBDaemonKickGen.
	DaemonFlags uint32     `c:"daemon_flags"`
	Reserved0   [12]uint32 `c:"reserved0"`
	// ClientFlags and Summary (ABI 1.3): the doorbell summary, see
	// DBFlagSummary.
	ClientFlags uint32                 `c:"client_flags"`
	Reserved1   [7]uint32              `c:"reserved1"`
	Summary     [DBSummaryWords]uint32 `c:"summary"`
}

// Doorbell summary (ABI 1.3, VRNIC_DB_F_SUMMARY and friends): a client
// that sets DBFlagSummary in the header's client_flags marks the group of
// every record whose producer index it stores: record i is bit
// (i/DBSummaryGroup)%32 of summary word (i/DBSummaryGroup)/32, set after
// the index store (load the word first, fetch-or only if the bit is
// clear; all sequentially consistent). The daemon then reads only the
// records of marked groups; without the flag it reads the client's
// records itself, a bounded number per pass.
const (
	DBFlagSummary = 0x1
	// DBDaemonKickGen (daemon_flags, ABI 1.4): kick_needed holds a
	// generation, non-zero and new each time the daemon prepares to
	// sleep, rather than 1; a client writes the kick eventfd once per
	// value it sees (one write wakes the daemon; more only cost system
	// calls while it is still waking up).
	DBDaemonKickGen = 0x1
	DBSummaryGroup  = 8 // records per summary bit
	DBSummaryWords  = 8 // 8 words of 32 bits cover DBRecords records
)

// DBQP is struct vrnic_db_qp.
type DBQP struct {
	SQPI      uint32     `c:"sq_pi"`
	RQPI      uint32     `c:"rq_pi"`
	Reserved0 [14]uint32 `c:"reserved0"`
	SQCI      uint32     `c:"sq_ci"`
	RQCI      uint32     `c:"rq_ci"`
	Reserved1 [14]uint32 `c:"reserved1"`
}

// DBCQ is struct vrnic_db_cq.
type DBCQ struct {
	CQCI      uint32     `c:"cq_ci"`
	Arm       uint32     `c:"arm"`
	Reserved0 [14]uint32 `c:"reserved0"`
	CQPI      uint32     `c:"cq_pi"`
	ArmSNDone uint32     `c:"arm_sn_done"`
	Overflow  uint32     `c:"overflow"`
	Reserved1 [13]uint32 `c:"reserved1"`
}

// DBSRQ is struct vrnic_db_srq.
type DBSRQ struct {
	SRQPI     uint32     `c:"srq_pi"`
	Reserved0 [15]uint32 `c:"reserved0"`
	SRQCI     uint32     `c:"srq_ci"`
	Reserved1 [15]uint32 `c:"reserved1"`
}

// Byte offsets of the doorbell words inside their record.
const (
	OffDBMagic      = 0
	OffDBABIVersion = 4
	OffDBKickNeeded = 8
	// ABI 1.4: DBDaemonKickGen.
	OffDBDaemonFlags = 12
	// ABI 1.3: the client-written line of the header.
	OffDBClientFlags = 64
	OffDBSummary     = 96 // DBSummaryWords words

	OffDBSQPI = 0
	OffDBRQPI = 4
	OffDBSQCI = 64
	OffDBRQCI = 68

	OffDBCQCI      = 0
	OffDBCQArm     = 4
	OffDBCQPI      = 64
	OffDBArmSNDone = 68
	OffDBOverflow  = 72

	OffDBSRQPI = 0
	OffDBSRQCI = 64
)

// ArmWord builds a CQ arm word: armed, optionally solicited-only, with
// sequence sn (24 bits).
func ArmWord(sn uint32, solicitedOnly bool) uint32 {
	w := sn<<CQArmSNShift | CQArmArmed
	if solicitedOnly {
		w |= CQArmSolicited
	}
	return w
}

// ArmSN is the 24-bit arm sequence of arm word w.
func ArmSN(w uint32) uint32 { return w >> CQArmSNShift }
