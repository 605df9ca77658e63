package admission

import (
	"context"
	"errors"
	"sync"

	"github.com/runbudget/runbudget/loom"
)

// Concurrency is a process-local cap on how many endpoint calls run at the
// same time. Build it with NewConcurrency and share the one pointer between
// every endpoint that draws on the same budget.
//
// A permit is held from admission until the wrapped endpoint returns or
// panics; a caller that gives up (its context is cancelled) while the endpoint
// keeps running does not free the permit early. That makes Concurrency a poor
// fit for streams, or for endpoints that hand work to goroutines outlasting
// the call: the permit would not cover that work.
//
// A Concurrency must not be copied after first use (it holds a mutex; go vet
// reports a copy).
type Concurrency struct {
	mu       sync.Mutex
	capacity int // 0 only in a value not built by NewConcurrency
	inFlight int
	admitted uint64
	rejected uint64
	canceled uint64
}

// ConcurrencySnapshot is one consistent reading of a Concurrency's limit and
// counters, taken under its lock. It carries no per-request data, so it is
// safe to export as metrics as is. Counters start at construction and only
// grow.
type ConcurrencySnapshot struct {
	// Capacity is the limit new calls are admitted against (always positive).
	Capacity int
	// InFlight is the number of admitted calls whose endpoint has not yet
	// returned. It can be above Capacity for a while after SetCapacity lowers
	// the limit, until those calls finish.
	InFlight int
	// Admitted counts calls that got a permit, whatever their endpoint then
	// did (returned an error, panicked).
	Admitted uint64
	// Rejected counts calls refused with "overloaded" because every permit
	// was taken.
	Rejected uint64
	// Canceled counts calls refused because their context was already done
	// when they arrived; they are not counted in Rejected.
	Canceled uint64
}

var (
	errCapacity       = errors.New("admission: concurrency capacity must be positive")
	errNotConstructed = errors.New("admission: Concurrency not built by NewConcurrency")
)

// NewConcurrency returns a Concurrency admitting at most capacity calls at
// once. A capacity of zero or less is refused with an error. It starts no
// goroutine and has nothing to close.
func NewConcurrency(capacity int) (*Concurrency, error) {
	if capacity <= 0 {
		return nil, errCapacity
	}
	return &Concurrency{capacity: capacity}, nil
}

// Middleware returns next guarded by c. Each call is decided at once, never
// queued:
//
//   - if ctx is already done, it returns ctx.Err() (counted as Canceled), even
//     when c is saturated, and next is not called;
//   - if every permit is taken, it returns a fresh *loom.ServiceError named
//     "overloaded" with Temporary set (counted as Rejected), and next is not
//     called; nothing is retried, so the service design should declare that
//     error and map it, typically to HTTP 503;
//   - otherwise it takes a permit and calls next with the same ctx and
//     request. Whatever next returns, or panics with, reaches the caller
//     unchanged, and the permit is given back when next is done, panic
//     included.
//
// Install it where validation and authorization have already run (through
// the generated Endpoints.Use, or in a per-method constructor), so that
// refused garbage does not cost a permit. It does not cover work done before
// the endpoint, such as transport decoding or authentication.
//
// Middleware panics if c is nil or was not built by NewConcurrency, or if next
// is nil: a wiring mistake shows at startup, before any call is served.
func (c *Concurrency) Middleware(next loom.Endpoint) loom.Endpoint {
	if !c.constructed() {
		panic("admission: Concurrency.Middleware on a Concurrency not built by NewConcurrency")
	}
	if next == nil {
		panic("admission: Concurrency.Middleware with a nil endpoint")
	}
	return func(ctx context.Context, req any) (any, error) {
		if err := c.acquire(ctx); err != nil {
			return nil, err
		}
		// A deferred release also runs while a panic unwinds, so a panicking
		// endpoint cannot leak its permit.
		defer c.release()
		return next(ctx, req)
	}
}

// acquire takes a permit or says why not.
func (c *Concurrency) acquire(ctx context.Context) error {
	// The context is read outside the lock: it has its own synchronization,
	// and a cancellation landing just after this check simply loses the race
	// to admission, as it would a moment later anyway.
	if err := ctx.Err(); err != nil {
		c.mu.Lock()
		c.canceled++
		c.mu.Unlock()
		return err
	}
	c.mu.Lock()
	if c.inFlight >= c.capacity {
		c.rejected++
		c.mu.Unlock()
		return errOverloaded()
	}
	c.inFlight++
	c.admitted++
	c.mu.Unlock()
	return nil
}

func (c *Concurrency) release() {
	c.mu.Lock()
	c.inFlight--
	c.mu.Unlock()
}

func (c *Concurrency) constructed() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.capacity > 0
}

// SetCapacity replaces the limit in one step. Permits already held and the
// counters are left alone: after a reduction, calls already running finish
// normally and InFlight may stay above the new Capacity until they do; only
// new calls see the lower limit. A capacity of zero or less, or a Concurrency
// not built by NewConcurrency, returns an error and changes nothing. Setting
// the current value again is a no-op.
func (c *Concurrency) SetCapacity(capacity int) error {
	if capacity <= 0 {
		return errCapacity
	}
	if c == nil {
		return errNotConstructed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.capacity <= 0 {
		return errNotConstructed
	}
	c.capacity = capacity
	return nil
}

// Snapshot returns the current limit and counters, read together under the
// lock, so they are consistent with one another (for example, InFlight never
// exceeds Admitted). A nil or unbuilt Concurrency reads as all zeros.
func (c *Concurrency) Snapshot() ConcurrencySnapshot {
	if c == nil {
		return ConcurrencySnapshot{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return ConcurrencySnapshot{
		Capacity: c.capacity,
		InFlight: c.inFlight,
		Admitted: c.admitted,
		Rejected: c.rejected,
		Canceled: c.canceled,
	}
}
