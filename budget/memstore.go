package budget

import (
	"cmp"
	"container/list"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runbudget/runbudget/lease"
)

// memStore is the in-process Store: one mutex over plain maps. It is the
// reference for the Redis scripts, which keep the same state in the same
// shape and take the same decisions; budgettest runs one suite over both.
type memStore struct {
	now func() time.Time

	mu sync.Mutex
	// The store's clock (memstore_clock.go): now() plus offset, kept from
	// going back behind anchor.
	offset     time.Duration
	anchor     time.Time
	registered bool
	limits     Limits
	caps       [NumClasses]int // in-flight ceilings by class index
	seq        uint64          // arrival tickets
	domains    map[Domain]*domainState
	// last is the most recently looked-up domain: a run tends to hit one
	// provider domain over and over, and hashing its key is a tenth of an
	// uncontended Acquire. Cleared when its domain is deleted.
	last    *domainState
	waiters map[string]*waiter
	leases  map[string]*memLease
	// draining holds domains whose only state left is a refilling bucket;
	// they are deleted once full, so a deleted domain never comes back with
	// more tokens than it had.
	draining map[*domainState]struct{}
	ops      uint // calls, to sweep only every sweepEvery of them
	// cands are waiters that may be able to move after the current call's
	// changes (new heads, heads where something came free); flush grants
	// them on the spot (a handoff) or wakes them.
	cands []*waiter
}

// handoffMax bounds the grants one call makes on others' behalf, like the
// scripts' HANDOFF: a release fills free slots, not an unbounded chain.
const handoffMax = 32

// sweepEvery spaces out sweeps: a domain stays idle for seconds before it
// can go, so looking on every call would only burn time on the hot path.
const sweepEvery = 32

// sweepMax bounds the domains one sweep looks at, as lib.lua's RECLAIM
// bounds what one script reclaims: no call pays for a large backlog.
const sweepMax = 16

type domainState struct {
	d        Domain
	queue    list.List // *waiter, oldest first
	inFlight [NumClasses]int
	bodies   int

	bucket   bool // tokens and tokensAt are set
	tokens   float64
	tokensAt time.Time

	throttled  bool      // a decrease is in force (factor < 1)
	wmax       float64   // factor just before the last decrease
	droppedAt  time.Time // time of the last decrease
	base       float64   // measured start rate captured for a domain without a ceiling
	pauseUntil time.Time

	draining bool // in memStore.draining

	startSum   float64 // decaying sum of starts, in starts per second
	startAt    time.Time
	firstStart time.Time
}

type waiter struct {
	id     string
	ticket uint64
	req    Request
	doms   []*domainState
	elems  []*list.Element  // this waiter's element in each domain queue
	one    [1]*list.Element // elems of a single-domain waiter, without an allocation
	wake   chan struct{}
	// granted is set, before the wake, when another call's handoff granted
	// this waiter: its Acquire can return without calling again.
	granted atomic.Bool
}

type memLease struct {
	at    time.Time // when granted
	doms  []*domainState
	one   [1]*domainState // doms for a single-domain request, without a second allocation
	class int
	held  lease.Parts
}

func newMemStore(now func() time.Time) *memStore {
	return &memStore{
		now:      now,
		domains:  make(map[Domain]*domainState),
		waiters:  make(map[string]*waiter),
		leases:   make(map[string]*memLease),
		draining: make(map[*domainState]struct{}),
	}
}

var (
	_ Store       = (*memStore)(nil)
	_ NonBlocking = (*memStore)(nil)
)

func (s *memStore) Register(_ context.Context, limits Limits, replace bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.registered && !replace && !s.limits.Equal(limits) {
		return fmt.Errorf("%w", ErrLimitsConflict)
	}
	changed := s.registered && !s.limits.Equal(limits)
	now := s.clock()
	if changed {
		// Buckets come up to now at the old rate before it changes, as in
		// register.lua.
		for _, ds := range s.domains {
			s.settle(ds, now)
			if rate, burst := s.rate(ds, now); rate > 0 {
				s.refill(ds, now, rate, burst)
			}
		}
	}
	s.registered = true
	s.limits = limits
	s.caps = limits.inFlightCaps()
	if changed {
		// New ceilings may let waiters move: try every queue's head, oldest
		// first.
		var heads []*waiter
		for _, ds := range s.domains {
			if f := ds.queue.Front(); f != nil {
				heads = append(heads, f.Value.(*waiter))
			}
		}
		slices.SortFunc(heads, func(a, b *waiter) int { return cmp.Compare(a.ticket, b.ticket) })
		heads = slices.Compact(heads)
		s.cands = append(s.cands, heads...)
		s.flush(now)
	}
	return nil
}

func (s *memStore) LeaseTTL() time.Duration { return 0 }
func (s *memStore) Close() error            { return nil }

// NonBlocking implements NonBlocking: every call is a mutex and map work.
func (s *memStore) NonBlocking() bool { return true }

func (s *memStore) TryAcquire(_ context.Context, id string, req Request) (Attempt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.leases[id]; ok {
		// A repeated call, or a handoff made by another call.
		return Attempt{Outcome: Granted, GrantedAgo: max(0, s.clock().Sub(l.at))}, nil
	}
	now := s.clock()
	if s.ops++; s.ops%sweepEvery == 0 {
		s.sweep(now)
	}

	w := s.waiters[id]
	if w == nil {
		l := &memLease{}
		doms := l.one[:]
		if len(req.Domains) > 1 {
			doms = make([]*domainState, len(req.Domains))
		}
		empty := true
		for i, d := range req.Domains {
			doms[i] = s.domain(d)
			empty = empty && doms[i].queue.Len() == 0
		}
		// Nobody ahead anywhere: admit without queueing if everything fits.
		if empty {
			if slot, wait := s.check(doms, req, now); !slot && wait == 0 {
				s.grant(id, l, doms, req, now)
				return Attempt{Outcome: Granted}, nil
			}
		}
		s.seq++
		req.Domains = nil // may be the caller's; the waiter keeps doms instead
		w = &waiter{id: id, ticket: s.seq, req: req, doms: doms, wake: make(chan struct{}, 1)}
		w.elems = w.one[:]
		if len(doms) > 1 {
			w.elems = make([]*list.Element, len(doms))
		}
		for i, ds := range doms {
			w.elems[i] = ds.queue.PushBack(w)
		}
		s.waiters[id] = w
	}
	att := s.attempt(w, now)
	s.flush(now)
	return att, nil
}

// attempt decides for a queued waiter, on its own call or on another call's
// behalf (flush): the one admission decision of this store. Lock held.
func (s *memStore) attempt(w *waiter, now time.Time) Attempt {
	for i, ds := range w.doms {
		if ds.queue.Front() != w.elems[i] {
			return Attempt{Outcome: Queued, Wake: w.wake, Handoff: &w.granted}
		}
	}
	slot, wait := s.check(w.doms, w.req, now)
	switch {
	case slot:
		return Attempt{Outcome: Queued, Wake: w.wake, Handoff: &w.granted}
	case wait > 0:
		return Attempt{Outcome: Delayed, Wait: wait, Wake: w.wake, Handoff: &w.granted}
	}
	s.grant(w.id, &memLease{}, w.doms, w.req, now)
	s.removeWaiter(w)
	return Attempt{Outcome: Granted}
}

// check reports, without changing any count, whether req could start now:
// slot is set when an in-flight or body ceiling is full on some domain, and
// wait is how long the rate or a pause holds it back. Refilling buckets is
// its only write. Memory is not the store's: the Budget reserved it before
// asking.
func (s *memStore) check(doms []*domainState, req Request, now time.Time) (slot bool, wait time.Duration) {
	class := req.Class.Index()
	for _, ds := range doms {
		s.settle(ds, now)
		if now.Before(ds.pauseUntil) {
			wait = max(wait, ds.pauseUntil.Sub(now))
		}
		if c := s.caps[class]; c > 0 && ds.inFlight[class] >= c {
			slot = true
		}
		if req.OpensBody && s.limits.OpenBodies > 0 && ds.bodies >= s.limits.OpenBodies {
			slot = true
		}
		if rate, burst := s.rate(ds, now); rate > 0 {
			s.refill(ds, now, rate, burst)
			if ds.tokens < 1 {
				wait = max(wait, secondsToDuration((1-ds.tokens)/rate))
			}
		}
	}
	return slot, wait
}

// grant charges req to every domain and records the lease. Lock held; check has just refilled the buckets at now.
func (s *memStore) grant(id string, l *memLease, doms []*domainState, req Request, now time.Time) {
	class := req.Class.Index()
	for _, ds := range doms {
		ds.inFlight[class]++
		if req.OpensBody {
			ds.bodies++
		}
		if ds.bucket {
			ds.tokens--
		}
		// The measured start rate only serves a throttle on a domain with no
		// rate ceiling; with one, the exp on every grant is wasted work.
		if s.limits.RequestsPerSecond == 0 {
			// A start history idle for startRateMemory is forgotten, as
			// in lib.lua: the next start begins a new one.
			if ds.firstStart.IsZero() || now.Sub(ds.startAt) >= startRateMemory {
				ds.firstStart, ds.startSum = now, 0
			}
			ds.startSum = decayRate(ds.startSum, now.Sub(ds.startAt).Seconds()) + 1/startRateTau.Seconds()
			ds.startAt = now
		}
	}
	l.at, l.doms, l.class, l.held = now, doms, class, req.Parts()&^lease.Memory
	s.leases[id] = l
}

// removeWaiter takes w out of every queue; whoever now heads them is a
// candidate.
func (s *memStore) removeWaiter(w *waiter) {
	for i, ds := range w.doms {
		head := ds.queue.Front() == w.elems[i]
		ds.queue.Remove(w.elems[i])
		if next := ds.queue.Front(); head && next != nil {
			s.cands = append(s.cands, next.Value.(*waiter))
		}
		s.maybeIdle(ds)
	}
	delete(s.waiters, w.id)
}

// flush hands what the current call freed to the candidates: each that
// heads all its queues and fits is granted here and now and woken (its
// next TryAcquire finds the lease); one held back by time is woken to learn
// how long to sleep; one held back by a ceiling sleeps on, since
// the release that frees it will try it again. Lock held.
func (s *memStore) flush(now time.Time) {
	granted := 0
	for i := 0; i < len(s.cands); i++ {
		w := s.cands[i]
		if s.waiters[w.id] != w {
			continue // already granted or gone
		}
		if granted >= handoffMax {
			wake(w) // past the bound: let it call for itself
			continue
		}
		switch s.attempt(w, now).Outcome {
		case Granted: // a handoff: the lease is recorded; tell the waiter
			granted++
			w.granted.Store(true)
			wake(w)
		case Delayed: // held back by time: it must learn how long
			wake(w)
		}
	}
	clear(s.cands)
	s.cands = s.cands[:0]
}

func wake(w *waiter) {
	select {
	case w.wake <- struct{}{}:
	default: // already signalled
	}
}

func (s *memStore) Cancel(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.waiters[id]; w != nil {
		s.removeWaiter(w)
	}
	if l := s.leases[id]; l != nil {
		s.retire(id, l, lease.All)
	}
	if len(s.cands) > 0 {
		s.flush(s.clock())
	}
	return nil
}

func (s *memStore) Retire(_ context.Context, id string, parts lease.Parts) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.leases[id]; l != nil {
		s.retire(id, l, parts)
	}
	if len(s.cands) > 0 {
		s.flush(s.clock())
	}
	return nil
}

// retire returns parts of l; the heads of its queues become candidates for
// what came free. Lock held.
func (s *memStore) retire(id string, l *memLease, parts lease.Parts) {
	parts &= l.held
	if parts == 0 {
		return
	}
	l.held &^= parts
	if parts&(lease.Request|lease.Body) != 0 {
		for _, ds := range l.doms {
			if parts&lease.Request != 0 {
				ds.inFlight[l.class]--
			}
			if parts&lease.Body != 0 {
				ds.bodies--
			}
			if f := ds.queue.Front(); f != nil {
				s.cands = append(s.cands, f.Value.(*waiter))
			}
			s.maybeIdle(ds)
		}
	}
	if l.held == 0 {
		delete(s.leases, id)
	}
}

func (s *memStore) Heartbeat(_ context.Context, ids []string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var missing []string
	for _, id := range ids {
		if _, ok := s.leases[id]; !ok {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

func (s *memStore) Throttle(_ context.Context, d Domain, retryAfter time.Duration) (float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	ds := s.domain(d)
	s.settle(ds, now)
	// Bring the bucket up to now at the old rate before the rate changes.
	if rate, burst := s.rate(ds, now); rate > 0 {
		s.refill(ds, now, rate, burst)
	}
	windowEnd := ds.droppedAt.Add(ThrottleWindow)
	if ds.pauseUntil.After(windowEnd) {
		windowEnd = ds.pauseUntil
	}
	if !ds.throttled || !now.Before(windowEnd) {
		// A new congestion event: one multiplicative decrease.
		if !ds.throttled && s.limits.RequestsPerSecond == 0 {
			ds.base = minBaseRate
			if !ds.firstStart.IsZero() && now.Sub(ds.startAt) < startRateMemory {
				ds.base = max(minBaseRate, measuredRate(ds.startSum, now.Sub(ds.startAt).Seconds(), now.Sub(ds.firstStart).Seconds()))
			}
		}
		ds.wmax = s.factor(ds, now)
		ds.droppedAt = now
		ds.throttled = true
		// Saved-up burst would only re-trigger the throttle: start empty.
		ds.bucket, ds.tokens, ds.tokensAt = true, 0, now
	}
	if retryAfter > 0 {
		if until := now.Add(retryAfter); until.After(ds.pauseUntil) {
			ds.pauseUntil = until
		}
		// Nothing accrues while paused, so the pause does not end in a burst.
		ds.tokens = min(ds.tokens, 0)
		if ds.pauseUntil.After(ds.tokensAt) {
			ds.tokensAt = ds.pauseUntil
		}
	}
	return s.factor(ds, now), nil
}

// factor is the domain's rate factor at now (1 when not throttled).
func (s *memStore) factor(ds *domainState, now time.Time) float64 {
	if !ds.throttled {
		return 1
	}
	return throttleFactor(ds.wmax, now.Sub(ds.droppedAt).Seconds())
}

// settle ends a throttle whose factor has recovered to 1. For a domain with
// no rate ceiling its bucket goes too: it is unbounded again.
func (s *memStore) settle(ds *domainState, now time.Time) {
	if ds.throttled && s.factor(ds, now) >= 1 {
		ds.throttled = false
		ds.base = 0
		if s.limits.RequestsPerSecond == 0 {
			ds.bucket = false
		}
	}
}

// rate returns the domain's effective rate and bucket size at now; a zero
// rate means starts are not rate limited.
func (s *memStore) rate(ds *domainState, now time.Time) (rate, burst float64) {
	f := s.factor(ds, now)
	switch {
	case s.limits.RequestsPerSecond > 0:
		return s.limits.RequestsPerSecond * f, max(1, float64(s.limits.Burst)*f)
	case ds.throttled:
		r := ds.base * f
		return r, max(1, r)
	}
	return 0, 0
}

func (s *memStore) refill(ds *domainState, now time.Time, rate, burst float64) {
	if !ds.bucket {
		ds.bucket, ds.tokens, ds.tokensAt = true, burst, now
		return
	}
	if dt := now.Sub(ds.tokensAt).Seconds(); dt > 0 {
		ds.tokens += dt * rate
		ds.tokensAt = now
	}
	ds.tokens = min(ds.tokens, burst)
}

// domain returns the state of d, creating it on first use.
func (s *memStore) domain(d Domain) *domainState {
	if s.last != nil && s.last.d == d {
		return s.last
	}
	ds := s.domains[d]
	if ds == nil {
		ds = &domainState{d: d}
		s.domains[d] = ds
	}
	s.last = ds
	return ds
}

// maybeIdle notes a domain that may soon hold nothing worth keeping. A
// domain stays noted while it is busy again (sweep checks before it deletes
// anything), so a domain used over and over costs no map writes.
func (s *memStore) maybeIdle(ds *domainState) {
	if !ds.draining && ds.queue.Len() == 0 && ds.inFlight == [NumClasses]int{} && ds.bodies == 0 {
		s.draining[ds] = struct{}{}
		ds.draining = true
	}
}

// sweep deletes up to a few draining domains whose state has returned to
// what a fresh domain would have. Bounded, like the Redis reclaim step, so no
// call pays for a large backlog.
func (s *memStore) sweep(now time.Time) {
	n := 0
	for ds := range s.draining {
		if n == sweepMax {
			return
		}
		n++
		if ds.queue.Len() != 0 || ds.inFlight != [NumClasses]int{} || ds.bodies != 0 {
			delete(s.draining, ds)
			ds.draining = false
			continue
		}
		s.settle(ds, now)
		if ds.throttled || now.Before(ds.pauseUntil) || now.Sub(ds.startAt) < startRateMemory {
			continue
		}
		if rate, burst := s.rate(ds, now); rate > 0 {
			s.refill(ds, now, rate, burst)
			if ds.tokens < burst {
				continue
			}
		}
		delete(s.draining, ds)
		ds.draining = false
		delete(s.domains, ds.d)
		if s.last == ds {
			s.last = nil
		}
	}
}

func (s *memStore) Usage(_ context.Context) (Usage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	u := Usage{Waiters: len(s.waiters)}
	for _, ds := range s.domains {
		du := DomainUsage{Domain: ds.d, OpenBodies: ds.bodies, RateFactor: s.factor(ds, now), Waiters: ds.queue.Len()}
		if now.Before(ds.pauseUntil) {
			du.Paused = ds.pauseUntil.Sub(now)
		}
		for i, n := range ds.inFlight {
			if n > 0 {
				if du.InFlight == nil {
					du.InFlight = make(map[OpClass]int)
				}
				du.InFlight[classTable[i]] = n
			}
		}
		if du.InFlight == nil && du.OpenBodies == 0 && du.Waiters == 0 && du.RateFactor >= 1 && du.Paused == 0 {
			continue
		}
		u.Domains = append(u.Domains, du)
	}
	slices.SortFunc(u.Domains, func(a, b DomainUsage) int { return a.Domain.compare(b.Domain) })
	return u, nil
}

// secondsToDuration converts, rounding up so a waiter never wakes a hair
// before its token exists.
func secondsToDuration(s float64) time.Duration {
	d := time.Duration(s * float64(time.Second))
	if float64(d) < s*float64(time.Second) {
		d++
	}
	return max(d, time.Nanosecond)
}

// NewLocalStore returns an in-process Store: what New uses when no store is
// given. Several Budgets built WithStore over one local store share one
// budget, as hosts do over Redis; closing one does not affect the others.
func NewLocalStore(opts ...LocalOption) Store {
	s := newMemStore(time.Now)
	for _, o := range opts {
		o(s)
	}
	return s
}

// LocalOption configures NewLocalStore.
type LocalOption func(*memStore)

// LocalClock makes the store read time from now instead of time.Now: tests
// step it to drive the token bucket, pauses and throttle recovery, as
// redisstore's tests step the time its scripts see. A nil now is ignored.
func LocalClock(now func() time.Time) LocalOption {
	return func(s *memStore) {
		if now != nil {
			s.now = now
		}
	}
}
