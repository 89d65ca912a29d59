package dma

import (
	crand "crypto/rand"
	"math/rand/v2"
)

// keyAlloc hands out MR key indices and variants (see the package
// comment, "Keys"). Guarded by Space.mu.
//
// A key is index<<8 | variant. Nothing about one key tells another:
//
//   - The index is drawn at random from the free indices, except those
//     freed most recently (a FIFO quarantine of up to quarantineMax
//     entries), so keys are not handed out in order and an index just
//     freed is not reused at once.
//   - The lkey and the rkey of an MR share the index and carry two
//     different random variants, so an lkey (which a client may show a
//     peer by mistake, or which leaks through a local SGE) does not give
//     the rkey. Lookups compare the whole key against the lkey for local
//     access and against the rkey for remote access, never across.
//   - Both variants of a new registration differ from both variants the
//     index had at its previous registration, so the keys of the MR that
//     last held an index never name the next one.
//
// The random stream is ChaCha8 seeded from the operating system's CSPRNG.
type keyAlloc struct {
	rng  *rand.ChaCha8
	last []uint16 // per index: lkey variant<<8 | rkey variant last handed out
	pool []uint32 // free indices, picked at random
	// quarantine is a ring of recently freed indices, oldest first; an
	// index moves to pool when quarantine is full or pool is empty.
	quarantine  []uint32
	qHead, qLen int
}

// quarantineMax bounds the quarantine (it holds a quarter of the table at
// most, so a nearly full table still draws from a pool).
const quarantineMax = 4096

func newKeyAlloc(n int) *keyAlloc {
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // never fails on Linux (getrandom)
	k := &keyAlloc{
		rng:        rand.NewChaCha8(seed),
		last:       make([]uint16, n),
		pool:       make([]uint32, 0, n-1),
		quarantine: make([]uint32, min(quarantineMax, (n-1)/4)),
	}
	for i := 1; i < n; i++ {
		k.pool = append(k.pool, uint32(i))
	}
	return k
}

// available reports whether alloc would succeed.
func (k *keyAlloc) available() bool { return len(k.pool)+k.qLen > 0 }

// alloc returns a free index and the lkey and rkey variants for it, or
// false when every index is in use.
func (k *keyAlloc) alloc() (idx uint32, lv, rv uint8, ok bool) {
	if len(k.pool) == 0 {
		if k.qLen == 0 {
			return 0, 0, 0, false
		}
		k.pool = append(k.pool, k.quarantine[k.qHead])
		k.qHead = (k.qHead + 1) % len(k.quarantine)
		k.qLen--
	}
	j := int(k.rng.Uint64() % uint64(len(k.pool)))
	idx = k.pool[j]
	k.pool[j] = k.pool[len(k.pool)-1]
	k.pool = k.pool[:len(k.pool)-1]

	prev := k.last[idx]
	pl, pr := uint8(prev>>8), uint8(prev)
	for lv = k.byte(); lv == pl || lv == pr; lv = k.byte() {
	}
	for rv = k.byte(); rv == pl || rv == pr || rv == lv; rv = k.byte() {
	}
	k.last[idx] = uint16(lv)<<8 | uint16(rv)
	return idx, lv, rv, true
}

func (k *keyAlloc) byte() uint8 { return uint8(k.rng.Uint64()) }

// free returns idx; it rests in the quarantine before it can be drawn.
func (k *keyAlloc) free(idx uint32) {
	if len(k.quarantine) == 0 {
		k.pool = append(k.pool, idx)
		return
	}
	if k.qLen == len(k.quarantine) {
		k.pool = append(k.pool, k.quarantine[k.qHead])
		k.qHead = (k.qHead + 1) % len(k.quarantine)
		k.qLen--
	}
	k.quarantine[(k.qHead+k.qLen)%len(k.quarantine)] = idx
	k.qLen++
}
