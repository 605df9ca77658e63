package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"

	"github.com/runbudget/runbudget/admission"
	"github.com/runbudget/runbudget/redisstore"
)

// p6: redisstore.NewRateCheck against redis_rate's Allow, the peer doing the
// same job (a shared rate per key in one script call), on the admitting
// path, over the same 100 keys, with 1 and 64 goroutines.
func p6(ctx context.Context, e *env) error {
	c := e.client(64)
	check, err := redisstore.NewRateCheck(c, e.name("p6:"), admission.RatePolicy{PerSecond: roomyRate, Burst: roomyRate})
	if err != nil {
		return err
	}
	gcra := redis_rate.NewLimiter(c)
	lim := redis_rate.Limit{Rate: roomyRate, Burst: roomyRate, Period: time.Second}
	const keys = 100
	names := make([]string, keys)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	gcraPrefix := e.name("p6-gcra:")
	var ki atomic.Int64
	rc := func(ctx context.Context) error {
		d, err := check(ctx, names[ki.Add(1)%keys])
		if err == nil && !d.Allowed {
			err = fmt.Errorf("NewRateCheck denied a call at a rate nothing reaches")
		}
		return err
	}
	rr := func(ctx context.Context) error {
		r, err := gcra.Allow(ctx, gcraPrefix+names[ki.Add(1)%keys], lim)
		if err == nil && r.Allowed != 1 {
			err = fmt.Errorf("redis_rate denied a call at a rate nothing reaches")
		}
		return err
	}
	// Warm up: scripts loaded, 64 connections open, every key exists.
	for _, f := range []func(context.Context) error{rc, rr} {
		if _, _, err := timeCalls(ctx, 64, 10*keys, f); err != nil {
			return err
		}
	}
	s := "P6 NewRateCheck"
	var steps []func(context.Context) error
	type pair struct{ rc, rr *Figure }
	pairs := map[int]pair{}
	for _, g := range []int{1, 64} {
		n := e.sz.rcCalls
		if g > 1 {
			n = e.sz.rcCalls64
		}
		p := pair{
			rc: e.figure(s, fmt.Sprintf("p6.ratecheck.g%d", g), fmt.Sprintf("NewRateCheck check, %d goroutine%s", g, plural(g)), "µs", true),
			rr: e.figure(sectionFloors, fmt.Sprintf("peer.redis_rate.g%d", g), fmt.Sprintf("redis_rate Allow (GCRA), 100 keys, %d goroutine%s", g, plural(g)), "µs", true),
		}
		pairs[g] = p
		steps = append(steps,
			into(p.rc, func(ctx context.Context) (Round, error) { return measure(ctx, g, n, rc) }),
			into(p.rr, func(ctx context.Context) (Round, error) { return measure(ctx, g, n, rr) }),
		)
	}
	if err := e.rounds(ctx, steps...); err != nil {
		return err
	}
	for _, g := range []int{1, 64} {
		p := pairs[g]
		e.target(perRound(fmt.Sprintf("P6.g%d", g), fmt.Sprintf("NewRateCheck checks/s / redis_rate Allow/s, %d goroutine%s", g, plural(g)),
			"x", ">=", 1.0, ratios(p.rc, p.rr, rate)))
	}
	return nil
}
