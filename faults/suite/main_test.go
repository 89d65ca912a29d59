package suite

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	RemoveBuilt()
	os.Exit(code)
}
