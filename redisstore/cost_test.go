package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

// countCalls counts commands a client sends: its round trips.
type countCalls struct{ n atomic.Int64 }

func (h *countCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}
func (h *countCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}

// TestRoundTrips: an uncontended Acquire is one round trip, a retirement
// one, and one heartbeat renews a thousand leases in one.
func TestRoundTrips(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	hook := &countCalls{}
	c.AddHook(hook)
	s, err := redisstore.New(c, "trips", redisstore.WithLeaseTTL(time.Hour)) // no beat during the test
	if err != nil {
		t.Fatal(err)
	}
	b, err := budget.New(budget.Limits{RequestsPerSecond: 1e6, InFlight: map[budget.OpClass]int{budget.OpGet: 2000}, OpenBodies: 2000, MemoryBytes: 1 << 40}, budget.WithStore(s))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	req := budget.Request{Domains: []budget.Domain{dom("a"), dom("b"), dom("c"), dom("d")}, Class: budget.OpGet, OpensBody: true, MemoryBytes: 100}
	mustAcquire(t, b, req).Release() // scripts loaded

	const n = 50
	before := hook.n.Load()
	var ls []*budget.Lease
	for range n {
		ls = append(ls, mustAcquire(t, b, req))
	}
	acq := hook.n.Load() - before
	before = hook.n.Load()
	for _, l := range ls {
		l.Release()
	}
	rel := hook.n.Load() - before
	t.Logf("round trips: %.2f per Acquire (4 domains, body, memory), %.2f per Release", float64(acq)/n, float64(rel)/n)
	if acq != n || rel != n {
		t.Errorf("round trips: %d for %d acquires, %d for %d releases; want one each", acq, n, rel, n)
	}

	for range 1000 {
		ls = append(ls, mustAcquire(t, b, req))
	}
	ids := make([]string, 0, 1000)
	for _, l := range ls[n:] {
		ids = append(ids, l.ID())
	}
	if _, err := s.Heartbeat(context.Background(), nil); err != nil { // loads the script
		t.Fatal(err)
	}
	before = hook.n.Load()
	start := time.Now()
	missing, err := s.Heartbeat(context.Background(), ids)
	if err != nil || len(missing) != 0 {
		t.Fatalf("Heartbeat: %v, missing %d", err, len(missing))
	}
	t.Logf("heartbeat of 1000 leases: %d round trip(s), %v", hook.n.Load()-before, time.Since(start))
	if got := hook.n.Load() - before; got != 1 {
		t.Errorf("heartbeat of 1000 leases took %d round trips, want 1", got)
	}
	for _, l := range ls[n:] {
		l.Release()
	}
	expectIdle(t, b)
}

// commandStats returns calls per command from INFO commandstats.
func commandStats(t testing.TB, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				out[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return out
}

// TestContentionCost: lanes contend for 8 slots; the script calls and wake
// messages per admitted request stay bounded as the number of waiters
// grows (a thundering herd or an unbounded scan would make them climb).
func TestContentionCost(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	var perAdmit []float64
	for _, lanes := range []int{16, 64} {
		c := srv.Client(t)
		b := open(t, c, fmt.Sprintf("contention-%d", lanes), slots(8), 5*time.Second)
		a := dom("a")
		const per = 30
		before := commandStats(t, admin)
		var wg sync.WaitGroup
		for range lanes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
					l, err := b.Acquire(context.Background(), get(a))
					if err != nil {
						t.Error(err)
						return
					}
					time.Sleep(time.Millisecond)
					l.Release()
				}
			}()
		}
		wg.Wait()
		after := commandStats(t, admin)
		admitted := float64(lanes * per)
		scripts := float64(after["evalsha"]+after["fcall"]-before["evalsha"]-before["fcall"]) / admitted
		pubs := float64(after["publish"]-before["publish"]) / admitted
		var inner int64
		for k, v := range after {
			inner += v - before[k]
		}
		// Each admission is one Acquire call plus one Release: a queued
		// waiter is granted by a releasing script and told so, with no call.
		t.Logf("%d lanes on 8 slots: %.2f script calls, %.2f wake messages, %.1f Redis commands (inside scripts included) per admitted request",
			lanes, scripts, pubs, float64(inner)/admitted)
		perAdmit = append(perAdmit, scripts)
		if scripts > 2.5 {
			t.Errorf("%d lanes: %.2f script calls per admission, want about 2 (acquire, release)", lanes, scripts)
		}
		if pubs > 1.5 {
			t.Errorf("%d lanes: %.2f wake messages per admission: a herd", lanes, pubs)
		}
	}
	if slices.Max(perAdmit) > 1.5*slices.Min(perAdmit)+0.5 {
		t.Errorf("script calls per admission grow with waiters: %v", perAdmit)
	}
}

// BenchmarkReleaseToWake measures the handoff: a waiter blocked on the only
// slot, the holder releases, the waiter's Acquire returns.
func BenchmarkReleaseToWake(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	bud := open(b, c, "wake", slots(1), 5*time.Second)
	a := dom("a")
	lats := make([]time.Duration, 0, b.N)
	for b.Loop() {
		hold := mustAcquire(b, bud, get(a))
		got := make(chan time.Time, 1)
		go func() {
			l, err := bud.Acquire(context.Background(), get(a))
			if err != nil {
				b.Error(err)
			}
			got <- time.Now()
			l.Release()
		}()
		for usage(b, bud).Waiters != 1 {
		}
		released := time.Now()
		hold.Release()
		lats = append(lats, (<-got).Sub(released))
	}
	slices.Sort(lats)
	b.ReportMetric(float64(lats[len(lats)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-us")
}
