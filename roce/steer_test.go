package roce

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSteerQueueSpreadsConsecutiveQPNs(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 8} {
		counts := make([]int, n)
		for qpn := uint32(16); qpn < 16+64*uint32(n); qpn++ {
			q := SteerQueue(qpn, n)
			assert.GreaterOrEqual(t, q, 0)
			assert.Less(t, q, n)
			counts[q]++
		}
		for q, c := range counts {
			// 64 QPNs a worker on average; no worker gets less than half.
			assert.GreaterOrEqualf(t, c, 32, "n=%d queue %d got %d", n, q, c)
		}
	}
}

func TestSteerHashIgnoresHighByte(t *testing.T) {
	assert.Equal(t, SteerHash(0x123456), SteerHash(0xff123456))
}
