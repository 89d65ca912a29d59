package device

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestQPTable checks the table against a map through random puts and
// deletes, with keys that collide on purpose (a constant hash: one probe
// run) and with the real hashes.
func TestQPTable(t *testing.T) {
	for _, name := range []string{"qpn", "collide", "peer"} {
		t.Run(name, func(t *testing.T) {
			var tab interface {
				put(*QP)
				len() int
				list() []*QP
			}
			var get func(*QP) *QP
			var del func(*QP)
			switch name {
			case "qpn":
				x := qpnTable()
				tab, get, del = x, func(q *QP) *QP { return x.get(q.qpn) }, func(q *QP) { x.delete(q.qpn) }
			case "collide":
				x := newQPTable(func(q *QP) uint32 { return q.qpn }, func(uint64, uint32) uint64 { return 5 })
				tab, get, del = x, func(q *QP) *QP { return x.get(q.qpn) }, func(q *QP) { x.delete(q.qpn) }
			case "peer":
				x := peerTable()
				tab, get, del = x, func(q *QP) *QP { return x.get(q.peer) }, func(q *QP) { x.delete(q.peer) }
			}
			r := rand.New(rand.NewPCG(1, 2))
			ref := map[uint32]*QP{}
			var all []*QP
			for i := range 3000 {
				if len(all) > 0 && r.IntN(3) == 0 {
					j := r.IntN(len(all))
					q := all[j]
					all[j] = all[len(all)-1]
					all = all[:len(all)-1]
					del(q)
					delete(ref, q.qpn)
					require.Nil(t, get(q), "deleted QP %d still found", q.qpn)
				} else {
					q := &QP{qpn: uint32(i)*7919 + 3}
					q.peer = peerKey{qpn: q.qpn}
					q.peer.gid[15] = byte(i)
					tab.put(q)
					ref[q.qpn] = q
					all = append(all, q)
				}
				require.Equal(t, len(ref), tab.len())
				if i%97 == 0 {
					for _, q := range ref {
						require.Same(t, q, get(q), "QP %d", q.qpn)
					}
					require.Len(t, tab.list(), len(ref))
				}
			}
			for _, q := range ref {
				require.Same(t, q, get(q))
				del(q)
			}
			require.Zero(t, tab.len())
		})
	}
}
