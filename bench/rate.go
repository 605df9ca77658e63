package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/redisstore"
)

// P8's budget: 200 starts per second, bucket of 20 (a tenth of a second's
// worth, tighter than the default of one second's worth, so the window
// check bites on short windows too).
const (
	p8Rate  = 200
	p8Burst = 20
)

// p8: 64 lanes over 4 processes draw on one rate-limited domain for a
// while. Every lane keeps its leases until the end, so the budget itself
// still holds the Redis TIME of every grant (Inspect reports each lease's
// age at one instant of Redis time); those grant times are checked against
// the token bucket's bound in every window, and their count against what
// the bound allows over the whole run.
func p8(ctx context.Context, e *env) error {
	name := e.name("p8")
	lim := budget.Limits{RequestsPerSecond: p8Rate, Burst: p8Burst}
	lanes, err := startCrew(ctx, hosts, "rate-host", workerSpec{Role: "lanes", Redis: e.url, Budget: name, Limits: lim,
		Domain: "a", LeaseTTL: 15 * time.Second})
	if err != nil {
		return err
	}
	defer lanes.close()
	admin, err := redisstore.NewAdmin(e.admin)
	if err != nil {
		return err
	}
	run := e.sz.p8Run
	s := fmt.Sprintf("P8 rate accuracy, %d/s (burst %d) for %v, 64 lanes over 4 processes", p8Rate, p8Burst, run)
	fStarts := e.figure(s, "p8.starts", "starts in the run", "starts", false)
	fUtil := e.figure(s, "p8.util", "utilisation: starts / (burst + rate x run)", "%", false)
	fServer := e.figure(s, "p8.excess.server", "worst window: starts beyond burst + rate x t (Redis grant times)", "starts", false)
	fOver := e.figure(s, "p8.over.server", "windows beyond the bound (Redis grant times)", "windows", false)
	fClient := e.figure(s, "p8.excess.client", "worst window: starts beyond the bound (as the lanes saw them)", "starts", false)
	err = e.rounds(ctx, func(ctx context.Context) error {
		// The bound assumes a full bucket at the start: give the previous
		// round's bucket time to refill (burst/rate), with room to spare.
		time.Sleep(time.Duration(1.5 * p8Burst / p8Rate * float64(time.Second)))
		start, err := e.admin.Time(ctx).Result()
		if err != nil {
			return err
		}
		for _, w := range lanes {
			if err := w.send(msg{Op: "go", Lanes: 64 / hosts, Keep: true}); err != nil {
				return err
			}
		}
		for _, w := range lanes {
			if _, err := w.recv(ctx); err != nil {
				return err
			}
		}
		time.Sleep(run)
		end, err := e.admin.Time(ctx).Result()
		if err != nil {
			return err
		}
		stopped, err := lanes.each(ctx, msg{Op: "stop"})
		if err != nil {
			return err
		}
		defer lanes.each(context.WithoutCancel(ctx), msg{Op: "release"})
		in, err := admin.Inspect(ctx, name, 1_000_000)
		if err != nil {
			return err
		}
		if in.Truncated {
			return fmt.Errorf("inspect truncated the leases")
		}
		secs := func(t time.Time) float64 { return float64(t.Sub(start).Microseconds()) / 1e6 }
		var server, client []float64
		for _, l := range in.Leases {
			if g := in.Now.Add(-l.Age); !g.After(end) && !g.Before(start) {
				server = append(server, secs(g))
			}
		}
		for _, m := range stopped {
			for _, t := range m.Times {
				if g := time.Unix(0, t); !g.After(end) && !g.Before(start) {
					client = append(client, secs(g))
				}
			}
		}
		slices.Sort(server)
		slices.Sort(client)
		span := secs(end)
		worst, over := windowExcess(server, p8Burst, p8Rate, 1e-6)
		cworst, _ := windowExcess(client, p8Burst, p8Rate, 1e-6)
		fStarts.add(Round{V: float64(len(server))})
		fUtil.add(Round{V: 100 * float64(len(server)) / (p8Burst + p8Rate*span)})
		fServer.add(Round{V: worst})
		fOver.add(Round{V: float64(over)})
		fClient.add(Round{V: cworst})
		return nil
	})
	if err != nil {
		return err
	}
	e.target(perRound("P8a", "windows with more starts than burst + rate x t (Redis grant times)", "", "==", 0, values(fOver)))
	e.target(perRound("P8b", "utilisation of the allowed starts", "%", ">=", 97, values(fUtil)))
	return nil
}
