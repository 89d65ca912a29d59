package engine

import (
	"bufio"
	"encoding/hex"
	"flag"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

var updateWire = flag.Bool("update-wire", false, "rewrite testdata/gbn_wire.txt from this tree")

// TestNoECEWireUnchanged: without ECE options (any peer that is not vrnic,
// or a vrnic that was not asked), what both ends put on the wire through
// losses is byte for byte what go-back-N vrnic sent before selective
// repeat existed: testdata/gbn_wire.txt was recorded from that tree
// (commit 4c98f41) with this scenario. With selective repeat in force the
// same scenario differs, by selective NAKs and fewer resends.
func TestNoECEWireUnchanged(t *testing.T) {
	got := lossyWireScenario(t, nil)
	if *updateWire {
		require.NoError(t, os.WriteFile("testdata/gbn_wire.txt", []byte(strings.Join(got, "\n")+"\n"), 0o644))
	}
	f, err := os.Open("testdata/gbn_wire.txt")
	require.NoError(t, err)
	defer f.Close()
	var want []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		want = append(want, sc.Text())
	}
	require.NoError(t, sc.Err())
	require.Equal(t, len(want), len(got), "frames on the wire")
	for i := range want {
		require.Equal(t, want[i], got[i], "frame %d", i)
	}

	sr := lossyWireScenario(t, func(o *qpOpts) { o.ece = abi.ECEOptions })
	assert.Less(t, len(sr), len(got), "selective repeat resends less")
	var snaks int
	for _, l := range sr {
		if !strings.HasPrefix(l, "b ") {
			continue
		}
		b, err := hex.DecodeString(l[2:])
		require.NoError(t, err)
		var p roce.Packet
		require.NoError(t, roce.Parse(b, &p))
		if p.AETH != nil && p.AETH.Syndrome().Kind() == roce.SyndromeNAK && p.AETH.Syndrome().NAK() == nakSelective {
			snaks++
		}
	}
	assert.NotZero(t, snaks, "selective NAKs with the option in force")
}

// wireTap records every frame a worker hands to its link (on a's side
// including those its dropLink then loses).
type wireTap struct {
	Link
	frames [][]byte
}

func (l *wireTap) SendBatch(f [][]byte, peers []netip.AddrPort) (int, error) {
	// Copied before: the link may take the buffers and hand back others.
	k := len(l.frames)
	for _, b := range f {
		l.frames = append(l.frames, append([]byte(nil), b...))
	}
	n, err := l.Link.SendBatch(f, peers)
	l.frames = l.frames[:k+max(n, 0)]
	return n, err
}

// lossyWireScenario runs, in lockstep (deterministic: one goroutine
// drives both workers a pass at a time, no timer fires), a mix of SENDs,
// WRITEs, a READ and an atomic from a to b while a's link loses the frames
// at the indexes lost picks, and returns every frame each side put on the
// wire, one hex line each.
func lossyWireScenario(t *testing.T, setECE func(*qpOpts)) []string {
	lost := map[int64]bool{3: true, 9: true, 10: true, 17: true}
	var tapA, tapB *wireTap
	nw := newNetworkMode(t, roce.ModeEthernet, 256, 256)
	na := newNodeStart(t, nw, "10.0.0.1", 1, nil, func(l Link) Link {
		tapA = &wireTap{Link: &dropLink{Link: l, drop: func(i int64) bool { return lost[i] }}}
		return tapA
	}, false)
	nb := newNodeStart(t, nw, "10.0.0.2", 1, nil, func(l Link) Link { tapB = &wireTap{Link: l}; return tapB }, false)
	o := defaultOpts()
	o.timeout = 20 // 4 s: no timer fires
	if setECE != nil {
		setECE(&o)
	}
	a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
	connect(t, a, b, o)
	a.w().pass()
	b.w().pass()
	src := na.buffer(20000, 0x100000, abi.AccessAll, 1)
	dst := nb.buffer(20000, 0x200000, abi.AccessAll, 2)
	rbuf := na.buffer(3000, 0x300000, abi.AccessAll, 3)
	ctr := nb.buffer(8, 0x400000, abi.AccessAll, 0)
	old := na.buffer(8, 0x500000, abi.AccessAll, 0)
	for i := range 4 { // three SENDs and the WRITE with immediate
		b.recv(t, uint64(100+i), dst.sge(i*3000, 3000))
	}
	post := func(w abi.SendWQE, sges ...abi.SGE) { require.NoError(t, a.sq.post(w, sges, nil)) }
	post(abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(0, 3000))
	post(abi.SendWQE{WrID: 2, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va + 10000, RKey: dst.key}, src.sge(0, 9000))
	post(abi.SendWQE{WrID: 3, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(3000, 3000))
	post(abi.SendWQE{WrID: 4, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, rbuf.sge(0, 3000))
	post(abi.SendWQE{WrID: 5, Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled, RemoteAddr: ctr.va, RKey: ctr.key, CompareAdd: 3}, old.sge(0, 8))
	post(abi.SendWQE{WrID: 6, Opcode: abi.WRRDMAWriteWithImm, Flags: abi.SendSignaled, RemoteAddr: dst.va + 19000, RKey: dst.key, ImmData: 7}, src.sge(0, 1000))
	post(abi.SendWQE{WrID: 7, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(6000, 100))
	a.n.eng.Kick(a.qpn)
	var ta, tb time.Duration
	lockstep(a, b, &ta, &tb, func() bool { return a.scq.count.Load() >= 7 })
	for _, c := range a.scq.all() {
		require.Equal(t, abi.WCSuccess, c.Status, "WR %d", c.WrID)
	}
	var out []string
	for _, f := range tapA.frames {
		out = append(out, "a "+hex.EncodeToString(f))
	}
	for _, f := range tapB.frames {
		out = append(out, "b "+hex.EncodeToString(f))
	}
	return out
}
