package abi

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/testenv"
)

// cStructs lists every struct of vrnic_abi.h with its Go mirror. The test
// also parses the header, so a struct missing here fails it.
var cStructs = []struct {
	name string
	v    any
}{
	{"vrnic_msg_hdr", MsgHdr{}},
	{"vrnic_cmd_open_context", CmdOpenContextReq{}},
	{"vrnic_resp_open_context", RespOpenContext{}},
	{"vrnic_device_attr", DeviceAttr{}},
	{"vrnic_cmd_query_port", CmdQueryPortReq{}},
	{"vrnic_port_attr", PortAttr{}},
	{"vrnic_cmd_query_gid", CmdQueryGIDReq{}},
	{"vrnic_resp_query_gid", RespQueryGID{}},
	{"vrnic_cmd_add_host_mem", CmdAddHostMemReq{}},
	{"vrnic_resp_add_host_mem", RespAddHostMem{}},
	{"vrnic_cmd_handle", CmdHandleReq{}},
	{"vrnic_resp_alloc_pd", RespAllocPD{}},
	{"vrnic_cmd_reg_mr", CmdRegMRReq{}},
	{"vrnic_resp_reg_mr", RespRegMR{}},
	{"vrnic_cmd_odp_attach", CmdODPAttachReq{}},
	{"vrnic_resp_odp_attach", RespODPAttach{}},
	{"vrnic_cmd_reg_mr_odp", CmdRegMRODPReq{}},
	{"vrnic_cmd_advise_mr", CmdAdviseMRReq{}},
	{"vrnic_cmd_create_cq", CmdCreateCQReq{}},
	{"vrnic_resp_create_cq", RespCreateCQ{}},
	{"vrnic_qp_cap", QPCap{}},
	{"vrnic_cmd_create_qp", CmdCreateQPReq{}},
	{"vrnic_resp_create_qp", RespCreateQP{}},
	{"vrnic_ah_attr", AHAttr{}},
	{"vrnic_qp_attr", QPAttr{}},
	{"vrnic_cmd_modify_qp", CmdModifyQPReq{}},
	{"vrnic_resp_query_qp", RespQueryQP{}},
	{"vrnic_cmd_create_srq", CmdCreateSRQReq{}},
	{"vrnic_resp_create_srq", RespCreateSRQ{}},
	{"vrnic_cmd_modify_srq", CmdModifySRQReq{}},
	{"vrnic_resp_query_srq", RespQuerySRQ{}},
	{"vrnic_cmd_open_xrcd", CmdOpenXRCDReq{}},
	{"vrnic_resp_open_xrcd", RespOpenXRCD{}},
	{"vrnic_cmd_create_xrc_srq", CmdCreateXRCSRQReq{}},
	{"vrnic_resp_create_xrc_srq", RespCreateXRCSRQ{}},
	{"vrnic_cmd_create_xrc_qp", CmdCreateXRCQPReq{}},
	{"vrnic_async_event", AsyncEvent{}},
	{"vrnic_cmd_cm_create_id", CmdCMCreateIDReq{}},
	{"vrnic_resp_cm_id", RespCMID{}},
	{"vrnic_cmd_cm_listen", CmdCMListenReq{}},
	{"vrnic_cmd_cm_connect", CmdCMConnectReq{}},
	{"vrnic_cmd_cm_accept", CmdCMAcceptReq{}},
	{"vrnic_cmd_cm_private", CmdCMPrivateReq{}},
	{"vrnic_cmd_cm_init_qp_attr", CmdCMInitQPAttrReq{}},
	{"vrnic_cm_qp_attr", CMQPAttr{}},
	{"vrnic_cm_event", CMEvent{}},
	{"vrnic_cm_ece", CMECE{}},
	{"vrnic_cm_event_ece", CMEventECE{}},
	{"vrnic_cmd_create_ah", CmdCreateAHReq{}},
	{"vrnic_cmd_alloc_mw", CmdAllocMWReq{}},
	{"vrnic_resp_alloc_mw", RespAllocMW{}},
	{"vrnic_resp_create_ah", RespCreateAH{}},
	{"vrnic_sge", SGE{}},
	{"vrnic_send_wqe", SendWQE{}},
	{"vrnic_recv_wqe", RecvWQE{}},
	{"vrnic_cqe", CQE{}},
	{"vrnic_db_header", DBHeader{}},
	{"vrnic_db_qp", DBQP{}},
	{"vrnic_db_cq", DBCQ{}},
	{"vrnic_db_srq", DBSRQ{}},
	{"vrnic_cmd_rereg_mr", CmdReregMRReq{}},
	{"vrnic_cmd_resize_cq", CmdResizeCQReq{}},
	{"vrnic_resp_resize_cq", RespResizeCQ{}},
	{"vrnic_cmd_alloc_dm", CmdAllocDMReq{}},
	{"vrnic_resp_alloc_dm", RespAllocDM{}},
	{"vrnic_cmd_reg_dm_mr", CmdRegDMMRReq{}},
	{"vrnic_device_attr_ex", DeviceAttrEx{}},
}

// cConsts maps every #define and enum value of the header to its Go value.
var cConsts = map[string]uint64{
	"VRNIC_ABI_VERSION_MAJOR": VersionMajor, "VRNIC_ABI_VERSION_MINOR": VersionMinor,
	"VRNIC_ABI_VERSION":  Version,
	"VRNIC_MAX_MSG_SIZE": MaxMsgSize, "VRNIC_MAX_ERR_MSG": MaxErrMsg, "VRNIC_MAX_FDS": MaxFDs,
	"VRNIC_MAX_SGE": MaxSGE, "VRNIC_MAX_INLINE": MaxInline, "VRNIC_MAX_CQE": MaxCQE,
	"VRNIC_MAX_QP_WR": MaxQPWR, "VRNIC_MAX_SRQ_WR": MaxSRQWR, "VRNIC_MAX_RD_ATOMIC": MaxRdAtomic,
	"VRNIC_MAX_MR_SIZE": MaxMRSize, "VRNIC_MAX_MSG_BYTES": MaxMsgBytes,
	"VRNIC_INLINE_PAGES": InlinePages, "VRNIC_GID_TABLE_LEN": GIDTableLen,
	"VRNIC_PKEY_DEFAULT": PKeyDefault, "VRNIC_PAGE_SHIFT_4K": PageShift4K,
	"VRNIC_PAGE_SHIFT_2M": PageShift2M, "VRNIC_MSG_F_REPLY": MsgFlagReply,

	"VRNIC_CMD_OPEN_CONTEXT": uint64(CmdOpenContext), "VRNIC_CMD_QUERY_DEVICE": uint64(CmdQueryDevice),
	"VRNIC_CMD_QUERY_PORT": uint64(CmdQueryPort), "VRNIC_CMD_QUERY_GID": uint64(CmdQueryGID),
	"VRNIC_CMD_ADD_HOST_MEM": uint64(CmdAddHostMem), "VRNIC_CMD_REMOVE_HOST_MEM": uint64(CmdRemoveHostMem),
	"VRNIC_CMD_ALLOC_PD": uint64(CmdAllocPD), "VRNIC_CMD_DEALLOC_PD": uint64(CmdDeallocPD),
	"VRNIC_CMD_REG_MR": uint64(CmdRegMR), "VRNIC_CMD_DEREG_MR": uint64(CmdDeregMR),
	"VRNIC_CMD_CREATE_CQ": uint64(CmdCreateCQ), "VRNIC_CMD_DESTROY_CQ": uint64(CmdDestroyCQ),
	"VRNIC_CMD_CREATE_QP": uint64(CmdCreateQP), "VRNIC_CMD_MODIFY_QP": uint64(CmdModifyQP),
	"VRNIC_CMD_QUERY_QP": uint64(CmdQueryQP), "VRNIC_CMD_DESTROY_QP": uint64(CmdDestroyQP),
	"VRNIC_CMD_CREATE_SRQ": uint64(CmdCreateSRQ), "VRNIC_CMD_MODIFY_SRQ": uint64(CmdModifySRQ),
	"VRNIC_CMD_DESTROY_SRQ": uint64(CmdDestroySRQ), "VRNIC_CMD_CREATE_AH": uint64(CmdCreateAH),
	"VRNIC_CMD_DESTROY_AH": uint64(CmdDestroyAH), "VRNIC_CMD_QUERY_SRQ": uint64(CmdQuerySRQ),
	"VRNIC_CMD_OPEN_EVENTS": uint64(CmdOpenEvents),
	"VRNIC_CMD_OPEN_XRCD":   uint64(CmdOpenXRCD), "VRNIC_CMD_CLOSE_XRCD": uint64(CmdCloseXRCD),
	"VRNIC_CMD_CREATE_XRC_SRQ": uint64(CmdCreateXRCSRQ), "VRNIC_CMD_CREATE_XRC_QP": uint64(CmdCreateXRCQP),
	"VRNIC_QPT_XRC_SEND": uint64(QPTXRCSend), "VRNIC_QPT_XRC_RECV": uint64(QPTXRCRecv),
	"VRNIC_DEVICE_XRC": DeviceXRC, "VRNIC_XRCD_O_CREAT": XRCDOCreat, "VRNIC_XRCD_O_EXCL": XRCDOExcl,
	"VRNIC_CMD_CM_CREATE_ID": uint64(CmdCMCreateID), "VRNIC_CMD_CM_DESTROY_ID": uint64(CmdCMDestroyID),
	"VRNIC_CMD_CM_LISTEN": uint64(CmdCMListen), "VRNIC_CMD_CM_CONNECT": uint64(CmdCMConnect),
	"VRNIC_CMD_CM_ACCEPT": uint64(CmdCMAccept), "VRNIC_CMD_CM_REJECT": uint64(CmdCMReject),
	"VRNIC_CMD_CM_ESTABLISH": uint64(CmdCMEstablish), "VRNIC_CMD_CM_DISCONNECT": uint64(CmdCMDisconnect),
	"VRNIC_CMD_CM_INIT_QP_ATTR": uint64(CmdCMInitQPAttr),
	"VRNIC_CMD_ODP_ATTACH":      uint64(CmdODPAttach), "VRNIC_CMD_REG_MR_ODP": uint64(CmdRegMRODP),
	"VRNIC_CMD_ADVISE_MR": uint64(CmdAdviseMR),
	"VRNIC_ODP_SUPPORT":   ODPSupport, "VRNIC_ODP_SUPPORT_IMPLICIT": ODPSupportImplicit,
	"VRNIC_ODP_SUPPORT_SEND": ODPSupportSend, "VRNIC_ODP_SUPPORT_RECV": ODPSupportRecv,
	"VRNIC_ODP_SUPPORT_WRITE": ODPSupportWrite, "VRNIC_ODP_SUPPORT_READ": ODPSupportRead,
	"VRNIC_ODP_SUPPORT_ATOMIC": ODPSupportAtomic, "VRNIC_ODP_SUPPORT_SRQ_RECV": ODPSupportSRQRecv,
	"VRNIC_ODP_F_IMPLICIT": ODPFlagImplicit, "VRNIC_ADVISE_MR_F_FLUSH": AdviseMRFlagFlush,
	"VRNIC_CMD_ALLOC_MW": uint64(CmdAllocMW), "VRNIC_CMD_DEALLOC_MW": uint64(CmdDeallocMW),
	"VRNIC_MW_TYPE_1": uint64(MWType1), "VRNIC_MW_TYPE_2": uint64(MWType2),
	"VRNIC_DEVICE_MEM_WINDOW": uint64(DeviceMemWindow), "VRNIC_DEVICE_MEM_WINDOW_TYPE_2B": uint64(DeviceMemWindowType2B),
	"VRNIC_CQ_F_TIMESTAMP": CQFlagTimestamp,
	"VRNIC_CMD_REREG_MR":   uint64(CmdReregMR), "VRNIC_CMD_RESIZE_CQ": uint64(CmdResizeCQ),
	"VRNIC_CMD_ALLOC_DM": uint64(CmdAllocDM), "VRNIC_CMD_FREE_DM": uint64(CmdFreeDM),
	"VRNIC_CMD_REG_DM_MR": uint64(CmdRegDMMR), "VRNIC_CMD_QUERY_DEVICE_EX": uint64(CmdQueryDeviceEx),
	"VRNIC_REREG_CHANGE_TRANSLATION": uint64(ReregChangeTranslation), "VRNIC_REREG_CHANGE_PD": uint64(ReregChangePD),
	"VRNIC_REREG_CHANGE_ACCESS": uint64(ReregChangeAccess), "VRNIC_DM_MAX_LOG_ALIGN": DMMaxLogAlign,
	"VRNIC_DM_MR_ZERO_BASED":    uint64(DMMRZeroBased),
	"VRNIC_CM_MAX_PRIVATE_DATA": CMMaxPrivateData, "VRNIC_CM_REQ_PRIVATE_DATA": CMREQPrivateData,
	"VRNIC_CM_REP_PRIVATE_DATA": CMREPPrivateData, "VRNIC_CM_REJ_PRIVATE_DATA": CMREJPrivateData,
	"VRNIC_CM_DREQ_PRIVATE_DATA": CMDREQPrivateData, "VRNIC_CM_SIDR_REQ_PRIVATE_DATA": CMSIDRREQPrivateData,
	"VRNIC_CM_SIDR_REP_PRIVATE_DATA": CMSIDRREPPrivateData,
	"VRNIC_CM_EVENT_BASE":            uint64(CMEventBase), "VRNIC_CM_EVENT_CONNECT_REQUEST": uint64(CMEventConnectRequest),
	"VRNIC_CM_EVENT_CONNECT_RESPONSE": uint64(CMEventConnectResponse), "VRNIC_CM_EVENT_UNREACHABLE": uint64(CMEventUnreachable),
	"VRNIC_CM_EVENT_REJECTED": uint64(CMEventRejected), "VRNIC_CM_EVENT_ESTABLISHED": uint64(CMEventEstablished),
	"VRNIC_CM_EVENT_DISCONNECTED": uint64(CMEventDisconnected), "VRNIC_CM_EVENT_TIMEWAIT_EXIT": uint64(CMEventTimeWaitExit),
	"VRNIC_EVENT_CQ_ERR": uint64(EventCQErr), "VRNIC_EVENT_QP_FATAL": uint64(EventQPFatal),
	"VRNIC_EVENT_QP_REQ_ERR": uint64(EventQPReqErr), "VRNIC_EVENT_QP_ACCESS_ERR": uint64(EventQPAccessErr),
	"VRNIC_EVENT_DEVICE_FATAL": uint64(EventDeviceFatal), "VRNIC_EVENT_PORT_ACTIVE": uint64(EventPortActive),
	"VRNIC_EVENT_PORT_ERR": uint64(EventPortErr), "VRNIC_EVENT_QP_LAST_WQE_REACHED": uint64(EventQPLastWQEReached),
	"VRNIC_EVENT_SRQ_LIMIT_REACHED": uint64(EventSRQLimitReached),
	"VRNIC_CMD_ADMIN_BASE":          uint64(CmdAdminBase), "VRNIC_CMD_FAULT_BASE": uint64(CmdFaultBase),

	"VRNIC_LINK_MEM": uint64(LinkMem), "VRNIC_LINK_UDP": uint64(LinkUDP), "VRNIC_LINK_TAP": uint64(LinkTAP),

	"VRNIC_ACCESS_LOCAL_WRITE": uint64(AccessLocalWrite), "VRNIC_ACCESS_REMOTE_WRITE": uint64(AccessRemoteWrite),
	"VRNIC_ACCESS_REMOTE_READ": uint64(AccessRemoteRead), "VRNIC_ACCESS_REMOTE_ATOMIC": uint64(AccessRemoteAtomic),
	"VRNIC_ACCESS_FLUSH_GLOBAL": uint64(AccessFlushGlobal), "VRNIC_ACCESS_FLUSH_PERSISTENT": uint64(AccessFlushPersistent),
	"VRNIC_PLACEMENT_ATOMIC_WRITE": uint64(PlacementAtomicWrite), "VRNIC_PLACEMENT_FLUSH_GLOBAL": uint64(PlacementFlushGlobal),
	"VRNIC_PLACEMENT_FLUSH_PERSISTENT": uint64(PlacementFlushPersistent),
	"VRNIC_FLUSH_GLOBAL":               uint64(FlushGlobal), "VRNIC_FLUSH_PERSISTENT": uint64(FlushPersistent),
	"VRNIC_FLUSH_RANGE": uint64(FlushRange), "VRNIC_FLUSH_MR": uint64(FlushMR),
	"VRNIC_ACCESS_MW_BIND": uint64(AccessMWBind), "VRNIC_ACCESS_ZERO_BASED": uint64(AccessZeroBased),

	"VRNIC_QPT_RC": uint64(QPTRC), "VRNIC_QPT_UC": uint64(QPTUC), "VRNIC_QPT_UD": uint64(QPTUD),

	"VRNIC_WQE_BLOCK": WQEBlock, "VRNIC_SGES_PER_BLOCK": SGEsPerBlock, "VRNIC_NO_SRQ": NoSRQ, "VRNIC_GRH_LEN": GRHLen,

	"VRNIC_QPS_RESET": uint64(QPSReset), "VRNIC_QPS_INIT": uint64(QPSInit), "VRNIC_QPS_RTR": uint64(QPSRTR),
	"VRNIC_QPS_RTS": uint64(QPSRTS), "VRNIC_QPS_SQD": uint64(QPSSQD), "VRNIC_QPS_SQE": uint64(QPSSQE),
	"VRNIC_QPS_ERR": uint64(QPSErr),

	"VRNIC_MTU_256": uint64(MTU256), "VRNIC_MTU_512": uint64(MTU512), "VRNIC_MTU_1024": uint64(MTU1024),
	"VRNIC_MTU_2048": uint64(MTU2048), "VRNIC_MTU_4096": uint64(MTU4096),

	"VRNIC_QP_STATE": uint64(QPAttrState), "VRNIC_QP_CUR_STATE": uint64(QPAttrCurState),
	"VRNIC_QP_EN_SQD_ASYNC_NOTIFY": uint64(QPAttrEnSQDAsyncNotify), "VRNIC_QP_ACCESS_FLAGS": uint64(QPAttrAccessFlags),
	"VRNIC_QP_PKEY_INDEX": uint64(QPAttrPKeyIndex), "VRNIC_QP_PORT": uint64(QPAttrPort),
	"VRNIC_QP_QKEY": uint64(QPAttrQKey), "VRNIC_QP_AV": uint64(QPAttrAV), "VRNIC_QP_PATH_MTU": uint64(QPAttrPathMTU),
	"VRNIC_QP_TIMEOUT": uint64(QPAttrTimeout), "VRNIC_QP_RETRY_CNT": uint64(QPAttrRetryCnt),
	"VRNIC_QP_RNR_RETRY": uint64(QPAttrRNRRetry), "VRNIC_QP_RQ_PSN": uint64(QPAttrRQPSN),
	"VRNIC_QP_MAX_QP_RD_ATOMIC": uint64(QPAttrMaxQPRdAtomic), "VRNIC_QP_ALT_PATH": uint64(QPAttrAltPath),
	"VRNIC_QP_MIN_RNR_TIMER": uint64(QPAttrMinRNRTimer), "VRNIC_QP_SQ_PSN": uint64(QPAttrSQPSN),
	"VRNIC_QP_MAX_DEST_RD_ATOMIC": uint64(QPAttrMaxDestRdAtomic), "VRNIC_QP_PATH_MIG_STATE": uint64(QPAttrPathMigState),
	"VRNIC_QP_CAP": uint64(QPAttrCap), "VRNIC_QP_DEST_QPN": uint64(QPAttrDestQPN),
	"VRNIC_QP_ECE": uint64(QPAttrECE),

	"VRNIC_ECE_VENDOR_ID": uint64(ECEVendorID), "VRNIC_ECE_SELECTIVE_REPEAT": uint64(ECESelectiveRepeat),
	"VRNIC_ECE_ADAPTIVE_RTO": uint64(ECEAdaptiveRTO), "VRNIC_ECE_OPTIONS": uint64(ECEOptions),
	"VRNIC_CM_ID_F_ECE": CMIDFlagECE,

	"VRNIC_WR_RDMA_WRITE": uint64(WRRDMAWrite), "VRNIC_WR_RDMA_WRITE_WITH_IMM": uint64(WRRDMAWriteWithImm),
	"VRNIC_WR_SEND": uint64(WRSend), "VRNIC_WR_SEND_WITH_IMM": uint64(WRSendWithImm),
	"VRNIC_WR_RDMA_READ": uint64(WRRDMARead), "VRNIC_WR_ATOMIC_CMP_AND_SWP": uint64(WRAtomicCmpAndSwp),
	"VRNIC_WR_ATOMIC_FETCH_AND_ADD": uint64(WRAtomicFetchAdd), "VRNIC_WR_LOCAL_INV": uint64(WRLocalInv),
	"VRNIC_WR_SEND_WITH_INV": uint64(WRSendWithInv), "VRNIC_WR_BIND_MW": uint64(WRBindMW),
	"VRNIC_WR_FLUSH": uint64(WRFlush), "VRNIC_WR_ATOMIC_WRITE": uint64(WRAtomicWrite),

	"VRNIC_SEND_FENCE": uint64(SendFence), "VRNIC_SEND_SIGNALED": uint64(SendSignaled),
	"VRNIC_SEND_SOLICITED": uint64(SendSolicited), "VRNIC_SEND_INLINE": uint64(SendInline),

	"VRNIC_WC_SEND": uint64(WCSend), "VRNIC_WC_RDMA_WRITE": uint64(WCRDMAWrite),
	"VRNIC_WC_RDMA_READ": uint64(WCRDMARead), "VRNIC_WC_COMP_SWAP": uint64(WCCompSwap),
	"VRNIC_WC_FETCH_ADD": uint64(WCFetchAdd), "VRNIC_WC_BIND_MW": uint64(WCBindMW),
	"VRNIC_WC_LOCAL_INV": uint64(WCLocalInv),
	"VRNIC_WC_FLUSH":     uint64(WCFlush), "VRNIC_WC_ATOMIC_WRITE": uint64(WCAtomicWrite), "VRNIC_WC_RECV": uint64(WCRecv),
	"VRNIC_WC_RECV_RDMA_WITH_IMM": uint64(WCRecvRDMAWithImm),

	"VRNIC_WC_SUCCESS": uint64(WCSuccess), "VRNIC_WC_LOC_LEN_ERR": uint64(WCLocLenErr),
	"VRNIC_WC_LOC_QP_OP_ERR": uint64(WCLocQPOpErr), "VRNIC_WC_LOC_EEC_OP_ERR": uint64(WCLocEECOpErr),
	"VRNIC_WC_LOC_PROT_ERR": uint64(WCLocProtErr), "VRNIC_WC_WR_FLUSH_ERR": uint64(WCWRFlushErr),
	"VRNIC_WC_MW_BIND_ERR": uint64(WCMWBindErr), "VRNIC_WC_BAD_RESP_ERR": uint64(WCBadRespErr),
	"VRNIC_WC_LOC_ACCESS_ERR": uint64(WCLocAccessErr), "VRNIC_WC_REM_INV_REQ_ERR": uint64(WCRemInvReqErr),
	"VRNIC_WC_REM_ACCESS_ERR": uint64(WCRemAccessErr), "VRNIC_WC_REM_OP_ERR": uint64(WCRemOpErr),
	"VRNIC_WC_RETRY_EXC_ERR": uint64(WCRetryExcErr), "VRNIC_WC_RNR_RETRY_EXC_ERR": uint64(WCRNRRetryExcErr),
	"VRNIC_WC_LOC_RDD_VIOL_ERR": uint64(WCLocRDDViolErr), "VRNIC_WC_REM_INV_RD_REQ_ERR": uint64(WCRemInvRdReqErr),
	"VRNIC_WC_REM_ABORT_ERR": uint64(WCRemAbortErr), "VRNIC_WC_INV_EECN_ERR": uint64(WCInvEECNErr),
	"VRNIC_WC_INV_EEC_STATE_ERR": uint64(WCInvEECStateErr), "VRNIC_WC_FATAL_ERR": uint64(WCFatalErr),
	"VRNIC_WC_RESP_TIMEOUT_ERR": uint64(WCRespTimeoutErr), "VRNIC_WC_GENERAL_ERR": uint64(WCGeneralErr),

	"VRNIC_WC_GRH": uint64(WCGRH), "VRNIC_WC_WITH_IMM": uint64(WCWithImm),
	"VRNIC_WC_IP_CSUM_OK": uint64(WCIPCsumOK), "VRNIC_WC_WITH_INV": uint64(WCWithInv),

	"VRNIC_DB_RECORD_SIZE": DBRecordSize, "VRNIC_DB_PAGE_SIZE": DBPageSize, "VRNIC_DB_MAGIC": DBMagic,
	"VRNIC_DB_F_SUMMARY": DBFlagSummary, "VRNIC_DB_DF_KICK_GEN": DBDaemonKickGen, "VRNIC_DB_SUMMARY_GROUP": DBSummaryGroup, "VRNIC_DB_SUMMARY_WORDS": DBSummaryWords,
	"VRNIC_CQ_ARM_ARMED": CQArmArmed, "VRNIC_CQ_ARM_SOLICITED": CQArmSolicited,
	"VRNIC_CQ_ARM_SN_SHIFT": CQArmSNShift,
}

// cOffsets maps every byte-offset constant of the package (and the tail
// word's bit shifts, as the byte they select) to the C member it locates;
// TestLayoutAgainstC compares each with offsetof, and
// TestOffsetConstantsListed fails on an offset constant missing here.
var cOffsets = []struct {
	name   string // the Go constant
	off    uintptr
	member string // struct.member in vrnic_abi.h
}{
	{"offHdrOpcode", offHdrOpcode, "vrnic_msg_hdr.opcode"},
	{"offHdrFlags", offHdrFlags, "vrnic_msg_hdr.flags"},
	{"offHdrLength", offHdrLength, "vrnic_msg_hdr.length"},
	{"offHdrSeq", offHdrSeq, "vrnic_msg_hdr.seq"},
	{"offHdrStatus", offHdrStatus, "vrnic_msg_hdr.status"},

	{"offSGEAddr", offSGEAddr, "vrnic_sge.addr"},
	{"offSGELength", offSGELength, "vrnic_sge.length"},
	{"offSGELKey", offSGELKey, "vrnic_sge.lkey"},

	{"offSendWrID", offSendWrID, "vrnic_send_wqe.wr_id"},
	{"offSendOpcode", offSendOpcode, "vrnic_send_wqe.opcode"},
	{"offSendFlags", offSendFlags, "vrnic_send_wqe.flags"},
	{"offSendNumSGE", offSendNumSGE, "vrnic_send_wqe.num_sge"},
	{"offSendReserved0", offSendReserved0, "vrnic_send_wqe.reserved0"},
	{"offSendImmData", offSendImmData, "vrnic_send_wqe.imm_data"},
	{"offSendInvRKey", offSendInvRKey, "vrnic_send_wqe.invalidate_rkey"},
	{"offSendInlineLen", offSendInlineLen, "vrnic_send_wqe.inline_len"},
	{"offSendRemoteAddr", offSendRemoteAddr, "vrnic_send_wqe.remote_addr"},
	{"offSendRKey", offSendRKey, "vrnic_send_wqe.rkey"},
	{"offSendRemoteQPN", offSendRemoteQPN, "vrnic_send_wqe.remote_qpn"},
	{"offSendRemoteQKey", offSendRemoteQKey, "vrnic_send_wqe.remote_qkey"},
	{"offSendAHHandle", offSendAHHandle, "vrnic_send_wqe.ah_handle"},
	{"offSendCompareAdd", offSendCompareAdd, "vrnic_send_wqe.compare_add"},
	{"offSendSwap", offSendSwap, "vrnic_send_wqe.swap"},

	{"offRecvWrID", offRecvWrID, "vrnic_recv_wqe.wr_id"},
	{"offRecvNumSGE", offRecvNumSGE, "vrnic_recv_wqe.num_sge"},
	{"offRecvReserved", offRecvReserved, "vrnic_recv_wqe.reserved"},

	{"offCQEWrID", offCQEWrID, "vrnic_cqe.wr_id"},
	{"offCQEByteLen", offCQEByteLen, "vrnic_cqe.byte_len"},
	{"offCQEImmOrInv", offCQEImmOrInv, "vrnic_cqe.imm_or_inv"},
	{"offCQEQPNum", offCQEQPNum, "vrnic_cqe.qp_num"},
	{"offCQESrcQP", offCQESrcQP, "vrnic_cqe.src_qp"},
	{"offCQEStatus", offCQEStatus, "vrnic_cqe.status"},
	{"offCQEOpcode", offCQEOpcode, "vrnic_cqe.opcode"},
	{"offCQEWCFlags", offCQEWCFlags, "vrnic_cqe.wc_flags"},
	{"offCQEVendorErr", offCQEVendorErr, "vrnic_cqe.vendor_err"},
	{"OffCQETail", OffCQETail, "vrnic_cqe.pkey_index"},
	{"tailSLShift", OffCQETail + tailSLShift/8, "vrnic_cqe.sl"},
	{"OffCQEOwner", OffCQEOwner, "vrnic_cqe.owner"},

	{"OffDBMagic", OffDBMagic, "vrnic_db_header.magic"},
	{"OffDBABIVersion", OffDBABIVersion, "vrnic_db_header.abi_version"},
	{"OffDBKickNeeded", OffDBKickNeeded, "vrnic_db_header.kick_needed"},
	{"OffDBDaemonFlags", OffDBDaemonFlags, "vrnic_db_header.daemon_flags"},
	{"OffDBClientFlags", OffDBClientFlags, "vrnic_db_header.client_flags"},
	{"OffDBSummary", OffDBSummary, "vrnic_db_header.summary"},
	{"OffDBSQPI", OffDBSQPI, "vrnic_db_qp.sq_pi"},
	{"OffDBRQPI", OffDBRQPI, "vrnic_db_qp.rq_pi"},
	{"OffDBSQCI", OffDBSQCI, "vrnic_db_qp.sq_ci"},
	{"OffDBRQCI", OffDBRQCI, "vrnic_db_qp.rq_ci"},
	{"OffDBCQCI", OffDBCQCI, "vrnic_db_cq.cq_ci"},
	{"OffDBCQArm", OffDBCQArm, "vrnic_db_cq.arm"},
	{"OffDBCQPI", OffDBCQPI, "vrnic_db_cq.cq_pi"},
	{"OffDBArmSNDone", OffDBArmSNDone, "vrnic_db_cq.arm_sn_done"},
	{"OffDBOverflow", OffDBOverflow, "vrnic_db_cq.overflow"},
	{"OffDBSRQPI", OffDBSRQPI, "vrnic_db_srq.srq_pi"},
	{"OffDBSRQCI", OffDBSRQCI, "vrnic_db_srq.srq_ci"},

	{"OffModifyQPECE", OffModifyQPECE, "vrnic_cmd_modify_qp.ece_options"},
	{"OffCMAcceptECE", OffCMAcceptECE, "vrnic_cmd_cm_accept.ece_options"},
}

// cFuncMacros are the function-like macros; they are checked on a grid of
// arguments against their Go functions.
var cFuncMacros = map[string]bool{"VRNIC_DIV_UP": true, "VRNIC_SQ_WQE_BLOCKS": true, "VRNIC_RQ_WQE_SIZE": true}

const headerFile = "vrnic_abi.h"

type headerInfo struct {
	structs map[string][]string // struct name -> member names in order
	consts  []string            // object-like #defines and enum members
	macros  []string            // function-like #defines
}

var (
	reStructStart = regexp.MustCompile(`^struct (vrnic_\w+) \{`)
	reMember      = regexp.MustCompile(`^\s*(?:uint8_t|uint16_t|uint32_t|uint64_t|char|struct vrnic_\w+)\s+(\w+)\s*(?:\[[^\]]+\])?\s*;`)
	reDefine      = regexp.MustCompile(`^#define (VRNIC_\w+)(\()?`)
	reEnumMember  = regexp.MustCompile(`^\s*(VRNIC_\w+)\s*=`)
)

// parseHeader extracts struct members, object-like macros and enum members
// from the header with line-oriented patterns (the header keeps one
// declaration per line).
func parseHeader(t *testing.T) headerInfo {
	t.Helper()
	src, err := os.ReadFile(headerFile)
	require.NoError(t, err)
	h := headerInfo{structs: map[string][]string{}}
	cur := ""
	inComment := false
	sc := bufio.NewScanner(bytes.NewReader(src))
	for sc.Scan() {
		line := sc.Text()
		// Drop comments so commented-out members are not counted.
		if inComment {
			i := strings.Index(line, "*/")
			if i < 0 {
				continue
			}
			line, inComment = line[i+2:], false
		}
		for {
			i := strings.Index(line, "/*")
			if i < 0 {
				break
			}
			j := strings.Index(line[i:], "*/")
			if j < 0 {
				line, inComment = line[:i], true
				break
			}
			line = line[:i] + line[i+j+2:]
		}
		if m := reStructStart.FindStringSubmatch(line); m != nil {
			cur = m[1]
			h.structs[cur] = nil
			continue
		}
		if cur != "" {
			if strings.HasPrefix(strings.TrimSpace(line), "};") {
				cur = ""
				continue
			}
			if m := reMember.FindStringSubmatch(line); m != nil {
				h.structs[cur] = append(h.structs[cur], m[1])
			} else if strings.TrimSpace(line) != "" {
				t.Fatalf("unparsed line in struct %s: %q", cur, line)
			}
			continue
		}
		if m := reDefine.FindStringSubmatch(line); m != nil {
			switch {
			case m[1] == "VRNIC_ABI_H":
			case m[2] == "(":
				h.macros = append(h.macros, m[1])
			default:
				h.consts = append(h.consts, m[1])
			}
			continue
		}
		if m := reEnumMember.FindStringSubmatch(line); m != nil {
			h.consts = append(h.consts, m[1])
		}
	}
	require.NoError(t, sc.Err())
	return h
}

type goField struct {
	cname    string
	offset   uintptr
	size     uintptr
	elemSize uintptr // arrays only
}

func goFields(t *testing.T, v any) []goField {
	t.Helper()
	rt := reflect.TypeOf(v)
	var out []goField
	for i := range rt.NumField() {
		f := rt.Field(i)
		c := f.Tag.Get("c")
		require.NotEmpty(t, c, "%s.%s has no c tag", rt.Name(), f.Name)
		g := goField{cname: c, offset: f.Offset, size: f.Type.Size()}
		if f.Type.Kind() == reflect.Array {
			g.elemSize = f.Type.Elem().Size()
		}
		out = append(out, g)
	}
	return out
}

// TestHeaderCoverage checks that the Go tables name every struct, member,
// constant and macro of the header, and nothing else.
func TestHeaderCoverage(t *testing.T) {
	h := parseHeader(t)
	goNames := map[string]bool{}
	for _, s := range cStructs {
		goNames[s.name] = true
		members, ok := h.structs[s.name]
		if !assert.True(t, ok, "struct %s not in the header", s.name) {
			continue
		}
		var gf []string
		for _, f := range goFields(t, s.v) {
			gf = append(gf, f.cname)
		}
		assert.Equal(t, members, gf, "members of struct %s", s.name)
	}
	for name := range h.structs {
		assert.True(t, goNames[name], "struct %s has no Go mirror", name)
	}
	var want []string
	for k := range cConsts {
		want = append(want, k)
	}
	got := append([]string(nil), h.consts...)
	sort.Strings(want)
	sort.Strings(got)
	assert.Equal(t, got, want, "constants of the header vs the Go table")
	var macros []string
	for k := range cFuncMacros {
		macros = append(macros, k)
	}
	sort.Strings(macros)
	sort.Strings(h.macros)
	assert.Equal(t, h.macros, macros, "function-like macros")
	require.NotEmpty(t, h.consts)
	require.Len(t, h.structs, len(cStructs))
}

var macroSGEs = []uint32{0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 32}
var macroInline = []uint32{0, 1, 63, 64, 65, 127, 128, 129, 256, 511, 512}

// TestLayoutAgainstC compiles a C program generated from the Go tables
// against the header and compares every size, offset, constant and macro
// result with the Go mirror.
func TestLayoutAgainstC(t *testing.T) {
	gcc := testenv.NeedTool(t, "gcc")
	hdr, err := filepath.Abs(headerFile)
	require.NoError(t, err)

	var src strings.Builder
	want := map[string]uint64{}
	fmt.Fprintf(&src, "#include <stdio.h>\n#include <stddef.h>\n#include %q\nint main(void) {\n", hdr)
	for _, s := range cStructs {
		fmt.Fprintf(&src, "\tprintf(\"size %s %%zu\\n\", sizeof(struct %s));\n", s.name, s.name)
		want["size "+s.name] = uint64(reflect.TypeOf(s.v).Size())
		for _, f := range goFields(t, s.v) {
			key := s.name + "." + f.cname
			fmt.Fprintf(&src, "\tprintf(\"off %s %%zu\\n\", offsetof(struct %s, %s));\n", key, s.name, f.cname)
			fmt.Fprintf(&src, "\tprintf(\"fsize %s %%zu\\n\", sizeof(((struct %s *)0)->%s));\n", key, s.name, f.cname)
			want["off "+key] = uint64(f.offset)
			want["fsize "+key] = uint64(f.size)
			if f.elemSize != 0 {
				fmt.Fprintf(&src, "\tprintf(\"esize %s %%zu\\n\", sizeof(((struct %s *)0)->%s[0]));\n", key, s.name, f.cname)
				want["esize "+key] = uint64(f.elemSize)
			}
		}
	}
	for _, o := range cOffsets {
		s, m, _ := strings.Cut(o.member, ".")
		fmt.Fprintf(&src, "\tprintf(\"goff %s %%zu\\n\", offsetof(struct %s, %s));\n", o.name, s, m)
		want["goff "+o.name] = uint64(o.off)
	}
	for name, v := range cConsts {
		fmt.Fprintf(&src, "\tprintf(\"const %s %%llu\\n\", (unsigned long long)(%s));\n", name, name)
		want["const "+name] = v
	}
	for _, a := range []uint32{0, 1, 3, 4, 5, 63, 64, 65} {
		for _, b := range []uint32{1, 4, 64} {
			fmt.Fprintf(&src, "\tprintf(\"divup %d %d %%u\\n\", VRNIC_DIV_UP(%du, %du));\n", a, b, a, b)
			want[fmt.Sprintf("divup %d %d", a, b)] = uint64(DivUp(a, b))
		}
	}
	for _, s := range macroSGEs {
		for _, i := range macroInline {
			fmt.Fprintf(&src, "\tprintf(\"sqblocks %d %d %%u\\n\", VRNIC_SQ_WQE_BLOCKS(%du, %du));\n", s, i, s, i)
			want[fmt.Sprintf("sqblocks %d %d", s, i)] = uint64(SQWQEBlocks(s, i))
		}
		fmt.Fprintf(&src, "\tprintf(\"rqsize %d %%u\\n\", VRNIC_RQ_WQE_SIZE(%du));\n", s, s)
		want[fmt.Sprintf("rqsize %d", s)] = uint64(RQWQESize(s))
	}
	src.WriteString("\treturn 0;\n}\n")

	dir := t.TempDir()
	cfile := filepath.Join(dir, "layout.c")
	bin := filepath.Join(dir, "layout")
	require.NoError(t, os.WriteFile(cfile, []byte(src.String()), 0o644))
	out, err := exec.Command(gcc, "-std=c11", "-Wall", "-Wextra", "-Wpadded", "-Werror", "-o", bin, cfile).CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)
	out, err = exec.Command(bin).Output()
	require.NoError(t, err)

	got := map[string]uint64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, "bad line %q", line)
		v, err := strconv.ParseUint(line[i+1:], 10, 64)
		require.NoError(t, err)
		got[line[:i]] = v
	}
	require.Len(t, got, len(want), "the C program printed a different set of values")
	for k, w := range want {
		assert.Equal(t, w, got[k], "%s: Go %d, C %d", k, w, got[k])
	}
}

// TestStructsCoverTheirSize checks that each Go struct's fields tile it with
// no gap (the header promises no implicit padding), and that binary
// encoding agrees with the in-memory size.
func TestStructsCoverTheirSize(t *testing.T) {
	for _, s := range cStructs {
		t.Run(s.name, func(t *testing.T) {
			var end uintptr
			for _, f := range goFields(t, s.v) {
				assert.Equal(t, end, f.offset, "gap before %s", f.cname)
				end = f.offset + f.size
			}
			size := reflect.TypeOf(s.v).Size()
			assert.Equal(t, size, end, "trailing padding")
			assert.Equal(t, int(size), Sizeof(s.v), "binary size")
		})
	}
}

func TestSizeConstants(t *testing.T) {
	cases := []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"SizeofMsgHdr", SizeofMsgHdr, reflect.TypeOf(MsgHdr{}).Size()},
		{"SizeofSendWQE", SizeofSendWQE, reflect.TypeOf(SendWQE{}).Size()},
		{"SizeofSGE", SizeofSGE, reflect.TypeOf(SGE{}).Size()},
		{"SizeofRecvWQE", SizeofRecvWQE, reflect.TypeOf(RecvWQE{}).Size()},
		{"SizeofCQE", SizeofCQE, reflect.TypeOf(CQE{}).Size()},
		{"DBRecordSize/header", DBRecordSize, reflect.TypeOf(DBHeader{}).Size()},
		{"DBRecordSize/qp", DBRecordSize, reflect.TypeOf(DBQP{}).Size()},
		{"DBRecordSize/cq", DBRecordSize, reflect.TypeOf(DBCQ{}).Size()},
		{"DBRecordSize/srq", DBRecordSize, reflect.TypeOf(DBSRQ{}).Size()},
		{"SizeofCMEvent", SizeofCMEvent, reflect.TypeOf(CMEvent{}).Size()},
		{"SizeofCMEventECE", SizeofCMEventECE, reflect.TypeOf(CMEventECE{}).Size()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { assert.Equal(t, c.want, c.got) })
	}
	// Client-written words in the first line, daemon-written in the second.
	for _, o := range []uintptr{OffDBSQPI, OffDBRQPI, OffDBCQCI, OffDBCQArm, OffDBSRQPI} {
		assert.Less(t, o, uintptr(64))
	}
	for _, o := range []uintptr{OffDBSQCI, OffDBRQCI, OffDBCQPI, OffDBArmSNDone, OffDBOverflow, OffDBSRQCI} {
		assert.GreaterOrEqual(t, o, uintptr(64))
	}
}

// TestOffsetConstantsListed checks that every byte-offset constant the
// package declares (off*, Off*) is in cOffsets, so each is compared with
// the C header.
func TestOffsetConstantsListed(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var declared []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					if reOffsetConst.MatchString(id.Name) {
						declared = append(declared, id.Name)
					}
				}
			}
		}
	}
	var listed []string
	for _, o := range cOffsets {
		if reOffsetConst.MatchString(o.name) {
			listed = append(listed, o.name)
		}
	}
	sort.Strings(declared)
	sort.Strings(listed)
	require.NotEmpty(t, declared)
	assert.Equal(t, declared, listed)
}

var reOffsetConst = regexp.MustCompile(`^[oO]ff[A-Z]`)
