package redisstore

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/recpack"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/lease"
)

// Tests of the waiter renewals (renew.go) on a real Redis 7.

const renewTTL = 300 * time.Millisecond

func renewLimits() budget.Limits {
	return budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
}

func renewReq(t *testing.T) budget.Request {
	t.Helper()
	req, err := budget.Request{Domains: []budget.Domain{{Version: 1, ID: "a"}}, Class: budget.OpGet, Consumer: "test"}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// renewHolder returns a Budget on its own store and client that holds the
// one slot of budget name until the test releases it.
func renewHolder(t *testing.T, srv *redistest.Server, name string) (*budget.Budget, *budget.Lease) {
	t.Helper()
	s, _, _ := batchStore(t, srv, name, renewLimits(), WithLeaseTTL(renewTTL))
	b, err := budget.New(renewLimits(), budget.WithStore(s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := b.Acquire(ctx, renewReq(t))
	if err != nil {
		t.Fatal(err)
	}
	return b, l
}

// count returns how many of calls ran the script op, alone or in a batch.
func count(t *testing.T, calls []sentCall, op string) int {
	n := 0
	for _, c := range calls {
		switch c.fn {
		case budgetLibrary.function(op):
			n++
		case budgetLibrary.function("batch"), budgetLibrary.function("batch_oom"):
			n += len(slices.DeleteFunc(batchOps(t, c), func(o string) bool { return o != op }))
		}
	}
	return n
}

// acquireBehind builds a Budget on s, forgets the calls h saw so far, and
// starts an Acquire (released at once when granted) that queues behind
// the holder; its error, nil once granted, comes on the channel.
func acquireBehind(t *testing.T, s *Store, h *scriptHook) <-chan error {
	t.Helper()
	b, err := budget.New(renewLimits(), budget.WithStore(s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	h.sent()
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := b.Acquire(ctx, renewReq(t))
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	return got
}

// waiting reports whether Redis holds a liveness deadline for waiter id
// of s's group.
func waitingInRedis(t *testing.T, s *Store, id string) bool {
	t.Helper()
	// Its marker, in one of the group's sessions (lib.lua, Queues).
	ctx, p := context.Background(), s.single.prefix
	ce := s.client.HGet(ctx, p+"cfg", "ce").Val()
	for _, sid := range s.client.ZRange(ctx, p+"sexp", 0, -1).Val() {
		if v, err := s.client.HGet(ctx, recpack.LeaseKey(p, ce, sid), id).Result(); err == nil && strings.HasPrefix(v, "W") {
			return true
		}
	}
	return false
}

// TestRenewKeepsQueuedWaiter: a waiter blocked by a ceiling for five TTLs
// keeps its place while its Budget calls acquire about once (its first
// call; the safety net is three TTLs away), and the store's renewals are
// one call per interval for the group. Before renewals, the Budget called
// acquire every TTL/3: 15 times here.
func TestRenewKeepsQueuedWaiter(t *testing.T) {
	srv := redistest.Start(t)
	_, held := renewHolder(t, srv, "renew-keeps")
	s, h, _ := batchStore(t, srv, "renew-keeps", renewLimits(), WithLeaseTTL(renewTTL))
	start := time.Now()
	got := acquireBehind(t, s, h)
	time.Sleep(5 * renewTTL)
	calls := h.sent()
	elapsed := time.Since(start)
	acq, ren := count(t, calls, "acquire"), count(t, calls, "renew")
	t.Logf("in %v: %d acquire calls, %d renew calls", elapsed, acq, ren)
	if acq > 2 {
		t.Errorf("%d acquire calls while queued for %v, want at most 2", acq, elapsed)
	}
	intervals := int(elapsed / (renewTTL / 3))
	if ren < intervals-2 || ren > intervals+1 {
		t.Errorf("%d renew calls in %d intervals, want one per interval", ren, intervals)
	}
	if u, err := s.Usage(context.Background()); err != nil || u.Waiters != 1 {
		t.Fatalf("Usage: %+v %v, want the waiter still queued", u, err)
	}
	released := time.Now()
	held.Release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(released); d > 200*time.Millisecond {
			t.Errorf("granted %v after the release, want on the wake", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not granted after the release")
	}
}

// TestRenewCollectsLostGrant: a handoff grant whose wake message reaches
// nobody (the waiter named a channel nobody listens on) is found by the
// next renewal, which wakes the waiter: collected within about one
// interval, where the Budget's own safety call is three TTLs away.
func TestRenewCollectsLostGrant(t *testing.T) {
	srv := redistest.Start(t)
	_, held := renewHolder(t, srv, "renew-lost")
	s, _, _ := batchStore(t, srv, "renew-lost", renewLimits(), WithLeaseTTL(renewTTL))
	s.proc = "nobody" // wakes for its waiters go where no hub listens
	ctx := context.Background()
	att, err := s.TryAcquire(ctx, "lost-grant", renewReq(t))
	if err != nil || att.Outcome != budget.Queued || !att.Renewed {
		t.Fatalf("TryAcquire: %+v %v, want Queued and Renewed", att, err)
	}
	released := time.Now()
	held.Release()
	select {
	case <-att.Wake:
	case <-time.After(renewTTL):
		t.Fatalf("no wake %v after the grant", renewTTL)
	}
	took := time.Since(released)
	att, err = s.TryAcquire(ctx, "lost-grant", renewReq(t))
	if err != nil || att.Outcome != budget.Granted {
		t.Fatalf("TryAcquire after the wake: %+v %v, want Granted", att, err)
	}
	t.Logf("lost grant collected %v after the release (interval %v)", took, renewTTL/3)
	if took > renewTTL/3+150*time.Millisecond {
		t.Errorf("collected %v after the release, want within about one interval (%v)", took, renewTTL/3)
	}
	if err := s.Retire(ctx, "lost-grant", lease.Request|lease.Body); err != nil {
		t.Fatal(err)
	}
}

// TestRenewEndsWithTheProcess: a queued waiter of a live store keeps its
// place past its TTL with no call of its own; once its store stops (the
// process died, nothing cancelled), its place is reclaimed within about a
// TTL, as before renewals.
func TestRenewEndsWithTheProcess(t *testing.T) {
	srv := redistest.Start(t)
	live, held := renewHolder(t, srv, "renew-dies")
	defer held.Release()
	dead, _, _ := batchStore(t, srv, "renew-dies", renewLimits(), WithLeaseTTL(renewTTL))
	ctx := context.Background()
	if att, err := dead.TryAcquire(ctx, "dead-waiter", renewReq(t)); err != nil || att.Outcome != budget.Queued {
		t.Fatalf("TryAcquire: %+v %v", att, err)
	}
	// Every script reclaims what is due: Usage runs one.
	poll := func(d time.Duration, until func() bool) bool {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			if _, err := live.Usage(ctx); err != nil {
				t.Fatal(err)
			}
			if until() {
				return true
			}
			time.Sleep(20 * time.Millisecond)
		}
		return false
	}
	gone := func() bool { return !waitingInRedis(t, dead, "dead-waiter") }
	if poll(3*renewTTL, gone) {
		t.Fatal("the waiter lost its place while its store renewed it")
	}
	dead.Close()
	stopped := time.Now()
	if !poll(5*renewTTL, gone) {
		t.Fatalf("the dead store's waiter still queued %v after it stopped", time.Since(stopped))
	}
	took := time.Since(stopped)
	t.Logf("reclaimed %v after the store stopped (TTL %v)", took, renewTTL)
	if bound := renewTTL + 200*time.Millisecond; took > bound {
		t.Errorf("reclaimed %v after the store stopped, want within about a TTL (%v)", took, bound)
	}
}

// TestRenewForgetsSilentWaiter: a waiter of a live store that never calls
// again (its caller forgot it) is renewed for renewFor TTLs after its last
// call, not for ever: then its place lapses a TTL later.
func TestRenewForgetsSilentWaiter(t *testing.T) {
	srv := redistest.Start(t)
	live, held := renewHolder(t, srv, "renew-silent")
	defer held.Release()
	s, _, _ := batchStore(t, srv, "renew-silent", renewLimits(), WithLeaseTTL(renewTTL))
	ctx := context.Background()
	start := time.Now()
	if att, err := s.TryAcquire(ctx, "silent", renewReq(t)); err != nil || att.Outcome != budget.Queued {
		t.Fatalf("TryAcquire: %+v %v", att, err)
	}
	for waitingInRedis(t, s, "silent") {
		if time.Since(start) > 10*renewTTL {
			t.Fatalf("the silent waiter still queued %v after its only call", time.Since(start))
		}
		if _, err := live.Usage(ctx); err != nil { // reclaims what is due
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("the silent waiter's place lapsed %v after its call (TTL %v)", took, renewTTL)
	if took < (renewFor-1)*renewTTL {
		t.Errorf("lapsed after %v: renewals stopped before %d TTLs", took, renewFor)
	}
}

// TestRenewTriesLostHead: a queued waiter that comes to head its queue
// while the rate holds it back is sent a wake to call ("<id>"); when that
// wake is lost, renewals still try it as a handoff would, so it is granted
// once a token is there, and the renewal after says so.
func TestRenewTriesLostHead(t *testing.T) {
	srv := redistest.Start(t)
	l := budget.Limits{RequestsPerSecond: 2, Burst: 1, InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
	hs, _, _ := batchStore(t, srv, "renew-head", l, WithLeaseTTL(renewTTL))
	s, _, _ := batchStore(t, srv, "renew-head", l, WithLeaseTTL(renewTTL))
	s.proc = "nobody" // every wake for its waiters is lost
	ctx := context.Background()
	if att, err := hs.TryAcquire(ctx, "holder", renewReq(t)); err != nil || att.Outcome != budget.Granted {
		t.Fatalf("holder: %+v %v", att, err)
	}
	granted := time.Now() // the bucket is empty: the next token comes 500ms on
	att, err := s.TryAcquire(ctx, "head", renewReq(t))
	if err != nil || att.Outcome != budget.Queued {
		t.Fatalf("TryAcquire: %+v %v, want Queued", att, err)
	}
	if err := hs.Retire(ctx, "holder", lease.Request|lease.Body); err != nil {
		t.Fatal(err)
	}
	select {
	case <-att.Wake:
	case <-time.After(5 * renewTTL):
		t.Fatalf("no wake %v after the release", 5*renewTTL)
	}
	took := time.Since(granted)
	if att, err := s.TryAcquire(ctx, "head", renewReq(t)); err != nil || att.Outcome != budget.Granted {
		t.Fatalf("TryAcquire after the wake: %+v %v, want Granted", att, err)
	}
	t.Logf("head woken with its grant %v after the token was taken (next token 500ms on, interval %v)", took, renewTTL/3)
	if bound := 500*time.Millisecond + 2*renewTTL/3 + 150*time.Millisecond; took > bound {
		t.Errorf("woken %v after, want within %v", took, bound)
	}
	if err := s.Retire(ctx, "head", lease.Request|lease.Body); err != nil {
		t.Fatal(err)
	}
}

// TestRenewNudgesInQuarantine: while the budget is quarantined after a
// state loss, a renewal keeps no place, so it wakes the waiters it names:
// each calls, learns how long the quarantine lasts, and is back at its
// end, where without the wake it would sleep until its safety call three
// TTLs away.
func TestRenewNudgesInQuarantine(t *testing.T) {
	srv := redistest.Start(t)
	_, held := renewHolder(t, srv, "renew-quarantine")
	s, h, c := batchStore(t, srv, "renew-quarantine", renewLimits(), WithLeaseTTL(renewTTL))
	got := acquireBehind(t, s, h)
	deadline := time.Now().Add(5 * time.Second)
	for !waitingInRedis(t, s, waiterOf(t, s)) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A quarantine of one TTL from now, in the group's clock (TIME plus
	// its offset), as a state loss starts one.
	ctx := context.Background()
	cfg := s.single.prefix + "cfg"
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	co, _ := c.HGet(ctx, cfg, "co").Int64()
	// pc, the packed copy scripts read, goes with the edit (see lib.lua).
	if _, err := c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.HSet(ctx, cfg, "qu", now.UnixMicro()+co+renewTTL.Microseconds())
		tx.HDel(ctx, cfg, "pc")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The next renewal comes within TTL/3; the waiter's safety call, three
	// TTLs after its first, well after this window.
	h.sent()
	deadline = time.Now().Add(renewTTL)
	for n := 0; n == 0; n += count(t, h.sent(), "acquire") {
		if time.Now().After(deadline) {
			t.Fatalf("no acquire call within %v of the quarantine's start: the waiter was not woken", renewTTL)
		}
		time.Sleep(5 * time.Millisecond)
	}
	held.Release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not granted after the quarantine")
	}
}

// waiterOf returns the id of s's one waiter.
func waiterOf(t *testing.T, s *Store) string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.wakes {
		return id
	}
	return ""
}

// TestFlushDoneCancelsWithoutLeases: a cancel that failed is sent again by
// the renewals in a group where the process holds no lease (no heartbeat
// goes there), a TTL after they first find it, since a waiter left queued
// would keep its place as long as its session lives.
func TestFlushDoneCancelsWithoutLeases(t *testing.T) {
	srv := redistest.Start(t)
	_, held := renewHolder(t, srv, "flush-done")
	defer held.Release()
	s, _, _ := batchStore(t, srv, "flush-done", renewLimits(), WithLeaseTTL(renewTTL))
	ctx := context.Background()
	if att, err := s.TryAcquire(ctx, "w", renewReq(t)); err != nil || att.Outcome != budget.Queued {
		t.Fatalf("TryAcquire: %+v %v", att, err)
	}
	// As a failed cancel leaves it: forgotten here, its id in done.
	s.mu.Lock()
	g := s.single
	g.done[doneID{"w", s.wakes["w"].sid}] = struct{}{}
	delete(s.wakes, "w")
	s.mu.Unlock()
	s.flushDone(ctx)
	if !waitingInRedis(t, s, "w") {
		t.Fatal("cancelled at first sight; want a TTL later")
	}
	s.mu.Lock()
	g.flushAt = s.now().Add(-time.Millisecond)
	s.mu.Unlock()
	s.flushDone(ctx)
	if waitingInRedis(t, s, "w") {
		t.Fatal("the waiter is still queued after the flush")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(g.done) != 0 {
		t.Errorf("done after the flush: %v", g.done)
	}
}
