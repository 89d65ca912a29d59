package hostile

// Impersonation probe: forged RDMA WRITEs into another client's memory
// over its live RC connection. RoCE has no authentication: a responder
// takes a request because it comes from the QP's path with the PSN it
// expects. The victim here is an RC connection between a client of daemon
// D and a client of daemon E, WRITE and READ traffic with every byte
// checked. The attacker is given everything it could guess or learn (the
// victim's QPN on D, the PSN D expects next, the rkey and address of the
// victim's MR) and tries from three places:
//
//   - a second context on E, the victim's peer daemon (a shared daemon
//     must not let it claim the connection E's victim QP holds);
//   - a daemon of its own on E's address but another UDP port (another
//     process on the peer host: D must check the peer daemon's port);
//   - a daemon of its own on a third address (an off-path host: D drops
//     requests that do not come from the QP's path).
//
// After each attempt the victim's memory must hold exactly what the victim
// wrote, and its connection must go on working.
//
// No root needed: three daemons with UDP links on loopback addresses.

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/rcpair"
	"github.com/vrnic/vrnic/verbs"
)

// udpDaemon is a vrnicd with a UDP link, as the process of this test.
type udpDaemon struct {
	proc   *launch.Proc
	socket string
	local  netip.AddrPort
	log    *launch.Buffer
}

// startUDPDaemon starts vrnicd name with its UDP link on local.
func startUDPDaemon(t *testing.T, rundir, name string, local netip.AddrPort) *udpDaemon {
	t.Helper()
	d := &udpDaemon{socket: admin.SocketPath(rundir, name), local: local, log: &launch.Buffer{}}
	p, err := launch.Start(launch.Spec{Name: name, Bin: vrnicdBinary(t), Stderr: d.log,
		Args: []string{"-name", name, "-runtime-dir", rundir, "-link", "udp", "-local", local.String(), "-workers", "1"}})
	require.NoError(t, err)
	d.proc = p
	t.Cleanup(func() {
		if err := p.Stop(0, 5*time.Second); err != nil {
			t.Errorf("vrnicd %s: %v\n%s", name, err, d.log)
		}
	})
	require.NoError(t, launch.WaitReady(context.Background(), p, d.socket, 10*time.Second), "%s", d.log)
	return d
}

// rcEnd is one end of an RC connection: a context, its QP, CQ and an MR
// over a buffer.
type rcEnd struct {
	c   *verbs.Context
	qp  *verbs.QP
	cq  *verbs.CQ
	buf *verbs.Buffer
	mr  *verbs.MR
	gid [16]byte
	wc  []abi.CQE
	seq uint64
}

const impBytes = 16 << 10

func newRCEnd(t *testing.T, socket, name string) *rcEnd {
	t.Helper()
	e := &rcEnd{wc: make([]abi.CQE, 16)}
	var err error
	e.c, err = verbs.Open(socket, verbs.WithClientName(name))
	require.NoError(t, err)
	t.Cleanup(func() { e.c.Close() })
	pd, err := e.c.AllocPD()
	require.NoError(t, err)
	e.cq, err = e.c.CreateCQ(64, nil)
	require.NoError(t, err)
	e.qp, err = pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: abi.QPCap{MaxSendWR: 64, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	e.buf, err = e.c.Alloc(2*impBytes, 4096)
	require.NoError(t, err)
	e.mr, err = pd.RegMR(e.buf, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead)
	require.NoError(t, err)
	g, err := e.c.QueryGID(1, 0)
	require.NoError(t, err)
	e.gid = g.GID
	return e
}

// post posts one signaled WR and waits for its completion's status.
func (e *rcEnd) post(wr verbs.SendWR, within time.Duration) (abi.WCStatus, error) {
	e.seq++
	wr.WrID, wr.Flags = e.seq, wr.Flags|abi.SendSignaled
	if err := e.qp.PostSend(&wr); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		n := e.cq.Poll(e.wc)
		for _, c := range e.wc[:n] {
			if c.WrID == e.seq {
				return c.Status, nil
			}
		}
		if n == 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
	return 0, fmt.Errorf("no completion for WR %d in %v", e.seq, within)
}

// impVictim is the victim's connection: src on E writes into tgt on D and
// reads it back; want is what tgt's first impBytes must hold. psn is the
// PSN D's QP expects next (the victim counts its packets: every WRITE and
// READ is one MTU or less, one PSN each).
type impVictim struct {
	src, tgt *rcEnd
	want     []byte
	psn      uint32
	round    int
}

const impMTU = 1024

// step writes a fresh pattern into the victim's MR on D, 1 KiB per WRITE,
// reads it back, and checks both ends' bytes.
func (v *impVictim) step(t *testing.T) {
	t.Helper()
	v.round++
	src := v.src.buf.Bytes[:impBytes]
	for i := range src {
		src[i] = byte(v.round*31 + i*7)
	}
	for off := 0; off < impBytes; off += impMTU {
		st, err := v.src.post(verbs.SendWR{Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{v.src.mr.SGE(uint32(off), impMTU)},
			RemoteAddr: v.tgt.mr.Addr + uint64(off), RKey: v.tgt.mr.RKey}, 10*time.Second)
		require.NoError(t, err, "victim round %d: WRITE at %d", v.round, off)
		require.Equal(t, abi.WCSuccess, st, "victim round %d: WRITE at %d", v.round, off)
		v.psn++
	}
	copy(v.want, src)
	require.True(t, bytes.Equal(v.tgt.buf.Bytes[:impBytes], v.want), "victim round %d: its MR on D holds other bytes than it wrote", v.round)
	back := v.src.buf.Bytes[impBytes : impBytes+impMTU]
	clear(back)
	st, err := v.src.post(verbs.SendWR{Opcode: abi.WRRDMARead, SGL: []abi.SGE{v.src.mr.SGE(impBytes, impMTU)},
		RemoteAddr: v.tgt.mr.Addr, RKey: v.tgt.mr.RKey}, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, abi.WCSuccess, st, "victim round %d: READ", v.round)
	v.psn++
	require.True(t, bytes.Equal(back, v.want[:impMTU]), "victim round %d: READ returned other bytes", v.round)
}

// checkIntact: the victim's MR on D holds what the victim wrote.
func (v *impVictim) checkIntact(t *testing.T, after string) {
	t.Helper()
	if !bytes.Equal(v.tgt.buf.Bytes[:impBytes], v.want) {
		n := 0
		for i := range v.want {
			if v.tgt.buf.Bytes[i] != v.want[i] {
				n++
			}
		}
		t.Fatalf("after %s: %d bytes of the victim's MR on D were overwritten", after, n)
	}
}

// forge connects a QP of a (a client of some daemon) to the victim's QP on
// D, sending from the PSN D expects, with a short ACK timeout and one
// retry, and posts 8 RDMA WRITEs of garbage at the victim's MR with its
// rkey. It returns the error of the move to RTR, or the statuses.
func (v *impVictim) forge(t *testing.T, a *rcEnd) (error, []abi.WCStatus) {
	t.Helper()
	require.NoError(t, a.qp.ToInit(abi.AccessAll, 0))
	err := a.qp.ToRTR(verbs.RTRAttr{AV: abi.AHAttr{DGID: v.tgt.gid, HopLimit: 64, PortNum: 1},
		PathMTU: abi.MTU1024, DestQPN: v.tgt.qp.QPN, RQPSN: 7, MaxDestRdAtomic: 1, MinRNRTimer: 1})
	if err != nil {
		return err, nil
	}
	require.NoError(t, a.qp.ToRTS(verbs.RTSAttr{SQPSN: v.psn, Timeout: 8, RetryCnt: 1, RNRRetry: 1, MaxRdAtomic: 1}))
	garbage := a.buf.Bytes[:impMTU]
	for i := range garbage {
		garbage[i] = 0xA5
	}
	var sts []abi.WCStatus
	for i := range 8 {
		st, err := a.post(verbs.SendWR{Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{a.mr.SGE(0, impMTU)},
			RemoteAddr: v.tgt.mr.Addr + uint64(i*impMTU), RKey: v.tgt.mr.RKey}, 20*time.Second)
		require.NoError(t, err)
		sts = append(sts, st)
		if st != abi.WCSuccess {
			break
		}
	}
	return nil, sts
}

func TestImpersonateConnection(t *testing.T) {
	rundir := t.TempDir()
	addrs := make([]netip.Addr, 3)
	for i := range addrs {
		a, err := launch.FreeLoopback()
		require.NoError(t, err)
		addrs[i] = a
	}
	port := func(a netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(a, p) }
	dD := startUDPDaemon(t, rundir, "impD", port(addrs[0], launch.RoCEPort))
	dE := startUDPDaemon(t, rundir, "impE", port(addrs[1], launch.RoCEPort))

	v := &impVictim{want: make([]byte, impBytes)}
	v.tgt, v.src = newRCEnd(t, dD.socket, "victim-d"), newRCEnd(t, dE.socket, "victim-e")
	const psnD, psnE = 3000, 9000
	attr := rcpair.Attr{MTU: abi.MTU1024, MaxRdAtomic: 1}
	require.NoError(t, rcpair.Connect(v.tgt.qp, psnD, rcpair.Local(v.src.qp, psnE, v.src.gid, v.src.mr), attr))
	require.NoError(t, rcpair.Connect(v.src.qp, psnE, rcpair.Local(v.tgt.qp, psnD, v.tgt.gid, v.tgt.mr), attr))
	v.psn = psnE
	v.step(t)

	t.Run("second context on the peer daemon", func(t *testing.T) {
		a := newRCEnd(t, dE.socket, "attacker")
		err, sts := v.forge(t, a)
		require.Error(t, err, "a second QP of daemon E claimed the connection E's victim QP holds (forged WRITEs: %v)", sts)
		assert.ErrorIs(t, err, syscall.EADDRINUSE)
		assert.Contains(t, err.Error(), fmt.Sprintf("remote QP %#x at %v", v.tgt.qp.QPN, dD.local.Addr()), "the error names the remote QP")
		v.checkIntact(t, "the attempt through daemon E")
		v.step(t)
	})
	t.Run("daemon on the peer's address, other port", func(t *testing.T) {
		dX := startUDPDaemon(t, rundir, "impX", port(addrs[1], launch.RoCEPort+1))
		a := newRCEnd(t, dX.socket, "attacker")
		err, sts := v.forge(t, a)
		require.NoError(t, err)
		assert.NotEqual(t, abi.WCSuccess, sts[0], "D acknowledged a forged WRITE from E's address but another port")
		v.checkIntact(t, "forged WRITEs from E's address, port 4792")
		v.step(t)
	})
	t.Run("daemon on another address", func(t *testing.T) {
		dF := startUDPDaemon(t, rundir, "impF", port(addrs[2], launch.RoCEPort))
		a := newRCEnd(t, dF.socket, "attacker")
		err, sts := v.forge(t, a)
		require.NoError(t, err)
		assert.NotEqual(t, abi.WCSuccess, sts[0], "D acknowledged a forged WRITE from an address off the QP's path")
		v.checkIntact(t, "forged WRITEs from a third address")
		v.step(t)
	})
	for _, d := range []*udpDaemon{dD, dE} {
		if !d.proc.Running() {
			t.Fatalf("vrnicd exited: %v\n%s", d.proc.Err(), d.log)
		}
	}
}
