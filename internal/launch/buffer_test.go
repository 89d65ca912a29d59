package launch

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestBufferConcurrent: writers and a reader at once (the race detector
// checks the locking); nothing written is lost.
func TestBufferConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				n, err := b.Write([]byte("x\n"))
				assert.NoError(t, err)
				assert.Equal(t, 2, n)
			}
		}()
	}
	for range 50 {
		_ = b.String()
	}
	wg.Wait()
	assert.Equal(t, 400, strings.Count(b.String(), "x\n"))
	assert.Len(t, b.String(), 800)
}
