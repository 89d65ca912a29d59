package device

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
)

// qpTable is a table of QPs by a key each QP carries itself (its QPN, or
// the remote QP it claimed): open addressing with linear probing over one
// pointer per slot, at most 3/4 full, removal by backward shift (no
// tombstones). A Go map of the same keys keeps the key beside the pointer
// in every slot (16 bytes for a QPN, 32 for a peer) and leaves its groups
// half empty after growing: the device holds three of these per QP, so
// their slots are a good part of what an idle QP costs (BENCHMARKS.md,
// "Idle QPs"). Insert, lookup and delete are O(1) amortised, as a map's;
// the hash is keyed with a random seed per table, so a client that
// chooses remote GIDs and QPNs cannot line up its keys in one probe run.
//
// The zero value is not usable: newQPTable. Not safe for concurrent use
// (the device's tables are guarded by Device.mu).
type qpTable[K comparable] struct {
	slots []*QP // len 0 or a power of two
	n     int
	seed  uint64
	key   func(*QP) K
	hash  func(seed uint64, k K) uint64
}

func newQPTable[K comparable](key func(*QP) K, hash func(uint64, K) uint64) *qpTable[K] {
	return &qpTable[K]{seed: rand.Uint64(), key: key, hash: hash}
}

// qpnTable returns a table of QPs by QPN.
func qpnTable() *qpTable[uint32] {
	return newQPTable(func(q *QP) uint32 { return q.qpn }, hashQPN)
}

// peerTable returns a table of RC and UC QPs by the remote QP they
// claimed (QP.peer).
func peerTable() *qpTable[peerKey] {
	return newQPTable(func(q *QP) peerKey { return q.peer }, hashPeer)
}

// mix folds the 128-bit product of a and b (the wyhash mixer).
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

const (
	mixK0 = 0xa0761d6478bd642f
	mixK1 = 0xe7037ed1a0b428db
	mixK2 = 0x8ebc6af09c88c6e3
)

func hashQPN(seed uint64, k uint32) uint64 {
	return mix(uint64(k)^seed^mixK0, seed^mixK1)
}

func hashPeer(seed uint64, k peerKey) uint64 {
	a := binary.LittleEndian.Uint64(k.gid[0:8])
	b := binary.LittleEndian.Uint64(k.gid[8:16])
	h := mix(a^seed^mixK0, b^mixK1)
	return mix(h^uint64(k.qpn)^mixK2, seed^mixK1)
}

// len is the number of QPs in the table.
func (t *qpTable[K]) len() int { return t.n }

// home is k's first slot.
func (t *qpTable[K]) home(k K) int {
	return int(t.hash(t.seed, k) & uint64(len(t.slots)-1))
}

// get returns the QP with key k, or nil.
func (t *qpTable[K]) get(k K) *QP {
	if t.n == 0 {
		return nil
	}
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		q := t.slots[i]
		if q == nil {
			return nil
		}
		if t.key(q) == k {
			return q
		}
	}
}

// put enters q under its key, replacing the QP that had the key.
func (t *qpTable[K]) put(q *QP) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	k := t.key(q)
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		p := t.slots[i]
		if p == nil {
			t.slots[i] = q
			t.n++
			return
		}
		if t.key(p) == k {
			t.slots[i] = q
			return
		}
	}
}

// grow doubles the slots (8 at first) and enters every QP again.
func (t *qpTable[K]) grow() {
	old := t.slots
	t.slots = make([]*QP, max(8, 2*len(old)))
	t.n = 0
	for _, q := range old {
		if q != nil {
			t.put(q)
		}
	}
}

// delete removes the QP with key k, if any. The QPs after it in its probe
// run move back so that every QP stays reachable from its home slot.
func (t *qpTable[K]) delete(k K) {
	if t.n == 0 {
		return
	}
	mask := len(t.slots) - 1
	i := t.home(k)
	for {
		q := t.slots[i]
		if q == nil {
			return
		}
		if t.key(q) == k {
			break
		}
		i = (i + 1) & mask
	}
	// Backward shift: j scans the run after the hole at i; a QP whose
	// home is cyclically outside (i, j] can fill the hole.
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		q := t.slots[j]
		if q == nil {
			break
		}
		h := t.home(t.key(q))
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.slots[i] = q
			i = j
		}
	}
	t.slots[i] = nil
	t.n--
}

// list returns the QPs in the table (a copy: the caller may change the
// table while it walks it).
func (t *qpTable[K]) list() []*QP {
	out := make([]*QP, 0, t.n)
	for _, q := range t.slots {
		if q != nil {
			out = append(out, q)
		}
	}
	return out
}

// each calls f for every QP in the table, which f must not change.
func (t *qpTable[K]) each(f func(*QP)) {
	for _, q := range t.slots {
		if q != nil {
			f(q)
		}
	}
}
