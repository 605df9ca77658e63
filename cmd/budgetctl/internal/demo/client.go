package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// The demo's lanes talk to the provider the way a cloud SDK's client does,
// in both runs, modelled on the AWS SDK for Go v2's standard retryer: a
// request gets at most Attempts attempts (3); before retry i (from 1) the
// client waits u x min(base x 2^i, 20 s) for u uniform in [0, 1) (full
// jitter), where base is 1 s after a throttle (429, 503) and 100 ms after
// any other retryable failure, or the provider's Retry-After when that is
// longer (as the SDKs that read the header do); when the attempts run out,
// the operation fails and the lane gives up on the object. The SDK's retry
// token bucket (which stops retries when too many fail) is left out: it
// would only make a client give up sooner. The runs differ only below the
// retries, in what admits each attempt: the shared budget
// (httpbudget.Transport), or the lane's own rate limiter.

// retryPolicy is how a client retries.
type retryPolicy struct {
	Attempts     int           // attempts per request, the first included
	Base         time.Duration // backoff base after a failure that is not a throttle
	ThrottleBase time.Duration // backoff base after a throttle
	Cap          time.Duration // no backoff is longer, nor is an honoured Retry-After
}

// DefaultAttempts is the attempts per request of the demo's clients: the
// AWS SDKs' standard mode.
const DefaultAttempts = 3

// sdkRetry is the demo's retry policy, with the attempts a run asks for.
func sdkRetry(attempts int) retryPolicy {
	return retryPolicy{Attempts: attempts, Base: 100 * time.Millisecond, ThrottleBase: time.Second, Cap: 20 * time.Second}
}

// backoff is the wait before retry i (1 for the first retry), given u in
// [0, 1) for the jitter, whether the failure was a throttle, and the
// provider's Retry-After (0 when it sent none): u x min(base x 2^i, Cap),
// or the Retry-After when that is longer, and never more than Cap.
func (p retryPolicy) backoff(i int, u float64, throttle bool, retryAfter time.Duration) time.Duration {
	base := p.Base
	if throttle {
		base = p.ThrottleBase
	}
	ceiling := p.Cap
	if i >= 0 && i < 32 && base<<i < p.Cap {
		ceiling = base << i
	}
	d := time.Duration(u * float64(ceiling))
	return min(max(d, retryAfter), p.Cap)
}

// errGaveUp is matched (errors.Is) by the error a client returns when a
// request's attempts ran out: the operation failed the way an SDK's does,
// and the lane gives the object up.
var errGaveUp = errors.New("retries exhausted")

type gaveUpError struct {
	attempts int
	last     string // the last attempt's status, or its transport error
}

func (e *gaveUpError) Error() string {
	return fmt.Sprintf("%v after %d attempts, the last: %s", errGaveUp, e.attempts, e.last)
}

func (e *gaveUpError) Is(target error) bool { return target == errGaveUp }

// clientStats are a host's counters, shared by its clients.
type clientStats struct {
	throttled atomic.Int64 // 429 and 503 responses
	retries   atomic.Int64 // attempts after a request's first
	waited    atomic.Int64 // nanoseconds from an attempt's start to its send: admission
	backoff   atomic.Int64 // nanoseconds backing off between attempts
}

// client sends a lane's requests with SDK-style retries. Its http.Client's
// transport admits each attempt, and must send through a sendMarker, which
// tells a transport error (retried) from an admission error (returned).
type client struct {
	http   *http.Client
	policy retryPolicy
	jitter func() float64 // in [0, 1); math/rand/v2's Float64
	stats  *clientStats
}

// attemptKey carries an attempt's record in its request's context.
type attemptKey struct{}

type attemptRecord struct {
	start time.Time
	sent  atomic.Bool
}

// sendMarker is the last RoundTripper before the wire: it records that the
// attempt got past admission, and how long admission took.
type sendMarker struct {
	base  http.RoundTripper
	stats *clientStats
}

func (m *sendMarker) RoundTrip(req *http.Request) (*http.Response, error) {
	if a, ok := req.Context().Value(attemptKey{}).(*attemptRecord); ok && !a.sent.Swap(true) {
		m.stats.waited.Add(int64(time.Since(a.start)))
	}
	return m.base.RoundTrip(req)
}

// retryable says whether an SDK retries a response of this status: the
// throttles, and the server errors that are worth another try.
func retryable(code int) bool {
	switch code {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// do sends the request newReq builds (anew for each attempt) until a
// response comes that is not retryable, and returns it for the caller to
// close. When the attempts run out it returns an error matching errGaveUp.
// An error before anything was sent (the budget refusing, or ctx ending
// while the attempt waited for admission) is returned at once: retrying
// would hide a broken budget behind lost objects. When ctx ends, do returns
// ctx.Err().
func (c *client) do(ctx context.Context, newReq func(context.Context) (*http.Request, error)) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		rec := &attemptRecord{start: time.Now()}
		req, err := newReq(context.WithValue(ctx, attemptKey{}, rec))
		if err != nil {
			return nil, err
		}
		resp, err := c.http.Do(req)
		var last string
		var wait time.Duration
		throttle := false
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil && !rec.sent.Load():
			return nil, err
		case err != nil:
			last = err.Error()
		case retryable(resp.StatusCode):
			if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests {
				throttle = true
				c.stats.throttled.Add(1)
			}
			wait, _ = retryAfter(resp.Header)
			last = resp.Status
			// Drained and closed: the connection goes back to the pool,
			// and a budget's lease for the attempt ends.
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		default:
			return resp, nil
		}
		if attempt >= c.policy.Attempts {
			return nil, &gaveUpError{attempts: attempt, last: last}
		}
		d := c.policy.backoff(attempt, c.jitter(), throttle, wait)
		c.stats.retries.Add(1)
		c.stats.backoff.Add(int64(d))
		if err := sleepCtx(ctx, d); err != nil {
			return nil, err
		}
	}
}

// retryAfter reads Retry-After-Ms (milliseconds, the header Azure's SDKs
// read), else Retry-After in delta-seconds (whole or fractional); ok is
// false when neither is there or readable, HTTP-dates included.
func retryAfter(h http.Header) (d time.Duration, ok bool) {
	if ms, err := strconv.ParseInt(strings.TrimSpace(h.Get("Retry-After-Ms")), 10, 64); err == nil && ms >= 0 && ms < 3600_000 {
		return time.Duration(ms) * time.Millisecond, true
	}
	if s, err := strconv.ParseFloat(strings.TrimSpace(h.Get("Retry-After")), 64); err == nil && s >= 0 && s < 3600 {
		return time.Duration(s * float64(time.Second)), true
	}
	return 0, false
}

// laneTransport admits a baseline lane's attempts with the lane's own rate
// limiter: limits that would be right for a lane alone. A lane runs one
// request at a time, so per-lane in-flight ceilings never bind; only this
// limiter and the client's retries remain.
type laneTransport struct {
	base http.RoundTripper
	lim  *rate.Limiter // nil: unlimited
}

func (t *laneTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.lim != nil {
		if err := t.lim.Wait(req.Context()); err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, err
		}
	}
	return t.base.RoundTrip(req)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
