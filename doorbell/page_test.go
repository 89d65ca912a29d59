package doorbell

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clientMap maps the daemon page p the way a client does, through
// duplicated descriptors (as SCM_RIGHTS would deliver them).
func clientMap(t *testing.T, p *Page) *Page {
	t.Helper()
	mfd, err := unix.Dup(p.MemFd())
	require.NoError(t, err)
	kfd, err := unix.Dup(p.KickFd())
	require.NoError(t, err)
	c, err := Map(mfd, kfd)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func newPage(t *testing.T) *Page {
	t.Helper()
	p, err := New()
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

func TestPageHeaderAndSharing(t *testing.T) {
	p := newPage(t)
	assert.Equal(t, uint32(abi.DBPageSize), p.Size())
	assert.Equal(t, uint32(abi.DBRecords), p.Records())
	c := clientMap(t, p)

	i, err := p.Alloc()
	require.NoError(t, err)
	assert.NotZero(t, i)
	dq, err := p.QP(i)
	require.NoError(t, err)
	cq, err := c.QP(i)
	require.NoError(t, err)
	cq.SQPI.Store(17)
	cq.RQPI.Store(3)
	assert.Equal(t, uint32(17), dq.SQPI.Load(), "client store visible to the daemon")
	assert.Equal(t, uint32(3), dq.RQPI.Load())
	dq.SQCI.Store(9)
	assert.Equal(t, uint32(9), cq.SQCI.Load())

	j, err := p.Alloc()
	require.NoError(t, err)
	dc, err := p.CQ(j)
	require.NoError(t, err)
	cc, err := c.CQ(j)
	require.NoError(t, err)
	cc.Arm.Store(abi.ArmWord(1, false))
	assert.Equal(t, abi.ArmWord(1, false), dc.Arm.Load())
	dc.Overflow.Store(1)
	assert.Equal(t, uint32(1), cc.Overflow.Load())

	k, err := p.Alloc()
	require.NoError(t, err)
	ds, err := p.SRQ(k)
	require.NoError(t, err)
	cs, err := c.SRQ(k)
	require.NoError(t, err)
	cs.PI.Store(5)
	assert.Equal(t, uint32(5), ds.PI.Load())

	// Freed records are zeroed and reused.
	p.Free(i)
	assert.Zero(t, cq.SQPI.Load())
	assert.Zero(t, cq.SQCI.Load())

	for _, bad := range []uint32{0, abi.DBRecords, 1 << 31} {
		_, err := p.QP(bad)
		assert.ErrorIs(t, err, ErrRecord)
		_, err = p.CQ(bad)
		assert.ErrorIs(t, err, ErrRecord)
		_, err = p.SRQ(bad)
		assert.ErrorIs(t, err, ErrRecord)
	}
}

func TestPageAllocExhaustion(t *testing.T) {
	p := newPage(t)
	seen := map[uint32]bool{}
	for range abi.DBRecords - 1 {
		i, err := p.Alloc()
		require.NoError(t, err)
		require.False(t, seen[i])
		require.NotZero(t, i)
		seen[i] = true
	}
	_, err := p.Alloc()
	assert.ErrorIs(t, err, ErrNoRecords)
	p.Free(42)
	p.Free(0)   // ignored
	p.Free(1e6) // ignored
	i, err := p.Alloc()
	require.NoError(t, err)
	assert.Equal(t, uint32(42), i)
	require.NoError(t, p.Close())
	_, err = p.Alloc()
	assert.ErrorIs(t, err, ErrClosed)
}

func TestMapRejects(t *testing.T) {
	kick, err := NewEventFD()
	require.NoError(t, err)
	defer kick.Close()

	t.Run("no magic", func(t *testing.T) {
		fd, err := unix.MemfdCreate("x", unix.MFD_CLOEXEC)
		require.NoError(t, err)
		defer unix.Close(fd)
		require.NoError(t, unix.Ftruncate(fd, abi.DBPageSize))
		_, err = Map(fd, kick.Fd())
		assert.ErrorIs(t, err, ErrBadPage)
	})
	t.Run("short", func(t *testing.T) {
		fd, err := unix.MemfdCreate("x", unix.MFD_CLOEXEC)
		require.NoError(t, err)
		defer unix.Close(fd)
		require.NoError(t, unix.Ftruncate(fd, 4096))
		_, err = Map(fd, kick.Fd())
		assert.ErrorIs(t, err, ErrBadPage)
	})
	t.Run("kick not an eventfd", func(t *testing.T) {
		p := newPage(t)
		r, w, err := os.Pipe()
		require.NoError(t, err)
		defer r.Close()
		defer w.Close()
		_, err = Map(p.MemFd(), int(r.Fd()))
		assert.ErrorIs(t, err, ErrNotEventFD)
	})
	t.Run("sealed against shrink", func(t *testing.T) {
		p := newPage(t)
		assert.Error(t, unix.Ftruncate(p.MemFd(), 4096), "a client must not shrink the page")
	})
}

func TestEventFD(t *testing.T) {
	e, err := NewEventFD()
	require.NoError(t, err)
	defer e.Close()
	n, err := e.Drain()
	require.NoError(t, err)
	assert.Zero(t, n)
	for range 3 {
		require.NoError(t, e.Signal())
	}
	n, err = e.Drain()
	require.NoError(t, err)
	assert.Equal(t, uint64(3), n)
	flags, err := unix.FcntlInt(uintptr(e.Fd()), unix.F_GETFL, 0)
	require.NoError(t, err)
	assert.NotZero(t, flags&unix.O_NONBLOCK)
	fdflags, err := unix.FcntlInt(uintptr(e.Fd()), unix.F_GETFD, 0)
	require.NoError(t, err)
	assert.NotZero(t, fdflags&unix.FD_CLOEXEC)
	allocs := testing.AllocsPerRun(100, func() {
		_ = e.Signal()
		_, _ = e.Drain()
	})
	assert.Zero(t, allocs)
}

func TestRingKicksOnlyWhenNeeded(t *testing.T) {
	p := newPage(t)
	c := clientMap(t, p)
	i, err := p.Alloc()
	require.NoError(t, err)
	rec, err := c.QP(i)
	require.NoError(t, err)

	kicked, err := c.Ring(rec.SQPI, 1)
	require.NoError(t, err)
	assert.False(t, kicked, "daemon polling: no kick")
	n, _ := p.Kick().Drain()
	assert.Zero(t, n)

	p.KickNeeded().Store(1)
	kicked, err = c.Ring(rec.SQPI, 2)
	require.NoError(t, err)
	assert.True(t, kicked)
	n, _ = p.Kick().Drain()
	assert.Equal(t, uint64(1), n, "the daemon's eventfd saw the client's kick")
	d, _ := p.QP(i)
	assert.Equal(t, uint32(2), d.SQPI.Load())
}

func TestCQNotifier(t *testing.T) {
	type step struct {
		arm       uint32 // 0: leave the arm word unchanged
		consumed  bool   // the client consumes every CQE before this step's arm
		solicited bool
		want      bool
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"not armed", []step{{0, false, false, false}, {0, false, true, false}}},
		{"once per sequence", []step{{abi.ArmWord(1, false), false, false, true}, {0, false, false, false}, {0, false, true, false}}},
		{"rearm", []step{{abi.ArmWord(1, false), false, false, true}, {abi.ArmWord(2, false), false, false, true}, {0, false, false, false}}},
		{"solicited only", []step{{abi.ArmWord(1, true), false, false, false}, {0, false, false, false}, {0, false, true, true}, {0, false, true, false}}},
		{"disarmed word", []step{{abi.ArmWord(1, false) &^ abi.CQArmArmed, false, false, false}}},
		{"sequence wrap", []step{{abi.ArmWord(0xffffff, false), false, false, true}, {abi.ArmWord(0, false), false, false, true}}},
		// The client consumed the CQE before arming (it was written before
		// the arm): the arm is kept for the next CQE.
		{"consumed before arm", []step{{abi.ArmWord(1, false), true, false, false}, {0, false, false, true}, {0, false, false, false}}},
	}
	k, err := NewKernelSignaller(1)
	require.NoError(t, err)
	defer k.Close()
	for _, c := range cases {
		for _, kind := range []string{"kernel", "writer"} {
			t.Run(c.name+"/"+kind, func(t *testing.T) {
				p := newPage(t)
				i, err := p.Alloc()
				require.NoError(t, err)
				rec, err := p.CQ(i)
				require.NoError(t, err)
				comp, err := NewEventFD()
				require.NoError(t, err)
				w := NewEventWriter() // flushed by hand below, not Run
				var sig Signaller = k
				if kind == "writer" {
					sig = w
				}
				n := NewCQNotifier(rec, comp, sig)
				defer n.Close()
				for k, s := range c.steps {
					rec.PI.Add(1) // the daemon wrote and published a CQE
					if s.consumed {
						rec.CI.Store(rec.PI.Load())
					}
					if s.arm != 0 {
						rec.Arm.Store(s.arm)
					}
					got := n.Completed(s.solicited)
					assert.Equal(t, s.want, got, "step %d", k)
					w.flush()
					cnt, _ := comp.Drain()
					assert.Equal(t, s.want, cnt == 1, "step %d eventfd", k)
					if got {
						assert.Equal(t, abi.ArmSN(rec.Arm.Load()), rec.ArmSNDone.Load())
					}
				}
			})
		}
	}
}
