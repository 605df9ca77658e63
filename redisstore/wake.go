package redisstore

import "time"

// Wake dispatch: scripts publish wake events for a process's waiters on
// its channel in their group (see the package doc); the process's hubs
// (hub.go) receive them and hand each to the waiter it names.

// waiting is what the store knows of one of this process's waiters.
type waiting struct {
	g        *group
	wake     chan struct{} // signalled by wake events
	first    time.Time     // when its first acquire call was sent
	answered time.Time     // when the latest acquire call answered was sent
	granted  bool          // a script granted it by handoff and said so
	grantSid string        // the session the handoff granted it in
	sid      string        // the session its latest call named (where a handoff grants it)
	short    time.Duration // how much earlier than its liveness deadline that session ends
	cutOff   bool          // a call of it was cut off by its ctx on its way: it may still land
	// queued: its latest call answered Queued or Delayed and no call of it
	// is out, so renewals (renew.go) keep its place, for renewFor after
	// called, its latest call's sending.
	queued bool
	called time.Time
	// delayed: its latest call answered Delayed, so it sleeps on a timer
	// of its own and need not be tried as a head by renewals.
	delayed bool
	encs    []string // its domains' encodings
}

// deliver hands one wake event to the waiter it names, if it is still
// waiting here.
func (s *Store) deliver(payload string) {
	id, granted, sid, short := parseWake(payload)
	s.mu.Lock()
	w := s.wakes[id]
	if w != nil && granted {
		w.granted, w.grantSid, w.short = true, sid, short
	}
	s.mu.Unlock()
	if w != nil {
		nudge(w.wake)
	}
}

// poke wakes every waiter of this process in group g, after g's channel
// was subscribed again: wake events published meanwhile reached nobody,
// and each waiter's call finds its grant, or its place in line.
func (s *Store) poke(g *group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.wakes {
		if w.g.channel == g.channel {
			nudge(w.wake)
		}
	}
}

// unwatch forgets waiter id: wake events for it are dropped from now on.
func (s *Store) unwatch(id string) {
	s.mu.Lock()
	delete(s.wakes, id)
	s.mu.Unlock()
}

// liveFrom is the latest time this process knows Redis had heard from
// waiter w by: when the latest of its calls that was answered was sent, or
// its first (a waiter that Redis queued has had some call run, and none
// was sent before the first). Redis's liveness deadline for the waiter is
// at least this plus a TTL.
func (w *waiting) liveFrom() time.Time {
	if w.answered.After(w.first) {
		return w.answered
	}
	return w.first
}
