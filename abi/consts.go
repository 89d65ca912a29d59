package abi

// ABI version (VRNIC_ABI_VERSION_*).
const (
	VersionMajor = 1
	VersionMinor = 0
	Version      = VersionMajor<<16 | VersionMinor
)

// VersionCompatible reports whether a client speaking clientVersion may
// open a context on a daemon speaking daemonVersion: the majors match and the
// client's minor is not newer than the daemon's.
func VersionCompatible(clientVersion, daemonVersion uint32) bool {
	return clientVersion>>16 == daemonVersion>>16 && clientVersion&0xffff <= daemonVersion&0xffff
}

// Limits (VRNIC_MAX_* and friends), also reported by QUERY_DEVICE.
const (
	MaxMsgSize     = 65536   // largest control datagram
	MaxErrMsg      = 256     // error text in a reply, NUL included
	MaxFDs         = 4       // fds on one control datagram
	MaxSGE         = 32      // SGEs per send WQE / RQE
	MaxInline      = 512     // inline bytes per send WQE
	MaxCQE         = 32768   // CQEs per CQ
	MaxQPWR        = 16384   // WRs per SQ or RQ
	MaxSRQWR       = 16384   // WRs per SRQ
	MaxRdAtomic    = 16      // max_rd_atomic / max_dest_rd_atomic
	MaxMRSize      = 1 << 40 // bytes
	MaxMsgBytes    = 1 << 31 // largest RDMA message
	InlinePages    = 64      // page list inline in REG_MR
	GIDTableLen    = 16
	PKeyDefault    = 0xffff
	PageShift4K    = 12
	PageShift2M    = 21
	MsgFlagReply   = 0x0001 // VRNIC_MSG_F_REPLY
	NoSRQ          = 0xffffffff
	WQEBlock       = 64 // VRNIC_WQE_BLOCK
	SGEsPerBlock   = 4  // VRNIC_SGES_PER_BLOCK
	DBRecordSize   = 128
	DBPageSize     = 262144
	DBRecords      = DBPageSize / DBRecordSize
	DBMagic        = 0x76726e63 // "vrnc"
	CQArmArmed     = 0x1
	CQArmSolicited = 0x2
	CQArmSNShift   = 8
)

// DivUp is VRNIC_DIV_UP: a / b rounded up.
func DivUp(a, b uint32) uint32 { return (a + b - 1) / b }

// SQWQEBlocks is VRNIC_SQ_WQE_BLOCKS: the send WQE slot size in 64-byte
// blocks for a queue of maxSGE SGEs and maxInline inline bytes.
func SQWQEBlocks(maxSGE, maxInline uint32) uint32 {
	s, i := DivUp(maxSGE, SGEsPerBlock), DivUp(maxInline, WQEBlock)
	return 1 + max(s, i)
}

// RQWQESize is VRNIC_RQ_WQE_SIZE: the receive WQE slot size in bytes.
func RQWQESize(maxSGE uint32) uint32 {
	return DivUp(16+16*maxSGE, 64) * 64
}

// Cmd is a control command opcode (enum vrnic_cmd).
type Cmd uint16

// Control commands.
const (
	CmdOpenContext   Cmd = 1
	CmdQueryDevice   Cmd = 2
	CmdQueryPort     Cmd = 3
	CmdQueryGID      Cmd = 4
	CmdAddHostMem    Cmd = 5
	CmdRemoveHostMem Cmd = 6
	CmdAllocPD       Cmd = 7
	CmdDeallocPD     Cmd = 8
	CmdRegMR         Cmd = 9
	CmdDeregMR       Cmd = 10
	CmdCreateCQ      Cmd = 11
	CmdDestroyCQ     Cmd = 12
	CmdCreateQP      Cmd = 13
	CmdModifyQP      Cmd = 14
	CmdQueryQP       Cmd = 15
	CmdDestroyQP     Cmd = 16
	CmdCreateSRQ     Cmd = 17
	CmdModifySRQ     Cmd = 18
	CmdDestroySRQ    Cmd = 19
	CmdCreateAH      Cmd = 20
	CmdDestroyAH     Cmd = 21
	CmdQuerySRQ      Cmd = 22
	CmdAdminBase     Cmd = 0x100
	CmdFaultBase     Cmd = 0x200
)

// LinkType is enum vrnic_link_type.
type LinkType uint32

// Link types.
const (
	LinkMem LinkType = 0
	LinkUDP LinkType = 1
	LinkTAP LinkType = 2
)

// Access flags (enum vrnic_access, IBV_ACCESS_*).
const (
	AccessLocalWrite   uint32 = 1 << 0
	AccessRemoteWrite  uint32 = 1 << 1
	AccessRemoteRead   uint32 = 1 << 2
	AccessRemoteAtomic uint32 = 1 << 3
	// AccessAll is every defined access bit.
	AccessAll = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
)

// QPType is enum vrnic_qp_type (IBV_QPT_*).
type QPType uint32

// QP types.
const (
	QPTRC QPType = 2
	QPTUC QPType = 3
	QPTUD QPType = 4
)

// QPState is enum vrnic_qp_state (IBV_QPS_*).
type QPState uint32

// QP states.
const (
	QPSReset QPState = 0
	QPSInit  QPState = 1
	QPSRTR   QPState = 2
	QPSRTS   QPState = 3
	QPSSQD   QPState = 4
	QPSSQE   QPState = 5
	QPSErr   QPState = 6
)

// MTU is enum vrnic_mtu (IBV_MTU_*).
type MTU uint32

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an unknown value.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// MODIFY_QP attribute mask bits (enum vrnic_qp_attr_mask, IBV_QP_*).
const (
	QPAttrState            uint32 = 1 << 0
	QPAttrCurState         uint32 = 1 << 1
	QPAttrEnSQDAsyncNotify uint32 = 1 << 2
	QPAttrAccessFlags      uint32 = 1 << 3
	QPAttrPKeyIndex        uint32 = 1 << 4
	QPAttrPort             uint32 = 1 << 5
	QPAttrQKey             uint32 = 1 << 6
	QPAttrAV               uint32 = 1 << 7
	QPAttrPathMTU          uint32 = 1 << 8
	QPAttrTimeout          uint32 = 1 << 9
	QPAttrRetryCnt         uint32 = 1 << 10
	QPAttrRNRRetry         uint32 = 1 << 11
	QPAttrRQPSN            uint32 = 1 << 12
	QPAttrMaxQPRdAtomic    uint32 = 1 << 13
	QPAttrAltPath          uint32 = 1 << 14
	QPAttrMinRNRTimer      uint32 = 1 << 15
	QPAttrSQPSN            uint32 = 1 << 16
	QPAttrMaxDestRdAtomic  uint32 = 1 << 17
	QPAttrPathMigState     uint32 = 1 << 18
	QPAttrCap              uint32 = 1 << 19
	QPAttrDestQPN          uint32 = 1 << 20
	QPAttrAll              uint32 = 1<<21 - 1
)

// WROpcode is a send opcode (enum vrnic_wr_opcode, IBV_WR_*).
type WROpcode uint8

// Send opcodes. 8 (IBV_WR_BIND_MW) is not supported.
const (
	WRRDMAWrite        WROpcode = 0
	WRRDMAWriteWithImm WROpcode = 1
	WRSend             WROpcode = 2
	WRSendWithImm      WROpcode = 3
	WRRDMARead         WROpcode = 4
	WRAtomicCmpAndSwp  WROpcode = 5
	WRAtomicFetchAdd   WROpcode = 6
	WRLocalInv         WROpcode = 7
	WRSendWithInv      WROpcode = 9
)

// Valid reports whether o is a defined send opcode.
func (o WROpcode) Valid() bool { return o <= WRLocalInv || o == WRSendWithInv }

// SendFlags is enum vrnic_send_flags (IBV_SEND_*).
type SendFlags uint8

// Send flags.
const (
	SendFence     SendFlags = 1 << 0
	SendSignaled  SendFlags = 1 << 1
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3
	// SendFlagsAll is every defined send flag.
	SendFlagsAll = SendFence | SendSignaled | SendSolicited | SendInline
)

// WCOpcode is a completion opcode (enum vrnic_wc_opcode, IBV_WC_*).
type WCOpcode uint8

// Completion opcodes.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCBindMW          WCOpcode = 5
	WCLocalInv        WCOpcode = 6
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

// WCFlags is enum vrnic_wc_flags (IBV_WC_*).
type WCFlags uint8

// Completion flags.
const (
	WCGRH      WCFlags = 1 << 0
	WCWithImm  WCFlags = 1 << 1
	WCIPCsumOK WCFlags = 1 << 2
	WCWithInv  WCFlags = 1 << 3
)

// WCStatus is a completion status (enum vrnic_wc_status, the numbering of
// enum ibv_wc_status).
type WCStatus uint8

// Completion statuses.
const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocQPOpErr     WCStatus = 2
	WCLocEECOpErr    WCStatus = 3
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCMWBindErr      WCStatus = 6
	WCBadRespErr     WCStatus = 7
	WCLocAccessErr   WCStatus = 8
	WCRemInvReqErr   WCStatus = 9
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCLocRDDViolErr  WCStatus = 14
	WCRemInvRdReqErr WCStatus = 15
	WCRemAbortErr    WCStatus = 16
	WCInvEECNErr     WCStatus = 17
	WCInvEECStateErr WCStatus = 18
	WCFatalErr       WCStatus = 19
	WCRespTimeoutErr WCStatus = 20
	WCGeneralErr     WCStatus = 21
)

var wcStatusNames = [...]string{
	WCSuccess:        "SUCCESS",
	WCLocLenErr:      "LOC_LEN_ERR",
	WCLocQPOpErr:     "LOC_QP_OP_ERR",
	WCLocEECOpErr:    "LOC_EEC_OP_ERR",
	WCLocProtErr:     "LOC_PROT_ERR",
	WCWRFlushErr:     "WR_FLUSH_ERR",
	WCMWBindErr:      "MW_BIND_ERR",
	WCBadRespErr:     "BAD_RESP_ERR",
	WCLocAccessErr:   "LOC_ACCESS_ERR",
	WCRemInvReqErr:   "REM_INV_REQ_ERR",
	WCRemAccessErr:   "REM_ACCESS_ERR",
	WCRemOpErr:       "REM_OP_ERR",
	WCRetryExcErr:    "RETRY_EXC_ERR",
	WCRNRRetryExcErr: "RNR_RETRY_EXC_ERR",
	WCLocRDDViolErr:  "LOC_RDD_VIOL_ERR",
	WCRemInvRdReqErr: "REM_INV_RD_REQ_ERR",
	WCRemAbortErr:    "REM_ABORT_ERR",
	WCInvEECNErr:     "INV_EECN_ERR",
	WCInvEECStateErr: "INV_EEC_STATE_ERR",
	WCFatalErr:       "FATAL_ERR",
	WCRespTimeoutErr: "RESP_TIMEOUT_ERR",
	WCGeneralErr:     "GENERAL_ERR",
}

// String returns the status name without the VRNIC_WC_ prefix, as
// ibv_wc_status_str would name it ("SUCCESS", "LOC_LEN_ERR", ...).
func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return "WC_STATUS_" + itoa(uint64(s))
}

var wrOpcodeNames = [...]string{
	WRRDMAWrite:        "RDMA_WRITE",
	WRRDMAWriteWithImm: "RDMA_WRITE_WITH_IMM",
	WRSend:             "SEND",
	WRSendWithImm:      "SEND_WITH_IMM",
	WRRDMARead:         "RDMA_READ",
	WRAtomicCmpAndSwp:  "ATOMIC_CMP_AND_SWP",
	WRAtomicFetchAdd:   "ATOMIC_FETCH_AND_ADD",
	WRLocalInv:         "LOCAL_INV",
	8:                  "",
	WRSendWithInv:      "SEND_WITH_INV",
}

// String returns the opcode name without the VRNIC_WR_ prefix.
func (o WROpcode) String() string {
	if int(o) < len(wrOpcodeNames) && wrOpcodeNames[o] != "" {
		return wrOpcodeNames[o]
	}
	return "WR_OPCODE_" + itoa(uint64(o))
}

// String returns the opcode name without the VRNIC_WC_ prefix.
func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCBindMW:
		return "BIND_MW"
	case WCLocalInv:
		return "LOCAL_INV"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return "WC_OPCODE_" + itoa(uint64(o))
}

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

// String returns the state name without the VRNIC_QPS_ prefix.
func (s QPState) String() string {
	if int(s) < len(qpStateNames) {
		return qpStateNames[s]
	}
	return "QPS_" + itoa(uint64(s))
}

var cmdNames = [...]string{
	CmdOpenContext: "OPEN_CONTEXT", CmdQueryDevice: "QUERY_DEVICE", CmdQueryPort: "QUERY_PORT",
	CmdQueryGID: "QUERY_GID", CmdAddHostMem: "ADD_HOST_MEM", CmdRemoveHostMem: "REMOVE_HOST_MEM",
	CmdAllocPD: "ALLOC_PD", CmdDeallocPD: "DEALLOC_PD", CmdRegMR: "REG_MR", CmdDeregMR: "DEREG_MR",
	CmdCreateCQ: "CREATE_CQ", CmdDestroyCQ: "DESTROY_CQ", CmdCreateQP: "CREATE_QP",
	CmdModifyQP: "MODIFY_QP", CmdQueryQP: "QUERY_QP", CmdDestroyQP: "DESTROY_QP",
	CmdCreateSRQ: "CREATE_SRQ", CmdModifySRQ: "MODIFY_SRQ", CmdDestroySRQ: "DESTROY_SRQ",
	CmdCreateAH: "CREATE_AH", CmdDestroyAH: "DESTROY_AH", CmdQuerySRQ: "QUERY_SRQ",
}

// String returns the command name without the VRNIC_CMD_ prefix.
func (c Cmd) String() string {
	if int(c) < len(cmdNames) && cmdNames[c] != "" {
		return cmdNames[c]
	}
	return "CMD_" + itoa(uint64(c))
}

func itoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}
