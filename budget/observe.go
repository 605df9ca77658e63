package budget

import (
	"context"
	"errors"
	"time"

	"github.com/runbudget/runbudget/lease"
)

// Observer is told what a Budget does, for metrics and logs: every Acquire
// as it returns, every throttle report, every lease found lost and every
// store call that failed. Methods are called synchronously on the goroutine
// that caused the event, so they must be cheap and must not block or call
// back into the Budget; a slow observer slows admissions. Domains arrive as
// values: the observer decides what, if anything, becomes a label.
//
// extra/budgetprom turns these events into Prometheus metrics.
type Observer interface {
	// ObserveAcquire is called once per Acquire call, as it returns.
	ObserveAcquire(AcquireEvent)
	// ObserveThrottle is called for each throttle report the store took.
	ObserveThrottle(ThrottleEvent)
	// ObserveLeaseLost is called when a lease of this Budget stopped being
	// held before its holder released it (see Lease.Lost).
	ObserveLeaseLost(LeaseLostEvent)
	// ObserveStoreError is called for each store call that failed, retried
	// or not, other than by the caller's own cancellation.
	ObserveStoreError(StoreErrorEvent)
}

// WithObserver reports the budget's events to o. Without it nothing is
// observed, and the admission path does no work for it.
func WithObserver(o Observer) Option { return func(opt *options) { opt.obs = o } }

// AcquireOutcome is how an Acquire call ended.
type AcquireOutcome uint8

// The outcomes of Acquire, as ObserveAcquire sees them.
const (
	AcquireGranted         AcquireOutcome = iota + 1 // a lease was returned
	AcquireCancelled                                 // the caller's ctx ended first
	AcquireInvalid                                   // the request or one of its domains was malformed
	AcquireNeverAdmissible                           // the request could never fit
	AcquireUnavailable                               // the store stayed unreachable past the grace
	AcquireClosed                                    // the budget was closed
	AcquireFailed                                    // any other error from the store
)

var acquireOutcomeNames = [...]string{"", "granted", "cancelled", "invalid", "never_admissible", "unavailable", "closed", "failed"}

// String returns the outcome's name in snake case, fit for a metric label.
func (o AcquireOutcome) String() string {
	if int(o) < len(acquireOutcomeNames) && o > 0 {
		return acquireOutcomeNames[o]
	}
	return "unknown"
}

// outcomeOf classifies what Acquire returned.
func outcomeOf(err error) AcquireOutcome {
	switch {
	case err == nil:
		return AcquireGranted
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return AcquireCancelled
	case errors.Is(err, ErrInvalidRequest), errors.Is(err, ErrInvalidDomain):
		return AcquireInvalid
	case errors.Is(err, ErrNeverAdmissible):
		return AcquireNeverAdmissible
	case errors.Is(err, ErrUnavailable):
		return AcquireUnavailable
	case errors.Is(err, ErrClosed):
		return AcquireClosed
	}
	return AcquireFailed
}

// AcquireEvent describes one Acquire call.
type AcquireEvent struct {
	Class OpClass
	// Domains are the request's domains as the caller gave them. The slice
	// is the caller's: read it during the call, do not keep it.
	Domains []Domain
	Outcome AcquireOutcome
	// Waited is the time from the call to its return, by the budget's clock.
	Waited time.Duration
	// Err is what Acquire returned (nil when granted).
	Err error
}

// ThrottleEvent describes one throttle report the store took.
type ThrottleEvent struct {
	Domain     Domain
	RetryAfter time.Duration
	// Factor is the domain's rate factor after the report.
	Factor float64
}

// LeaseLostEvent describes a lease found lost.
type LeaseLostEvent struct {
	LeaseID string
}

// StoreErrorEvent describes a failed store call.
type StoreErrorEvent struct {
	// Op names the call: "register", "acquire", "cancel", "retire",
	// "heartbeat", "throttle" or "usage".
	Op  string
	Err error
}

// observedStore reports the failures of s's calls to obs. The Budget puts
// it between itself (and its leases and keeper) and the store only when an
// observer is set, so an unobserved budget pays nothing.
type observedStore struct {
	Store
	obs Observer
}

// fail reports err unless the call was cancelled. A deadline is no excuse:
// the Budget bounds each call to a remote store by what is left of its
// grace, so a store too slow to answer in time fails by the deadline.
func (s observedStore) fail(ctx context.Context, op string, err error) {
	if err != nil && !(errors.Is(err, context.Canceled) || errors.Is(ctx.Err(), context.Canceled)) {
		s.obs.ObserveStoreError(StoreErrorEvent{Op: op, Err: err})
	}
}

func (s observedStore) Register(ctx context.Context, limits Limits, replace bool) error {
	err := s.Store.Register(ctx, limits, replace)
	if !errors.Is(err, ErrLimitsConflict) { // a conflict is an answer, not a failure
		s.fail(ctx, "register", err)
	}
	return err
}

func (s observedStore) TryAcquire(ctx context.Context, id string, req Request) (Attempt, error) {
	att, err := s.Store.TryAcquire(ctx, id, req)
	if !errors.Is(err, ErrNeverAdmissible) {
		s.fail(ctx, "acquire", err)
	}
	return att, err
}

func (s observedStore) Cancel(ctx context.Context, id string) error {
	err := s.Store.Cancel(ctx, id)
	s.fail(ctx, "cancel", err)
	return err
}

func (s observedStore) Retire(ctx context.Context, id string, parts lease.Parts) error {
	err := s.Store.Retire(ctx, id, parts)
	s.fail(ctx, "retire", err)
	return err
}

func (s observedStore) Heartbeat(ctx context.Context, ids []string) ([]string, error) {
	missing, err := s.Store.Heartbeat(ctx, ids)
	s.fail(ctx, "heartbeat", err)
	return missing, err
}

func (s observedStore) Throttle(ctx context.Context, d Domain, retryAfter time.Duration) (float64, error) {
	f, err := s.Store.Throttle(ctx, d, retryAfter)
	s.fail(ctx, "throttle", err)
	return f, err
}

func (s observedStore) Usage(ctx context.Context) (Usage, error) {
	u, err := s.Store.Usage(ctx)
	s.fail(ctx, "usage", err)
	return u, err
}

func (s observedStore) NonBlocking() bool { return nonBlocking(s.Store) }

// HostStats is what this Budget (this host) holds right now, without asking
// the store: cheap enough for every metrics scrape.
type HostStats struct {
	// Leases counts leases granted here that their holders have not yet
	// released in full. It is kept only for a Budget built WithObserver
	// (the count costs every lease two atomic operations, which an
	// unobserved budget does not pay); without one it is zero.
	Leases int
	// Waiters counts Acquire calls of this Budget that are waiting, for
	// memory or in the store.
	Waiters int
	// MemoryHeld is the memory this Budget's leases and waiters hold.
	MemoryHeld int64
}

// HostStats returns this Budget's own counts.
func (b *Budget) HostStats() HostStats {
	return HostStats{Leases: int(b.held.Load()), Waiters: int(b.waiting.Load() + b.mem.waiting.Load()),
		MemoryHeld: b.mem.held.Load()}
}
