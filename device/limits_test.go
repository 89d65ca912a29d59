package device_test

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/verbs"
)

// limitEnv is what one client needs before it creates the limited kind.
type limitEnv struct {
	c   *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
	buf *verbs.Buffer
}

// TestPerDeviceLimits fills each per-device limit from two clients: the
// creation past it fails with ENOMEM (EAGAIN is the per-client limit's),
// whichever client asks; freeing one object, or closing a client, makes
// room again.
func TestPerDeviceLimits(t *testing.T) {
	const max = 3
	udQP := func(e *limitEnv) verbs.QPInitAttr {
		return verbs.QPInitAttr{Type: abi.QPTUD, SendCQ: e.cq, RecvCQ: e.cq, Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}
	}
	cases := []struct {
		what  string // as the error message names it
		limit func(*device.ResourceCounts)
		count func(device.ResourceCounts) int
		prep  func(t *testing.T, e *limitEnv)
		make  func(e *limitEnv) (free func() error, err error)
	}{
		{what: "host memory regions",
			limit: func(r *device.ResourceCounts) { r.HostMem = max },
			count: func(r device.ResourceCounts) int { return r.HostMem },
			make: func(e *limitEnv) (func() error, error) {
				h, err := e.c.AddHostMem(4096)
				if err != nil {
					return nil, err
				}
				return h.Remove, nil
			}},
		{what: "PDs",
			limit: func(r *device.ResourceCounts) { r.PD = max },
			count: func(r device.ResourceCounts) int { return r.PD },
			make: func(e *limitEnv) (func() error, error) {
				p, err := e.c.AllocPD()
				if err != nil {
					return nil, err
				}
				return p.Dealloc, nil
			}},
		{what: "MRs",
			limit: func(r *device.ResourceCounts) { r.MR = max },
			count: func(r device.ResourceCounts) int { return r.MR },
			prep: func(t *testing.T, e *limitEnv) {
				var err error
				e.pd, err = e.c.AllocPD()
				require.NoError(t, err)
				e.buf, err = e.c.Alloc(4096, 4096)
				require.NoError(t, err)
			},
			make: func(e *limitEnv) (func() error, error) {
				m, err := e.pd.RegMR(e.buf, abi.AccessLocalWrite)
				if err != nil {
					return nil, err
				}
				return m.Dereg, nil
			}},
		{what: "CQs",
			limit: func(r *device.ResourceCounts) { r.CQ = max },
			count: func(r device.ResourceCounts) int { return r.CQ },
			make: func(e *limitEnv) (func() error, error) {
				q, err := e.c.CreateCQ(2, nil)
				if err != nil {
					return nil, err
				}
				return q.Destroy, nil
			}},
		{what: "QPs",
			limit: func(r *device.ResourceCounts) { r.QP = max },
			count: func(r device.ResourceCounts) int { return r.QP },
			prep: func(t *testing.T, e *limitEnv) {
				var err error
				e.pd, err = e.c.AllocPD()
				require.NoError(t, err)
				e.cq, err = e.c.CreateCQ(8, nil)
				require.NoError(t, err)
			},
			make: func(e *limitEnv) (func() error, error) {
				q, err := e.pd.CreateQP(udQP(e))
				if err != nil {
					return nil, err
				}
				return q.Destroy, nil
			}},
		{what: "SRQs",
			limit: func(r *device.ResourceCounts) { r.SRQ = max },
			count: func(r device.ResourceCounts) int { return r.SRQ },
			prep: func(t *testing.T, e *limitEnv) {
				var err error
				e.pd, err = e.c.AllocPD()
				require.NoError(t, err)
			},
			make: func(e *limitEnv) (func() error, error) {
				s, err := e.pd.CreateSRQ(2, 1, 0)
				if err != nil {
					return nil, err
				}
				return s.Destroy, nil
			}},
		{what: "AHs",
			limit: func(r *device.ResourceCounts) { r.AH = max },
			count: func(r device.ResourceCounts) int { return r.AH },
			prep: func(t *testing.T, e *limitEnv) {
				var err error
				e.pd, err = e.c.AllocPD()
				require.NoError(t, err)
			},
			make: func(e *limitEnv) (func() error, error) {
				a, err := e.pd.CreateAH(testAV())
				if err != nil {
					return nil, err
				}
				return a.Destroy, nil
			}},
	}
	for _, tc := range cases {
		t.Run(tc.what, func(t *testing.T) {
			var lim device.Limits
			tc.limit(&lim.PerDevice)
			s := startServer(t, lim)
			env := func() *limitEnv {
				e := &limitEnv{c: open(t, s)}
				if tc.prep != nil {
					tc.prep(t, e)
				}
				return e
			}
			e1, e2 := env(), env()
			base := tc.count(s.Device.Counts()) // what prep took (host memory: none)
			require.Zero(t, base, "the environment takes none of the limited kind")
			var frees1 []func() error
			for range max - 1 {
				free, err := tc.make(e1)
				require.NoError(t, err)
				frees1 = append(frees1, free)
			}
			_, err := tc.make(e2)
			require.NoError(t, err)
			assert.Equal(t, max, tc.count(s.Device.Counts()))

			for i, e := range []*limitEnv{e1, e2} {
				_, err := tc.make(e)
				assert.Equal(t, syscall.ENOMEM, errno(t, err), "client %d past the device limit", i+1)
				assert.Contains(t, err.Error(), fmt.Sprintf("device limit of %d %s reached", max, tc.what))
			}
			assert.Equal(t, max, tc.count(s.Device.Counts()), "a refused creation takes nothing")

			// Freeing one of client 1's makes room for client 2.
			require.NoError(t, frees1[0]())
			_, err = tc.make(e2)
			require.NoError(t, err, "room again after a free")
			_, err = tc.make(e1)
			assert.Equal(t, syscall.ENOMEM, errno(t, err), "full again")

			// Client 2's objects go with its context.
			require.NoError(t, e2.c.Close())
			require.Eventually(t, func() bool { return tc.count(s.Device.Counts()) == max-2 }, timeout, tick)
			for range 2 {
				_, err := tc.make(e1)
				require.NoError(t, err, "room left by the closed client")
			}
			_, err = tc.make(e1)
			assert.Equal(t, syscall.ENOMEM, errno(t, err))
		})
	}
}

// TestMaxMRPages: a REG_MR whose page list is longer than
// Limits.MaxMRPages fails with EINVAL and registers nothing, with the
// page list inline in the command or in client memory (pbl_pa); one at
// the limit succeeds.
func TestMaxMRPages(t *testing.T) {
	for _, pages := range []int{abi.InlinePages / 2, 2 * abi.InlinePages} {
		t.Run(fmt.Sprintf("%d pages", pages), func(t *testing.T) {
			s := startServer(t, device.Limits{MaxMRPages: uint32(pages)})
			assert.Equal(t, uint32(pages), s.Device.Limits().MaxMRPages)
			c := open(t, s)
			pd, err := c.AllocPD()
			require.NoError(t, err)
			over, err := c.Alloc((pages+1)*4096, 4096)
			require.NoError(t, err)
			_, err = pd.RegMR(over, abi.AccessLocalWrite)
			assert.Equal(t, syscall.EINVAL, errno(t, err))
			assert.Contains(t, err.Error(), fmt.Sprintf("npages %d exceeds the limit of %d pages per MR", pages+1, pages))
			assert.Zero(t, s.Device.Counts().MR)
			at, err := c.Alloc(pages*4096, 4096)
			require.NoError(t, err)
			mr, err := pd.RegMR(at, abi.AccessLocalWrite)
			require.NoError(t, err, "an MR of exactly MaxMRPages pages")
			mrs := adminList[admin.MRInfo](t, s.SocketPath, admin.MRsCmd)
			require.Len(t, mrs, 1)
			assert.Equal(t, uint32(pages), mrs[0].Pages)
			require.NoError(t, mr.Dereg())
		})
	}
	// The default bounds it too.
	assert.Equal(t, device.DefaultLimits.MaxMRPages, startServer(t, device.Limits{}).Device.Limits().MaxMRPages)
}
