package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RatePolicy sets up one token bucket: it holds at most Burst tokens, gains
// PerSecond tokens each second, and every admitted call spends one.
//
// Both fields must be positive. PerSecond must also be finite and below
// math.MaxFloat64, which golang.org/x/time/rate reserves to mean "no limit at
// all"; a bucket that admits everything is not a policy this package offers.
type RatePolicy struct {
	// PerSecond is the refill rate in tokens per second. Fractions are fine:
	// 0.5 is one call every two seconds.
	PerSecond float64
	// Burst is the bucket's size: how many calls may run back to back after
	// an idle spell. A new bucket starts with all of them.
	Burst int
}

func (p RatePolicy) validate() error {
	switch {
	case math.IsNaN(p.PerSecond) || p.PerSecond <= 0:
		return fmt.Errorf("admission: RatePolicy.PerSecond must be positive, got %v", p.PerSecond)
	case p.PerSecond >= math.MaxFloat64: // +Inf included
		return fmt.Errorf("admission: RatePolicy.PerSecond must be finite and below math.MaxFloat64, got %v", p.PerSecond)
	case p.Burst <= 0:
		return fmt.Errorf("admission: RatePolicy.Burst must be positive, got %d", p.Burst)
	}
	return nil
}

// Rate is a single process-local token bucket built on
// golang.org/x/time/rate, whose policy can be replaced while it is in use.
// It is one budget, not a map of them: an application that limits per client
// keeps its own bounded set of Rates keyed by a trusted identity, or hands a
// shared backend (such as redisstore.NewRateCheck) to NewRateAdmission.
//
// Build it with NewRate. A Rate must not be copied after first use (it holds
// a mutex; go vet reports a copy).
type Rate struct {
	// mu makes a policy change and the version that names it one step, as seen
	// by Allow and Policy. The limiter has its own lock, which is not enough:
	// its limit and burst are set by two separate calls.
	mu      sync.Mutex
	lim     *rate.Limiter // nil only in a value not built by NewRate
	policy  RatePolicy
	version uint64
}

var errRateNotConstructed = errors.New("admission: Rate not built by NewRate")

// NewRate returns a full bucket for policy, at version 1, or an error if the
// policy is invalid (see RatePolicy).
func NewRate(policy RatePolicy) (*Rate, error) {
	if err := policy.validate(); err != nil {
		return nil, err
	}
	return &Rate{
		lim:     rate.NewLimiter(rate.Limit(policy.PerSecond), policy.Burst),
		policy:  policy,
		version: 1,
	}, nil
}

// Allow spends one token and returns an allowed decision, or, when less than
// a whole token is left, spends nothing and returns a denied decision whose
// RetryAfter estimates when the next token will be there. It never waits and
// never books future tokens. Both decisions carry the policy version they were
// made under.
//
// RetryAfter is a hint: other callers may take the token first, and a policy
// change may move it. A token spent on an allowed call stays spent, whatever
// happens to the call afterwards.
//
// If ctx is already done, Allow returns ctx.Err() and spends nothing. A Rate
// not built by NewRate returns an error (never an allowed decision).
func (r *Rate) Allow(ctx context.Context) (RateDecision, error) {
	return r.allowAt(ctx, time.Now())
}

// allowAt is Allow at a given instant, for tests that step time by hand.
func (r *Rate) allowAt(ctx context.Context, now time.Time) (RateDecision, error) {
	if err := ctx.Err(); err != nil {
		return RateDecision{}, err
	}
	if r == nil {
		return RateDecision{}, errRateNotConstructed
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lim == nil {
		return RateDecision{}, errRateNotConstructed
	}
	if r.lim.AllowN(now, 1) {
		return RateDecision{Allowed: true, Version: r.version}, nil
	}
	// Still under r.mu, so no policy change can slip in between the refusal
	// and this reading; other Allow calls cannot either.
	missing := 1 - r.lim.TokensAt(now)
	return RateDecision{RetryAfter: durationFor(missing, r.policy.PerSecond), Version: r.version}, nil
}

// durationFor is how long refilling tokens takes at perSecond, rounded up to
// the nanosecond, at least one nanosecond (a denial always has a known,
// positive delay) and at most the largest time.Duration.
func durationFor(tokens, perSecond float64) time.Duration {
	ns := math.Ceil(tokens / perSecond * float64(time.Second))
	switch {
	case !(ns >= 1): // also catches NaN, which cannot arise from valid input
		return 1
	case ns >= math.MaxInt64: // the float rounds up to 2^63, out of range
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// Policy returns the policy in force and its version, read together. A Rate
// not built by NewRate reads as the zero policy at version 0.
func (r *Rate) Policy() (RatePolicy, uint64) {
	if r == nil {
		return RatePolicy{}, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.policy, r.version
}

// SetPolicy replaces both settings in one step. Tokens earned up to now are
// credited at the old rate; what the bucket holds is kept, cut down to the
// new Burst if that is smaller; refill continues at the new rate from now.
// A larger Burst therefore gives room to refill into, not extra tokens at
// once.
//
// Setting the policy already in force does nothing: the bucket is not
// refilled and the version stays. Any real change bumps the version by one.
// An invalid policy, or a Rate not built by NewRate, returns an error and
// changes nothing.
func (r *Rate) SetPolicy(policy RatePolicy) error {
	return r.setPolicyAt(policy, time.Now())
}

// setPolicyAt is SetPolicy at a given instant, for tests that step time by
// hand.
func (r *Rate) setPolicyAt(policy RatePolicy, now time.Time) error {
	if err := policy.validate(); err != nil {
		return err
	}
	if r == nil {
		return errRateNotConstructed
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lim == nil {
		return errRateNotConstructed
	}
	if policy == r.policy {
		return nil
	}
	// SetLimitAt first: it credits the time up to now at the old rate. The
	// burst change then finds nothing left to credit; the limiter trims the
	// tokens to the new burst the next time it reads them.
	r.lim.SetLimitAt(now, rate.Limit(policy.PerSecond))
	r.lim.SetBurstAt(now, policy.Burst)
	r.policy = policy
	r.version++
	return nil
}
