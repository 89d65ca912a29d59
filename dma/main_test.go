package dma

import (
	"testing"

	"go.uber.org/goleak"
)

// The tests start worker goroutines; none may outlive its test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
