package dataplane

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/capture"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/roce"
)

// TestCNPDecodesInTshark: two daemons with congestion control (-cc
// dcqcn); a fault rule on the first marks its RDMA WRITE packets CE (the
// BTH FECN bit: on the UDP link the kernel writes the IP header), so the
// second answers with a Congestion Notification Packet. vrnicctl capture
// on the first records it, and tshark decodes it as the RoCE v2 annex
// defines it: BTH opcode 0x81, BECN set, PSN 0, the first daemon's QP
// as destination, 16 zero bytes before the ICRC, no malformed field;
// its ICRC verifies. The first daemon's
// counters show the CNP received.
func TestCNPDecodesInTshark(t *testing.T) {
	gcc := testenv.NeedTool(t, "gcc")
	tshark := testenv.NeedTool(t, "tshark")
	cl := filepath.Join(t.TempDir(), "rc_ops")
	out, err := exec.Command(gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I", "../../abi", "-o", cl, "../../examples/rc_ops.c").CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)
	la, lb, err := launch.LoopbackPair(ownLoopback(44, 31), ownLoopback(44, 32))
	require.NoError(t, err)
	a := startDaemon(t, "cnp0", "-link", "udp", "-workers", "1", "-local", la.String()+":4791", "-cc", "dcqcn")
	b := startDaemon(t, "cnp1", "-link", "udp", "-workers", "1", "-local", lb.String()+":4791", "-cc", "dcqcn")
	ctl := func(args ...string) string {
		out, err := exec.Command(filepath.Join(bin, "vrnicctl"), append([]string{"-s", a.socket}, args...)...).CombinedOutput()
		require.NoError(t, err, "vrnicctl %v: %s", args, out)
		return string(out)
	}
	ctl("fault", "add", "dir=tx", "op=write", "action=ecn")

	file := filepath.Join(t.TempDir(), "a.pcapng")
	cap := exec.Command(filepath.Join(bin, "vrnicctl"), "-s", a.socket, "-w", file, "-t", "4s", "-c", "1000", "capture")
	capErr := &launch.Buffer{}
	cap.Stderr = capErr
	require.NoError(t, cap.Start())
	t.Cleanup(func() {
		if cap.ProcessState == nil {
			cap.Process.Kill()
			cap.Wait()
		}
	})
	require.Eventually(t, func() bool { return strings.Contains(a.logs.String(), "capture started") },
		10*time.Second, 5*time.Millisecond, "the capture did not start")
	out, err = exec.Command(cl, a.socket, b.socket).CombinedOutput()
	require.NoError(t, err, "rc_ops: %s", out)
	// The CNPs have arrived once a's counters say so (one per marked
	// WRITE packet: they are far apart in time); the capture ends
	// after its 4 s.
	var info admin.Info
	require.Eventually(t, func() bool {
		require.NoError(t, json.Unmarshal([]byte(ctl("-json", "info")), &info))
		return info.Wire.CNPsReceived > 0 && info.Wire.CNPsReceived == info.DataPath.CNPsReceived
	}, 10*time.Second, 10*time.Millisecond, "a CNP reached the first daemon")
	assert.Equal(t, "dcqcn", info.CongestionControl)
	assert.Zero(t, info.Wire.CNPsIgnored)
	require.NoError(t, cap.Wait(), "vrnicctl capture (4 s): %s", capErr.String())

	cmd := exec.Command(tshark, "-r", file, "-Y", "infiniband.bth.opcode == 0x81", "-T", "fields",
		"-e", "frame.protocols", "-e", "_ws.malformed", "-e", "infiniband.bth.opcode", "-e", "infiniband.reserved",
		"-e", "infiniband.vendor", "-e", "infiniband.bth.destqp", "-e", "infiniband.bth.psn", "-e", "ip.src", "-e", "_ws.col.Info")
	var tsErr bytes.Buffer
	cmd.Stderr = &tsErr
	dec, err := cmd.Output()
	require.NoError(t, err, "%s%s", dec, tsErr.String())
	lines := strings.Split(strings.TrimRight(string(dec), "\n"), "\n")
	require.Len(t, lines, int(info.Wire.CNPsReceived), "the CNPs the daemon counted: %q", dec)
	col := strings.Split(lines[0], "\t")
	require.Len(t, col, 9, "%q", lines[0])
	t.Logf("tshark: %s", lines[0])
	assert.Contains(t, col[0], "udp:infiniband")
	assert.Empty(t, col[1], "malformed")
	assert.Equal(t, "129", col[2], "opcode 0x81")
	// tshark 4.0 knows no CNP: it names the opcode "Unknown (129)", shows
	// the FECN/BECN byte as "Reserved" and the 16 reserved bytes and the
	// ICRC as unknown data. 0x40 is BECN alone.
	assert.Equal(t, "40", col[3], "the BTH byte of FECN and BECN: BECN set, FECN clear")
	vend := strings.Split(col[4], ",")
	data := strings.ReplaceAll(vend[len(vend)-1], ":", "")
	require.Len(t, data, 2*(16+roce.ICRCLen), "16 reserved bytes and the ICRC: %q", col[4])
	assert.Equal(t, strings.Repeat("00", 16), data[:32], "reserved bytes zero")
	assert.Equal(t, "0", col[6], "PSN 0")
	assert.Equal(t, lb.String(), col[7], "from the second daemon")
	qpn, err := strconv.ParseUint(col[5], 0, 32)
	require.NoError(t, err, "%q", col[5])

	// The destination is the first daemon's QP: the one the second
	// daemon's ACKs go to. Every frame's ICRC verifies.
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	fs, err := capture.ReadFrames(raw)
	require.NoError(t, err)
	cnps, acked := 0, map[uint32]bool{}
	for _, f := range fs {
		var p roce.Packet
		require.NoError(t, roce.Parse(f.Data, &p))
		if p.Info.Flags&roce.OpAck != 0 && p.Src() == lb {
			acked[p.BTH.DestQP()] = true
		}
		if p.BTH.Opcode() == roce.OpCNP {
			cnps++
			assert.True(t, p.BTH.BECN())
			assert.Equal(t, uint32(qpn), p.BTH.DestQP())
			assert.Len(t, p.Payload, 0)
		}
	}
	assert.Equal(t, int(info.Wire.CNPsReceived), cnps)
	assert.True(t, acked[uint32(qpn)], "the CNP goes to the QP the ACKs go to (%#x; ACKed %v)", qpn, acked)
}

// ownLoopback is 127.0.x.y.
func ownLoopback(x, y byte) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, x, y}) }
