package awsbudget

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/logging"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/runbudget/runbudget/budget"
)

// Middleware IDs, as they appear in an operation's stack.
const (
	// AdmissionID is the Finalize-step middleware that acquires a lease for
	// each attempt. It sits right after the SDK's "Retry" middleware, so
	// every retry is a new admission, and before "Signing", so an attempt is
	// signed only once it is admitted and a long wait never ages its
	// signature. Credentials are resolved after the wait too (the SDK's
	// "GetIdentity" comes later), so they cannot expire during it.
	AdmissionID = "RunBudgetAdmission"
	// OperationID is the Initialize-step middleware that records, once per
	// operation, what the operation touches (buckets, class), for
	// AdmissionID to read on every attempt.
	OperationID = "RunBudgetOperation"

	// retryID is the SDK's ID of its retry loop, (*retry.Attempt).ID().
	retryID = "Retry"
)

// throttleTimeout bounds one Throttle report. The report is sent even when
// the caller's context has ended (the provider's feedback matters to every
// other consumer of the domain), so it needs a bound of its own; a Redis
// store retries within it.
const throttleTimeout = 5 * time.Second

// Option configures the middleware.
type Option func(*config)

type config struct {
	domain         func(Resource) budget.Domain
	class          func(operation string) budget.OpClass
	consumer       string
	maxPause       time.Duration
	throttleStatus []int
	throttleCheck  retry.IsErrorThrottle
	now            func() time.Time
}

func newConfig(opts []Option) *config {
	c := &config{
		domain:         DefaultDomain,
		class:          DefaultClass,
		consumer:       "awsbudget",
		maxPause:       DefaultMaxPause,
		throttleStatus: DefaultThrottleStatus,
		throttleCheck:  defaultThrottleCheck,
		now:            time.Now,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// WithDomain replaces DefaultDomain: f names the quota domain of each
// resource an operation touches. It is called once per operation, not per
// attempt, for the operation's bucket and, for a copy, its source bucket.
// A domain f returns that fails budget.Domain.Validate makes the operation
// fail with an error wrapping budget.ErrInvalidDomain, before anything is
// sent. A nil f is ignored.
func WithDomain(f func(Resource) budget.Domain) Option {
	return func(c *config) {
		if f != nil {
			c.domain = f
		}
	}
}

// WithClass replaces DefaultClass: f returns the class an operation is
// charged as. Whether a body slot is held follows the class: OpGet holds
// one until the output's Body is closed (an OpGet operation whose output
// has no Body gives its slot back when the call returns). An unknown class
// makes the operation fail with an error wrapping budget.ErrInvalidRequest.
// A nil f is ignored.
func WithClass(f func(operation string) budget.OpClass) Option {
	return func(c *config) {
		if f != nil {
			c.class = f
		}
	}
}

// WithConsumer names the leases of this client for operators (budgetctl
// lists leases by consumer): the consumer of a lease is name + "/" + the
// operation, e.g. "copyjob-7/GetObject". The default name is "awsbudget".
func WithConsumer(name string) Option {
	return func(c *config) { c.consumer = name }
}

// WithMaxPause caps the pause one throttled response can impose on its
// domains (default DefaultMaxPause). Zero makes a throttle slow the domain
// down without pausing it; a negative d is treated as zero.
func WithMaxPause(d time.Duration) Option {
	return func(c *config) { c.maxPause = max(d, 0) }
}

// WithThrottleStatus sets the HTTP statuses counted as throttles in addition
// to the SDK's classifier (default DefaultThrottleStatus: 503 and 429).
// With no codes, only the classifier decides.
func WithThrottleStatus(codes ...int) Option {
	return func(c *config) { c.throttleStatus = append([]int(nil), codes...) }
}

// WithThrottleCheck replaces the SDK classifier consulted first (default:
// retry.DefaultThrottles, the error codes SlowDown, Throttling,
// RequestLimitExceeded and the rest, and an unmodeled 429). An attempt is a
// throttle when check says aws.TrueTernary or its status is one of
// WithThrottleStatus. A nil check leaves only the statuses.
func WithThrottleCheck(check retry.IsErrorThrottle) Option {
	return func(c *config) { c.throttleCheck = check }
}

// withClock makes the middleware read time from now (an HTTP-date
// Retry-After is relative to it); tests only.
func withClock(now func() time.Time) Option {
	return func(c *config) { c.now = now }
}

// WithBudget returns an S3 client option that runs every attempt of every
// operation of the client through b:
//
//	client := s3.NewFromConfig(cfg, awsbudget.WithBudget(b))
//
// It appends APIOption(b, opts...) to the client's APIOptions. With the
// adaptive retry mode it logs a warning through the client's logger: see the
// package documentation for why standard mode is the one to use.
func WithBudget(b *budget.Budget, opts ...Option) func(*s3.Options) {
	install := APIOption(b, opts...)
	return func(o *s3.Options) {
		if o.RetryMode == aws.RetryModeAdaptive && o.Logger != nil {
			o.Logger.Logf(logging.Warn, "awsbudget: the adaptive retry mode's client-side rate limiter reacts to the throttles the shared budget already answers; use the standard retry mode")
		}
		o.APIOptions = append(o.APIOptions, install)
	}
}

// APIOption returns the stack option that WithBudget installs, for
// aws.Config.APIOptions or one operation's options:
//
//	cfg.APIOptions = append(cfg.APIOptions, awsbudget.APIOption(b))
//	out, err := client.GetObject(ctx, in, func(o *s3.Options) {
//		o.APIOptions = append(o.APIOptions, awsbudget.APIOption(b))
//	})
//
// It adds the OperationID middleware at the end of the Initialize step and
// AdmissionID right after the SDK's "Retry" middleware in the Finalize step.
// A stack without "Retry" is a presigner's, which sends nothing: it is left
// alone, so presigning through a budgeted client charges nothing. Installing
// twice on one stack is an error (two admissions per attempt would charge
// every request twice), as is a nil budget; the operation then fails before
// anything is sent.
func APIOption(b *budget.Budget, opts ...Option) func(*middleware.Stack) error {
	c := newConfig(opts)
	return func(stack *middleware.Stack) error {
		if b == nil {
			return errors.New("awsbudget: nil budget")
		}
		if _, ok := stack.Finalize.Get(retryID); !ok {
			return nil
		}
		if _, ok := stack.Finalize.Get(AdmissionID); ok {
			return errors.New("awsbudget: the budget middleware is installed twice on this client")
		}
		if err := stack.Initialize.Add(&operationMiddleware{c: c}, middleware.After); err != nil {
			return fmt.Errorf("awsbudget: %w", err)
		}
		if err := stack.Finalize.Insert(&admissionMiddleware{c: c, b: b}, retryID, middleware.After); err != nil {
			return fmt.Errorf("awsbudget: %w", err)
		}
		return nil
	}
}

// operationKey keys the operation record in the stack values.
type operationKey struct{}

// operation is what one operation charges on each attempt.
type operation struct {
	name string
	req  budget.Request
}

// operationMiddleware records what the operation touches, once, before the
// retry loop: the input is only visible in the Initialize step.
type operationMiddleware struct{ c *config }

func (*operationMiddleware) ID() string { return OperationID }

func (m *operationMiddleware) HandleInitialize(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
	name := awsmiddleware.GetOperationName(ctx)
	target, source := resources(name, awsmiddleware.GetRegion(ctx), in.Parameters)
	class := m.c.class(name)
	req := budget.Request{
		Domains:   []budget.Domain{m.c.domain(target)},
		Class:     class,
		OpensBody: class == budget.OpGet,
		Consumer:  m.c.consumer + "/" + name,
	}
	if source != nil {
		// A server-side copy is one admission on both buckets; see the
		// package documentation, "Copies", for why not two.
		if d := m.c.domain(*source); d != req.Domains[0] {
			req.Domains = append(req.Domains, d)
		}
	}
	ctx = middleware.WithStackValue(ctx, operationKey{}, &operation{name: name, req: req})
	return next.HandleInitialize(ctx, in)
}

// admissionMiddleware holds one lease per attempt.
type admissionMiddleware struct {
	c *config
	b *budget.Budget
}

func (*admissionMiddleware) ID() string { return AdmissionID }

// HandleFinalize admits the attempt, sends it, reports a throttle, and
// retires the lease: the request slot when the response is in (for a GET,
// when its headers are), the body slot when the caller closes the body.
// The lease is released on every other path, a panic included.
//
// If ctx ends while waiting, nothing is sent and the error is an
// *aws.RequestCanceledError wrapping ctx's error (the SDK's own way of
// saying so, which its retryer never retries).
func (m *admissionMiddleware) HandleFinalize(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (out middleware.FinalizeOutput, md middleware.Metadata, err error) {
	op, _ := middleware.GetStackValue(ctx, operationKey{}).(*operation)
	if op == nil {
		return out, md, fmt.Errorf("awsbudget: %s middleware missing from the Initialize step", OperationID)
	}
	l, err := m.b.Acquire(ctx, op.req)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return out, md, &aws.RequestCanceledError{Err: err}
		}
		return out, md, fmt.Errorf("awsbudget: admit %s: %w", op.name, err)
	}
	handedOff := false
	defer func() {
		if !handedOff {
			l.Release()
		}
	}()

	out, md, err = next.HandleFinalize(ctx, in)

	if resp := rawResponse(md, err); m.c.isThrottle(err, resp) {
		m.throttle(ctx, op, resp)
	}
	if err == nil && op.req.OpensBody && holdBody(out.Result, l) {
		l.CompleteRequest()
		handedOff = true
	}
	return out, md, err
}

// throttle reports a throttled attempt on every domain of the request: S3
// does not say which bucket of a copy was over its rate, so both slow down.
// A failed report is logged through the SDK's logger, never returned: the
// caller needs the provider's error, not the budget's.
func (m *admissionMiddleware) throttle(ctx context.Context, op *operation, resp *http.Response) {
	var pause time.Duration
	if resp != nil {
		pause = pauseFrom(resp.Header, m.c.now(), m.c.maxPause)
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), throttleTimeout)
	defer cancel()
	for _, d := range op.req.Domains {
		if err := m.b.Throttle(tctx, d, pause); err != nil {
			middleware.GetLogger(ctx).Logf(logging.Warn, "awsbudget: report throttle of %s on %s: %v", op.name, d, err)
		}
	}
}

// middlewareRawResponse reads the raw response the SDK records in md.
func middlewareRawResponse(md middleware.Metadata) (*http.Response, bool) {
	r, ok := awsmiddleware.GetRawResponse(md).(*smithyhttp.Response)
	if !ok || r == nil || r.Response == nil {
		return nil, false
	}
	return r.Response, true
}

// holdBody makes closing the output's Body release l, and reports whether
// it did; false when the output carries no body.
func holdBody(result any, l *budget.Lease) bool {
	var b *io.ReadCloser
	switch o := result.(type) {
	case *s3.GetObjectOutput:
		b = &o.Body
	case *s3.GetObjectTorrentOutput:
		b = &o.Body
	}
	if b == nil || *b == nil {
		return false
	}
	*b = &body{ReadCloser: *b, lease: l}
	return true
}

// body releases its lease when closed. A body the caller never closes holds
// its slot until the lease is reclaimed, as it holds the connection.
type body struct {
	io.ReadCloser
	lease *budget.Lease
}

// Close closes the SDK's body, then retires the lease (idempotently: a
// second Close only repeats the SDK body's own answer).
func (b *body) Close() error {
	err := b.ReadCloser.Close()
	b.lease.Release()
	return err
}
