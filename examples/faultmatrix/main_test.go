package faultmatrix

import (
	"os"
	"testing"

	"github.com/vrnic/vrnic/faults/suite"
)

// TestMain removes the daemon the suite built for the run.
func TestMain(m *testing.M) {
	code := m.Run()
	suite.RemoveBuilt()
	os.Exit(code)
}
