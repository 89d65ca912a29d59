package engine

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// workerRig is two engines of w workers each over one in-memory
// network with qps connected QP pairs, their QPNs spread over the
// workers by the steering hash.
type workerRig struct {
	w     int
	pairs [][2]*tqp
	src   []*buffer
	dst   []*buffer
	sig   []int64
}

func newWorkerRig(b *testing.B, w, qps int) *workerRig {
	o := defaultOpts()
	o.mtu = roce.MTU4096
	nw := newNetworkMode(b, roce.ModeEthernet, 256, 256)
	na := newNode(b, nw, "10.0.0.1", w, nil)
	nb := newNode(b, nw, "10.0.0.2", w, nil)
	r := &workerRig{w: w, sig: make([]int64, qps)}
	owned := make([]int, w)
	for i := range qps {
		qa, qb := uint32(0x100+2*i), uint32(0x101+2*i)
		owned[roce.SteerQueue(qa, w)]++
		a, pb := na.newQP(b, qa, o), nb.newQP(b, qb, o)
		connect(b, a, pb, o)
		r.pairs = append(r.pairs, [2]*tqp{a, pb})
		r.src = append(r.src, na.buffer(8, 0x1000+uint64(i)<<16, abi.AccessAll, uint64(i)))
		r.dst = append(r.dst, nb.buffer(8, 0x1000+uint64(i)<<16, abi.AccessAll, uint64(i)+1000))
	}
	for i, n := range owned {
		require.NotZero(b, n, "worker %d of %d owns no QP: the benchmark would not use it", i, w)
	}
	return r
}

// run posts msgs 8-byte WRITEs spread over the pairs, batches of 16 per
// QP with the last signaled, from two driver goroutines (each drives
// half the QPs; the same two whatever w), and waits for all of them.
func (r *workerRig) run(msgs int) {
	const batch = 16
	per := max(msgs/len(r.pairs)/batch, 1)
	var wg sync.WaitGroup
	for d := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				for i := d; i < len(r.pairs); i += 2 {
					wr := abi.SendWQE{Opcode: abi.WRRDMAWrite, RemoteAddr: r.dst[i].va, RKey: r.dst[i].key}
					r.pairs[i][0].postBatch(wr, []abi.SGE{r.src[i].sge(0, 8)}, batch)
				}
				for i := d; i < len(r.pairs); i += 2 {
					r.pairs[i][0].waitSignaled(&r.sig[i])
				}
			}
		}()
	}
	wg.Wait()
}

// cpuTime is the process's user and system time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkWorkers measures the aggregate 8-byte WRITE rate of 64 QP
// pairs between two engines with 1, 2 and 4 workers each, in one run
// (the 1-worker rig before and after the others, its mean the
// baseline), and reports each as a ratio to 1 worker, with the messages
// per CPU-second of the process (drivers included). Each worker owns
// the QPs the steering hash gives it and runs them without locks; the
// aggregate grows with workers while cores are free, and the rate per
// CPU-second shows what running more workers costs when they are not.
func BenchmarkWorkers(b *testing.B) {
	const qps = 64
	ws := []int{1, 2, 4}
	rigs := make(map[int]*workerRig)
	for _, w := range ws {
		rigs[w] = newWorkerRig(b, w, qps)
		rigs[w].run(qps * 16)
	}
	measure := func(w int) (rate, perCPU float64) {
		c0, t0 := cpuTime(), time.Now()
		rigs[w].run(b.N)
		d, c := time.Since(t0), cpuTime()-c0
		n := float64(max(b.N/qps/16, 1) * qps * 16)
		return n / d.Seconds(), n / c.Seconds()
	}
	b.ResetTimer()
	r1a, c1a := measure(1)
	rates := map[int][2]float64{}
	for _, w := range ws[1:] {
		r, c := measure(w)
		rates[w] = [2]float64{r, c}
	}
	r1b, c1b := measure(1)
	b.StopTimer()
	r1, c1 := (r1a+r1b)/2, (c1a+c1b)/2
	b.ReportMetric(r1, "w1-msg/s")
	b.ReportMetric(c1, "w1-msg/cpu-s")
	for _, w := range ws[1:] {
		b.ReportMetric(rates[w][0]/r1, fmt.Sprintf("w%d/w1", w))
		b.ReportMetric(rates[w][1]/c1, fmt.Sprintf("w%d/w1-per-cpu", w))
	}
}
