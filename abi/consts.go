package abi

import (
	"strconv"
	"strings"
)

//go:generate go tool stringer -type=WROpcode,WCOpcode,WCStatus -linecomment -output=consts_string.go

// ABI version (VRNIC_ABI_VERSION_*).
const (
	VersionMajor = 1
	VersionMinor = 5
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
	MaxCQE         = 262144  // CQEs per CQ (libfabric's ofi_rxm asks for 135168 by default)
	MaxQPWR        = 16384   // WRs per SQ or RQ
	MaxSRQWR       = 16384   // WRs per SRQ
	MaxRdAtomic    = 16      // max_rd_atomic / max_dest_rd_atomic by default (QUERY_DEVICE: the device's)
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
	GRHLen         = 40 // VRNIC_GRH_LEN: the GRH in front of a UD receive
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
	CmdOpenEvents    Cmd = 23
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
	// ABI 1.4: FLUSH (IBTA 1.5 Memory Placement Extensions) with the
	// global visibility or persistence placement type may target the MR
	// (IBV_ACCESS_FLUSH_GLOBAL, IBV_ACCESS_FLUSH_PERSISTENT).
	AccessFlushGlobal     uint32 = 1 << 8
	AccessFlushPersistent uint32 = 1 << 9
	// AccessAll is every right the device grants: FLUSH_PERSISTENT is
	// defined but refused (its memory has no persistence domain).
	AccessAll = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic |
		AccessFlushGlobal
	// AccessDefined is every access bit of the ABI but the memory-window
	// ones (abi/mw.go).
	AccessDefined = AccessAll | AccessFlushPersistent
)

// QPType is enum vrnic_qp_type (IBV_QPT_*).
type QPType uint32

// QP types.
const (
	QPTRC QPType = 2
	QPTUC QPType = 3
	QPTUD QPType = 4
)

// String returns "RC", "UC", "UD", or "type N" for another value.
func (t QPType) String() string {
	switch t {
	case QPTRC:
		return "RC"
	case QPTUC:
		return "UC"
	case QPTUD:
		return "UD"
	case QPTXRCSend:
		return "XRC_SEND"
	case QPTXRCRecv:
		return "XRC_RECV"
	}
	return "type " + strconv.FormatUint(uint64(t), 10)
}

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
	// QPAttrECE (ABI 1.5, vrnic's own, beyond the IBV_QP_* bits): the
	// QP's ECE options in force (ECESelectiveRepeat, ECEAdaptiveRTO;
	// CmdModifyQPReq.ECEOptions), settable on RC and XRC QPs in the
	// RESET→INIT, INIT→INIT and INIT→RTR transitions only.
	QPAttrECE uint32 = 1 << 30
)

// Enhanced Connection Establishment (ECE): the vendor ID and option bits
// vrnic offers in the CM REQ (its Vendor ID field and the MAD's attribute
// modifier, as Linux's cm.c carries struct ib_cm_ece) and through
// ibv_query_ece / ibv_set_ece. A peer that does not know them answers
// with none, and nothing on the QP's wire changes; both ends must have an
// option for it to be in force.
const (
	// ECEVendorID is the PCI vendor ID the device reports.
	ECEVendorID uint32 = 0x1ded
	// ECESelectiveRepeat: the responder keeps out-of-order packets and
	// names each hole with a selective NAK; the requester resends only
	// the holes (device/engine, kernel-notes/loss.md).
	ECESelectiveRepeat uint32 = 1 << 0
	// ECEAdaptiveRTO: the requester's retransmission timer follows the
	// measured round trip (RFC 6298) instead of the IBTA ACK timeout,
	// which still bounds the retries.
	ECEAdaptiveRTO uint32 = 1 << 1
	// ECEOptions: every option this vrnic offers.
	ECEOptions = ECESelectiveRepeat | ECEAdaptiveRTO
)

// Path migration states (QPAttr.PathMigState, enum ibv_mig_state). vrnic
// keeps no alternate path, so a QP is always MIGRATED.
const (
	MigMigrated uint8 = 0
	MigRearm    uint8 = 1
	MigArmed    uint8 = 2
)

// WROpcode is a send opcode (enum vrnic_wr_opcode, IBV_WR_*). Its String
// method (generated) returns the name without the VRNIC_WR_ prefix, from
// the line comments below.
type WROpcode uint8

// Send opcodes.
const (
	WRRDMAWrite        WROpcode = 0 // RDMA_WRITE
	WRRDMAWriteWithImm WROpcode = 1 // RDMA_WRITE_WITH_IMM
	WRSend             WROpcode = 2 // SEND
	WRSendWithImm      WROpcode = 3 // SEND_WITH_IMM
	WRRDMARead         WROpcode = 4 // RDMA_READ
	WRAtomicCmpAndSwp  WROpcode = 5 // ATOMIC_CMP_AND_SWP
	WRAtomicFetchAdd   WROpcode = 6 // ATOMIC_FETCH_AND_ADD
	WRLocalInv         WROpcode = 7 // LOCAL_INV
	WRBindMW           WROpcode = 8 // BIND_MW
	WRSendWithInv      WROpcode = 9 // SEND_WITH_INV
	// ABI 1.4, IBTA 1.5 Memory Placement Extensions (RC): FLUSH takes
	// RemoteAddr, RKey, the length in CompareAdd and the FETH bits in
	// Swap (FlushWQEBits); ATOMIC_WRITE takes RemoteAddr, RKey and the 8
	// bytes of CompareAdd (little-endian in the WQE, stored as they lie).
	WRFlush       WROpcode = 14 // FLUSH
	WRAtomicWrite WROpcode = 15 // ATOMIC_WRITE
)

// Valid reports whether o is a defined send opcode.
func (o WROpcode) Valid() bool {
	return o <= WRSendWithInv || o == WRFlush || o == WRAtomicWrite
}

// FLUSH placement types and selectivity levels (enum vrnic_flush; the
// FETH's PLT and SEL, IBV_FLUSH_*), ABI 1.4.
const (
	FlushGlobal     uint8 = 1 << 0
	FlushPersistent uint8 = 1 << 1
	FlushRange      uint8 = 0
	FlushMR         uint8 = 1
)

// FlushWQEBits is the Swap field of a FLUSH WQE: the placement type in
// bits 0-3, the selectivity level in bits 4-5.
func FlushWQEBits(placement, level uint8) uint64 {
	return uint64(placement&0xf) | uint64(level&3)<<4
}

// PlacementCaps is enum vrnic_placement_caps (DeviceAttr.PlacementCaps),
// ABI 1.4.
const (
	PlacementAtomicWrite     uint8 = 1 << 0
	PlacementFlushGlobal     uint8 = 1 << 1
	PlacementFlushPersistent uint8 = 1 << 2
)

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

// WCOpcode is a completion opcode (enum vrnic_wc_opcode, IBV_WC_*). Its
// String method (generated) returns the name without the VRNIC_WC_ prefix.
type WCOpcode uint8

// Completion opcodes.
const (
	WCSend      WCOpcode = 0 // SEND
	WCRDMAWrite WCOpcode = 1 // RDMA_WRITE
	WCRDMARead  WCOpcode = 2 // RDMA_READ
	WCCompSwap  WCOpcode = 3 // COMP_SWAP
	WCFetchAdd  WCOpcode = 4 // FETCH_ADD
	WCBindMW    WCOpcode = 5 // BIND_MW
	WCLocalInv  WCOpcode = 6 // LOCAL_INV
	// ABI 1.4 (IBTA 1.5 Memory Placement Extensions).
	WCFlush           WCOpcode = 8   // FLUSH
	WCAtomicWrite     WCOpcode = 9   // ATOMIC_WRITE
	WCRecv            WCOpcode = 128 // RECV
	WCRecvRDMAWithImm WCOpcode = 129 // RECV_RDMA_WITH_IMM
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
// enum ibv_wc_status). Its String method (generated) returns the name
// without the VRNIC_WC_ prefix, as ibv_wc_status_str would name it
// ("SUCCESS", "LOC_LEN_ERR", ...).
type WCStatus uint8

// Completion statuses.
const (
	WCSuccess        WCStatus = 0  // SUCCESS
	WCLocLenErr      WCStatus = 1  // LOC_LEN_ERR
	WCLocQPOpErr     WCStatus = 2  // LOC_QP_OP_ERR
	WCLocEECOpErr    WCStatus = 3  // LOC_EEC_OP_ERR
	WCLocProtErr     WCStatus = 4  // LOC_PROT_ERR
	WCWRFlushErr     WCStatus = 5  // WR_FLUSH_ERR
	WCMWBindErr      WCStatus = 6  // MW_BIND_ERR
	WCBadRespErr     WCStatus = 7  // BAD_RESP_ERR
	WCLocAccessErr   WCStatus = 8  // LOC_ACCESS_ERR
	WCRemInvReqErr   WCStatus = 9  // REM_INV_REQ_ERR
	WCRemAccessErr   WCStatus = 10 // REM_ACCESS_ERR
	WCRemOpErr       WCStatus = 11 // REM_OP_ERR
	WCRetryExcErr    WCStatus = 12 // RETRY_EXC_ERR
	WCRNRRetryExcErr WCStatus = 13 // RNR_RETRY_EXC_ERR
	WCLocRDDViolErr  WCStatus = 14 // LOC_RDD_VIOL_ERR
	WCRemInvRdReqErr WCStatus = 15 // REM_INV_RD_REQ_ERR
	WCRemAbortErr    WCStatus = 16 // REM_ABORT_ERR
	WCInvEECNErr     WCStatus = 17 // INV_EECN_ERR
	WCInvEECStateErr WCStatus = 18 // INV_EEC_STATE_ERR
	WCFatalErr       WCStatus = 19 // FATAL_ERR
	WCRespTimeoutErr WCStatus = 20 // RESP_TIMEOUT_ERR
	WCGeneralErr     WCStatus = 21 // GENERAL_ERR
)

// The names of QPState and Cmd stay hand-written: for a value outside the
// enum they print "QPS_<n>" and "CMD_<n>", which reach clients in the
// daemon's error replies (a MODIFY_QP to an undefined state, an operator or
// fault command of 0x100 and up); a generated String would print
// "QPState(<n>)" and name CmdAdminBase and CmdFaultBase.

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

// String returns the state name without the VRNIC_QPS_ prefix.
func (s QPState) String() string {
	if int(s) < len(qpStateNames) {
		return qpStateNames[s]
	}
	return "QPS_" + strconv.FormatUint(uint64(s), 10)
}

var cmdNames = [...]string{
	CmdOpenContext: "OPEN_CONTEXT", CmdQueryDevice: "QUERY_DEVICE", CmdQueryPort: "QUERY_PORT",
	CmdQueryGID: "QUERY_GID", CmdAddHostMem: "ADD_HOST_MEM", CmdRemoveHostMem: "REMOVE_HOST_MEM",
	CmdAllocPD: "ALLOC_PD", CmdDeallocPD: "DEALLOC_PD", CmdRegMR: "REG_MR", CmdDeregMR: "DEREG_MR",
	CmdCreateCQ: "CREATE_CQ", CmdDestroyCQ: "DESTROY_CQ", CmdCreateQP: "CREATE_QP",
	CmdModifyQP: "MODIFY_QP", CmdQueryQP: "QUERY_QP", CmdDestroyQP: "DESTROY_QP",
	CmdCreateSRQ: "CREATE_SRQ", CmdModifySRQ: "MODIFY_SRQ", CmdDestroySRQ: "DESTROY_SRQ",
	CmdCreateAH: "CREATE_AH", CmdDestroyAH: "DESTROY_AH", CmdQuerySRQ: "QUERY_SRQ",
	CmdOpenEvents: "OPEN_EVENTS",
	CmdOpenXRCD:   "OPEN_XRCD", CmdCloseXRCD: "CLOSE_XRCD", CmdCreateXRCSRQ: "CREATE_XRC_SRQ", CmdCreateXRCQP: "CREATE_XRC_QP",
	CmdAllocMW: "ALLOC_MW", CmdDeallocMW: "DEALLOC_MW",
	CmdCMCreateID: "CM_CREATE_ID", CmdCMDestroyID: "CM_DESTROY_ID", CmdCMListen: "CM_LISTEN",
	CmdCMConnect: "CM_CONNECT", CmdCMAccept: "CM_ACCEPT", CmdCMReject: "CM_REJECT",
	CmdCMEstablish: "CM_ESTABLISH", CmdCMDisconnect: "CM_DISCONNECT", CmdCMInitQPAttr: "CM_INIT_QP_ATTR",
	CmdODPAttach: "ODP_ATTACH", CmdRegMRODP: "REG_MR_ODP", CmdAdviseMR: "ADVISE_MR",
	CmdReregMR: "REREG_MR", CmdResizeCQ: "RESIZE_CQ", CmdAllocDM: "ALLOC_DM", CmdFreeDM: "FREE_DM",
	CmdRegDMMR: "REG_DM_MR", CmdQueryDeviceEx: "QUERY_DEVICE_EX",
}

// String returns the command name without the VRNIC_CMD_ prefix.
func (c Cmd) String() string {
	if int(c) < len(cmdNames) && cmdNames[c] != "" {
		return cmdNames[c]
	}
	return "CMD_" + strconv.FormatUint(uint64(c), 10)
}

// eceNames are the ECE options' short names (ECEString, ParseECE), in bit
// order.
var eceNames = []struct {
	bit  uint32
	name string
}{{ECESelectiveRepeat, "sr"}, {ECEAdaptiveRTO, "rto"}}

// ECEString names the ECE options of opts: "sr,rto", "sr", ...; "none"
// for 0. A bit without a name shows as its hexadecimal value.
func ECEString(opts uint32) string {
	if opts == 0 {
		return "none"
	}
	var s string
	for _, n := range eceNames {
		if opts&n.bit != 0 {
			if s != "" {
				s += ","
			}
			s += n.name
			opts &^= n.bit
		}
	}
	if opts != 0 {
		if s != "" {
			s += ","
		}
		s += "0x" + strconv.FormatUint(uint64(opts), 16)
	}
	return s
}

// ParseECE reads a list of ECE options as the operator writes them (the
// drop-in library's VRNIC_ECE, vrnic-perf -ece): names separated by
// commas ("sr", "rto", also "selective-repeat" and "adaptive-rto"),
// "all" for every option, "none" or "" for none.
func ParseECE(s string) (uint32, error) {
	var opts uint32
	for _, w := range splitList(s) {
		switch w {
		case "none", "0":
		case "all":
			opts |= ECEOptions
		case "sr", "selective-repeat":
			opts |= ECESelectiveRepeat
		case "rto", "adaptive-rto":
			opts |= ECEAdaptiveRTO
		default:
			return 0, &eceError{w}
		}
	}
	return opts, nil
}

type eceError struct{ word string }

func (e *eceError) Error() string {
	return "ECE option " + strconv.Quote(e.word) + ": want sr, rto, all or none (comma-separated)"
}

// splitList splits a comma-separated list, dropping blanks around and
// between its words.
func splitList(s string) []string {
	var out []string
	for _, w := range strings.Split(s, ",") {
		if w = strings.TrimSpace(w); w != "" {
			out = append(out, w)
		}
	}
	return out
}
