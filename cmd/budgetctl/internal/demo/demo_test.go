package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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
// the tests are), against miniredis and the provider, in both modes.
func TestWorkersInProcess(t *testing.T) {
	mr := miniredis.RunT(t)
	lim := budget.Limits{RequestsPerSecond: 90, Burst: 10, OpenBodies: 3, MemoryBytes: 1 << 20,
		InFlight: map[budget.OpClass]int{budget.OpGet: 2, budget.OpHead: 2, budget.OpList: 1}}
	for _, noBudget := range []bool{false, true} {
		t.Run(fmt.Sprintf("no-budget=%v", noBudget), func(t *testing.T) {
			p := newProvider(ProviderConfig{Quota: 100, MaxConcurrent: 6, Objects: 60, Size: 4 << 10, PageSize: 25, Seed: 3})
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
					cfg := WorkerConfig{Provider: url, Budget: "inproc", Host: fmt.Sprintf("h%d", i), Lanes: 3,
						NoBudget: noBudget, Limits: lim, LeaseTTL: 2 * time.Second, Progress: 20 * time.Millisecond}
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					errs[i] = RunWorker(ctx, cfg, rdb, &outs[i])
				})
			}
			wg.Wait()
			var copied int64
			for i := range 2 {
				if errs[i] != nil {
					t.Fatalf("host %d: %v\n%s", i, errs[i], outs[i].String())
				}
				lines := strings.Split(strings.TrimSpace(outs[i].String()), "\n")
				var last WorkerEvent
				if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Type != "done" || last.Error != "" {
					t.Fatalf("host %d's last line %q: %v", i, lines[len(lines)-1], err)
				}
				if last.Budget == noBudget || last.Objects != 60 {
					t.Errorf("host %d: %+v", i, last)
				}
				copied += last.Copied
			}
			s := p.stats()
			if copied != 60 || s.Classes[budget.OpGet].Requests-s.Classes[budget.OpGet].Throttled != 60 {
				t.Errorf("copied %d, provider served %+v; want 60 each", copied, s.Classes[budget.OpGet])
			}
			// Pages: 60 objects in pages of 25 are 3 full listings and
			// one empty one per host that ran out.
			if n := s.Classes[budget.OpList].Requests - s.Classes[budget.OpList].Throttled; n < 4 || n > 5 {
				t.Errorf("provider served %d listings, want 4 or 5", n)
			}
			if !noBudget {
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
	// The bucket holds 2: two pass, the third is refused with the time to
	// the next token (0.1s at 10/s), never less than the 100ms floor.
	for i := range 2 {
		if resp := head(); resp.StatusCode != http.StatusOK || resp.ContentLength != p.sizes[1] {
			t.Fatalf("request %d: %s, length %d", i, resp.Status, resp.ContentLength)
		}
	}
	resp := head()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("third request: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}
	if ra := retryAfter(resp.Header); ra < 90*time.Millisecond || ra > 110*time.Millisecond {
		t.Errorf("Retry-After-Ms says %v, want about 100ms", ra)
	}
	s := p.stats()
	if c := s.Classes[budget.OpHead]; c.Requests != 3 || c.Throttled != 1 || c.PeakInFlight != 1 || s.Requests != 3 {
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
	}{
		{"250", "1", 250 * time.Millisecond},
		{"", "2", 2 * time.Second},
		{"", "0.5", 500 * time.Millisecond},
		{"x", "3", 3 * time.Second},
		{"", "", time.Second},
		{"", "Wed, 21 Oct 2015 07:28:00 GMT", time.Second},
		{"-5", "-1", time.Second},
	} {
		h := http.Header{}
		if tc.ms != "" {
			h.Set("Retry-After-Ms", tc.ms)
		}
		if tc.s != "" {
			h.Set("Retry-After", tc.s)
		}
		if got := retryAfter(h); got != tc.want {
			t.Errorf("retryAfter(ms %q, s %q) = %v, want %v", tc.ms, tc.s, got, tc.want)
		}
	}
}
