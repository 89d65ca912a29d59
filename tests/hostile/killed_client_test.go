package hostile

// The clients of the SIGKILL probe (sigkill_test.go) and of the fairness
// probe: processes of another uid, each with two RC QPs connected to each
// other running traffic at full speed, that announce a point of their
// work ("OPS at <point>") and are killed there by the probe.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/rcpair"
	"github.com/vrnic/vrnic/verbs"
)

// killedPointEnv names the client's kill point.
const killedPointEnv = "VRNIC_KILLED_POINT"

// The kill points. In every one the client's QPs run traffic.
var killedPoints = []string{
	"traffic", // at a random moment of the traffic
	"churn",   // at a random moment of registering and deregistering MRs and creating, connecting and destroying QPs
	"reg",     // right after sending REG_MR of 16 MiB in 4096 scattered pages, its reply unread
	"addmem",  // right after sending ADD_HOST_MEM of a 64 MiB memfd, its reply unread
}

// killedPair is a client's two RC QPs connected to each other.
type killedPair struct {
	c      *verbs.Context
	pd     *verbs.PD
	cq     *verbs.CQ
	qp, q2 *verbs.QP
	mr     *verbs.MR
	gid    [16]byte
	done   atomic.Int64 // completions polled
}

const killedBuf = 1 << 20

func killedConnect(sock string) (*killedPair, error) {
	k := &killedPair{}
	var err error
	if k.c, err = verbs.Open(sock, verbs.WithClientName("killed")); err != nil {
		return nil, err
	}
	if k.pd, err = k.c.AllocPD(); err != nil {
		return nil, err
	}
	if k.cq, err = k.c.CreateCQ(256, nil); err != nil {
		return nil, err
	}
	buf, err := k.c.Alloc(killedBuf, 4096)
	if err != nil {
		return nil, err
	}
	if k.mr, err = k.pd.RegMR(buf, abi.AccessAll); err != nil {
		return nil, err
	}
	g, err := k.c.QueryGID(1, 0)
	if err != nil {
		return nil, err
	}
	k.gid = g.GID
	k.qp, k.q2, err = k.pair()
	return k, err
}

// pair creates two RC QPs and connects them to each other.
func (k *killedPair) pair() (*verbs.QP, *verbs.QP, error) {
	attr := verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: k.cq, RecvCQ: k.cq,
		Cap: abi.QPCap{MaxSendWR: 64, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}
	a, err := k.pd.CreateQP(attr)
	if err != nil {
		return nil, nil, err
	}
	b, err := k.pd.CreateQP(attr)
	if err != nil {
		return nil, nil, err
	}
	ia, ib := rcpair.Local(a, 1, k.gid, k.mr), rcpair.Local(b, 2, k.gid, k.mr)
	ra := rcpair.Attr{MTU: abi.MTU4096, MaxRdAtomic: 4}
	if err := rcpair.Connect(a, ia.PSN, ib, ra); err != nil {
		return nil, nil, err
	}
	return a, b, rcpair.Connect(b, ib.PSN, ia, ra)
}

// traffic keeps 32 RDMA WRITEs and READs of 16 KiB in flight from qp to
// the other half of the buffer, forever; it returns on the first failure.
// It sleeps 20 µs when it finds no completion.
func (k *killedPair) traffic() error {
	const inflight, size = 32, 16 << 10
	wc := make([]abi.CQE, 64)
	posted, id := 0, uint64(0)
	for {
		for ; posted < inflight; posted++ {
			id++
			op := abi.WRRDMAWrite
			if id%2 == 1 {
				op = abi.WRRDMARead
			}
			off := uint32(id%16) * size
			err := k.qp.PostSend(&verbs.SendWR{WrID: id, Opcode: op, Flags: abi.SendSignaled,
				SGL: []abi.SGE{k.mr.SGE(off, size)}, RemoteAddr: k.mr.Addr + killedBuf/2 + uint64(off), RKey: k.mr.RKey})
			if err != nil {
				return err
			}
		}
		n := k.cq.Poll(wc)
		for _, e := range wc[:n] {
			if e.Status != abi.WCSuccess {
				return fmt.Errorf("WR %d: %v", e.WrID, e.Status)
			}
		}
		posted -= n
		k.done.Add(int64(n))
		if n == 0 {
			// As the victim does: the daemon's engine is kept busy, not
			// the machine's CPUs (50 clients spinning on 2 CPUs would
			// measure the kernel's scheduler, not the daemon).
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// churn registers and deregisters MRs and creates, connects and destroys
// QP pairs, forever; after each round it calls round.
func (k *killedPair) churn(round func()) error {
	buf, err := k.c.Alloc(256<<10, 4096)
	if err != nil {
		return err
	}
	for {
		mr, err := k.pd.RegMR(buf, abi.AccessAll)
		if err != nil {
			return err
		}
		a, b, err := k.pair()
		if err != nil {
			return err
		}
		if err := errors.Join(a.Destroy(), b.Destroy(), mr.Dereg()); err != nil {
			return err
		}
		round()
	}
}

// killedHelper is one killed client: it connects its QPs, starts their
// traffic, goes to its kill point ($VRNIC_KILLED_POINT), says "at
// <point>" and waits there to be killed. It says "error ..." if it cannot
// get there.
func killedHelper(say func(string, ...any), sock string) {
	point := os.Getenv(killedPointEnv)
	k, err := killedConnect(sock)
	if err != nil {
		say("error connect: %v", err)
		return
	}
	var once sync.Once
	fail := func(err error) { once.Do(func() { say("error %s: %v", point, err); os.Exit(1) }) }
	go func() { fail(k.traffic()) }()
	for deadline := time.Now().Add(30 * time.Second); k.done.Load() < 64; time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			fail(fmt.Errorf("traffic: %d completions in 30 s", k.done.Load()))
		}
	}
	switch point {
	case "traffic":
	case "churn":
		rounds := make(chan struct{}, 1)
		go func() {
			fail(k.churn(func() {
				select {
				case rounds <- struct{}{}:
				default:
				}
			}))
		}()
		<-rounds
	case "reg", "addmem":
		if err := killedMidCommand(point, sock); err != nil {
			fail(err)
		}
	default:
		fail(errors.New("unknown kill point"))
	}
	say("at %s", point)
	select {} // until killed
}

// killedMidCommand sends, on a connection of its own, the command of the
// kill point and returns without reading the reply.
func killedMidCommand(point, sock string) error {
	r, err := memRawOpen(sock)
	if err != nil {
		return err
	}
	if point == "addmem" {
		const size = 64 << 20
		fd, err := unix.MemfdCreate("killed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			return err
		}
		if err := unix.Ftruncate(fd, size); err != nil {
			return err
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
			return err
		}
		return r.send(abi.CmdAddHostMem, &abi.CmdAddHostMemReq{Length: size}, []int{fd})
	}
	const pages = 4096
	mem, pa, err := r.addMem(pages*4096 + pages*8)
	if err != nil {
		return err
	}
	pd, err := r.allocPD()
	if err != nil {
		return err
	}
	pbl := pages * 4096
	for i := range pages {
		binary.LittleEndian.PutUint64(mem[pbl+8*i:], pa+uint64(pages-1-i)*4096) // no two adjacent
	}
	return r.send(abi.CmdRegMR, &abi.CmdRegMRReq{Length: pages * 4096, PBLPA: pa + uint64(pbl), PDHandle: pd,
		Access: abi.AccessLocalWrite | abi.AccessRemoteWrite, PageShift: abi.PageShift4K, NPages: pages}, nil)
}

// killedStats is what killedRun saw.
type killedStats struct {
	at     map[string]int // clients killed at each point
	errors []string       // clients that did not get to their point
}

// killedRun runs n killed clients as uid nobody against d, parallel at a
// time, each at a kill point drawn from seed, killed (SIGKILL, by its
// pid) when it gets there, after a delay drawn from seed (up to 20 ms)
// for the points that are a moment of ongoing work. It does not fail t
// (it may run in a goroutine of the probe); the errors are returned.
func killedRun(t testing.TB, e *opsEnv, d *opsDaemon, seed uint64, n, parallel int) killedStats {
	st := killedStats{at: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range parallel {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				r := rand.New(rand.NewPCG(seed, uint64(i)))
				point := killedPoints[r.IntN(len(killedPoints))]
				delay := time.Duration(r.IntN(20_000)) * time.Microsecond
				err := killedOne(t, e, d, point, delay)
				mu.Lock()
				if err != nil {
					st.errors = append(st.errors, fmt.Sprintf("client %d (%s): %v", i, point, err))
				} else {
					st.at[point]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return st
}

// killedOne runs one killed client to its point and kills it there.
func killedOne(t testing.TB, e *opsEnv, d *opsDaemon, point string, delay time.Duration) error {
	p, err := e.opsStart(t, opsAsNobody, "killed", d.socket, killedPointEnv+"="+point)
	if err != nil {
		return err
	}
	defer p.kill()
	l, ok := p.next(60 * time.Second)
	if !ok || l != "at "+point {
		p.kill()
		return fmt.Errorf("did not get to its kill point: %q; output:\n%s", l, &p.out)
	}
	if point == "traffic" || point == "churn" {
		time.Sleep(delay) // a moment of its work
	}
	p.kill()
	return nil
}
