package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"testing"

	"github.com/runbudget/runbudget/lease"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// call is one Retire a fake store received.
type call struct {
	id    string
	parts lease.Parts
}

var errDown = errors.New("fake store: connection refused")

// fakeStore records Retire and Heartbeat calls. Retire fails while failRetire
// is set; Heartbeat fails while failBeat is set, reports the IDs in missing,
// and, when block is set, waits for a value on it before answering.
type fakeStore struct {
	mu         sync.Mutex
	retires    []call
	beats      [][]string
	failRetire bool
	failBeat   bool
	missing    map[string]bool
	unrenewed  map[string]bool // renewals that fail apart from the others (a dead server)
	block      chan struct{}
	entered    chan struct{} // receives when a blocking Heartbeat starts
}

func (s *fakeStore) Retire(_ context.Context, id string, parts lease.Parts) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retires = append(s.retires, call{id, parts})
	if s.failRetire {
		return errDown
	}
	return nil
}

func (s *fakeStore) Heartbeat(ctx context.Context, ids []string) ([]string, error) {
	s.mu.Lock()
	s.beats = append(s.beats, slices.Clone(ids))
	block, entered := s.block, s.entered
	s.mu.Unlock()
	if block != nil {
		entered <- struct{}{}
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failBeat {
		return nil, errDown
	}
	var missing, failed []string
	for _, id := range ids {
		switch {
		case s.unrenewed[id]:
			failed = append(failed, id)
		case s.missing[id]:
			missing = append(missing, id)
		}
	}
	if failed != nil {
		return missing, &lease.PartialError{Failed: failed, Err: errDown}
	}
	return missing, nil
}

func (s *fakeStore) set(f func(s *fakeStore)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *fakeStore) retired() []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.retires)
}

func (s *fakeStore) heartbeats() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.beats)
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestPartsString(t *testing.T) {
	for _, tc := range []struct {
		p    lease.Parts
		want string
	}{
		{0, "none"},
		{lease.Request, "request"},
		{lease.Body, "body"},
		{lease.Memory, "memory"},
		{lease.Request | lease.Body, "request+body"},
		{lease.Request | lease.Memory, "request+memory"},
		{lease.Body | lease.Memory, "body+memory"},
		{lease.All, "request+body+memory"},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("Parts(%d).String() = %q, want %q", tc.p, got, tc.want)
		}
	}
	if got := fmt.Sprint(lease.All); got != "request+body+memory" {
		t.Errorf("fmt uses %q, want the String method", got)
	}
}

func TestNew(t *testing.T) {
	s := &fakeStore{}
	for _, tc := range []struct {
		held, want lease.Parts
	}{
		{lease.Request, lease.Request},
		{lease.All, lease.All},
		{lease.Request | lease.Memory, lease.Request | lease.Memory},
		{0xff, lease.All}, // bits outside All are not parts
	} {
		l := lease.New("id-1", tc.held, s)
		if l.ID() != "id-1" || l.Held() != tc.want {
			t.Errorf("New(id-1, %d): ID %q, Held %v; want id-1, %v", tc.held, l.ID(), l.Held(), tc.want)
		}
		if isClosed(l.Lost()) {
			t.Errorf("a new lease is lost")
		}
	}
	if len(s.retired()) != 0 {
		t.Errorf("New called Retire: %v", s.retired())
	}
}

// TestRetireEachPart runs step tables: each step retires something and names
// the exact Retire call it must cause (none when the parts were gone).
func TestRetireEachPart(t *testing.T) {
	type step struct {
		op   string
		want lease.Parts // parts passed to Retire; 0 means no call
		held lease.Parts // Held() afterwards
	}
	run := func(t *testing.T, held lease.Parts, steps []step) {
		t.Helper()
		s := &fakeStore{}
		l := lease.New("L", held, s)
		for i, st := range steps {
			before := len(s.retired())
			switch st.op {
			case "complete":
				l.CompleteRequest()
			case "close":
				l.CloseBody()
			case "memory":
				l.ReleaseMemory()
			case "release":
				l.Release()
			default:
				t.Fatalf("bad op %q", st.op)
			}
			calls := s.retired()[before:]
			var want []call
			if st.want != 0 {
				want = []call{{"L", st.want}}
			}
			if !slices.Equal(calls, want) {
				t.Errorf("step %d (%s): Retire calls %v, want %v", i, st.op, calls, want)
			}
			if got := l.Held(); got != st.held {
				t.Errorf("step %d (%s): Held() = %v, want %v", i, st.op, got, st.held)
			}
		}
		if isClosed(l.Lost()) {
			t.Errorf("retiring closed Lost()")
		}
	}
	t.Run("ordinary copy lane", func(t *testing.T) {
		run(t, lease.All, []step{
			{"complete", lease.Request, lease.Body | lease.Memory},
			{"close", lease.Body, lease.Memory},
			{"memory", lease.Memory, 0},
			{"release", 0, 0},
		})
	})
	t.Run("release after completing", func(t *testing.T) {
		run(t, lease.All, []step{
			{"complete", lease.Request, lease.Body | lease.Memory},
			{"complete", 0, lease.Body | lease.Memory},
			{"release", lease.Body | lease.Memory, 0},
			{"release", 0, 0},
			{"close", 0, 0},
		})
	})
	t.Run("release after closing the body", func(t *testing.T) {
		run(t, lease.All, []step{
			{"close", lease.Body, lease.Request | lease.Memory},
			{"release", lease.Request | lease.Memory, 0},
		})
	})
	t.Run("parts never held", func(t *testing.T) {
		run(t, lease.Request, []step{
			{"close", 0, lease.Request},
			{"memory", 0, lease.Request},
			{"release", lease.Request, 0},
			{"complete", 0, 0},
		})
	})
	t.Run("release first", func(t *testing.T) {
		run(t, lease.Request|lease.Body, []step{
			{"release", lease.Request | lease.Body, 0},
			{"complete", 0, 0},
			{"close", 0, 0},
			{"release", 0, 0},
		})
	})
}

// TestRetireFailureStaysPending: a Retire the store did not confirm is sent
// again with the next retirement, so no part is forgotten even without a
// keeper.
func TestRetireFailureStaysPending(t *testing.T) {
	s := &fakeStore{failRetire: true}
	l := lease.New("L", lease.All, s)
	l.CompleteRequest()
	if l.Held() != lease.Body|lease.Memory {
		t.Fatalf("Held() = %v after a failed retire, want the part retired for the holder anyway", l.Held())
	}
	s.set(func(s *fakeStore) { s.failRetire = false })
	l.CloseBody()
	l.Release()
	want := []call{{"L", lease.Request}, {"L", lease.Request | lease.Body}, {"L", lease.Memory}}
	if got := s.retired(); !slices.Equal(got, want) {
		t.Errorf("Retire calls %v, want %v", got, want)
	}
}

// TestRetireHammer retires every part from many goroutines at once: each
// part reaches the store exactly once, whatever the interleaving.
func TestRetireHammer(t *testing.T) {
	ops := []func(*lease.Lease){
		(*lease.Lease).CompleteRequest, (*lease.Lease).CloseBody,
		(*lease.Lease).ReleaseMemory, (*lease.Lease).Release,
		func(l *lease.Lease) { _ = l.Held() }, func(l *lease.Lease) { _ = l.Lost() },
	}
	for round := range 200 {
		s := &fakeStore{}
		l := lease.New(fmt.Sprint("L", round), lease.All, s)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 24 {
			wg.Go(func() {
				<-start
				ops[(g+round)%len(ops)](l)
			})
		}
		close(start)
		wg.Wait()
		l.Release()

		var union lease.Parts
		n := 0
		for _, c := range s.retired() {
			if c.id != l.ID() || c.parts == 0 || union&c.parts != 0 {
				t.Fatalf("round %d: Retire calls %v: a part was retired twice or empty", round, s.retired())
			}
			union |= c.parts
			n += bits.OnesCount8(uint8(c.parts))
		}
		if union != lease.All || n != 3 || l.Held() != 0 {
			t.Fatalf("round %d: retired %v (held %v), want every part exactly once", round, union, l.Held())
		}
		if isClosed(l.Lost()) {
			t.Fatalf("round %d: retiring closed Lost()", round)
		}
	}
}
