package engine

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

// maxQPBytes is the most a QP's struct may take: Go's 640-byte size
// class. Every QP, idle or not, holds one, and the next class is 704
// bytes (BENCHMARKS.md, "Idle QPs": the daemon's bytes per idle QP).
const maxQPBytes = 640

// TestQPSize: the QP struct stays within its size class. A field added to
// it has to find room: padding, a rarely used part moved behind a pointer
// (QPCounters.rare, the CC state in the worker's map), a narrower type.
func TestQPSize(t *testing.T) {
	assert.LessOrEqual(t, unsafe.Sizeof(QP{}), uintptr(maxQPBytes), "engine.QP grew past its size class")
}
