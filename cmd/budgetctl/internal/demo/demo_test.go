package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
)

// TestWorkersInProcess runs two hosts in this process (under -race when
// the tests are), against miniredis and the provider: with the budget,
// without it, and without it on a provider so tight, and with clients so
// impatient (one attempt), that objects are certainly lost. Every object is
// accounted for, copied or failed, and each copy is one GET the provider
// served.
func TestWorkersInProcess(t *testing.T) {
	mr := miniredis.RunT(t)
	lim := budget.Limits{RequestsPerSecond: 90, Burst: 10, OpenBodies: 3, MemoryBytes: 1 << 20,
		InFlight: map[budget.OpClass]int{budget.OpGet: 2, budget.OpHead: 2, budget.OpList: 1}}
	for _, tc := range []struct {
		name     string
		noBudget bool
		attempts int
		provider ProviderConfig
		lists    [2]int // served listings, least and most
		wantLoss bool   // objects must be lost (else: none may be, with the budget)
	}{
		// Pages: 60 objects in pages of 25 are 3 full listings and one
		// empty one per host that ran out.
		{"budget", false, 0, ProviderConfig{Quota: 100, MaxConcurrent: 6, Objects: 60, Size: 4 << 10, PageSize: 25, Seed: 3}, [2]int{4, 5}, false},
		{"per-lane", true, 0, ProviderConfig{Quota: 100, MaxConcurrent: 6, Objects: 60, Size: 4 << 10, PageSize: 25, Seed: 3}, [2]int{4, 5}, false},
		{"per-lane-lossy", true, 1, ProviderConfig{Quota: 40, Burst: 2, MaxConcurrent: 3, Objects: 30, Size: 1 << 10, PageSize: 10, Seed: 4}, [2]int{4, 5}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(tc.provider)
			url, stop, err := serveProvider(p, "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			var wg sync.WaitGroup
			outs := make([]bytes.Buffer, 2)
			errs := make([]error, 2)
			for i := range 2 {
				wg.Go(func() {
					rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
					defer rdb.Close()
					cfg := WorkerConfig{Provider: url, Budget: "inproc", Host: fmt.Sprintf("h%d", i), Lanes: 3, Attempts: tc.attempts,
						NoBudget: tc.noBudget, Limits: lim, LeaseTTL: 2 * time.Second, Progress: 20 * time.Millisecond}
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					errs[i] = RunWorker(ctx, cfg, rdb, &outs[i])
				})
			}
			wg.Wait()
			var copied, failed, throttled int64
			for i := range 2 {
				if errs[i] != nil {
					t.Fatalf("host %d: %v\n%s", i, errs[i], outs[i].String())
				}
				lines := strings.Split(strings.TrimSpace(outs[i].String()), "\n")
				var last WorkerEvent
				if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Type != "done" || last.Error != "" {
					t.Fatalf("host %d's last line %q: %v", i, lines[len(lines)-1], err)
				}
				if last.Budget == tc.noBudget || last.Objects != tc.provider.Objects {
					t.Errorf("host %d: %+v", i, last)
				}
				copied += last.Copied
				failed += last.Failed
				throttled += last.Throttled
			}
			s := p.stats()
			objects := int64(tc.provider.Objects)
			get := s.Classes[budget.OpGet]
			if copied+failed != objects || int64(get.Requests-get.Throttled) != copied {
				t.Errorf("copied %d, failed %d, provider served %d GETs; want %d objects in all, one served GET per copy",
					copied, failed, get.Requests-get.Throttled, objects)
			}
			if throttled != int64(s.Throttled) {
				t.Errorf("hosts saw %d 503s, the provider sent %d", throttled, s.Throttled)
			}
			if n := s.Classes[budget.OpList].Requests - s.Classes[budget.OpList].Throttled; n < tc.lists[0] || n > tc.lists[1] {
				t.Errorf("provider served %d listings, want %d to %d", n, tc.lists[0], tc.lists[1])
			}
			switch {
			case tc.wantLoss && failed == 0:
				t.Errorf("no object lost on a provider this tight with one attempt each (%d 503s)", s.Throttled)
			case !tc.noBudget && failed != 0:
				t.Errorf("with the budget %d objects were lost", failed)
			}
			if !tc.noBudget {
				if broke := OverCeilings(lim, s); len(broke) > 0 {
					t.Errorf("over the ceilings for %v: %+v", broke, s)
				}
			}
		})
	}
}

func TestProviderQuota(t *testing.T) {
	p := newProvider(ProviderConfig{Quota: 10, Burst: 2, MaxConcurrent: 3, Objects: 5, Size: 100})
	url, stop, err := serveProvider(p, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	head := func() *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodHead, url+"/o/"+objectKey(1), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	// The bucket holds 2: two pass, the third is refused. The refusal
	// itself takes a token, so it is told to wait until the bucket is back
	// from -1 to a whole token: 200ms at 10/s (less the little the bucket
	// refilled meanwhile).
	for i := range 2 {
		if resp := head(); resp.StatusCode != http.StatusOK || resp.ContentLength != p.sizes[1] {
			t.Fatalf("request %d: %s, length %d", i, resp.Status, resp.ContentLength)
		}
	}
	resp := head()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("third request: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}
	if ra, ok := retryAfter(resp.Header); !ok || ra < 100*time.Millisecond || ra > 200*time.Millisecond {
		t.Errorf("Retry-After-Ms says %v, want about 200ms", ra)
	}
	s := p.stats()
	if c := s.Classes[budget.OpHead]; c.Requests != 3 || c.Throttled != 1 || c.PeakInFlight != 1 || s.Requests != 3 || s.Served != 2 {
		t.Errorf("stats: %+v", s)
	}
	http.DefaultClient.CloseIdleConnections()

	// Concurrency: with MaxConcurrent served at once, the next is refused
	// whatever the bucket holds.
	p.mu.Lock()
	p.tokens, p.active = 2, 3
	p.mu.Unlock()
	if ok, ra, _ := p.admit(classGet); ok || ra != 100*time.Millisecond {
		t.Errorf("admit at max concurrency = %v, %v; want refused with the 100ms floor", ok, ra)
	}
}

// TestProviderRefusalCost: refusals draw on the bucket the served requests
// need, down to a debt of one bucket, and the Retry-After grows with the
// debt; with refusals free, only served requests draw on it.
func TestProviderRefusalCost(t *testing.T) {
	t0 := time.Now()
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	type step struct {
		at         int // ms after the start
		ok         bool
		retryAfter time.Duration
		tokens     float64 // after the step
	}
	run := func(t *testing.T, cost float64, steps []step) {
		t.Helper()
		p := newProvider(ProviderConfig{Quota: 10, Burst: 4, Objects: 1, Size: 1, RefusalCost: cost})
		p.mu.Lock()
		p.tokens, p.last = 1, t0
		p.mu.Unlock()
		for i, st := range steps {
			ok, ra, _ := p.admitAt(classHead, ms(st.at))
			p.mu.Lock()
			tokens := p.tokens
			p.mu.Unlock()
			if ok != st.ok || ra != st.retryAfter || math.Abs(tokens-st.tokens) > 1e-9 {
				t.Errorf("step %d at %dms: admitted %v, Retry-After %v, tokens %v; want %v, %v, %v",
					i, st.at, ok, ra, tokens, st.ok, st.retryAfter, st.tokens)
			}
		}
	}
	t.Run("half", func(t *testing.T) {
		run(t, 0.5, []step{
			{0, true, 0, 0},
			{0, false, 150 * time.Millisecond, -0.5}, // (1 - -0.5) / 10/s
			{0, false, 200 * time.Millisecond, -1},
			{0, false, 250 * time.Millisecond, -1.5},
			{0, false, 300 * time.Millisecond, -2},
			{0, false, 350 * time.Millisecond, -2.5},
			{0, false, 400 * time.Millisecond, -3},
			{0, false, 450 * time.Millisecond, -3.5},
			{0, false, 500 * time.Millisecond, -4}, // the floor: one bucket of debt
			{0, false, 500 * time.Millisecond, -4},
			{400, false, 150 * time.Millisecond, -0.5}, // refilled 4 to 0, minus this refusal
			{600, true, 0, 0.5},                        // 200ms later: 1.5 tokens
		})
	})
	t.Run("default: a whole request", func(t *testing.T) {
		run(t, 0, []step{
			{0, true, 0, 0},
			{0, false, 200 * time.Millisecond, -1}, // (1 - -1) / 10/s
			{0, false, 300 * time.Millisecond, -2},
			{0, false, 400 * time.Millisecond, -3},
			{0, false, 500 * time.Millisecond, -4},
			{0, false, 500 * time.Millisecond, -4}, // the floor
			{500, true, 0, 0},                      // 5 tokens back: one served
		})
	})
	t.Run("free", func(t *testing.T) {
		run(t, -1, []step{
			{0, true, 0, 0},
			{0, false, 100 * time.Millisecond, 0},
			{0, false, 100 * time.Millisecond, 0},
			{150, true, 0, 0.5},
		})
	})
}

func TestArrivalRates(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	for _, tc := range []struct {
		arrivals []time.Duration
		end      time.Duration
		seconds  float64
		mean     float64
		peak     int
	}{
		{nil, 0, 0, 0, 0},
		{ms(0), 0, 0, 0, 1},
		{ms(0, 100, 200, 300), 400 * time.Millisecond, 0.4, 4, 4},          // under a second: counted over one
		{ms(0, 500, 1000, 1500, 2000), 2 * time.Second, 2, 2.5, 2},         // a window is [t, t+1s)
		{ms(0, 10, 20, 30, 1500, 3000, 3999), 4 * time.Second, 4, 1.75, 4}, // the busiest second
	} {
		s, m, p := arrivalRates(tc.arrivals, tc.end)
		if s != tc.seconds || m != tc.mean || p != tc.peak {
			t.Errorf("arrivalRates(%v, %v) = %v, %v, %v; want %v, %v, %v", tc.arrivals, tc.end, s, m, p, tc.seconds, tc.mean, tc.peak)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		ms, s string
		want  time.Duration
		ok    bool
	}{
		{"250", "1", 250 * time.Millisecond, true},
		{"", "2", 2 * time.Second, true},
		{"", "0.5", 500 * time.Millisecond, true},
		{"x", "3", 3 * time.Second, true},
		{" 40 ", "", 40 * time.Millisecond, true},
		{"", "", 0, false},
		{"", "Wed, 21 Oct 2015 07:28:00 GMT", 0, false},
		{"-5", "-1", 0, false},
		{"", "86400", 0, false},
	} {
		h := http.Header{}
		if tc.ms != "" {
			h.Set("Retry-After-Ms", tc.ms)
		}
		if tc.s != "" {
			h.Set("Retry-After", tc.s)
		}
		if got, ok := retryAfter(h); got != tc.want || ok != tc.ok {
			t.Errorf("retryAfter(ms %q, s %q) = %v, %v; want %v, %v", tc.ms, tc.s, got, ok, tc.want, tc.ok)
		}
	}
}
