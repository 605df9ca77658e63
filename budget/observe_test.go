package budget

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// recorder is an Observer that keeps every event.
type recorder struct {
	mu        sync.Mutex
	acquires  []AcquireEvent
	throttles []ThrottleEvent
	lost      []LeaseLostEvent
	errs      []StoreErrorEvent
}

func (r *recorder) ObserveAcquire(e AcquireEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e.Domains = append([]Domain(nil), e.Domains...) // the caller's slice: copy it
	r.acquires = append(r.acquires, e)
}

func (r *recorder) ObserveThrottle(e ThrottleEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.throttles = append(r.throttles, e)
}

func (r *recorder) ObserveLeaseLost(e LeaseLostEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lost = append(r.lost, e)
}

func (r *recorder) ObserveStoreError(e StoreErrorEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, e)
}

func (r *recorder) outcomes() []AcquireOutcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []AcquireOutcome
	for _, e := range r.acquires {
		out = append(out, e.Outcome)
	}
	return out
}

// TestObserverAcquireOutcomes: every Acquire reaches the observer once, with
// its class, domains, outcome and wait; HostStats follows leases and
// waiters.
func TestObserverAcquireOutcomes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		b, err := New(Limits{InFlight: map[OpClass]int{OpGet: 1}, MemoryBytes: 100}, WithObserver(rec))
		if err != nil {
			t.Fatal(err)
		}
		a := Domain{Version: 1, ID: "a"}
		req := Request{Domains: []Domain{a}, Class: OpGet, MemoryBytes: 10}
		l, err := b.Acquire(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if hs := b.HostStats(); hs.Leases != 1 || hs.MemoryHeld != 10 || hs.Waiters != 0 {
			t.Errorf("HostStats = %+v, want 1 lease, 10 bytes, no waiter", hs)
		}
		// A second request waits 3s for the slot, then gets it.
		done := make(chan error, 1)
		go func() {
			l2, err := b.Acquire(context.Background(), req)
			if err == nil {
				l2.Release()
			}
			done <- err
		}()
		synctest.Wait()
		if hs := b.HostStats(); hs.Waiters != 1 {
			t.Errorf("HostStats.Waiters = %d while one Acquire waits", hs.Waiters)
		}
		time.Sleep(3 * time.Second) // virtual time: how long the slot stays held
		l.Release()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		b.Acquire(ctx, req)
		b.Acquire(context.Background(), Request{Domains: []Domain{a}, Class: "rename"})
		b.Acquire(context.Background(), Request{Domains: []Domain{a}, Class: OpGet, MemoryBytes: 101})
		b.Close()
		b.Acquire(context.Background(), req)

		want := []AcquireOutcome{AcquireGranted, AcquireGranted, AcquireCancelled, AcquireInvalid, AcquireNeverAdmissible, AcquireClosed}
		if got := rec.outcomes(); !equalOutcomes(got, want) {
			t.Fatalf("outcomes %v, want %v", got, want)
		}
		second := rec.acquires[1]
		if second.Waited != 3*time.Second || second.Class != OpGet || len(second.Domains) != 1 || second.Domains[0] != a {
			t.Errorf("second acquire event %+v, want a 3s wait for get on %v", second, a)
		}
		if hs := b.HostStats(); hs.Leases != 0 || hs.MemoryHeld != 0 {
			t.Errorf("HostStats after every release = %+v, want zero", hs)
		}
	})
}

func equalOutcomes(a, b []AcquireOutcome) bool {
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

// TestObserverThrottleAndStoreErrors: a throttle reports its new factor; a
// store that is down reports each failed call, and the Acquire that gave up
// reports unavailable.
func TestObserverThrottleAndStoreErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		s := &flakyStore{Store: newMemStore(time.Now), downUntil: time.Now().Add(time.Hour)}
		b, err := New(Limits{RequestsPerSecond: 10}, WithStore(s), WithObserver(rec), WithUnavailableGrace(testGrace))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		a := Domain{Version: 1, ID: "a"}
		if err := b.Throttle(context.Background(), a, time.Second); err != nil {
			t.Fatal(err)
		}
		if len(rec.throttles) != 1 || rec.throttles[0].Factor != ThrottleBeta || rec.throttles[0].RetryAfter != time.Second {
			t.Errorf("throttle events %+v, want one with factor %v", rec.throttles, ThrottleBeta)
		}
		_, err = b.Acquire(context.Background(), Request{Domains: []Domain{a}, Class: OpGet})
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Acquire on a down store = %v, want ErrUnavailable", err)
		}
		synctest.Wait()
		rec.mu.Lock()
		defer rec.mu.Unlock()
		tries, _ := s.calls()
		acquireErrs := 0
		for _, e := range rec.errs {
			if e.Op == "acquire" && errors.Is(e.Err, ErrUnavailable) {
				acquireErrs++
			}
		}
		if acquireErrs != len(tries) || acquireErrs < 2 {
			t.Errorf("%d acquire errors observed for %d failed calls, want one per call", acquireErrs, len(tries))
		}
		if n := len(rec.acquires); n != 1 || rec.acquires[0].Outcome != AcquireUnavailable {
			t.Errorf("acquire events %+v, want one, unavailable", rec.acquires)
		}
	})
}

// TestAcquireOutcomeNames: outcome names are the label values metrics use.
func TestAcquireOutcomeNames(t *testing.T) {
	for o, want := range map[AcquireOutcome]string{AcquireGranted: "granted", AcquireCancelled: "cancelled",
		AcquireInvalid: "invalid", AcquireNeverAdmissible: "never_admissible", AcquireUnavailable: "unavailable",
		AcquireClosed: "closed", AcquireFailed: "failed", 0: "unknown", 200: "unknown"} {
		if got := o.String(); got != want {
			t.Errorf("AcquireOutcome(%d).String() = %q, want %q", o, got, want)
		}
	}
}

// forgetfulStore expires leases (a TTL) and reports every lease missing at
// its heartbeat, as a store that lost them would.
type forgetfulStore struct{ Store }

func (forgetfulStore) LeaseTTL() time.Duration { return 300 * time.Millisecond }
func (forgetfulStore) Heartbeat(_ context.Context, ids []string) ([]string, error) {
	return ids, nil
}

// TestObserverLeaseLost: a lease the store reports missing reaches the
// observer, by ID.
func TestObserverLeaseLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		b, err := New(Limits{InFlight: map[OpClass]int{OpGet: 1}}, WithStore(forgetfulStore{newMemStore(time.Now)}), WithObserver(rec))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		l, err := b.Acquire(context.Background(), Request{Domains: []Domain{{Version: 1, ID: "a"}}, Class: OpGet})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond) // past the first beat, at TTL/3
		<-l.Lost()
		rec.mu.Lock()
		lost := append([]LeaseLostEvent(nil), rec.lost...)
		rec.mu.Unlock()
		if len(lost) != 1 || lost[0].LeaseID != l.ID() {
			t.Errorf("lost events %+v, want one for %s", lost, l.ID())
		}
		l.Release()
	})
}
