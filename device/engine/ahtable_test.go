package engine

import (
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testAH returns a distinct AH (its PD tells it apart).
func testAH(pd uint32) *AH {
	return &AH{attr: AHAttr{PD: pd, Local: netip.MustParseAddr("10.0.0.1"), Remote: netip.MustParseAddr("10.0.0.2")}}
}

// slotsOf returns the table's slot array size (0: none).
func (t *AHTable) slotsOf() int {
	if a := t.slots.Load(); a != nil {
		return len(a.s)
	}
	return 0
}

func TestAHTableSetLookupDelete(t *testing.T) {
	var nilTable *AHTable
	assert.Nil(t, nilTable.Lookup(1), "a QP without a table")

	var tab AHTable
	assert.Nil(t, tab.Lookup(0))
	assert.Nil(t, tab.Lookup(1))
	assert.Zero(t, tab.slotsOf(), "an empty table has no array")

	a, b, c := testAH(1), testAH(2), testAH(3)
	tab.Set(0, a) // handle 0 is a handle like any other here
	tab.Set(7, b)
	tab.Set(1<<31, c)
	assert.Same(t, a, tab.Lookup(0))
	assert.Same(t, b, tab.Lookup(7))
	assert.Same(t, c, tab.Lookup(1<<31))
	assert.Nil(t, tab.Lookup(8))
	assert.Equal(t, 3, tab.Len())

	tab.Set(7, c) // replaced
	assert.Same(t, c, tab.Lookup(7))
	assert.Equal(t, 3, tab.Len())

	tab.Delete(0)
	assert.Nil(t, tab.Lookup(0), "deleted: the tombstone is not handle 0")
	tab.Delete(0) // twice: nothing
	tab.Delete(12345)
	assert.Equal(t, 2, tab.Len())
	tab.Set(1<<31, nil) // Set nil removes
	assert.Nil(t, tab.Lookup(1<<31))
	assert.Same(t, c, tab.Lookup(7))
	tab.Delete(7)
	assert.Zero(t, tab.Len())
	assert.Zero(t, tab.slotsOf(), "emptied: the array is dropped")
	tab.Set(7, a)
	assert.Same(t, a, tab.Lookup(7), "set again")
}

// TestAHTableSparseHandles: handles spread over the whole 32-bit space
// (the device's handles count up through every object kind; QP1's never
// restart) cost what dense ones cost in memory: the array follows the
// number of AHs, not the handles' values.
func TestAHTableSparseHandles(t *testing.T) {
	var tab AHTable
	const n = 4096
	for i := range uint32(n) {
		tab.Set(i*1_048_573, testAH(i)) // a prime stride: 4096 handles over the 32-bit space
	}
	for i := range uint32(n) {
		require.Equal(t, i, tab.Lookup(i*1_048_573).attr.PD)
		require.Nil(t, tab.Lookup(i*1_048_573+1))
	}
	assert.LessOrEqual(t, tab.slotsOf(), 8*n, "at least an eighth full")
	assert.GreaterOrEqual(t, tab.slotsOf(), 2*n, "at most half full")
}

// TestAHTableModel runs seeded random adds, replaces and removes against
// a map and checks the table agrees after each, and that it keeps to its
// bounds: never more than half of the slots used, and once more than a
// few AHs are held, at least a sixteenth of them live.
func TestAHTableModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var tab AHTable
	model := map[uint32]*AH{}
	check := func(step int, h uint32) {
		if got := tab.Lookup(h); got != model[h] {
			t.Fatalf("step %d: handle %d resolves to %p, want %p", step, h, got, model[h])
		}
	}
	peak := 0
	for step := range 60_000 {
		// Phases: grow to a few thousand, shrink to nothing, again.
		grow := (step/10_000)%2 == 0
		h := uint32(r.IntN(8192))
		if add := r.IntN(10) < 6; add == grow {
			a := testAH(uint32(step))
			tab.Set(h, a)
			model[h] = a
		} else {
			tab.Delete(h)
			delete(model, h)
		}
		check(step, h)
		check(step, uint32(r.IntN(8192)))
		used, live, size := tab.used, tab.live, tab.slotsOf() // no Set or Delete runs
		if live != len(model) {
			t.Fatalf("step %d: %d live, want %d", step, live, len(model))
		}
		if 2*used > size {
			t.Fatalf("step %d: %d of %d slots used", step, used, size)
		}
		if size > ahMinSlots && 16*live < size {
			t.Fatalf("step %d: %d slots for %d AHs", step, size, live)
		}
		if live == 0 && size != 0 {
			t.Fatalf("step %d: %d slots for no AH", step, size)
		}
		peak = max(peak, live)
	}
	for h := range uint32(8192) {
		check(-1, h)
	}
	assert.Greater(t, peak, 1000, "the model went through thousands of AHs")
	assert.Equal(t, len(model), tab.Len())
}

// TestAHTableConcurrent: workers look handles up without a lock while
// the control path adds and removes (run it with -race). Handles of
// three kinds: stable ones (set before, never removed) always resolve to
// their AH; churned ones resolve to nil or their own AH, never another;
// removed ones resolve to nil once their removal was announced (a lookup
// that starts after Delete returned).
func TestAHTableConcurrent(t *testing.T) {
	const (
		stable  = 256
		churned = 4096
		workers = 4
	)
	var tab AHTable
	ahs := make([]*AH, stable+churned)
	for i := range ahs {
		ahs[i] = testAH(uint32(i))
	}
	handle := func(i int) uint32 { return uint32(i)*3 + 1 } // spaced out, as the device's are
	for i := range stable {
		tab.Set(handle(i), ahs[i])
	}
	var removed [churned]atomic.Bool
	var stop atomic.Bool
	var lookups atomic.Int64
	errs := make(chan string, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 9))
			n := int64(0)
			for !stop.Load() {
				n++
				i := r.IntN(stable + churned)
				if i < stable {
					if got := tab.Lookup(handle(i)); got != ahs[i] {
						errs <- "a stable handle did not resolve to its AH"
						return
					}
					continue
				}
				gone := removed[i-stable].Load()
				got := tab.Lookup(handle(i))
				if got != nil && got != ahs[i] {
					errs <- "a handle resolved to another handle's AH"
					return
				}
				if gone && got != nil {
					errs <- "a removed handle resolved after its removal"
					return
				}
				if tab.Lookup(handle(stable+churned)) != nil {
					errs <- "a handle never set resolved"
					return
				}
			}
			lookups.Add(n)
		})
	}
	// The control path: add the churned handles, remove half, add them
	// back, then remove them all for good, announcing each removal.
	for round := range 3 {
		for i := stable; i < stable+churned; i++ {
			if round == 1 && i%2 == 0 {
				tab.Delete(handle(i))
				continue
			}
			tab.Set(handle(i), ahs[i])
		}
	}
	for i := stable; i < stable+churned; i++ {
		tab.Delete(handle(i))
		removed[i-stable].Store(true)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	assert.Equal(t, stable, tab.Len())
	for i := range stable {
		assert.Same(t, ahs[i], tab.Lookup(handle(i)))
	}
	t.Logf("%d lookups beside the control path", lookups.Load())
}

// TestAHTableLookupAllocs: the worker's lookup allocates nothing, hit or
// miss.
func TestAHTableLookupAllocs(t *testing.T) {
	var tab AHTable
	for i := range uint32(4096) {
		tab.Set(i*5+2, testAH(i))
	}
	var sink *AH
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		sink = tab.Lookup(2)
		sink = tab.Lookup(4095*5 + 2)
		sink = tab.Lookup(3)
	}))
	_ = sink
}

// TestAHTableLinearWork: creating and then destroying n AHs (a context's
// whole table, as its release does) visits O(n) slots, rebuilds
// included: the work per AH stays within a constant as n grows 64-fold.
// (Destroying them once copied the table for each, O(n²): a release of
// 4,096 AHs held the device lock for about a second.) The count is of
// slots visited, so no scheduler changes it.
func TestAHTableLinearWork(t *testing.T) {
	perAH := func(n int) float64 {
		var tab AHTable
		// Handles spaced as a context's are (other objects in between).
		for i := range uint32(n) {
			tab.Set(i*3+1, testAH(i))
		}
		for i := range uint32(n) {
			tab.Delete(i*3 + 1)
		}
		require.Zero(t, tab.Len())
		return float64(tab.work) / float64(n)
	}
	small, large := perAH(64), perAH(4096)
	t.Logf("slots visited per AH: %.1f for 64 AHs, %.1f for 4096", small, large)
	assert.Less(t, large, 40.0, "slots visited per AH created and destroyed")
	assert.Less(t, large, 2*small+8, "the work per AH does not grow with the table")
}
