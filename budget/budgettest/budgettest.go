// Package budgettest is the conformance suite every budget.Store must pass.
// The in-process store and the Redis store run the same tests with the same
// assertions, so "behaves exactly like the in-process one" is checked, not
// hoped for.
package budgettest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runbudget/runbudget/budget"
	"go.uber.org/goleak"
)

// Harness tells the suite how to build budgets on the store under test.
type Harness struct {
	// Open prepares a fresh, empty budget (in Redis: a new name) and returns
	// a constructor for its hosts: every Budget the constructor builds shares
	// that one budget's state, as hosts of one run do.
	Open func(t testing.TB) func(budget.Limits, ...budget.Option) (*budget.Budget, error)
	// Synctest runs each test inside testing/synctest, so time is virtual and
	// time-dependent tests are exact and instant. Only for stores that do no
	// network I/O.
	Synctest bool
	// ClockSlack is how late a caller may observe a grant after the store
	// made it (a network round trip). Zero under Synctest.
	ClockSlack time.Duration
	// LeakOptions are passed to goleak when checking that Close leaves no
	// goroutine, to ignore goroutines the harness itself owns.
	LeakOptions []goleak.Option
}

type testCase struct {
	name string
	fn   func(e *env)
	// serial tests must not run beside others (they count goroutines).
	serial bool
}

var cases = []testCase{
	{name: "InvalidLimits", fn: testInvalidLimits},
	{name: "BurstDefault", fn: testBurstDefault},
	{name: "InvalidRequests", fn: testInvalidRequests},
	{name: "NeverAdmissible", fn: testNeverAdmissible},
	{name: "ZeroIsUnbounded", fn: testZeroIsUnbounded},
	{name: "InFlightCeiling", fn: testInFlightCeiling},
	{name: "OpenBodies", fn: testOpenBodies},
	{name: "MemoryChargedOnce", fn: testMemoryChargedOnce},
	{name: "DuplicateDomainsCountOnce", fn: testDuplicateDomains},
	{name: "MultiDomainAtomic", fn: testMultiDomainAtomic},
	{name: "FIFO100", fn: testFIFO100},
	{name: "LargeNotStarved", fn: testLargeNotStarved},
	{name: "CongestedDomainDoesNotStallOthers", fn: testCongestedDomain},
	{name: "NoDeadlockInCycle", fn: testNoDeadlockCycle},
	{name: "RateAccuracy", fn: testRateAccuracy},
	{name: "ThrottleCoalesces", fn: testThrottleCoalesces},
	{name: "ThrottleRecovers", fn: testThrottleRecovers},
	{name: "ThrottlePausesOneDomain", fn: testThrottlePause},
	{name: "ThrottleWithoutRateCeiling", fn: testThrottleUnbounded},
	{name: "CancelLeavesEveryQueue", fn: testCancelLeavesQueues},
	{name: "CancelRaces", fn: testCancelRaces},
	{name: "LeaseParts", fn: testLeaseParts},
	{name: "LeaseConcurrentRetire", fn: testLeaseConcurrentRetire},
	{name: "Close", fn: testClose},
	{name: "CloseLeavesNoGoroutine", fn: testNoGoroutineLeft, serial: true},
	{name: "LimitsConflict", fn: testLimitsConflict},
	{name: "HostsShareOneBudget", fn: testHostsShare},
	{name: "MemoryIsPerHost", fn: testMemoryPerHost},
	{name: "MemoryCancelAndClose", fn: testMemoryCancelClose},
}

// Run runs the whole suite against h.
func Run(t *testing.T, h Harness) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !h.Synctest && !tc.serial {
				t.Parallel()
			}
			if h.Synctest {
				synctest.Test(t, func(t *testing.T) { tc.fn(&env{T: t, h: h}) })
				return
			}
			tc.fn(&env{T: t, h: h})
		})
	}
}

// env is one test's view of the harness.
type env struct {
	*testing.T
	h    Harness
	open func(budget.Limits, ...budget.Option) (*budget.Budget, error)
}

// host builds a host of this test's budget, closed at cleanup.
func (e *env) host(l budget.Limits, opts ...budget.Option) *budget.Budget {
	e.Helper()
	b, err := e.tryHost(l, opts...)
	if err != nil {
		e.Fatalf("New(%+v): %v", l, err)
	}
	return b
}

func (e *env) tryHost(l budget.Limits, opts ...budget.Option) (*budget.Budget, error) {
	if e.open == nil {
		e.open = e.h.Open(e.T)
	}
	b, err := e.open(l, opts...)
	if err == nil {
		e.Cleanup(func() { b.Close() })
	}
	return b, err
}

// eventually waits until cond holds. Under synctest it first lets every
// goroutine of the test block, so cond is checked once the system is quiet;
// otherwise it polls the store, bounded generously.
func (e *env) eventually(what string, cond func() bool) {
	e.Helper()
	if e.h.Synctest {
		synctest.Wait()
		if !cond() {
			e.Fatalf("not true once every goroutine blocked: %s", what)
		}
		return
	}
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.Fatalf("not true within 20s: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// quiet waits until the budget has had every chance to act on what was
// just done, for checks that something did NOT happen.
func (e *env) quiet() {
	if e.h.Synctest {
		synctest.Wait()
		return
	}
	time.Sleep(150 * time.Millisecond)
}

func (e *env) usage(b *budget.Budget) budget.Usage {
	e.Helper()
	u, err := b.Usage(context.Background())
	if err != nil {
		e.Fatalf("Usage: %v", err)
	}
	return u
}

func (e *env) domainUsage(b *budget.Budget, d budget.Domain) budget.DomainUsage {
	e.Helper()
	for _, du := range e.usage(b).Domains {
		if du.Domain == d {
			return du
		}
	}
	return budget.DomainUsage{Domain: d, RateFactor: 1}
}

func (e *env) waiters(b *budget.Budget) int { return e.usage(b).Waiters }

// expectIdle checks that nothing is held or queued: the zero-leak promise.
func (e *env) expectIdle(b *budget.Budget) {
	e.Helper()
	e.eventually("usage returns to zero", func() bool {
		u := e.usage(b)
		if u.MemoryHeld != 0 || u.Waiters != 0 {
			return false
		}
		for _, du := range u.Domains {
			if len(du.InFlight) != 0 || du.OpenBodies != 0 || du.Waiters != 0 {
				return false
			}
		}
		return true
	})
}

func (e *env) acquire(b *budget.Budget, req budget.Request) *budget.Lease {
	e.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := b.Acquire(ctx, req)
	if err != nil {
		e.Fatalf("Acquire(%+v): %v", req, err)
	}
	return l
}

// pending starts an Acquire in a goroutine and returns a channel that
// delivers its result once.
func (e *env) pending(b *budget.Budget, ctx context.Context, req budget.Request) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := b.Acquire(ctx, req)
		ch <- result{l, err}
	}()
	return ch
}

type result struct {
	l   *budget.Lease
	err error
}

// expectBlocked checks that ch has not delivered.
func (e *env) expectBlocked(ch <-chan result, what string) {
	e.Helper()
	e.quiet()
	select {
	case r := <-ch:
		e.Fatalf("%s: admitted (err %v), want still waiting", what, r.err)
	default:
	}
}

func (e *env) expectGranted(ch <-chan result, what string) *budget.Lease {
	e.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			e.Fatalf("%s: %v", what, r.err)
		}
		return r.l
	case <-time.After(30 * time.Second):
		e.Fatalf("%s: not granted", what)
	}
	return nil
}

// dom names a domain of the suite. Domains that one request names together
// share the prefix before a "/" ("m/a", "m/b"): a store that spreads domains
// over shard groups runs the suite with a shard key that keeps such domains
// together (ColocateShardKey) and puts every other domain in a group of
// its own.
func dom(id string) budget.Domain { return budget.Domain{Version: 1, ID: id} }

// ColocateShardKey is the shard key under which the suite's multi-domain
// requests stay inside one group while other domains spread out: the part
// of the ID before its first "/", or the whole ID.
func ColocateShardKey(d budget.Domain) string {
	if i := strings.IndexByte(d.ID, '/'); i >= 0 {
		return d.ID[:i]
	}
	return d.ID
}

func get(ds ...budget.Domain) budget.Request {
	return budget.Request{Domains: ds, Class: budget.OpGet, Consumer: "test"}
}

func getSlots(n int) budget.Limits {
	return budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: n}}
}

// ---- validation

func testInvalidLimits(e *env) {
	nan := math.NaN()
	for _, tc := range []struct {
		name string
		l    budget.Limits
	}{
		{"all zero", budget.Limits{}},
		{"zero entries only", budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 0}}},
		{"negative rate", budget.Limits{RequestsPerSecond: -1}},
		{"NaN rate", budget.Limits{RequestsPerSecond: nan}},
		{"+Inf rate", budget.Limits{RequestsPerSecond: math.Inf(1)}},
		{"-Inf rate", budget.Limits{RequestsPerSecond: math.Inf(-1)}},
		{"huge rate", budget.Limits{RequestsPerSecond: 1e300}},
		{"negative burst", budget.Limits{RequestsPerSecond: 1, Burst: -1}},
		{"burst without rate", budget.Limits{Burst: 3}},
		{"unknown class", budget.Limits{InFlight: map[budget.OpClass]int{"rename": 1}}},
		{"empty class", budget.Limits{InFlight: map[budget.OpClass]int{"": 1}}},
		{"negative in-flight", budget.Limits{InFlight: map[budget.OpClass]int{budget.OpList: -1}}},
		{"negative bodies", budget.Limits{OpenBodies: -1}},
		{"negative memory", budget.Limits{MemoryBytes: -1}},
	} {
		_, err := e.tryHost(tc.l)
		if !errors.Is(err, budget.ErrInvalidLimits) {
			e.Errorf("%s: New(%+v) = %v, want ErrInvalidLimits", tc.name, tc.l, err)
		}
	}
}

func testBurstDefault(e *env) {
	for _, tc := range []struct {
		rate  float64
		burst int
	}{{0.5, 1}, {1, 1}, {10, 10}, {10.2, 11}} {
		b := e.host(budget.Limits{RequestsPerSecond: tc.rate}, budget.WithReplaceLimits())
		if got := b.Limits().Burst; got != tc.burst {
			e.Errorf("rate %v: burst %d, want %d", tc.rate, got, tc.burst)
		}
	}
}

func testInvalidRequests(e *env) {
	b := e.host(getSlots(1))
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  budget.Request
		want error
	}{
		{"no domains", budget.Request{Class: budget.OpGet}, budget.ErrInvalidRequest},
		{"unknown class", budget.Request{Domains: []budget.Domain{dom("a")}, Class: "rename"}, budget.ErrInvalidRequest},
		{"empty class", budget.Request{Domains: []budget.Domain{dom("a")}}, budget.ErrInvalidRequest},
		{"negative memory", budget.Request{Domains: []budget.Domain{dom("a")}, Class: budget.OpGet, MemoryBytes: -1}, budget.ErrInvalidRequest},
		{"empty domain ID", get(budget.Domain{Version: 1}), budget.ErrInvalidDomain},
		{"invalid UTF-8 ID", get(budget.Domain{Version: 1, ID: "a\xffb"}), budget.ErrInvalidDomain},
		{"one bad among good", get(dom("a"), budget.Domain{ID: ""}), budget.ErrInvalidDomain},
	} {
		l, err := b.Acquire(ctx, tc.req)
		if !errors.Is(err, tc.want) || l != nil {
			e.Errorf("%s: Acquire = %v, %v; want %v", tc.name, l, err, tc.want)
		}
	}
	if err := b.Throttle(ctx, budget.Domain{ID: ""}, 0); !errors.Is(err, budget.ErrInvalidDomain) {
		e.Errorf("Throttle(empty domain) = %v, want ErrInvalidDomain", err)
	}
	if err := b.Throttle(ctx, budget.Domain{ID: "\xc3\x28"}, 0); !errors.Is(err, budget.ErrInvalidDomain) {
		e.Errorf("Throttle(invalid UTF-8) = %v, want ErrInvalidDomain", err)
	}
	if err := b.Throttle(ctx, dom("a"), -time.Second); !errors.Is(err, budget.ErrInvalidRequest) {
		e.Errorf("Throttle(negative retry-after) = %v, want ErrInvalidRequest", err)
	}
	// A cancelled context consumes nothing, even when the request would fit.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Acquire(cctx, get(dom("a"))); !errors.Is(err, context.Canceled) {
		e.Errorf("Acquire(cancelled ctx) = %v, want context.Canceled", err)
	}
	e.expectIdle(b)
	if u := e.usage(b); len(u.Domains) != 0 {
		e.Errorf("refused requests left usage %+v", u)
	}
}

func testNeverAdmissible(e *env) {
	b := e.host(budget.Limits{MemoryBytes: 100})
	// No deadline: it must fail at once, not wait.
	_, err := b.Acquire(context.Background(), budget.Request{Domains: []budget.Domain{dom("a")}, Class: budget.OpGet, MemoryBytes: 101})
	if !errors.Is(err, budget.ErrNeverAdmissible) {
		e.Fatalf("Acquire(101 bytes of 100) = %v, want ErrNeverAdmissible", err)
	}
	l := e.acquire(b, budget.Request{Domains: []budget.Domain{dom("a")}, Class: budget.OpGet, MemoryBytes: 100})
	l.Release()
	e.expectIdle(b)
}

// ---- ceilings

func testZeroIsUnbounded(e *env) {
	b := e.host(getSlots(1)) // list, head, bodies, memory, rate: unbounded
	var ls []*budget.Lease
	for i := range 50 {
		ls = append(ls, e.acquire(b, budget.Request{Domains: []budget.Domain{dom("a")}, Class: budget.OpList, OpensBody: true, MemoryBytes: int64(i) << 20}))
	}
	if du := e.domainUsage(b, dom("a")); du.InFlight[budget.OpList] != 50 || du.OpenBodies != 50 {
		e.Errorf("usage %+v, want 50 list in flight and 50 bodies", du)
	}
	for _, l := range ls {
		l.Release()
	}
	e.expectIdle(b)
}

func testInFlightCeiling(e *env) {
	b := e.host(getSlots(2))
	a := dom("a")
	l1, l2 := e.acquire(b, get(a)), e.acquire(b, get(a))
	// Other classes are not bounded by the get ceiling.
	head := e.acquire(b, budget.Request{Domains: []budget.Domain{a}, Class: budget.OpHead})
	third := e.pending(b, context.Background(), get(a))
	e.expectBlocked(third, "third get with 2 slots")
	if du := e.domainUsage(b, a); du.InFlight[budget.OpGet] != 2 || du.Waiters != 1 {
		e.Errorf("usage %+v, want 2 in flight and 1 waiter", du)
	}
	// A blocked waiter holds back every younger request on its domain, of
	// any class: fairness is by arrival per domain.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	if _, err := b.Acquire(ctx, budget.Request{Domains: []budget.Domain{a}, Class: budget.OpHead}); !errors.Is(err, context.DeadlineExceeded) {
		e.Errorf("younger head request passed a blocked get: %v", err)
	}
	cancel()
	head.Release()
	l1.CompleteRequest()
	l3 := e.expectGranted(third, "third get after a completion")
	l2.Release()
	l3.Release()
	l1.Release()
	e.expectIdle(b)
}

func testOpenBodies(e *env) {
	b := e.host(budget.Limits{OpenBodies: 1})
	a := dom("a")
	body := budget.Request{Domains: []budget.Domain{a}, Class: budget.OpGet, OpensBody: true}
	l1 := e.acquire(b, body)
	l1.CompleteRequest() // the call returned; the body is still streaming
	if du := e.domainUsage(b, a); len(du.InFlight) != 0 || du.OpenBodies != 1 {
		e.Errorf("after CompleteRequest: %+v, want 0 in flight, 1 body", du)
	}
	second := e.pending(b, context.Background(), body)
	e.expectBlocked(second, "second body with 1 body slot")
	l1.CloseBody()
	l2 := e.expectGranted(second, "second body after CloseBody")
	l2.Release()
	l1.Release()
	e.expectIdle(b)
}

func testMemoryChargedOnce(e *env) {
	b := e.host(budget.Limits{MemoryBytes: 100})
	a, bb, c := dom("m/a"), dom("m/b"), dom("c")
	l1 := e.acquire(b, budget.Request{Domains: []budget.Domain{a, bb}, Class: budget.OpGet, MemoryBytes: 60})
	if u := e.usage(b); u.MemoryHeld != 60 {
		e.Errorf("two-domain request holds %d bytes, want 60 (charged once)", u.MemoryHeld)
	}
	// Memory is the host's: a third domain shares the same 100 bytes.
	w := e.pending(b, context.Background(), budget.Request{Domains: []budget.Domain{c}, Class: budget.OpGet, MemoryBytes: 60})
	e.expectBlocked(w, "60 bytes with 40 left")
	l1.CompleteRequest()
	e.expectBlocked(w, "60 bytes after CompleteRequest (memory still held)")
	l1.ReleaseMemory()
	l2 := e.expectGranted(w, "60 bytes after ReleaseMemory")
	if u := e.usage(b); u.MemoryHeld != 60 {
		e.Errorf("memory held %d, want 60", u.MemoryHeld)
	}
	l2.Release()
	l1.Release()
	e.expectIdle(b)
}

func testDuplicateDomains(e *env) {
	b := e.host(budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}, MemoryBytes: 10})
	a := dom("a")
	l := e.acquire(b, budget.Request{Domains: []budget.Domain{a, a, a}, Class: budget.OpGet, MemoryBytes: 10})
	if du := e.domainUsage(b, a); du.InFlight[budget.OpGet] != 1 {
		e.Errorf("duplicated domain counted %d times", du.InFlight[budget.OpGet])
	}
	l.Release()
	e.expectIdle(b)
}

func testMultiDomainAtomic(e *env) {
	b := e.host(getSlots(1))
	a, bb := dom("m/a"), dom("m/b")
	la := e.acquire(b, get(a))
	both := e.pending(b, context.Background(), get(a, bb))
	e.expectBlocked(both, "request on a+b while a is full")
	if du := e.domainUsage(b, bb); len(du.InFlight) != 0 {
		e.Errorf("waiting request charged b: %+v", du)
	}
	la.Release()
	l := e.expectGranted(both, "a+b after a is free")
	if ua, ub := e.domainUsage(b, a), e.domainUsage(b, bb); ua.InFlight[budget.OpGet] != 1 || ub.InFlight[budget.OpGet] != 1 {
		e.Errorf("after grant: a %+v b %+v, want both charged", ua, ub)
	}
	l.Release()
	e.expectIdle(b)
}

// ---- fairness

func testFIFO100(e *env) {
	b := e.host(getSlots(1))
	a := dom("a")
	hold := e.acquire(b, get(a))
	order := make(chan int, 100)
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := b.Acquire(context.Background(), get(a))
			if err != nil {
				e.Errorf("waiter %d: %v", i, err)
				return
			}
			order <- i // one holder at a time, so sends happen in grant order
			l.Release()
		}()
		e.eventually(fmt.Sprintf("waiter %d queued", i), func() bool { return e.waiters(b) == i+1 })
	}
	hold.Release()
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			e.Fatalf("grant %d went to waiter %d: not arrival order", want, got)
		}
		want++
	}
	e.expectIdle(b)
}

func testLargeNotStarved(e *env) {
	b := e.host(budget.Limits{MemoryBytes: 100, InFlight: map[budget.OpClass]int{budget.OpGet: 100}})
	a, other := dom("a"), dom("other")
	mem := func(d budget.Domain, n int64) budget.Request {
		return budget.Request{Domains: []budget.Domain{d}, Class: budget.OpGet, MemoryBytes: n}
	}
	hold := e.acquire(b, mem(a, 30))
	large := e.pending(b, context.Background(), mem(a, 100))
	e.eventually("large request queued", func() bool { return e.waiters(b) == 1 })
	// A stream of small requests arrives after it; 70 bytes are free, which
	// would fit all of them, on its domain and on another one.
	var small []<-chan result
	for i := range 6 {
		d := a
		if i%2 == 1 {
			d = other
		}
		small = append(small, e.pending(b, context.Background(), mem(d, 10)))
		e.eventually("small request queued", func() bool { return e.waiters(b) == i+2 })
	}
	e.expectBlocked(large, "large request while 30 bytes are held")
	for _, s := range small {
		e.expectBlocked(s, "small request behind the large one")
	}
	hold.Release()
	l := e.expectGranted(large, "large request once memory is free")
	for _, s := range small {
		e.expectBlocked(s, "small request while the large one holds everything")
	}
	l.Release()
	for _, s := range small {
		e.expectGranted(s, "small request after the large one").Release()
	}
	e.expectIdle(b)
}

func testCongestedDomain(e *env) {
	b := e.host(getSlots(1))
	a, bb := dom("congested"), dom("free")
	hold := e.acquire(b, get(a))
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := b.Acquire(context.Background(), get(a))
			if err != nil {
				e.Errorf("congested waiter: %v", err)
				return
			}
			l.Release()
		}()
	}
	e.eventually("5 waiters on the congested domain", func() bool { return e.waiters(b) == 5 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := b.Acquire(ctx, get(bb))
	if err != nil {
		e.Fatalf("unrelated domain stalled by a congested one: %v", err)
	}
	l.Release()
	hold.Release()
	wg.Wait()
	e.expectIdle(b)
}

func testNoDeadlockCycle(e *env) {
	b := e.host(getSlots(1))
	ds := []budget.Domain{dom("m/a"), dom("m/b"), dom("m/c")}
	var held [3]atomic.Int32
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for g := range 9 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			i, j := g%3, (g+1)%3 // a+b, b+c, c+a
			for range 20 {
				l, err := b.Acquire(ctx, get(ds[i], ds[j]))
				if err != nil {
					e.Errorf("cycle %d: %v (deadlock?)", g, err)
					return
				}
				if held[i].Add(1) > 1 || held[j].Add(1) > 1 {
					e.Errorf("more than one holder on a 1-slot domain")
				}
				held[i].Add(-1)
				held[j].Add(-1)
				l.Release()
			}
		}()
	}
	wg.Wait()
	e.expectIdle(b)
}

// ---- rate and throttle

func testRateAccuracy(e *env) {
	const rate, burst = 50.0, 5
	b := e.host(budget.Limits{RequestsPerSecond: rate, Burst: burst})
	a := dom("a")
	var mu sync.Mutex
	var starts []time.Time
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runFor := 1500 * time.Millisecond
	begin := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(begin) < runFor {
				l, err := b.Acquire(ctx, get(a))
				if err != nil {
					e.Errorf("Acquire: %v", err)
					return
				}
				mu.Lock()
				starts = append(starts, time.Now())
				mu.Unlock()
				l.Release()
			}
		}()
	}
	wg.Wait()
	// A lane records its start when its goroutine runs again after the
	// reply, which on a loaded two-core machine can come tens of
	// milliseconds after the round trip ClockSlack allows for: starts the
	// store spread over 40 ms were seen recorded within 2 ms. Three times
	// the slack still catches a store that admits a burst too many.
	slack := 3 * e.h.ClockSlack.Seconds()
	for i := range starts {
		for j := i; j < len(starts); j++ {
			window := starts[j].Sub(starts[i]).Seconds()
			if n := float64(j - i + 1); n > burst+rate*(window+slack)+1e-6 {
				e.Fatalf("%v starts in %.3fs, bound burst+rate*window = %.2f", n, window, burst+rate*(window+slack))
			}
		}
	}
	// Not trivially passing: the bucket was actually used. (Utilisation
	// itself is measured by the bench program on a quiet machine; here the
	// floor is loose because tests share two cores under -race.)
	elapsed := starts[len(starts)-1].Sub(begin).Seconds()
	if min := 0.5 * (burst + rate*elapsed); float64(len(starts)) < min {
		e.Errorf("only %d starts in %.2fs, want at least %.0f", len(starts), elapsed, min)
	}
	e.expectIdle(b)
}

func testThrottleCoalesces(e *env) {
	b := e.host(budget.Limits{RequestsPerSecond: 100})
	a := dom("a")
	var wg sync.WaitGroup
	start := make(chan struct{})
	t0 := time.Now()
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := b.Throttle(context.Background(), a, 0); err != nil {
				e.Errorf("Throttle: %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	f := e.domainUsage(b, a).RateFactor
	// One decrease gives 0.7, then recovery climbs at most 3*C*K^2 =
	// 0.9/K per second (the cubic is steepest right after the drop); two
	// decreases would give 0.49 and climb from there.
	elapsed := time.Since(t0).Seconds()
	hi := budget.ThrottleBeta + 0.9/budget.ThrottleRecovery.Seconds()*elapsed + 1e-9
	if f < budget.ThrottleBeta-1e-9 || f > hi {
		e.Fatalf("factor after 50 simultaneous throttles = %v, want one decrease: [%v, %.3f] after %.3fs", f, budget.ThrottleBeta, hi, elapsed)
	}
	if other := e.domainUsage(b, dom("b")).RateFactor; other != 1 {
		e.Errorf("unrelated domain factor %v, want 1", other)
	}
}

func testThrottleRecovers(e *env) {
	b := e.host(budget.Limits{RequestsPerSecond: 100})
	a := dom("a")
	if err := b.Throttle(context.Background(), a, 0); err != nil {
		e.Fatal(err)
	}
	f0 := e.domainUsage(b, a).RateFactor
	if f0 >= 1 {
		e.Fatalf("factor %v after a throttle, want < 1", f0)
	}
	time.Sleep(budget.ThrottleRecovery / 2)
	f1 := e.domainUsage(b, a).RateFactor
	if f1 <= f0 || f1 >= 1 {
		e.Errorf("factor halfway through recovery %v, want between %v and 1", f1, f0)
	}
	time.Sleep(budget.ThrottleRecovery)
	if f := e.domainUsage(b, a).RateFactor; f != 1 {
		e.Errorf("factor %v after the recovery time, want 1", f)
	}
	e.expectIdle(b)
}

func testThrottlePause(e *env) {
	b := e.host(getSlots(10))
	a, other, short := dom("a"), dom("other"), dom("short")
	// The pause on a is far longer than any stall of a loaded machine, so
	// "the other domain did not wait for it" is not a race against the
	// clock (a one-second pause once lost to a 1.6 s stall of parallel
	// tests under -race).
	const long = time.Minute
	if err := b.Throttle(context.Background(), a, long); err != nil {
		e.Fatal(err)
	}
	if du := e.domainUsage(b, a); du.Paused <= 0 || du.Paused > long {
		e.Errorf("Paused = %v, want in (0, %v]", du.Paused, long)
	}
	if du := e.domainUsage(b, other); du.Paused != 0 {
		e.Errorf("unrelated domain Paused = %v, want 0", du.Paused)
	}
	ctx, cancel := context.WithTimeout(context.Background(), long/2)
	lo, err := b.Acquire(ctx, get(other))
	cancel()
	if err != nil {
		e.Fatalf("Acquire on the unrelated domain during a %v pause of another: %v", long, err)
	}
	lo.Release()
	// A start on a waits out the pause: a short ctx ends first, and the
	// waiter leaves nothing behind.
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	la, err := b.Acquire(ctx, get(a))
	cancel()
	if err == nil {
		la.Release()
		e.Fatalf("Acquire on a domain paused for %v was admitted", long)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		e.Errorf("Acquire on the paused domain: %v, want context.DeadlineExceeded", err)
	}
	// The pause ends on its own. Only its lower bound is timed: t0 is read
	// before the store's clock starts the pause, so a loaded machine can
	// make the start later, never earlier.
	const pause = 300 * time.Millisecond
	t0 := time.Now()
	if err := b.Throttle(context.Background(), short, pause); err != nil {
		e.Fatal(err)
	}
	ls := e.acquire(b, get(short))
	if d := time.Since(t0); d < pause {
		e.Errorf("start on the paused domain after %v, want >= %v", d, pause)
	}
	ls.Release()
	e.expectIdle(b)
}

func testThrottleUnbounded(e *env) {
	// No rate ceiling: the factor scales the domain's measured start rate.
	b := e.host(getSlots(100))
	a := dom("a")
	const gap = 10 * time.Millisecond // about 100 starts per second
	for range 150 {
		e.acquire(b, get(a)).Release()
		time.Sleep(gap)
	}
	if err := b.Throttle(context.Background(), a, 0); err != nil {
		e.Fatal(err)
	}
	t0 := time.Now()
	const n = 30
	for range n {
		e.acquire(b, get(a)).Release()
	}
	took := time.Since(t0).Seconds()
	// Unthrottled these would take no time at all. Throttled they run at
	// most at 0.7 x ~100/s (plus recovery), so n starts need at least
	// (n-1) / 100 s even with generous error on the measured rate.
	if min := float64(n-1) / 100; took < min {
		e.Errorf("%d starts took %.3fs after a throttle, want >= %.3fs", n, took, min)
	}
	if f := e.domainUsage(b, a).RateFactor; f >= 1 {
		e.Errorf("factor %v, want < 1", f)
	}
}

// ---- cancellation and leases

func testCancelLeavesQueues(e *env) {
	b := e.host(getSlots(1))
	a, bb := dom("m/a"), dom("m/b")
	hold := e.acquire(b, get(a))
	ctx, cancel := context.WithCancel(context.Background())
	w := e.pending(b, ctx, get(a, bb))
	e.eventually("waiter queued", func() bool { return e.waiters(b) == 1 })
	cancel()
	r := <-w
	if !errors.Is(r.err, context.Canceled) || r.l != nil {
		e.Fatalf("cancelled Acquire = %v, %v; want context.Canceled", r.l, r.err)
	}
	e.eventually("waiter gone", func() bool { return e.waiters(b) == 0 })
	// It no longer holds b's queue back.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	lb, err := b.Acquire(ctx2, get(bb))
	if err != nil {
		e.Fatalf("b after the cancelled waiter left: %v", err)
	}
	lb.Release()
	hold.Release()
	e.expectIdle(b)
	// A deadline behaves like a cancel.
	hold = e.acquire(b, get(a))
	dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer dcancel()
	if _, err := b.Acquire(dctx, get(a)); !errors.Is(err, context.DeadlineExceeded) {
		e.Errorf("Acquire past its deadline = %v, want DeadlineExceeded", err)
	}
	hold.Release()
	e.expectIdle(b)
}

func testCancelRaces(e *env) {
	const slots = 4
	b := e.host(getSlots(slots))
	a := dom("a")
	var inFlight, peak atomic.Int32
	var granted, cancelled atomic.Int32
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 15 {
				// Deadlines from 0 to 20 steps land before, during and after
				// grants; a step is a fraction of a store round trip.
				step := max(100*time.Microsecond, e.h.ClockSlack)
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration((g*7+i*13)%20)*step)
				l, err := b.Acquire(ctx, get(a))
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
						e.Errorf("Acquire: %v", err)
					}
					cancelled.Add(1)
					continue
				}
				granted.Add(1)
				n := inFlight.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				inFlight.Add(-1)
				l.Release()
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > slots {
		e.Errorf("peak in flight %d > %d slots", p, slots)
	}
	if granted.Load() == 0 {
		e.Errorf("no grant at all among %d cancelled", cancelled.Load())
	}
	e.expectIdle(b)
}

func testLeaseParts(e *env) {
	b := e.host(budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 5}, OpenBodies: 5, MemoryBytes: 1000})
	a := dom("a")
	l := e.acquire(b, budget.Request{Domains: []budget.Domain{a}, Class: budget.OpGet, OpensBody: true, MemoryBytes: 400})
	if l.ID() == "" {
		e.Error("lease has no ID")
	}
	check := func(step string, inflight, bodies int, mem int64) {
		e.Helper()
		u := e.usage(b)
		du := e.domainUsage(b, a)
		if du.InFlight[budget.OpGet] != inflight || du.OpenBodies != bodies || u.MemoryHeld != mem {
			e.Errorf("%s: in flight %d bodies %d memory %d; want %d %d %d", step,
				du.InFlight[budget.OpGet], du.OpenBodies, u.MemoryHeld, inflight, bodies, mem)
		}
	}
	check("granted", 1, 1, 400)
	l.CompleteRequest()
	l.CompleteRequest()
	check("CompleteRequest twice", 0, 1, 400)
	l.ReleaseMemory()
	check("ReleaseMemory", 0, 1, 0)
	l.CloseBody()
	check("CloseBody", 0, 0, 0)
	l.Release()
	l.Release()
	check("Release after everything", 0, 0, 0)
	select {
	case <-l.Lost():
		e.Error("Lost closed for a lease that was released normally")
	default:
	}
	e.expectIdle(b)
}

func testLeaseConcurrentRetire(e *env) {
	b := e.host(budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 50}, OpenBodies: 50, MemoryBytes: 5000})
	a := dom("a")
	var wg sync.WaitGroup
	for range 20 {
		l := e.acquire(b, budget.Request{Domains: []budget.Domain{a}, Class: budget.OpGet, OpensBody: true, MemoryBytes: 100})
		for k := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				switch k % 4 {
				case 0:
					l.CompleteRequest()
				case 1:
					l.CloseBody()
				case 2:
					l.ReleaseMemory()
				default:
					l.Release()
				}
			}()
		}
	}
	wg.Wait()
	e.expectIdle(b)
}

func testClose(e *env) {
	b := e.host(getSlots(1))
	a := dom("a")
	hold := e.acquire(b, get(a))
	w := e.pending(b, context.Background(), get(a))
	e.eventually("waiter queued", func() bool { return e.waiters(b) == 1 })
	hold.Release()
	e.expectGranted(w, "waiter").Release()

	hold = e.acquire(b, get(a))
	w = e.pending(b, context.Background(), get(a))
	e.eventually("waiter queued", func() bool { return e.waiters(b) == 1 })
	if err := b.Close(); err != nil {
		e.Fatalf("Close: %v", err)
	}
	if r := <-w; !errors.Is(r.err, budget.ErrClosed) {
		e.Errorf("waiting Acquire after Close = %v, want ErrClosed", r.err)
	}
	if err := b.Close(); err != nil {
		e.Errorf("second Close = %v, want nil", err)
	}
	if _, err := b.Acquire(context.Background(), get(a)); !errors.Is(err, budget.ErrClosed) {
		e.Errorf("Acquire after Close = %v, want ErrClosed", err)
	}
	hold.Release() // safe after Close
}

func testNoGoroutineLeft(e *env) {
	opts := append([]goleak.Option{goleak.IgnoreCurrent()}, e.h.LeakOptions...)
	b := e.host(getSlots(2))
	a := dom("a")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				l, err := b.Acquire(context.Background(), get(a))
				if err != nil {
					e.Errorf("Acquire: %v", err)
					return
				}
				l.Release()
			}
		}()
	}
	wg.Wait()
	if err := b.Close(); err != nil {
		e.Fatal(err)
	}
	if e.h.Synctest {
		synctest.Wait()
		return // the bubble itself fails the test if a goroutine outlives it
	}
	if err := goleak.Find(opts...); err != nil {
		e.Errorf("goroutines left after Close: %v", err)
	}
}

// ---- hosts of one budget

func testLimitsConflict(e *env) {
	l1 := getSlots(1)
	l2 := getSlots(2)
	h1 := e.host(l1)
	if _, err := e.tryHost(l2); !errors.Is(err, budget.ErrLimitsConflict) {
		e.Fatalf("second host with other limits: %v, want ErrLimitsConflict", err)
	}
	e.host(l1) // same limits: fine
	h2 := e.host(l2, budget.WithReplaceLimits())
	// The replaced limits apply to every host: two gets fit now.
	a := dom("a")
	x := e.acquire(h1, get(a))
	y := e.acquire(h2, get(a))
	x.Release()
	y.Release()
	e.expectIdle(h1)
}

func testHostsShare(e *env) {
	l := getSlots(1)
	h1, h2 := e.host(l), e.host(l)
	a := dom("a")
	hold := e.acquire(h1, get(a))
	w := e.pending(h2, context.Background(), get(a))
	e.expectBlocked(w, "second host while the first holds the only slot")
	if u := e.usage(h2); u.Waiters != 1 || e.domainUsage(h2, a).InFlight[budget.OpGet] != 1 {
		e.Errorf("second host sees %+v, want the first host's lease and its own waiter", u)
	}
	hold.Release()
	e.expectGranted(w, "second host after release").Release()
	e.expectIdle(h1)
}

// testMemoryPerHost: memory is each host's, not the run's. Two hosts with
// 100 bytes each hold 80 at once; a third reservation of 30 on the first
// waits while the second still admits 20. Different memory ceilings on two
// hosts are not a limits conflict.
func testMemoryPerHost(e *env) {
	l := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 100}, MemoryBytes: 100}
	h1, h2 := e.host(l), e.host(l)
	a := dom("a")
	mem := func(n int64) budget.Request {
		return budget.Request{Domains: []budget.Domain{a}, Class: budget.OpGet, MemoryBytes: n}
	}
	l1, l2 := e.acquire(h1, mem(80)), e.acquire(h2, mem(80))
	if u1, u2 := e.usage(h1), e.usage(h2); u1.MemoryHeld != 80 || u2.MemoryHeld != 80 {
		e.Errorf("memory held %d and %d, want 80 on each host", u1.MemoryHeld, u2.MemoryHeld)
	}
	w := e.pending(h1, context.Background(), mem(30))
	e.expectBlocked(w, "30 bytes on a host with 20 free")
	if e.waiters(h1) != 1 {
		e.Errorf("waiters %d, want the memory waiter counted", e.waiters(h1))
	}
	l3 := e.acquire(h2, mem(20))
	e.expectBlocked(w, "30 bytes on the first host after the second admitted 20")
	l1.ReleaseMemory()
	l4 := e.expectGranted(w, "30 bytes once the first host's 80 came back")
	if u := e.usage(h1); u.MemoryHeld != 30 {
		e.Errorf("first host holds %d bytes, want 30", u.MemoryHeld)
	}
	for _, x := range []*budget.Lease{l1, l2, l3, l4} {
		x.Release()
	}
	// A host with a larger heap joins the same run without a conflict.
	big := l
	big.MemoryBytes = 1 << 30
	h3 := e.host(big)
	e.acquire(h3, mem(500)).Release()
	e.expectIdle(h1)
	e.expectIdle(h2)
	e.expectIdle(h3)
}

// testMemoryCancelAndClose: a waiter for memory that is cancelled takes
// nothing and lets the next in line through; Close ends a memory wait with
// ErrClosed.
func testMemoryCancelClose(e *env) {
	b := e.host(budget.Limits{MemoryBytes: 100})
	a := dom("a")
	mem := func(n int64) budget.Request {
		return budget.Request{Domains: []budget.Domain{a}, Class: budget.OpGet, MemoryBytes: n}
	}
	hold := e.acquire(b, mem(60))
	ctx, cancel := context.WithCancel(context.Background())
	big := e.pending(b, ctx, mem(50))
	e.eventually("large waiter in the memory line", func() bool { return e.waiters(b) == 1 })
	small := e.pending(b, context.Background(), mem(30))
	e.expectBlocked(small, "30 bytes behind an older waiter for 50")
	cancel()
	if r := <-big; !errors.Is(r.err, context.Canceled) || r.l != nil {
		e.Fatalf("cancelled memory waiter = %v, %v; want context.Canceled", r.l, r.err)
	}
	l := e.expectGranted(small, "30 bytes once the older waiter left")
	if u := e.usage(b); u.MemoryHeld != 90 {
		e.Errorf("memory held %d, want 90", u.MemoryHeld)
	}
	l.Release()
	hold.Release()
	e.expectIdle(b)

	hold = e.acquire(b, mem(100))
	w := e.pending(b, context.Background(), mem(1))
	e.eventually("memory waiter queued", func() bool { return e.waiters(b) == 1 })
	b.Close()
	if r := <-w; !errors.Is(r.err, budget.ErrClosed) {
		e.Fatalf("memory waiter after Close = %v, want ErrClosed", r.err)
	}
	hold.Release()
}
