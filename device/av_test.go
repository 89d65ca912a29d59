package device_test

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
)

// avCases are address vectors with one field set, each accepted or
// refused (with Linux's errno) as a RoCE port of rdma_rxe does (see
// checkAH for the Linux functions). The test device has one GID, at
// index 0, in a table of abi.GIDTableLen entries.
var avCases = []struct {
	name  string
	mut   func(a *abi.AHAttr)
	errno syscall.Errno // 0: accepted, and QUERY_QP gives the value back
}{
	{"flow label 20 bits", func(a *abi.AHAttr) { a.FlowLabel = 0xfffff }, 0},
	{"flow label bit 20", func(a *abi.AHAttr) { a.FlowLabel = 1 << 20 }, 0},
	{"flow label all ones", func(a *abi.AHAttr) { a.FlowLabel = 0xffffffff }, 0}, // UCX ud_verbs
	{"traffic class", func(a *abi.AHAttr) { a.TrafficClass = 0xff }, 0},
	{"hop limit 0", func(a *abi.AHAttr) { a.HopLimit = 0 }, 0},
	{"hop limit 255", func(a *abi.AHAttr) { a.HopLimit = 255 }, 0},
	{"sl 15", func(a *abi.AHAttr) { a.SL = 15 }, 0},
	{"sl 16", func(a *abi.AHAttr) { a.SL = 16 }, 0},
	{"sl 255", func(a *abi.AHAttr) { a.SL = 255 }, 0},
	{"sgid index empty entry", func(a *abi.AHAttr) { a.SGIDIndex = 1 }, syscall.ENODATA},
	{"sgid index last entry", func(a *abi.AHAttr) { a.SGIDIndex = abi.GIDTableLen - 1 }, syscall.ENODATA},
	{"sgid index past the table", func(a *abi.AHAttr) { a.SGIDIndex = abi.GIDTableLen }, syscall.EINVAL},
	{"sgid index 255", func(a *abi.AHAttr) { a.SGIDIndex = 255 }, syscall.EINVAL},
	{"port 0", func(a *abi.AHAttr) { a.PortNum = 0 }, syscall.EINVAL},
	{"port 2", func(a *abi.AHAttr) { a.PortNum = 2 }, syscall.EINVAL},
}

// TestAVFields: CREATE_AH and the AV of MODIFY_QP (RC INIT→RTR) accept
// and refuse the same address vectors, with the same errno.
func TestAVFields(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	e := newQPEnv(t, c)
	for i, tc := range avCases {
		t.Run(tc.name, func(t *testing.T) {
			av := testAV()
			tc.mut(&av)

			ah, err := e.pd.CreateAH(av)
			if tc.errno != 0 {
				assert.Equal(t, tc.errno, errno(t, err), "CREATE_AH")
			} else {
				require.NoError(t, err, "CREATE_AH")
				require.NoError(t, ah.Destroy())
			}

			qp := e.qp(t, abi.QPTRC)
			require.NoError(t, modify(qp, abi.QPSInit, rcInit))
			a := fullAttr(abi.QPSRTR)
			a.AHAttr = av
			a.DestQPNum = uint32(0x100 + i) // one connection per remote QP
			err = qp.Modify(&a, abi.QPAttrState|rcRTR)
			if tc.errno != 0 {
				assert.Equal(t, tc.errno, errno(t, err), "MODIFY_QP")
				assert.Contains(t, err.Error(), "AV: ah_attr.")
				return
			}
			require.NoError(t, err, "MODIFY_QP")
			q, err := qp.Query()
			require.NoError(t, err)
			// Stored as given, as Linux's copy_ah_attr_to_uverbs gives
			// back the AV's u32 flow label and u8 fields.
			assert.Equal(t, av, q.Attr.AHAttr)
		})
	}
}
