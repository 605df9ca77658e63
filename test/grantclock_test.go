//go:build linux

package test

import (
	"context"
	"encoding/hex"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/recpack"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/test/history"
)

// newGrantClock returns a grant clock for budget name (one group: no shard
// key) read through c.
func newGrantClock(c redis.UniversalClient, name string) *grantClock {
	return &grantClock{c: c, prefix: "rb:{" + hex.EncodeToString([]byte(name)) + "}:", at: map[string]time.Time{}}
}

// grantClock notes when the store made each grant. Put between a Budget
// and its recorder, it reads the lease's record on a grant's reply, after
// the recorder has timed the call and before the Budget can give the lease
// back (a grant that comes as its caller gives up is cancelled at once).
type grantClock struct {
	c      redis.UniversalClient // a client the fault spares, where it can
	prefix string                // the budget's keys

	mu sync.Mutex
	at map[string]time.Time // lease ID -> the store's time of its grant
}

// wrap returns s with grants timed. spy, if given, watches s's client: a
// grant is looked for in the session it names first (redistest.FindLease).
func (g *grantClock) wrap(s budget.Store, spy ...*redistest.SessionSpy) budget.Store {
	t := &grantTimed{Store: s, g: g}
	if len(spy) > 0 {
		t.spy = spy[0]
	}
	return t
}

func (g *grantClock) times() map[string]time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.at)
}

type grantTimed struct {
	budget.Store
	g   *grantClock
	spy *redistest.SessionSpy // nil: no hint
}

func (s *grantTimed) TryAcquire(ctx context.Context, id string, req budget.Request) (budget.Attempt, error) {
	att, err := s.Store.TryAcquire(ctx, id, req)
	if err == nil && att.Outcome == budget.Granted {
		hint := ""
		if s.spy != nil {
			hint = s.spy.Session()
		}
		if at, ok := s.g.read(id, hint); ok {
			s.g.mu.Lock()
			s.g.at[id] = at
			s.g.mu.Unlock()
		}
	}
	return att, err
}

// read returns the time of lease id's grant on this machine's wall clock:
// the record's grant time (group time in us) less the group's clock offset
// (absent: none). False when the record is gone or unreadable.
func (g *grantClock) read(id, hint string) (time.Time, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v, ok, err := redistest.FindLease(ctx, g.c, g.prefix, id, hint)
	if !ok || err != nil {
		return time.Time{}, false
	}
	rec, err := recpack.DecodeLease(v)
	if err != nil {
		return time.Time{}, false
	}
	at := rec.Granted
	co, err := g.c.HGet(ctx, g.prefix+"cfg", "co").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return time.Time{}, false
	}
	return time.UnixMicro(at - co), true
}

// boundHistory bounds the grants of h by clock's times (boundGrants),
// reports how many, and fails t for a grant the store made, by its own
// clock, after its reply reached the holder.
func boundHistory(t *testing.T, h *history.History, clock *grantClock) {
	t.Helper()
	bounded, after := boundGrants(h, clock.times())
	figure(t, "history: %d grants bounded below by the store's time of the grant (read from the lease's record); %d of them recorded later than the reply that reported them",
		bounded, after)
	if after > 0 {
		t.Errorf("%d grants made, by the store's clock, after their holder was told of them", after)
	}
}

// boundGrants moves the start of each grant in h whose store time is in at
// up to that time, less a millisecond (the recorder's allowance for the
// store's clock). The recorder alone starts a grant made by another host's
// release at the waiter's last call answered "wait": in the storm, up to
// a second or more before it, with hundreds of such intervals overlapping
// on a ceiling of 8, which porcupine's search cannot get through (it gave
// Unknown after a minute). The store's record bounds the grant from below
// (Redis TIME, this machine's clock, read by the script that made it), so
// the check only gets stricter. It returns how many grants it bounded, and
// how many of those the store made after their reply (none can be).
func boundGrants(h *history.History, at map[string]time.Time) (bounded, after int) {
	for i := range h.Waiters {
		w := &h.Waiters[i]
		g, ok := at[w.ID]
		if !ok || !w.Granted() {
			continue
		}
		bounded++
		from := g.Add(-time.Millisecond).UnixNano()
		if from > w.GrantTo {
			after++
			continue
		}
		w.GrantFrom = max(w.GrantFrom, from)
	}
	return bounded, after
}
