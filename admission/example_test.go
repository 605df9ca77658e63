package admission_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runbudget/runbudget/admission"
	"github.com/runbudget/runbudget/loom"
)

func ExampleConcurrency() {
	c, err := admission.NewConcurrency(1)
	if err != nil {
		panic(err)
	}
	var inner loom.Endpoint
	// The endpoint calls back into the same budget while it holds the only
	// permit, so the inner call is refused at once.
	outer := c.Middleware(func(ctx context.Context, req any) (any, error) {
		_, err := inner(ctx, req)
		var se *loom.ServiceError
		if errors.As(err, &se) {
			fmt.Printf("inner call: %s (temporary: %v)\n", se.Name, se.Temporary)
		}
		return "done", nil
	})
	inner = c.Middleware(func(context.Context, any) (any, error) { return "never", nil })

	res, err := outer(context.Background(), nil)
	fmt.Println(res, err)
	s := c.Snapshot()
	fmt.Printf("capacity %d, in flight %d, admitted %d, rejected %d\n", s.Capacity, s.InFlight, s.Admitted, s.Rejected)
	// Output:
	// inner call: overloaded (temporary: true)
	// done <nil>
	// capacity 1, in flight 0, admitted 1, rejected 1
}

func ExampleRate() {
	r, err := admission.NewRate(admission.RatePolicy{PerSecond: 0.5, Burst: 2})
	if err != nil {
		panic(err)
	}
	for range 3 {
		d, _ := r.Allow(context.Background())
		fmt.Printf("allowed %v, retry after %ds\n", d.Allowed, d.RetryAfterSeconds())
	}
	if err := r.SetPolicy(admission.RatePolicy{PerSecond: 10, Burst: 2}); err != nil {
		panic(err)
	}
	p, version := r.Policy()
	fmt.Printf("now %v/s, burst %d, version %d\n", p.PerSecond, p.Burst, version)
	// Output:
	// allowed true, retry after 0s
	// allowed true, retry after 0s
	// allowed false, retry after 2s
	// now 10/s, burst 2, version 2
}

// tooManyRequests is the denial error a service design would declare, with
// the delay its transport turns into a Retry-After header.
type tooManyRequests struct{ retryAfter int64 }

func (e *tooManyRequests) Error() string { return "too many requests" }

func ExampleRateAdmission_Middleware() {
	// One local bucket stands in for a shared backend such as
	// redisstore.NewRateCheck; every key draws on it here.
	r, _ := admission.NewRate(admission.RatePolicy{PerSecond: 1, Burst: 1})
	a, err := admission.NewRateAdmission(func(ctx context.Context, _ string) (admission.RateDecision, error) {
		return r.Allow(ctx)
	}, 50*time.Millisecond)
	if err != nil {
		panic(err)
	}
	type callerKey struct{}
	limit := a.Middleware(
		func(ctx context.Context, _ any) (string, error) {
			id, ok := ctx.Value(callerKey{}).(string)
			if !ok {
				return "", errors.New("no authenticated caller")
			}
			return id, nil
		},
		func(d admission.RateDecision) error {
			return &tooManyRequests{retryAfter: d.RetryAfterSeconds()}
		},
	)
	hello := limit(func(context.Context, any) (any, error) { return "hello", nil })

	ctx := context.WithValue(context.Background(), callerKey{}, "alice")
	for range 2 {
		res, err := hello(ctx, nil)
		var tmr *tooManyRequests
		switch {
		case errors.As(err, &tmr):
			fmt.Printf("denied, retry in %ds\n", tmr.retryAfter)
		case err != nil:
			fmt.Println("error:", err)
		default:
			fmt.Println(res)
		}
	}
	_, err = hello(context.Background(), nil) // no caller: refused, not admitted
	var se *loom.ServiceError
	if errors.As(err, &se) {
		fmt.Println(se.Name)
	}
	// Output:
	// hello
	// denied, retry in 1s
	// rate_limit_unavailable
}

func ExampleRateDecision_RetryAfterSeconds() {
	for _, d := range []time.Duration{0, time.Millisecond, time.Second, 2500 * time.Millisecond} {
		fmt.Println(admission.RateDecision{RetryAfter: d}.RetryAfterSeconds())
	}
	// Output:
	// 0
	// 1
	// 1
	// 3
}
