package device

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestProcGroups(t *testing.T) {
	status := []byte("Name:\tx\nUid:\t1000\t1001\t1001\t1001\nGid:\t100\t200\t200\t200\nGroups:\t4 27 3000 \nNSpid:\t1\n")
	g, ok := procGroups(status, 1001, 200)
	assert.True(t, ok)
	assert.Equal(t, []uint32{4, 27, 3000}, g)
	_, ok = procGroups(status, 1000, 200)
	assert.False(t, ok, "the effective uid is the second field")
	_, ok = procGroups(status, 1001, 100)
	assert.False(t, ok, "the effective gid is the second field")
	g, ok = procGroups([]byte("Uid:\t5\t5\t5\t5\nGid:\t5\t5\t5\t5\nGroups:\t\n"), 5, 5)
	assert.True(t, ok)
	assert.Empty(t, g)
	_, ok = procGroups([]byte("Uid:\t5\t5\t5\t5\nGid:\t5\t5\t5\t5\nGroups:\tx\n"), 5, 5)
	assert.False(t, ok, "a malformed group")
	_, ok = procGroups([]byte("Groups:\t7\n"), 0, 0)
	assert.False(t, ok, "no Uid and Gid lines")
}

func TestIsOperator(t *testing.T) {
	d := &Device{euid: 4242}
	assert.True(t, d.isOperator(peer{uid: 0}), "root")
	assert.True(t, d.isOperator(peer{uid: 4242, gid: 9}), "the daemon's uid")
	assert.False(t, d.isOperator(peer{uid: 1000, gid: 1000}))
	d.cfg.OperatorGroup = &OperatorGroup{Name: "ops", GID: 777}
	assert.True(t, d.isOperator(peer{uid: 1000, gid: 777}), "primary gid")
	assert.False(t, d.isOperator(peer{uid: 1000, gid: 1000, pid: int32(os.Getpid())}), "this process has other credentials")
	assert.False(t, d.isOperator(peer{uid: 1000, gid: 1000}), "no pid: no supplementary groups")
}
