package faults

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/roce"
)

// FuzzParseScenario: the operator's JSON and YAML are never trusted: any
// input is either refused with an error or gives rules that compile,
// whose JSON parses back to the same scenario.
func FuzzParseScenario(f *testing.F) {
	f.Add([]byte(`{"seed":1,"rules":[{"id":3,"dir":"tx","qpn":17,"message":{"kind":"write","index":2,"packet":3},"round":"first","action":{"type":"drop"}}]}`), false)
	f.Add([]byte(`{"rules":[{"op":["ack","RC_SEND_ONLY","0x11"],"psn":"5-9","probability":0.5,"action":{"type":"corrupt","field":"bth","offset":3,"mask":4,"fix_icrc":true}}]}`), false)
	f.Add([]byte(`{"rules":[{"action":{"type":"delay","dist":"normal","delay":"1ms","stddev":"100us"}},{"action":{"type":"rate","pps":10}}]}`), false)
	f.Add([]byte("seed: 9\nrules:\n  - {peer: 10.0.0.0/8, action: {type: reorder, frames: 2, for: 3ms}}\n"), true)
	f.Add([]byte("rules:\n  - action: {type: down, for: 1s}\n    after: 1s\n    until: 2s\n"), true)
	f.Add([]byte(`{"rules":[{"action":{"type":"bogus"}}]}`), false)
	f.Add([]byte(`{"rules":[{"psn":"9-5","action":{"type":"drop"}}]}`), false)
	f.Fuzz(func(t *testing.T, b []byte, isYAML bool) {
		sc, err := ParseScenario(b, isYAML)
		if err != nil {
			require.NotEmpty(t, err.Error())
			return
		}
		j, err := json.Marshal(sc)
		require.NoError(t, err)
		again, err := ParseScenario(j, false)
		require.NoError(t, err, "%s", j)
		j2, err := json.Marshal(again)
		require.NoError(t, err)
		require.JSONEq(t, string(j), string(j2))
		inj := New(Config{Mode: roce.ModeUDP, Local: local, Seed: sc.Seed})
		_, err = inj.Add(sc.Rules)
		require.NoError(t, err)
	})
}

// FuzzLink: any bytes through a layer with rules of every action, sent
// and received, never panic, and every frame the engine hands over is
// taken.
func FuzzLink(f *testing.F) {
	f.Add(pkt(f, local, peer, roce.OpRCWriteFirst, 0x11, 1, 64), uint8(0))
	f.Add(pkt(f, local, peer, roce.OpRCAck, 0x11, 1, 0), uint8(3))
	f.Add([]byte{0x0a, 0, 0xff}, uint8(1))
	f.Fuzz(func(t *testing.T, frame []byte, which uint8) {
		if len(frame) > frameCap {
			return
		}
		half, off := 0.5, 2
		rules := []admin.FaultRule{
			{Probability: &half, Action: admin.FaultAction{Type: "drop"}},
			{Action: admin.FaultAction{Type: "corrupt", Offset: &off, FixICRC: true}},
			{Action: admin.FaultAction{Type: "duplicate"}},
			{Action: admin.FaultAction{Type: "ecn"}},
			{Message: &admin.FaultMessage{Kind: "write", Index: 1}, Action: admin.FaultAction{Type: "delay", Delay: "1us"}},
			{Op: []string{"ack", "nak"}, Action: admin.FaultAction{Type: "reorder"}},
		}
		r := newRig(t, uint64(which), rules[int(which)%len(rules)], rules[(int(which)+1)%len(rules)])
		for range 3 {
			r.send(t, [][]byte{frame, frame})
			r.fake.rx = append(r.fake.rx, frame)
			r.fake.rxFrom = append(r.fake.rxFrom, peer)
			r.recv(t)
			r.clk.add(2e6)
		}
		_ = netip.AddrPort{}
	})
}
