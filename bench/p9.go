package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/childproc"
	"github.com/runbudget/runbudget/internal/recpack"
)

// P9 (issue 13): a copy job of many hosts, simulated. 1,000 hosts, each a
// Budget on a client of its own, spread over a few worker processes, run 64
// lanes each on one budget whose ceilings are far below the lanes (most
// lanes wait most of the time), once in one group on one Redis and once in
// 16 shard groups over a 3-master Cluster. Everything is measured from the
// servers (INFO commandstats, cpu, memory, clients, stats; SLOWLOG for the
// server time of each script) and from a hook on every host's client that
// names the script of each call, which commandstats does not. It takes
// minutes of both cores, so it runs only when -only names it.
//
// Its lease TTL is 60 s by default, not the store's 15 s: every queued
// waiter calls once per TTL/3 to keep its place, and 64,000 of them at 15 s
// make 12,800 calls/s, about one Redis core on their own, more than a
// 2-core machine serves beside the clients. Those calls scale as 3/TTL
// (-p9-ttl).

// p9Config is the size and shape of the run; its flags set it.
type p9Config struct {
	hosts, lanes, procs, pool int
	domains, inFlight         int
	rate                      float64       // per domain, per second
	ttl                       time.Duration // the stores' lease TTL
	measure                   time.Duration // measured windows of each configuration, in all
	holdMin, holdMax          time.Duration // how long a lane holds a lease: one transfer
}

var p9Flags = p9Config{hosts: 1000, lanes: 64, procs: 8, pool: 4, domains: 16, inFlight: 32, rate: 25,
	ttl: 60 * time.Second, measure: 30 * time.Second, holdMin: 500 * time.Millisecond, holdMax: 1500 * time.Millisecond}

func init() {
	f := &p9Flags
	flag.IntVar(&f.hosts, "p9-hosts", f.hosts, "P9: simulated hosts, each a Budget on a go-redis client of its own")
	flag.IntVar(&f.lanes, "p9-lanes", f.lanes, "P9: lanes (goroutines) per host")
	flag.IntVar(&f.procs, "p9-procs", f.procs, "P9: worker processes the hosts are spread over")
	flag.IntVar(&f.pool, "p9-pool", f.pool, "P9: PoolSize of each host's client (per node on the Cluster)")
	flag.IntVar(&f.domains, "p9-domains", f.domains, "P9: domains of the budget (one shard group each on the Cluster)")
	flag.IntVar(&f.inFlight, "p9-inflight", f.inFlight, "P9: in-flight ceiling per domain")
	flag.Float64Var(&f.rate, "p9-rate", f.rate, "P9: rate ceiling per domain, requests/s")
	flag.DurationVar(&f.ttl, "p9-ttl", f.ttl, "P9: lease TTL of every host (heartbeats and waiters' liveness calls every TTL/3)")
	flag.DurationVar(&f.measure, "p9-time", f.measure, "P9: measured time of each of its two runs, split into windows (-rounds, default 3)")
	flag.DurationVar(&f.holdMin, "p9-hold-min", f.holdMin, "P9: shortest time a lane holds a lease")
	flag.DurationVar(&f.holdMax, "p9-hold-max", f.holdMax, "P9: longest time a lane holds a lease")
}

// p9Node is one server of a run: the one Redis, or a master.
type p9Node struct {
	name string
	c    *redis.Client // INFO, CONFIG, SCAN, SLOWLOG: never in a measured path
	own  bool          // started by the bench: CONFIG SET is allowed
}

// p9Run is one of the two configurations.
type p9Run struct {
	id, title string
	nodes     []p9Node
	spec      p9Spec // the workers' spec, without their share of hosts
	master    []int  // of each domain (Cluster), else all 0
}

// p9Snap is what one INFO call tells of a server.
type p9Snap struct {
	at                          time.Time
	cpu                         float64 // used_cpu_user + used_cpu_sys, s
	used, dataset, clientsMem   int64   // used_memory, used_memory_dataset, mem_clients_normal
	clients, channels, received int64   // connected_clients, pub/sub channels (plain and shard), total_connections_received
	cmds                        stats
}

func p9Snapshot(ctx context.Context, c *redis.Client) (p9Snap, error) {
	info, err := c.Info(ctx, "cpu", "memory", "clients", "stats", "commandstats").Result()
	if err != nil {
		return p9Snap{}, fmt.Errorf("INFO: %w", err)
	}
	f := infoFields(info)
	fl := func(k string) float64 { v, _ := strconv.ParseFloat(f[k], 64); return v }
	in := func(k string) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	return p9Snap{at: time.Now(), cpu: fl("used_cpu_user") + fl("used_cpu_sys"),
		used: in("used_memory"), dataset: in("used_memory_dataset"), clientsMem: in("mem_clients_normal"),
		clients: in("connected_clients"), channels: in("pubsub_channels") + in("pubsubshard_channels"),
		received: in("total_connections_received"), cmds: parseCommandStats(info)}, nil
}

func p9Snapshots(ctx context.Context, nodes []p9Node) ([]p9Snap, error) {
	out := make([]p9Snap, len(nodes))
	for i, n := range nodes {
		var err error
		if out[i], err = p9Snapshot(ctx, n.c); err != nil {
			return nil, fmt.Errorf("%s: %w", n.name, err)
		}
	}
	return out, nil
}

// p9 runs the section: the one-Redis configuration, then the Cluster one.
func p9(ctx context.Context, e *env) error {
	c := p9Flags
	if c.hosts < 1 || c.lanes < 1 || c.procs < 1 || c.pool < 1 || c.domains < 1 || c.inFlight < 1 || c.rate <= 0 ||
		c.ttl < time.Second || c.measure <= 0 || c.holdMin <= 0 || c.holdMax < c.holdMin {
		return fmt.Errorf("P9: bad size: %+v", c)
	}
	c.procs = min(c.procs, c.hosts)
	windows := 3
	if e.cfg.rounds > 0 {
		windows = e.cfg.rounds
	}
	one := p9Run{id: "P9.g1", master: make([]int, c.domains),
		nodes: []p9Node{{name: "redis", c: e.admin, own: e.own}},
		spec:  p9Spec{Budget: e.name("p9-g1"), Redis: e.url}}
	one.title = fmt.Sprintf("P9: one Redis, 1 group: %%d hosts x %d lanes over %%d processes, %d domains", c.lanes, c.domains)
	if err := e.p9Measure(ctx, c, windows, &one); err != nil {
		return fmt.Errorf("one Redis: %w", err)
	}
	if e.bin == "" {
		e.note("P9: no redis-server binary to start a Cluster with: the Cluster run was not measured")
		return nil
	}
	cl, err := startCluster(ctx, e.bin, shardMasters)
	if err != nil {
		return fmt.Errorf("starting a Cluster: %w", err)
	}
	defer cl.stop()
	sh := p9Run{id: fmt.Sprintf("P9.g%d", c.domains),
		spec: p9Spec{Budget: e.name(fmt.Sprintf("p9-g%d", c.domains)), Cluster: cl.addrs(), Sharded: true}}
	held := make([]int, shardMasters)
	for i := range c.domains {
		m, err := cl.masterOf(ctx, groupCfgKey(sh.spec.Budget, p9Domain(i)))
		if err != nil {
			return err
		}
		sh.master = append(sh.master, m)
		held[m]++
	}
	var place []string
	for m, cc := range cl.clients {
		sh.nodes = append(sh.nodes, p9Node{name: fmt.Sprintf("master %d", m+1), c: cc, own: true})
		place = append(place, strconv.Itoa(held[m]))
	}
	sh.title = fmt.Sprintf("P9: %d-master Cluster, %d groups (%s per master): %%d hosts x %d lanes over %%d processes",
		shardMasters, c.domains, strings.Join(place, "+"), c.lanes)
	if err := e.p9Measure(ctx, c, windows, &sh); err != nil {
		return fmt.Errorf("Cluster: %w", err)
	}
	return nil
}

// p9Fit shrinks the run to what the machine allows. Every host may hold
// pool+1 connections to each server (its pool, filled, and a pub/sub
// connection), which count against each server's maxclients and against
// the open files of the worker process it lives in. More workers come
// first; fewer hosts only when more workers do not help, and then it says
// so.
func (e *env) p9Fit(ctx context.Context, c *p9Config, r *p9Run) {
	perServer := c.pool + 1
	for _, n := range r.nodes {
		m, err := n.c.ConfigGet(ctx, "maxclients").Result()
		if err != nil {
			continue // not allowed (an external Redis): trust it
		}
		limit, err := strconv.Atoi(m["maxclients"])
		if err != nil || c.hosts*perServer <= limit-64 {
			continue
		}
		was := c.hosts
		c.hosts = max(1, (limit-64)/perServer)
		e.logf("P9 %s: %s allows %d clients: %d hosts instead of %d", r.id, n.name, limit, c.hosts, was)
		e.note("P9 %s: ran %d hosts, not %d: %s allows %d clients, and each host may hold %d", r.id, c.hosts, was, n.name, limit, perServer)
	}
	limit := p9FileLimit()
	if limit == 0 {
		return
	}
	const slack = 256 // the worker's own files
	perHost := perServer * len(r.nodes)
	need := func(procs int) int { return (c.hosts+procs-1)/procs*perHost + slack }
	for c.procs < 64 && need(c.procs) > limit {
		c.procs++
	}
	if need(c.procs) > limit {
		was := c.hosts
		c.hosts = max(1, c.procs*(limit-slack)/perHost)
		e.logf("P9 %s: %d open files per process allow %d hosts over %d workers, not %d", r.id, limit, c.hosts, c.procs, was)
		e.note("P9 %s: ran %d hosts, not %d: %d open files per process, up to %d connections per host", r.id, c.hosts, was, limit, perHost)
	}
}

// p9Worker is one worker process, from the parent's side.
type p9Worker struct {
	name   string
	p      *childproc.Proc
	stderr *tailBuffer
}

func (w *p9Worker) send(op string) error {
	b, _ := json.Marshal(p9Order{Op: op})
	if err := w.p.Send(b); err != nil {
		return fmt.Errorf("%w%s", err, w.tail())
	}
	return nil
}

func (w *p9Worker) tail() string {
	if s := strings.TrimSpace(w.stderr.String()); s != "" {
		return "\n" + w.name + " stderr:\n" + s
	}
	return ""
}

func (w *p9Worker) recv(ctx context.Context, timeout time.Duration) (p9Reply, error) {
	// The tail is read only when the reply carries an error.
	r, err := readReply(ctx, w.p, w.name, w.tail, timeout, func(r p9Reply) string { return r.Err })
	if err != nil && r.Err != "" {
		err = fmt.Errorf("%w%s", err, w.tail())
	}
	return r, err
}

type p9Crew []*p9Worker

// p9StartCrew starts c.procs workers, the hosts split evenly between them,
// and waits until each has built its hosts.
func p9StartCrew(ctx context.Context, c p9Config, base p9Spec) (p9Crew, []p9Reply, error) {
	crew := make(p9Crew, c.procs)
	replies := make([]p9Reply, c.procs)
	errs := make([]error, c.procs)
	var wg sync.WaitGroup
	first := 0
	for i := range c.procs {
		spec := base
		spec.First, spec.Hosts, spec.Total = first, c.hosts/c.procs, c.hosts
		if i < c.hosts%c.procs {
			spec.Hosts++
		}
		first += spec.Hosts
		wg.Go(func() {
			js, err := json.Marshal(spec)
			if err != nil {
				errs[i] = err
				return
			}
			w := &p9Worker{name: fmt.Sprintf("p9-%d", i+1), stderr: &tailBuffer{max: 8 << 10}}
			// Ended by close (its stdin), not by ctx: see startWorker.
			w.p, err = childproc.Start(context.WithoutCancel(ctx), childproc.Config{
				Name: w.name, Env: []string{envP9Worker + "=" + string(js)}, Stderr: w.stderr,
				MaxLine: 1 << 20, Grace: 30 * time.Second, // a stop cancels thousands of waiters
			})
			if err != nil {
				errs[i] = err
				return
			}
			crew[i] = w
			replies[i], errs[i] = w.recv(ctx, spec.Stagger+3*time.Minute)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		crew.close()
		return nil, nil, err
	}
	return crew, replies, nil
}

// each sends op to every worker and collects one reply from each.
func (c p9Crew) each(ctx context.Context, op string, timeout time.Duration) ([]p9Reply, error) {
	for _, w := range c {
		if err := w.send(op); err != nil {
			return nil, err
		}
	}
	out := make([]p9Reply, len(c))
	var errs []error
	for i, w := range c {
		var err error
		if out[i], err = w.recv(ctx, timeout); err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// mark reads the workers' counts and the servers' INFO at one moment: the
// order goes to every worker first, and the servers are read while the
// workers answer, so both ends of a window see nearly the same calls.
func (c p9Crew) mark(ctx context.Context, nodes []p9Node) ([]p9Reply, []p9Snap, error) {
	for _, w := range c {
		if err := w.send("mark"); err != nil {
			return nil, nil, err
		}
	}
	snaps, serr := p9Snapshots(ctx, nodes)
	out := make([]p9Reply, len(c))
	errs := []error{serr}
	for i, w := range c {
		var err error
		if out[i], err = w.recv(ctx, time.Minute); err != nil {
			errs = append(errs, err)
		}
	}
	return out, snaps, errors.Join(errs...)
}

func (c p9Crew) close() {
	var wg sync.WaitGroup
	for _, w := range c {
		if w != nil {
			wg.Go(func() { w.p.Close() })
		}
	}
	wg.Wait()
}

// p9Sum adds up the workers' counts.
func p9Sum(rs []p9Reply) map[string]int64 {
	m := map[string]int64{}
	for _, r := range rs {
		for k, v := range r.Counts {
			m[k] += v
		}
	}
	return m
}

// p9Window is one measured window: the workers' counts and every server's
// INFO at both ends.
type p9Window struct {
	sec                float64
	counts             map[string]int64 // deltas, summed over workers
	waiting, holding   int64            // lanes, at the end
	before, after      []p9Snap
	perMasterAdm       []int64
	scriptCalls, pubs  int64 // commandstats deltas, summed over servers
	scriptUsec, cmds   int64
	cpu                []float64 // per server, s
	cpuSum, cpuBusiest float64
	clients, channels  int64 // at the end, summed over servers
	connsOpened        int64
}

func (e *env) p9Measure(ctx context.Context, c p9Config, windows int, r *p9Run) error {
	e.p9Fit(ctx, &c, r)
	c.procs = min(c.procs, c.hosts)
	spec := r.spec
	spec.Lanes, spec.Pool, spec.TTL, spec.Domains = c.lanes, c.pool, c.ttl, c.domains
	spec.HoldMin, spec.HoldMax = c.holdMin, c.holdMax
	spec.Limits = budget.Limits{RequestsPerSecond: c.rate, InFlight: map[budget.OpClass]int{budget.OpGet: c.inFlight}}
	interval := c.ttl / 3
	// Hosts are built over one renewal interval, and their lanes start
	// over one more: from then on, heartbeats and liveness calls are spread
	// evenly over the interval, as those of hosts started at different
	// times would be.
	spec.Stagger = interval

	base, err := p9Snapshots(ctx, r.nodes)
	if err != nil {
		return err
	}
	t0 := time.Now()
	e.logf("P9 %s: starting %d hosts over %d workers, spread over %v", r.id, c.hosts, c.procs, spec.Stagger)
	crew, ready, err := p9StartCrew(ctx, c, spec)
	if err != nil {
		return err
	}
	defer crew.close()
	hosts := 0
	for _, rp := range ready {
		hosts += rp.Hosts
		if rp.Note != "" {
			e.logf("P9 %s: %s", r.id, rp.Note)
			e.note("P9 %s: a worker built fewer hosts than asked: %s", r.id, rp.Note)
		}
	}
	e.logf("P9 %s: %d hosts ready in %v", r.id, hosts, time.Since(t0).Round(time.Millisecond))
	idle, err := p9Snapshots(ctx, r.nodes)
	if err != nil {
		return err
	}
	sec := fmt.Sprintf(r.title, hosts, c.procs) // the table's section: how many hosts actually ran

	if _, err := crew.each(ctx, "go", time.Minute); err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			crew.each(context.WithoutCancel(ctx), "stop", 2*time.Minute)
		}
	}()
	// The first liveness calls come one interval after the first calls,
	// which are spread over the stagger: measure once both have begun.
	warm := spec.Stagger + interval + c.holdMax + min(3*time.Second, interval)
	e.logf("P9 %s: lanes starting over %v; measuring in %v", r.id, spec.Stagger, warm.Round(time.Second))
	if err := sleepCtx(ctx, warm); err != nil {
		return err
	}

	var ws []p9Window
	marks, snaps, err := crew.mark(ctx, r.nodes)
	if err != nil {
		return err
	}
	length := c.measure / time.Duration(windows)
	for i := range windows {
		if err := sleepCtx(ctx, length); err != nil {
			return err
		}
		m1, s1, err := crew.mark(ctx, r.nodes)
		if err != nil {
			return err
		}
		w := p9NewWindow(r, c.domains, p9Sum(marks), p9Sum(m1), snaps, s1)
		ws = append(ws, w)
		e.logf("P9 %s: window %d: %.0f admissions/s, %.0f script calls/s, Redis CPU %.0f%% of a core (summed), %d lanes waiting",
			r.id, i+1, float64(w.counts["admitted"])/w.sec, float64(w.scriptCalls)/w.sec, 100*w.cpuSum/w.sec, w.waiting)
		marks, snaps = m1, s1
	}

	// At a steady point, with the lanes still running: what the budget's
	// keys hold, by kind, and how many waiters, leases and sessions there are.
	cen, err := p9Count(ctx, r)
	if err != nil {
		return err
	}
	steady, err := p9Snapshots(ctx, r.nodes)
	if err != nil {
		return err
	}
	slow, err := e.p9Slowlog(ctx, r, ws[len(ws)-1], min(2*time.Second, length))
	if err != nil {
		return err
	}

	stopped = true
	t1 := time.Now()
	final, err := crew.each(ctx, "stop", 2*time.Minute)
	if err != nil {
		return err
	}
	e.logf("P9 %s: lanes stopped and hosts closed in %v", r.id, time.Since(t1).Round(time.Millisecond))
	end := p9Sum(final)
	for _, f := range final {
		if f.Note != "" {
			e.note("P9 %s: a lane failed: %s", r.id, f.Note)
			break
		}
	}

	e.p9Figures(sec, r, c, hosts, ws, base, idle, steady, cen, slow, end)
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func p9NewWindow(r *p9Run, domains int, m0, m1 map[string]int64, s0, s1 []p9Snap) p9Window {
	w := p9Window{counts: map[string]int64{}, before: s0, after: s1, perMasterAdm: make([]int64, len(r.nodes))}
	for k, v := range m1 {
		w.counts[k] = v - m0[k]
	}
	w.waiting, w.holding = m1["waiting"], m1["holding"]
	for i := range domains {
		w.perMasterAdm[r.master[i]] += w.counts["adm."+p9Domain(i)]
	}
	var secs float64
	for i := range s0 {
		secs = max(secs, s1[i].at.Sub(s0[i].at).Seconds())
		d := s1[i].cmds.since(s0[i].cmds)
		sc := d.scripts()
		w.scriptCalls += sc.Calls
		w.scriptUsec += sc.Usec
		w.pubs += d["publish"].Calls + d["spublish"].Calls
		w.cmds += d.total()
		cpu := s1[i].cpu - s0[i].cpu
		w.cpu = append(w.cpu, cpu)
		w.cpuSum += cpu
		w.cpuBusiest = max(w.cpuBusiest, cpu)
		w.clients += s1[i].clients
		w.channels += s1[i].channels
		w.connsOpened += s1[i].received - s0[i].received
	}
	w.sec = secs
	return w
}

// p9Census is the budget's keys at one moment, by kind.
type p9Census struct {
	bytes, keys                        map[string]int64 // by kind
	waiters, queued, leases, sessions  int64            // markers and leases in lx:*, ZCARD sexp, summed over groups (queued: waiters)
	sessionSets, sessionLeases, groups int64            // the sessions' lease hashes lx:*, their leases, config keys
}

// p9Kind sorts a budget key by what it holds (see lib.lua's key layout):
// waiter (q:*, the queues; a waiter's marker sits in its session's lx:*),
// lease (lx:<ce>:<sid>, a session's leases and its waiters' markers),
// session (sexp, sd:*, sgone)
// or other (cfg, d:*, doms, the registry).
func p9Kind(key string) string {
	_, rest, ok := strings.Cut(key, "}:")
	if !ok {
		return "other"
	}
	switch {
	case strings.HasPrefix(rest, "q:"):
		return "waiter"
	case strings.HasPrefix(rest, "lx:"):
		return "lease"
	case rest == "sexp", rest == "sgone", strings.HasPrefix(rest, "sd:"):
		return "session"
	}
	return "other"
}

// p9Count sums MEMORY USAGE (SAMPLES 0, exact) over every key of the
// run's budget, on every server, by kind, and counts what the keys hold.
func p9Count(ctx context.Context, r *p9Run) (p9Census, error) {
	cen := p9Census{bytes: map[string]int64{}, keys: map[string]int64{}}
	pattern := "rb:{" + hex.EncodeToString([]byte(r.spec.Budget)) + "*"
	for _, n := range r.nodes {
		var cursor uint64
		for {
			ks, next, err := n.c.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return cen, err
			}
			if len(ks) > 0 {
				pipe := n.c.Pipeline()
				mem := make([]*redis.IntCmd, len(ks))
				size := make([]*redis.IntCmd, len(ks))
				vals := make([]*redis.StringSliceCmd, len(ks))
				for i, k := range ks {
					mem[i] = pipe.MemoryUsage(ctx, k, 0)
					_, rest, _ := strings.Cut(k, "}:")
					switch {
					case rest == "sexp":
						size[i] = pipe.ZCard(ctx, k)
					case strings.HasPrefix(rest, "lx:"):
						vals[i] = pipe.HVals(ctx, k)
					}
				}
				if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
					return cen, err
				}
				for i, k := range ks {
					b, err := mem[i].Result()
					if err != nil {
						continue // expired between SCAN and MEMORY USAGE
					}
					kind := p9Kind(k)
					cen.bytes[kind] += b
					cen.keys[kind]++
					var sz int64
					if size[i] != nil {
						sz, _ = size[i].Result()
					}
					_, rest, _ := strings.Cut(k, "}:")
					switch {
					case rest == "sexp":
						cen.sessions += sz
					case strings.HasPrefix(rest, "lx:") && vals[i] != nil:
						// One field of each is no lease (lib.lua, lease_put),
						// and a waiter's marker is none either (Queues).
						cen.sessionSets++
						for _, v := range vals[i].Val() {
							if _, waiter := recpack.DecodeMarker(v); waiter {
								cen.waiters++
								cen.queued++
							} else if v != "" {
								cen.leases++
								cen.sessionLeases++
							}
						}
					case rest == "cfg":
						cen.groups++
					}
				}
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return cen, nil
}

// p9Slow is the server time of each script, from a short SLOWLOG sample.
type p9Slow struct {
	calls map[string]int64
	usec  map[string]float64 // total
}

func (s p9Slow) mean(script string) float64 {
	if s.calls[script] == 0 {
		return 0
	}
	return s.usec[script] / float64(s.calls[script])
}

// p9Slowlog logs every command on every server for a moment (SLOWLOG with
// slowlog-log-slower-than 0, which names the function or SHA of each
// script call: commandstats has one FCALL line for all of them) and sums
// the server time of each script. Only on servers the bench started.
func (e *env) p9Slowlog(ctx context.Context, r *p9Run, last p9Window, sample time.Duration) (p9Slow, error) {
	s := p9Slow{calls: map[string]int64{}, usec: map[string]float64{}}
	for _, n := range r.nodes {
		if !n.own {
			return s, nil
		}
	}
	// Enough for every call of the sample, with room: an entry is a few
	// hundred bytes.
	rate := float64(last.scriptCalls) / last.sec
	if rate*sample.Seconds() > 100000 {
		sample = time.Duration(100000 / rate * float64(time.Second))
	}
	restore := make([]map[string]string, len(r.nodes))
	defer func() {
		bg := context.WithoutCancel(ctx)
		for i, n := range r.nodes {
			for k, v := range restore[i] {
				n.c.ConfigSet(bg, k, v)
			}
			n.c.SlowLogReset(bg)
		}
	}()
	for i, n := range r.nodes {
		old, err := n.c.ConfigGet(ctx, "slowlog-*").Result()
		if err != nil {
			return s, err
		}
		restore[i] = old
		if err := n.c.ConfigSet(ctx, "slowlog-max-len", "200000").Err(); err != nil {
			return s, err
		}
		if err := n.c.SlowLogReset(ctx).Err(); err != nil {
			return s, err
		}
		if err := n.c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
			return s, err
		}
	}
	if err := sleepCtx(ctx, sample); err != nil {
		return s, err
	}
	for _, n := range r.nodes {
		if err := n.c.ConfigSet(ctx, "slowlog-log-slower-than", "-1").Err(); err != nil { // stop logging, then read
			return s, err
		}
		logs, err := n.c.SlowLogGet(ctx, -1).Result()
		if err != nil {
			return s, err
		}
		for _, l := range logs {
			if len(l.Args) < 2 {
				continue
			}
			switch strings.ToLower(l.Args[0]) {
			case "fcall", "fcall_ro", "evalsha", "evalsha_ro":
			default:
				continue
			}
			name, ok := p9ScriptNames[l.Args[1]]
			if !ok {
				name = "other"
			}
			s.calls[name]++
			s.usec[name] += float64(l.Duration.Microseconds())
		}
	}
	return s, nil
}

// p9Kinds are the scripts a host calls, in the order of the table.
var p9Kinds = []struct{ script, what string }{
	{"heartbeat", "heartbeat calls/s (one per host per group where it holds leases, every TTL/3)"},
	{"renew", "renew calls/s (one per host per group where it has queued waiters, every TTL/3)"},
	{"retire", "retire calls/s (a lease released)"},
	{"cancel", "cancel calls/s (a waiter gave up)"},
	{"register", "register calls/s"},
	{"groups", "registry calls/s (a host lists the groups it uses)"},
	{"usage", "usage calls/s"},
}

func (e *env) p9Figures(sec string, r *p9Run, c p9Config, hosts int, ws []p9Window, base, idle, steady []p9Snap,
	cen p9Census, slow p9Slow, end map[string]int64) {
	id := func(s string) string { return r.id + "." + s }
	fig := func(s, name, unit string) *Figure { return e.figure(sec, id(s), name, unit, false) }
	once := func(s, name, unit string, v float64, note string) {
		f := fig(s, name, unit)
		f.add(Round{V: v})
		f.Note = note
	}
	// each adds a figure with one round per window.
	each := func(s, name, unit string, v func(i int, w p9Window) float64) {
		f := fig(s, name, unit)
		for i, w := range ws {
			f.add(Round{V: v(i, w)})
		}
	}
	perSec := func(k string) func(int, p9Window) float64 {
		return func(_ int, w p9Window) float64 { return float64(w.counts[k]) / w.sec }
	}
	script := func(name string) func(int, p9Window) float64 { return perSec("script." + name) }
	adm := func(w p9Window) float64 { return float64(w.counts["admitted"]) / w.sec }
	perAdm := func(n int64, w p9Window) float64 { return float64(n) / float64(max(w.counts["admitted"], 1)) }
	// Later acquire calls: every Acquire sends one first call (admitted at
	// once, or queued); the rest are queued waiters calling again.
	later := func(w p9Window) float64 { return float64(w.counts["script.acquire"]-w.counts["started"]) / w.sec }
	interval := c.ttl / 3
	servers := len(r.nodes)
	// A waiter calls again without news only as a safety net, once every
	// three TTLs, since its store renews its place (renew calls, counted
	// apart), and after a wake that does not carry a grant or a timed
	// sleep (its head is held by the rate). Calls do not say which; the
	// liveness share is what a lane waiting throughout makes, which holds
	// while waits are long next to that (here they are minutes).
	liveness := func(w p9Window) float64 { return min(later(w), float64(w.waiting)/(9*interval.Seconds())) }

	each("adm_s", "admissions/s", "ops/s", func(_ int, w p9Window) float64 { return adm(w) })
	each("calls_s", "script calls/s (commandstats: FCALL, EVALSHA, EVAL)", "ops/s", func(_ int, w p9Window) float64 { return float64(w.scriptCalls) / w.sec })
	each("acq_first_s", "acquire calls/s, first call of an Acquire (admits at once, or queues)", "ops/s", perSec("started"))
	each("acq_later_s", "acquire calls/s, later calls of queued waiters (safety calls every 3 TTLs, timed wakes)", "ops/s", func(_ int, w p9Window) float64 { return later(w) })
	each("acq_later_per_waiter", "later acquire calls per waiting lane per TTL/3 (1/9 = safety calls alone)", "calls", func(_ int, w p9Window) float64 {
		return later(w) * interval.Seconds() / float64(max(w.waiting, 1))
	})
	each("acq_live_s", "of which safety calls (estimated: waiting lanes / (3 TTLs))", "ops/s", func(_ int, w p9Window) float64 { return liveness(w) })
	each("acq_timed_s", "of which calls after a wake or a timed sleep (rate, pause): the rest", "ops/s", func(_ int, w p9Window) float64 {
		return later(w) - liveness(w)
	})
	each("acq_timed_adm", "acquire calls after a wake or a timed sleep, per admission", "calls", func(_ int, w p9Window) float64 {
		return (later(w) - liveness(w)) / max(adm(w), 1e-9)
	})
	for _, k := range p9Kinds {
		short := map[string]string{"heartbeat": "hb", "groups": "registry"}[k.script]
		if short == "" {
			short = k.script
		}
		each(short+"_calls_s", k.what, "ops/s", script(k.script))
	}
	each("hb_per_host", "heartbeat calls per host per TTL/3", "calls", func(_ int, w p9Window) float64 {
		return float64(w.counts["script.heartbeat"]) / w.sec * interval.Seconds() / float64(hosts)
	})
	each("wake_msgs_s", "wake messages/s (PUBLISH/SPUBLISH run inside scripts)", "ops/s", func(_ int, w p9Window) float64 { return float64(w.pubs) / w.sec })
	each("wakes_adm", "wake messages per admission", "msgs", func(_ int, w p9Window) float64 { return perAdm(w.pubs, w) })
	each("calls_adm", "script calls per admission, everything included", "calls", func(_ int, w p9Window) float64 { return perAdm(w.scriptCalls, w) })
	each("hook_vs_server", "script calls sent (client hooks) / run (commandstats)", "x", func(_ int, w p9Window) float64 {
		var sent int64
		for k, v := range w.counts {
			if strings.HasPrefix(k, "script.") {
				sent += v
			}
		}
		return float64(sent) / float64(max(w.scriptCalls, 1))
	})
	each("cmds_s", "Redis commands/s, inside scripts included", "ops/s", func(_ int, w p9Window) float64 { return float64(w.cmds) / w.sec })
	each("cpu_pct", "Redis CPU, % of one core (summed over servers)", "%", func(_ int, w p9Window) float64 { return 100 * w.cpuSum / w.sec })
	each("cpu_adm", "Redis CPU per admission, all of it (liveness and heartbeats included)", "µs", func(_ int, w p9Window) float64 {
		return 1e6 * w.cpuSum / float64(max(w.counts["admitted"], 1))
	})
	each("cpu_call", "Redis CPU per script call", "µs", func(_ int, w p9Window) float64 { return 1e6 * w.cpuSum / float64(max(w.scriptCalls, 1)) })
	each("script_pct", "Redis time inside scripts, % of the CPU it used (commandstats usec)", "%", func(_ int, w p9Window) float64 {
		return 100 * float64(w.scriptUsec) / 1e6 / w.cpuSum
	})
	satName := "admissions/s at which one Redis core saturates (admissions/s / CPU fraction)"
	if servers > 1 {
		satName = "admissions/s at which the busiest master saturates (admissions/s / its CPU fraction)"
	}
	each("sat_adm_s", satName, "ops/s", func(_ int, w p9Window) float64 { return adm(w) / (w.cpuBusiest / w.sec) })
	if servers > 1 {
		for m := range r.nodes {
			groups := 0
			for _, x := range r.master {
				if x == m {
					groups++
				}
			}
			mid := fmt.Sprintf("m%d.", m+1)
			mw := fmt.Sprintf("%s (%d group%s)", r.nodes[m].name, groups, plural(groups))
			each(mid+"adm_s", mw+": admissions/s of its groups", "ops/s", func(_ int, w p9Window) float64 { return float64(w.perMasterAdm[m]) / w.sec })
			each(mid+"cpu_pct", mw+": Redis CPU, % of one core", "%", func(_ int, w p9Window) float64 { return 100 * w.cpu[m] / w.sec })
			each(mid+"calls_s", mw+": script calls/s it ran", "ops/s", func(_ int, w p9Window) float64 {
				return float64(w.after[m].cmds.since(w.before[m].cmds).scripts().Calls) / w.sec
			})
			each(mid+"conns", mw+": connections held by the hosts", "conns", func(_ int, w p9Window) float64 { return float64(w.after[m].clients - base[m].clients) })
		}
	}
	each("errors", "Acquire calls that failed (not cancelled) in the window", "", func(_ int, w p9Window) float64 { return float64(w.counts["errors"]) })
	each("waiting", "lanes waiting in Acquire (client side, at the window's end)", "lanes", func(_ int, w p9Window) float64 { return float64(w.waiting) })
	each("holding", "lanes holding a lease (client side, at the window's end)", "lanes", func(_ int, w p9Window) float64 { return float64(w.holding) })
	conns := func(w p9Window) float64 {
		var n int64
		for i := range w.after {
			n += w.after[i].clients - base[i].clients
		}
		return float64(n)
	}
	each("conns", "connections held by the hosts (INFO clients, summed over servers, less the bench's own)", "conns", func(_ int, w p9Window) float64 { return conns(w) })
	each("conns_per_host", "connections per host", "conns", func(_ int, w p9Window) float64 { return conns(w) / float64(hosts) })
	each("conns_opened_s", "connections opened/s (pools still growing, or churn)", "ops/s", func(_ int, w p9Window) float64 { return float64(w.connsOpened) / w.sec })
	each("channels", "pub/sub channels subscribed (INFO stats, summed)", "", func(_ int, w p9Window) float64 { return float64(w.channels) })

	// Once, at the steady point.
	var clientsIdle, usedDelta, clientsMemDelta, datasetDelta, connsSteady int64
	for i := range steady {
		clientsIdle += idle[i].clients - base[i].clients
		usedDelta += steady[i].used - base[i].used
		clientsMemDelta += steady[i].clientsMem - base[i].clientsMem
		datasetDelta += steady[i].dataset - base[i].dataset
		connsSteady += steady[i].clients - base[i].clients
	}
	const steadyNote = "steady point"
	once("conns_idle", "connections held by the hosts before their lanes started", "conns", float64(clientsIdle), "measured once")
	once("waiters", "waiters queued in Redis (markers in the sessions' lx:*, summed over groups)", "", float64(cen.waiters), steadyNote)
	once("leases", "leases held in Redis (the sessions' lease hashes lx:*, summed over groups)", "", float64(cen.leases), steadyNote)
	once("sessions", "sessions in Redis (ZCARD sexp, summed over groups)", "", float64(cen.sessions), steadyNote)
	once("mem_used_mb", "Redis used_memory, growth since before the hosts (summed)", "MB", float64(usedDelta)/1e6, steadyNote)
	once("mem_clients_mb", "of which client connections (mem_clients_normal)", "MB", float64(clientsMemDelta)/1e6, steadyNote)
	once("mem_dataset_mb", "of which the dataset (used_memory_dataset)", "MB", float64(datasetDelta)/1e6, steadyNote)
	once("mem_used_per_waiter", "used_memory growth less connections, per waiter (leases, sessions, channels included)", "bytes",
		float64(usedDelta-clientsMemDelta)/float64(max(cen.waiters, 1)), steadyNote)
	once("mem_per_conn", "connection memory per connection (mem_clients_normal)", "bytes", float64(clientsMemDelta)/float64(max(connsSteady, 1)), steadyNote)
	once("mem_waiter", "key memory per waiter (q:*, without its marker in lx:*; MEMORY USAGE)", "bytes", float64(cen.bytes["waiter"])/float64(max(cen.waiters, 1)), steadyNote)
	once("mem_lease", "key memory per lease (the sessions' lease hashes lx:*)", "bytes", float64(cen.bytes["lease"])/float64(max(cen.leases, 1)), steadyNote)
	once("mem_session", "key memory per session (sexp, sd:*, sgone)", "bytes", float64(cen.bytes["session"])/float64(max(cen.sessions, 1)), steadyNote)
	var keyBytes int64
	for _, b := range cen.bytes {
		keyBytes += b
	}
	once("mem_overhead_mb", "used_memory growth less connections and keys (pub/sub channels, the keyspace's tables)", "MB",
		float64(usedDelta-clientsMemDelta-keyBytes)/1e6, steadyNote)
	once("mem_other_kb", "key memory of the rest (config, domains, registry)", "kB", float64(cen.bytes["other"])/1e3, steadyNote)
	once("lane_errors", "Acquire calls that failed (not cancelled), whole run", "", float64(end["errors"]), "whole run")
	once("leases_lost", "leases lost while held, whole run", "", float64(end["lost"]), "whole run")

	// Server time per script, from SLOWLOG, and what it makes of the CPU.
	if len(slow.calls) == 0 {
		e.note("P9 %s: SLOWLOG needs CONFIG SET, done only on servers the bench started: the per-script figures were not measured", r.id)
		return
	}
	for _, k := range []string{"acquire", "retire", "heartbeat", "cancel", "renew"} {
		once("us_"+k, fmt.Sprintf("%s: server µs per call (SLOWLOG, %d calls)", k, slow.calls[k]), "µs", slow.mean(k), "sampled")
	}
	// What the CPU goes to, per window. Each call costs Redis its time
	// inside the script plus what every call costs around it (reading,
	// replying, the event loop). The window's time inside scripts
	// (commandstats, at most its CPU) is shared out by each kind's calls
	// times its mean server time in the SLOWLOG sample, which tells
	// scripts apart; the rest of the CPU evenly by calls. Waiters' liveness
	// calls and heartbeats are the load that does not depend on the
	// admission rate; the rest is what admissions cost.
	type split struct{ fixed, perAdm, perWaiter, live, hb float64 } // µs/s, µs, µs/s, µs, µs
	sp := make([]split, len(ws))
	var all, allUsec float64
	for _, n := range slow.calls {
		all += float64(n)
	}
	for _, u := range slow.usec {
		allUsec += u
	}
	for i, w := range ws {
		cpu := 1e6 * w.cpuSum / w.sec
		first, live := float64(w.counts["started"])/w.sec, liveness(w)
		rates := map[string]float64{"first": first, "live": live, "timed": later(w) - live}
		means := map[string]float64{"first": slow.mean("acquire"), "live": slow.mean("acquire"), "timed": slow.mean("acquire")}
		known := first + later(w)
		for _, k := range []string{"retire", "heartbeat", "cancel", "renew"} {
			rates[k], means[k] = float64(w.counts["script."+k])/w.sec, slow.mean(k)
			known += rates[k]
		}
		total := float64(w.scriptCalls) / w.sec
		rates["other"], means["other"] = max(total-known, 0), allUsec/max(all, 1)
		var inTime, calls float64
		for k, r := range rates {
			inTime += r * means[k]
			calls += r
		}
		inScripts := min(float64(w.scriptUsec)/w.sec, cpu)
		around := (cpu - inScripts) / max(calls, 1e-9)
		of := func(k string) float64 { return inScripts*rates[k]*means[k]/max(inTime, 1e-9) + around*rates[k] }
		liveCPU, hbCPU := of("live")+of("renew"), of("heartbeat")
		sp[i] = split{fixed: liveCPU + hbCPU, perAdm: (cpu - liveCPU - hbCPU) / max(adm(w), 1e-9),
			perWaiter: liveCPU / float64(max(w.waiting, 1)),
			live:      of("live") / max(live, 1e-9), hb: hbCPU / max(rates["heartbeat"], 1e-9)}
	}
	each("fixed_pct", "Redis CPU of waiters' liveness calls and heartbeats, % of one core (estimated)", "%", func(i int, _ p9Window) float64 { return sp[i].fixed / 1e4 })
	each("cpu_adm_marginal", "Redis CPU per admission, less liveness and heartbeats (estimated)", "µs", func(i int, _ p9Window) float64 { return sp[i].perAdm })
	each("cpu_waiter_s", "Redis CPU per waiting lane per second: its liveness calls (estimated)", "µs", func(i int, _ p9Window) float64 { return sp[i].perWaiter })
	each("cpu_live", "Redis CPU per acquire call of a waiting lane (estimated)", "µs", func(i int, _ p9Window) float64 { return sp[i].live })
	each("cpu_hb", "Redis CPU per heartbeat call (estimated)", "µs", func(i int, _ p9Window) float64 { return sp[i].hb })
	each("sat_adm_bare", fmt.Sprintf("admissions/s %d core%s carry with no waiter liveness or heartbeats (estimated)", servers, plural(servers)), "ops/s",
		func(i int, _ p9Window) float64 { return float64(servers) * 1e6 / sp[i].perAdm })
	each("sat_adm_marginal", fmt.Sprintf("admissions/s %d core%s carry beside this run's waiters and heartbeats (estimated)", servers, plural(servers)), "ops/s",
		func(i int, _ p9Window) float64 { return (float64(servers)*1e6 - sp[i].fixed) / sp[i].perAdm })
}
