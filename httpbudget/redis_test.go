package httpbudget_test

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/httpbudget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

// redisBudget is one host's Budget on the budget called name in srv, with a
// Redis client and store of its own, closed at cleanup.
func redisBudget(t *testing.T, srv *redistest.Server, name string, l budget.Limits) *budget.Budget {
	t.Helper()
	s, err := redisstore.New(srv.Client(t), name)
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	b, err := budget.New(l, budget.WithStore(s))
	if err != nil {
		t.Fatalf("budget.New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// Two hosts of a run, each with its own Budget (its own Redis client and
// store) on one budget in one redis-server, each with its own Transport:
// the GET ceiling holds across both, counted at the provider.
func TestRedisCeilingAcrossTransports(t *testing.T) {
	srv := redistest.Start(t)
	const ceiling = 2
	limits := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: ceiling}, OpenBodies: ceiling}
	name := fmt.Sprintf("httpbudget-%d", time.Now().UnixNano())
	budgets := []*budget.Budget{redisBudget(t, srv, name, limits), redisBudget(t, srv, name, limits)}

	var (
		mu           sync.Mutex
		cur, most    int
		perHost      = map[string]int{}
		gate         = make(chan struct{}) // holds the first requests at the provider
		hold         atomic.Bool
		arrived      = make(chan struct{}, 2*ceiling)
		sentAtServer atomic.Int64
	)
	hold.Store(true)
	provider := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		sentAtServer.Add(1)
		mu.Lock()
		cur++
		most = max(most, cur)
		perHost[r.Header.Get("X-Host")]++
		mu.Unlock()
		if hold.Load() {
			arrived <- struct{}{}
			<-gate
		}
		mu.Lock()
		cur--
		mu.Unlock()
		io.WriteString(w, "object")
	})

	clients := make([]*http.Client, len(budgets))
	for i, b := range budgets {
		clients[i] = newClient(t, &httpbudget.Transport{Budget: b})
	}
	get := func(i int) error {
		req, _ := http.NewRequestWithContext(ctxFor(t), http.MethodGet, provider.URL, nil)
		req.Header.Set("X-Host", fmt.Sprint(i))
		resp, err := clients[i].Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "object" {
			return fmt.Errorf("body %q, %v", b, err)
		}
		return nil
	}

	// Host 0 takes both slots with requests held at the provider; host 1's
	// request must then wait in the shared budget, unsent.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range ceiling {
		wg.Go(func() { errs <- get(0) })
	}
	for range ceiling {
		<-arrived
	}
	wg.Go(func() { errs <- get(1) })
	eventually(t, "host 1's request to queue", func() bool { return usage(t, budgets[1]).Waiters == 1 })
	if n := sentAtServer.Load(); n != ceiling {
		t.Errorf("provider saw %d requests while host 0 held the ceiling; want %d", n, ceiling)
	}
	hold.Store(false)
	close(gate)
	wg.Wait()

	// Then both hosts, four lanes each, hammer the provider.
	for i := range budgets {
		for range 4 {
			wg.Go(func() {
				for range 10 {
					if err := get(i); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if most > ceiling {
		t.Errorf("provider saw %d concurrent requests; the shared ceiling is %d", most, ceiling)
	}
	if most < ceiling {
		t.Errorf("provider saw at most %d concurrent requests; the held phase alone reached %d", most, ceiling)
	}
	if perHost["0"] == 0 || perHost["1"] == 0 {
		t.Errorf("requests per host %v; want both hosts served", perHost)
	}
	// The held requests, the queued one, then 2 hosts x 4 lanes x 10.
	if n, want := sentAtServer.Load(), int64(ceiling+1+80); n != want {
		t.Errorf("provider saw %d requests; want %d (one per round trip)", n, want)
	}
	// A host's last Release may return before Redis has it (it rides the
	// next call of that host's store); each host's Usage waits for its own.
	// So read every host once, and only then expect the shared budget empty.
	for _, b := range budgets {
		usage(t, b)
	}
	for i, b := range budgets {
		if u := usage(t, b); len(u.Domains) != 0 || u.Waiters != 0 {
			t.Errorf("host %d: usage %+v after every body closed; want zero", i, u)
		}
	}
}

// A caller that cancels right after a throttled response does not erase the
// report: it runs without the caller's cancellation. (On a Redis store, whose
// client honours a cancelled context; the in-process store never blocks.)
func TestThrottleOutlivesCallerContext(t *testing.T) {
	b := redisBudget(t, redistest.Start(t), "throttle-outlives", getSlots(1))
	var cancel func()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	var hookErr error
	tr := &httpbudget.Transport{Budget: b, ThrottleError: func(_ *http.Request, _ budget.Domain, err error) { hookErr = err }}
	newClient(t, tr)
	// A base that cancels the caller's context as the response arrives.
	base := tr.Base
	tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := base.RoundTrip(r)
		cancel()
		return resp, err
	})
	ctx, c := cancelCtx(t)
	cancel = c
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if hookErr != nil {
		t.Errorf("ThrottleError: %v", hookErr)
	}
	if du := domainUsage(t, b, srv.domain(t)); du.Paused <= 4*time.Second {
		t.Errorf("paused %v after the caller cancelled; want about 5s", du.Paused)
	}
}
