package redisstore

import "time"

// Wake dispatch: scripts publish wake events for a process's waiters on
// its channel in their group (see the package doc); the process's hubs
// (hub.go) receive them and hand each to the waiter it names.

// waiting is what the store knows of one of this process's waiters.
type waiting struct {
	g        *group
	wake     chan struct{} // signalled by wake events
	lastCall time.Time     // when its latest acquire call was sent
	granted  bool          // a script granted it by handoff and said so
	grantSid string        // the session the handoff granted it in
	grantAge time.Duration // how much of the session's TTL the lease had spent then
	cutOff   bool          // a call of it was cut off by its ctx on its way: it may still land
}

// unwatch forgets waiter id: wake events for it are dropped from now on.
func (s *Store) unwatch(id string) {
	s.mu.Lock()
	delete(s.wakes, id)
	s.mu.Unlock()
}
