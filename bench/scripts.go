package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/admission"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/recpack"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/luascripts"
	"github.com/runbudget/runbudget/redisstore"
)

// serverTime runs op (which must send only script calls of one kind) and
// returns the mean server time per script call from INFO commandstats, and
// the number of calls. Nothing else may use Redis meanwhile; the run is
// sequential here, so nothing does.
func (e *env) serverTime(ctx context.Context, op func(context.Context) error) (usec float64, calls int64, err error) {
	usec, calls, _, err = e.serverMix(ctx, op)
	return usec, calls, err
}

// serverMix is serverTime that also returns what the scripts ran inside
// Redis, per script call, by command.
func (e *env) serverMix(ctx context.Context, op func(context.Context) error) (usec float64, calls int64, mix map[string]float64, err error) {
	before, err := commandStats(ctx, e.admin)
	if err != nil {
		return 0, 0, nil, err
	}
	if err := op(ctx); err != nil {
		return 0, 0, nil, err
	}
	after, err := commandStats(ctx, e.admin)
	if err != nil {
		return 0, 0, nil, err
	}
	d := after.since(before)
	calls = d.scripts().Calls
	if calls > 0 {
		mix = map[string]float64{}
		for k, v := range d {
			if k != "evalsha" && k != "eval" && k != "fcall" {
				mix[k] = float64(v.Calls) / float64(calls)
			}
		}
	}
	return d.usecPerCall(), calls, mix, nil
}

// scriptCosts: the server time of each script, each one run alone so that
// the FCALL (or EVALSHA) line of INFO commandstats, which does not tell
// scripts apart, holds only that script. Reassert cannot run alone (a
// heartbeat triggers it), so its time comes from SLOWLOG, which names the
// function (or SHA) of every call.
func scriptCosts(ctx context.Context, e *env) error {
	c := e.client(8)
	b, s, err := e.openBudget(c, "scripts", roomy, time.Hour)
	if err != nil {
		return err
	}
	defer b.Close()
	one := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
	bq, sq, err := e.openBudget(c, "scripts-queued", one, time.Hour)
	if err != nil {
		return err
	}
	defer bq.Close()
	check, err := redisstore.NewRateCheck(c, e.name("rc:"), admission.RatePolicy{PerSecond: roomyRate, Burst: roomyRate})
	if err != nil {
		return err
	}
	n := e.sz.scriptCalls
	_, _, functions := luascripts.Library()
	renewFn := functions["renew"]
	queuedCfg := "rb:{" + hex.EncodeToString([]byte(e.name("scripts-queued"))) + "}:cfg"
	sec := "scripts: server µs per call (commandstats usec_per_call)"
	var steps []func(context.Context) error
	// The server-side floor and the peer: a script that does nothing, and
	// redis_rate's GCRA script on one key.
	noop := redis.NewScript(noopScript)
	gcra := redis_rate.NewLimiter(c)
	gcraKey := e.name("scripts-gcra")
	gcraLimit := redis_rate.Limit{Rate: roomyRate, Burst: roomyRate, Period: time.Second}
	if err := noop.Load(ctx, c).Err(); err != nil {
		return err
	}
	if _, err := gcra.Allow(ctx, gcraKey, gcraLimit); err != nil {
		return err
	}
	add := func(id, name string, op func(context.Context) error) {
		f := e.figure(sec, "script."+id, name, "µs", false)
		steps = append(steps, func(ctx context.Context) error {
			usec, calls, mix, err := e.serverMix(ctx, op)
			if err != nil {
				return fmt.Errorf("%s: %w", id, err)
			}
			f.add(Round{V: usec, N: int(calls)})
			f.Mix = mix
			return nil
		})
	}
	repeat := func(k int, op func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error {
			for range k {
				if err := op(ctx); err != nil {
					return err
				}
			}
			return nil
		}
	}
	ids := 0
	newID := func() string { ids++; return e.run + "w" + strconv.Itoa(ids) }

	for _, dn := range []int{1, 4} {
		req := request(dn, "scripts")
		nreq, err := req.Normalize()
		if err != nil {
			return err
		}
		for range 3 { // domains exist, scripts loaded
			l, err := b.Acquire(ctx, req)
			if err != nil {
				return err
			}
			l.Release()
		}
		suffix := fmt.Sprintf(", %d domain%s", dn, plural(dn))
		var held []*budget.Lease
		add(fmt.Sprintf("acquire.granted.d%d", dn), "acquire, granted at once"+suffix, repeat(n, func(ctx context.Context) error {
			l, err := b.Acquire(ctx, req)
			held = append(held, l)
			return err
		}))
		add(fmt.Sprintf("retire.d%d", dn), "retire, whole lease"+suffix, func(ctx context.Context) error {
			for _, l := range held {
				l.Release()
			}
			held = held[:0]
			return nil
		})
		// Queued paths: one holder fills the only slot, then waiters arrive,
		// call again (their liveness beat), and give up.
		var holder *budget.Lease
		var waiters []string
		steps = append(steps, func(ctx context.Context) error {
			holder, err = bq.Acquire(ctx, req)
			waiters = waiters[:0]
			return err
		})
		add(fmt.Sprintf("acquire.queued.d%d", dn), "acquire, first call of a waiter that queues"+suffix, repeat(n, func(ctx context.Context) error {
			id := newID()
			waiters = append(waiters, id)
			return expect(sq.TryAcquire(ctx, id, nreq))
		}))
		add(fmt.Sprintf("acquire.again.d%d", dn), "acquire, later call of a queued waiter (liveness)"+suffix, func(ctx context.Context) error {
			for _, id := range waiters {
				if err := expect(sq.TryAcquire(ctx, id, nreq)); err != nil {
					return err
				}
			}
			return nil
		})
		// The store's bulk renewal of its queued waiters (renew.lua), which
		// replaces their liveness calls: one call for up to 64 of them.
		k := min(64, n) // waiters queued by the step above, when it runs
		add(fmt.Sprintf("renew.w64.d%d", dn), fmt.Sprintf("renew, %d queued waiters in one call", k)+suffix, repeat(max(n/10, 1), func(ctx context.Context) error {
			// Each waiter with the session its calls named, as the store
			// sends it: from its queue entry (one GET, not the script's).
			d0 := nreq.Domains[0]
			es, err := recpack.DecodeQueue(c.Get(ctx, strings.TrimSuffix(queuedCfg, "cfg")+fmt.Sprintf("q:%d.%x", d0.Version, d0.ID)).Val())
			var w recpack.Entry
			for _, e := range es {
				if e.ID == waiters[0] {
					w = e
				}
			}
			if err != nil || w.ID == "" {
				return fmt.Errorf("renew: the first waiter's entry: %v", err)
			}
			args := []any{"PUBLISH", strconv.FormatInt((20 * time.Hour).Milliseconds(), 10), "", strconv.FormatInt(time.Hour.Milliseconds(), 10), k}
			for _, id := range waiters[:k] {
				args = append(args, id, w.Session)
			}
			// Their domains, as redisstore encodes them: the script tries
			// whichever of them heads a queue (blocked by the holder).
			args = append(args, len(nreq.Domains))
			for _, d := range nreq.Domains {
				args = append(args, fmt.Sprintf("%d.%x", d.Version, d.ID))
			}
			res, err := c.FCall(ctx, renewFn, []string{queuedCfg}, args...).StringSlice()
			if err == nil && (len(res) != 2 || strings.Trim(res[1], "w") != "") {
				err = fmt.Errorf("renew: %q, want every waiter still queued", res)
			}
			return err
		}))
		add(fmt.Sprintf("cancel.d%d", dn), "cancel, a queued waiter"+suffix, func(ctx context.Context) error {
			for _, id := range waiters {
				if err := sq.Cancel(ctx, id); err != nil {
					return err
				}
			}
			return nil
		})
		// The second half of a contended admission: a release whose
		// handoff grants the head of the queue and publishes the grant
		// (retire, then try_grant for the waiter). A chain of waiters
		// queues behind the holder; the holder's release, then each
		// granted waiter's but the last's, hands the slot on.
		var chain []string
		steps = append(steps, func(ctx context.Context) error {
			chain = chain[:0]
			for range n {
				id := newID()
				chain = append(chain, id)
				if err := expect(sq.TryAcquire(ctx, id, nreq)); err != nil {
					return err
				}
			}
			return nil
		})
		add(fmt.Sprintf("retire.handoff.d%d", dn), "retire, handing the slot to the head waiter"+suffix, func(ctx context.Context) error {
			if err := sq.Retire(ctx, holder.ID(), lease.All); err != nil {
				return err
			}
			for _, id := range chain[:len(chain)-1] {
				if err := sq.Retire(ctx, id, lease.All); err != nil {
					return err
				}
			}
			return nil
		})
		steps = append(steps, func(ctx context.Context) error {
			if err := sq.Retire(ctx, chain[len(chain)-1], lease.All); err != nil {
				return err
			}
			holder.Release() // already retired above: a no-op for the store
			return nil
		})
		// Heartbeats of 1 and of 100 leases.
		var hb []string
		steps = append(steps, func(ctx context.Context) error {
			hb = hb[:0]
			for range 100 {
				l, err := b.Acquire(ctx, req)
				if err != nil {
					return err
				}
				held = append(held, l)
				hb = append(hb, l.ID())
			}
			return nil
		})
		add(fmt.Sprintf("heartbeat.1.d%d", dn), "heartbeat, 1 lease"+suffix, repeat(n, func(ctx context.Context) error {
			_, err := s.Heartbeat(ctx, hb[:1])
			return err
		}))
		add(fmt.Sprintf("heartbeat.100.d%d", dn), "heartbeat, 100 leases"+suffix, repeat(max(n/10, 1), func(ctx context.Context) error {
			_, err := s.Heartbeat(ctx, hb)
			return err
		}))
		steps = append(steps, func(ctx context.Context) error {
			for _, l := range held {
				l.Release()
			}
			held = held[:0]
			return nil
		})
	}
	thr := budget.Domain{Version: 1, ID: "scripts-throttled"}
	add("throttle", "throttle, one domain (coalesced after the first)", repeat(n, func(ctx context.Context) error {
		return b.Throttle(ctx, thr, 0)
	}))
	add("usage", "usage, a budget of 5 domains", repeat(n, func(ctx context.Context) error {
		_, err := b.Usage(ctx)
		return err
	}))
	// What the Budget registered: a store is sent limits without memory,
	// which is each host's own.
	limits := b.Limits()
	limits.MemoryBytes = 0
	add("register", "register, limits already stored", repeat(n, func(ctx context.Context) error {
		return s.Register(ctx, limits, false)
	}))
	add("ratecheck", "ratecheck (NewRateCheck), one key", repeat(n, func(ctx context.Context) error {
		_, err := check(ctx, "k")
		return err
	}))
	add("noop", "no-op script (return 1): the floor", repeat(n, func(ctx context.Context) error {
		return noop.EvalSha(ctx, c, nil).Err()
	}))
	// lib.lua alone: the shared prelude a budget script sent by EVALSHA
	// runs before its own first line (defining every helper, checking the
	// common arguments). In the function library it runs once, at load.
	// The scripts get NCLASS from a line luascripts writes before lib.lua.
	prelude := redis.NewScript(fmt.Sprintf("local NCLASS = %d\n", budget.NumClasses) + luascripts.Source("lib") +
		"\nbegin(KEYS, ARGV)\nreturn 1\n")
	preludeKeys := []string{"rb:{" + fmt.Sprintf("%x", e.name("prelude")) + "}:cfg"}
	add("prelude", "lib.lua prelude alone, by EVALSHA (a library runs it once, at load)", repeat(n, func(ctx context.Context) error {
		return prelude.Run(ctx, c, preludeKeys, "PUBLISH", "300000", "").Err() // "": Redis TIME
	}))
	// The library's own floor: a function that returns 1, called by FCALL.
	if err := e.admin.FunctionLoad(ctx, noopLibrary).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
		return err
	}
	defer e.admin.FunctionDelete(context.WithoutCancel(ctx), noopLibraryName)
	add("noop-fcall", "no-op function (FCALL, return 1): the library's floor", repeat(n, func(ctx context.Context) error {
		return c.FCall(ctx, noopLibraryName, nil).Err()
	}))
	add("redis_rate", "redis_rate Allow (GCRA), one key: the peer", repeat(n, func(ctx context.Context) error {
		_, err := gcra.Allow(ctx, gcraKey, gcraLimit)
		return err
	}))
	if err := e.rounds(ctx, func(ctx context.Context) error {
		// One round of every step, in order: they depend on each other.
		for _, st := range steps {
			if err := st(ctx); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	return e.reassertCost(ctx, c)
}

// expect checks that a TryAcquire queued.
func expect(a budget.Attempt, err error) error {
	if err != nil {
		return err
	}
	if a.Outcome != budget.Queued {
		return fmt.Errorf("acquire: %v, want queued", a.Outcome)
	}
	return nil
}

// reassertCost measures the reassert script, which runs when a heartbeat
// finds that the budget's epoch changed (Redis lost its state and a host
// re-created it). The bench changes the epoch field of the budget's config
// hash to force that path, on a budget of its own: a reassert quarantines
// its budget for one lease TTL.
func (e *env) reassertCost(ctx context.Context, c *redis.Client) error {
	if !e.own {
		e.note("reassert's server time needs SLOWLOG with CONFIG SET, done only on the bench's own redis-server")
		return nil
	}
	sha := redis.NewScript(luascripts.Source("reassert")).Hash()
	_, _, functions := luascripts.Library()
	fn := functions["reassert"]
	sec := "scripts: server µs per call (commandstats usec_per_call)"
	for _, dn := range []int{1, 4} {
		for _, k := range []int{1, 100} {
			name := fmt.Sprintf("reassert-%d-%d", dn, k)
			b, s, err := e.openBudget(c, name, roomy, time.Hour)
			if err != nil {
				return err
			}
			req := request(dn, "scripts")
			var held []*budget.Lease
			var ids []string
			for range k {
				l, err := b.Acquire(ctx, req)
				if err != nil {
					b.Close()
					return err
				}
				held, ids = append(held, l), append(ids, l.ID())
			}
			cfg := "rb:{" + fmt.Sprintf("%x", e.name(name)) + "}:cfg"
			f := e.figure(sec, fmt.Sprintf("script.reassert.%d.d%d", k, dn),
				fmt.Sprintf("reassert, %d lease%s, %d domain%s (SLOWLOG)", k, plural(k), dn, plural(dn)), "µs", false)
			epoch := 0
			for range e.sz.rounds {
				var durs []time.Duration
				err := e.slowlog(ctx, sha, fn, &durs, func(ctx context.Context) error {
					for range max(e.sz.scriptCalls/10, 3) {
						epoch++
						if err := e.admin.HSet(ctx, cfg, "epoch", strconv.Itoa(epoch)).Err(); err != nil {
							return err
						}
						if _, err := s.Heartbeat(ctx, ids); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Close()
					return err
				}
				if len(durs) == 0 {
					b.Close()
					return fmt.Errorf("reassert never ran: the forced epoch change did not trigger it")
				}
				var sum time.Duration
				for _, d := range durs {
					sum += d
				}
				f.add(Round{V: us(sum) / float64(len(durs)), N: len(durs)})
			}
			for _, l := range held {
				l.Release()
			}
			b.Close()
		}
	}
	return nil
}

// slowlog runs op with every command logged, and appends the durations of
// the logged calls of the script with the given SHA (EVALSHA) or function
// name (FCALL) to durs.
func (e *env) slowlog(ctx context.Context, sha, fn string, durs *[]time.Duration, op func(context.Context) error) error {
	old, err := e.admin.ConfigGet(ctx, "slowlog-log-slower-than").Result()
	if err != nil {
		return err
	}
	if err := e.admin.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		return err
	}
	defer e.admin.ConfigSet(context.WithoutCancel(ctx), "slowlog-log-slower-than", old["slowlog-log-slower-than"])
	if err := e.admin.SlowLogReset(ctx).Err(); err != nil {
		return err
	}
	if err := op(ctx); err != nil {
		return err
	}
	logs, err := e.admin.SlowLogGet(ctx, -1).Result()
	if err != nil {
		return err
	}
	for _, l := range logs {
		if len(l.Args) >= 2 && (strings.EqualFold(l.Args[0], "evalsha") && l.Args[1] == sha ||
			strings.EqualFold(l.Args[0], "fcall") && l.Args[1] == fn) {
			*durs = append(*durs, l.Duration)
		}
	}
	return nil
}

// noopLibrary holds one function that returns 1: FCALL's own floor.
const (
	noopLibraryName = "runbudget_bench_noop"
	noopLibrary     = "#!lua name=" + noopLibraryName + "\nredis.register_function('" + noopLibraryName + "', function() return 1 end)\n"
)
