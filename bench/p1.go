package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/redisstore"
)

// callCounter is a go-redis hook counting what a client sends: one per
// command or pipeline, that is, one per round trip.
type callCounter struct{ n atomic.Int64 }

func (h *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// roomyRate is the rate of every limiter that must never deny: far above
// what this machine reaches, yet low enough that every limiter still does
// its full work on each call. Higher, redis_rate's GCRA would skip its
// write: it counts in float seconds since 1970, where one call's increment
// (1/rate) below about 2.4e-7 s vanishes in rounding, so its state would
// never change and it would look cheaper than it is.
const roomyRate = 1_000_000

// roomy limits bound every dimension (so every check runs: rate, slots,
// bodies, memory) yet never make anyone wait.
var roomy = budget.Limits{
	RequestsPerSecond: roomyRate,
	InFlight:          map[budget.OpClass]int{budget.OpGet: 1 << 24},
	OpenBodies:        1 << 24,
	MemoryBytes:       1 << 50,
}

// request names n domains; with a body and memory it holds all three parts
// of a lease.
func request(n int, prefix string) budget.Request {
	r := budget.Request{Class: budget.OpGet, OpensBody: true, MemoryBytes: 1 << 10, Consumer: "bench"}
	for i := range n {
		r.Domains = append(r.Domains, budget.Domain{Version: 1, ID: fmt.Sprintf("%s-%d", prefix, i)})
	}
	return r
}

// openBudget opens a budget on Redis through client c.
func (e *env) openBudget(c *redis.Client, name string, l budget.Limits, ttl time.Duration) (*budget.Budget, *redisstore.Store, error) {
	s, err := redisstore.New(c, e.name(name), redisstore.WithLeaseTTL(ttl))
	if err != nil {
		return nil, nil, err
	}
	b, err := budget.New(l, budget.WithStore(s), budget.WithReplaceLimits())
	if err != nil {
		return nil, nil, err
	}
	return b, s, nil
}

// p1: the uncontended cost of a budget on Redis, against the round trips
// it is made of and against a one-key GCRA limiter doing a single check.
func p1(ctx context.Context, e *env) error {
	hook := &callCounter{}
	cb := e.client(8)
	cb.AddHook(hook)
	cp := e.client(8) // the floors and the peer: same options, no hook
	// A lease TTL of an hour: no heartbeat runs while the calls are counted.
	b, _, err := e.openBudget(cb, "p1", roomy, time.Hour)
	if err != nil {
		return err
	}
	defer b.Close()
	noop := redis.NewScript(noopScript)
	if err := noop.Load(ctx, cp).Err(); err != nil {
		return err
	}
	gcra := redis_rate.NewLimiter(cp)
	lim := redis_rate.Limit{Rate: roomyRate, Burst: roomyRate, Period: time.Second}
	gcraKey := e.name("p1-gcra")
	allow := func(ctx context.Context) error {
		r, err := gcra.Allow(ctx, gcraKey, lim)
		if err == nil && r.Allowed != 1 {
			err = fmt.Errorf("redis_rate denied a call at a rate nothing reaches")
		}
		return err
	}
	noop2 := func(ctx context.Context) error {
		if err := noop.EvalSha(ctx, cp, nil).Err(); err != nil {
			return err
		}
		return noop.EvalSha(ctx, cp, nil).Err()
	}
	reqs := map[int]budget.Request{1: request(1, "p1"), 4: request(4, "p1")}
	acqRel := func(req budget.Request) func(context.Context) error {
		return func(ctx context.Context) error {
			l, err := b.Acquire(ctx, req)
			if err != nil {
				return err
			}
			l.Release()
			return nil
		}
	}
	// Warm up: scripts loaded, connections open, domains exist.
	for range 20 {
		for _, f := range []func(context.Context) error{allow, noop2, acqRel(reqs[1]), acqRel(reqs[4])} {
			if err := f(ctx); err != nil {
				return err
			}
		}
	}

	s := "P1 uncontended, Redis"
	fNoop2 := e.figure(sectionFloors, "floor.evalsha.x2", "two back-to-back no-op EVALSHA, 1 goroutine", "µs", true)
	fAllow := e.figure(sectionFloors, "peer.redis_rate.allow.g1", "redis_rate Allow (GCRA, one key), 1 goroutine", "µs", true)
	steps := []func(context.Context) error{
		into(fNoop2, func(ctx context.Context) (Round, error) { return measure(ctx, 1, e.sz.p1Calls, noop2) }),
		into(fAllow, func(ctx context.Context) (Round, error) { return measure(ctx, 1, e.sz.p1Calls, allow) }),
	}
	type p1figs struct{ acqRel, acq, trips, hookTrips, cmds *Figure }
	figs := map[int]*p1figs{}
	for _, n := range []int{1, 4} {
		req := reqs[n]
		dn := fmt.Sprintf("%d domain%s", n, plural(n))
		f := &p1figs{
			acqRel:    e.figure(s, fmt.Sprintf("p1.acqrel.d%d", n), "Acquire+Release, "+dn, "µs", true),
			acq:       e.figure(s, fmt.Sprintf("p1.acq.d%d", n), "Acquire alone, "+dn, "µs", true),
			trips:     e.figure(s, fmt.Sprintf("p1.trips.d%d", n), "script calls per Acquire+Release (commandstats), "+dn, "calls", false),
			hookTrips: e.figure(s, fmt.Sprintf("p1.hooktrips.d%d", n), "round trips per Acquire+Release (client hook), "+dn, "calls", false),
			cmds:      e.figure(s, fmt.Sprintf("p1.cmds.d%d", n), "Redis commands per Acquire+Release, inside scripts included, "+dn, "cmds", false),
		}
		figs[n] = f
		steps = append(steps,
			func(ctx context.Context) error {
				before, err := commandStats(ctx, e.admin)
				if err != nil {
					return err
				}
				h0 := hook.n.Load()
				r, err := measure(ctx, 1, e.sz.p1Calls, acqRel(req))
				if err != nil {
					return err
				}
				h1 := hook.n.Load()
				after, err := commandStats(ctx, e.admin)
				if err != nil {
					return err
				}
				d := after.since(before)
				calls := float64(e.sz.p1Calls)
				f.acqRel.add(r)
				f.trips.add(Round{V: float64(d.scripts().Calls) / calls})
				f.hookTrips.add(Round{V: float64(h1-h0) / calls})
				f.cmds.add(Round{V: float64(d.total()) / calls})
				return nil
			},
			into(f.acq, func(ctx context.Context) (Round, error) {
				held := make([]*budget.Lease, 0, e.sz.p1Calls)
				r, err := measure(ctx, 1, e.sz.p1Calls, func(ctx context.Context) error {
					l, err := b.Acquire(ctx, req)
					if err == nil {
						held = append(held, l)
					}
					return err
				})
				for _, l := range held {
					l.Release()
				}
				return r, err
			}),
		)
	}
	if err := e.rounds(ctx, steps...); err != nil {
		return err
	}

	for _, n := range []int{1, 4} {
		f := figs[n]
		dn := fmt.Sprintf("%d domain%s", n, plural(n))
		e.target(perRound(fmt.Sprintf("P1a.d%d", n), "script calls per uncontended Acquire+Release (commandstats), "+dn,
			"", "==", 2, values(f.trips)))
		e.target(perRound(fmt.Sprintf("P1b.d%d", n), "Acquire+Release p50 / two no-op EVALSHA p50, "+dn,
			"x", "<=", 3, ratios(f.acqRel, fNoop2, p50)))
		e.target(perRound(fmt.Sprintf("P1c.d%d", n), "Acquire alone p50 / redis_rate Allow p50, "+dn,
			"x", "<=", 1.5, ratios(f.acq, fAllow, p50)))
	}
	return nil
}

func values(f *Figure) []float64 {
	out := make([]float64, len(f.Rounds))
	for i, r := range f.Rounds {
		out[i] = r.V
	}
	return out
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
