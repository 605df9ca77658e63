package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runbudget/runbudget/budget"
)

// budgetKeys is the pattern of every key of the budget called name (see
// redisstore's package doc: "rb:{<hex of name>}:...").
func (e *env) budgetKeys(name string) string {
	return "rb:{" + fmt.Sprintf("%x", e.name(name)) + "}:*"
}

// scale: what a domain, a held lease and a queued waiter occupy in Redis
// (MEMORY USAGE summed over the budget's keys, before and after), and how
// the cost of an admission moves as the budget grows from 1 to 10,000
// domains.
func scale(ctx context.Context, e *env) error {
	if err := e.memory(ctx); err != nil {
		return err
	}
	return e.domainCount(ctx)
}

func (e *env) memory(ctx context.Context) error {
	c := e.client(64)
	n := e.sz.memItems
	s := "scale: Redis memory (MEMORY USAGE over the budget's keys)"
	// measureOnce gives the growth of the budget's keys per item, over n
	// items added by grow. MEMORY USAGE is exact and the state the same each
	// time, so one measurement is enough.
	measureOnce := func(name string, grow func() error) (float64, error) {
		before, _, err := keysMemory(ctx, e.admin, e.budgetKeys(name))
		if err != nil {
			return 0, err
		}
		if err := grow(); err != nil {
			return 0, err
		}
		after, _, err := keysMemory(ctx, e.admin, e.budgetKeys(name))
		if err != nil {
			return 0, err
		}
		return float64(after-before) / float64(n), nil
	}
	add := func(id, name string, v float64) {
		f := e.figure(s, "mem."+id, name, "bytes", false)
		f.add(Round{V: v})
		f.Note = "measured once: exact"
	}

	// Domains: each touched once by an Acquire and a Release.
	b, _, err := e.openBudget(c, "mem-d", roomy, time.Hour)
	if err != nil {
		return err
	}
	v, err := measureOnce("mem-d", func() error {
		return touchDomains(ctx, b, "m", 0, n)
	})
	b.Close()
	if err != nil {
		return err
	}
	add("domain", fmt.Sprintf("per domain (after %d domains touched once)", n), v)

	for _, dn := range []int{1, 4} {
		req := request(dn, "mem")
		suffix := fmt.Sprintf(", %d domain%s each", dn, plural(dn))
		// Held leases.
		name := fmt.Sprintf("mem-l%d", dn)
		b, _, err := e.openBudget(c, name, roomy, time.Hour)
		if err != nil {
			return err
		}
		if err := touch(ctx, b, req); err != nil {
			b.Close()
			return err
		}
		var held []*budget.Lease
		v, err := measureOnce(name, func() error {
			held, err = acquireMany(ctx, b, n, func(int) budget.Request { return req })
			return err
		})
		releaseAll(held)
		b.Close()
		if err != nil {
			return err
		}
		add(fmt.Sprintf("lease.d%d", dn), fmt.Sprintf("per held lease (%d held)%s", n, suffix), v)

		// Queued waiters: behind one holder of the only slot, placed by the
		// store directly (a blocked Acquire would need a goroutine each).
		name = fmt.Sprintf("mem-w%d", dn)
		one := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
		b, st, err := e.openBudget(c, name, one, time.Hour)
		if err != nil {
			return err
		}
		holder, err := b.Acquire(ctx, req)
		if err != nil {
			b.Close()
			return err
		}
		nreq, _ := req.Normalize()
		var ids []string
		v, err = measureOnce(name, func() error {
			for i := range n {
				id := e.run + "mw" + strconv.Itoa(dn) + "." + strconv.Itoa(i)
				if err := expect(st.TryAcquire(ctx, id, nreq)); err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		})
		for _, id := range ids {
			st.Cancel(ctx, id)
		}
		holder.Release()
		b.Close()
		if err != nil {
			return err
		}
		add(fmt.Sprintf("waiter.d%d", dn), fmt.Sprintf("per queued waiter (%d queued)%s", n, suffix), v)
	}
	return nil
}

// touch makes the domains of req exist.
func touch(ctx context.Context, b *budget.Budget, req budget.Request) error {
	l, err := b.Acquire(ctx, req)
	if err != nil {
		return err
	}
	l.Release()
	return nil
}

// touchDomains creates domains prefix-from .. prefix-(to-1) with one
// Acquire and Release each, from 32 goroutines.
func touchDomains(ctx context.Context, b *budget.Budget, prefix string, from, to int) error {
	var next atomic.Int64
	next.Store(int64(from))
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(to) && failed.Load() == nil; i = next.Add(1) - 1 {
				req := budget.Request{Domains: []budget.Domain{{Version: 1, ID: prefix + "-" + strconv.FormatInt(i, 10)}}, Class: budget.OpGet}
				if err := touch(ctx, b, req); err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		return *p
	}
	return nil
}

// domainCount: one budget per size, each filled with that many domains;
// in every round each is measured in turn on one hot domain: the server
// time of its acquire script, and the client's Acquire latency.
func (e *env) domainCount(ctx context.Context) error {
	c := e.client(64)
	s := "scale: admission cost against domains in the budget"
	type level struct {
		b       *budget.Budget
		server  *Figure
		latency *Figure
	}
	var levels []level
	defer func() {
		for _, l := range levels {
			l.b.Close()
		}
	}()
	req := budget.Request{Domains: []budget.Domain{{Version: 1, ID: "hot"}}, Class: budget.OpGet, OpensBody: true, MemoryBytes: 1 << 10}
	for _, d := range e.sz.scaleDomains {
		b, _, err := e.openBudget(c, fmt.Sprintf("domains-%d", d), roomy, time.Hour)
		if err != nil {
			return err
		}
		levels = append(levels, level{b: b,
			server:  e.figure(s, fmt.Sprintf("scale.acquire.server.%d", d), fmt.Sprintf("acquire script, server µs, %d domains", d), "µs", false),
			latency: e.figure(s, fmt.Sprintf("scale.acquire.client.%d", d), fmt.Sprintf("Acquire, client latency, %d domains", d), "µs", true),
		})
		if err := touch(ctx, b, req); err != nil {
			return err
		}
		t0 := time.Now()
		if err := touchDomains(ctx, b, "x", 1, d); err != nil {
			return err
		}
		e.logf("scale: %d domains in %v", d, time.Since(t0).Round(time.Millisecond))
	}
	var steps []func(context.Context) error
	for _, l := range levels {
		steps = append(steps, func(ctx context.Context) error {
			held := make([]*budget.Lease, 0, e.sz.p1Calls)
			var r Round
			usec, _, err := e.serverTime(ctx, func(ctx context.Context) error {
				var err error
				r, err = measure(ctx, 1, e.sz.p1Calls, func(ctx context.Context) error {
					lease, err := l.b.Acquire(ctx, req)
					if err == nil {
						held = append(held, lease)
					}
					return err
				})
				return err
			})
			for _, h := range held {
				h.Release()
			}
			if err != nil {
				return err
			}
			l.server.add(Round{V: usec})
			l.latency.add(r)
			return nil
		})
	}
	if err := e.rounds(ctx, steps...); err != nil {
		return err
	}
	first, last := levels[0], levels[len(levels)-1]
	e.target(perRound("scale", fmt.Sprintf("acquire server µs with %d domains / with %d", e.sz.scaleDomains[len(levels)-1], e.sz.scaleDomains[0]),
		"x", "<=", 1.25, ratios(last.server, first.server, p50)))
	return nil
}
