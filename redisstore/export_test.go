package redisstore

import "time"

// AgeRenewals makes every group of s look as if its heartbeats had last
// renewed the idle TTLs of its session's keys and domain keys d earlier,
// as they would after a long hold.
func AgeRenewals(s *Store, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.allGroupsLocked() {
		g.keysRenewed = g.keysRenewed.Add(-d)
		for e, t := range g.domsRenewed {
			g.domsRenewed[e] = t.Add(-d)
		}
	}
}

// SessionID is the id of s's current session in its unsharded group.
func SessionID(s *Store) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.single.sid
}

// IdleTTL is how long s's keys live untouched.
func IdleTTL(s *Store) time.Duration { return s.idle }

// WithEvalOnly runs the scripts with EVALSHA even where Redis could load
// them as a function library, so that path is tested on Redis 7 too.
func WithEvalOnly() Option { return func(s *Store) { s.evalOnly = true } }

// UsesLibrary reports whether s runs its scripts as library functions.
func UsesLibrary(s *Store) bool { return s.lib != nil }

// WithTestClock makes every script of s take now() as the time instead of
// Redis TIME (ARGV[3] of lib.lua's conventions), and s's own bookkeeping
// read it too, so a test steps one fake time for the scripts and for the
// in-process store.
func WithTestClock(now func() time.Time) Option { return withClock(now) }

// ReplyCodes maps lib.lua's reply code names to the Go constants that
// decode them.
var ReplyCodes = map[string]string{
	"R_OK": replyOK, "R_GRANTED": replyGranted, "R_QUEUED": replyQueued, "R_DELAYED": replyDelayed,
	"R_UNREGISTERED": replyUnregistered, "R_CONFLICT": replyConflict,
	"R_NEW_EPOCH": replyNewEpoch, "R_NO_STATE": replyNoState, "R_SESSION_GONE": replySessionGone,
}

// WithTestClocks is WithTestClock with s's own bookkeeping on own, a clock
// that never goes back, while the scripts' time may (a Redis TIME jump).
func WithTestClocks(scripts, own func() time.Time) Option { return withClocks(scripts, own) }

// WithoutRenewals turns off s's background renewals of its queued
// waiters: each waiter's own calls keep its place, as its Budget makes
// them every TTL/3 then. For tests that step a clock of their own.
func WithoutRenewals() Option { return func(s *Store) { s.noRenew = true } }
