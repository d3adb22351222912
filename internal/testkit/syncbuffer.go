package testkit

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer safe for one writer and concurrent readers
// (a child process's output read while it runs). The zero value is empty
// and ready.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
