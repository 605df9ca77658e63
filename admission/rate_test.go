package admission

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestNewRateValidation(t *testing.T) {
	for _, tc := range []struct {
		p  RatePolicy
		ok bool
	}{
		{RatePolicy{PerSecond: 0, Burst: 1}, false},
		{RatePolicy{PerSecond: -1, Burst: 1}, false},
		{RatePolicy{PerSecond: math.NaN(), Burst: 1}, false},
		{RatePolicy{PerSecond: math.Inf(1), Burst: 1}, false},
		{RatePolicy{PerSecond: math.Inf(-1), Burst: 1}, false},
		{RatePolicy{PerSecond: math.MaxFloat64, Burst: 1}, false},
		{RatePolicy{PerSecond: 1, Burst: 0}, false},
		{RatePolicy{PerSecond: 1, Burst: -1}, false},
		{RatePolicy{}, false},
		{RatePolicy{PerSecond: math.SmallestNonzeroFloat64, Burst: 1}, true},
		{RatePolicy{PerSecond: math.Nextafter(math.MaxFloat64, 0), Burst: 1}, true},
		{RatePolicy{PerSecond: 0.5, Burst: 1}, true},
		{RatePolicy{PerSecond: 100, Burst: math.MaxInt}, true},
	} {
		t.Run(fmt.Sprintf("%v/%d", tc.p.PerSecond, tc.p.Burst), func(t *testing.T) {
			r, err := NewRate(tc.p)
			if !tc.ok {
				if err == nil || r != nil {
					t.Fatalf("NewRate(%+v) = %v, %v; want an error", tc.p, r, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewRate(%+v): %v", tc.p, err)
			}
			if p, v := r.Policy(); p != tc.p || v != 1 {
				t.Fatalf("Policy() = %+v, %d; want %+v, 1", p, v, tc.p)
			}
		})
	}
}

// A step is one action on a Rate at an offset from the test's start.
type rateStep struct {
	at     time.Duration
	allow  int           // calls to make; each is checked against wantOK
	wantOK bool          // whether those calls are allowed
	retry  time.Duration // when denied, the RetryAfter expected (0: not checked)
	set    *RatePolicy   // apply this policy instead of calling Allow
	setErr bool          // the policy update must fail
	ver    uint64        // expected version after the step
}

func runRateSteps(t *testing.T, initial RatePolicy, steps []rateStep) {
	t.Helper()
	r, err := NewRate(initial)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	for i, s := range steps {
		now := t0.Add(s.at)
		if s.set != nil {
			before, beforeVer := r.Policy()
			err := r.setPolicyAt(*s.set, now)
			if s.setErr != (err != nil) {
				t.Fatalf("step %d (%+v): SetPolicy error %v, want error: %v", i, s, err, s.setErr)
			}
			if p, v := r.Policy(); s.setErr && (p != before || v != beforeVer) {
				t.Fatalf("step %d: refused update changed the policy to %+v v%d", i, p, v)
			}
		}
		for n := range s.allow {
			d, err := r.allowAt(context.Background(), now)
			if err != nil {
				t.Fatalf("step %d call %d: %v", i, n, err)
			}
			if d.Allowed != s.wantOK {
				t.Fatalf("step %d (%+v) call %d: allowed %v, want %v", i, s, n, d.Allowed, s.wantOK)
			}
			if d.Allowed && d.RetryAfter != 0 {
				t.Fatalf("step %d: allowed decision with RetryAfter %v", i, d.RetryAfter)
			}
			if !d.Allowed && d.RetryAfter <= 0 {
				t.Fatalf("step %d: denial without a positive RetryAfter: %v", i, d.RetryAfter)
			}
			if !d.Allowed && s.retry != 0 && d.RetryAfter != s.retry {
				t.Fatalf("step %d: RetryAfter %v, want %v", i, d.RetryAfter, s.retry)
			}
			if d.Version != s.ver {
				t.Fatalf("step %d: decision version %d, want %d", i, d.Version, s.ver)
			}
		}
		if _, v := r.Policy(); v != s.ver {
			t.Fatalf("step %d: version %d, want %d", i, v, s.ver)
		}
	}
}

func TestRateSteps(t *testing.T) {
	p := func(perSecond float64, burst int) *RatePolicy { return &RatePolicy{PerSecond: perSecond, Burst: burst} }
	for _, tc := range []struct {
		name    string
		initial RatePolicy
		steps   []rateStep
	}{
		{"starts full, then refills at the rate", RatePolicy{PerSecond: 2, Burst: 3}, []rateStep{
			{at: 0, allow: 3, wantOK: true, ver: 1},
			{at: 0, allow: 2, wantOK: false, retry: 500 * time.Millisecond, ver: 1},
			{at: 200 * time.Millisecond, allow: 1, wantOK: false, retry: 300 * time.Millisecond, ver: 1},
			{at: 500 * time.Millisecond, allow: 1, wantOK: true, ver: 1},
			{at: 500 * time.Millisecond, allow: 1, wantOK: false, ver: 1},
			// Ten idle seconds refill only up to the burst.
			{at: 10 * time.Second, allow: 3, wantOK: true, ver: 1},
			{at: 10 * time.Second, allow: 1, wantOK: false, ver: 1},
		}},
		{"update credits the old rate up to now, then refills at the new one", RatePolicy{PerSecond: 1, Burst: 10}, []rateStep{
			{at: 0, allow: 10, wantOK: true, ver: 1},
			// Two seconds at 1/s earn 2 tokens before the switch to 10/s.
			{at: 2 * time.Second, set: p(10, 5), ver: 2},
			{at: 2 * time.Second, allow: 2, wantOK: true, ver: 2},
			{at: 2 * time.Second, allow: 1, wantOK: false, retry: 100 * time.Millisecond, ver: 2},
			{at: 2*time.Second + 100*time.Millisecond, allow: 1, wantOK: true, ver: 2},
		}},
		{"a smaller burst cuts what the bucket holds", RatePolicy{PerSecond: 1, Burst: 10}, []rateStep{
			{at: 0, set: p(1, 4), ver: 2},
			{at: 0, allow: 4, wantOK: true, ver: 2},
			{at: 0, allow: 1, wantOK: false, retry: time.Second, ver: 2},
		}},
		{"a larger burst adds room, not tokens", RatePolicy{PerSecond: 1, Burst: 2}, []rateStep{
			{at: 0, set: p(1, 10), ver: 2},
			{at: 0, allow: 2, wantOK: true, ver: 2},
			{at: 0, allow: 1, wantOK: false, ver: 2},
			{at: 5 * time.Second, allow: 5, wantOK: true, ver: 2},
			{at: 5 * time.Second, allow: 1, wantOK: false, ver: 2},
		}},
		{"identical settings change nothing", RatePolicy{PerSecond: 1, Burst: 2}, []rateStep{
			{at: 0, allow: 2, wantOK: true, ver: 1},
			{at: 0, set: p(1, 2), ver: 1},
			{at: 0, allow: 1, wantOK: false, retry: time.Second, ver: 1},
			{at: 500 * time.Millisecond, set: p(1, 2), ver: 1},
			{at: 500 * time.Millisecond, allow: 1, wantOK: false, retry: 500 * time.Millisecond, ver: 1},
		}},
		{"invalid updates change nothing", RatePolicy{PerSecond: 1, Burst: 2}, []rateStep{
			{at: 0, allow: 1, wantOK: true, ver: 1},
			{at: 0, set: p(0, 2), setErr: true, ver: 1},
			{at: 0, set: p(math.NaN(), 2), setErr: true, ver: 1},
			{at: 0, set: p(math.Inf(1), 2), setErr: true, ver: 1},
			{at: 0, set: p(math.MaxFloat64, 2), setErr: true, ver: 1},
			{at: 0, set: p(1, 0), setErr: true, ver: 1},
			{at: 0, set: p(-1, -1), setErr: true, ver: 1},
			{at: 0, allow: 1, wantOK: true, ver: 1},
			{at: 0, allow: 1, wantOK: false, retry: time.Second, ver: 1},
		}},
		{"each real change bumps the version once", RatePolicy{PerSecond: 1, Burst: 1}, []rateStep{
			{at: 0, set: p(2, 1), ver: 2},
			{at: 0, set: p(2, 2), ver: 3},
			{at: 0, set: p(2, 2), ver: 3},
			{at: 0, set: p(1, 1), ver: 4},
		}},
		{"a slow rate gives a long but exact delay", RatePolicy{PerSecond: 1.0 / 3600, Burst: 1}, []rateStep{
			{at: 0, allow: 1, wantOK: true, ver: 1},
			{at: 0, allow: 1, wantOK: false, retry: time.Hour, ver: 1},
			{at: time.Hour, allow: 1, wantOK: true, ver: 1},
		}},
		{"a delay beyond time.Duration is capped", RatePolicy{PerSecond: 1e-300, Burst: 1}, []rateStep{
			{at: 0, allow: 1, wantOK: true, ver: 1},
			{at: 0, allow: 1, wantOK: false, retry: math.MaxInt64, ver: 1},
		}},
		{"a delay rounds up to the nanosecond", RatePolicy{PerSecond: 3, Burst: 1}, []rateStep{
			{at: 0, allow: 1, wantOK: true, ver: 1},
			{at: 0, allow: 1, wantOK: false, retry: 333333334, ver: 1},
			{at: 333333334, allow: 1, wantOK: true, ver: 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { runRateSteps(t, tc.initial, tc.steps) })
	}
}

func TestRateCanceledConsumesNothing(t *testing.T) {
	r, _ := NewRate(RatePolicy{PerSecond: 1e-9, Burst: 1})
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel2()
	for _, tc := range []struct {
		ctx  context.Context
		want error
	}{{canceled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		for range 3 {
			d, err := r.Allow(tc.ctx)
			if err != tc.want || d != (RateDecision{}) {
				t.Fatalf("Allow(done ctx) = %+v, %v; want zero decision and %v", d, err, tc.want)
			}
		}
	}
	if d, err := r.Allow(context.Background()); err != nil || !d.Allowed {
		t.Fatalf("the only token was spent by canceled calls: %+v, %v", d, err)
	}
}

// TestRateNeverWaits runs in a synctest bubble, where the clock moves only
// when every goroutine is blocked: a denied Allow that slept or waited for a
// token would move it.
func TestRateNeverWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, _ := NewRate(RatePolicy{PerSecond: 1, Burst: 1})
		start := time.Now()
		for range 3 {
			r.Allow(context.Background())
		}
		if !time.Now().Equal(start) {
			t.Fatalf("Allow waited %v", time.Since(start))
		}
		d, _ := r.Allow(context.Background())
		if d.Allowed || d.RetryAfter != time.Second {
			t.Fatalf("decision %+v, want a denial with RetryAfter 1s", d)
		}
		time.Sleep(d.RetryAfter)
		if d, _ := r.Allow(context.Background()); !d.Allowed {
			t.Fatalf("after waiting RetryAfter: %+v, want allowed", d)
		}
	})
}

func TestRateUnbuilt(t *testing.T) {
	for name, r := range map[string]*Rate{"nil": nil, "zero": new(Rate)} {
		t.Run(name, func(t *testing.T) {
			if d, err := r.Allow(context.Background()); err == nil || d.Allowed {
				t.Fatalf("Allow = %+v, %v; want an error and no allowance", d, err)
			}
			if err := r.SetPolicy(RatePolicy{PerSecond: 1, Burst: 1}); err == nil {
				t.Fatal("SetPolicy accepted")
			}
			if p, v := r.Policy(); p != (RatePolicy{}) || v != 0 {
				t.Fatalf("Policy = %+v, %d", p, v)
			}
		})
	}
}

// TestRatePolicyCoherent updates the policy while readers run, under -race.
// Policy i has Burst i and PerSecond i and is version i, so any torn read
// (settings of one version with the number of another) shows.
func TestRatePolicyCoherent(t *testing.T) {
	const updates = 2000
	r, _ := NewRate(RatePolicy{PerSecond: 1, Burst: 1})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 8 {
		wg.Go(func() {
			var last uint64
			for {
				p, v := r.Policy()
				if p.Burst != int(v) || p.PerSecond != float64(v) || v < last {
					t.Errorf("Policy() = %+v at version %d (previously %d)", p, v, last)
					return
				}
				last = v
				d, err := r.Allow(context.Background())
				if err != nil || d.Version == 0 || d.Version > updates+1 {
					t.Errorf("Allow = %+v, %v", d, err)
					return
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	for i := 2; i <= updates+1; i++ {
		if err := r.SetPolicy(RatePolicy{PerSecond: float64(i), Burst: i}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if p, v := r.Policy(); v != updates+1 || p.Burst != updates+1 {
		t.Fatalf("final policy %+v v%d", p, v)
	}
}

func TestDurationFor(t *testing.T) {
	for _, tc := range []struct {
		tokens, perSecond float64
		want              time.Duration
	}{
		{1, 1, time.Second},
		{0.5, 1, 500 * time.Millisecond},
		{1, 3, 333333334},          // rounded up, never down
		{1, 1e300, 1},              // under a nanosecond: still positive
		{1e-300, 1, 1},             // likewise
		{1, 1e-300, math.MaxInt64}, // beyond time.Duration: capped
		{9.3e9, 1, math.MaxInt64},  // just beyond
		{9.2e9, 1, 9.2e18},         // just within
		{math.NaN(), 1, 1},         // cannot happen; must not panic or go negative
		{1, math.SmallestNonzeroFloat64, math.MaxInt64},
	} {
		if got := durationFor(tc.tokens, tc.perSecond); got != tc.want {
			t.Errorf("durationFor(%v, %v) = %d, want %d", tc.tokens, tc.perSecond, got, tc.want)
		}
	}
}
