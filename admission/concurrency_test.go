package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runbudget/runbudget/loom"
)

type ctxKey struct{}

func TestNewConcurrency(t *testing.T) {
	for _, tc := range []struct {
		capacity int
		ok       bool
	}{
		{-1 << 62, false}, {-1, false}, {0, false}, {1, true}, {64, true}, {1 << 40, true},
	} {
		t.Run(fmt.Sprint(tc.capacity), func(t *testing.T) {
			c, err := NewConcurrency(tc.capacity)
			if !tc.ok {
				if err == nil || c != nil {
					t.Fatalf("NewConcurrency(%d) = %v, %v; want nil and an error", tc.capacity, c, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewConcurrency(%d): %v", tc.capacity, err)
			}
			if got, want := c.Snapshot(), (ConcurrencySnapshot{Capacity: tc.capacity}); got != want {
				t.Fatalf("fresh snapshot %+v, want %+v", got, want)
			}
		})
	}
}

func TestConcurrencyConstructionPanics(t *testing.T) {
	ok := func(context.Context, any) (any, error) { return nil, nil }
	good, _ := NewConcurrency(1)
	for _, tc := range []struct {
		name string
		c    *Concurrency
		next loom.Endpoint
	}{
		{"zero value", new(Concurrency), ok},
		{"nil pointer", nil, ok},
		{"nil endpoint", good, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("Middleware did not panic")
				}
			}()
			tc.c.Middleware(tc.next)
		})
	}
}

// TestConcurrencyPassThrough checks that an admitted call sees the caller's
// own ctx and request, and the caller sees next's own result and error.
func TestConcurrencyPassThrough(t *testing.T) {
	c, _ := NewConcurrency(2)
	sentinel := errors.New("from next")
	req := &struct{ n int }{7}
	var gotCtx context.Context
	var gotReq any
	ep := c.Middleware(func(ctx context.Context, r any) (any, error) {
		gotCtx, gotReq = ctx, r
		return "result", sentinel
	})
	ctx := context.WithValue(context.Background(), ctxKey{}, "v")
	res, err := ep(ctx, req)
	if res != "result" || err != sentinel {
		t.Fatalf("got %v, %v; want next's result and error unchanged", res, err)
	}
	if gotCtx != ctx || gotReq != any(req) {
		t.Fatal("next did not get the caller's ctx and request")
	}
	if got, want := c.Snapshot(), (ConcurrencySnapshot{Capacity: 2, Admitted: 1}); got != want {
		t.Fatalf("snapshot %+v, want %+v", got, want)
	}
}

// holder runs calls through c that stay inside next until released.
type holder struct {
	ep      loom.Endpoint
	entered chan struct{}
	release chan struct{}
	wg      sync.WaitGroup
}

func newHolder(c *Concurrency) *holder {
	h := &holder{entered: make(chan struct{}), release: make(chan struct{})}
	h.ep = c.Middleware(func(ctx context.Context, _ any) (any, error) {
		h.entered <- struct{}{}
		<-h.release
		return nil, nil
	})
	return h
}

// hold starts n calls and returns once all n are inside next.
func (h *holder) hold(t *testing.T, n int) {
	t.Helper()
	for range n {
		h.wg.Go(func() {
			if _, err := h.ep(context.Background(), nil); err != nil {
				t.Errorf("held call: %v", err)
			}
		})
		<-h.entered
	}
}

// done lets every held call return and waits for them.
func (h *holder) done() {
	close(h.release)
	h.wg.Wait()
}

func TestConcurrencySaturated(t *testing.T) {
	c, _ := NewConcurrency(2)
	h := newHolder(c)
	h.hold(t, 2)
	called := false
	ep := c.Middleware(func(context.Context, any) (any, error) { called = true; return nil, nil })

	res, err := ep(context.Background(), nil)
	wantServiceError(t, err, "overloaded")
	if res != nil || called {
		t.Fatalf("refused call returned %v, next called: %v", res, called)
	}
	if got, want := c.Snapshot(), (ConcurrencySnapshot{Capacity: 2, InFlight: 2, Admitted: 2, Rejected: 1}); got != want {
		t.Fatalf("snapshot %+v, want %+v", got, want)
	}
	h.done()
	if _, err := ep(context.Background(), nil); err != nil || !called {
		t.Fatalf("after release: err %v, called %v; want admitted", err, called)
	}
	if got, want := c.Snapshot(), (ConcurrencySnapshot{Capacity: 2, Admitted: 3, Rejected: 1}); got != want {
		t.Fatalf("snapshot %+v, want %+v", got, want)
	}
}

// TestConcurrencyOverloadedErrorsAreDistinct guards against handing every
// caller the same mutable error value.
func TestConcurrencyOverloadedErrorsAreDistinct(t *testing.T) {
	c, _ := NewConcurrency(1)
	h := newHolder(c)
	h.hold(t, 1)
	defer h.done()
	_, err1 := h.ep(context.Background(), nil)
	_, err2 := h.ep(context.Background(), nil)
	e1, e2 := wantServiceError(t, err1, "overloaded"), wantServiceError(t, err2, "overloaded")
	if e1 == e2 || e1.ID == e2.ID {
		t.Fatal("two refusals share one error value or ID")
	}
}

func TestConcurrencyCanceledAtAdmission(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel2()
	for _, tc := range []struct {
		name      string
		ctx       context.Context
		saturated bool
		want      error
	}{
		{"canceled, free", canceled, false, context.Canceled},
		{"canceled, saturated", canceled, true, context.Canceled},
		{"expired, free", expired, false, context.DeadlineExceeded},
		{"expired, saturated", expired, true, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := NewConcurrency(1)
			want := ConcurrencySnapshot{Capacity: 1, Canceled: 1}
			if tc.saturated {
				h := newHolder(c)
				h.hold(t, 1)
				defer h.done()
				want.InFlight, want.Admitted = 1, 1
			}
			called := false
			ep := c.Middleware(func(context.Context, any) (any, error) { called = true; return nil, nil })
			_, err := ep(tc.ctx, nil)
			if err != tc.want {
				t.Fatalf("err %v, want exactly ctx.Err() = %v", err, tc.want)
			}
			if called {
				t.Fatal("next ran for a done context")
			}
			if got := c.Snapshot(); got != want {
				t.Fatalf("snapshot %+v, want %+v", got, want)
			}
		})
	}
}

func TestConcurrencyPanicReleasesPermit(t *testing.T) {
	c, _ := NewConcurrency(1)
	boom := c.Middleware(func(context.Context, any) (any, error) { panic("boom") })
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the endpoint's own panic value", r)
			}
		}()
		boom(context.Background(), nil)
	}()
	if got, want := c.Snapshot(), (ConcurrencySnapshot{Capacity: 1, Admitted: 1}); got != want {
		t.Fatalf("after panic: snapshot %+v, want %+v (permit given back)", got, want)
	}
	ok := c.Middleware(func(context.Context, any) (any, error) { return 1, nil })
	if _, err := ok(context.Background(), nil); err != nil {
		t.Fatalf("call after a panic: %v", err)
	}
}

func TestConcurrencyErrorReleasesPermit(t *testing.T) {
	c, _ := NewConcurrency(1)
	ep := c.Middleware(func(context.Context, any) (any, error) { return nil, errors.New("fail") })
	for range 3 {
		if _, err := ep(context.Background(), nil); err == nil || err.Error() != "fail" {
			t.Fatalf("err %v, want next's error", err)
		}
	}
	if got, want := c.Snapshot(), (ConcurrencySnapshot{Capacity: 1, Admitted: 3}); got != want {
		t.Fatalf("snapshot %+v, want %+v", got, want)
	}
}

func TestConcurrencySetCapacity(t *testing.T) {
	c, _ := NewConcurrency(3)
	h := newHolder(c)
	h.hold(t, 3)
	probe := c.Middleware(func(context.Context, any) (any, error) { return nil, nil })

	// Invalid values change nothing.
	for _, bad := range []int{0, -1} {
		if err := c.SetCapacity(bad); err == nil {
			t.Fatalf("SetCapacity(%d) accepted", bad)
		}
	}
	if got := c.Snapshot().Capacity; got != 3 {
		t.Fatalf("capacity %d after refused updates, want 3", got)
	}

	// A reduction leaves running calls alone and refuses new ones.
	if err := c.SetCapacity(1); err != nil {
		t.Fatal(err)
	}
	if got, want := c.Snapshot(), (ConcurrencySnapshot{Capacity: 1, InFlight: 3, Admitted: 3}); got != want {
		t.Fatalf("after reduction: snapshot %+v, want %+v", got, want)
	}
	_, err := probe(context.Background(), nil)
	wantServiceError(t, err, "overloaded")

	// Raising it above what is held admits again at once.
	if err := c.SetCapacity(4); err != nil {
		t.Fatal(err)
	}
	if _, err := probe(context.Background(), nil); err != nil {
		t.Fatalf("after raise: %v", err)
	}
	h.done()
	if got, want := c.Snapshot(), (ConcurrencySnapshot{Capacity: 4, Admitted: 4, Rejected: 1}); got != want {
		t.Fatalf("final snapshot %+v, want %+v", got, want)
	}
}

func TestConcurrencyUnbuilt(t *testing.T) {
	var nilC *Concurrency
	if err := nilC.SetCapacity(1); err == nil {
		t.Fatal("SetCapacity on nil accepted")
	}
	if err := new(Concurrency).SetCapacity(1); err == nil {
		t.Fatal("SetCapacity on a zero value accepted")
	}
	if (nilC.Snapshot() != ConcurrencySnapshot{}) || (new(Concurrency).Snapshot() != ConcurrencySnapshot{}) {
		t.Fatal("unbuilt Concurrency does not read as zeros")
	}
}

// TestConcurrencyHammer runs 200 goroutines through one Concurrency under
// -race. Every call is refused, canceled or admitted exactly once, and the
// endpoint never sees more than Capacity calls at once.
func TestConcurrencyHammer(t *testing.T) {
	const (
		goroutines = 200
		calls      = 50 // per goroutine, after the first
		capacity   = 16
	)
	c, _ := NewConcurrency(capacity)
	var inside, maxInside, ran atomic.Int64
	ep := c.Middleware(func(ctx context.Context, _ any) (any, error) {
		n := inside.Add(1)
		for m := maxInside.Load(); n > m && !maxInside.CompareAndSwap(m, n); m = maxInside.Load() {
		}
		ran.Add(1)
		inside.Add(-1)
		return nil, nil
	})

	// Fill every permit first, so each goroutine's first call must be refused
	// (or canceled): the test then proves rejections are counted, not just
	// that they add up.
	h := newHolder(c)
	h.hold(t, capacity)

	canceledCtx, cancel := context.WithCancel(context.Background())
	cancel()
	var overloaded, canceled, admitted atomic.Int64
	call := func(ctx context.Context) {
		_, err := ep(ctx, nil)
		var se *loom.ServiceError
		switch {
		case err == nil:
			admitted.Add(1)
		case err == context.Canceled:
			canceled.Add(1)
		case errors.As(err, &se) && se.Name == "overloaded":
			overloaded.Add(1)
		default:
			t.Errorf("unexpected error %v", err)
		}
	}
	ctxFor := func(g, i int) context.Context {
		if (g+i)%7 == 0 {
			return canceledCtx
		}
		return context.Background()
	}

	// A reader checks that every snapshot is coherent while the load runs.
	stop := make(chan struct{})
	var reader sync.WaitGroup
	reader.Go(func() {
		for {
			s := c.Snapshot()
			if s.InFlight < 0 || s.InFlight > s.Capacity || uint64(s.InFlight) > s.Admitted {
				t.Errorf("incoherent snapshot %+v", s)
				return
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	})

	var firstDone, all sync.WaitGroup
	firstDone.Add(goroutines)
	gate := make(chan struct{})
	for g := range goroutines {
		all.Go(func() {
			call(ctxFor(g, 0))
			firstDone.Done()
			<-gate
			for i := 1; i <= calls; i++ {
				call(ctxFor(g, i))
			}
		})
	}
	firstDone.Wait()
	if got := overloaded.Load() + canceled.Load(); got != goroutines {
		t.Fatalf("while saturated: %d refused or canceled of %d", got, goroutines)
	}
	h.done()
	close(gate)
	all.Wait()
	close(stop)
	reader.Wait()

	total := uint64(goroutines * (calls + 1))
	s := c.Snapshot()
	if s.InFlight != 0 {
		t.Errorf("InFlight %d after all calls returned", s.InFlight)
	}
	if got := s.Admitted + s.Rejected + s.Canceled; got != total+capacity {
		t.Errorf("Admitted+Rejected+Canceled = %d, want %d calls", got, total+capacity)
	}
	if s.Admitted != uint64(admitted.Load())+capacity || uint64(ran.Load()) != uint64(admitted.Load()) {
		t.Errorf("Admitted %d, callers saw %d (+%d held), endpoint ran %d", s.Admitted, admitted.Load(), capacity, ran.Load())
	}
	if s.Rejected != uint64(overloaded.Load()) || s.Canceled != uint64(canceled.Load()) {
		t.Errorf("snapshot %+v; callers saw %d overloaded, %d canceled", s, overloaded.Load(), canceled.Load())
	}
	if m := maxInside.Load(); m > capacity {
		t.Errorf("%d calls inside at once, capacity %d", m, capacity)
	}
}

// TestConcurrencyHammerWithResize changes the capacity while 200 goroutines
// call: the endpoint never sees more calls than the largest capacity set, and
// the counters still add up.
func TestConcurrencyHammerWithResize(t *testing.T) {
	const goroutines, calls, small, large = 200, 50, 4, 12
	c, _ := NewConcurrency(large)
	var inside, maxInside atomic.Int64
	ep := c.Middleware(func(ctx context.Context, _ any) (any, error) {
		n := inside.Add(1)
		for m := maxInside.Load(); n > m && !maxInside.CompareAndSwap(m, n); m = maxInside.Load() {
		}
		inside.Add(-1)
		return nil, nil
	})
	stop := make(chan struct{})
	var resizer sync.WaitGroup
	resizer.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := c.SetCapacity([]int{small, large}[i%2]); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var all sync.WaitGroup
	for range goroutines {
		all.Go(func() {
			for range calls {
				ep(context.Background(), nil)
			}
		})
	}
	all.Wait()
	close(stop)
	resizer.Wait()
	s := c.Snapshot()
	if got := s.Admitted + s.Rejected + s.Canceled; got != goroutines*calls || s.InFlight != 0 {
		t.Errorf("snapshot %+v: want %d calls accounted and none in flight", s, goroutines*calls)
	}
	if m := maxInside.Load(); m > large {
		t.Errorf("%d calls inside at once, never had capacity above %d", m, large)
	}
}
