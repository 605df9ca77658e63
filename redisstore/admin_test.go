package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

func TestAdmin(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"redis", func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient {
			if testing.Short() {
				t.Skip("cluster")
			}
			return redistest.StartCluster(t, 3, 0).Client(t)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { testAdmin(t, tc.client(t)) })
	}
}

func testAdmin(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	adm, err := redisstore.NewAdmin(c)
	if err != nil {
		t.Fatal(err)
	}
	lim := budget.Limits{RequestsPerSecond: 100, InFlight: map[budget.OpClass]int{budget.OpGet: 1}, MemoryBytes: 1000}
	b := open(t, c, "ops {1}", lim, 10*time.Second) // liveness calls every 3.3s: wakes must come from events
	open(t, c, "other", slots(3), 2*time.Second)
	a, x := dom("a\nb"), budget.Domain{Version: 2, ID: "x"}

	if _, err := adm.Inspect(ctx, "missing", 0); !errors.Is(err, redisstore.ErrNoBudget) {
		t.Errorf("Inspect(missing) = %v, want ErrNoBudget", err)
	}
	if err := adm.Throttle(ctx, "missing", a, 0); !errors.Is(err, redisstore.ErrNoBudget) {
		t.Errorf("Throttle(missing) = %v, want ErrNoBudget", err)
	}

	held := mustAcquire(t, b, budget.Request{Domains: []budget.Domain{a, x}, Class: budget.OpGet, MemoryBytes: 300, Consumer: "lane-1"})
	waiter := make(chan error, 1)
	go func() {
		l, err := b.Acquire(context.Background(), budget.Request{Domains: []budget.Domain{a}, Class: budget.OpGet, Consumer: "lane-2"})
		if err == nil {
			l.Release()
		}
		waiter <- err
	}()
	for usage(t, b).Waiters != 1 {
		time.Sleep(time.Millisecond)
	}
	if err := adm.Throttle(ctx, "ops {1}", x, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	list, err := adm.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "ops {1}" || list[0].Leases != 1 || list[0].Waiters != 1 || list[0].Domains != 2 || list[1].Name != "other" {
		t.Errorf("List = %+v", list)
	}

	in, err := adm.Inspect(ctx, "ops {1}", 0)
	if err != nil {
		t.Fatal(err)
	}
	// Memory is the host's (each Budget keeps its own line): the store
	// never sees it, so the budget in Redis holds none and stores no ceiling.
	stored := b.Limits()
	stored.MemoryBytes = 0
	if !in.Limits.Equal(stored) || len(in.Leases) != 1 || len(in.Waiters) != 1 || len(in.Domains) != 2 {
		t.Fatalf("Inspect = %+v", in)
	}
	if l := in.Leases[0]; l.Consumer != "lane-1" || l.Class != budget.OpGet || l.Parts != "request" ||
		len(l.Domains) != 2 || l.ExpiresIn <= 0 || l.ExpiresIn > 10*time.Second || l.Age < 0 || l.Age > time.Minute {
		t.Errorf("lease = %+v", l)
	}
	if w := in.Waiters[0]; w.Consumer != "lane-2" || w.Domains[0] != a || w.Waiting < 0 {
		t.Errorf("waiter = %+v", w)
	}
	for _, d := range in.Domains {
		switch d.Domain {
		case a:
			if d.InFlight[budget.OpGet] != 1 || d.Waiters != 1 || d.Throttled || d.Rate != 100 || d.Tokens < 0 || d.Tokens > d.Burst {
				t.Errorf("domain a = %+v", d)
			}
		case x:
			if !d.Throttled || d.RateFactor >= 1 || d.Paused <= 9*time.Second || d.Tokens > 0 {
				t.Errorf("domain x = %+v", d)
			}
		default:
			t.Errorf("unexpected domain %s", d.Domain)
		}
	}

	if ok, err := adm.ResetThrottle(ctx, "ops {1}", x); err != nil || !ok {
		t.Fatalf("ResetThrottle = %v, %v", ok, err)
	}
	if du := domainOf(usage(t, b), x); du.RateFactor != 1 || du.Paused != 0 {
		t.Errorf("after reset: %+v", du)
	}

	// Dropping lane-1's lease frees the slot for the waiter at once.
	if n, err := adm.DropLeases(ctx, "ops {1}", "nobody", false); err != nil || n != 0 {
		t.Errorf("DropLeases(nobody) = %d, %v", n, err)
	}
	if n, err := adm.DropLeases(ctx, "ops {1}", "lane-1", false); err != nil || n != 1 {
		t.Fatalf("DropLeases(lane-1) = %d, %v", n, err)
	}
	select {
	case err := <-waiter:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not admitted after its blocker's lease was dropped")
	}
	held.Release() // already dropped: harmless

	// Replacing limits: a waiter blocked by the old ceiling moves at once.
	h1 := mustAcquire(t, b, get(a))
	w2 := make(chan error, 1)
	go func() {
		l, err := b.Acquire(context.Background(), get(a))
		if err == nil {
			l.Release()
		}
		w2 <- err
	}()
	for usage(t, b).Waiters != 1 {
		time.Sleep(time.Millisecond)
	}
	if err := adm.ReplaceLimits(ctx, "missing", lim); !errors.Is(err, redisstore.ErrNoBudget) {
		t.Errorf("ReplaceLimits(missing) = %v", err)
	}
	if err := adm.ReplaceLimits(ctx, "ops {1}", budget.Limits{}); !errors.Is(err, budget.ErrInvalidLimits) {
		t.Errorf("ReplaceLimits(zero) = %v", err)
	}
	raised := lim
	raised.InFlight = map[budget.OpClass]int{budget.OpGet: 2}
	if err := adm.ReplaceLimits(ctx, "ops {1}", raised); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w2:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Second): // well under the 3.3s liveness call
		t.Fatal("waiter not woken by raised limits")
	}
	h1.Release()
	expectIdle(t, b)
}

func domainOf(u budget.Usage, d budget.Domain) budget.DomainUsage {
	for _, du := range u.Domains {
		if du.Domain == d {
			return du
		}
	}
	return budget.DomainUsage{Domain: d, RateFactor: 1}
}

// TestAdminLibraries: listing and pruning runbudget function libraries, on
// every master of a Cluster; a server without FUNCTION says so.
func TestAdminLibraries(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster start takes a few seconds")
	}
	cl := redistest.StartCluster(t, 3, 0)
	c := cl.Client(t)
	ctx := context.Background()
	s, err := redisstore.New(c, "libs") // loads this build's library on every master
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const other = "runbudget_000000000001"
	for _, n := range cl.Nodes() {
		if err := n.Client(t).FunctionLoad(ctx,
			"#!lua name="+other+"\nredis.register_function('rb_000000000001_noop', function() return 1 end)").Err(); err != nil {
			t.Fatal(err)
		}
	}
	adm, err := redisstore.NewAdmin(c)
	if err != nil {
		t.Fatal(err)
	}
	libs, err := adm.Libraries(ctx)
	if err != nil || len(libs) != 2 || libs[0].Name != other || libs[0].Current || !libs[1].Current {
		t.Fatalf("Libraries = %+v, %v", libs, err)
	}
	deleted, err := adm.PruneLibraries(ctx)
	if err != nil || len(deleted) != 1 || deleted[0] != other {
		t.Fatalf("PruneLibraries = %v, %v", deleted, err)
	}
	for _, n := range cl.Nodes() {
		for _, l := range n.Client(t).FunctionList(ctx, redis.FunctionListQuery{}).Val() {
			if l.Name == other {
				t.Errorf("node %d still holds %s", n.Port(), other)
			}
		}
	}
	if libs, err := adm.Libraries(ctx); err != nil || len(libs) != 1 || !libs[0].Current {
		t.Fatalf("Libraries after the prune = %+v, %v", libs, err)
	}

	mr := miniredis.RunT(t)
	mc := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer mc.Close()
	madm, _ := redisstore.NewAdmin(mc)
	if _, err := madm.Libraries(ctx); !errors.Is(err, redisstore.ErrNoFunctions) {
		t.Errorf("Libraries on a server without FUNCTION = %v, want ErrNoFunctions", err)
	}
}

// TestInspectTruncated: Truncated says that more leases or waiters exist
// than were listed, not merely that the page is full.
func TestInspectTruncated(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	b := open(t, c, "trunc", slots(10), time.Minute)
	var held []*budget.Lease
	for range 2 {
		held = append(held, mustAcquire(t, b, get(dom("a"))))
	}
	adm, _ := redisstore.NewAdmin(c)
	in, err := adm.Inspect(ctx, "trunc", 2)
	if err != nil || len(in.Leases) != 2 || in.Truncated {
		t.Fatalf("2 leases, most 2: %d listed, truncated %v, %v", len(in.Leases), in.Truncated, err)
	}
	held = append(held, mustAcquire(t, b, get(dom("a"))))
	in, err = adm.Inspect(ctx, "trunc", 2)
	if err != nil || len(in.Leases) != 2 || !in.Truncated {
		t.Fatalf("3 leases, most 2: %d listed, truncated %v, %v", len(in.Leases), in.Truncated, err)
	}
	for _, l := range held {
		l.Release()
	}
}
