package redisstore_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

// byPrefix is a shard key for tests: the part of a domain's ID before "/".
func byPrefix(d budget.Domain) string {
	k, _, _ := strings.Cut(d.ID, "/")
	return k
}

func openSharded(t testing.TB, c redis.UniversalClient, name string, l budget.Limits, opts ...budget.Option) *budget.Budget {
	t.Helper()
	s, err := redisstore.New(c, name, redisstore.WithLeaseTTL(3*time.Second), redisstore.WithShardKey(byPrefix))
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	b, err := budget.New(l, append([]budget.Option{budget.WithStore(s)}, opts...)...)
	if err != nil {
		t.Fatalf("budget.New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestShardGroups: a request across two groups is refused at once, naming
// both; domains of different groups keep apart keys (different hash tags)
// while one group's domains share one; Usage and Admin see every group.
func TestShardGroups(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	b := openSharded(t, c, "sharded", slots(1))
	ctx := within(t, 30*time.Second)

	_, err := b.Acquire(ctx, get(dom("p/a"), dom("q/a")))
	if !errors.Is(err, budget.ErrInvalidRequest) || !strings.Contains(err.Error(), "different shard groups") {
		t.Fatalf("Acquire across two groups = %v, want ErrInvalidRequest naming the groups", err)
	}
	// One group holds its only slot on p/a; group q still admits.
	pa := mustAcquire(t, b, get(dom("p/a"), dom("p/b")))
	qa := mustAcquire(t, b, get(dom("q/a")))
	// Each group's keys carry their own hash tag.
	tags := map[string]bool{}
	for _, k := range c.Keys(ctx, "rb:*").Val() {
		if open, close := strings.IndexByte(k, '{'), strings.IndexByte(k, '}'); open >= 0 && close > open {
			tags[k[open:close+1]] = true
		}
	}
	if len(tags) != 3 { // the name's (registry, limits), group p's, group q's
		t.Errorf("hash tags %v, want three: the registry's and one per group", tags)
	}
	u := usage(t, b)
	if got := len(u.Domains); got != 3 {
		t.Errorf("Usage lists %d domains, want p/a, p/b and q/a: %+v", got, u.Domains)
	}
	adm, _ := redisstore.NewAdmin(c)
	in, err := adm.Inspect(ctx, "sharded", 0)
	if err != nil {
		t.Fatal(err)
	}
	if in.Groups != 2 || len(in.Domains) != 3 || len(in.Leases) != 2 {
		t.Errorf("Inspect: %d groups, %d domains, %d leases; want 2, 3, 2", in.Groups, len(in.Domains), len(in.Leases))
	}
	list, err := adm.List(ctx)
	if err != nil || len(list) != 1 || list[0].Groups != 2 || list[0].Leases != 2 {
		t.Errorf("List = %+v, %v; want one budget with 2 groups and 2 leases", list, err)
	}
	// A throttle from the operator reaches the domain's own group.
	if err := adm.Throttle(ctx, "sharded", dom("q/a"), time.Second); err != nil {
		t.Fatal(err)
	}
	if f := domainOf(usage(t, b), dom("q/a")).RateFactor; f >= 1 {
		t.Errorf("q/a factor %v after the operator's throttle, want below 1", f)
	}
	if f := domainOf(usage(t, b), dom("p/a")).RateFactor; f != 1 {
		t.Errorf("p/a factor %v after a throttle of q/a, want 1", f)
	}
	if n, err := adm.DropLeases(ctx, "sharded", "", true); err != nil || n != 2 {
		t.Errorf("DropLeases(all) = %d, %v; want 2 over both groups", n, err)
	}
	pa.Release()
	qa.Release()
}

// TestShardLimitsConflict: a host whose limits differ is refused before
// any group exists, and a group registered by an earlier host is checked
// on first use; a host that replaces limits replaces them in every group.
func TestShardLimitsConflict(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	h1 := openSharded(t, c, "conflict", slots(1))
	s2, err := redisstore.New(c, "conflict", redisstore.WithShardKey(byPrefix))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := budget.New(slots(2), budget.WithStore(s2)); !errors.Is(err, budget.ErrLimitsConflict) {
		t.Fatalf("second host with other limits before any group = %v, want ErrLimitsConflict", err)
	}
	l := mustAcquire(t, h1, get(dom("p/a")))
	h2 := openSharded(t, c, "conflict", slots(2), budget.WithReplaceLimits())
	// Two slots now, on the group h1 created: h2's replace reached it.
	l2 := mustAcquire(t, h2, get(dom("p/a")))
	adm, _ := redisstore.NewAdmin(c)
	in, err := adm.Inspect(within(t, 10*time.Second), "conflict", 0)
	if err != nil || in.Limits.InFlight[budget.OpGet] != 2 {
		t.Errorf("stored limits %+v, %v; want the replaced 2 slots", in.Limits, err)
	}
	l.Release()
	l2.Release()
}

// TestShardGroupsOverCluster: on a 3-master cluster, groups spread over the
// masters; every script call of a group touches one slot (no CROSSSLOT, no
// MOVED loop), and a host holds one wake connection per master it uses,
// not one per group.
func TestShardGroupsOverCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster start takes a few seconds")
	}
	cl := redistest.StartCluster(t, 3, 0)
	c := cl.Client(t)
	b := openSharded(t, c, "spread", slots(2))
	const groups = 24
	var wg sync.WaitGroup
	errs := make(chan error, groups)
	for g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				l, err := b.Acquire(within(t, 30*time.Second), get(dom(fmt.Sprintf("g%d/%d", g, i%2))))
				if err != nil {
					errs <- err
					return
				}
				l.Release()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Acquire on a group: %v", err)
	}
	masters := map[string]bool{}
	ctx := within(t, 10*time.Second)
	for g := range groups {
		m, err := c.MasterForKey(ctx, fmt.Sprintf("rb:{%x.%x}:cfg", "spread", fmt.Sprintf("g%d", g)))
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true
	}
	if len(masters) != 3 {
		t.Errorf("%d groups landed on %d masters, want all 3", groups, len(masters))
	}
	// Every master that holds a group has exactly one pub/sub client of
	// this process: its hub.
	for addr := range masters {
		n := 0
		clients, err := redis.NewClient(&redis.Options{Addr: addr}).ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(clients, "\n") {
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "ssub="); ok && v != "0" {
					n++ // a connection subscribed to shard channels
				}
			}
		}
		if n != 1 {
			t.Errorf("master %s has %d sharded pub/sub connections, want 1 for %d groups", addr, n, groups)
		}
	}
	if u := usage(t, b); u.Waiters != 0 || len(u.Domains) != 0 {
		t.Errorf("usage after every release: %+v, want idle", u)
	}
}

// TestShardGroupsKeysDisjoint: the same name sharded and unsharded are two
// budgets: a slot held in one does not count in the other, and each has
// its own config key.
func TestShardGroupsKeysDisjoint(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	plain := open(t, c, "x", slots(1), 3*time.Second)
	held := mustAcquire(t, plain, get(dom("a")))
	sh := openSharded(t, c, "x", slots(1))
	l := mustAcquire(t, sh, get(dom("a"))) // shard key "a", the same ID, the same name
	ctx := within(t, 10*time.Second)
	var cfgs []string
	for _, k := range c.Keys(ctx, "rb:*:cfg").Val() {
		cfgs = append(cfgs, k)
	}
	if len(cfgs) != 2 {
		t.Errorf("config keys %q, want the plain budget's and the shard group's", cfgs)
	}
	if u := usage(t, plain); domainOf(u, dom("a")).InFlight[budget.OpGet] != 1 {
		t.Errorf("plain budget sees %+v, want only its own lease", u)
	}
	held.Release()
	l.Release()
}
