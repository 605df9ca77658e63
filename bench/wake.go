package main

import (
	"context"
	"fmt"
	"time"

	"github.com/runbudget/runbudget/budget"
)

// p2: how long a waiter in another OS process takes to be admitted after
// the holder of the only slot releases it, against the bare handoff of the
// wake mechanism the store uses (pub/sub) and of the one it did not choose
// (BLPOP), each between two processes.
//
// Each side reads the wall clock (time.Now, CLOCK_REALTIME): one machine,
// one clock, so the two readings compare directly.
func p2(ctx context.Context, e *env) error {
	ch, list := e.name("wake-ch"), e.name("wake-list")
	sub, err := startWorker(ctx, "pubsub-worker", workerSpec{Role: "pubsub", Redis: e.url, Key: ch})
	if err != nil {
		return err
	}
	defer sub.close()
	pop, err := startWorker(ctx, "blpop-worker", workerSpec{Role: "blpop", Redis: e.url, Key: list})
	if err != nil {
		return err
	}
	defer pop.close()
	one := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
	waiter, err := startWorker(ctx, "waiter", workerSpec{Role: "waiter", Redis: e.url, Budget: e.name("p2"),
		Limits: one, Domain: "a", LeaseTTL: 15 * time.Second})
	if err != nil {
		return err
	}
	defer waiter.close()
	c := e.client(4)
	b, _, err := e.openBudget(c, "p2", one, 15*time.Second)
	if err != nil {
		return err
	}
	defer b.Close()
	req := budget.Request{Domains: []budget.Domain{{Version: 1, ID: "a"}}, Class: budget.OpGet, Consumer: "holder"}

	handoff := func(n int, one func(context.Context) (time.Duration, error)) func(context.Context) (Round, error) {
		return func(ctx context.Context) (Round, error) {
			lat := make([]time.Duration, 0, n)
			for range n {
				d, err := one(ctx)
				if err != nil {
					return Round{}, err
				}
				lat = append(lat, d)
			}
			return latencyRound(lat, 0), nil
		}
	}
	since := func(t0 time.Time, m msg) time.Duration { return time.Unix(0, m.T).Sub(t0) }

	pubsubOne := func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		if err := c.Publish(ctx, ch, "w").Err(); err != nil {
			return 0, err
		}
		m, err := sub.recv(ctx)
		return since(t0, m), err
	}
	blpopOne := func(ctx context.Context) (time.Duration, error) {
		if err := pop.send(msg{Op: "arm"}); err != nil {
			return 0, err
		}
		// Push only once the worker is blocked, or the pop would not wait.
		if err := until(ctx, func() (bool, error) {
			v, err := infoField(ctx, e.admin, "clients", "blocked_clients")
			return v != "0", err
		}); err != nil {
			return 0, err
		}
		t0 := time.Now()
		if err := c.LPush(ctx, list, "w").Err(); err != nil {
			return 0, err
		}
		m, err := pop.recv(ctx)
		return since(t0, m), err
	}
	// The releasing script grants the waiter itself and says so in the wake
	// message, so the handoff is one script call plus one message. Release
	// returns once that call has its reply, so its own duration, kept
	// beside the handoff's, splits the handoff into the script's round trip
	// and what follows it (the message, the waiter's dispatch).
	var released []time.Duration
	budgetOne := func(ctx context.Context) (time.Duration, error) {
		l, err := b.Acquire(ctx, req)
		if err != nil {
			return 0, err
		}
		if err := waiter.send(msg{Op: "arm"}); err != nil {
			return 0, err
		}
		// Release only once the other process waits in line.
		if err := until(ctx, func() (bool, error) {
			u, err := b.Usage(ctx)
			return u.Waiters == 1, err
		}); err != nil {
			return 0, err
		}
		t0 := time.Now()
		l.Release()
		released = append(released, time.Since(t0))
		m, err := waiter.recv(ctx)
		return since(t0, m), err
	}
	// Warm up all three paths.
	for _, one := range []func(context.Context) (time.Duration, error){pubsubOne, blpopOne, budgetOne} {
		for range 5 {
			if _, err := one(ctx); err != nil {
				return err
			}
		}
	}
	fPub := e.figure(sectionFloors, "floor.wake.pubsub", "wake floor: bare pub/sub handoff, 2 processes", "µs", true)
	fPop := e.figure(sectionFloors, "floor.wake.blpop", "wake floor: bare BLPOP handoff, 2 processes", "µs", true)
	s := "P2 release to wake, 2 processes"
	fRB := e.figure(s, "p2.handoff", "Release in one process to Acquire returning in another", "µs", true)
	fRel := e.figure(s, "p2.release", "of which Release returning (the handing-off retire's round trip)", "µs", true)
	n := e.sz.wakes
	if err := e.rounds(ctx,
		into(fPub, handoff(n, pubsubOne)),
		func(ctx context.Context) error {
			released = released[:0]
			r, err := handoff(n, budgetOne)(ctx)
			if err != nil {
				return err
			}
			fRB.add(r)
			fRel.add(latencyRound(released, 0))
			return nil
		},
		into(fPop, handoff(n, blpopOne)),
	); err != nil {
		return err
	}
	e.target(perRound("P2a", "release-to-wake p50 / bare pub/sub handoff p50", "x", "<=", 2, ratios(fRB, fPub, p50)))
	e.target(perRound("P2b", "release-to-wake p99 / bare pub/sub handoff p99", "x", "<=", 3, ratios(fRB, fPub, p99)))
	return nil
}

// until polls cond until it holds. The other side is another process, so
// no event of ours can announce its state; the poll stops before the timed
// part begins.
func until(ctx context.Context, cond func() (bool, error)) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("condition not reached within 10s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Microsecond):
		}
	}
}
