package budget

import "time"

// The in-process store's clock mirrors the group clock of lib.lua (Clock
// jumps there) where it applies: time that steps back is taken up by an
// offset, so buckets, pauses and throttles go on from the latest time read
// instead of waiting for the clock to catch up. With time.Now that never
// happens (its monotonic reading orders every comparison); a LocalClock
// may step back, and the differential test steps both stores back alike.
// A jump forward needs nothing here: this store has no deadlines to pass.

// clockStep mirrors lib.lua's STEP: the anchor moves only once time has
// gone this far past it, as the scripts write it at most once a second.
const clockStep = time.Second

// clock is the store's time for the call in progress. Lock held.
func (s *memStore) clock() time.Time {
	now := s.now().Add(s.offset)
	if !s.anchor.IsZero() && now.Before(s.anchor) {
		s.offset += s.anchor.Sub(now)
		now = s.anchor
	}
	if s.anchor.IsZero() || now.Sub(s.anchor) > clockStep {
		s.anchor = now
	}
	return now
}
