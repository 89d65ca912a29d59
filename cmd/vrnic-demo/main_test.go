package main

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 5*time.Second, c.duration)
	assert.Equal(t, defaultLink, c.link)
	assert.True(t, c.autoAddr)
	c, err = parseFlags([]string{"-link", "udp", "-addr-a", "127.0.0.9", "-duration", "2s", "-size", "100", "-mtu", "1024"}, io.Discard)
	require.NoError(t, err)
	assert.False(t, c.autoAddr, "addresses given: used as they are")
	assert.Equal(t, 100, c.size)
	for _, bad := range [][]string{
		{"-size", "0"}, {"-size", "2000000"}, {"-link", "tap"}, {"-mtu", "1500"}, {"-duration", "0s"},
		{"-workers", "0"}, {"-addr-a", "localhost"}, {"extra"},
	} {
		t.Run(bad[0], func(t *testing.T) {
			_, err := parseFlags(bad, io.Discard)
			assert.Error(t, err)
		})
	}
}

func TestVerify(t *testing.T) {
	good := func() (*result, *result) {
		a := &result{Sends: 10, SendBytes: 1000, FetchAdds: 9, CmpSwaps: 9, All: opStats{Ops: 47}}
		b := &result{RecvVerified: 10, RecvBytes: 1000, AddWord: 9, SwapWord: 9}
		return a, b
	}
	a, b := good()
	require.NoError(t, verify(a, b))
	for name, spoil := range map[string]func(a, b *result){
		"lost SEND":         func(a, b *result) { b.RecvVerified-- },
		"short SEND":        func(a, b *result) { b.RecvBytes-- },
		"atomic add lost":   func(a, b *result) { b.AddWord-- },
		"swap lost":         func(a, b *result) { b.SwapWord++ },
		"requester failure": func(a, b *result) { a.Failures = []string{"READ 3: data differs"} },
		"responder failure": func(a, b *result) { b.Failures = []string{"SEND 1: content"} },
		"nothing done":      func(a, b *result) { a.All.Ops = 0 },
	} {
		t.Run(name, func(t *testing.T) {
			a, b := good()
			spoil(a, b)
			assert.Error(t, verify(a, b))
		})
	}
}
