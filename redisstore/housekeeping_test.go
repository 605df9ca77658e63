package redisstore_test

import (
	"context"
	"encoding/hex"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/dompack"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/redisstore"
)

// The scripts skip work that is not due: reclaim scans only once the
// earliest deadline may have passed, idle TTLs are renewed when half spent,
// lease hashes when their holder asks. These tests hold each shortcut to
// what it must still guarantee, on real Redis.

// TestShortTTLHolderReclaimedOnTime: a host with a long lease TTL sets the
// point where reclaim is next due far ahead; a host with a short TTL that
// then crashes must still have its slot back soon after its own TTL, at the
// next script anyone runs, so its grant must move that point earlier.
func TestShortTTLHolderReclaimedOnTime(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	live := open(t, c, "shortttl", slots(1), 20*time.Second)
	a := dom("a")
	mustAcquire(t, live, get(a)).Release() // reclaim's next point: 20 s ahead

	const ttl = 300 * time.Millisecond
	dead, err := redisstore.New(c, "shortttl", redisstore.WithLeaseTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	req, _ := get(a).Normalize()
	start := time.Now()
	if att, err := dead.TryAcquire(context.Background(), "short-holder", req); err != nil || att.Outcome != budget.Granted {
		t.Fatalf("short-TTL holder: %+v %v", att, err)
	}
	// Each Usage call runs a script, and every script reclaims what is due.
	for domainOf(usage(t, live), a).InFlight[budget.OpGet] != 0 {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the crashed short-TTL lease still counts after %v (its TTL %v)", time.Since(start), ttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("slot back %v after the short-TTL holder's grant (its TTL %v)", took, ttl)
	if took < ttl {
		t.Errorf("slot back after %v, before the lease's TTL of %v ran out", took, ttl)
	}
	// Without its grant moving the reclaim point, the slot would come back
	// only at the periodic rescan, a second after the last one.
	if took > 800*time.Millisecond {
		t.Errorf("slot back after %v: the short TTL did not move the reclaim point (rescans are a second apart)", took)
	}
	mustAcquire(t, live, get(a)).Release()
	expectIdle(t, live)
}

// TestLongHeldSessionKeysRenewed: leases held for longer than the idle TTL
// keep their records, because heartbeats renew the idle TTLs of the
// session's keys (the lease records, the session's set, the deadlines)
// once a quarter of the idle TTL has passed since they last did, and not
// on every beat.
func TestLongHeldSessionKeysRenewed(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	s, err := redisstore.New(c, "renew", redisstore.WithLeaseTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Register(ctx, slots(4), false); err != nil {
		t.Fatal(err)
	}
	req, _ := get(dom("a")).Normalize()
	if att, err := s.TryAcquire(ctx, "long", req); err != nil || att.Outcome != budget.Granted {
		t.Fatalf("acquire: %+v %v", att, err)
	}
	p := "rb:{" + hex.EncodeToString([]byte("renew")) + "}:"
	keys := []string{p + "sexp", redistest.LeaseKey(ctx, c, p, redisstore.SessionID(s))}
	idle := redisstore.IdleTTL(s)
	short := 10 * time.Minute // stands in for a TTL mostly spent
	shorten := func() {
		t.Helper()
		for _, k := range keys {
			if ttl := c.PTTL(ctx, k).Val(); ttl < idle-time.Minute || ttl > idle {
				t.Fatalf("%s: TTL %v, want about %v", k, ttl, idle)
			}
			c.PExpire(ctx, k, short)
		}
	}
	beat := func() {
		t.Helper()
		if missing, err := s.Heartbeat(ctx, []string{"long"}); err != nil || len(missing) != 0 {
			t.Fatalf("heartbeat: %v %v", missing, err)
		}
	}
	beat() // the first beat of a session renews its keys
	shorten()
	beat()
	for _, k := range keys {
		if ttl := c.PTTL(ctx, k).Val(); ttl > short {
			t.Fatalf("%s renewed on a beat (TTL %v): renewals should be rare", k, ttl)
		}
	}
	redisstore.AgeRenewals(s, idle/4+time.Second)
	beat()
	shorten() // checks they were renewed, then shortens them again
	beat()
	for _, k := range keys {
		if ttl := c.PTTL(ctx, k).Val(); ttl > short {
			t.Fatalf("%s renewed again on the next beat (TTL %v)", k, ttl)
		}
	}
	if err := s.Retire(ctx, "long", lease.All); err != nil {
		t.Fatal(err)
	}
}

// TestHeartbeatRetiresUnlistedLeases: a lease its holder stopped renewing
// (its keeper declared it lost, so it is no longer listed) would live as
// long as the session without per-lease deadlines; a beat retires it once
// it has gone a TTL unlisted, as it would have expired. A lease still
// listed is untouched.
func TestHeartbeatRetiresUnlistedLeases(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	step := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	const ttl = time.Minute
	s, err := redisstore.New(c, "unlisted", redisstore.WithLeaseTTL(ttl), redisstore.WithTestClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Register(ctx, slots(4), false); err != nil {
		t.Fatal(err)
	}
	req, _ := get(dom("a")).Normalize()
	for _, id := range []string{"kept", "dropped"} {
		if att, err := s.TryAcquire(ctx, id, req); err != nil || att.Outcome != budget.Granted {
			t.Fatalf("acquire %s: %+v %v", id, att, err)
		}
	}
	inFlight := func() int {
		t.Helper()
		u, err := s.Usage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return domainOf(u, dom("a")).InFlight[budget.OpGet]
	}
	beat := func() {
		t.Helper()
		step(ttl / 3)
		if missing, err := s.Heartbeat(ctx, []string{"kept"}); err != nil || len(missing) != 0 {
			t.Fatalf("heartbeat: %v %v", missing, err)
		}
	}
	beat()
	beat() // the second lease unlisted for two thirds of a TTL: still held
	if n := inFlight(); n != 2 {
		t.Fatalf("in flight before the unlisted lease's TTL ran out: %d, want 2", n)
	}
	beat() // a TTL unlisted: retired by this beat
	if n := inFlight(); n != 1 {
		t.Fatalf("in flight after the unlisted lease's TTL: %d, want 1 (the listed one)", n)
	}
	if missing, err := s.Heartbeat(ctx, []string{"kept", "dropped"}); err != nil || !slices.Equal(missing, []string{"dropped"}) {
		t.Fatalf("heartbeat listing both: missing %v, %v; want the retired lease", missing, err)
	}
	if err := s.Retire(ctx, "kept", lease.All); err != nil {
		t.Fatal(err)
	}
	if n := inFlight(); n != 0 {
		t.Fatalf("in flight after the release: %d", n)
	}
}

// TestRetireAfterDomainHashLost: a retirement whose domain hash is gone
// (Redis lost it) neither drives a count below zero nor leaves behind a key
// without a TTL.
func TestRetireAfterDomainHashLost(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	b := open(t, c, "lostdom", budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 2}, OpenBodies: 2}, time.Minute)
	a, other := dom("a"), dom("b")
	l := mustAcquire(t, b, budget.Request{Domains: []budget.Domain{a, other}, Class: budget.OpGet, OpensBody: true})
	keep := mustAcquire(t, b, get(other))
	prefix := "rb:{" + hex.EncodeToString([]byte("lostdom")) + "}:"
	var lost string
	for _, k := range budgetKeys(t, c, "lostdom") {
		if len(k) <= len(prefix)+2 || k[len(prefix):len(prefix)+2] != "d:" {
			continue
		}
		d, err := dompack.Decode(c.Get(ctx, k).Val(), budget.NumClasses)
		if err != nil {
			t.Fatalf("domain key %q: %v", k, err)
		}
		if d.Bodies == 1 && d.InFlight[budget.OpGet.Index()] == 1 {
			lost = k // domain a: one request, one body
		}
	}
	if lost == "" {
		t.Fatal("domain a's hash not found")
	}
	c.Del(ctx, lost)
	l.Release()
	if n := c.Exists(ctx, lost).Val(); n != 0 {
		t.Errorf("retire recreated the lost domain key %q: %q", lost, c.Get(ctx, lost).Val())
	}
	for _, k := range budgetKeys(t, c, "lostdom") {
		if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("key %q has no TTL (%v)", k, ttl)
		}
	}
	u := usage(t, b)
	if got := domainOf(u, other).InFlight[budget.OpGet]; got != 1 {
		t.Errorf("domain b in flight %d, want 1 (the kept lease)", got)
	}
	keep.Release()
	expectIdle(t, b)
}

// TestFunctionLibrary: on Redis 7 the scripts run as one function library,
// loaded by New; a Redis that lost it (FUNCTION FLUSH stands in for a
// restart without persistence) gets it back on the next call, which then
// runs normally. miniredis has no functions: EVALSHA there.
func TestFunctionLibrary(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	s, err := redisstore.New(c, "library", redisstore.WithLeaseTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !redisstore.UsesLibrary(s) {
		t.Fatal("New on Redis 7 did not load the function library")
	}
	b, err := budget.New(slots(1), budget.WithStore(s))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mustAcquire(t, b, get(dom("a"))).Release()
	// Every library of this build, and no stray one per store.
	s2, err := redisstore.New(c, "library2")
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil || len(libs) != 1 {
		t.Fatalf("libraries after two stores: %v %v, want one", libs, err)
	}

	if err := c.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, b, get(dom("a"))).Release()
	if n, err := c.FunctionList(ctx, redis.FunctionListQuery{}).Result(); err != nil || len(n) != 1 {
		t.Fatalf("library not loaded again after a flush: %v %v", n, err)
	}
	expectIdle(t, b)

	mr := miniredis.RunT(t)
	mc := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer mc.Close()
	ms, err := redisstore.New(mc, "library")
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	if redisstore.UsesLibrary(ms) {
		t.Error("miniredis has no FUNCTION, yet the store claims the library")
	}
}

// TestLibraryRefusedByACL: a user allowed scripts but not FUNCTION gets the
// scripts by EVALSHA, and everything works.
func TestLibraryRefusedByACL(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nofn", Password: "pw", ContextTimeoutEnabled: true})
	defer c.Close()
	s, err := redisstore.New(c, "nofn")
	if err != nil {
		t.Fatal(err)
	}
	if redisstore.UsesLibrary(s) {
		t.Fatal("the store claims the library although FUNCTION LOAD is refused")
	}
	b, err := budget.New(slots(1), budget.WithStore(s))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mustAcquire(t, b, get(dom("a"))).Release()
	expectIdle(t, b)
}

// TestOneCallGrantsSeveral: a call that frees room for several waiters
// (here new limits) grants them in one go, each seeing the grants before
// it: with room for two more, exactly two of three waiters start.
func TestOneCallGrantsSeveral(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	a := dom("a")
	b := open(t, c, "several", slots(2), time.Minute)
	held := []*budget.Lease{mustAcquire(t, b, get(a)), mustAcquire(t, b, get(a))}
	got := make(chan *budget.Lease, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 3 {
		go func() {
			l, err := b.Acquire(ctx, get(a))
			if err == nil {
				got <- l
			}
		}()
	}
	for usage(t, b).Waiters != 3 {
		time.Sleep(time.Millisecond)
	}
	wider := open(t, c, "several", slots(4), time.Minute, budget.WithReplaceLimits())
	held = append(held, granted(t, got), granted(t, got))
	// Usage runs a script, and so would hand out a slot that is free.
	if n := domainOf(usage(t, wider), a).InFlight[budget.OpGet]; n != 4 {
		t.Fatalf("in flight %d after the limits went from 2 to 4, want 4", n)
	}
	select {
	case l := <-got:
		t.Fatalf("a third waiter started with room for two: %s", l.ID())
	default:
	}
	held[0].Release()
	held = append(held[1:], granted(t, got))
	if n := domainOf(usage(t, b), a).InFlight[budget.OpGet]; n != 4 {
		t.Fatalf("in flight %d, want 4", n)
	}
	for _, l := range held {
		l.Release()
	}
	expectIdle(t, b)
}

// TestReassertSeveralLeasesOnOneDomain: after Redis loses a budget, a host
// holding several leases on the same domains puts every one of them back.
func TestReassertSeveralLeasesOnOneDomain(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	a, other := dom("a"), dom("b")
	b := open(t, c, "reassert-many", slots(10), 300*time.Millisecond)
	var held []*budget.Lease
	for range 3 {
		held = append(held, mustAcquire(t, b, get(a)))
	}
	for range 2 {
		held = append(held, mustAcquire(t, b, get(a, other)))
	}
	if err := c.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		u := usage(t, b)
		if domainOf(u, a).InFlight[budget.OpGet] == 5 && domainOf(u, other).InFlight[budget.OpGet] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the loss, usage never came back to 5 on a and 2 on b: %+v", u)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, l := range held {
		l.Release()
	}
	expectIdle(t, b)
}

// granted waits (boundedly) for a lease from got.
func granted(t *testing.T, got <-chan *budget.Lease) *budget.Lease {
	t.Helper()
	select {
	case l := <-got:
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter was granted within 10s")
		return nil
	}
}

// TestQueueKeysRenewedWhenDue: a waiter that joins behind another, and a
// grant into a session whose set exists, renew no key's TTL (a queue's
// follows its domain's, the waiters' deadlines the config's, a session's
// set its heartbeats), and once the domain and the config are due their
// renewal takes the queue and the waiters' deadlines along, so no key that
// holds waiters runs out while its domain and config live.
func TestQueueKeysRenewedWhenDue(t *testing.T) {
	c, clock, holder, waiter := twoHosts(t, "qttl", time.Hour, 2)
	ctx := context.Background()
	p := "rb:{" + hex.EncodeToString([]byte("qttl")) + "}:"
	q, sl := p+"q:1."+hex.EncodeToString([]byte("a")), redistest.LeaseKey(ctx, c, p, redisstore.SessionID(holder))
	wexp := redistest.LeaseKey(ctx, c, p, redisstore.SessionID(waiter)) // the waiters' markers (lib.lua, Queues)
	idle := redisstore.IdleTTL(holder)
	const short = time.Hour // stands in for a TTL mostly spent
	ttl := func(k string) time.Duration { return c.PTTL(ctx, k).Val() }
	fresh := func(k string) {
		t.Helper()
		// (A queue made after its domain's renewal gets what the domain has
		// left and a second more.)
		if got := ttl(k); got < idle-time.Minute || got > idle+2*time.Second {
			t.Fatalf("%s: TTL %v, want about %v", k, got, idle)
		}
	}
	grantNow(t, holder, "h1")
	fresh(sl)
	c.PExpire(ctx, sl, short)
	grantNow(t, holder, "h2")
	queueNow(t, waiter, "w1", get(dom("a")))
	fresh(q)
	fresh(wexp)
	c.PExpire(ctx, q, short)
	c.PExpire(ctx, wexp, short)
	queueNow(t, waiter, "w2", get(dom("a")))
	for _, k := range []string{sl, q, wexp} {
		if got := ttl(k); got > short || got <= 0 {
			t.Fatalf("%s: TTL %v after a grant or a join that renews nothing, want at most %v", k, got, short)
		}
	}
	// Half an idle TTL later by the scripts' clock, in steps shorter than
	// half a lease TTL (a longer silence with leases held would be taken
	// for a clock jump), with the holder beating and the waiters calling.
	req, _ := get(dom("a")).Normalize()
	for elapsed := time.Duration(0); elapsed <= idle/2; elapsed += 29 * time.Minute {
		clock.step(29 * time.Minute)
		if missing, err := holder.Heartbeat(ctx, []string{"h1", "h2"}); err != nil || len(missing) != 0 {
			t.Fatalf("heartbeat: %v %v", missing, err)
		}
		for _, id := range []string{"w1", "w2"} {
			if att, err := waiter.TryAcquire(ctx, id, req); err != nil || att.Outcome != budget.Queued {
				t.Fatalf("TryAcquire(%s) = %+v, %v; want queued", id, att, err)
			}
		}
	}
	fresh(q)
	fresh(wexp)
	// A heartbeat that renews a domain's key renews its queue with it.
	dk := p + "d:1." + hex.EncodeToString([]byte("a"))
	c.PExpire(ctx, dk, short)
	c.PExpire(ctx, q, short)
	redisstore.AgeRenewals(holder, idle/4+time.Second)
	if missing, err := holder.Heartbeat(ctx, []string{"h1", "h2"}); err != nil || len(missing) != 0 {
		t.Fatalf("heartbeat: %v %v", missing, err)
	}
	fresh(dk)
	fresh(q)
}
