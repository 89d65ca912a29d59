package ebpf

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/vrnic/vrnic/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// loadOrSkip loads the programs or skips the test when BPF is not allowed.
func loadOrSkip(t testing.TB, queues int) *Programs {
	t.Helper()
	testenv.NeedRoot(t, "needs root (CAP_BPF, CAP_NET_ADMIN) to load BPF programs and run BPF_PROG_TEST_RUN")
	p, err := Load(queues)
	if err != nil {
		t.Fatalf("load programs: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close programs: %v", err)
		}
	})
	return p
}
