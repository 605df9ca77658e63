package budget

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// flakyStore wraps the in-process store and makes TryAcquire fail with an
// error wrapping ErrUnavailable until a chosen time, the way the Redis store
// does while Redis is down. With lostReply set, the call reaches the inner
// store first and only the reply is lost: the ambiguous outcome that IDs
// chosen by the caller exist to clean up.
type flakyStore struct {
	Store
	downUntil time.Time
	lostReply bool

	mu      sync.Mutex
	tries   []string // waiter IDs, one per TryAcquire call
	cancels []string
}

func (s *flakyStore) TryAcquire(ctx context.Context, id string, req Request) (Attempt, error) {
	s.mu.Lock()
	s.tries = append(s.tries, id)
	s.mu.Unlock()
	if time.Now().Before(s.downUntil) {
		if s.lostReply {
			s.Store.TryAcquire(ctx, id, req)
		}
		return Attempt{}, fmt.Errorf("flaky: connection refused: %w", ErrUnavailable)
	}
	return s.Store.TryAcquire(ctx, id, req)
}

func (s *flakyStore) Cancel(ctx context.Context, id string) error {
	s.mu.Lock()
	s.cancels = append(s.cancels, id)
	s.mu.Unlock()
	return s.Store.Cancel(ctx, id)
}

func (s *flakyStore) calls() (tries, cancels []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.tries), slices.Clone(s.cancels)
}

const testGrace = 2 * time.Second

var oneGet = Request{Domains: []Domain{{Version: 1, ID: "a"}}, Class: OpGet, MemoryBytes: 10}

// newFlaky builds a budget over a flaky store that is down for the given
// time from now. Call it inside a synctest bubble.
func newFlaky(t *testing.T, down time.Duration, lostReply bool) (*Budget, *flakyStore) {
	t.Helper()
	s := &flakyStore{Store: newMemStore(time.Now), downUntil: time.Now().Add(down), lostReply: lostReply}
	b, err := New(Limits{InFlight: map[OpClass]int{OpGet: 1}, MemoryBytes: 100},
		WithStore(s), WithUnavailableGrace(testGrace))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, s
}

// expectOneWaiter checks that every attempt used one waiter ID, that there
// were several (Acquire retried), and that Cancel was called for that ID
// when wantCancel is set and never otherwise.
//
// Call it inside the bubble: it first waits for the background cancel that
// Acquire starts on its way out.
func expectOneWaiter(t *testing.T, s *flakyStore, wantCancel bool) string {
	t.Helper()
	synctest.Wait()
	tries, cancels := s.calls()
	if len(tries) < 3 {
		t.Errorf("TryAcquire called %d times, want Acquire to keep retrying", len(tries))
	}
	if len(tries) > 50 {
		t.Errorf("TryAcquire called %d times in %v: retries should back off", len(tries), testGrace)
	}
	for _, id := range tries {
		if id != tries[0] {
			t.Fatalf("attempts used waiter IDs %v, want one ID for the whole Acquire", tries)
		}
	}
	switch {
	case wantCancel && !slices.Equal(cancels, tries[:1]):
		t.Errorf("Cancel calls %q, want exactly one for waiter %q", cancels, tries[0])
	case !wantCancel && len(cancels) != 0:
		t.Errorf("Cancel calls %q after a grant, want none", cancels)
	}
	return tries[0]
}

func expectNothingHeld(t *testing.T, b *Budget) {
	t.Helper()
	u, err := b.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if u.MemoryHeld != 0 || u.Waiters != 0 || len(u.Domains) != 0 {
		t.Errorf("usage %+v, want nothing held or queued", u)
	}
}

func forBothFailureModes(t *testing.T, fn func(t *testing.T, lostReply bool)) {
	for _, mode := range []struct {
		name      string
		lostReply bool
	}{{"RefusedBeforeStore", false}, {"ReplyLostAfterStore", true}} {
		t.Run(mode.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { fn(t, mode.lostReply) })
		})
	}
}

// TestAcquireUnavailableGivesUpAfterGrace: a store down for longer than the
// grace makes Acquire retry with backoff, admit nothing, and then fail with
// ErrUnavailable once the grace has passed, having cancelled its waiter.
func TestAcquireUnavailableGivesUpAfterGrace(t *testing.T) {
	forBothFailureModes(t, func(t *testing.T, lostReply bool) {
		b, s := newFlaky(t, time.Hour, lostReply)
		start := time.Now()
		l, err := b.Acquire(context.Background(), oneGet)
		elapsed := time.Since(start)
		if !errors.Is(err, ErrUnavailable) || l != nil {
			t.Fatalf("Acquire = %v, %v; want an error wrapping ErrUnavailable", l, err)
		}
		if elapsed < testGrace || elapsed > testGrace+100*time.Millisecond {
			t.Errorf("Acquire gave up after %v, want the grace %v", elapsed, testGrace)
		}
		expectOneWaiter(t, s, true)
		// Whatever the lost replies granted in the store was given back.
		expectNothingHeld(t, b)
	})
}

// TestAcquireUnavailableRecovers: a store that comes back within the grace
// leads to a grant, under the ID of the retried waiter, charged once.
func TestAcquireUnavailableRecovers(t *testing.T) {
	forBothFailureModes(t, func(t *testing.T, lostReply bool) {
		const down = 700 * time.Millisecond
		b, s := newFlaky(t, down, lostReply)
		start := time.Now()
		l, err := b.Acquire(context.Background(), oneGet)
		elapsed := time.Since(start)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		defer l.Release()
		if elapsed < down || elapsed >= testGrace {
			t.Errorf("granted after %v, want after the outage (%v) and within the grace (%v)", elapsed, down, testGrace)
		}
		id := expectOneWaiter(t, s, false)
		if l.ID() != id {
			t.Errorf("lease ID %q, want the waiter ID %q", l.ID(), id)
		}
		u, err := b.Usage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if u.MemoryHeld != oneGet.MemoryBytes || len(u.Domains) != 1 || u.Domains[0].InFlight[OpGet] != 1 {
			t.Errorf("usage %+v, want one GET and %d bytes held: the retries were charged once", u, oneGet.MemoryBytes)
		}
		l.Release()
		expectNothingHeld(t, b)
	})
}

// TestAcquireUnavailableHonorsDeadline: a ctx deadline shorter than the grace
// ends Acquire at the deadline with ctx.Err(), its waiter cancelled.
func TestAcquireUnavailableHonorsDeadline(t *testing.T) {
	forBothFailureModes(t, func(t *testing.T, lostReply bool) {
		const deadline = 300 * time.Millisecond
		b, s := newFlaky(t, time.Hour, lostReply)
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		l, err := b.Acquire(ctx, oneGet)
		elapsed := time.Since(start)
		if err != ctx.Err() || !errors.Is(err, context.DeadlineExceeded) || l != nil {
			t.Fatalf("Acquire = %v, %v; want ctx.Err() (%v)", l, err, ctx.Err())
		}
		if elapsed < deadline || elapsed > deadline+100*time.Millisecond {
			t.Errorf("Acquire returned after %v, want at the %v deadline", elapsed, deadline)
		}
		expectOneWaiter(t, s, true)
		expectNothingHeld(t, b)
	})
}

// TestAcquireUnavailableClose: Close during an outage ends the retries with
// ErrClosed, and the waiter is cancelled.
func TestAcquireUnavailableClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, s := newFlaky(t, time.Hour, false)
		done := make(chan error, 1)
		go func() {
			_, err := b.Acquire(context.Background(), oneGet)
			done <- err
		}()
		time.Sleep(500 * time.Millisecond) // several retries into the outage
		synctest.Wait()
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Errorf("Acquire during Close = %v, want ErrClosed", err)
		}
		expectOneWaiter(t, s, true)
	})
}

// TestAcquireOtherStoreErrorIsFinal: an error that is not ErrUnavailable is
// returned at once, without retries, and the waiter is cancelled.
func TestAcquireOtherStoreErrorIsFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &brokenStore{Store: newMemStore(time.Now)}
		b, err := New(Limits{MemoryBytes: 100}, WithStore(s))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		start := time.Now()
		if _, err := b.Acquire(context.Background(), oneGet); !errors.Is(err, errBroken) {
			t.Fatalf("Acquire = %v, want errBroken", err)
		}
		elapsed := time.Since(start)
		synctest.Wait() // for the background cancel
		s.mu.Lock()
		defer s.mu.Unlock()
		if elapsed != 0 || s.tries != 1 || s.cancels != 1 {
			t.Errorf("after %v: %d tries and %d cancels, want 1 and 1 at once", elapsed, s.tries, s.cancels)
		}
	})
}

var errBroken = errors.New("broken: script error")

type brokenStore struct {
	Store
	mu             sync.Mutex
	tries, cancels int
}

func (s *brokenStore) TryAcquire(context.Context, string, Request) (Attempt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tries++
	return Attempt{}, errBroken
}

func (s *brokenStore) Cancel(ctx context.Context, id string) error {
	s.mu.Lock()
	s.cancels++
	s.mu.Unlock()
	return s.Store.Cancel(ctx, id)
}

// hangingStore never answers TryAcquire until the call's context ends, like
// a Redis that accepts connections but does not reply, and expires leases
// (so the budget runs a keeper and bounds each call by the grace).
type hangingStore struct {
	Store
	mu      sync.Mutex
	tries   int
	cancels []string
}

func (s *hangingStore) LeaseTTL() time.Duration { return 3 * time.Second }

func (s *hangingStore) TryAcquire(ctx context.Context, id string, req Request) (Attempt, error) {
	s.mu.Lock()
	s.tries++
	s.mu.Unlock()
	<-ctx.Done()
	return Attempt{}, fmt.Errorf("hanging: %w", ctx.Err())
}

func (s *hangingStore) Cancel(ctx context.Context, id string) error {
	s.mu.Lock()
	s.cancels = append(s.cancels, id)
	s.mu.Unlock()
	return s.Store.Cancel(ctx, id)
}

// TestAcquireHungStore: a store call that never returns is bounded too. With
// no deadline of its own the caller gets ErrUnavailable once the grace has
// passed; with a shorter deadline, ctx.Err() at that deadline.
func TestAcquireHungStore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration // 0: none
		want     error
		after    time.Duration
	}{
		{"no deadline", 0, ErrUnavailable, testGrace},
		{"deadline before the grace", 300 * time.Millisecond, context.DeadlineExceeded, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &hangingStore{Store: newMemStore(time.Now)}
				b, err := New(Limits{MemoryBytes: 100}, WithStore(s), WithUnavailableGrace(testGrace))
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				start := time.Now()
				l, err := b.Acquire(ctx, oneGet)
				elapsed := time.Since(start)
				if !errors.Is(err, tc.want) || l != nil {
					t.Fatalf("Acquire = %v, %v; want an error wrapping %v", l, err, tc.want)
				}
				if elapsed < tc.after || elapsed > tc.after+100*time.Millisecond {
					t.Errorf("Acquire returned after %v, want %v", elapsed, tc.after)
				}
				synctest.Wait() // for the background cancel
				s.mu.Lock()
				defer s.mu.Unlock()
				if s.tries < 1 || len(s.cancels) != 1 {
					t.Errorf("%d tries, cancels %q; want at least one try and one cancel", s.tries, s.cancels)
				}
			})
		})
	}
}

// lateStore reports its first grant as made a whole TTL ago, as a grant
// collected after a stall of the process would be.
type lateStore struct {
	Store
	mu      sync.Mutex
	late    bool
	cancels []string
}

func (s *lateStore) LeaseTTL() time.Duration                               { return 300 * time.Millisecond }
func (s *lateStore) Heartbeat(context.Context, []string) ([]string, error) { return nil, nil }
func (s *lateStore) TryAcquire(ctx context.Context, id string, req Request) (Attempt, error) {
	att, err := s.Store.TryAcquire(ctx, id, req)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && att.Outcome == Granted && !s.late {
		s.late = true
		att.GrantedAgo = s.LeaseTTL()
	}
	return att, err
}
func (s *lateStore) Cancel(ctx context.Context, id string) error {
	s.mu.Lock()
	s.cancels = append(s.cancels, id)
	s.mu.Unlock()
	return s.Store.Cancel(ctx, id)
}

// TestAcquireRefusesAStaleGrant: a grant collected a TTL after the store
// made it may already be reclaimed, so Acquire gives it back and waits
// again under a new ID rather than hand out a lease nothing counts.
func TestAcquireRefusesAStaleGrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &lateStore{Store: newMemStore(time.Now)}
		b, err := New(Limits{InFlight: map[OpClass]int{OpGet: 1}}, WithStore(s))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		l, err := b.Acquire(context.Background(), Request{Domains: []Domain{{Version: 1, ID: "a"}}, Class: OpGet})
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the background give-back
		s.mu.Lock()
		cancels := slices.Clone(s.cancels)
		s.mu.Unlock()
		if len(cancels) != 1 || cancels[0] == l.ID() {
			t.Fatalf("cancels %v, lease %s: want the stale grant's ID given back, and another lease", cancels, l.ID())
		}
		select {
		case <-l.Lost():
			t.Fatal("the lease handed out is lost")
		default:
		}
		l.Release()
		u, err := b.Usage(context.Background())
		if err != nil || len(u.Domains) != 0 && len(u.Domains[0].InFlight) != 0 {
			t.Errorf("usage after release: %+v, %v", u, err)
		}
	})
}
