package abi

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// randomize fills every field of the struct pointed to by p with random
// values (test helper; reflection is fine here).
func randomize(r *rand.Rand, p any) {
	var fill func(v reflect.Value)
	fill = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			v.SetUint(r.Uint64())
		case reflect.Array:
			for i := range v.Len() {
				fill(v.Index(i))
			}
		case reflect.Struct:
			for i := range v.NumField() {
				fill(v.Field(i))
			}
		}
	}
	fill(reflect.ValueOf(p).Elem())
}

// TestHotCodecsMatchBinary checks the hand-written Put/Decode methods
// against encoding/binary's reflection-based layout of the same struct.
func TestHotCodecsMatchBinary(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	type codec interface {
		Put([]byte)
	}
	cases := []struct {
		name   string
		new    func() any
		decode func(v any, b []byte)
	}{
		{"SendWQE", func() any { return new(SendWQE) }, func(v any, b []byte) { v.(*SendWQE).Decode(b) }},
		{"SGE", func() any { return new(SGE) }, func(v any, b []byte) { v.(*SGE).Decode(b) }},
		{"RecvWQE", func() any { return new(RecvWQE) }, func(v any, b []byte) { v.(*RecvWQE).Decode(b) }},
		{"CQE", func() any { return new(CQE) }, func(v any, b []byte) { v.(*CQE).Decode(b) }},
		{"MsgHdr", func() any { return new(MsgHdr) }, func(v any, b []byte) { require.NoError(t, v.(*MsgHdr).Decode(b)) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for range 100 {
				v := c.new()
				randomize(r, v)
				size := Sizeof(v)
				hand := make([]byte, size)
				v.(codec).Put(hand)
				ref := make([]byte, size)
				_, err := Marshal(ref, v)
				require.NoError(t, err)
				assert.Equal(t, ref, hand, "Put vs encoding/binary")
				back := c.new()
				c.decode(back, ref)
				assert.Equal(t, v, back, "Decode vs encoding/binary")
			}
		})
	}
}

func TestCQETailWord(t *testing.T) {
	c := CQE{PKeyIndex: 0x1234, SL: 0x56, Owner: 1}
	b := make([]byte, SizeofCQE)
	c.Put(b)
	assert.Equal(t, []byte{0x34, 0x12, 0x56, 0x01}, b[OffCQETail:])
	assert.Equal(t, uint8(1), b[OffCQEOwner])
	assert.Equal(t, uint32(0xfe561234), c.TailWordWith(0xfe), "the owner byte replaced, the rest kept")
	var back CQE
	back.Decode(b)
	assert.Equal(t, c, back)
	// Entry 5 of a ring of 4 is on the second pass: valid with owner bit 0.
	assert.True(t, CQEReady(c.TailWordWith(0), 5, 4))
	assert.False(t, CQEReady(c.TailWordWith(1), 5, 4))
	assert.True(t, CQEReady(c.TailWordWith(1), 1, 4))
	assert.True(t, CQEReady(c.TailWordWith(0xff), 1, 4), "only bit 0 of owner is the phase")
}

func TestCQEPhase(t *testing.T) {
	cases := []struct {
		index, count uint32
		want         uint8
	}{
		{0, 4, 1}, {3, 4, 1}, {4, 4, 0}, {7, 4, 0}, {8, 4, 1},
		{0xffffffff, 4, 0}, // pass 0x3fffffff (odd)
		{0, MaxCQE, 1}, {MaxCQE, MaxCQE, 0},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, CQEPhase(c.index, c.count), "index %d count %d", c.index, c.count)
	}
	// Wrap of the u32 counter keeps the alternation (count divides 2^32).
	assert.NotEqual(t, CQEPhase(0xffffffff, 4), CQEPhase(0, 4))
}

func TestMarshalRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, s := range cStructs {
		t.Run(s.name, func(t *testing.T) {
			p := reflect.New(reflect.TypeOf(s.v))
			randomize(r, p.Interface())
			b := make([]byte, Sizeof(s.v))
			n, err := Marshal(b, p.Interface())
			require.NoError(t, err)
			assert.Equal(t, len(b), n)
			q := reflect.New(reflect.TypeOf(s.v))
			n, err = Unmarshal(b, q.Interface())
			require.NoError(t, err)
			assert.Equal(t, len(b), n)
			assert.Equal(t, p.Interface(), q.Interface())
			_, err = Unmarshal(b[:len(b)-1], q.Interface())
			assert.ErrorIs(t, err, ErrShort)
		})
	}
}

func TestErrorReplyRoundTrip(t *testing.T) {
	cases := []struct {
		name    string
		errno   syscall.Errno
		msg     string
		wantMsg string
	}{
		{"plain", syscall.EINVAL, "reserved field non-zero", "reserved field non-zero"},
		{"empty", syscall.EBUSY, "", ""},
		{"zero errno becomes EIO", 0, "x", "x"},
		{"truncated", syscall.ENOMEM, string(bytes.Repeat([]byte{'a'}, 400)), string(bytes.Repeat([]byte{'a'}, MaxErrMsg-1))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := MsgHdr{Opcode: CmdCreateQP, Seq: 77}
			b := make([]byte, SizeofMsgHdr+MaxErrMsg)
			n, err := PutErrorReply(b, &req, c.errno, c.msg)
			require.NoError(t, err)
			var h MsgHdr
			require.NoError(t, h.Decode(b[:n]))
			assert.Equal(t, uint32(n), h.Length)
			assert.Equal(t, uint32(77), h.Seq)
			assert.Equal(t, uint16(MsgFlagReply), h.Flags)
			assert.LessOrEqual(t, n-SizeofMsgHdr, MaxErrMsg)
			err = ReplyError(&h, b[SizeofMsgHdr:n])
			var ce *ControlError
			require.ErrorAs(t, err, &ce)
			want := c.errno
			if want == 0 {
				want = syscall.EIO
			}
			assert.ErrorIs(t, err, want)
			assert.Equal(t, c.wantMsg, ce.Msg)
			assert.Equal(t, CmdCreateQP, ce.Op)
			assert.Equal(t, want, ErrnoOf(err))
		})
	}
	_, err := PutErrorReply(make([]byte, 10), &MsgHdr{}, syscall.EINVAL, "")
	assert.ErrorIs(t, err, ErrShort)
	assert.NoError(t, ReplyError(&MsgHdr{}, nil))
}

func TestErrnoOf(t *testing.T) {
	sentinel := errors.New("boom")
	assert.Equal(t, syscall.Errno(0), ErrnoOf(nil))
	assert.Equal(t, syscall.EIO, ErrnoOf(sentinel))
	assert.Equal(t, syscall.EACCES, ErrnoOf(errors.Join(sentinel, syscall.EACCES)))
}

func TestNames(t *testing.T) {
	assert.Equal(t, "SUCCESS", WCSuccess.String())
	assert.Equal(t, "LOC_QP_OP_ERR", WCLocQPOpErr.String())
	assert.Equal(t, "GENERAL_ERR", WCGeneralErr.String())
	assert.Equal(t, "WCStatus(99)", WCStatus(99).String())
	assert.Equal(t, "SEND_WITH_INV", WRSendWithInv.String())
	assert.Equal(t, "BIND_MW", WRBindMW.String())
	assert.Equal(t, "WROpcode(10)", WROpcode(10).String())
	assert.Equal(t, "RECV", WCRecv.String())
	assert.Equal(t, "RTS", QPSRTS.String())
	assert.Equal(t, "CREATE_QP", CmdCreateQP.String())
	assert.Equal(t, "CMD_256", CmdAdminBase.String())
	assert.Equal(t, "QPS_7", QPState(7).String())
	// Each name is the header's, less the prefix.
	named := map[string]uint64{}
	for s := range WCStatus(255) {
		named["VRNIC_WC_"+s.String()] = uint64(s)
	}
	for o := range WCOpcode(255) {
		named["VRNIC_WC_"+o.String()] = uint64(o)
	}
	for o := range WROpcode(255) {
		named["VRNIC_WR_"+o.String()] = uint64(o)
	}
	for s := range QPState(255) {
		named["VRNIC_QPS_"+s.String()] = uint64(s)
	}
	for c := range Cmd(CmdAdminBase) {
		named["VRNIC_CMD_"+c.String()] = uint64(c)
	}
	wcFlags := map[string]bool{"VRNIC_WC_GRH": true, "VRNIC_WC_WITH_IMM": true, "VRNIC_WC_IP_CSUM_OK": true, "VRNIC_WC_WITH_INV": true}
	for _, prefix := range []string{"VRNIC_WC_", "VRNIC_WR_", "VRNIC_QPS_", "VRNIC_CMD_"} {
		for name, v := range cConsts {
			if !strings.HasPrefix(name, prefix) || strings.HasSuffix(name, "_BASE") || wcFlags[name] {
				continue
			}
			got, ok := named[name]
			if assert.True(t, ok, "no value is named %s", name) {
				assert.Equal(t, v, got, name)
			}
		}
	}
	for o := range WROpcode(20) {
		assert.Equal(t, o <= 9 || o == 14 || o == 15, o.Valid(), "opcode %d", o)
	}
}

func TestVersionAndLimits(t *testing.T) {
	assert.True(t, VersionCompatible(Version, Version))
	assert.True(t, VersionCompatible(1<<16, 1<<16|3))
	assert.False(t, VersionCompatible(1<<16|4, 1<<16|3))
	assert.False(t, VersionCompatible(2<<16, 1<<16))
	assert.Equal(t, 1024, MTU1024.Bytes())
	assert.Equal(t, 4096, MTU4096.Bytes())
	assert.Equal(t, 0, MTU(0).Bytes())
	// The largest send slot: 32 SGEs and 512 inline bytes both need 8 blocks.
	assert.Equal(t, uint32(9), SQWQEBlocks(MaxSGE, MaxInline))
	assert.Equal(t, uint32(576), RQWQESize(MaxSGE)) // 16 + 32*16 = 528, rounded up to 64
	assert.Equal(t, uint32(DBRecords), uint32(2048))
	w := ArmWord(5, true)
	assert.Equal(t, uint32(5), ArmSN(w))
	assert.Equal(t, uint32(CQArmArmed|CQArmSolicited), w&0xff)
}

func TestHotCodecsDoNotAllocate(t *testing.T) {
	b := make([]byte, 64)
	var w SendWQE
	var c CQE
	var h MsgHdr
	n := testing.AllocsPerRun(100, func() {
		w.Put(b)
		w.Decode(b)
		c.Put(b)
		c.Decode(b)
		h.Put(b)
		_ = h.Decode(b)
	})
	assert.Zero(t, n)
}

// FuzzReply feeds arbitrary datagrams to the reply decoding a client does:
// it never panics, and a non-zero status always yields a ControlError whose
// message is at most MaxErrMsg-1 bytes and NUL-free.
func FuzzReply(f *testing.F) {
	b := make([]byte, SizeofMsgHdr+MaxErrMsg)
	n, _ := PutErrorReply(b, &MsgHdr{Opcode: CmdRegMR, Seq: 1}, syscall.EINVAL, "bad page")
	f.Add(b[:n])
	f.Add([]byte{})
	f.Add(make([]byte, 15))
	f.Fuzz(func(t *testing.T, d []byte) {
		var h MsgHdr
		if err := h.Decode(d); err != nil {
			require.ErrorIs(t, err, ErrShort)
			require.Less(t, len(d), SizeofMsgHdr)
			return
		}
		err := ReplyError(&h, d[SizeofMsgHdr:])
		if h.Status == 0 {
			require.NoError(t, err)
			return
		}
		var ce *ControlError
		require.ErrorAs(t, err, &ce)
		require.LessOrEqual(t, len(ce.Msg), MaxErrMsg)
		require.NotContains(t, ce.Msg, "\x00")
		require.Equal(t, syscall.Errno(h.Status), ce.Errno)
	})
}
