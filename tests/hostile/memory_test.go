package hostile

// Memory probes: a real vrnicd (built from this tree), a well-behaved
// victim client in this process running RDMA WRITE and READ between two
// RC QPs of its own and checking its memory after each, and a hostile
// client process (this test binary again, as the user nobody when the
// test runs as root, so that it is another uid) doing one of:
//
//   - sparse: ADD_HOST_MEM of a sparse 2 GiB memfd, an MR over all of it
//     and one over 256 MiB of it;
//   - alias: 64 REG_MRs of 1<<20 pages that all alias one page;
//   - many: 4096 REG_MRs of 8192 scattered pages each.
//
// Each probe asserts the daemon stays alive and answering, the victim
// keeps completing operations with its memory intact and its commands
// answered promptly, the daemon's locked memory and RSS stay bounded
// while the hostile client is there, and both come back near their
// baseline after it is killed.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/rcpair"
	"github.com/vrnic/vrnic/verbs"
)

const (
	memHelperModeEnv = "VRNIC_HOSTILE_MEM_MODE"
	memHelperSockEnv = "VRNIC_HOSTILE_MEM_SOCK"
	memNobody        = 65534
)

// TestMemHelperProcess is the hostile client of the memory probes, run by
// them in a process of its own; on its own it skips.
func TestMemHelperProcess(t *testing.T) {
	mode := os.Getenv(memHelperModeEnv)
	if mode == "" {
		t.Skip("the hostile client of the memory probes; they run it")
	}
	out, err := memHelperHostile(mode, os.Getenv(memHelperSockEnv))
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	fmt.Println("READY", out)
	time.Sleep(time.Hour) // until the probe kills it
}

func TestMemorySparseHostMem(t *testing.T) {
	memProbe(t, "sparse", func(t *testing.T, r memProbeResult) {
		// Pages of the memfd in memory after ADD_HOST_MEM, before the
		// client touched any (mincore): a daemon that populated the
		// holes (touching or locking them) would be slow and fill RAM.
		populated, err := strconv.Atoi(r.hostile["populated_pages"])
		require.NoError(t, err)
		assert.Zero(t, populated, "pages of the sparse 2 GiB memfd populated by ADD_HOST_MEM")
		assert.Equal(t, "ENOMEM", r.hostile["all"], "an MR over 2 GiB exceeds the uid's pinned limit")
		assert.Equal(t, "ok", r.hostile["mr256"], "an MR over 256 MiB does not")
		assert.LessOrEqual(t, r.during.lck, r.base.lck+(256+16)<<20, "locked while the hostile client holds 256 MiB of a sparse memfd")
		assert.LessOrEqual(t, r.during.rss, r.base.rss+128<<20, "the daemon populated holes of the sparse memfd")
	})
}

func TestMemoryAliasingPageLists(t *testing.T) {
	memProbe(t, "alias", func(t *testing.T, r memProbeResult) {
		ok, err := strconv.Atoi(r.hostile["ok"])
		require.NoError(t, err)
		assert.LessOrEqual(t, ok, 8, "64 MiB of page tables per uid: 8 tables of 8 MiB")
		assert.Equal(t, "ENOMEM", r.hostile["err"])
		assert.LessOrEqual(t, r.during.rss, r.base.rss+160<<20, "page tables held for the hostile client")
	})
}

func TestMemoryManyMRs(t *testing.T) {
	memProbe(t, "many", func(t *testing.T, r memProbeResult) {
		ok, err := strconv.Atoi(r.hostile["ok"])
		require.NoError(t, err)
		assert.LessOrEqual(t, ok, 1024, "64 MiB of page tables per uid: 1024 tables of 64 KiB")
		assert.Equal(t, "ENOMEM", r.hostile["err"])
		assert.LessOrEqual(t, r.during.rss, r.base.rss+160<<20, "page tables held for the hostile client")
	})
}

// memStatus is what /proc/<pid>/status says of the daemon's memory.
type memStatus struct{ rss, lck uint64 }

func (s memStatus) String() string {
	return fmt.Sprintf("RSS %d MiB, locked %d MiB", s.rss>>20, s.lck>>20)
}

type memProbeResult struct {
	base, during, after memStatus
	hostile             map[string]string // what the hostile client reported
}

// memProbe runs one probe: daemon, victim, baseline, hostile client,
// check (while the hostile client is there), kill, recovery.
func memProbe(t *testing.T, mode string, check func(*testing.T, memProbeResult)) {
	d := memHelperStartDaemon(t, "")
	v := memHelperNewVictim(t, d.sock)
	v.start()
	time.Sleep(time.Second)
	var r memProbeResult
	r.base = memHelperStatus(t, d.p.Pid())
	heldBase := memHelperHeld(t, d.sock)
	opsBefore, _ := v.progress()

	h, fields := memHelperStartHostile(t, d.sock, mode)
	r.hostile = fields
	time.Sleep(time.Second) // the victim works beside it; the pinner catches up
	r.during = memHelperStatus(t, d.p.Pid())
	opsDuring, st := v.progress()
	t.Logf("%s: baseline %v, with the hostile client %v; hostile reported %v; slowest victim command %v, longest pause %v",
		mode, r.base, r.during, fields, st.maxCtl, st.maxGap)
	require.NoError(t, st.err, "the victim failed while the hostile client ran")
	assert.Greater(t, opsDuring, opsBefore, "the victim progressed while the hostile client ran")
	// Hang bounds only: with two CPU hogs beside the test a victim
	// step took up to 1.6 s of wall time (the test process, the daemon
	// and the hostile client share two CPUs); tens of seconds mean a
	// victim stuck behind the hostile client (a lock held across its
	// registrations, a command that spins). That the victim is served
	// at all while the hostile client is there is the progress check
	// above.
	assert.Less(t, st.maxGap, 20*time.Second, "longest pause between two victim operations")
	assert.Less(t, st.maxCtl, 20*time.Second, "slowest victim command")
	check(t, r)

	// The hostile client dies. What the daemon holds for its clients
	// (its own accounting: memory regions, pins, locks, page-table
	// entries, descriptors) goes back to the victim's exactly; the
	// kernel's figures follow: locked memory to the baseline, RSS near
	// it once the page tables freed to the Go heap are returned
	// (dma.Space.maybeReturnHeap). The daemon does that as soon as it
	// processed the client's exit; the deadline only ends a wait on a
	// hung daemon.
	require.NoError(t, h.Process.Kill())
	_ = h.Wait()
	var heldAfter admin.HeldResources
	deadline := time.Now().Add(60 * time.Second)
	for {
		heldAfter = memHelperHeld(t, d.sock)
		r.after = memHelperStatus(t, d.p.Pid())
		if heldAfter == heldBase && r.after.rss <= r.base.rss+48<<20 && r.after.lck <= r.base.lck+4<<20 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%s: after the hostile client left: %v; held %+v (with the victim alone %+v)", mode, r.after, heldAfter, heldBase)
	assert.Equal(t, heldBase, heldAfter, "what the daemon holds for its clients, back to the victim's alone")
	assert.LessOrEqual(t, r.after.rss, r.base.rss+48<<20, "RSS back near the baseline after the hostile client left")
	assert.LessOrEqual(t, r.after.lck, r.base.lck+4<<20, "locked memory back to the baseline after the hostile client left")

	var opsAfter int
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if opsAfter, st = v.progress(); opsAfter > opsDuring+10 || st.err != nil {
			break
		}
	}
	v.stopAndWait()
	require.NoError(t, st.err)
	assert.Greater(t, opsAfter, opsDuring+10, "the victim goes on")
	_, err := v.c.QueryDevice()
	require.NoError(t, err, "the daemon answers")
	require.True(t, d.p.Running(), "the daemon is alive")
}

// memDaemon is a vrnicd started for one test.
type memDaemon struct {
	p    *launch.Proc
	sock string
	dir  string
}

// memHelperStartDaemon builds vrnicd and starts it with an in-memory link
// (the victim's QPs talk to each other through it) and the JSON config
// cfg (none if empty). Its runtime directory and socket are open to
// other users, for a hostile client of another uid.
func memHelperStartDaemon(t *testing.T, cfg string) *memDaemon {
	t.Helper()
	bin := vrnicdBinary(t)
	dir, err := os.MkdirTemp("", "vrnic-h-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	name := "h" + strconv.Itoa(os.Getpid()%100000)
	args := []string{"-name", name, "-runtime-dir", dir, "-link", "mem", "-log-level", "info"}
	if cfg != "" {
		path := filepath.Join(dir, "config.json")
		require.NoError(t, os.WriteFile(path, []byte(cfg), 0o644))
		args = append(args, "-config", path)
	}
	logs := t.TempDir()
	p, err := launch.Start(launch.Spec{Name: "vrnicd", Bin: bin, Args: args, Dir: logs})
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := p.Stop(0, 10*time.Second); err != nil && !p.Killed() {
			t.Logf("vrnicd: %v\n%s", err, p.Tail(20))
		}
	})
	sock := filepath.Join(dir, name+".sock")
	require.NoError(t, launch.WaitReady(context.Background(), p, sock, 20*time.Second))
	require.NoError(t, os.Chmod(sock, 0o666))
	return &memDaemon{p: p, sock: sock, dir: dir}
}

// memHelperStatus reads the daemon's VmRSS and VmLck.
func memHelperStatus(t testing.TB, pid int) memStatus {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	var s memStatus
	for _, l := range strings.Split(string(b), "\n") {
		for _, f := range []struct {
			name string
			v    *uint64
		}{{"VmRSS:", &s.rss}, {"VmLck:", &s.lck}} {
			if v, ok := strings.CutPrefix(l, f.name); ok {
				n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				require.NoError(t, err)
				*f.v = n << 10
			}
		}
	}
	return s
}

// memHelperHeld asks the daemon at sock what it holds for its clients
// (admin.Info.Held).
func memHelperHeld(t testing.TB, sock string) admin.HeldResources {
	t.Helper()
	info, err := admin.Serving(sock)
	require.NoError(t, err)
	return info.Held
}

// memHelperStartHostile runs the hostile client in mode against sock, as
// the user nobody when this process may switch users, and returns it once
// it reported READY, with the key=value fields of its report.
func memHelperStartHostile(t *testing.T, sock, mode string) (*exec.Cmd, map[string]string) {
	t.Helper()
	bin := os.Args[0]
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		// A copy nobody may run, in a directory nobody may enter.
		dir, err := os.MkdirTemp("", "vrnic-h-bin-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		require.NoError(t, os.Chmod(dir, 0o755))
		self, err := os.ReadFile(os.Args[0])
		require.NoError(t, err)
		bin = filepath.Join(dir, "hostile.test")
		require.NoError(t, os.WriteFile(bin, self, 0o755))
		attr.Credential = &syscall.Credential{Uid: memNobody, Gid: memNobody}
	}
	cmd := exec.Command(bin, "-test.run=^TestMemHelperProcess$", "-test.timeout=0")
	cmd.Env = append(os.Environ(), memHelperModeEnv+"="+mode, memHelperSockEnv+"="+sock, "TMPDIR=/tmp")
	cmd.SysProcAttr = attr
	var stderr launch.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "READY") || strings.HasPrefix(l, "ERROR") {
				lines <- l
				break
			}
		}
		close(lines)
		io.Copy(io.Discard, out)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(3 * time.Minute):
		t.Fatalf("hostile client %s did not report; stderr:\n%s", mode, stderr.String())
	}
	require.True(t, strings.HasPrefix(line, "READY"), "hostile client %s: %q; stderr:\n%s", mode, line, stderr.String())
	fields := map[string]string{}
	for _, f := range strings.Fields(strings.TrimPrefix(line, "READY")) {
		if k, v, ok := strings.Cut(f, "="); ok {
			fields[k] = v
		}
	}
	return cmd, fields
}

// memHelperHostile does what mode says and returns its report.
func memHelperHostile(mode, sock string) (string, error) {
	r, err := memRawOpen(sock)
	if err != nil {
		return "", err
	}
	switch mode {
	case "rings":
		return ringsHostile(sock)
	case "sparse":
		const size = 2 << 30
		start := time.Now()
		mem, pa, err := r.addMem(size)
		if err != nil {
			return "", err
		}
		add := time.Since(start)
		// The memfd's pages in memory now, before this client touched
		// any: what the daemon populated.
		vec := make([]byte, size/4096)
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			return "", fmt.Errorf("mincore: %w", e)
		}
		populated := 0
		for _, v := range vec {
			populated += int(v & 1)
		}
		copy(mem, "hostile")
		pd, err := r.allocPD()
		if err != nil {
			return "", err
		}
		// The page list of all 2 GiB in the region's last 4 MiB.
		pbl := size - 4<<20
		for i := range size / 4096 {
			binary.LittleEndian.PutUint64(mem[pbl+8*i:], pa+uint64(i)*4096)
		}
		errAll := r.regMR(pd, size, size/4096, pa+uint64(pbl))
		err256 := r.regMR(pd, 256<<20, 65536, pa+uint64(pbl))
		return fmt.Sprintf("add_ms=%d populated_pages=%d all=%s mr256=%s", add.Milliseconds(), populated, memErrName(errAll), memErrName(err256)), nil
	case "alias", "many":
		size, pages, tries := 16<<20, 1<<20, 64
		if mode == "many" {
			size, pages, tries = 64<<20, 8192, 4096
		}
		mem, pa, err := r.addMem(size)
		if err != nil {
			return "", err
		}
		copy(mem, "hostile")
		pd, err := r.allocPD()
		if err != nil {
			return "", err
		}
		pbl := size / 2
		for i := range pages {
			page := pa // alias: every page is page 0
			if mode == "many" {
				page = pa + uint64(pages-1-i)*4096 // scattered: no two adjacent
			}
			binary.LittleEndian.PutUint64(mem[pbl+8*i:], page)
		}
		ok := 0
		var first error
		for range tries {
			if err := r.regMR(pd, uint64(pages)*4096, uint32(pages), pa+uint64(pbl)); err != nil {
				if first == nil {
					first = err
				}
				continue
			}
			ok++
		}
		return fmt.Sprintf("ok=%d err=%s", ok, memErrName(first)), nil
	}
	return "", fmt.Errorf("unknown mode %q", mode)
}

// memErrName is "ok", an errno's name, or the error.
func memErrName(err error) string {
	var e *memRawError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &e):
		return unix.ErrnoName(e.errno)
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}

// memRaw is a bare client of the control ABI: page lists verbs would not
// build.
type memRaw struct {
	c   *net.UnixConn
	seq uint32
	buf []byte
	oob []byte
}

type memRawError struct {
	errno syscall.Errno
	msg   string
}

func (e *memRawError) Error() string { return fmt.Sprintf("%v: %s", e.errno, e.msg) }

func memRawOpen(sock string) (*memRaw, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	r := &memRaw{c: c, buf: make([]byte, abi.MaxMsgSize+1), oob: make([]byte, unix.CmsgSpace(4*4))}
	req := abi.CmdOpenContextReq{ABIVersion: abi.Version}
	copy(req.ClientName[:], "hostile")
	var resp abi.RespOpenContext
	return r, r.call(abi.CmdOpenContext, &req, nil, &resp)
}

func (r *memRaw) call(op abi.Cmd, req any, fds []int, resp any) error {
	if err := r.send(op, req, fds); err != nil {
		return err
	}
	return r.recv(resp)
}

// send sends a command without waiting for its reply.
func (r *memRaw) send(op abi.Cmd, req any, fds []int) error {
	n := abi.SizeofMsgHdr
	if req != nil {
		k, err := abi.Marshal(r.buf[n:], req)
		if err != nil {
			return err
		}
		n += k
	}
	r.seq++
	h := abi.MsgHdr{Opcode: op, Length: uint32(n), Seq: r.seq}
	h.Put(r.buf)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	r.c.SetDeadline(time.Now().Add(2 * time.Minute))
	_, _, err := r.c.WriteMsgUnix(r.buf[:n], oob, nil)
	return err
}

// recv reads the reply to the command sent last into resp.
func (r *memRaw) recv(resp any) error {
	m, oobn, _, _, err := r.c.ReadMsgUnix(r.buf, r.oob)
	if err != nil {
		return err
	}
	closeRights(r.oob[:oobn]) // OPEN_CONTEXT's doorbell page and kick eventfd: not needed
	var rh abi.MsgHdr
	if err := rh.Decode(r.buf[:m]); err != nil {
		return err
	}
	body := r.buf[abi.SizeofMsgHdr:m]
	if rh.Status != 0 {
		msg, _, _ := bytes.Cut(body, []byte{0})
		return &memRawError{errno: syscall.Errno(rh.Status), msg: string(msg)}
	}
	if resp != nil {
		_, err = abi.Unmarshal(body, resp)
	}
	return err
}

// addMem creates a sealed memfd of size bytes (sparse), maps it and adds
// it; it returns the mapping and the region's PA.
func (r *memRaw) addMem(size int) ([]byte, uint64, error) {
	fd, err := unix.MemfdCreate("hostile", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, 0, err
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, 0, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		return nil, 0, err
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, 0, err
	}
	var resp abi.RespAddHostMem
	if err := r.call(abi.CmdAddHostMem, &abi.CmdAddHostMemReq{Length: uint64(size)}, []int{fd}, &resp); err != nil {
		return nil, 0, err
	}
	return mem, resp.PABase, nil
}

func (r *memRaw) allocPD() (uint32, error) {
	var resp abi.RespAllocPD
	err := r.call(abi.CmdAllocPD, nil, nil, &resp)
	return resp.PDHandle, err
}

// regMR registers length bytes at IOVA 0 in 4 KiB pages listed at pbl.
func (r *memRaw) regMR(pd uint32, length uint64, npages uint32, pbl uint64) error {
	var resp abi.RespRegMR
	return r.call(abi.CmdRegMR, &abi.CmdRegMRReq{Length: length, PBLPA: pbl, PDHandle: pd,
		Access: abi.AccessLocalWrite, PageShift: abi.PageShift4K, NPages: npages}, nil, &resp)
}

// memVictim is a well-behaved client: two RC QPs of one context connected
// to each other; each step RDMA WRITEs a fresh pattern from A's memory to
// B's, checks B's memory, READs it back into A's and checks that, then
// times one command.
type memVictim struct {
	t        testing.TB
	c        *verbs.Context
	pd       *verbs.PD
	cq       *verbs.CQ
	qpA, qpB *verbs.QP
	local    *verbs.Buffer // source [0, n), READ destination [n, 2n)
	tgt      *verbs.Buffer
	mrA, mrB *verbs.MR
	wc       []abi.CQE
	seq      uint64

	mu     sync.Mutex
	st     memVictimStats
	lat    []time.Duration // see takeLatencies
	ops    int
	last   time.Time
	stop   chan struct{}
	done   chan struct{}
	psnA   uint32
	infoA  rcpair.Info
	infoB  rcpair.Info
	closed bool
}

type memVictimStats struct {
	maxGap, maxCtl time.Duration
	err            error
}

const memVictimBytes = 64 << 10

func memHelperNewVictim(t testing.TB, sock string) *memVictim {
	t.Helper()
	v := &memVictim{t: t, wc: make([]abi.CQE, 16), stop: make(chan struct{}), done: make(chan struct{})}
	var err error
	v.c, err = verbs.Open(sock, verbs.WithClientName("victim"))
	require.NoError(t, err)
	t.Cleanup(func() { v.stopAndWait(); v.c.Close() })
	v.pd, err = v.c.AllocPD()
	require.NoError(t, err)
	v.cq, err = v.c.CreateCQ(64, nil)
	require.NoError(t, err)
	qpAttr := verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: v.cq, RecvCQ: v.cq, Cap: abi.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}
	v.qpA, err = v.pd.CreateQP(qpAttr)
	require.NoError(t, err)
	v.qpB, err = v.pd.CreateQP(qpAttr)
	require.NoError(t, err)
	v.local, err = v.c.Alloc(2*memVictimBytes, 4096)
	require.NoError(t, err)
	v.tgt, err = v.c.Alloc(memVictimBytes, 4096)
	require.NoError(t, err)
	v.mrA, err = v.pd.RegMR(v.local, abi.AccessLocalWrite)
	require.NoError(t, err)
	v.mrB, err = v.pd.RegMR(v.tgt, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead)
	require.NoError(t, err)
	gid, err := v.c.QueryGID(1, 0)
	require.NoError(t, err)
	v.infoA = rcpair.Local(v.qpA, 100, gid.GID, v.mrA)
	v.infoB = rcpair.Local(v.qpB, 5000, gid.GID, v.mrB)
	attr := rcpair.Attr{MTU: abi.MTU4096, MaxRdAtomic: 1}
	require.NoError(t, rcpair.Connect(v.qpA, 100, v.infoB, attr))
	require.NoError(t, rcpair.Connect(v.qpB, 5000, v.infoA, attr))
	require.NoError(t, v.step(), "the victim works before anything else")
	return v
}

// post posts one signaled RDMA WRITE or READ on QP A against rkey at va
// of B's memory and waits for its completion.
func (v *memVictim) post(op abi.WROpcode, sge abi.SGE, rkey uint32, va uint64) (abi.WCStatus, error) {
	v.seq++
	id := v.seq
	if err := v.qpA.PostSend(&verbs.SendWR{WrID: id, Opcode: op, Flags: abi.SendSignaled, SGL: []abi.SGE{sge}, RemoteAddr: va, RKey: rkey}); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n := v.cq.Poll(v.wc)
		for _, e := range v.wc[:n] {
			if e.WrID == id {
				return e.Status, nil
			}
		}
		if n == 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}
	return 0, fmt.Errorf("no completion for WR %d in 10 s", id)
}

// step is one round of the victim's work.
func (v *memVictim) step() error {
	n := uint32(memVictimBytes)
	src, dst := v.local.Bytes[:n], v.local.Bytes[n:2*n]
	for i := range src {
		src[i] = byte(v.seq*7 + uint64(i)*13)
	}
	clear(dst)
	start := time.Now()
	st, err := v.post(abi.WRRDMAWrite, v.mrA.SGE(0, n), v.mrB.RKey, v.mrB.Addr)
	if err != nil || st != abi.WCSuccess {
		return fmt.Errorf("RDMA WRITE: status %v, %v", st, err)
	}
	v.took(start, false)
	if !bytes.Equal(v.tgt.Bytes, src) {
		return errors.New("the victim's target memory differs from what it wrote")
	}
	start = time.Now()
	st, err = v.post(abi.WRRDMARead, v.mrA.SGE(n, n), v.mrB.RKey, v.mrB.Addr)
	if err != nil || st != abi.WCSuccess {
		return fmt.Errorf("RDMA READ: status %v, %v", st, err)
	}
	v.took(start, false)
	if !bytes.Equal(dst, src) {
		return errors.New("the victim read back other bytes than it wrote")
	}
	start = time.Now()
	if _, err := v.c.QueryDevice(); err != nil {
		return fmt.Errorf("QUERY_DEVICE: %w", err)
	}
	v.took(start, true)
	return nil
}

// memVictimMaxSamples bounds the latencies kept between two
// takeLatencies.
const memVictimMaxSamples = 1 << 18

// took records the latency of one operation that started at start (a
// command when ctl).
func (v *memVictim) took(start time.Time, ctl bool) {
	d := time.Since(start)
	v.mu.Lock()
	defer v.mu.Unlock()
	if ctl {
		v.st.maxCtl = max(v.st.maxCtl, d)
	}
	if len(v.lat) < memVictimMaxSamples {
		v.lat = append(v.lat, d)
	}
}

// takeLatencies returns the latencies of the operations (RDMA WRITE,
// RDMA READ, QUERY_DEVICE) done since the last call, in order.
func (v *memVictim) takeLatencies() []time.Duration {
	v.mu.Lock()
	defer v.mu.Unlock()
	l := v.lat
	v.lat = nil
	return l
}

// start runs steps in a goroutine until stopAndWait.
func (v *memVictim) start() {
	v.last = time.Now()
	go func() {
		defer close(v.done)
		for {
			select {
			case <-v.stop:
				return
			default:
			}
			err := v.step()
			v.mu.Lock()
			now := time.Now()
			v.st.maxGap = max(v.st.maxGap, now.Sub(v.last))
			v.last = now
			if err != nil {
				v.st.err = err
				v.mu.Unlock()
				return
			}
			v.ops++
			v.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
}

// progress returns the steps done so far and the statistics.
func (v *memVictim) progress() (int, memVictimStats) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.ops, v.st
}

func (v *memVictim) stopAndWait() {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return
	}
	v.closed = true
	started := !v.last.IsZero()
	v.mu.Unlock()
	close(v.stop)
	if started {
		<-v.done
	}
}
