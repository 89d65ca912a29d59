package faults

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/roce"
)

// BenchmarkNoRules measures what the fault layer costs with no rule
// installed (and no capture running): batches of 32 frames sent from one
// port of an in-memory network to another and received there, once
// through the bare ports and once through the fault layer, alternately
// in the same run. It reports ns per frame of each and their ratio
// (layer/bare): the layer's price is one atomic load per batch and call.
// A third case, "one rule", has a rule installed that matches nothing
// (another QPN): the price of parsing and matching every frame.
func BenchmarkNoRules(b *testing.B) {
	nw, err := link.NewNetwork(link.Config{Mode: roce.ModeUDP, FrameCap: frameCap, QueueLen: 256, Buffers: 1024})
	require.NoError(b, err)
	pa, err := nw.Attach(local.Addr(), 1, nil)
	require.NoError(b, err)
	pb, err := nw.Attach(peer.Addr(), 1, nil)
	require.NoError(b, err)
	const batch = 32
	tmpl := pkt(b, local, peer, roce.OpRCWriteMiddle, 0x11, 1, 1024)
	tx, rx := make([][]byte, batch), make([][]byte, batch)
	txTo, rxFrom := make([]netip.AddrPort, batch), make([]netip.AddrPort, batch)
	for i := range tx {
		tx[i] = make([]byte, frameCap)
		rx[i] = make([]byte, frameCap)
		txTo[i] = peer
	}
	round := func(s, r engine.Link) {
		for i := range tx {
			tx[i] = tx[i][:copy(tx[i][:cap(tx[i])], tmpl)]
		}
		if n, err := s.SendBatch(tx, txTo); n != batch || err != nil {
			b.Fatalf("sent %d: %v", n, err)
		}
		for i := range rx {
			rx[i] = rx[i][:cap(rx[i])]
		}
		if n, err := r.RecvBatch(rx, rxFrom); n != batch || err != nil {
			b.Fatalf("received %d: %v", n, err)
		}
	}
	inj := New(Config{Mode: roce.ModeUDP, Local: local, Seed: 1})
	sa, rb := inj.Wrap(pa[0], nil), inj.Wrap(pb[0], nil)
	inj2 := New(Config{Mode: roce.ModeUDP, Local: local, Seed: 1, Logger: slog.New(slog.DiscardHandler)})
	q := uint32(0x99)
	_, err = inj2.Add([]admin.FaultRule{{QPN: &q, Action: admin.FaultAction{Type: "drop"}}})
	require.NoError(b, err)
	sa2, rb2 := inj2.Wrap(pa[0], nil), inj2.Wrap(pb[0], nil)
	const rounds = 64
	var bare, layer, ruled time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	timed := func(s, r engine.Link) time.Duration {
		t0 := time.Now()
		for range rounds {
			round(s, r)
		}
		return time.Since(t0)
	}
	for i := range b.N {
		// Alternate the order, so that neither case always runs on the
		// caches the other warmed.
		if i%2 == 0 {
			bare += timed(pa[0], pb[0])
			layer += timed(sa, rb)
		} else {
			layer += timed(sa, rb)
			bare += timed(pa[0], pb[0])
		}
		ruled += timed(sa2, rb2)
	}
	frames := float64(b.N * rounds * batch)
	b.ReportMetric(float64(bare.Nanoseconds())/frames, "bare-ns/frame")
	b.ReportMetric(float64(layer.Nanoseconds())/frames, "layer-ns/frame")
	b.ReportMetric(float64(ruled.Nanoseconds())/frames, "onerule-ns/frame")
	b.ReportMetric(float64(layer)/float64(bare), "layer/bare")
	b.ReportMetric(float64(ruled)/float64(bare), "onerule/bare")
}

// TestNoAllocs: a batch through the layer allocates nothing, with no rule
// and with a rule that parses and matches every frame without acting.
func TestNoAllocs(t *testing.T) {
	nw, err := link.NewNetwork(link.Config{Mode: roce.ModeUDP, FrameCap: frameCap, QueueLen: 256, Buffers: 1024})
	require.NoError(t, err)
	pa, err := nw.Attach(local.Addr(), 1, nil)
	require.NoError(t, err)
	pb, err := nw.Attach(peer.Addr(), 1, nil)
	require.NoError(t, err)
	tmpl := pkt(t, local, peer, roce.OpRCWriteMiddle, 0x11, 1, 1024)
	tx, rx := make([][]byte, 32), make([][]byte, 32)
	txTo, rxFrom := make([]netip.AddrPort, 32), make([]netip.AddrPort, 32)
	for i := range tx {
		tx[i], rx[i], txTo[i] = make([]byte, frameCap), make([]byte, frameCap), peer
	}
	inj := New(Config{Mode: roce.ModeUDP, Local: local, Seed: 1})
	s, r := inj.Wrap(pa[0], nil), inj.Wrap(pb[0], nil)
	round := func() {
		for i := range tx {
			tx[i] = tx[i][:copy(tx[i][:cap(tx[i])], tmpl)]
		}
		n, err := s.SendBatch(tx, txTo)
		require.NoError(t, err)
		require.Equal(t, len(tx), n)
		for i := range rx {
			rx[i] = rx[i][:cap(rx[i])]
		}
		n, err = r.RecvBatch(rx, rxFrom)
		require.NoError(t, err)
		require.Equal(t, len(rx), n)
	}
	assert.Zero(t, testing.AllocsPerRun(100, round), "no rule")
	p := 0.0
	_, err = inj.Add([]admin.FaultRule{{Probability: &p, Action: admin.FaultAction{Type: "drop"}}})
	require.NoError(t, err)
	assert.Zero(t, testing.AllocsPerRun(100, round), "a rule that matches every frame")
	assert.Equal(t, uint64(2*101*32), inj.List()[0].Matched, "it did match them all")
}
