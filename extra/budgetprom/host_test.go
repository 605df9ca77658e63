package budgetprom_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/extra/budgetprom"
)

var (
	acct  = budget.Domain{Version: 1, ID: "acct-42"}
	other = budget.Domain{Version: 1, ID: "acct-7"}
)

func newHost(t *testing.T, opts budgetprom.HostOpts) (*budgetprom.HostCollector, *prometheus.Registry) {
	t.Helper()
	c, err := budgetprom.NewHost(opts)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return c, reg
}

func newBudget(t *testing.T, l budget.Limits, opts ...budget.Option) *budget.Budget {
	t.Helper()
	b, err := budget.New(l, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func mustAcquire(t *testing.T, b *budget.Budget, req budget.Request) *budget.Lease {
	t.Helper()
	l, err := b.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("Acquire(%+v): %v", req, err)
	}
	t.Cleanup(l.Release)
	return l
}

// TestHostAcquireOutcomes drives one Budget through every outcome a caller
// can cause and checks each count, the wait histogram and the gauges
// against HostStats and Usage.
func TestHostAcquireOutcomes(t *testing.T) {
	ctx := context.Background()
	c, reg := newHost(t, budgetprom.HostOpts{Budget: "copy"})
	b := newBudget(t, budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 2}, MemoryBytes: 1000},
		budget.WithObserver(c))

	if mfs := families(t, reg); find(mfs, "runbudget_host_leases_held") != nil {
		t.Error("gauges served before Attach")
	}
	c.Attach(b)

	get := budget.Request{Domains: []budget.Domain{acct}, Class: budget.OpGet, MemoryBytes: 100}
	l1 := mustAcquire(t, b, get)
	mustAcquire(t, b, get)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Acquire(cancelled, get); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire(cancelled) = %v", err)
	}
	if _, err := b.Acquire(ctx, budget.Request{Class: budget.OpGet}); !errors.Is(err, budget.ErrInvalidRequest) {
		t.Fatalf("Acquire(no domains) = %v", err)
	}
	if _, err := b.Acquire(ctx, budget.Request{Domains: []budget.Domain{acct}, Class: "bogus"}); !errors.Is(err, budget.ErrInvalidRequest) {
		t.Fatalf("Acquire(bogus class) = %v", err)
	}
	if _, err := b.Acquire(ctx, budget.Request{Domains: []budget.Domain{acct}, Class: budget.OpGet, MemoryBytes: 2000}); !errors.Is(err, budget.ErrNeverAdmissible) {
		t.Fatalf("Acquire(too much memory) = %v", err)
	}
	if err := b.Throttle(ctx, acct, 0); err != nil {
		t.Fatal(err)
	}

	mfs := families(t, reg)
	for _, tc := range []struct {
		class, outcome string
		want           float64
	}{
		{"get", "granted", 2}, {"get", "cancelled", 1}, {"get", "invalid", 1}, {"unknown", "invalid", 1},
		{"get", "never_admissible", 1}, {"list", "granted", 0}, {"put", "unavailable", 0},
	} {
		if got := value(t, mfs, "runbudget_acquires_total", "budget", "copy", "class", tc.class, "outcome", tc.outcome); got != tc.want {
			t.Errorf("acquires_total{%s,%s} = %v, want %v", tc.class, tc.outcome, got, tc.want)
		}
	}
	if got := value(t, mfs, "runbudget_acquire_wait_seconds", "class", "get", "outcome", "granted"); got != 2 {
		t.Errorf("wait histogram count{get,granted} = %v, want 2", got)
	}
	if find(mfs, "runbudget_acquire_wait_seconds", "class", "list") != nil {
		t.Error("a wait histogram exists for a class never seen")
	}
	if got := value(t, mfs, "runbudget_throttles_total"); got != 1 {
		t.Errorf("throttles_total = %v, want 1", got)
	}
	u, err := b.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hs := b.HostStats()
	if hs.Leases != 2 || u.MemoryHeld != 200 {
		t.Fatalf("HostStats = %+v, Usage.MemoryHeld = %d; want 2 leases, 200 bytes", hs, u.MemoryHeld)
	}
	checkGauge(t, mfs, "runbudget_host_leases_held", float64(hs.Leases))
	checkGauge(t, mfs, "runbudget_host_waiters", 0)
	checkGauge(t, mfs, "runbudget_host_memory_held_bytes", float64(u.MemoryHeld))
	checkGauge(t, mfs, "runbudget_host_limit_memory_bytes", 1000)

	l1.Release()
	mfs = families(t, reg)
	checkGauge(t, mfs, "runbudget_host_leases_held", 1)
	checkGauge(t, mfs, "runbudget_host_memory_held_bytes", 100)
}

func checkGauge(t *testing.T, mfs familiesMap, name string, want float64, pairs ...string) {
	t.Helper()
	if got := value(t, mfs, name, pairs...); got != want {
		t.Errorf("%s%v = %v, want %v", name, pairs, got, want)
	}
}

// queueSignal wraps a store and reports each attempt that left its waiter
// queued: by then the Budget counts the call among its waiters.
type queueSignal struct {
	budget.Store
	queued chan struct{}
}

func (s queueSignal) TryAcquire(ctx context.Context, id string, req budget.Request) (budget.Attempt, error) {
	att, err := s.Store.TryAcquire(ctx, id, req)
	if err == nil && att.Outcome == budget.Queued {
		select {
		case s.queued <- struct{}{}:
		default:
		}
	}
	return att, err
}

// TestHostWaitersGauge holds a lane in line and checks the waiters gauge
// while it waits, and its wait recorded once it is granted.
func TestHostWaitersGauge(t *testing.T) {
	c, reg := newHost(t, budgetprom.HostOpts{})
	st := queueSignal{Store: budget.NewLocalStore(), queued: make(chan struct{}, 1)}
	b := newBudget(t, budget.Limits{InFlight: map[budget.OpClass]int{budget.OpHead: 1}},
		budget.WithStore(st), budget.WithObserver(c))
	c.Attach(b)
	head := budget.Request{Domains: []budget.Domain{acct}, Class: budget.OpHead}
	first := mustAcquire(t, b, head)

	granted := make(chan error, 1)
	go func() {
		l, err := b.Acquire(context.Background(), head)
		if err == nil {
			l.Release()
		}
		granted <- err
	}()
	<-st.queued
	mfs := families(t, reg)
	checkGauge(t, mfs, "runbudget_host_waiters", float64(b.HostStats().Waiters))
	checkGauge(t, mfs, "runbudget_host_waiters", 1)
	first.Release()
	if err := <-granted; err != nil {
		t.Fatal(err)
	}
	mfs = families(t, reg)
	checkGauge(t, mfs, "runbudget_host_waiters", 0)
	if got := value(t, mfs, "runbudget_acquire_wait_seconds", "class", "head", "outcome", "granted"); got != 2 {
		t.Errorf("wait histogram count{head,granted} = %v, want 2", got)
	}
}

// TestHostDomainLabels checks the bound: two domains get their own value,
// the third is folded into "other" and counted, a request naming a domain
// twice counts once, and an invalid request claims no value.
func TestHostDomainLabels(t *testing.T) {
	ctx := context.Background()
	c, reg := newHost(t, budgetprom.HostOpts{DomainLabels: 2})
	b := newBudget(t, budget.Limits{RequestsPerSecond: 1000}, budget.WithObserver(c))
	third := budget.Domain{Version: 2, ID: "acct-42"} // same ID, other scheme: another domain
	list := func(ds ...budget.Domain) budget.Request {
		return budget.Request{Domains: ds, Class: budget.OpList}
	}
	if _, err := b.Acquire(ctx, budget.Request{Domains: []budget.Domain{{Version: 1, ID: "\xff"}}, Class: budget.OpList}); !errors.Is(err, budget.ErrInvalidDomain) {
		t.Fatalf("Acquire(invalid domain) = %v", err)
	}
	mustAcquire(t, b, list(acct, acct))
	mustAcquire(t, b, list(other, acct))
	mustAcquire(t, b, list(third))
	if err := b.Throttle(ctx, third, 0); err != nil {
		t.Fatal(err)
	}

	mfs := families(t, reg)
	want := []string{budgetprom.OtherDomain, acct.String(), other.String()}
	if got := labelValues(mfs, "runbudget_acquires_total", "domain"); !equal(got, want) {
		t.Fatalf("domain values = %q, want %q", got, want)
	}
	granted := func(d string) float64 {
		return value(t, mfs, "runbudget_acquires_total", "domain", d, "class", "list", "outcome", "granted")
	}
	if a, o, x := granted(acct.String()), granted(other.String()), granted(budgetprom.OtherDomain); a != 2 || o != 1 || x != 1 {
		t.Errorf("granted by domain: %s=%v %s=%v other=%v; want 2, 1, 1", acct, a, other, o, x)
	}
	if got := value(t, mfs, "runbudget_acquires_total", "domain", budgetprom.OtherDomain, "outcome", "invalid"); got != 1 {
		t.Errorf("invalid under other = %v, want 1", got)
	}
	if got := value(t, mfs, "runbudget_throttles_total", "domain", budgetprom.OtherDomain); got != 1 {
		t.Errorf("throttles under other = %v, want 1", got)
	}
	// The invalid domain, the third domain's grant and its throttle.
	checkGauge(t, mfs, "runbudget_domain_label_folds_total", 3)
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestHostStoreErrorOps counts a store error under its op, and an op the
// collector does not know under "other".
func TestHostStoreErrorOps(t *testing.T) {
	c, reg := newHost(t, budgetprom.HostOpts{})
	c.ObserveStoreError(budget.StoreErrorEvent{Op: "heartbeat", Err: errors.New("x")})
	c.ObserveStoreError(budget.StoreErrorEvent{Op: "something new", Err: errors.New("x")})
	c.ObserveLeaseLost(budget.LeaseLostEvent{LeaseID: "l"})
	mfs := families(t, reg)
	checkGauge(t, mfs, "runbudget_store_errors_total", 1, "op", "heartbeat")
	checkGauge(t, mfs, "runbudget_store_errors_total", 1, "op", "other")
	checkGauge(t, mfs, "runbudget_store_errors_total", 0, "op", "acquire")
	checkGauge(t, mfs, "runbudget_leases_lost_total", 1)
}

func TestNewHostRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts budgetprom.HostOpts
	}{
		{"unsorted buckets", budgetprom.HostOpts{Buckets: []float64{1, 0.5}}},
		{"empty buckets", budgetprom.HostOpts{Buckets: []float64{}}},
		{"negative domain bound", budgetprom.HostOpts{DomainLabels: -1}},
		{"const label clash", budgetprom.HostOpts{ConstLabels: prometheus.Labels{"class": "x"}}},
		{"reserved const label", budgetprom.HostOpts{ConstLabels: prometheus.Labels{"__name__": "x"}}},
	} {
		if _, err := budgetprom.NewHost(tc.opts); err == nil {
			t.Errorf("%s: NewHost accepted %+v", tc.name, tc.opts)
		}
	}
}

// TestHostTwoBudgetsOneRegistry registers two collectors told apart by
// their budget label.
func TestHostTwoBudgetsOneRegistry(t *testing.T) {
	a, reg := newHost(t, budgetprom.HostOpts{Budget: "a"})
	b, err := budgetprom.NewHost(budgetprom.HostOpts{Budget: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(b); err != nil {
		t.Fatalf("second budget's collector: %v", err)
	}
	a.ObserveLeaseLost(budget.LeaseLostEvent{})
	mfs := families(t, reg)
	checkGauge(t, mfs, "runbudget_leases_lost_total", 1, "budget", "a")
	checkGauge(t, mfs, "runbudget_leases_lost_total", 0, "budget", "b")
}

// TestObserveAcquireAllocs holds the hot path to no allocation once a
// label combination has been seen, with and without domain labels.
func TestObserveAcquireAllocs(t *testing.T) {
	for _, n := range []int{0, 4} {
		c, _ := newHost(t, budgetprom.HostOpts{DomainLabels: n})
		ev := budget.AcquireEvent{Class: budget.OpGet, Domains: []budget.Domain{acct, other},
			Outcome: budget.AcquireGranted, Waited: 3 * time.Millisecond}
		c.ObserveAcquire(ev)
		if allocs := testing.AllocsPerRun(1000, func() { c.ObserveAcquire(ev) }); allocs != 0 {
			t.Errorf("DomainLabels %d: ObserveAcquire allocates %v times per call", n, allocs)
		}
	}
}

func BenchmarkObserveAcquire(b *testing.B) {
	for _, bc := range []struct {
		name    string
		domains int
	}{{"plain", 0}, {"domains", 100}} {
		c, err := budgetprom.NewHost(budgetprom.HostOpts{DomainLabels: bc.domains})
		if err != nil {
			b.Fatal(err)
		}
		ev := budget.AcquireEvent{Class: budget.OpGet, Domains: []budget.Domain{acct},
			Outcome: budget.AcquireGranted, Waited: 3 * time.Millisecond}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.ObserveAcquire(ev)
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.ObserveAcquire(ev)
				}
			})
		})
	}
}

// BenchmarkAcquireObserved is what the collector adds to a whole
// uncontended in-process admission (Acquire and Release), against the same
// budget without an observer.
func BenchmarkAcquireObserved(b *testing.B) {
	ctx := context.Background()
	req := budget.Request{Domains: []budget.Domain{acct}, Class: budget.OpGet}
	for _, observed := range []bool{false, true} {
		var opts []budget.Option
		if observed {
			c, err := budgetprom.NewHost(budgetprom.HostOpts{})
			if err != nil {
				b.Fatal(err)
			}
			opts = append(opts, budget.WithObserver(c))
		}
		bud, err := budget.New(budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1 << 20}}, opts...)
		if err != nil {
			b.Fatal(err)
		}
		name := map[bool]string{false: "unobserved", true: "observed"}[observed]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				l, err := bud.Acquire(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				l.Release()
			}
		})
		_ = bud.Close()
	}
}
