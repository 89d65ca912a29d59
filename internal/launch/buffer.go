package launch

import (
	"bytes"
	"sync"
)

// Buffer collects a process's output for Spec.Stdout or Spec.Stderr: a
// bytes.Buffer that the goroutine copying the output and a reader may
// use at the same time. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
