package httpbudget

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/runbudget/runbudget/budget"
)

// DefaultMaxPause is the longest pause a Transport asks of the budget when
// MaxPause is zero. A provider's Retry-After beyond it is cut to it: the
// domain's rate factor still drops, so the run keeps backing off, but one
// response (or a misread date) cannot stop every host of the run for an hour.
const DefaultMaxPause = 30 * time.Second

// throttleTimeout bounds the reports of one throttled response. They run
// after the caller's context may have ended (a caller that gives up on a 429
// must not erase the provider's feedback), so they need a bound of their own.
const throttleTimeout = 5 * time.Second

// ErrNilResponse is returned by RoundTrip when Base returned neither a
// response nor an error, which the http.RoundTripper contract forbids.
var ErrNilResponse = errors.New("httpbudget: base RoundTripper returned a nil response and a nil error")

// ErrNoBudget is returned by RoundTrip when Transport.Budget is nil: a
// Transport without a budget refuses to send rather than send unmetered.
var ErrNoBudget = errors.New("httpbudget: Transport has no Budget")

// Transport is an http.RoundTripper that admits every round trip through a
// budget before Base sends it, and reports the provider's throttles back to
// the budget so every host of the run slows down together.
//
// Each call of RoundTrip is one admission. A client that retries (by hand or
// through a retrying wrapper around the http.Client) makes a new round trip,
// so each attempt is admitted and counted, as the provider counts it.
//
// The lease of a round trip ends in steps: its request slot when the
// response headers arrive, and, when the budget.Request opens a body or
// reserves memory, the rest when the caller closes the response body. A
// body read to EOF but never closed keeps its slot, even after net/http has
// put the connection back in its pool: the slot ends at Close, and only
// there, so close every body (as net/http asks anyway). On every error
// RoundTrip returns, the lease has been released.
//
// An http.Client that follows a redirect makes one round trip per hop, so
// each hop is admitted; the client closes the previous hop's body itself.
//
// A Transport is safe for concurrent use; its fields must not change once it
// is in use. Several Transports may share one Budget.
type Transport struct {
	// Base sends the admitted requests. nil means http.DefaultTransport.
	Base http.RoundTripper

	// Budget admits every round trip. It is required: RoundTrip returns
	// ErrNoBudget without one.
	Budget *budget.Budget

	// Request names the domains and class of one request. nil means
	// DefaultRequest. An error from it fails the round trip before anything
	// is admitted or sent. It must not modify the request.
	Request func(*http.Request) (budget.Request, error)

	// Throttled says whether a response is the provider throttling. nil
	// means IsThrottle: status 429 or 503. Each throttled response calls
	// Budget.Throttle once for each distinct domain of its request.
	Throttled func(*http.Response) bool

	// MaxPause caps the pause taken from a throttled response's Retry-After.
	// Zero means DefaultMaxPause (30 s). A negative value never pauses: a
	// throttle then only lowers the domain's rate. A shorter cap keeps a run
	// moving when a provider over-asks; a longer one trusts the provider more
	// (every host of the run waits out the whole pause).
	MaxPause time.Duration

	// ThrottleError, if set, is called (synchronously, from RoundTrip) when
	// reporting a throttle to the budget fails, once per domain that
	// failed. Such a failure never fails the round trip: the provider's
	// response still goes back to the caller. nil drops the error; a budget
	// whose store is unreachable says so again on the next Acquire.
	ThrottleError func(req *http.Request, d budget.Domain, err error)
}

var _ http.RoundTripper = (*Transport)(nil)

// IsThrottle reports whether resp is 429 Too Many Requests or 503 Service
// Unavailable, the statuses providers throttle with. It is what a Transport
// uses when Throttled is nil; a custom classifier can call it and add its own
// cases.
func IsThrottle(resp *http.Response) bool {
	return resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable
}

// RoundTrip admits req through the budget, sends it through Base, and
// returns Base's response unchanged, but for its Body, which is wrapped so
// that closing it ends the lease (when the request holds a body slot or
// memory). req is not modified.
//
// Errors: an error from Request, from Budget.Acquire (which is ctx.Err()
// when req's context ends while waiting for admission; nothing has been
// sent then) or from Base is returned as is, or wrapped with %w; so are
// ErrNoBudget and ErrNilResponse. Whenever RoundTrip returns an error, the
// lease has been released and req.Body closed (by Base, or by RoundTrip
// when Base was never called).
//
// A throttled response (see Throttled) is reported to the budget before
// RoundTrip returns, so the caller's retry already sees the pause. The
// reports run after the request slot has ended, keep the values of req's
// context but not its cancellation (a caller that gives up on a 429 must
// not erase the provider's feedback), and wait at most 5 s in all; a report
// that fails goes to ThrottleError and never fails the round trip.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.Budget == nil {
		closeBody(req)
		return nil, ErrNoBudget
	}
	mapReq := t.Request
	if mapReq == nil {
		mapReq = DefaultRequest
	}
	breq, err := mapReq(req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	ctx := req.Context()
	l, err := t.Budget.Acquire(ctx, breq)
	if err != nil {
		closeBody(req)
		return nil, err
	}

	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(req)
	if err != nil {
		l.Release()
		if resp != nil && resp.Body != nil {
			// A response beside an error breaks the RoundTripper contract;
			// net/http ignores it, so nobody else would close it.
			resp.Body.Close()
		}
		return nil, err
	}
	if resp == nil {
		l.Release()
		return nil, fmt.Errorf("%w (%T)", ErrNilResponse, base)
	}
	l.CompleteRequest()

	throttled := t.Throttled
	if throttled == nil {
		throttled = IsThrottle
	}
	if throttled(resp) {
		t.throttle(ctx, req, breq, resp)
	}

	if resp.Body == nil || (!breq.OpensBody && breq.MemoryBytes == 0) {
		l.Release()
		return resp, nil
	}
	b := &body{rc: resp.Body, lease: l}
	if rwc, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		// net/http hands an upgraded connection back as a writable Body and
		// the caller asserts io.ReadWriteCloser on it: keep it writable.
		resp.Body = &rwBody{body: b, w: rwc}
	} else {
		resp.Body = b
	}
	return resp, nil
}

// throttle reports a throttled response for every distinct domain of breq.
// The reports keep ctx's values but not its cancellation: a caller that gives
// up on the response must not erase the provider's feedback.
func (t *Transport) throttle(ctx context.Context, req *http.Request, breq budget.Request, resp *http.Response) {
	pause := t.pause(resp)
	nreq, err := breq.Normalize() // sorted, duplicates dropped; Acquire accepted it
	if err != nil {
		nreq = breq
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), throttleTimeout)
	defer cancel()
	for _, d := range nreq.Domains {
		if err := t.Budget.Throttle(ctx, d, pause); err != nil && t.ThrottleError != nil {
			t.ThrottleError(req, d, err)
		}
	}
}

// pause is the Retry-After of resp, capped by MaxPause; zero when absent,
// malformed, in the past, or when MaxPause is negative.
func (t *Transport) pause(resp *http.Response) time.Duration {
	limit := t.MaxPause
	switch {
	case limit < 0:
		return 0
	case limit == 0:
		limit = DefaultMaxPause
	}
	d, ok := ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	if !ok {
		return 0
	}
	return min(d, limit)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// body ends a lease when the caller closes a response body. Close is
// idempotent and safe to call concurrently with itself; Read is as safe as
// the body it wraps.
type body struct {
	rc    io.ReadCloser
	lease *budget.Lease

	once sync.Once
	err  error
}

func (b *body) Read(p []byte) (int, error) { return b.rc.Read(p) }

// Close closes the wrapped body and then releases the lease, once. Later
// calls return the first call's error.
func (b *body) Close() error {
	b.once.Do(func() {
		b.err = b.rc.Close()
		b.lease.Release()
	})
	return b.err
}

// rwBody is body for an upgraded (101) connection, which stays writable.
type rwBody struct {
	*body
	w io.Writer
}

func (b *rwBody) Write(p []byte) (int, error) { return b.w.Write(p) }
