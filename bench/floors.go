package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// timeCalls runs op n times in all, spread over g goroutines, and returns
// the duration of every call and the wall time of the whole.
func timeCalls(ctx context.Context, g, n int, op func(context.Context) error) ([]time.Duration, time.Duration, error) {
	var (
		next  atomic.Int64
		mu    sync.Mutex
		all   = make([]time.Duration, 0, n)
		first error
		wg    sync.WaitGroup
	)
	start := time.Now()
	for range g {
		wg.Go(func() {
			own := make([]time.Duration, 0, n/g+1)
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				if err := op(ctx); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					break
				}
				own = append(own, time.Since(t0))
			}
			mu.Lock()
			all = append(all, own...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all, time.Since(start), first
}

// measure runs op like timeCalls and turns the result into a round.
func measure(ctx context.Context, g, n int, op func(context.Context) error) (Round, error) {
	lat, wall, err := timeCalls(ctx, g, n, op)
	if err != nil {
		return Round{}, err
	}
	return latencyRound(lat, wall), nil
}

// rounds runs every step once per round. The order rotates from round to
// round, so no step always runs first, on a machine just woken or just
// loaded; steps whose figures are compared run next to each other.
func (e *env) rounds(ctx context.Context, steps ...func(context.Context) error) error {
	for r := range e.sz.rounds {
		for i := range steps {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := steps[(i+r)%len(steps)](ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// into returns a step that measures with m and adds the round to f.
func into(f *Figure, m func(context.Context) (Round, error)) func(context.Context) error {
	return func(ctx context.Context) error {
		r, err := m(ctx)
		if err != nil {
			return err
		}
		f.add(r)
		return nil
	}
}

// floors: what one Redis round trip costs on this machine, now, with one
// goroutine and with 64: PING (the network and the event loop) and a no-op
// EVALSHA (that plus the scripting machinery). Every budget operation is
// one script call, so these are what its figures are held against.
func floors(ctx context.Context, e *env) error {
	c := e.client(64)
	noop := redis.NewScript(noopScript)
	if err := noop.Load(ctx, c).Err(); err != nil {
		return err
	}
	ping := func(ctx context.Context) error { return c.Ping(ctx).Err() }
	eval := func(ctx context.Context) error { return noop.EvalSha(ctx, c, nil).Err() }
	// Warm the pool: 64 connections dialled before anything is timed.
	if _, _, err := timeCalls(ctx, 64, 640, ping); err != nil {
		return err
	}
	s := sectionFloors
	p1 := e.figure(s, "floor.ping.g1", "Redis PING, 1 goroutine", "µs", true)
	p64 := e.figure(s, "floor.ping.g64", "Redis PING, 64 goroutines", "µs", true)
	n1 := e.figure(s, "floor.evalsha.g1", "no-op EVALSHA, 1 goroutine", "µs", true)
	n64 := e.figure(s, "floor.evalsha.g64", "no-op EVALSHA, 64 goroutines", "µs", true)
	return e.rounds(ctx,
		into(p1, func(ctx context.Context) (Round, error) { return measure(ctx, 1, e.sz.rtCalls, ping) }),
		into(n1, func(ctx context.Context) (Round, error) { return measure(ctx, 1, e.sz.rtCalls, eval) }),
		into(p64, func(ctx context.Context) (Round, error) { return measure(ctx, 64, e.sz.rtCalls64, ping) }),
		into(n64, func(ctx context.Context) (Round, error) { return measure(ctx, 64, e.sz.rtCalls64, eval) }),
	)
}
