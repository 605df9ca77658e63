package admission

import (
	"context"
	"errors"
	"time"

	"github.com/runbudget/runbudget/loom"
)

// RateDecision is the outcome of one rate check. A denied decision returned
// with a nil error means the group's quota is spent for now; a backend that
// could not decide returns an error instead, never a denial.
type RateDecision struct {
	// Allowed reports whether the call may go ahead.
	Allowed bool
	// RetryAfter, on a denial, estimates how long until the group has
	// allowance again; it is a hint, not a reservation. Zero means the delay
	// is not known. It is never negative, and it is zero on an allowed
	// decision.
	RetryAfter time.Duration
	// Version names the policy the decision was made under, as reported by
	// Rate.Policy. A backend without policy versions leaves it zero.
	Version uint64
}

// RetryAfterSeconds returns RetryAfter in whole seconds, rounded up, or zero
// when the delay is unknown (RetryAfter zero or, from a broken backend,
// negative). It cannot overflow: the largest time.Duration gives
// 9223372037. An HTTP adapter may send a positive result as Retry-After and
// should send no Retry-After header at all for zero.
func (d RateDecision) RetryAfterSeconds() int64 {
	if d.RetryAfter <= 0 {
		return 0
	}
	s := int64(d.RetryAfter / time.Second)
	if d.RetryAfter%time.Second != 0 {
		s++ // at most MaxInt64/1e9 + 1: no overflow
	}
	return s
}

// wellFormed reports whether d keeps RateDecision's own rules: a delay is
// never negative, and an allowed decision has none.
func (d RateDecision) wellFormed() bool {
	return d.RetryAfter >= 0 && !(d.Allowed && d.RetryAfter != 0)
}

// RateCheck makes one rate decision for a call in the group named by key, and
// charges the call to that group when it allows it. Which policy applies and
// how far the quota reaches (this process, every replica) is the backend's
// business.
//
// A RateCheck must be safe for concurrent use and return soon after ctx is
// done. Keys may identify people or tenants: a RateCheck must not put them in
// its errors, logs or metric labels.
type RateCheck func(ctx context.Context, key string) (RateDecision, error)

// RateAdmission puts a time limit and a sanity check around a RateCheck, so
// that a slow, failing or confused backend turns into a refusal rather than
// a hung or admitted call. It keeps no state per key and starts no goroutine;
// it neither retries nor queues.
//
// Its timeout is enforced through the context given to the backend, so it
// only bounds backends that watch that context; one that ignores it is waited
// for, and its late answer is then discarded as a timeout.
type RateAdmission struct {
	check   RateCheck
	timeout time.Duration
}

// NewRateAdmission returns a RateAdmission that gives check at most timeout
// per call. A nil check or a timeout of zero or less is refused with an error.
// The timeout does not replace the backend's own network timeouts (dial,
// read, pool wait), which should be set as well.
func NewRateAdmission(check RateCheck, timeout time.Duration) (*RateAdmission, error) {
	if check == nil {
		return nil, errors.New("admission: NewRateAdmission needs a RateCheck")
	}
	if timeout <= 0 {
		return nil, errors.New("admission: NewRateAdmission timeout must be positive")
	}
	return &RateAdmission{check: check, timeout: timeout}, nil
}

func (a *RateAdmission) constructed() bool {
	return a != nil && a.check != nil && a.timeout > 0
}

// Check asks the backend about key under a context derived from ctx: it has
// ctx's values, and its deadline is the earlier of ctx's and now plus the
// timeout.
//
// If ctx is done, before or during the check, Check returns ctx.Err(). If the
// backend fails, runs out of time, or answers with a malformed decision (a
// negative RetryAfter, or an allowed decision with a RetryAfter), Check
// returns a *loom.ServiceError named "rate_limit_unavailable" with Temporary
// set, and Timeout set too when time ran out; so does a RateAdmission not
// built by NewRateAdmission. That error's message is fixed: it contains
// neither the backend's error text nor key. Whenever the error is non-nil the
// returned decision is the zero value, which does not allow the call.
//
// A panic in the backend is not recovered.
func (a *RateAdmission) Check(ctx context.Context, key string) (RateDecision, error) {
	if err := ctx.Err(); err != nil {
		return RateDecision{}, err
	}
	if !a.constructed() {
		return RateDecision{}, errRateUnavailable()
	}
	d, timedOut, err := a.run(ctx, key)
	switch {
	case ctx.Err() != nil:
		// The caller left; its reason wins over whatever the backend said.
		return RateDecision{}, ctx.Err()
	case timedOut:
		return RateDecision{}, errRateTimeout()
	case err != nil, !d.wellFormed():
		return RateDecision{}, errRateUnavailable()
	}
	return d, nil
}

// run calls the backend under the bounded context and reports whether that
// context had expired by the time the backend returned: an answer that came
// after the deadline is not trusted, even if it looks fine.
func (a *RateAdmission) run(ctx context.Context, key string) (RateDecision, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	d, err := a.check(cctx, key)
	return d, cctx.Err() != nil, err
}

// Middleware returns an endpoint middleware that charges each call to the
// group key(ctx, request) names and lets it through only on an allowed
// decision. Install it after authentication (generated Endpoints.Use, or a
// per-method constructor) so that key can rely on a verified identity.
//
// For each call:
//
//   - ctx already done: ctx.Err();
//   - key returns an error: a "rate_limit_unavailable" error that does not
//     include that error's text;
//   - Check returns an error: that error (see Check);
//   - a denial: the error denied(decision) returns. That is the
//     application's declared error, carrying RetryAfterSeconds when its
//     transport publishes one. If denied returns nil the call is still
//     refused, with "rate_limit_unavailable";
//   - an allowed decision: next(ctx, request), with the caller's ctx, not
//     the bounded one the check ran under.
//
// Panics in key, denied or next are not recovered. Middleware panics at once
// if a was not built by NewRateAdmission or key or denied is nil; the
// middleware it returns panics when given a nil endpoint. Streams and
// per-message quotas are out of its scope.
func (a *RateAdmission) Middleware(key func(context.Context, any) (string, error), denied func(RateDecision) error) func(loom.Endpoint) loom.Endpoint {
	switch {
	case !a.constructed():
		panic("admission: RateAdmission.Middleware on a RateAdmission not built by NewRateAdmission")
	case key == nil:
		panic("admission: RateAdmission.Middleware with a nil key function")
	case denied == nil:
		panic("admission: RateAdmission.Middleware with a nil denied function")
	}
	return func(next loom.Endpoint) loom.Endpoint {
		if next == nil {
			panic("admission: RateAdmission.Middleware applied to a nil endpoint")
		}
		return func(ctx context.Context, req any) (any, error) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			k, err := key(ctx, req)
			if err != nil {
				if cerr := ctx.Err(); cerr != nil {
					return nil, cerr
				}
				return nil, errRateUnavailable()
			}
			d, err := a.Check(ctx, k)
			if err != nil {
				return nil, err
			}
			if !d.Allowed {
				if derr := denied(d); derr != nil {
					return nil, derr
				}
				// A denial must never turn into a success because the
				// callback forgot to build its error.
				return nil, errRateUnavailable()
			}
			return next(ctx, req)
		}
	}
}
