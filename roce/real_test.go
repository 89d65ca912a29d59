package roce

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// realFrame is one frame of the real-traffic vectors.
type realFrame struct {
	name  string
	frame []byte
}

// loadRxeFrames returns the Ethernet frames of every rxe capture,
// including the non-RoCE ones (ARP, TCP).
func loadRxeFrames(t testing.TB) []realFrame {
	t.Helper()
	files, err := filepath.Glob("testdata/rxe/*.pcap")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var out []realFrame
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		pr, err := NewPcapReader(bytes.NewReader(b))
		require.NoError(t, err, f)
		require.Equal(t, uint32(LinkTypeEthernet), pr.LinkType(), f)
		for i := 0; ; i++ {
			_, data, err := pr.Next()
			if err == io.EOF {
				break
			}
			require.NoError(t, err, f)
			out = append(out, realFrame{name: filepath.Base(f) + "#" + itoa(i), frame: bytes.Clone(data)})
		}
	}
	return out
}

// loadConnectXFrames parses testdata/connectx_vectors.txt.
func loadConnectXFrames(t testing.TB) []realFrame {
	t.Helper()
	b, err := os.ReadFile("testdata/connectx_vectors.txt")
	require.NoError(t, err)
	var out []realFrame
	var cur *realFrame
	var hexs strings.Builder
	flush := func() {
		if cur != nil {
			fr, err := hex.DecodeString(hexs.String())
			require.NoError(t, err, cur.name)
			cur.frame = fr
			out = append(out, *cur)
		}
		hexs.Reset()
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			flush()
			cur = &realFrame{name: strings.Trim(line, "[]")}
		default:
			hexs.WriteString(strings.Join(strings.Fields(line), ""))
		}
	}
	flush()
	require.Len(t, out, 3)
	return out
}

func itoa(i int) string { return strings.TrimSpace(strings.Repeat(" ", 0) + fmtInt(i)) }

func fmtInt(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

func TestRealTrafficParses(t *testing.T) {
	frames := append(loadRxeFrames(t), loadConnectXFrames(t)...)
	roce := 0
	for _, f := range frames {
		var pkt Packet
		err := Parse(f.frame, &pkt)
		if errors.Is(err, ErrRoCEv1) {
			t.Logf("%s: RoCE v1, skipped: vrnic speaks RoCE v2 only", f.name)
			continue
		}
		if isRoCEv2(f.frame) {
			roce++
			if assert.NoError(t, err, f.name) {
				t.Logf("%s: %v", f.name, pkt.Opcode())
			}
		} else {
			assert.Error(t, err, f.name)
		}
	}
	assert.Greater(t, roce, 100)
}

// isRoCEv2 reports whether frame is IPv4/UDP to port 4791, judged
// without the parser.
func isRoCEv2(f []byte) bool {
	return len(f) > 42 && f[12] == 0x08 && f[13] == 0 && f[23] == 17 && f[36] == 0x12 && f[37] == 0xb7
}

// TestRealTrafficRebuilds re-builds every real RoCE v2 frame from its
// parsed fields and expects the same bytes.
func TestRealTrafficRebuilds(t *testing.T) {
	frames := append(loadRxeFrames(t), loadConnectXFrames(t)...)
	n := 0
	for _, f := range frames {
		var pkt Packet
		if Parse(f.frame, &pkt) != nil {
			continue
		}
		n++
		path := pkt.Path()
		h := pkt.Headers()
		buf := make([]byte, MaxHeadroom+len(pkt.Payload)+MaxTailroom)
		copy(buf[MaxHeadroom:], pkt.Payload)
		out, err := path.Build(buf, MaxHeadroom, len(pkt.Payload), &h)
		require.NoError(t, err, f.name)
		assert.Equal(t, hex.EncodeToString(f.frame), hex.EncodeToString(out), f.name)
	}
	assert.Greater(t, n, 100)
}
