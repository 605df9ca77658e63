package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
// (MEMORY USAGE summed over the budget's keys, before and after), how the
// cost of an admission moves as the budget grows from 1 to 10,000 domains,
// and how admissions spread over a Cluster's masters as a budget is split
// into 1, 4 and 16 shard groups.
func scale(ctx context.Context, e *env) error {
	if err := e.memory(ctx); err != nil {
		return err
	}
	if err := e.domainCount(ctx); err != nil {
		return err
	}
	return e.shardGroups(ctx)
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

// The Cluster run of the scale section.
const (
	shardMasters = 3
	shardLanes   = 64 // over hosts (4) worker processes
	// shardDomains is the number of domains of every configuration, spread
	// evenly over its groups, each with room for shardCeiling requests at
	// once: 64 lanes on 32 slots, so at any moment at least half of the
	// lanes hold none and lanes queue, and every configuration has the same
	// domains and ceilings, only grouped differently.
	shardDomains = 32
	shardCeiling = 1
)

// groupCfgKey is the config key of shard group key of the budget called
// name, "rb:{<hex name>.<hex key>}:cfg" (redisstore's groups.go): the key
// every script call of the group names first, so its slot is the group's.
func groupCfgKey(name, key string) string {
	return "rb:{" + hex.EncodeToString([]byte(name)) + "." + hex.EncodeToString([]byte(key)) + "}:cfg"
}

// shardConfig is one configuration of the Cluster run, and its figures.
type shardConfig struct {
	spec   shardBudget
	master []int // of each group
	held   []int // groups on each master

	rate, cpu, sys, script, busy, capacity, calls, cmds, mismatch, errors *Figure
	vswitch, iswitch                                                      *Figure   // nil where not known
	adm, ran, mcpu                                                        []*Figure // per master
}

// shardGroups: admissions/s of 64 lanes over 4 processes on a local
// 3-master Cluster, with the budget's 32 domains in 1, 4 and 16 shard
// groups, each lane drawing a random domain for every admission; the
// Redis CPU each master spends per admission; and the proof that every
// script call ran on the master of its group: per master, the script calls
// it ran (commandstats) equal the calls the clients sent to keys in its
// slots (counted by a hook, by first key), and no master answered a call
// with an error (errorstats: MOVED, ASK, CROSSSLOT, a script reaching for a
// key of another slot). The window is cut at pauses, when no lane is inside
// an admission and no script call is in flight, so the two counts are
// exact.
//
// On a machine with fewer cores than masters plus clients, admissions/s
// cannot grow with the masters. What shows that the work splits is the
// work per admission summed over the masters as groups are added (script
// calls, Redis commands, Redis CPU), and the admissions per CPU-second of
// the busiest master: where a run with a core per master would stop. CPU
// per admission also depends on how the masters share the cores, so the
// event loops' context switches (Linux) are counted beside it.
func (e *env) shardGroups(ctx context.Context) error {
	flat := fmt.Sprintf("Redis CPU per admission summed over masters, %d groups / %d", slices.Max(e.sz.shardGroups), slices.Min(e.sz.shardGroups))
	targets := []*Target{
		{ID: "Scale.cpu_flat", Claim: flat, Unit: "x", Op: "<=", Limit: 1.25},
		{ID: "Scale.cmds_flat", Claim: fmt.Sprintf("Redis commands per admission (inside scripts included), %d groups / %d", slices.Max(e.sz.shardGroups), slices.Min(e.sz.shardGroups)),
			Unit: "x", Op: "<=", Limit: 1.25},
		{ID: "Scale.local", Claim: "script calls a master ran that were not sent to a key in its slots (all configurations)", Op: "==", Limit: 0},
		{ID: "Scale.errors", Claim: "calls refused for their slot (MOVED, ASK, CROSSSLOT, ...), script calls refused or failed (all configurations)", Op: "==", Limit: 0},
	}
	if e.bin == "" {
		for _, t := range targets {
			t.Skipped, t.Note = true, "no redis-server binary to start a Cluster with"
			e.target(t)
		}
		e.note("scale: no redis-server binary to start a Cluster with; shard groups not measured")
		return nil
	}
	t0 := time.Now()
	cl, err := startCluster(ctx, e.bin, shardMasters)
	if err != nil {
		return fmt.Errorf("starting a Cluster: %w", err)
	}
	defer cl.stop()
	if err := cl.checkErrorCounting(ctx); err != nil {
		return err
	}
	e.logf("scale: a %d-master Cluster formed in %v", shardMasters, time.Since(t0).Round(time.Millisecond))

	s := fmt.Sprintf("scale: shard groups on a %d-master Cluster, %d lanes over %d processes, %d domains of %d slot%s each",
		shardMasters, shardLanes, hosts, shardDomains, shardCeiling, plural(shardCeiling))
	var specs []shardBudget
	var cfgs []*shardConfig
	for _, n := range e.sz.shardGroups {
		sb := shardBudget{Budget: fmt.Sprintf("scale-g%d", n), Groups: n, Domains: shardDomains}
		specs = append(specs, sb)
		c := &shardConfig{spec: sb, held: make([]int, shardMasters)}
		for i := range n {
			m, err := cl.masterOf(ctx, groupCfgKey(sb.Budget, groupName(i)))
			if err != nil {
				return err
			}
			c.master = append(c.master, m)
			c.held[m]++
		}
		var place []string
		for _, h := range c.held {
			place = append(place, strconv.Itoa(h))
		}
		id := fmt.Sprintf("Scale.g%d", n)
		what := fmt.Sprintf("%d group%s (%s per master)", n, plural(n), strings.Join(place, "+"))
		c.rate = e.figure(s, id, what+": admissions/s", "ops/s", false)
		c.cpu = e.figure(s, id+".cpu", what+": Redis CPU per admission, summed over masters", "µs", false)
		c.sys = e.figure(s, id+".sys", what+": of which system CPU (network, event loop)", "µs", false)
		c.script = e.figure(s, id+".script", what+": Redis time inside scripts per admission, summed (commandstats)", "µs", false)
		c.busy = e.figure(s, id+".busy", what+": Redis CPU summed over masters, % of one core", "%", false)
		if _, _, ok := contextSwitches(cl.nodes[0].cmd.Process.Pid); ok {
			c.vswitch = e.figure(s, id+".sleeps", what+": event-loop sleeps per admission (voluntary context switches, summed)", "", false)
			c.iswitch = e.figure(s, id+".preempted", what+": event-loop preemptions per admission (involuntary context switches, summed)", "", false)
		}
		c.capacity = e.figure(s, id+".cap", what+": admissions per CPU-second of the busiest master", "ops/s", false)
		c.calls = e.figure(s, id+".calls", what+": script calls per admission", "calls", false)
		c.cmds = e.figure(s, id+".cmds", what+": Redis commands per admission, inside scripts included", "cmds", false)
		c.mismatch = e.figure(s, id+".mismatch", what+": script calls a master ran, not sent to its slots", "calls", false)
		c.errors = e.figure(s, id+".errors", what+": calls refused for their slot, and script calls refused or failed", "errors", false)
		for m := range shardMasters {
			mw := fmt.Sprintf("%s, master %d (slots %d-%d, %d group%s)", what, m+1, cl.ranges[m][0], cl.ranges[m][1], c.held[m], plural(c.held[m]))
			mid := fmt.Sprintf("%s.m%d", id, m+1)
			c.adm = append(c.adm, e.figure(s, mid+".adm", mw+": admissions/s of its groups", "ops/s", false))
			c.ran = append(c.ran, e.figure(s, mid+".calls", mw+": script calls/s it ran", "ops/s", false))
			if c.held[m] > 0 {
				c.mcpu = append(c.mcpu, e.figure(s, mid+".cpu", mw+": Redis CPU per admission of its groups", "µs", false))
			} else {
				c.mcpu = append(c.mcpu, e.figure(s, mid+".pct", mw+": Redis CPU, % of one core", "%", false))
			}
		}
		cfgs = append(cfgs, c)
	}

	lim := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: shardCeiling}}
	crew, err := startCrew(ctx, hosts, "shards", workerSpec{Role: "shards", Cluster: cl.addrs(), Shards: specs,
		Limits: lim, LeaseTTL: 15 * time.Second})
	if err != nil {
		return err
	}
	defer crew.close()

	keyMaster := map[string]int{} // the master of every key script calls were sent to
	local, errs := make([]float64, e.sz.rounds), make([]float64, e.sz.rounds)
	round := make([]int, len(cfgs)) // rounds done, per configuration
	var otherErrs, conns int64      // other error replies, and connections opened, in the windows
	var steps []func(context.Context) error
	for ci, c := range cfgs {
		steps = append(steps, func(ctx context.Context) error {
			w, err := e.shardWindow(ctx, crew, cl, ci)
			if err != nil {
				return fmt.Errorf("%d groups: %w", c.spec.Groups, err)
			}
			// Admissions per master, by where each group's config key lives.
			adm := make([]int64, shardMasters)
			var total int64
			for g, n := range w.groups {
				if n > 0 && w.calls[groupCfgKey(c.spec.Budget, groupName(g))] == 0 {
					return fmt.Errorf("%d groups: group %s admitted %d times without a script call on %q: the bench's key layout is not the store's",
						c.spec.Groups, groupName(g), n, groupCfgKey(c.spec.Budget, groupName(g)))
				}
				adm[c.master[g]] += n
				total += n
			}
			if total == 0 {
				return fmt.Errorf("%d groups: nothing was admitted in %v", c.spec.Groups, w.elapsed)
			}
			// Script calls sent, per master, by the slot of their first key.
			sent := make([]int64, shardMasters)
			var mismatch int64
			for k, n := range w.calls {
				if k == "" {
					mismatch += n // a call without keys could run anywhere
					continue
				}
				m, ok := keyMaster[k]
				if !ok {
					if m, err = cl.masterOf(ctx, k); err != nil {
						return err
					}
					keyMaster[k] = m
				}
				sent[m] += n
			}
			var cpuSum, sysSum, busiest float64
			var ran, cmds, usec, nerr, vsw, isw int64
			sec := w.elapsed.Seconds()
			for m := range shardMasters {
				before, after := w.before[m], w.after[m]
				d := after.cmds.since(before.cmds)
				calls := d.scripts()
				ran += calls.Calls
				usec += calls.Usec
				cmds += d.total()
				mismatch += max(calls.Calls-sent[m], sent[m]-calls.Calls)
				cpu := after.cpu() - before.cpu()
				cpuSum += cpu
				sysSum += after.sys - before.sys
				busiest = max(busiest, cpu)
				slot, script, other := after.clusterErrors(before)
				nerr += slot + script
				otherErrs += other
				conns += after.conns - before.conns
				vsw += after.vswitch - before.vswitch
				isw += after.iswitch - before.iswitch
				c.adm[m].add(Round{V: float64(adm[m]) / sec, N: int(adm[m])})
				c.ran[m].add(Round{V: float64(calls.Calls) / sec, N: int(calls.Calls)})
				if c.held[m] > 0 {
					c.mcpu[m].add(Round{V: 1e6 * cpu / float64(max(adm[m], 1))})
				} else {
					c.mcpu[m].add(Round{V: 100 * cpu / sec})
				}
			}
			c.rate.add(Round{V: float64(total) / sec, N: int(total)})
			c.cpu.add(Round{V: 1e6 * cpuSum / float64(total)})
			c.sys.add(Round{V: 1e6 * sysSum / float64(total)})
			c.script.add(Round{V: float64(usec) / float64(total)})
			c.busy.add(Round{V: 100 * cpuSum / sec})
			if c.vswitch != nil {
				c.vswitch.add(Round{V: float64(vsw) / float64(total)})
				c.iswitch.add(Round{V: float64(isw) / float64(total)})
			}
			if busiest > 0 {
				c.capacity.add(Round{V: float64(total) / busiest})
			} else {
				c.capacity.add(Round{})
			}
			c.calls.add(Round{V: float64(ran) / float64(total)})
			c.cmds.add(Round{V: float64(cmds) / float64(total)})
			c.mismatch.add(Round{V: float64(mismatch)})
			c.errors.add(Round{V: float64(nerr)})
			local[round[ci]] += float64(mismatch)
			errs[round[ci]] += float64(nerr)
			round[ci]++
			return nil
		})
	}
	if err := e.rounds(ctx, steps...); err != nil {
		return err
	}
	if otherErrs > 0 {
		// go-redis greets a new connection with commands Redis 7.0 does not
		// know (CLIENT SETINFO, CLIENT MAINT_NOTIFICATIONS), which it
		// answers with errors; they say nothing about slots.
		e.note("scale: the masters gave %d other error replies in the measured windows, in which %d connections were opened (2 per connection: go-redis's greeting)", otherErrs, conns)
	}
	first, last := cfgs[0], cfgs[len(cfgs)-1]
	for _, t := range targets {
		var vs []float64
		switch t.ID {
		case "Scale.cpu_flat":
			vs = ratios(last.cpu, first.cpu, p50)
		case "Scale.cmds_flat":
			vs = ratios(last.cmds, first.cmds, p50)
		case "Scale.local":
			vs = local
		case "Scale.errors":
			vs = errs
		}
		e.target(perRound(t.ID, t.Claim, t.Unit, t.Op, t.Limit, vs))
	}
	return nil
}

// shardRun is what the Cluster crew did between two pauses.
type shardRun struct {
	elapsed       time.Duration
	groups        []int64          // admissions per group
	calls         map[string]int64 // script calls sent, by first key
	before, after []nodeSnap       // each master at the two pauses
}

// shardWindow runs shardLanes lanes over the crew on configuration ci,
// lets them settle, then measures from one pause to the next: at a pause
// no lane is inside an admission and no script call is in flight, so
// what the clients counted and what each master counted cover the same
// calls.
func (e *env) shardWindow(ctx context.Context, c crew, cl *cluster, ci int) (shardRun, error) {
	var r shardRun
	for i, w := range c {
		lanes := shardLanes / len(c)
		if i < shardLanes%len(c) {
			lanes++
		}
		if err := w.send(msg{Op: "go", Config: ci, Lanes: lanes}); err != nil {
			return r, err
		}
	}
	for _, w := range c {
		if _, err := w.recv(ctx); err != nil {
			return r, err
		}
	}
	stopped := false
	defer func() {
		if !stopped {
			c.each(context.WithoutCancel(ctx), msg{Op: "stop"})
		}
	}()
	time.Sleep(e.sz.warm)
	p0, err := c.each(ctx, msg{Op: "pause"})
	if err != nil {
		return r, err
	}
	if r.before, err = cl.snapshots(ctx); err != nil {
		return r, err
	}
	t0 := time.Now()
	if _, err := c.each(ctx, msg{Op: "resume"}); err != nil {
		return r, err
	}
	time.Sleep(e.sz.window)
	p1, err := c.each(ctx, msg{Op: "pause"})
	if err != nil {
		return r, err
	}
	r.elapsed = time.Since(t0)
	if r.after, err = cl.snapshots(ctx); err != nil {
		return r, err
	}
	stopped = true
	if _, err := c.each(ctx, msg{Op: "stop"}); err != nil {
		return r, err
	}
	r.calls = map[string]int64{}
	for i := range c {
		for g, n := range p1[i].Groups {
			if g >= len(r.groups) {
				r.groups = append(r.groups, make([]int64, g+1-len(r.groups))...)
			}
			var was int64
			if g < len(p0[i].Groups) {
				was = p0[i].Groups[g]
			}
			r.groups[g] += n - was
		}
		for k, n := range p1[i].Calls {
			if d := n - p0[i].Calls[k]; d != 0 {
				r.calls[k] += d
			}
		}
	}
	return r, nil
}
