package tap

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/roce"
)

const (
	workers = 4
	numQPs  = 64
	bigMsg  = 1 << 20
)

var matrixMTUs = []int{256, 1024, 4096}

// The daemons' GID 0 addresses.
const (
	addrA = "10.77.0.1"
	addrB = "10.77.0.2"
)

// report parses a client's report line.
func report(t *testing.T, p *proc) clientReport {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(p.out.String()), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var r clientReport
		if strings.HasPrefix(lines[i], "{") && json.Unmarshal([]byte(lines[i]), &r) == nil && len(r.QPs) > 0 {
			return r
		}
	}
	require.FailNow(t, "no client report", "%s", p.out)
	return clientReport{}
}

// TestTwoDaemonsOverTAP: two vrnicd with -link tap in two namespaces
// joined by a bridge (package doc); client a runs SEND, SEND with
// immediate, RDMA WRITE, WRITE with immediate and RDMA READ of sizes 0,
// 1, MTU-1, MTU, MTU+1 and 1 MiB on QPs of path MTU 256, 1024 and 4096,
// compare-and-swap and fetch-and-add, then one WRITE and one SEND on
// each of 64 QPs; client b checks every byte, length, immediate and
// atomic word. Then:
//   - the steering counters of each daemon equal, queue by queue, the
//     frames its link delivered on that queue and the frames the QPs
//     that queue's worker owns received; no frame reached another queue;
//   - every RoCE frame captured on a bridge port (segmented packets cut as
//     the kernel cuts them for a wire: vnetCapture) has a valid ICRC, tshark
//     decodes all of them as RoCE v2 (InfiniBand over UDP) without
//     malformed packets, and the request and response opcodes of each
//     op-matrix QP follow the expected sequence exactly.
func TestTwoDaemonsOverTAP(t *testing.T) {
	tp := newTopo(t)
	da := tp.startDaemon(t, tp.nsA, "ta", "vta", workers, nil, addrA+"/24", "fd77::1/64")
	db := tp.startDaemon(t, tp.nsB, "tb", "vtb", workers, nil, addrB+"/24", "fd77::2/64")
	// The capture on bridge port vta: as captured (segmented packets
	// whole) and as a wire carries it (segmented packets cut), which the
	// checks read (vnetCapture).
	rawPcap, pcap := filepath.Join(tp.dir, "vta-raw.pcap"), filepath.Join(tp.dir, "vta.pcap")
	capture := startVnetCapture(t, tp.nsBr, "vta", rawPcap, pcap)

	rel := filepath.Join(tp.dir, "relay.sock")
	relay(t, rel)
	args := clientArgs{Relay: rel, QPs: numQPs, MTUs: matrixMTUs, Big: bigMsg}
	aArgs, bArgs := args, args
	aArgs.Role, aArgs.Socket = "a", da.sock
	bArgs.Role, bArgs.Socket = "b", db.sock
	cb := startClient(t, bArgs)
	ca := startClient(t, aArgs)
	require.NoError(t, ca.wait(3*time.Minute), "client a:\n%s\nclient b:\n%s\nvrnicd ta:\n%s\nvrnicd tb:\n%s", ca.out, cb.out, da.proc.out, db.proc.out)
	require.NoError(t, cb.wait(30*time.Second), "client b:\n%s", cb.out)
	ra, rb := report(t, ca), report(t, cb)
	t.Logf("client a: %d operations on %d QPs", ra.Ops, len(ra.QPs))

	t.Run("steering", func(t *testing.T) {
		for _, x := range []struct {
			d   *daemon
			rep clientReport
		}{{da, ra}, {db, rb}} {
			st := linkStats(t, x.d)
			require.Len(t, st.Queues, workers)
			assert.Equal(t, "uso", st.Offload, "%s: the TAP offload is on", x.d.name)
			owned := make([]uint64, workers)
			for _, q := range x.rep.QPs {
				owned[roce.SteerQueue(q.QPN, workers)] += q.Rx
			}
			// Frames the kernel dropped because a queue was full (the
			// daemon did not read fast enough) were steered but never
			// read: they count in the interface's TX drops (with the
			// filter program's drops).
			dropped := tp.txDropped(t, x.d.ifname)
			var lost uint64
			for q, s := range st.Queues {
				assert.Equal(t, owned[q], s.RxFrames, "%s queue %d: RoCE frames the link read here = frames received by the QPs its worker owns", x.d.name, q)
				assert.Zero(t, s.RxMisqueued, "%s queue %d: no frame for another queue's QP", x.d.name, q)
				assert.NotZero(t, s.RxFrames, "%s queue %d: 64 QPs give every queue traffic", x.d.name, q)
				assert.Zero(t, s.TxErrors, "%s queue %d", x.d.name, q)
				assert.Zero(t, s.RxBad, "%s queue %d: no bad segmented packet", x.d.name, q)
				// The steering program runs once per packet: a
				// segmented packet (RxGSO of them, cut into
				// RxGSOFrames frames) counts once.
				packets := s.RxFrames - s.RxGSOFrames + s.RxGSO
				if dropped == 0 {
					assert.Equal(t, s.Steered, packets, "%s queue %d: packets steered here = RoCE packets the link read here", x.d.name, q)
				}
				assert.GreaterOrEqual(t, s.Steered, packets, "%s queue %d", x.d.name, q)
				lost += s.Steered - packets
			}
			assert.LessOrEqual(t, lost, dropped, "%s: steered frames not read were dropped by the kernel", x.d.name)
			if dropped > 0 {
				t.Logf("%s: %d frames dropped on the way to the daemon (filter verdicts, full queues)", x.d.name, dropped)
			}
			assert.NotZero(t, st.Filter["pass_arp"], "%s: ARP went through the filter", x.d.name)
			assert.NotZero(t, st.Filter["pass_nd"], "%s: neighbour discovery went through the filter", x.d.name)
			assert.NotZero(t, st.Filter["pass_roce_v4"], "%s: RoCE over IPv4", x.d.name)
			assert.NotZero(t, st.Filter["pass_roce_v6"], "%s: RoCE over IPv6", x.d.name)
			t.Logf("%s: steered %v, non-RoCE %d, filter %v", x.d.name, steered(st), st.SteerNonRoCE, st.Filter)
		}
	})

	// Let the capture drain: stop when the file stopped growing.
	for last, i := int64(-1), 0; i < 50; i++ {
		fi, err := os.Stat(pcap)
		if err == nil && fi.Size() == last {
			break
		}
		if err == nil {
			last = fi.Size()
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(t, capture.stop(), "capture")
	packets, gso, segs := capture.counts()
	t.Logf("capture on vta: %d packets, %d of them segmented (%d frames)", packets, gso, segs)
	assert.NotZero(t, gso, "the daemons wrote segmented packets (the TAP offload is on)")
	dropped := tp.txDropped(t, da.ifname)
	if !t.Run("capture", func(t *testing.T) { checkCapture(t, pcap, ra, rb, dropped) }) {
		for _, f := range []string{pcap, rawPcap} {
			keep := filepath.Join(os.TempDir(), tp.pfx+"-"+filepath.Base(f))
			if b, err := os.ReadFile(f); err == nil && os.WriteFile(keep, b, 0o644) == nil {
				t.Logf("capture kept in %s", keep)
			}
		}
	}
}

func steered(st linkJSON) []uint64 {
	var out []uint64
	for _, q := range st.Queues {
		out = append(out, q.Steered)
	}
	return out
}

// ignoreSignal treats an exit by the signal the test sent as success.
func ignoreSignal(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return nil
		}
	}
	return err
}

// checkCapture verifies the pcap of bridge port vta (both directions of
// daemon A's traffic).
func checkCapture(t *testing.T, file string, ra, rb clientReport, dropped uint64) {
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	pr, err := roce.NewPcapReader(f)
	require.NoError(t, err)
	var pkt roce.Packet
	roceFrames := 0
	for {
		_, data, err := pr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if !isRoCE(data) {
			continue
		}
		roceFrames++
		require.NoError(t, roce.Parse(data, &pkt), "captured frame %d: a valid RoCE v2 frame (ICRC checked)", roceFrames)
	}
	require.NotZero(t, roceFrames)
	// Every frame of daemon A's QPs crossed vta: what they sent and what
	// they received.
	var sum uint64
	for _, q := range ra.QPs {
		sum += q.Tx + q.Rx
	}
	if dropped == 0 {
		assert.EqualValues(t, sum, roceFrames, "captured RoCE frames = frames sent and received by daemon A's QPs")
	} else { // captured on the port, then dropped at a full queue
		assert.LessOrEqual(t, uint64(roceFrames), sum+dropped, "captured RoCE frames: sent, received or dropped at vta")
	}

	// tshark: everything on UDP 4791 is decoded as InfiniBand (RoCE v2),
	// nothing is malformed.
	count := func(filter string) int {
		out, err := exec.Command("tshark", "-r", file, "-Y", filter, "-T", "fields", "-e", "frame.number").Output()
		require.NoError(t, err, "tshark -Y %s", filter)
		return len(strings.Fields(string(out)))
	}
	assert.Equal(t, roceFrames, count("udp.dstport == 4791"))
	assert.Equal(t, roceFrames, count("infiniband.bth.opcode"), "tshark decodes every RoCE frame")
	// Wireshark hands the payload of a SEND or WRITE to heuristic payload
	// dissectors (RPC over RDMA, raw Ethernet types, ...), which call
	// random test data malformed; the RoCE headers themselves must not be.
	out, err := exec.Command("tshark", "-r", file, "-Y", "_ws.malformed || _ws.expert.severity >= error", "-T", "fields",
		"-e", "frame.number", "-e", "frame.protocols").Output()
	require.NoError(t, err)
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l == "" {
			continue
		}
		_, protos, _ := strings.Cut(l, "\t")
		_, payload, ok := strings.Cut(protos, ":infiniband:")
		assert.True(t, ok && payload != "", "frame %s: an error in the RoCE headers (protocols %s)", l, protos)
	}

	out, err = exec.Command("tshark", "-r", file, "-Y", "infiniband.bth.opcode", "-T", "fields", "-E", "separator=,",
		"-e", "ip.dst", "-e", "infiniband.bth.destqp", "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.psn").Output()
	require.NoError(t, err)
	// Both daemons number their QPs alike: a QP is its address and QPN.
	type qpKey struct {
		dst string
		qp  uint64
	}
	type key struct {
		qpKey
		psn uint64
	}
	seen := map[key]bool{}
	byQP := map[qpKey][]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fs := strings.Split(l, ",")
		require.Len(t, fs, 4, l)
		qp, err1 := strconv.ParseUint(strings.TrimPrefix(fs[1], "0x"), 16, 32)
		op, err2 := strconv.ParseUint(fs[2], 10, 8)
		psn, err3 := strconv.ParseUint(fs[3], 10, 32)
		require.NoError(t, errors.Join(err1, err2, err3), l)
		k := key{qpKey{fs[0], qp}, psn}
		if seen[k] && op != uint64(roce.OpRCAck) {
			continue // a retransmission: the sequence is of first transmissions
		}
		seen[k] = true
		byQP[k.qpKey] = append(byQP[k.qpKey], int(op))
	}
	for i, mtu := range matrixMTUs {
		req, resp := expectedOpcodes(i, mtu)
		gotReq := byQP[qpKey{addrB, uint64(rb.QPs[i].QPN)}]
		var gotResp []int
		for _, op := range byQP[qpKey{addrA, uint64(ra.QPs[i].QPN)}] {
			if op != int(roce.OpRCAck) {
				gotResp = append(gotResp, op)
			}
		}
		if ra.QPs[i].Retrans+rb.QPs[i].Retrans == 0 {
			assert.Equal(t, req, gotReq, "QP %d (MTU %d): request opcodes a → b", i, mtu)
			assert.Equal(t, resp, gotResp, "QP %d (MTU %d): read responses and atomic ACKs b → a", i, mtu)
			continue
		}
		// Retransmitted READ requests restart at the first missing
		// response (a new PSN): the expected sequence is then a
		// subsequence of what crossed the wire.
		t.Logf("QP %d: %d+%d retransmissions", i, ra.QPs[i].Retrans, rb.QPs[i].Retrans)
		assert.True(t, isSubsequence(req, gotReq), "QP %d (MTU %d): request opcodes a → b (with retransmissions)", i, mtu)
		assert.True(t, isSubsequence(resp, gotResp), "QP %d (MTU %d): responses b → a (with retransmissions)", i, mtu)
	}
}

// expectedOpcodes returns the requests client a sends on an op-matrix QP
// of path MTU mtu and the responses other than plain ACKs it gets back,
// in order (see client.requester and client.everyQP).
func expectedOpcodes(qp, mtu int) (req, resp []int) {
	seg := func(n int, first, middle, last, only roce.Opcode) []int {
		k := max(1, (n+mtu-1)/mtu)
		if k == 1 {
			return []int{int(only)}
		}
		out := []int{int(first)}
		for range k - 2 {
			out = append(out, int(middle))
		}
		return append(out, int(last))
	}
	for _, n := range []int{0, 1, mtu - 1, mtu, mtu + 1, bigMsg} {
		req = append(req, seg(n, roce.OpRCSendFirst, roce.OpRCSendMiddle, roce.OpRCSendLast, roce.OpRCSendOnly)...)
		req = append(req, seg(n, roce.OpRCSendFirst, roce.OpRCSendMiddle, roce.OpRCSendLastImm, roce.OpRCSendOnlyImm)...)
		req = append(req, seg(n, roce.OpRCWriteFirst, roce.OpRCWriteMiddle, roce.OpRCWriteLast, roce.OpRCWriteOnly)...)
		req = append(req, seg(n, roce.OpRCWriteFirst, roce.OpRCWriteMiddle, roce.OpRCWriteLastImm, roce.OpRCWriteOnlyImm)...)
		req = append(req, int(roce.OpRCReadRequest))
		resp = append(resp, seg(n, roce.OpRCReadResponseFirst, roce.OpRCReadResponseMiddle, roce.OpRCReadResponseLast, roce.OpRCReadResponseOnly)...)
	}
	req = append(req, int(roce.OpRCCompareSwap), int(roce.OpRCCompareSwap), int(roce.OpRCFetchAdd), int(roce.OpRCFetchAdd))
	resp = append(resp, int(roce.OpRCAtomicAck), int(roce.OpRCAtomicAck), int(roce.OpRCAtomicAck), int(roce.OpRCAtomicAck))
	// Phase 2: one WRITE and one 64-byte SEND per QP.
	req = append(req, seg(1+(qp*997)%8192, roce.OpRCWriteFirst, roce.OpRCWriteMiddle, roce.OpRCWriteLast, roce.OpRCWriteOnly)...)
	req = append(req, seg(64, roce.OpRCSendFirst, roce.OpRCSendMiddle, roce.OpRCSendLast, roce.OpRCSendOnly)...)
	return req, resp
}

// isRoCE tells whether an Ethernet frame is IPv4/IPv6 UDP to port 4791.
func isRoCE(f []byte) bool {
	eth := roce.Ethernet(f)
	if !eth.IsValid() {
		return false
	}
	ip := f[eth.HeaderLen():]
	switch eth.Type() {
	case roce.EtherTypeIPv4:
		h := roce.IPv4(ip)
		return h.IsValid() && h.Protocol() == roce.ProtocolUDP && len(ip) >= h.HeaderLen()+roce.UDPHeaderLen &&
			roce.UDP(ip[h.HeaderLen():]).DstPort() == roce.UDPPort
	case roce.EtherTypeIPv6:
		h := roce.IPv6(ip)
		return h.IsValid() && h.NextHeader() == roce.ProtocolUDP && len(ip) >= roce.IPv6HeaderLen+roce.UDPHeaderLen &&
			roce.UDP(ip[roce.IPv6HeaderLen:]).DstPort() == roce.UDPPort
	}
	return false
}

// isSubsequence tells whether want appears in got in order (with other
// elements in between).
func isSubsequence(want, got []int) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && want[i] == g {
			i++
		}
	}
	return i == len(want)
}
