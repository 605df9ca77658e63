package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
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
// TTL/3. Two budgets run side by side, each in a process of its own (its
// own store and client): one holding hbLeases leases, one holding
// hbFewLeases. Each measured window is one renewal interval, placed
// between two beats of the large budget, so it holds one of its beats and
// usually one of the small one's, which beats at its own phase; nothing
// else runs. The server time of each beat comes from SLOWLOG (every
// command logged for the window), which names the budget's config key, so
// the beats of the two budgets are told apart within one window: P5b is
// the ratio of their medians, round by round, a round being hbWindows
// windows, or up to three more until each budget has beaten in it. On a
// Redis the bench did not start (no CONFIG SET), only the large budget
// runs, measured by INFO commandstats, and P5b is skipped.
func p5(ctx context.Context, e *env) error {
	_, _, functions := luascripts.Library()
	sha, fn := redis.NewScript(luascripts.Source("heartbeat")).Hash(), functions["heartbeat"]
	lim := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1 << 20}}
	ttl := e.sz.hbTTL
	interval := ttl / 3
	type population struct {
		n     int
		cfg   string // the budget's config key, as SLOWLOG shows it
		watch *beatWatch
	}
	counts := []int{e.sz.hbLeases}
	if e.own {
		counts = append(counts, e.sz.hbFewLeases)
	}
	var pops []*population
	for _, n := range counts {
		name := fmt.Sprintf("p5-%d", n)
		watch := &beatWatch{sha: sha, fn: fn, done: make(chan struct{}, 1)}
		c := e.client(64)
		c.AddHook(watch)
		b, _, err := e.openBudget(c, name, lim, ttl)
		if err != nil {
			return err
		}
		defer b.Close()
		held, err := acquireMany(ctx, b, n, func(i int) budget.Request {
			return budget.Request{Domains: []budget.Domain{{Version: 1, ID: "p5"}}, Class: budget.OpGet, Consumer: "p5"}
		})
		defer releaseAll(held)
		if err != nil {
			return err
		}
		pops = append(pops, &population{n: n, cfg: "rb:{" + hex.EncodeToString([]byte(e.name(name))) + "}:cfg", watch: watch})
	}
	big := pops[0]
	// Line up on the large budget's beat: wait for one to finish, then open
	// windows half an interval later, each one interval long.
	for len(big.watch.done) > 0 {
		<-big.watch.done
	}
	select {
	case <-big.watch.done:
	case <-time.After(5 * interval):
		return fmt.Errorf("no heartbeat within %v, with an interval of %v", 5*interval, interval)
	case <-ctx.Done():
		return ctx.Err()
	}
	time.Sleep(interval / 2)

	s := fmt.Sprintf("P5 heartbeats, %d leases in one process, lease TTL %v", big.n, ttl)
	fCalls := e.figure(s, "p5.calls", "Redis calls per renewal interval", "calls", false)
	fServer := e.figure(s, "p5.server", "server µs per beat", "µs", false)
	fPerLease := e.figure(s, "p5.perlease", "server µs per lease renewed", "µs", false)
	fClient := e.figure(s, "p5.client", "client time per beat (call sent to reply)", "µs", false)
	var fFewServer, fFewClient *Figure
	if len(pops) > 1 {
		few := pops[1]
		sf := fmt.Sprintf("P5 heartbeats, %d leases in one process, lease TTL %v (beside the %d)", few.n, ttl, big.n)
		fFewServer = e.figure(sf, "p5.few.server", "server µs per beat", "µs", false)
		fFewClient = e.figure(sf, "p5.few.client", "client time per beat (call sent to reply)", "µs", false)
	}
	clientTime := func(p *population, mark *int, f *Figure) {
		took := p.watch.since(*mark)
		*mark += len(took)
		var sum time.Duration
		for _, t := range took {
			sum += t
		}
		if len(took) > 0 {
			f.add(Round{V: us(sum) / float64(len(took))})
		}
	}
	marks := make([]int, len(pops))
	for i, p := range pops {
		marks[i] = p.watch.count()
	}
	if !e.own {
		e.note("P5b needs SLOWLOG with CONFIG SET, done only on the bench's own redis-server: only the large budget was measured, by INFO commandstats")
		prev, err := commandStats(ctx, e.admin)
		if err != nil {
			return err
		}
		next := time.Now()
		for range e.sz.rounds {
			next = next.Add(interval)
			time.Sleep(time.Until(next))
			cur, err := commandStats(ctx, e.admin)
			if err != nil {
				return err
			}
			sc := cur.since(prev).scripts()
			prev = cur
			fCalls.add(Round{V: float64(sc.Calls)})
			if sc.Calls > 0 {
				fServer.add(Round{V: float64(sc.Usec) / float64(sc.Calls)})
				fPerLease.add(Round{V: float64(sc.Usec) / float64(big.n)})
			}
			clientTime(big, &marks[0], fClient)
		}
		e.target(perRound("P5", fmt.Sprintf("heartbeat calls per interval, %d leases", big.n), "", "<=", 1, values(fCalls)))
		e.target(perRound("P5b", fmt.Sprintf("heartbeat server µs per beat, %d leases / %d leases", e.sz.hbLeases, e.sz.hbFewLeases), "x", "<=", 1.5, nil))
		return nil
	}
	restore, err := e.logEveryCommand(ctx)
	if err != nil {
		return err
	}
	defer restore()
	// A round is hbWindows intervals (a few more where needed, below),
	// and its server time per beat the median of its beats: on a shared
	// machine one beat in a few lands on a moment when Redis is
	// descheduled, and a beat of tens of µs then takes hundreds.
	middle := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return us(quantile(s, 0.5))
	}
	next := time.Now()
	for range e.sz.rounds {
		var calls, few []time.Duration
		// A round goes on for up to three more windows until each budget
		// has beaten in it: the windows follow the large budget's beat,
		// the small one beats at its own phase, and on a loaded machine a
		// beat near a window's edge slips into the next one.
		windows := 0
		for windows < e.sz.hbWindows || windows < e.sz.hbWindows+3 && (len(calls) == 0 || len(few) == 0) {
			windows++
			next = next.Add(interval)
			time.Sleep(time.Until(next))
			byKey, err := e.drainSlowlog(ctx, sha, fn)
			if err != nil {
				return err
			}
			calls = append(calls, byKey[big.cfg]...)
			few = append(few, byKey[pops[1].cfg]...)
		}
		fCalls.add(Round{V: float64(len(calls)) / float64(windows)})
		if len(calls) > 0 {
			fServer.add(Round{V: middle(calls), N: len(calls)})
			fPerLease.add(Round{V: middle(calls) / float64(big.n)})
		}
		clientTime(big, &marks[0], fClient)
		if len(few) > 0 {
			fFewServer.add(Round{V: middle(few), N: len(few)})
		}
		clientTime(pops[1], &marks[1], fFewClient)
	}
	e.target(perRound("P5", fmt.Sprintf("heartbeat calls per interval, %d leases", big.n), "", "<=", 1, values(fCalls)))
	e.target(perRound("P5b", fmt.Sprintf("heartbeat server µs per beat, %d leases / %d leases (SLOWLOG, side by side)", big.n, pops[1].n),
		"x", "<=", 1.5, ratios(fServer, fFewServer, p50)))
	return nil
}

// logEveryCommand makes SLOWLOG keep every command (with room for a window
// of them) until the returned function puts the old settings back.
func (e *env) logEveryCommand(ctx context.Context) (restore func(), err error) {
	old, err := e.admin.ConfigGet(ctx, "slowlog-*").Result()
	if err != nil {
		return nil, err
	}
	if err := e.admin.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		return nil, err
	}
	if err := e.admin.ConfigSet(ctx, "slowlog-max-len", "100000").Err(); err != nil {
		return nil, err
	}
	if err := e.admin.SlowLogReset(ctx).Err(); err != nil {
		return nil, err
	}
	return func() {
		bg := context.WithoutCancel(ctx)
		for _, k := range []string{"slowlog-log-slower-than", "slowlog-max-len"} {
			if v, ok := old[k]; ok {
				e.admin.ConfigSet(bg, k, v)
			}
		}
	}, nil
}

// drainSlowlog takes every logged call of the script with the given SHA
// (EVALSHA) or function name (FCALL) out of SLOWLOG, by the key it was
// called on, and empties the log.
func (e *env) drainSlowlog(ctx context.Context, sha, fn string) (map[string][]time.Duration, error) {
	logs, err := e.admin.SlowLogGet(ctx, -1).Result()
	if err != nil {
		return nil, err
	}
	if err := e.admin.SlowLogReset(ctx).Err(); err != nil {
		return nil, err
	}
	out := map[string][]time.Duration{}
	for _, l := range logs {
		if len(l.Args) >= 4 && (strings.EqualFold(l.Args[0], "evalsha") && l.Args[1] == sha ||
			strings.EqualFold(l.Args[0], "fcall") && l.Args[1] == fn) {
			out[l.Args[3]] = append(out[l.Args[3]], l.Duration)
		}
	}
	return out, nil
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
