package connector

// Tracked reports what the scheduler holds per request: how many requests it tracks and their
// tokens in all. The daemon bounds both against a misbehaving engine. Safe for concurrent use.
func (s *Scheduler) Tracked() (requests, tokens int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.reqs {
		tokens += len(st.tokens)
	}
	return len(s.reqs), tokens
}

// Tracks reports whether the scheduler holds state for request id.
func (s *Scheduler) Tracks(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.reqs[id]
	return ok
}
