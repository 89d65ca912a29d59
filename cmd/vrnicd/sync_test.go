package main

import (
	"fmt"
	"io"
	"sync"
)

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// String returns what was written so far, when w is a fmt.Stringer
// (a strings.Builder).
func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.w.(fmt.Stringer); ok {
		return st.String()
	}
	return ""
}
