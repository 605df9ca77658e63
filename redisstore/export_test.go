package redisstore

import "time"

// AgeRenewals makes every lease held through s look as if its hash's idle
// TTL had been set d earlier, as it would after a long hold.
func AgeRenewals(s *Store, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.leases {
		h.renewed = h.renewed.Add(-d)
	}
}

// IdleTTL is how long s's keys live untouched.
func IdleTTL(s *Store) time.Duration { return s.idle }

// WithEvalOnly runs the scripts with EVALSHA even where Redis could load
// them as a function library, so that path is tested on Redis 7 too.
func WithEvalOnly() Option { return func(s *Store) { s.evalOnly = true } }

// UsesLibrary reports whether s runs its scripts as library functions.
func UsesLibrary(s *Store) bool { return s.lib != nil }
