package ebpf

import (
	"encoding/binary"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/roce"
	"golang.org/x/sys/unix"
)

// steerModel is the steering decision written out in Go, independently of
// steer.c: roce.SteerHash of the BTH destination QP of an Ethernet
// [802.1Q] IPv4 (non-fragment) or IPv6 (no extension header) UDP 4791
// frame, else 0.
func steerModel(f []byte) uint32 {
	if len(f) < 14 {
		return 0
	}
	et, l3 := binary.BigEndian.Uint16(f[12:]), 14
	if et == 0x8100 {
		if len(f) < 18 {
			return 0
		}
		et, l3 = binary.BigEndian.Uint16(f[16:]), 18
	}
	var l4 int
	switch et {
	case 0x0800:
		if len(f) < l3+20 || f[l3]>>4 != 4 || f[l3]&0xf < 5 ||
			binary.BigEndian.Uint16(f[l3+6:])&0x3fff != 0 || f[l3+9] != 17 {
			return 0
		}
		l4 = l3 + int(f[l3]&0xf)*4
	case 0x86dd:
		if len(f) < l3+40 || f[l3]>>4 != 6 || f[l3+6] != 17 {
			return 0
		}
		l4 = l3 + 40
	default:
		return 0
	}
	if len(f) < l4+8 || binary.BigEndian.Uint16(f[l4+2:]) != 4791 || len(f) < l4+16 {
		return 0
	}
	return roce.SteerHash(uint32(f[l4+13])<<16 | uint32(f[l4+14])<<8 | uint32(f[l4+15]))
}

var (
	fuzzOnce  sync.Once
	fuzzProgs *Programs
	fuzzErr   error
)

// FuzzSteerMatchesModel runs the steering program on arbitrary frames
// and compares its choice with steerModel.
func FuzzSteerMatchesModel(f *testing.F) {
	testenv.NeedRoot(f, "needs root (CAP_BPF) to run BPF_PROG_TEST_RUN")
	for _, rf := range []roceFrame{
		{src: src4, dst: dst4, qpn: 0x123456},
		{src: src4, dst: dst4, qpn: 9, ipOptions: 8},
		{src: src6, dst: dst6, qpn: 0xfffff0, vlan: true},
		{src: src4, dst: dst4, qpn: 1, dport: 53},
	} {
		f.Add(buildRoCEFrame(rf))
	}
	f.Add(arpFrame(1, dst4, true))
	f.Cleanup(func() {
		if fuzzProgs != nil {
			fuzzProgs.Close()
		}
		// The next run of the test (-count) loads them again.
		fuzzProgs, fuzzErr, fuzzOnce = nil, nil, sync.Once{}
	})
	f.Fuzz(func(t *testing.T, frame []byte) {
		fuzzOnce.Do(func() { fuzzProgs, fuzzErr = Load(4) })
		require.NoError(t, fuzzErr)
		if len(frame) > 3000 {
			frame = frame[:3000]
		}
		ret, err := fuzzProgs.SteerProgram().Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			require.ErrorIs(t, err, unix.EINVAL)
			require.True(t, testRunRefuses(frame, len(frame)), "unexpected refusal of %x", frame)
			return
		}
		require.Equal(t, steerModel(frame), ret, "frame %x", frame)
	})
}
