package engine

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// xrcSRQ is a fake XRC SRQ: its receive queue and CQ.
type xrcSRQ struct {
	rq *fakeRQ
	cq *fakeCQ
}

func addXRCSRQ(n *node, srqn, xrcd uint32) *xrcSRQ {
	s := &xrcSRQ{rq: newFakeRQ(64), cq: newFakeCQ(64)}
	n.eng.AddXRCSRQ(srqn, &XRCSRQ{XRCD: xrcd, RQ: s.rq, CQ: s.cq, Mems: []Memory{n.mem}})
	return s
}

// TestXRC: one initiator QP sends to two XRC SRQs behind one target QP:
// each SEND (with and without immediate) lands in the SRQ its WQE names
// and completes in that SRQ's CQ with the target QP's number; RDMA WRITE,
// READ and both atomics work through the target; a request naming an SRQ
// of another domain, or no SRQ, completes at the requester with
// REM_INV_REQ_ERR (NAK Invalid Request) and nothing lands. Both framings.
func TestXRC(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			for _, bad := range []uint32{0x300, 0x999} {
				nw := newNetworkMode(t, mode, 4096, 1024)
				na, nb := newNode(t, nw, "10.0.0.1", 1, nil), newNode(t, nw, "10.0.0.2", 1, nil)
				o := defaultOpts()
				oi, ot := o, o
				oi.typ, ot.typ = abi.QPTXRCSend, abi.QPTXRCRecv
				ini := na.newQP(t, 0x11, oi)
				tgt := &tqp{n: nb, qpn: 0x22}
				_, err := nb.eng.CreateQP(QPConfig{QPN: 0x22, SQ: newFakeSQ(1), RQ: newFakeRQ(1), SendCQ: newFakeCQ(1),
					RecvCQ: newFakeCQ(1), Mem: nb.mem, SQDepth: 1, Type: abi.QPTXRCRecv, XRCD: 7})
				require.NoError(t, err)
				s1, s2 := addXRCSRQ(nb, 0x100, 7), addXRCSRQ(nb, 0x200, 7)
				foreign := addXRCSRQ(nb, 0x300, 8)
				connect(t, ini, tgt, o)

				src := na.buffer(4096, 0x10000, abi.AccessLocalWrite, 1)
				dst := nb.buffer(8192, 0x20000, abi.AccessAll, 2)
				require.NoError(t, s1.rq.post(101, dst.sge(0, 3000)))
				require.NoError(t, s2.rq.post(201, dst.sge(4096, 4096)))
				ini.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, RemoteQPN: 0x100}, src.sge(0, 3000))
				ini.send(t, abi.SendWQE{WrID: 2, Opcode: abi.WRSendWithImm, Flags: abi.SendSignaled, ImmData: 0xabcd, RemoteQPN: 0x200}, src.sge(100, 50))
				require.True(t, ini.scq.wait(2, waitFor))
				require.True(t, s1.cq.wait(1, waitFor))
				require.True(t, s2.cq.wait(1, waitFor))
				assert.Equal(t, src.b[:3000], dst.b[:3000])
				assert.Equal(t, src.b[100:150], dst.b[4096:4146])
				assert.Equal(t, []abi.CQE{{WrID: 101, ByteLen: 3000, QPNum: 0x22, Opcode: abi.WCRecv}}, s1.cq.all())
				assert.Equal(t, []abi.CQE{{WrID: 201, ByteLen: 50, QPNum: 0x22, Opcode: abi.WCRecv, WCFlags: abi.WCWithImm, ImmOrInv: 0xabcd}}, s2.cq.all())
				assert.Equal(t, []abi.CQE{{WrID: 1, QPNum: 0x11, Opcode: abi.WCSend}, {WrID: 2, QPNum: 0x11, Opcode: abi.WCSend}}, ini.scq.all())
				assert.Zero(t, foreign.cq.count.Load())

				// One-sided operations through the target (any SRQ of
				// the domain names the PD).
				ini.scq.reset()
				ini.send(t, abi.SendWQE{WrID: 3, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteQPN: 0x100,
					RemoteAddr: dst.va + 5000, RKey: dst.key}, src.sge(0, 2500))
				ini.send(t, abi.SendWQE{WrID: 4, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, RemoteQPN: 0x200,
					RemoteAddr: dst.va + 100, RKey: dst.key}, src.sge(2560, 1500))
				binary.LittleEndian.PutUint64(dst.b[8000:], 40)
				ini.send(t, abi.SendWQE{WrID: 5, Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled, RemoteQPN: 0x100,
					RemoteAddr: dst.va + 8000, RKey: dst.key, CompareAdd: 2}, src.sge(4064, 8))
				require.True(t, ini.scq.wait(3, waitFor))
				assert.Equal(t, src.b[:2500], dst.b[5000:7500])
				assert.Equal(t, dst.b[100:1600], src.b[2560:4060])
				assert.Equal(t, uint64(42), binary.LittleEndian.Uint64(dst.b[8000:]))
				assert.Equal(t, uint64(40), binary.LittleEndian.Uint64(src.b[4064:]))
				assert.Equal(t, []abi.CQE{{WrID: 3, QPNum: 0x11, Opcode: abi.WCRDMAWrite},
					{WrID: 4, QPNum: 0x11, Opcode: abi.WCRDMARead, ByteLen: 1500},
					{WrID: 5, QPNum: 0x11, Opcode: abi.WCFetchAdd}}, ini.scq.all())

				// An SRQ of another domain, or none: invalid request.
				require.NoError(t, foreign.rq.post(301, dst.sge(0, 64)))
				ini.scq.reset()
				ini.send(t, abi.SendWQE{WrID: 6, Opcode: abi.WRSend, Flags: abi.SendSignaled, RemoteQPN: bad}, src.sge(0, 64))
				require.True(t, ini.scq.wait(1, waitFor))
				c := ini.scq.all()[0]
				assert.Equal(t, abi.WCRemInvReqErr, c.Status)
				assert.Equal(t, uint64(6), c.WrID)
				assert.Zero(t, foreign.cq.count.Load(), "nothing lands in another domain's SRQ")
			}
		})
	}
}

// TestXRCOpcodes: XRC requests carry the XRCETH; responses do not.
func TestXRCOpcodes(t *testing.T) {
	assert.True(t, (roce.OpRCSendOnly + roce.XRCOpcodeOffset).Info().Has(roce.HdrXRCETH))
	assert.False(t, (roce.OpRCAck + roce.XRCOpcodeOffset).Info().Has(roce.HdrXRCETH))
}
