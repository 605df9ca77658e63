package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/lease"
)

// Tests of the detached retirement (batch.go, Store.Flush) on a real
// Redis 7: a final retirement that meets a call in flight returns at once
// and goes with the next call; Usage, Flush and Close wait for it; one
// that Redis refuses is retired by the next heartbeat.

// detachSetUp opens budget name twice on srv: s, with the hook, holding
// lease "a" (granted alone), and a peer, a second process's view of the
// same budget. With the hook held, it starts b's acquire and returns when
// that call is held in flight: goB lets it go, bDone gives its error.
func detachSetUp(t *testing.T, name string) (s *Store, h *scriptHook, peer *Store, goB chan struct{}, bDone chan error) {
	t.Helper()
	srv := redistest.Start(t)
	s, h, _ = batchStore(t, srv, name, oneSlot(2))
	peer, err := New(srv.Client(t), name, WithLeaseTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	ctx := context.Background()
	if att, err := s.TryAcquire(ctx, "a", getReq("d")); err != nil || att.Outcome != budget.Granted {
		t.Fatalf("a: %v, %v", att.Outcome, err)
	}
	h.hold(true)
	bDone = make(chan error, 1)
	go func() {
		att, err := s.TryAcquire(ctx, "b", getReq("d"))
		if err == nil && att.Outcome != budget.Granted {
			err = errors.New("b not granted")
		}
		bDone <- err
	}()
	goB = <-h.arrived
	h.sent()
	return s, h, peer, goB, bDone
}

// retireNow retires all of lease a and fails the test unless Retire
// returns while the call in flight is still held.
func retireNow(t *testing.T, s *Store) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Retire(context.Background(), "a", lease.Request) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("retire: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Retire waited for the call in flight instead of queueing its retirement")
	}
}

func inFlight(t *testing.T, s *Store) int {
	t.Helper()
	n, err := countInFlight(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func countInFlight(s *Store) (int, error) {
	u, err := s.Usage(context.Background())
	n := 0
	for _, d := range u.Domains {
		n += d.InFlight[budget.OpGet]
	}
	return n, err
}

// TestDetachedRetire: the retirement returns at once, is still counted by
// Redis while its call waits, goes in a call of its own when nothing else
// is queued, and the store's own Usage waits for it.
func TestDetachedRetire(t *testing.T) {
	s, h, peer, goB, bDone := detachSetUp(t, "detach")
	retireNow(t, s)
	queued(t, s.single, 1)
	if n := inFlight(t, peer); n != 1 {
		t.Errorf("in flight while the retirement is queued: %d, want 1 (a, still held in Redis)", n)
	}
	s.mu.Lock()
	_, known := s.leases["a"]
	s.mu.Unlock()
	if known {
		t.Error("the store still renews a lease released")
	}

	type reading struct {
		n   int
		err error
	}
	usage := make(chan reading, 1)
	go func() {
		n, err := countInFlight(s)
		usage <- reading{n, err}
	}()
	close(goB)
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	goRetire := <-h.arrived // the retirement's call, led by a goroutine of the store
	select {
	case r := <-usage:
		t.Fatalf("Usage returned %d, %v before the retirement was answered", r.n, r.err)
	default:
	}
	h.hold(false)
	close(goRetire)
	if r := <-usage; r.err != nil || r.n != 1 {
		t.Errorf("Usage after the release of a: %d in flight, %v; want 1 (b)", r.n, r.err)
	}
	calls := h.sent()
	if len(calls) == 0 || calls[0].fn != s.lib.function("retire") {
		t.Errorf("calls after b's: %v, want the retirement alone, then Usage's", calls)
	}
	if n := inFlight(t, peer); n != 1 {
		t.Errorf("another process sees %d in flight, want 1", n)
	}
}

// TestDetachedRetireRefused: a retirement that fails after Release
// returned is not lost: the group's next heartbeat retires the lease.
func TestDetachedRetireRefused(t *testing.T) {
	s, h, peer, goB, bDone := detachSetUp(t, "detach-refused")
	retireNow(t, s)
	refused := errors.New("connection reset by peer (injected)")
	h.mu.Lock()
	h.fail = func(c sentCall) error {
		if c.fn == s.lib.function("retire") {
			return refused
		}
		return nil
	}
	h.held = false
	h.mu.Unlock()
	close(goB)
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := inFlight(t, peer); n != 2 {
		t.Fatalf("in flight after the refused retirement: %d, want 2", n)
	}
	s.mu.Lock()
	_, queued := s.single.done[doneID{"a", s.single.sid}]
	s.mu.Unlock()
	if !queued {
		t.Fatal("the refused retirement is not among what the next heartbeat retires")
	}
	h.mu.Lock()
	h.fail = nil
	h.mu.Unlock()
	if missing, err := s.Heartbeat(ctx, []string{"b"}); err != nil || len(missing) != 0 {
		t.Fatalf("heartbeat: %v, %v", missing, err)
	}
	if n := inFlight(t, peer); n != 1 {
		t.Errorf("in flight after the heartbeat: %d, want 1 (b)", n)
	}
}

// TestFlushWaitsOnlyForEarlier: Flush waits for the retirements queued
// before it, not for those queued while it waits, so a busy group cannot
// hold a scrape up for ever.
func TestFlushWaitsOnlyForEarlier(t *testing.T) {
	s, h, _, goB, bDone := detachSetUp(t, "detach-flush")
	ctx := context.Background()
	retireNow(t, s)
	close(goB)
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	goA := <-h.arrived // a's retirement, in flight
	waits := s.pending()
	if len(waits) != 1 {
		t.Fatalf("%d retirements pending, want 1 (a's)", len(waits))
	}
	flushed := make(chan error, 1)
	go func() { flushed <- settle(ctx, waits) }()
	// b's final retirement comes while a's call is out: it queues behind
	// it, after the flush began.
	done := make(chan error, 1)
	go func() { done <- s.Retire(ctx, "b", lease.Request) }()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(goA)
	goRetireB := <-h.arrived
	select {
	case err := <-flushed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the flush waits for a retirement queued after it began")
	}
	// A Flush now waits for b's, and gives up at its ctx's end.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := s.Flush(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Flush with b's retirement held: %v, want the deadline", err)
	}
	h.hold(false)
	close(goRetireB)
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCloseWaitsForDetached: Close returns only once the retirements
// queued are answered (and their leading goroutine gone: the package's
// leak check).
func TestCloseWaitsForDetached(t *testing.T) {
	s, h, peer, goB, bDone := detachSetUp(t, "detach-close")
	retireNow(t, s)
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	close(goB)
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	goRetire := <-h.arrived
	select {
	case <-closed:
		t.Fatal("Close returned with a retirement in flight")
	default:
	}
	h.hold(false)
	close(goRetire)
	<-closed
	if n := inFlight(t, peer); n != 1 {
		t.Errorf("in flight after Close: %d, want 1 (b)", n)
	}
}
