// Package budget gives a whole run one budget per provider quota domain, so
// that spreading work over more lanes or hosts redistributes it instead of
// multiplying the load the provider sees.
//
// A Budget admits requests against per-domain ceilings shared by the whole
// run (rate, in-flight requests per class, open bodies), fairly by arrival
// within each domain, and against a memory ceiling of its own host. Provider throttles slow every consumer of the
// domain together. The state sits behind the Store seam: in this process by
// default, or in Redis (package redisstore) for a run spread over hosts.
package budget

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/runbudget/runbudget/internal/backoff"
	"github.com/runbudget/runbudget/lease"
)

// Lease is an admitted request's hold on the budget; see package lease.
type Lease = lease.Lease

// DefaultUnavailableGrace is how long Acquire, Throttle and Usage keep
// retrying an unreachable store before they give up with ErrUnavailable.
// The pauses between tries start at 10 ms and double up to a second, each
// drawn at random from the upper half of its step, so that the hosts of a
// run, which all lost the store at once, do not come back to it at once.
const DefaultUnavailableGrace = 5 * time.Second

// Option configures New.
type Option func(*options)

type options struct {
	store   Store
	replace bool
	grace   time.Duration
	now     func() time.Time
	obs     Observer
}

// WithStore keeps the budget's state in s instead of in this process. The
// budget owns s from then on: Close closes it, and so does a failing New.
func WithStore(s Store) Option { return func(o *options) { o.store = s } }

// WithReplaceLimits makes this host's Limits replace the ones stored for the
// budget. Without it, New fails with ErrLimitsConflict when they differ, so
// two hosts of one run can never silently enforce different ceilings.
func WithReplaceLimits() Option { return func(o *options) { o.replace = true } }

// WithClock makes the budget read its own time from now instead of
// time.Now: the in-process store's clock, and the client-side timing of
// renewals and outages. A Redis store never uses it for admission, which
// runs on Redis TIME, so hosts with skewed clocks share one budget
// correctly. Tests use it to skew or fake a host's clock.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithUnavailableGrace sets how long calls retry an unreachable store before
// they return ErrUnavailable (default DefaultUnavailableGrace). Nothing is
// admitted while the store is unreachable, whatever the grace.
func WithUnavailableGrace(d time.Duration) Option { return func(o *options) { o.grace = d } }

// Budget admits provider requests against a run's ceilings. One Budget (per
// host) serves every consumer of the run; its methods are safe for concurrent
// use.
//
// Admission is fair by arrival within each domain: a waiter that cannot start
// holds back younger waiters that need any of its domains, and only those.
// Serving whichever request happens to fit would let a stream of small
// requests starve a large one; one global line would let a single congested
// quota stall traffic to every unrelated one.
type Budget struct {
	store  Store
	limits Limits
	grace  time.Duration
	now    func() time.Time
	keeper *lease.Keeper // nil when the store never expires leases
	ttl    time.Duration // the store's LeaseTTL, with the keeper
	obs    Observer      // nil: nothing observed
	// local is set for a NonBlocking store, whose calls cannot hang: the
	// admission path then skips the clock reads and per-call deadlines
	// that any other store needs.
	local bool

	idPrefix string
	idSeq    atomic.Uint64

	held     atomic.Int64 // leases granted here, not yet released in full (counted when observed)
	waiting  atomic.Int64 // Acquire calls waiting on the store
	released func()       // given to every lease when observed (counts held); nil otherwise
	mem      *memLine     // this host's memory; see memory.go

	mu      sync.RWMutex
	closed  bool
	done    <-chan struct{}
	doneCtx context.Context // cancelled by Close, for waits that take a context
	cancel  context.CancelFunc
	active  sync.WaitGroup // Acquire calls in progress
	cleanup sync.WaitGroup // background cancellations of abandoned waiters
}

// New validates limits and returns a Budget over the in-process store, or
// over the store given by WithStore, where it registers the limits (see
// WithReplaceLimits). Invalid limits give an error wrapping ErrInvalidLimits.
func New(limits Limits, opts ...Option) (*Budget, error) {
	o := options{grace: DefaultUnavailableGrace, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	nl, err := limits.Normalize()
	if err != nil {
		if o.store != nil {
			o.store.Close()
		}
		return nil, err
	}
	if o.grace <= 0 {
		o.grace = DefaultUnavailableGrace
	}
	if o.store == nil {
		o.store = newMemStore(o.now)
	}
	if o.obs != nil {
		o.store = observedStore{Store: o.store, obs: o.obs}
	}
	b := &Budget{
		store:    o.store,
		limits:   nl,
		grace:    o.grace,
		now:      o.now,
		obs:      o.obs,
		local:    nonBlocking(o.store),
		idPrefix: uuid.NewString() + ".",
		mem:      newMemLine(nl.MemoryBytes),
	}
	b.doneCtx, b.cancel = context.WithCancel(context.Background())
	b.done = b.doneCtx.Done()
	if o.obs != nil {
		// Leases are counted for HostStats only when observed: an
		// unobserved budget does not pay two atomic operations per lease.
		// Built once: a func made per Acquire would cost an allocation.
		b.released = func() { b.held.Add(-1) }
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.grace+time.Second)
	defer cancel()
	shared := nl.shared()
	if err := b.retry(ctx, func(ctx context.Context) error { return b.store.Register(ctx, shared, o.replace) }); err != nil {
		b.store.Close()
		return nil, err
	}
	if ttl := b.store.LeaseTTL(); ttl > 0 {
		b.ttl = ttl
		kopts := []lease.KeeperOption{lease.WithClock(o.now)}
		if o.obs != nil {
			kopts = append(kopts, lease.WithLostHook(func(id string) {
				o.obs.ObserveLeaseLost(LeaseLostEvent{LeaseID: id})
			}))
		}
		if b.keeper, err = lease.NewKeeper(b.store, ttl, kopts...); err != nil {
			b.store.Close()
			return nil, err
		}
	}
	return b, nil
}

// Limits returns the normalized limits this budget was built with.
func (b *Budget) Limits() Limits { return b.limits }

// newID returns a waiter ID, which becomes the lease ID on a grant. A random
// 122-bit prefix per Budget (a UUID) plus a counter is as unique across hosts
// as a fresh UUID per call, and much cheaper on the admission path.
func (b *Budget) newID() string {
	var n [13]byte // a uint64 in base 32 (a power of two formats fastest)
	seq := strconv.AppendUint(n[:0], b.idSeq.Add(1), 32)
	var sb strings.Builder // one allocation: the ID itself
	sb.Grow(len(b.idPrefix) + len(seq))
	sb.WriteString(b.idPrefix)
	sb.Write(seq)
	return sb.String()
}

// Acquire waits until the run may start req and returns the lease that holds
// its share of the budget until retired.
//
// Errors: a malformed request wraps ErrInvalidRequest or ErrInvalidDomain; a
// request that can never fit wraps ErrNeverAdmissible and returns at once. If
// ctx ends while waiting, Acquire returns ctx.Err() and the waiter leaves
// every queue having consumed nothing; a grant that races with the
// cancellation is given back, never leaked. If the store stays unreachable
// for the grace period, the error wraps ErrUnavailable; nothing is ever
// admitted without the store. After Close it returns ErrClosed.
func (b *Budget) Acquire(ctx context.Context, req Request) (*Lease, error) {
	if b.obs == nil {
		return b.acquire(ctx, req)
	}
	start := b.now()
	l, err := b.acquire(ctx, req)
	b.obs.ObserveAcquire(AcquireEvent{Class: req.Class, Domains: req.Domains, Outcome: outcomeOf(err),
		Waited: b.now().Sub(start), Err: err})
	return l, err
}

// acquire is Acquire's work: check the request, try once on the fast path
// a NonBlocking store allows, and otherwise wait in line.
func (b *Budget) acquire(ctx context.Context, req Request) (*Lease, error) {
	nreq, err := b.admissible(req)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Memory is reserved here, before the store is asked, and the store
	// never sees it.
	mem := nreq.MemoryBytes
	nreq.MemoryBytes = 0
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return nil, ErrClosed
	}
	id := b.newID()
	reserved := mem == 0 || b.mem.tryReserve(mem)
	if b.local && reserved {
		// A NonBlocking store answers without waiting: a first try under
		// the read lock (which Close waits for) needs none of the
		// bookkeeping of a call that may wait. Anything but a grant goes
		// the long way, which asks again (calls are idempotent by ID).
		if att, err := b.store.TryAcquire(ctx, id, nreq); err == nil && att.Outcome == Granted {
			b.mu.RUnlock()
			return b.newLease(id, nreq, mem), nil
		}
	}
	b.active.Add(1)
	b.mu.RUnlock()
	defer b.active.Done()
	if !reserved {
		if err := b.mem.reserve(ctx, b.doneCtx, mem); err != nil {
			return nil, err
		}
	}
	l, err := b.wait(ctx, id, nreq, mem)
	if err != nil && mem > 0 {
		b.mem.release(mem)
	}
	return l, err
}

// admissible validates req and returns it in normal form, or the error for
// a request that is malformed or could never fit.
func (b *Budget) admissible(req Request) (Request, error) {
	nreq, err := req.normalize(true)
	if err != nil {
		return Request{}, err
	}
	if b.limits.MemoryBytes > 0 && nreq.MemoryBytes > b.limits.MemoryBytes {
		return Request{}, fmt.Errorf("%w: %d bytes of memory asked, this host's ceiling is %d",
			ErrNeverAdmissible, nreq.MemoryBytes, b.limits.MemoryBytes)
	}
	return nreq, nil
}

// wait asks the store for waiter id until it is granted, sleeping between
// attempts on what the store said (a wake, a computed delay) and riding out
// an outage within the grace. Every way out but a grant takes id out of
// the store. mem is the memory already reserved for the lease.
func (b *Budget) wait(ctx context.Context, id string, req Request, mem int64) (*Lease, error) {
	b.waiting.Add(1)
	defer b.waiting.Add(-1)
	var (
		timer *time.Timer // stopped after every sleep, so no return leaves it running
		down  = newOutage()
	)
	for {
		var sent time.Time // when the call went out: a lease's TTL starts after it
		if !b.local {
			sent = b.now()
		}
		att, err := b.tryAcquire(ctx, id, req, down.since)
		if err != nil {
			att, err = b.ride(ctx, &down, err, sent)
		} else {
			down = newOutage()
		}
		if err == nil && att.Outcome == Granted {
			grantedAt := sent.Add(-att.GrantedAgo)
			if err = ctx.Err(); err == nil {
				if b.keeper == nil || b.now().Sub(grantedAt) < b.keeper.LostAfter() {
					return b.track(b.newLease(id, req, mem), grantedAt), nil
				}
				// Collected so long after the store made it (this process
				// stalled, or the reply came that late) that the keeper
				// would declare it lost at once: nothing renewed it
				// meanwhile, so the store may already have reclaimed its
				// slots and given them to others. Give it back and queue
				// again, as a new waiter.
				b.abandon(id)
				id = b.newID()
				continue
			}
			// Granted in the same moment the caller gave up: give it back.
		}
		if err == nil {
			err = b.sleep(ctx, att, &timer)
		}
		if err == nil && att.Handoff != nil && att.Handoff.Load() {
			// Granted by a handoff the store recorded in full: no call
			// needed to collect it.
			if err = ctx.Err(); err == nil {
				return b.newLease(id, req, mem), nil
			}
		}
		if err != nil {
			b.abandon(id)
			return nil, err
		}
	}
}

// minBackoff is the first pause after a failed store call; it doubles on
// each failure of one outage, up to maxBackoff, and each pause is drawn
// from the upper half of its step (package backoff says why).
const (
	minBackoff = 10 * time.Millisecond
	maxBackoff = time.Second
)

// outage is the state of a run of failed store calls.
type outage struct {
	since   time.Time // when the first failed call of the outage was sent; zero when none
	backoff backoff.Backoff
}

func newOutage() outage { return outage{backoff: backoff.New(minBackoff, maxBackoff)} }

// ride decides what a failed store call means: the end of ctx, an error to
// return, or, while the store has been unavailable for less than the
// grace, a Delayed attempt that backs off before the next try.
func (b *Budget) ride(ctx context.Context, o *outage, err error, sent time.Time) (Attempt, error) {
	if ctx.Err() != nil {
		return Attempt{}, ctx.Err()
	}
	if !errors.Is(err, ErrUnavailable) {
		return Attempt{}, err
	}
	if o.since.IsZero() {
		o.since = sent
	}
	left := b.grace - b.now().Sub(o.since)
	if left <= 0 {
		return Attempt{}, err
	}
	return Attempt{Outcome: Delayed, Wait: min(o.backoff.Next(), left)}, nil
}

// renewedCall is how many lease TTLs a waiter whose store renews its place
// (Attempt.Renewed) sleeps at most before it calls again. Such a store
// wakes it when Redis has news for it (a grant, a lost place, its turn
// held back by time), so this call only guards against what the store
// missed: rare
// enough to cost little, as the calls it replaces were most of Redis's
// work with many waiters (BENCHMARKS.md, P9).
const renewedCall = 3

// sleep waits after an attempt that was not granted: until the store's wake,
// until a Delayed attempt's wait is over, or, when the store expires
// waiters, until the next liveness call is due (which also recovers from a
// wake lost on the way): a third of a TTL, or renewedCall TTLs where the
// store renews the waiter's place itself (Attempt.Renewed). It returns ctx's
// error or ErrClosed when either ends first. *timer is reused across
// sleeps and stopped after each.
func (b *Budget) sleep(ctx context.Context, att Attempt, timer **time.Timer) error {
	wait := time.Duration(-1)
	if b.keeper != nil {
		wait = b.keeper.Interval()
		if att.Renewed {
			wait = renewedCall * b.ttl
		}
	}
	if att.Outcome == Delayed && (wait < 0 || att.Wait < wait) {
		wait = max(att.Wait, time.Microsecond)
	}
	var tick <-chan time.Time
	if wait >= 0 {
		if *timer == nil {
			*timer = time.NewTimer(wait)
		} else {
			(*timer).Reset(wait)
		}
		tick = (*timer).C
		defer (*timer).Stop()
	}
	select {
	case <-att.Wake:
	case <-tick:
	case <-ctx.Done():
		return ctx.Err()
	case <-b.done:
		return ErrClosed
	}
	return nil
}

// newLease returns the lease for a grant of req under id, holding mem
// bytes of this host's memory as well.
func (b *Budget) newLease(id string, req Request, mem int64) *Lease {
	parts, r := req.Parts(), lease.Retirer(b.store)
	if mem > 0 {
		parts, r = parts|lease.Memory, &memRetirer{store: b.store, line: b.mem, n: mem}
	}
	if b.released == nil {
		return lease.New(id, parts, r)
	}
	b.held.Add(1)
	return lease.NewReleased(id, parts, r, b.released)
}

// track hands l to the keeper, when the store expires leases; the store's
// TTL for it started no earlier than grantedAt.
func (b *Budget) track(l *Lease, grantedAt time.Time) *Lease {
	if b.keeper != nil {
		b.keeper.Track(l, grantedAt)
	}
	return l
}

// tryAcquire makes one store call. Unless the store is NonBlocking, the
// call is bounded by the grace (counted from the start of an outage
// already under way), so a hung or unreachable store turns into
// ErrUnavailable on time; the caller's own deadline still applies.
func (b *Budget) tryAcquire(ctx context.Context, id string, req Request, downSince time.Time) (Attempt, error) {
	if b.local {
		return b.store.TryAcquire(ctx, id, req)
	}
	start := downSince
	if start.IsZero() {
		start = b.now()
	}
	cctx, cancel := context.WithTimeout(ctx, b.grace-b.now().Sub(start))
	defer cancel()
	att, err := b.store.TryAcquire(cctx, id, req)
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		err = fmt.Errorf("%w: no reply within %v: %v", ErrUnavailable, b.grace, err)
	}
	return att, err
}

// abandon takes id out of the store: out of every queue, and any grant made
// under it (a reply lost to a timeout, a race with cancellation) returned.
// It runs in the background, so the caller returns at its deadline even when
// the store is slow or down; Close waits for it. If the store cannot be
// reached, the waiter and any lease expire on their own, since nothing
// renews them.
func (b *Budget) abandon(id string) {
	b.cleanup.Add(1)
	go func() {
		defer b.cleanup.Done()
		ctx, cancel := context.WithTimeout(context.Background(), lease.RetireTimeout)
		defer cancel()
		b.store.Cancel(ctx, id)
	}()
}

// Throttle records that the provider throttled a request on d. Every
// consumer of d slows down together: the domain's rate factor drops (once for
// a burst of reports, however many consumers send them) and recovers on its
// own, and when retryAfter is positive no new request starts on d before it
// has passed. Other domains are untouched.
//
// An invalid d is an error wrapping ErrInvalidDomain, never a silent no-op:
// dropping provider feedback would hide a throttle exactly when it matters.
// A negative retryAfter wraps ErrInvalidRequest; zero means unknown.
func (b *Budget) Throttle(ctx context.Context, d Domain, retryAfter time.Duration) error {
	if err := d.Validate(); err != nil {
		return err
	}
	if retryAfter < 0 {
		return fmt.Errorf("%w: negative retry-after %v for %s", ErrInvalidRequest, retryAfter, d)
	}
	if b.isClosed() {
		return ErrClosed
	}
	var factor float64
	err := b.retry(ctx, func(ctx context.Context) (err error) {
		factor, err = b.store.Throttle(ctx, d, retryAfter)
		return err
	})
	if err == nil && b.obs != nil {
		b.obs.ObserveThrottle(ThrottleEvent{Domain: d, RetryAfter: retryAfter, Factor: factor})
	}
	return err
}

// Usage returns a snapshot of the budget: from the store, the whole run's
// per-domain in flight by class, open bodies, rate factor, pause and
// waiters; from this Budget, the memory its leases and waiters hold. Waiters
// counts the run's waiters in the store plus this host's waiters for
// memory, which have not reached the store yet. Once every lease is
// released and nobody waits, it is the zero Usage (apart from domains still
// recovering from a throttle).
func (b *Budget) Usage(ctx context.Context) (Usage, error) {
	if b.isClosed() {
		return Usage{}, ErrClosed
	}
	var u Usage
	err := b.retry(ctx, func(ctx context.Context) (err error) {
		u, err = b.store.Usage(ctx)
		return err
	})
	if err != nil {
		return Usage{}, err
	}
	u.MemoryHeld = b.mem.held.Load()
	u.Waiters += int(b.mem.waiting.Load())
	return u, nil
}

// Close stops the budget: waiting Acquire calls return ErrClosed and leave
// their queues, renewals stop, and the store is closed. A lease still held is
// no longer renewed: its Lost channel closes and the store reclaims it within
// one TTL. Release leases before Close. Later calls return nil.
func (b *Budget) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.cancel()
	b.mu.Unlock()

	b.active.Wait()
	b.cleanup.Wait()
	if b.keeper != nil {
		b.keeper.Stop()
	}
	return b.store.Close()
}

func (b *Budget) isClosed() bool {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.closed
}

// retry runs fn until it succeeds, fails with an error other than
// ErrUnavailable, ctx ends, or the store has been unavailable for the grace.
// Each call is bounded by what is left of the grace.
func (b *Budget) retry(ctx context.Context, fn func(context.Context) error) error {
	start := b.now()
	pause := backoff.New(minBackoff, maxBackoff)
	for {
		cctx, cancel := context.WithTimeout(ctx, b.grace-b.now().Sub(start))
		err := fn(cctx)
		timedOut := cctx.Err() != nil
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case timedOut:
			return fmt.Errorf("%w: no reply within %v: %v", ErrUnavailable, b.grace, err)
		case !errors.Is(err, ErrUnavailable):
			return err
		}
		left := b.grace - b.now().Sub(start)
		if left <= 0 {
			return err
		}
		t := time.NewTimer(min(pause.Next(), left))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}
