package device_test

import (
	"bufio"
	"encoding/binary"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/dma"
	"golang.org/x/sys/unix"
)

// memClient is a raw client with one host memory region mapped in the
// test, for page lists no verbs call would build.
type memClient struct {
	r   *rawConn
	mem []byte // the client's mapping of the region
	pa  uint64
	pd  uint32
	seq uint32
}

// newMemClient opens a context, adds a memfd of size bytes (sparse) and
// allocates a PD.
func newMemClient(t *testing.T, path string, size int) *memClient {
	t.Helper()
	c := &memClient{r: dialRaw(t, path)}
	t.Cleanup(func() { c.r.c.Close() })
	c.r.open()
	fd := newMemfd(t, size, true)
	defer unix.Close(fd)
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem) })
	c.mem = mem
	rep := c.call(t, abi.CmdAddHostMem, &abi.CmdAddHostMemReq{Length: uint64(size)}, fd)
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	var hm abi.RespAddHostMem
	_, err = abi.Unmarshal(rep.body, &hm)
	require.NoError(t, err)
	c.pa = hm.PABase
	rep = c.call(t, abi.CmdAllocPD, nil)
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	var pd abi.RespAllocPD
	_, err = abi.Unmarshal(rep.body, &pd)
	require.NoError(t, err)
	c.pd = pd.PDHandle
	return c
}

func (c *memClient) call(t *testing.T, op abi.Cmd, req any, fds ...int) rawReply {
	t.Helper()
	c.seq++
	var payload []byte
	if req != nil {
		payload = encode(t, req)
	}
	return c.r.call(msg(op, c.seq, payload), fds...)
}

// regMR registers n 4 KiB pages, the PA of page i being page(i), with the
// page list written at byte pblOff of the region.
func (c *memClient) regMR(t *testing.T, n int, pblOff int, access uint32, page func(i int) uint64) rawReply {
	t.Helper()
	for i := range n {
		binary.LittleEndian.PutUint64(c.mem[pblOff+8*i:], page(i))
	}
	return c.call(t, abi.CmdRegMR, &abi.CmdRegMRReq{IOVA: 0, Length: uint64(n) * 4096, PBLPA: c.pa + uint64(pblOff),
		PDHandle: c.pd, Access: access, PageShift: abi.PageShift4K, NPages: uint32(n)})
}

// TestPageTablesPerUID: the MR page tables of all contexts of one uid
// share MRTableBytesPerUID; beyond it REG_MR fails with ENOMEM and a
// message naming the limit, and a context that goes gives its share back.
func TestPageTablesPerUID(t *testing.T) {
	s := startServer(t, device.Limits{MRTableBytesPerUID: 2 << 20})
	uid := uint32(os.Getuid())
	const pages = 1 << 17 // aliasing pages: a flat table of 1 MiB
	alias := func(c *memClient) func(int) uint64 { return func(int) uint64 { return c.pa } }
	a := newMemClient(t, s.SocketPath, 2<<20)
	b := newMemClient(t, s.SocketPath, 2<<20)
	for range 2 {
		rep := a.regMR(t, pages, 4096, 0, alias(a))
		require.Zero(t, rep.hdr.Status, rep.errMsg())
	}
	assert.Equal(t, uint64(2<<20), s.Space.AccountUsage(dma.AccountID(uid)).TableBytes)
	rep := b.regMR(t, pages, 4096, 0, alias(b))
	assert.Equal(t, uint32(syscall.ENOMEM), rep.hdr.Status, rep.errMsg())
	assert.Contains(t, rep.errMsg(), "mr_table_bytes_per_uid")
	assert.Contains(t, rep.errMsg(), "uid "+strconv.Itoa(int(uid)))
	// The limit is reached: even a one-run table (16 bytes) is refused.
	rep = b.regMR(t, 256, 4096, 0, func(i int) uint64 { return b.pa + uint64(i%256)*4096 })
	assert.Equal(t, uint32(syscall.ENOMEM), rep.hdr.Status, rep.errMsg())

	a.r.c.Close()
	require.Eventually(t, func() bool { return s.Device.Counts().Contexts == 1 }, timeout, tick)
	rep = b.regMR(t, pages, 4096, 0, alias(b))
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	b.r.c.Close()
	waitIdle(t, s)
	assert.Equal(t, dma.AccountUsage{}, s.Space.AccountUsage(dma.AccountID(uid)), "nothing left charged")
}

// vmLck is this process's locked memory (the device runs in it).
func vmLck(t *testing.T) uint64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmLck:"); ok {
			n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return n << 10
		}
	}
	t.Fatal("no VmLck")
	return 0
}

// TestSparseHostMemory adds a sparse 4 GiB memfd: the command is quick,
// locks and populates nothing, and another client is served meanwhile;
// an MR over all of it exceeds PinnedBytesPerUID (ENOMEM); one over 64
// MiB of it is accepted and locks 64 MiB at most, populating no hole;
// everything is released with the client.
func TestSparseHostMemory(t *testing.T) {
	s := startServer(t, device.Limits{PinnedBytesPerUID: 1 << 30})
	uid := dma.AccountID(os.Getuid())
	base := vmLck(t)
	other := open(t, s)

	start := time.Now()
	c := newMemClient(t, s.SocketPath, 4<<30)
	added := time.Since(start)
	qStart := time.Now()
	_, err := other.QueryDevice()
	require.NoError(t, err)
	// Timed for the log only (a loaded machine makes any bound a guess):
	// that the command does no work per byte is asserted below, by what
	// it locked and populated.
	t.Logf("sparse 4 GiB ADD_HOST_MEM in %v; another client's query then in %v", added, time.Since(qStart))
	s.Space.WaitPinned()
	assert.Equal(t, base, vmLck(t), "adding host memory locks nothing")

	// All of it: 1<<20 pages, the list in the region's last 8 MiB.
	pblOff := 4<<30 - 8<<20
	rep := c.regMR(t, 1<<20, pblOff, abi.AccessLocalWrite, func(i int) uint64 { return c.pa + uint64(i)*4096 })
	assert.Equal(t, uint32(syscall.ENOMEM), rep.hdr.Status, rep.errMsg())
	assert.Contains(t, rep.errMsg(), "pinned_bytes_per_uid")

	rep = c.regMR(t, 16384, pblOff, abi.AccessLocalWrite, func(i int) uint64 { return c.pa + uint64(i)*4096 })
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	s.Space.WaitPinned()
	u := s.Space.AccountUsage(uid)
	assert.Equal(t, uint64(64<<20), u.PinnedBytes)
	assert.Zero(t, u.PresentBytes, "the client never wrote there")
	assert.LessOrEqual(t, vmLck(t), base+64<<20)

	c.r.c.Close()
	require.Eventually(t, func() bool { return s.Device.Counts().Contexts == 1 }, timeout, tick)
	s.Space.WaitPinned()
	assert.Equal(t, base, vmLck(t))
	assert.Zero(t, s.Space.PinnedBytes())
}
