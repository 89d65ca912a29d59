package device_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test stops its servers and connections: no goroutine survives.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
