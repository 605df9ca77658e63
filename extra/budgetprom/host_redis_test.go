package budgetprom_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/extra/budgetprom"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

// lostSignal passes events to a HostCollector and reports each lost lease
// once the collector has counted it.
type lostSignal struct {
	*budgetprom.HostCollector
	lost chan string
}

func (o lostSignal) ObserveLeaseLost(ev budget.LeaseLostEvent) {
	o.HostCollector.ObserveLeaseLost(ev)
	o.lost <- ev.LeaseID
}

func redisBudget(t *testing.T, c redis.UniversalClient, name string, l budget.Limits, ttl time.Duration, opts ...budget.Option) *budget.Budget {
	t.Helper()
	st, err := redisstore.New(c, name, redisstore.WithLeaseTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	return newBudget(t, l, append([]budget.Option{budget.WithStore(st)}, opts...)...)
}

// TestHostOnRedis holds leases on a Redis budget and checks the host
// gauges against HostStats and Usage, then drops a lease behind the
// holder's back (counted lost) and stops Redis (store errors and an
// unavailable outcome).
func TestHostOnRedis(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	// No retries inside go-redis: with Redis gone each store call fails at
	// once, well within the budget's grace, and is counted. (go-redis's
	// default dial retries outlast a short grace, and a call cut off by the
	// budget's own deadline is not reported as a store error.)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = client.Close() })
	c, reg := newHost(t, budgetprom.HostOpts{Budget: "on-redis"})
	obs := lostSignal{HostCollector: c, lost: make(chan string, 4)}
	name := randomName("host")
	b := redisBudget(t, client, name, budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 8}, MemoryBytes: 1 << 20},
		300*time.Millisecond, budget.WithObserver(obs), budget.WithUnavailableGrace(300*time.Millisecond))
	c.Attach(b)

	const n = 5
	var leases []*budget.Lease
	for range n {
		leases = append(leases, mustAcquire(t, b, budget.Request{Domains: []budget.Domain{acct}, Class: budget.OpGet, MemoryBytes: 1000}))
	}
	u, err := b.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mfs := families(t, reg)
	checkGauge(t, mfs, "runbudget_host_leases_held", n)
	checkGauge(t, mfs, "runbudget_host_leases_held", float64(b.HostStats().Leases))
	checkGauge(t, mfs, "runbudget_host_memory_held_bytes", float64(u.MemoryHeld))
	checkGauge(t, mfs, "runbudget_host_memory_held_bytes", n*1000)
	checkGauge(t, mfs, "runbudget_acquires_total", n, "class", "get", "outcome", "granted")

	adm, err := redisstore.NewAdmin(client)
	if err != nil {
		t.Fatal(err)
	}
	if dropped, err := adm.DropLeases(ctx, name, "", true); err != nil || dropped != n {
		t.Fatalf("DropLeases = %d, %v; want %d", dropped, err, n)
	}
	timeout := time.After(10 * time.Second)
	for range n {
		select {
		case <-obs.lost:
		case <-timeout:
			t.Fatal("dropped leases not reported lost within 10s")
		}
	}
	checkGauge(t, families(t, reg), "runbudget_leases_lost_total", n)
	for _, l := range leases {
		l.Release()
	}

	srv.Kill()
	_, err = b.Acquire(ctx, budget.Request{Domains: []budget.Domain{acct}, Class: budget.OpGet})
	if !errors.Is(err, budget.ErrUnavailable) {
		t.Fatalf("Acquire with Redis down = %v, want ErrUnavailable", err)
	}
	mfs = families(t, reg)
	checkGauge(t, mfs, "runbudget_acquires_total", 1, "class", "get", "outcome", "unavailable")
	if got := value(t, mfs, "runbudget_store_errors_total", "op", "acquire"); got < 1 {
		t.Errorf("store_errors_total{op=acquire} = %v with Redis down, want at least 1", got)
	}
}
