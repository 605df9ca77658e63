package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/luascripts"
)

// beatWatch is a go-redis hook that times the heartbeat script's calls,
// sent by EVALSHA (sha) or FCALL (fn).
type beatWatch struct {
	sha  string
	fn   string
	mu   sync.Mutex
	took []time.Duration
	done chan struct{} // receives after each heartbeat call
}

func (h *beatWatch) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *beatWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *beatWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) < 2 || (args[1] != h.sha && args[1] != h.fn) {
			return next(ctx, cmd)
		}
		t0 := time.Now()
		err := next(ctx, cmd)
		h.mu.Lock()
		h.took = append(h.took, time.Since(t0))
		h.mu.Unlock()
		select {
		case h.done <- struct{}{}:
		default:
		}
		return err
	}
}

func (h *beatWatch) since(i int) []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Duration(nil), h.took[min(i, len(h.took)):]...)
}

func (h *beatWatch) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.took)
}

// p5: one process holds many leases, and its keeper renews them every
// TTL/3. Each measured window is one renewal interval, placed between two
// beats, so it holds exactly the calls of one beat; nothing else runs.
func p5(ctx context.Context, e *env) error {
	_, _, functions := luascripts.Library()
	watch := &beatWatch{sha: redis.NewScript(luascripts.Source("heartbeat")).Hash(), fn: functions["heartbeat"], done: make(chan struct{}, 1)}
	c := e.client(64)
	c.AddHook(watch)
	lim := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1 << 20}}
	ttl := e.sz.hbTTL
	b, _, err := e.openBudget(c, "p5", lim, ttl)
	if err != nil {
		return err
	}
	defer b.Close()
	n := e.sz.hbLeases
	held, err := acquireMany(ctx, b, n, func(i int) budget.Request {
		return budget.Request{Domains: []budget.Domain{{Version: 1, ID: "p5"}}, Class: budget.OpGet, Consumer: "p5"}
	})
	defer releaseAll(held)
	if err != nil {
		return err
	}
	interval := ttl / 3
	// Line up on the beat: wait for one to finish, then open windows half an
	// interval later, each one interval long.
	for len(watch.done) > 0 {
		<-watch.done
	}
	select {
	case <-watch.done:
	case <-time.After(5 * interval):
		return fmt.Errorf("no heartbeat within %v, with an interval of %v", 5*interval, interval)
	case <-ctx.Done():
		return ctx.Err()
	}
	time.Sleep(interval / 2)

	s := fmt.Sprintf("P5 heartbeats, %d leases in one process, lease TTL %v", n, ttl)
	fCalls := e.figure(s, "p5.calls", "Redis calls per renewal interval", "calls", false)
	fServer := e.figure(s, "p5.server", "server µs per beat", "µs", false)
	fPerLease := e.figure(s, "p5.perlease", "server µs per lease renewed", "µs", false)
	fClient := e.figure(s, "p5.client", "client time per beat (call sent to reply)", "µs", false)
	prev, err := commandStats(ctx, e.admin)
	if err != nil {
		return err
	}
	mark := watch.count()
	next := time.Now()
	for range e.sz.rounds {
		next = next.Add(interval)
		time.Sleep(time.Until(next))
		cur, err := commandStats(ctx, e.admin)
		if err != nil {
			return err
		}
		d := cur.since(prev)
		prev = cur
		sc := d.scripts()
		fCalls.add(Round{V: float64(sc.Calls)})
		if sc.Calls > 0 {
			fServer.add(Round{V: float64(sc.Usec) / float64(sc.Calls)})
			fPerLease.add(Round{V: float64(sc.Usec) / float64(n)})
		}
		var sum time.Duration
		took := watch.since(mark)
		mark += len(took)
		for _, t := range took {
			sum += t
		}
		if len(took) > 0 {
			fClient.add(Round{V: us(sum) / float64(len(took))})
		}
	}
	e.target(perRound("P5", fmt.Sprintf("heartbeat calls per interval, %d leases", n), "", "<=", 1, values(fCalls)))
	return nil
}

// acquireMany takes n leases from 32 goroutines at once.
func acquireMany(ctx context.Context, b *budget.Budget, n int, req func(i int) budget.Request) ([]*budget.Lease, error) {
	out := make([]*budget.Lease, n)
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n) && failed.Load() == nil; i = next.Add(1) - 1 {
				l, err := b.Acquire(ctx, req(int(i)))
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				out[i] = l
			}
		})
	}
	wg.Wait()
	var held []*budget.Lease
	for _, l := range out {
		if l != nil {
			held = append(held, l)
		}
	}
	if p := failed.Load(); p != nil {
		return held, *p
	}
	return held, nil
}
