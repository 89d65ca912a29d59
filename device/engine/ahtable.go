package engine

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// AHTable is the address handles of one context (or of QP1), by handle.
// Lookup is for the workers: no lock, no allocation, no write. Set and
// Delete are for the control path (serialised by the table's mutex):
// amortised O(1) whatever the number of AHs, so that destroying the n AHs
// of a context costs O(n).
//
// Handles are not dense: a context's objects of every kind share one
// handle space counting up (package device), and QP1 counts its handles
// up without end; so the table hashes them. It is an open-addressing
// table (linear probing) whose slots are atomic pointers to immutable
// entries:
//
//   - Lookup loads the slot array once and follows the handle's probe
//     sequence in it until it finds the handle or an empty slot.
//   - Set stores the handle's entry in the first deleted or empty slot of
//     its probe sequence (or over its own entry); Delete stores the
//     tombstone ahGone in its slot. A slot never goes back to empty, so a
//     store cuts no probe sequence a worker is following.
//   - When live entries and tombstones fill half of the array, or live
//     ones fall under a sixteenth of it, the control path builds an array
//     a quarter full of the live entries (a new hash seed, no tombstone)
//     and publishes it with one atomic store; an empty table has no
//     array. The old array is written no more: a worker still probing it
//     sees the table as it was just before. A rebuild costs O(live AHs)
//     and comes after at least a quarter as many Sets or Deletes: add and
//     remove are amortised O(1).
//
// Every array has its own random hash seed, so a client that spaces its
// handles out (by creating other objects in between) cannot aim them at
// one probe sequence.
//
// A Lookup that starts after Set(h, a) returned returns a (or what a later
// Set put there), one that starts after Delete(h) returned returns nil
// (until h is set again). A worker keeps the *AH it got.
type AHTable struct {
	slots atomic.Pointer[ahSlots] // nil while the table is empty

	mu   sync.Mutex // serialises Set and Delete; guards live and used
	live int        // entries in slots
	used int        // slots not empty: live entries and tombstones
	// work counts the slots Set, Delete and their rebuilds visited (a
	// measure of their cost that no scheduler changes: tests).
	work int
}

// ahSlots is one slot array of an AHTable: a power of two of slots, at
// least ahMinSlots, never more than half of them used.
type ahSlots struct {
	seed uint32
	mask uint32 // len(s) - 1
	s    []atomic.Pointer[ahEntry]
}

// ahEntry is an AH under its handle; immutable.
type ahEntry struct {
	h  uint32
	ah *AH
}

// ahGone is the tombstone of a deleted entry.
var ahGone ahEntry

const ahMinSlots = 8

// home returns the first slot of h's probe sequence: murmur3's 32-bit
// finaliser of the seeded handle.
func (a *ahSlots) home(h uint32) uint32 {
	x := h ^ a.seed
	x ^= x >> 16
	x *= 0x85ebca6b
	x ^= x >> 13
	x *= 0xc2b2ae35
	x ^= x >> 16
	return x & a.mask
}

// Lookup returns the AH of handle h, or nil.
func (t *AHTable) Lookup(h uint32) *AH {
	if t == nil {
		return nil
	}
	a := t.slots.Load()
	if a == nil {
		return nil
	}
	for i := a.home(h); ; i = (i + 1) & a.mask {
		e := a.s[i].Load()
		if e == nil {
			return nil
		}
		if e.h == h && e != &ahGone {
			return e.ah
		}
	}
}

// Set publishes ah as handle h (nil: removes h).
func (t *AHTable) Set(h uint32, ah *AH) {
	if ah == nil {
		t.Delete(h)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.slots.Load()
	if a == nil || (t.used+1)*2 > len(a.s) {
		a = t.rebuildLocked(a, t.live+1)
	}
	free := -1
	for i := a.home(h); ; i = (i + 1) & a.mask {
		e := a.s[i].Load()
		t.work++
		switch {
		case e == nil:
			if free < 0 {
				free = int(i)
				t.used++
			}
			a.s[free].Store(&ahEntry{h: h, ah: ah})
			t.live++
			return
		case e == &ahGone:
			if free < 0 {
				free = int(i)
			}
		case e.h == h:
			a.s[i].Store(&ahEntry{h: h, ah: ah})
			return
		}
	}
}

// Delete removes handle h.
func (t *AHTable) Delete(h uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.slots.Load()
	if a == nil {
		return
	}
	for i := a.home(h); ; i = (i + 1) & a.mask {
		e := a.s[i].Load()
		if e == nil {
			return
		}
		t.work++
		if e.h == h && e != &ahGone {
			a.s[i].Store(&ahGone)
			t.live--
			break
		}
	}
	if t.live*16 < len(a.s) {
		t.rebuildLocked(a, t.live)
	}
}

// rebuildLocked publishes a slot array holding old's live entries, sized
// for n of them (none when n is 0), and returns it.
func (t *AHTable) rebuildLocked(old *ahSlots, n int) *ahSlots {
	t.used = t.live
	if n == 0 {
		t.slots.Store(nil)
		return nil
	}
	size := ahMinSlots
	for size < 4*n {
		size *= 2
	}
	a := &ahSlots{seed: rand.Uint32(), mask: uint32(size - 1), s: make([]atomic.Pointer[ahEntry], size)}
	t.work += size
	if old != nil {
		t.work += len(old.s)
		for i := range old.s {
			e := old.s[i].Load()
			if e == nil || e == &ahGone {
				continue
			}
			j := a.home(e.h)
			for a.s[j].Load() != nil {
				j = (j + 1) & a.mask
			}
			a.s[j].Store(e)
		}
	}
	t.slots.Store(a)
	return a
}

// Len returns the number of AHs.
func (t *AHTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live
}
