package roce

import (
	"fmt"
	"math/bits"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// allOpcodes returns every opcode the table knows, in numeric order.
func allOpcodes() []Opcode {
	var ops []Opcode
	for i := 0; i < 256; i++ {
		if Opcode(i).Valid() {
			ops = append(ops, Opcode(i))
		}
	}
	return ops
}

func TestOpcodeTableCounts(t *testing.T) {
	per := map[Service]int{}
	for _, op := range allOpcodes() {
		per[op.Service()]++
	}
	// IBTA 1.4 table 38: RC 0x00-0x14 and 0x16-0x17, with FLUSH 0x1c and
	// ATOMIC WRITE 0x1d of IBTA 1.5; UC SEND and RDMA WRITE 0x20-0x2b; UD
	// SEND ONLY with and without immediate; RoCE CNP; XRC the RC opcodes
	// of IBTA 1.4.
	assert.Equal(t, map[Service]int{ServiceRC: 25, ServiceUC: 12, ServiceUD: 2, ServiceCNP: 1, ServiceXRC: 23}, per)
	assert.False(t, Opcode(0x15).Valid(), "0x15 is reserved")
	assert.False(t, Opcode(0x18).Valid(), "0x18 (RC SEND ONLY with invalidate's neighbour) is reserved")
	assert.False(t, Opcode(0x3c).Valid(), "UC has no FLUSH")
	assert.False(t, Opcode(0x3d).Valid(), "UC has no ATOMIC WRITE")
	assert.False(t, Opcode(0x2c).Valid(), "UC has no RDMA READ")
	assert.False(t, Opcode(0x40).Valid(), "RD is not supported")
	assert.False(t, Opcode(0x60).Valid(), "UD has only SEND ONLY")
	assert.Equal(t, "Opcode(0x15)", Opcode(0x15).String())
}

// TestOpcodeTableConsistent checks every entry against the rules the IBTA
// states for headers, payloads and positions.
func TestOpcodeTableConsistent(t *testing.T) {
	names := map[string]Opcode{}
	for _, op := range allOpcodes() {
		info := op.Info()
		t.Run(info.Name, func(t *testing.T) {
			f := info.Flags
			// Name and service agree.
			prefix := map[Service]string{ServiceRC: "RC_", ServiceUC: "UC_", ServiceUD: "UD_", ServiceCNP: "CNP"}[op.Service()]
			assert.True(t, strings.HasPrefix(info.Name, prefix), "name %q, service %v", info.Name, op.Service())
			assert.Equal(t, op.Service(), info.Service)
			_, dup := names[info.Name]
			assert.False(t, dup, "duplicate name")
			names[info.Name] = op

			// Exactly one position.
			assert.Equal(t, 1, bits.OnesCount32(uint32(f&(OpFirst|OpMiddle|OpLast|OpOnly))))

			// Header offsets are contiguous in wire order after the BTH
			// and sum to HeaderLen; absent headers have offset 0.
			off := BTHLen
			for h := Header(0); h < numHeaders; h++ {
				if info.Has(h) {
					assert.Equal(t, off, info.Offset(h), "offset of %v", h)
					off += h.Len()
				} else {
					assert.Zero(t, info.Offset(h), "absent %v", h)
				}
			}
			assert.Equal(t, off, info.HeaderLen)
			assert.Equal(t, info.HeaderLen, op.HeaderLen())
			assert.LessOrEqual(t, info.HeaderLen, MaxTransportHeaderLen)

			// Each header is there exactly when the operation needs it.
			pos := f & (OpFirst | OpMiddle | OpLast | OpOnly)
			assert.Equal(t, f&OpImm != 0, info.Has(HdrImmDt), "ImmDt")
			assert.Equal(t, f&OpInvalidate != 0, info.Has(HdrIETH), "IETH")
			assert.Equal(t, op.Service() == ServiceUD, info.Has(HdrDETH), "DETH")
			assert.Equal(t, op.Service() == ServiceXRC && f&OpRequest != 0, info.Has(HdrXRCETH), "XRCETH")
			if op.Service() == ServiceXRC {
				// Each XRC opcode is its RC twin plus the XRCETH.
				rc := (op - XRCOpcodeOffset).Info()
				assert.Equal(t, rc.Flags, f, "XRC flags")
				assert.Equal(t, "XRC_"+strings.TrimPrefix(rc.Name, "RC_"), info.Name)
				assert.Equal(t, rc.HeaderLen+boolInt(info.Has(HdrXRCETH))*XRCETHLen, info.HeaderLen)
			}
			assert.Equal(t, op.Service() == ServiceCNP, info.Has(HdrCNPReserved), "CNP block")
			assert.Equal(t, f&OpWrite != 0 && (pos == OpFirst || pos == OpOnly) || f&(OpRead|OpRequest) == OpRead|OpRequest ||
				f&(OpAtomicWrite|OpFlush) != 0, info.Has(HdrRETH), "RETH")
			assert.Equal(t, f&OpFlush != 0, info.Has(HdrFETH), "FETH")
			if f&(OpAtomicWrite|OpFlush) != 0 {
				assert.Equal(t, ServiceRC, op.Service(), "memory placement extensions are RC")
				assert.Equal(t, OpRequest|OpOnly|OpAcked, f&(OpRequest|OpResponse|OpOnly|OpAcked))
			}
			assert.Equal(t, f&(OpAtomic|OpRequest) == OpAtomic|OpRequest, info.Has(HdrAtomicETH), "AtomicETH")
			assert.Equal(t, f&OpAck != 0 || f&(OpRead|OpResponse) == OpRead|OpResponse && pos != OpMiddle, info.Has(HdrAETH), "AETH")
			assert.Equal(t, f&(OpAck|OpAtomic) == OpAck|OpAtomic, info.Has(HdrAtomicAckETH), "AtomicAckETH")

			// Payload: SEND, RDMA WRITE, ATOMIC WRITE and READ RESPONSE only.
			assert.Equal(t, f&(OpSend|OpWrite|OpAtomicWrite) != 0 || f&(OpRead|OpResponse) == OpRead|OpResponse, f&OpPayload != 0, "payload")

			// Direction: requests and responses are disjoint; only the CNP is
			// neither.
			assert.NotEqual(t, f&OpRequest != 0 && f&OpResponse != 0, true)
			assert.Equal(t, op.Service() == ServiceCNP, f&(OpRequest|OpResponse) == 0)
			assert.Equal(t, op.Service() == ServiceCNP, f&OpCongestion != 0)
			if f&OpResponse != 0 {
				assert.Contains(t, []Service{ServiceRC, ServiceXRC}, op.Service(), "only RC and XRC have responses")
			}
			// Acknowledged: exactly the RC requests.
			assert.Equal(t, (op.Service() == ServiceRC || op.Service() == ServiceXRC) && f&OpRequest != 0, f&OpAcked != 0, "acked")
			// Receive WQE: SENDs and RDMA WRITE with immediate.
			assert.Equal(t, f&OpSend != 0 || f&(OpWrite|OpImm) == OpWrite|OpImm, f&OpRecvWQE != 0, "recv WQE")
			// One operation kind per opcode (ACK alone, atomic ACK is
			// OpAck|OpAtomic).
			kinds := bits.OnesCount32(uint32(f & (OpSend | OpWrite | OpRead | OpAtomic | OpAck | OpAtomicWrite | OpFlush)))
			if f&(OpAck|OpAtomic) == OpAck|OpAtomic {
				kinds--
			}
			if op.Service() == ServiceCNP {
				assert.Equal(t, 0, kinds)
			} else {
				assert.Equal(t, 1, kinds)
			}
			// UC mirrors RC for the same operation bits.
			if op.Service() == ServiceUC {
				rc := (op & 0x1f).Info()
				require.True(t, rc.Valid())
				assert.Equal(t, "UC_"+strings.TrimPrefix(rc.Name, "RC_"), info.Name)
				assert.Equal(t, rc.Headers, info.Headers)
				assert.Equal(t, rc.Flags&^OpAcked, info.Flags)
			}
		})
	}
}

// TestOpcodeTableSpotChecks pins entries to IBTA table 38 values.
func TestOpcodeTableSpotChecks(t *testing.T) {
	tests := []struct {
		op        Opcode
		name      string
		headerLen int
		hdrs      []Header
		offsets   []int
	}{
		{0x00, "RC_SEND_FIRST", 12, nil, nil},
		{0x04, "RC_SEND_ONLY", 12, nil, nil},
		{0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", 16, []Header{HdrImmDt}, []int{12}},
		{0x06, "RC_RDMA_WRITE_FIRST", 28, []Header{HdrRETH}, []int{12}},
		{0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32, []Header{HdrRETH, HdrImmDt}, []int{12, 28}},
		{0x0c, "RC_RDMA_READ_REQUEST", 28, []Header{HdrRETH}, []int{12}},
		{0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", 12, nil, nil},
		{0x10, "RC_RDMA_READ_RESPONSE_ONLY", 16, []Header{HdrAETH}, []int{12}},
		{0x11, "RC_ACKNOWLEDGE", 16, []Header{HdrAETH}, []int{12}},
		{0x12, "RC_ATOMIC_ACKNOWLEDGE", 24, []Header{HdrAETH, HdrAtomicAckETH}, []int{12, 16}},
		{0x13, "RC_COMPARE_SWAP", 40, []Header{HdrAtomicETH}, []int{12}},
		{0x14, "RC_FETCH_ADD", 40, []Header{HdrAtomicETH}, []int{12}},
		{0x16, "RC_SEND_LAST_WITH_INVALIDATE", 16, []Header{HdrIETH}, []int{12}},
		{0x17, "RC_SEND_ONLY_WITH_INVALIDATE", 16, []Header{HdrIETH}, []int{12}},
		// IBTA 1.5 Memory Placement Extensions: FLUSH is BTH, FETH, RETH
		// (as Linux rxe_opcode.c), ATOMIC WRITE BTH, RETH, 8-byte payload.
		{0x1c, "RC_FLUSH", 32, []Header{HdrFETH, HdrRETH}, []int{12, 16}},
		{0x1d, "RC_ATOMIC_WRITE", 28, []Header{HdrRETH}, []int{12}},
		{0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16, []Header{HdrImmDt}, []int{12}},
		{0x64, "UD_SEND_ONLY", 20, []Header{HdrDETH}, []int{12}},
		{0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", 24, []Header{HdrDETH, HdrImmDt}, []int{12, 20}},
		{0x81, "CNP", 28, []Header{HdrCNPReserved}, []int{12}},
		{0xa4, "XRC_SEND_ONLY", 16, []Header{HdrXRCETH}, []int{12}},
		{0xa5, "XRC_SEND_ONLY_WITH_IMMEDIATE", 20, []Header{HdrXRCETH, HdrImmDt}, []int{12, 16}},
		{0xab, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 36, []Header{HdrXRCETH, HdrRETH, HdrImmDt}, []int{12, 16, 32}},
		{0xac, "XRC_RDMA_READ_REQUEST", 32, []Header{HdrXRCETH, HdrRETH}, []int{12, 16}},
		{0xb0, "XRC_RDMA_READ_RESPONSE_ONLY", 16, []Header{HdrAETH}, []int{12}},
		{0xb1, "XRC_ACKNOWLEDGE", 16, []Header{HdrAETH}, []int{12}},
		{0xb4, "XRC_FETCH_ADD", 44, []Header{HdrXRCETH, HdrAtomicETH}, []int{12, 16}},
		{0xb7, "XRC_SEND_ONLY_WITH_INVALIDATE", 20, []Header{HdrXRCETH, HdrIETH}, []int{12, 16}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info := tt.op.Info()
			require.True(t, info.Valid())
			assert.Equal(t, tt.name, info.Name)
			assert.Equal(t, tt.name, tt.op.String())
			assert.Equal(t, tt.headerLen, info.HeaderLen)
			var m HeaderMask
			for i, h := range tt.hdrs {
				m |= 1 << h
				assert.Equal(t, tt.offsets[i], info.Offset(h), "%v", h)
			}
			assert.Equal(t, m, info.Headers)
		})
	}
}

// TestEnumNames pins the names of the small enums (their String methods
// are generated), undefined values included.
func TestEnumNames(t *testing.T) {
	cases := []struct {
		v    fmt.Stringer
		want string
	}{
		{ServiceRC, "RC"}, {ServiceUC, "UC"}, {ServiceRD, "RD"}, {ServiceUD, "UD"}, {ServiceCNP, "CNP"},
		{ServiceXRC, "XRC"}, {Service(6), "Service(6)"},
		{HdrDETH, "DETH"}, {HdrXRCETH, "XRCETH"}, {HdrFETH, "FETH"}, {HdrRETH, "RETH"}, {HdrAtomicETH, "AtomicETH"}, {HdrAETH, "AETH"},
		{HdrAtomicAckETH, "AtomicAckETH"}, {HdrImmDt, "ImmDt"}, {HdrIETH, "IETH"},
		{HdrCNPReserved, "CNPReserved"}, {Header(numHeaders), "Header(10)"},
		{SyndromeACK, "ACK"}, {SyndromeRNRNAK, "RNR_NAK"}, {SyndromeReserved, "RESERVED"}, {SyndromeNAK, "NAK"},
		{SyndromeKind(4), "SyndromeKind(4)"},
		{NAKPSNSequenceError, "PSN_SEQUENCE_ERROR"}, {NAKInvalidRequest, "INVALID_REQUEST"},
		{NAKRemoteAccessError, "REMOTE_ACCESS_ERROR"}, {NAKRemoteOperationalErr, "REMOTE_OPERATIONAL_ERROR"},
		{NAKInvalidRDRequest, "INVALID_RD_REQUEST"}, {NAKCode(nakCodeCount), "NAKCode(5)"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, c.v.String())
	}
}

// TestOpcodeByName: every opcode of the table is found by its name, in
// any letter case; nothing else is.
func TestOpcodeByName(t *testing.T) {
	n := 0
	for i := range 256 {
		op := Opcode(i)
		if !op.Valid() {
			continue
		}
		n++
		got, ok := OpcodeByName(op.Info().Name)
		require.True(t, ok, "%v", op)
		assert.Equal(t, op, got)
		got, ok = OpcodeByName(strings.ToLower(op.Info().Name))
		require.True(t, ok, "%v in lower case", op)
		assert.Equal(t, op, got)
	}
	assert.Len(t, opByName, n)
	for _, bad := range []string{"", "RC_SEND", "SEND_ONLY", "0x04", "RC_SEND_ONLY "} {
		_, ok := OpcodeByName(bad)
		assert.False(t, ok, "%q", bad)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
