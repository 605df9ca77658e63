package budget

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/runbudget/runbudget/lease"
)

// Store is where a budget's state lives. Each method is one atomic step; the
// waiting, retrying and lease objects are the Budget's, and are the same for
// every store. The in-process store (the default) and redisstore implement
// it, and budgettest holds the conformance suite both must pass.
//
// IDs are chosen by the caller before a call, so a call whose outcome is
// unknown (a timeout, a lost reply) can be repeated or undone by ID: every
// method must be idempotent by its ID.
type Store interface {
	// Register stores limits (already normalized, and without MemoryBytes,
	// which is each host's) as the budget's limits if none are stored, or if
	// replace is set. Otherwise stored limits that differ give an error
	// wrapping ErrLimitsConflict.
	Register(ctx context.Context, limits Limits, replace bool) error

	// TryAcquire makes one admission attempt for waiter id. The first call
	// with an id places the waiter in arrival order on every domain of req
	// (normalized); later calls find it there, keep its place, and refresh
	// its liveness. A call for an id already granted returns Granted again
	// without granting twice. The granted lease has the same id.
	// req.Domains may share the caller's memory: a store reads it during
	// the call and must not keep it. req.MemoryBytes is zero: memory is
	// each host's, kept by the Budget before it asks the store, so a store
	// ignores it (and the Memory part of a lease).
	TryAcquire(ctx context.Context, id string, req Request) (Attempt, error)

	// Cancel takes waiter id out of every queue and returns anything granted
	// under id. Unknown ids are not an error.
	Cancel(ctx context.Context, id string) error

	// Retire returns parts of lease id; parts already returned, and unknown
	// leases, are ignored.
	Retire(ctx context.Context, id string, parts lease.Parts) error

	// Heartbeat renews the listed leases in one call and returns the IDs the
	// store no longer holds.
	Heartbeat(ctx context.Context, ids []string) (missing []string, err error)

	// Throttle records that the provider throttled a request on d (valid);
	// retryAfter, when positive, pauses new starts on d for that long. It
	// returns the domain's rate factor after the report.
	Throttle(ctx context.Context, d Domain, retryAfter time.Duration) (factor float64, err error)

	// Usage returns a consistent snapshot of the budget; MemoryHeld is left
	// to the Budget.
	Usage(ctx context.Context) (Usage, error)

	// LeaseTTL is how long a lease or waiter lives without renewal; zero when
	// the store never expires them (the in-process store).
	LeaseTTL() time.Duration

	// Close releases what the store started (connections it owns,
	// subscriptions, goroutines). The Budget calls it from Close.
	Close() error
}

// Outcome is the result of one admission attempt.
type Outcome int

// The outcomes of TryAcquire.
const (
	// Granted: the lease exists in the store; the request may start.
	Granted Outcome = iota + 1
	// Queued: the waiter must wait for an event (a predecessor leaving, a
	// slot freed). Attempt.Wake is signalled when it may move.
	Queued
	// Delayed: the waiter heads its queues but waits on time (the token
	// bucket or a provider's pause). Try again after Attempt.Wait.
	Delayed
)

func (o Outcome) String() string {
	switch o {
	case Granted:
		return "granted"
	case Queued:
		return "queued"
	case Delayed:
		return "delayed"
	}
	return "outcome(?)"
}

// Attempt is what TryAcquire found.
type Attempt struct {
	Outcome Outcome
	// Wait is how long a Delayed waiter should sleep, measured by the
	// store's clock (for Redis, its TIME), so client clocks never matter.
	Wait time.Duration
	// Wake, for Queued and Delayed, receives a value when the waiter may be
	// able to move, or was granted by another call's handoff (its next
	// TryAcquire then returns Granted). It may be signalled spuriously; the
	// waiter then simply tries again. It stays valid until the id is granted
	// or cancelled.
	Wake <-chan struct{}
	// GrantedAgo, for Granted, is how long before this call the store made
	// the grant (a handoff, or a repeated call), by the store's clock. The
	// lease's TTL runs from the grant, so renewals count from then. A store
	// whose leases share one renewal (redisstore's sessions) reports how
	// much of the lease's TTL was already spent, which can be more.
	GrantedAgo time.Duration
	// Handoff, optional for Queued and Delayed, is set by the store, before
	// it signals Wake, when another call's handoff granted the waiter: the
	// lease is recorded in full, so the Budget returns it on the wake
	// without calling TryAcquire again. A store that leaves it nil is asked
	// again, and answers Granted. It suits stores whose grants need no
	// follow-up from the waiter (no TTL to start, nothing to record).
	Handoff *atomic.Bool
	// Renewed, optional for Queued and Delayed, says the store keeps the
	// waiter's place alive by itself while it waits (redisstore renews all
	// of a process's waiters with one call per group) and signals Wake
	// when the waiter must call: it may move, was granted, or lost its
	// place. The Budget then calls again only on Wake, after a Delayed
	// attempt's Wait, or every few LeaseTTLs as a safety net, instead of
	// every third of a TTL to renew the place itself. A store that leaves
	// it false gets those calls, as their liveness.
	Renewed bool
}

// NonBlocking is an optional interface of a Store. A store whose calls all
// finish in this process without waiting on I/O, and never fail with
// ErrUnavailable, says so with NonBlocking returning true. The Budget then
// makes an Acquire's first attempt under its own read lock, with none of
// the bookkeeping a call that may hang needs, and skips the clock reads and
// per-call deadlines that bound calls to a remote store. The in-process
// store is one; a store that wraps another should forward the answer.
type NonBlocking interface {
	NonBlocking() bool
}

// nonBlocking reports whether s declares itself NonBlocking.
func nonBlocking(s Store) bool {
	nb, ok := s.(NonBlocking)
	return ok && nb.NonBlocking()
}
