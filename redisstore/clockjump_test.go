package redisstore_test

import (
	"context"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/redisstore"
)

// Redis TIME jumping, through the scripts' clock argument (lib.lua, Clock
// jumps). The stores' own bookkeeping reads mono, which never jumps, as a
// host's monotonic clock does not; FAULTS.md scenario 22 moves a real
// server's clock.

// jumpClock is a script clock that can jump, and the monotonic time of
// the hosts beside it.
type jumpClock struct {
	mu     sync.Mutex
	now    time.Time
	jumped time.Duration
}

func newJumpClock() *jumpClock { return &jumpClock{now: time.Unix(1_900_000_000, 0)} }

func (c *jumpClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *jumpClock) Mono() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now.Add(-c.jumped)
}

// step lets d pass on both clocks.
func (c *jumpClock) step(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// jump moves Redis TIME by d and leaves the hosts' time where it is.
func (c *jumpClock) jump(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.jumped += d
	c.mu.Unlock()
}

func jumpStore(t *testing.T, c redis.UniversalClient, name string, ttl time.Duration, clock *jumpClock, l budget.Limits) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, name, redisstore.WithLeaseTTL(ttl), redisstore.WithTestClocks(clock.Now, clock.Mono))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Register(context.Background(), l, false); err != nil {
		t.Fatal(err)
	}
	return s
}

func try(t *testing.T, s *redisstore.Store, id string) budget.Attempt {
	t.Helper()
	req, _ := get(dom("a")).Normalize()
	att, err := s.TryAcquire(context.Background(), id, req)
	if err != nil {
		t.Fatalf("TryAcquire(%s): %v", id, err)
	}
	return att
}

func storeUsage(t *testing.T, s *redisstore.Store) budget.DomainUsage {
	t.Helper()
	u, err := s.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return domainOf(u, dom("a"))
}

// TestClockBackBucketRefills: a bucket whose last refill now lies minutes
// ahead keeps refilling from where it was, so a waiter for a token is
// granted after its wait, not once TIME has caught up.
func TestClockBackBucketRefills(t *testing.T) {
	c := redistest.Start(t).Client(t)
	clock := newJumpClock()
	s := jumpStore(t, c, "back-bucket", time.Minute, clock, budget.Limits{RequestsPerSecond: 10, Burst: 1})
	if a := try(t, s, "w1"); a.Outcome != budget.Granted {
		t.Fatalf("first: %v", a.Outcome)
	}
	a := try(t, s, "w2")
	if a.Outcome != budget.Delayed || a.Wait > 100*time.Millisecond {
		t.Fatalf("second: %v %v, want delayed 100ms", a.Outcome, a.Wait)
	}
	clock.jump(-5 * time.Minute)
	if a := try(t, s, "w2"); a.Outcome != budget.Delayed || a.Wait > 100*time.Millisecond {
		t.Fatalf("after TIME went back 5m: %v %v, want delayed at most 100ms", a.Outcome, a.Wait)
	}
	clock.step(100*time.Millisecond + time.Microsecond)
	if a := try(t, s, "w2"); a.Outcome != budget.Granted {
		t.Fatalf("100ms later: %v %v, want granted (the bucket refilled)", a.Outcome, a.Wait)
	}
}

// TestClockBackDeadlinesAndPauses: a pause and a dead holder's session,
// set before TIME went back, end as they would have: the pause after its
// retry-after, the session a TTL after its last renewal, not minutes late.
func TestClockBackDeadlinesAndPauses(t *testing.T) {
	c := redistest.Start(t).Client(t)
	clock := newJumpClock()
	const ttl = time.Second
	l := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
	dead := jumpStore(t, c, "back-deadlines", ttl, clock, l)
	live := jumpStore(t, c, "back-deadlines", ttl, clock, l)
	if a := try(t, dead, "held"); a.Outcome != budget.Granted {
		t.Fatalf("grant: %v", a.Outcome)
	}
	if _, err := live.Throttle(context.Background(), dom("b"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	clock.jump(-5 * time.Minute)
	u, err := live.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p := domainOf(u, dom("b")).Paused; p > 2*time.Second {
		t.Errorf("pause left after TIME went back 5m: %v, want at most 2s", p)
	}
	// The live store calls every quarter TTL, as a waiter's liveness would.
	for range 4 {
		clock.step(ttl / 4)
		storeUsage(t, live)
	}
	clock.step(time.Millisecond)
	if n := storeUsage(t, live).InFlight[budget.OpGet]; n != 0 {
		t.Errorf("dead holder's lease still counted a TTL after its grant (TIME went back 5m): %d", n)
	}
	if p := domainOf(must(live.Usage(context.Background())), dom("b")).Paused; p > time.Second {
		t.Errorf("pause left 1s later: %v, want at most 1s", p)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestClockForwardKeepsLiveSessions: TIME jumps forward by more than a
// TTL while a holder keeps beating: its session survives (nobody else is
// granted its slot), no quarantine starts, and a holder that stops beating
// is still reclaimed, within a TTL.
func TestClockForwardKeepsLiveSessions(t *testing.T) {
	c := redistest.Start(t).Client(t)
	clock := newJumpClock()
	const ttl = time.Second
	l := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
	holder := jumpStore(t, c, "forward-live", ttl, clock, l)
	other := jumpStore(t, c, "forward-live", ttl, clock, l)
	if a := try(t, holder, "held"); a.Outcome != budget.Granted {
		t.Fatalf("grant: %v", a.Outcome)
	}
	if a := try(t, other, "waiter"); a.Outcome != budget.Queued {
		t.Fatalf("waiter: %v", a.Outcome)
	}
	clock.step(ttl / 3)
	clock.jump(20 * time.Second) // below the far-jump bound (idle TTL/8): no rebuild
	if a := try(t, other, "waiter"); a.Outcome != budget.Queued {
		t.Fatalf("waiter after a jump of 20s: %v %v, want still queued (the holder's slot is held)", a.Outcome, a.Wait)
	}
	for range 6 { // two TTLs of beats, the waiter calling between them
		clock.step(ttl / 3)
		if missing, err := holder.Heartbeat(context.Background(), []string{"held"}); err != nil || len(missing) != 0 {
			t.Fatalf("heartbeat after the jump: missing %v, %v", missing, err)
		}
		if a := try(t, other, "waiter"); a.Outcome != budget.Queued {
			t.Fatalf("waiter: %v, want queued while the holder beats", a.Outcome)
		}
	}
	// The holder stops beating: its slot comes back within a TTL.
	for i := range 5 {
		clock.step(ttl / 4)
		if a := try(t, other, "waiter"); a.Outcome == budget.Granted {
			if i < 3 {
				t.Errorf("granted %v after the last beat, before the session's TTL ran out", time.Duration(i+1)*ttl/4)
			}
			return
		}
	}
	t.Fatal("the waiter was not granted the slot of a holder silent for 5/4 TTL")
}

// TestClockForwardFarRebuilds: a jump far enough to expire keys apart (a
// domain's counts gone, its leases kept, or the other way) starts a new
// epoch under quarantine; the holder's re-assertion rebuilds the counts,
// so the ceiling holds and nothing leaks.
func TestClockForwardFarRebuilds(t *testing.T) {
	for _, lost := range []string{"d:", "lx"} {
		t.Run("lost="+lost, func(t *testing.T) {
			c := redistest.Start(t).Client(t)
			ctx := context.Background()
			clock := newJumpClock()
			const ttl = time.Second
			l := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
			name := "forward-far-" + lost
			holder := jumpStore(t, c, name, ttl, clock, l)
			other := jumpStore(t, c, name, ttl, clock, l)
			if a := try(t, holder, "held"); a.Outcome != budget.Granted {
				t.Fatalf("grant: %v", a.Outcome)
			}
			// What the jump expired: the domain's hash (its counts) with the
			// lease records kept, or the records with the counts kept (the
			// config goes first: it never outlives the records).
			p := "rb:{" + hex.EncodeToString([]byte(name)) + "}:"
			keys := []string{p + "d:1." + hex.EncodeToString([]byte("a"))}
			if lost == "lx" {
				keys = []string{p + "cfg", redistest.LeaseKey(ctx, c, p, redisstore.SessionID(holder))}
			}
			if n := c.Del(ctx, keys...).Val(); n != int64(len(keys)) {
				t.Fatalf("DEL %s: %d", keys, n)
			}
			clock.jump(2 * time.Minute)
			a := try(t, other, "waiter")
			if a.Outcome != budget.Delayed || a.Wait <= 0 || a.Wait > ttl {
				t.Fatalf("first call after a jump of 2m: %v %v, want delayed by the quarantine (at most a TTL)", a.Outcome, a.Wait)
			}
			// The holder beats on: its first beat hears of the new epoch
			// and re-asserts, and the quarantine ends a TTL after that.
			for range 4 {
				clock.step(ttl / 3)
				if missing, err := holder.Heartbeat(ctx, []string{"held"}); err != nil || len(missing) != 0 {
					t.Fatalf("heartbeat: missing %v, %v", missing, err)
				}
			}
			if n := storeUsage(t, other).InFlight[budget.OpGet]; n != 1 {
				t.Fatalf("in flight after re-assertion: %d, want 1 (the holder's lease)", n)
			}
			if a := try(t, other, "waiter"); a.Outcome != budget.Queued {
				t.Fatalf("waiter after the quarantine: %v %v, want queued behind the re-asserted lease", a.Outcome, a.Wait)
			}
			if err := holder.Retire(ctx, "held", lease.All); err != nil {
				t.Fatal(err)
			}
			if a := try(t, other, "waiter"); a.Outcome != budget.Granted {
				t.Fatalf("waiter after the release: %v, want granted (no count leaked)", a.Outcome)
			}
			if err := other.Retire(ctx, "waiter", lease.All); err != nil {
				t.Fatal(err)
			}
			if n := storeUsage(t, other).InFlight[budget.OpGet]; n != 0 {
				t.Fatalf("in flight at the end: %d", n)
			}
		})
	}
}

// TestClockForwardIdleIsTime: with no lease held, a long silence is time
// passing like any other: no quarantine, the bucket full again.
func TestClockForwardIdleIsTime(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	clock := newJumpClock()
	s := jumpStore(t, c, "forward-idle", time.Second, clock, budget.Limits{RequestsPerSecond: 1, Burst: 3})
	for i := range 3 {
		id := "a" + string(rune('0'+i))
		if a := try(t, s, id); a.Outcome != budget.Granted {
			t.Fatalf("grant %d: %v", i, a.Outcome)
		}
		if err := s.Retire(ctx, id, lease.All); err != nil {
			t.Fatal(err)
		}
	}
	clock.step(10 * time.Minute)
	for i := range 3 {
		id := "b" + string(rune('0'+i))
		if a := try(t, s, id); a.Outcome != budget.Granted {
			t.Fatalf("grant %d after 10 idle minutes: %v %v, want the burst back", i, a.Outcome, a.Wait)
		}
		if err := s.Retire(ctx, id, lease.All); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClockBackConfigNeverOutlivesRecords: after TIME went back, keys
// renewed from then on expire earlier by Redis's clock than the config
// renewed before; a jump forward could then expire the lease records and
// leave the config, which would vouch for counts no record backs. The step
// back renews the config with the records.
func TestClockBackConfigNeverOutlivesRecords(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	clock := newJumpClock()
	s := jumpStore(t, c, "back-ttls", time.Second, clock, budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 2}})
	if a := try(t, s, "held"); a.Outcome != budget.Granted {
		t.Fatalf("grant: %v", a.Outcome)
	}
	p := "rb:{" + hex.EncodeToString([]byte("back-ttls")) + "}:"
	// What a step back of Redis's own clock does to a TTL set before it.
	idle := redisstore.IdleTTL(s)
	if err := c.PExpire(ctx, p+"cfg", idle+5*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	clock.jump(-5 * time.Minute)
	if a := try(t, s, "next"); a.Outcome != budget.Granted {
		t.Fatalf("grant after the step back: %v", a.Outcome)
	}
	// The records first: a millisecond passing between the two reads then
	// shortens the config's, never the records', so equal TTLs pass.
	lx := c.PTTL(ctx, redistest.LeaseKey(ctx, c, p, redisstore.SessionID(s))).Val()
	if cfg := c.PTTL(ctx, p+"cfg").Val(); cfg > lx {
		t.Errorf("after a step back the config lives %v, the lease records %v: the config outlives them", cfg, lx)
	}
}
