package redisstore

import (
	"context"
	"errors"
	"time"
)

// Waiter renewals. A queued waiter's place in line lives as long as the
// session its latest call named (lib.lua, Queues). Its own acquire calls
// keep that session alive, but each is a full admission attempt, and a
// waiter blocked by a ceiling has nothing else to learn from it: with many
// lanes waiting, those calls were most of what Redis did (BENCHMARKS.md,
// P9). So the store renews the sessions of this process's queued waiters
// in a group with one renew call per TTL/3 (a process that holds leases
// there renews the same session by its heartbeats too), and the Budget,
// told so by Attempt.Renewed, calls for itself only on a wake, a timed
// delay, or every three TTLs as a safety net.
//
// Since a place lives as long as its session, a waiter this process gives
// up must be cancelled in Redis: a cancel that failed is sent again, by
// the group's heartbeat or, in a group where this process holds no lease
// (no heartbeat), by the renewals (flushDone); and a waiter whose Budget
// stopped calling for it is cancelled once renewFor has passed.

// maxRenew bounds the ids of one renew call (renew.lua refuses more).
const maxRenew = 1000

// renewFor is how many TTLs after a waiter's latest call of its own the
// store still renews its place. The Budget calls every three (budget's
// renewedCall); a waiter nobody calls for any more (a bug, a caller that
// stalled) is then cancelled within six TTLs of its last call, instead of
// holding up the line for ever.
const renewFor = 5

// startRenewals starts the goroutine that renews this process's waiters,
// unless a test turned renewals off; stopRenewals ends it.
func (s *Store) startRenewals() {
	if s.noRenew {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.renewStop = cancel
	s.renewDone = make(chan struct{})
	go s.renewLoop(ctx)
}

func (s *Store) stopRenewals() {
	if s.renewStop == nil {
		return
	}
	s.renewStop()
	<-s.renewDone
}

func (s *Store) renewLoop(ctx context.Context) {
	defer close(s.renewDone)
	t := time.NewTicker(s.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Bounded by the interval: a renewal that hangs would only
		// delay the next, which may find Redis back.
		cctx, cancel := context.WithTimeout(ctx, s.ttl/3)
		s.renewAll(cctx)
		cancel()
	}
}

// renewing is one waiter a renewal names.
type renewing struct {
	id   string
	w    *waiting
	encs []string // its domains, when it is queued rather than delayed
}

// renewAll sends one renew call per group (per maxRenew waiters) for this
// process's waiters that Redis has queued and no call of theirs is out
// for. Errors are left to the next tick: a waiter whose renewals keep
// failing loses its place after a TTL, as one whose own calls fail.
func (s *Store) renewAll(ctx context.Context) {
	byGroup := make(map[*group][]renewing)
	var stale []string
	s.mu.Lock()
	now := s.now()
	for id, w := range s.wakes {
		if w.queued && !w.granted {
			if now.Sub(w.called) >= renewFor*s.ttl {
				stale = append(stale, id)
				continue
			}
			r := renewing{id: id, w: w}
			if !w.delayed {
				r.encs = w.encs
			}
			byGroup[w.g] = append(byGroup[w.g], r)
		}
	}
	s.mu.Unlock()
	for _, id := range stale {
		if ctx.Err() != nil {
			return
		}
		s.Cancel(ctx, id) // a failure is sent again (flushDone, heartbeats)
	}
	s.flushDone(ctx)
	gs := make([]*group, 0, len(byGroup))
	for g := range byGroup {
		gs = append(gs, g)
	}
	eachGroup(gs, func(g *group) error {
		all := byGroup[g]
		for start := 0; start < len(all) && ctx.Err() == nil; start += maxRenew {
			s.renew(ctx, g, all[start:min(start+maxRenew, len(all))])
		}
		return nil
	})
}

// renew renews ws in group g. A waiter granted meanwhile (its wake may
// have been lost) or gone from Redis is woken, so its Budget calls at once:
// the call collects the grant, or queues it again. The script also tries
// those that head their queues, as a handoff would, so a head whose wake
// was lost hears again (renew.lua).
func (s *Store) renew(ctx context.Context, g *group, ws []renewing) {
	sent := s.now()
	args := s.args(ms(s.ttl), len(ws))
	var encs []string
	seen := make(map[string]bool)
	s.mu.Lock()
	for _, r := range ws {
		args = append(args, r.id, r.w.sid)
		for _, e := range r.encs {
			if !seen[e] {
				seen[e] = true
				encs = append(encs, e)
			}
		}
	}
	s.mu.Unlock()
	args = append(args, len(encs))
	for _, e := range encs {
		args = append(args, e)
	}
	res, err := s.run(ctx, g, "renew", s.sc.renew, args...)
	if err != nil {
		return
	}
	r, err := decodeRenew(res, len(ws))
	switch {
	case errors.Is(err, errNotRegistered):
		// Redis lost the group: the waiters' own calls register it again.
		for _, x := range ws {
			nudge(x.w.wake)
		}
		return
	case err != nil:
		return
	case r.held:
		// Quarantined: nobody moves then, so each waiter calls now,
		// learns the wait, and is back when the quarantine ends, instead
		// of at its next safety call. Their sessions were renewed.
		s.mu.Lock()
		for i, x := range ws {
			if i < len(r.status) && r.status[i] == renewWaiting {
				s.confirmLocked(g, x.w.sid, sent)
			}
		}
		s.mu.Unlock()
		for _, x := range ws {
			nudge(x.w.wake)
		}
		return
	}
	s.mu.Lock()
	for i, x := range ws {
		if s.wakes[x.id] != x.w {
			continue // granted and collected, or cancelled, meanwhile
		}
		if r.status[i] == renewWaiting {
			// Its session lives a TTL past this call's run.
			if sent.After(x.w.answered) {
				x.w.answered = sent
			}
			s.confirmLocked(g, x.w.sid, sent)
			continue
		}
		nudge(x.w.wake)
	}
	s.mu.Unlock()
}

// nudge wakes the waiter listening on c, unless a wake is already there.
func nudge(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// maxFlush bounds the cancels flushDone sends to one group per tick.
const maxFlush = 100

// flushDone sends again the cancels of groups where this process holds no
// lease: no heartbeat goes there to carry them (Heartbeat, done), and a
// waiter left queued would keep its place as long as its session lives.
// A group's cancels go a TTL after flushDone first finds them (a cancel
// that failed because Redis is away would fail again at once), and after
// a failure four TTLs later: Redis is not dialled every tick while it is
// down.
func (s *Store) flushDone(ctx context.Context) {
	type pending struct {
		g  *group
		ds []doneID
	}
	var todo []pending
	s.mu.Lock()
	holds := make(map[*group]bool)
	for _, h := range s.leases {
		holds[h.g] = true
	}
	now := s.now()
	for _, g := range s.allGroupsLocked() {
		if len(g.done) == 0 || holds[g] {
			g.flushAt = time.Time{}
			continue
		}
		if g.flushAt.IsZero() {
			g.flushAt = now.Add(s.ttl)
		}
		if now.Before(g.flushAt) {
			continue
		}
		p := pending{g: g}
		for d := range g.done {
			if len(p.ds) == maxFlush {
				break
			}
			p.ds = append(p.ds, d)
		}
		todo = append(todo, p)
	}
	s.mu.Unlock()
	for _, p := range todo {
		for _, d := range p.ds {
			if ctx.Err() != nil {
				return
			}
			res, err := s.run(ctx, p.g, "cancel", s.sc.cancel, s.args(d.id, 1, d.sid)...)
			if err == nil {
				err = decodeOK("cancel", res)
			}
			s.mu.Lock()
			if err != nil {
				p.g.flushAt = s.now().Add(4 * s.ttl)
				s.mu.Unlock()
				break
			}
			delete(p.g.done, d)
			s.mu.Unlock()
		}
	}
}
