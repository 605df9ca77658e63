package admission

import (
	"context"
	"testing"

	"golang.org/x/time/rate"

	"github.com/runbudget/runbudget/loom"
)

var benchSink any

func benchEndpoint(ctx context.Context, req any) (any, error) { return req, nil }

// BenchmarkConcurrencyMiddleware compares a call through the middleware with
// a bare call of the same endpoint; the difference is the admission cost.
func BenchmarkConcurrencyMiddleware(b *testing.B) {
	c, _ := NewConcurrency(1 << 30)
	wrapped := c.Middleware(benchEndpoint)
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		ep   loom.Endpoint
	}{{"bare", benchEndpoint}, {"middleware", wrapped}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				benchSink, _ = bc.ep(ctx, 1)
			}
		})
		b.Run(bc.name+"-parallel", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				var sink any
				for pb.Next() {
					sink, _ = bc.ep(ctx, 1)
				}
				_ = sink
			})
		})
	}
	b.Run("middleware-rejected", func(b *testing.B) {
		full, _ := NewConcurrency(1)
		full.inFlight = 1 // saturated for good: every call is refused
		ep := full.Middleware(benchEndpoint)
		for b.Loop() {
			benchSink, _ = ep(ctx, 1)
		}
	})
}

// BenchmarkRateAllow compares Rate.Allow with a bare rate.Limiter under the
// same settings, on the admitting path (a rate nothing can exhaust) and the
// denying path (a bucket that stays empty).
func BenchmarkRateAllow(b *testing.B) {
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		p    RatePolicy
	}{
		{"admit", RatePolicy{PerSecond: 1e15, Burst: 1 << 40}},
		{"deny", RatePolicy{PerSecond: 1e-9, Burst: 1}},
	} {
		b.Run(bc.name+"/raw-limiter", func(b *testing.B) {
			lim := rate.NewLimiter(rate.Limit(bc.p.PerSecond), bc.p.Burst)
			var ok bool
			for b.Loop() {
				ok = lim.Allow()
			}
			benchSink = ok
		})
		b.Run(bc.name+"/Rate", func(b *testing.B) {
			r, _ := NewRate(bc.p)
			var d RateDecision
			for b.Loop() {
				d, _ = r.Allow(ctx)
			}
			benchSink = d
		})
		b.Run(bc.name+"/raw-limiter-parallel", func(b *testing.B) {
			lim := rate.NewLimiter(rate.Limit(bc.p.PerSecond), bc.p.Burst)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					lim.Allow()
				}
			})
		})
		b.Run(bc.name+"/Rate-parallel", func(b *testing.B) {
			r, _ := NewRate(bc.p)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r.Allow(ctx)
				}
			})
		})
	}
}
