package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device/devicetest"
	"github.com/vrnic/vrnic/faults"
	"github.com/vrnic/vrnic/roce"
)

// TestFaultCommand: vrnicctl fault adds, lists, changes and removes the
// rules of a running device; bad rules are refused by the CLI before
// they are sent, and by the device when only it can tell (opcode names),
// each with a message saying what is wrong.
func TestFaultCommand(t *testing.T) {
	inj := faults.New(faults.Config{Mode: roce.ModeUDP, Seed: 77})
	s, err := devicetest.Start(devicetest.Options{Name: "flt0", Faults: inj.Serve})
	require.NoError(t, err)
	defer s.Close()
	sock := s.SocketPath

	rc, out, errs := ctl("-s", sock, "fault", "add", "dir=tx", "qpn=0x1234", "msg=write:2", "pkt=3", "round=first", "action=drop")
	require.Equal(t, 0, rc, errs)
	assert.Equal(t, "added rule 1: dir=tx qpn=0x1234 msg=write:2 pkt=3 round=first action=drop\n", out)
	rc, _, errs = ctl("-s", sock, "fault", "add", "name=slow", "op=ack,nak", "prob=0.5", "action=delay", "dist=uniform", "min=10us", "max=1ms")
	require.Equal(t, 0, rc, errs)

	rc, out, _ = ctl("-s", sock, "fault", "list")
	require.Equal(t, 0, rc)
	assert.Contains(t, out, "seed 77, 2 rules")
	assert.Regexp(t, `1\s+-\s+on\s+0\s+0\s+dir=tx qpn=0x1234`, out)
	assert.Regexp(t, `2\s+slow\s+on\s+0\s+0\s+op=ack,nak prob=0.5 action=delay dist=uniform min=10us max=1ms`, out)

	rc, _, errs = ctl("-s", sock, "fault", "set", "2", "disabled=true", "action=duplicate", "copies=3")
	require.Equal(t, 0, rc, errs)
	rc, out, _ = ctl("-s", sock, "-json", "fault", "list")
	require.Equal(t, 0, rc)
	var r admin.FaultReply
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Len(t, r.Rules, 2)
	assert.True(t, r.Rules[1].Disabled)
	assert.Equal(t, 3, r.Rules[1].Action.Copies)

	// A rules file.
	path := filepath.Join(t.TempDir(), "r.json")
	require.NoError(t, os.WriteFile(path, []byte(`[{"id":9,"peer":"10.0.0.0/8","action":{"type":"ecn"}}]`), 0o644))
	rc, out, errs = ctl("-s", sock, "fault", "add", "-f", path)
	require.Equal(t, 0, rc, errs)
	assert.Equal(t, "added rule 9: peer=10.0.0.0/8 action=ecn\n", out)

	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"add", "action=explode"}, `unknown action "explode"`},
		{[]string{"add", "colour=red", "action=drop"}, "colour=red: unknown key"},
		{[]string{"add", "psn=9-5", "action=drop"}, "is empty (9 > 5)"},
		{[]string{"add", "qpn=0x1000000", "action=drop"}, "does not fit 24 bits"},
		{[]string{"add", "prob=1.5", "action=drop"}, "probability 1.5 not in [0, 1]"},
		{[]string{"add", "action=drop", "copies=2"}, "action drop does not take copies"},
		{[]string{"add", "action=delay", "dist=uniform", "min=2ms", "max=1ms"}, "max 1ms below min 2ms"},
		{[]string{"add", "after=2s", "until=1s", "action=drop"}, "could never apply"},
		{[]string{"add", "qpn=x", "action=drop"}, `"x" is not a valid value`},
		{[]string{"add", "action=verb", "verb=rnr_nak"}, `verb "rnr_nak": want one of rnr, qp_err`},
		{[]string{"add", "op=ack", "action=verb", "verb=rnr"}, "verb fault rnr does not take op"},
		{[]string{"add", "cq=3", "action=verb", "verb=rnr"}, "verb fault rnr does not take cq"},
		{[]string{"add", "action=verb", "verb=cqe_delay"}, "cqe_delay takes delay"},
		{[]string{"add", "cq=3", "action=drop"}, "cq applies to verb faults only"},
		// Only the device knows the opcode table.
		{[]string{"add", "op=RC_WRITE_SIDEWAYS", "action=drop"}, `opcode "RC_WRITE_SIDEWAYS": want an opcode name`},
		{[]string{"del", "5"}, "no rule 5"},
		{[]string{"set", "42", "action=drop"}, "no rule 42"},
		{[]string{"frobnicate"}, `unknown fault operation "frobnicate"`},
	} {
		rc, _, errs := ctl(append([]string{"-s", sock, "fault"}, c.args...)...)
		assert.Equal(t, 1, rc, "%v", c.args)
		assert.Contains(t, errs, c.msg, "%v", c.args)
	}
	// The device trusts no JSON: what the CLI would refuse, sent raw.
	a, err := admin.Dial(sock)
	require.NoError(t, err)
	defer a.Close()
	for _, c := range []struct {
		req any
		msg string
	}{
		{map[string]any{"op": "add", "rules": []any{map[string]any{"action": map[string]any{"type": "drop"}, "bogus": 1}}}, `unknown field "bogus"`},
		{map[string]any{"op": "add", "rules": []any{map[string]any{"psn": "9-5", "action": map[string]any{"type": "drop"}}}}, "is empty (9 > 5)"},
		{map[string]any{"op": "add", "rules": []any{map[string]any{"action": map[string]any{"type": "corrupt", "field": "icrc", "offset": 4}}}}, "beyond the 4-byte ICRC"},
		{map[string]any{"op": "add"}, "add takes rules"},
		{map[string]any{"op": "nuke"}, `unknown operation "nuke"`},
	} {
		_, err := a.Call(admin.FaultCmd, c.req)
		assert.ErrorContains(t, err, c.msg)
	}
	assert.Len(t, inj.List(), 3, "nothing bad was installed")

	rc, _, errs = ctl("-s", sock, "fault", "del", "1", "9")
	require.Equal(t, 0, rc, errs)
	assert.Len(t, inj.List(), 1)
	rc, _, errs = ctl("-s", sock, "fault", "clear")
	require.Equal(t, 0, rc, errs)
	assert.Empty(t, inj.List())
	rc, out, _ = ctl("-s", sock, "fault", "list")
	require.Equal(t, 0, rc)
	assert.Equal(t, "seed 77, 0 rules\n", out)
}
