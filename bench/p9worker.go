package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/luascripts"
	"github.com/runbudget/runbudget/redisstore"
)

// P9's worker processes. Each runs a share of the simulated hosts: every
// host is a budget.Budget of its own, on a redisstore.Store of its own, on
// a go-redis client of its own, so that it holds its own connections,
// subscriptions, session and keeper exactly as a separate machine would;
// its lanes are goroutines. Only the OS process (scheduler, heap) is
// shared by the hosts of one worker.

// envP9Worker carries a P9 worker's spec (JSON). It is not envWorker, whose
// dispatch (worker.go) knows only the other sections' roles; init picks it
// up instead, so this program and the test binary both serve as P9
// workers without a line in their main functions.
const envP9Worker = "RUNBUDGET_BENCH_P9_WORKER"

func init() {
	if spec, ok := os.LookupEnv(envP9Worker); ok {
		os.Exit(p9WorkerMain(spec))
	}
}

// p9Spec is what a P9 worker is started with.
type p9Spec struct {
	Budget  string        `json:"budget"`
	Redis   string        `json:"redis,omitempty"`   // a redis:// URL, for the one-Redis run
	Cluster []string      `json:"cluster,omitempty"` // the masters' addresses, for the Cluster run
	Sharded bool          `json:"sharded,omitempty"` // one shard group per domain
	First   int           `json:"first"`             // index of this worker's first host
	Hosts   int           `json:"hosts"`             // this worker's
	Total   int           `json:"total"`             // hosts of the run, over every worker
	Lanes   int           `json:"lanes"`             // per host
	Pool    int           `json:"pool"`              // go-redis PoolSize of every host's client (per node on a Cluster)
	TTL     time.Duration `json:"ttl"`
	Limits  budget.Limits `json:"limits"`
	Domains int           `json:"domains"`
	HoldMin time.Duration `json:"hold_min"`
	HoldMax time.Duration `json:"hold_max"`
	Stagger time.Duration `json:"stagger"` // hosts are built, and later lanes start, spread over this long
}

// p9Order is one line from the parent: "go" starts the lanes, "mark"
// reports the counts so far, "stop" ends the lanes and closes the hosts.
type p9Order struct {
	Op string `json:"op"`
}

// p9Reply is one line to the parent.
type p9Reply struct {
	Hosts  int              `json:"hosts,omitempty"` // hosts built (ready)
	Note   string           `json:"note,omitempty"`  // why fewer hosts than asked were built; a lane's first error
	Counts map[string]int64 `json:"counts,omitempty"`
	Err    string           `json:"err,omitempty"`
}

// p9Domain names domain i of the P9 budget. With Sharded, the domain's ID
// is its shard key: one group per domain.
func p9Domain(i int) string { return fmt.Sprintf("d%02d", i) }

func p9ShardKey(d budget.Domain) string { return d.ID }

// p9Counter is a go-redis hook shared by every host client of a worker: it
// counts the script calls sent, by script (FCALL names the function, EVALSHA
// the SHA), and every other command by name. The parent compares the sum
// with the servers' commandstats, which count FCALL as one line whatever
// the function.
type p9Counter struct {
	mu sync.Mutex
	n  map[string]int64
}

// p9ScriptNames maps what a script call names (a function of the library,
// or the SHA of a script sent by EVALSHA, with or without its shebang) to
// the script's name.
var p9ScriptNames = func() map[string]string {
	m := map[string]string{}
	_, _, fns := luascripts.Library()
	for script, fn := range fns {
		m[fn] = script
	}
	for _, n := range luascripts.Names() {
		src := luascripts.Source(n)
		m[redis.NewScript(src).Hash()] = n
		m[redis.NewScript(luascripts.WithoutShebang(src)).Hash()] = n
	}
	return m
}()

// p9CallName is the counter name of one command: "script.<name>" for a
// script call of the store, "cmd.<name>" for anything else.
func p9CallName(cmd redis.Cmder) string {
	name := strings.ToLower(cmd.Name())
	switch name {
	case "fcall", "fcall_ro", "evalsha", "evalsha_ro":
		if args := cmd.Args(); len(args) > 1 {
			if s, ok := p9ScriptNames[fmt.Sprint(args[1])]; ok {
				return "script." + s
			}
		}
		return "script.other"
	case "eval", "eval_ro":
		return "script.eval" // the store's probe of shebang support, at start
	}
	return "cmd." + name
}

func (h *p9Counter) add(cmd redis.Cmder) {
	k := p9CallName(cmd)
	h.mu.Lock()
	h.n[k]++
	h.mu.Unlock()
}

func (h *p9Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *p9Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd)
		return next(ctx, cmd)
	}
}

func (h *p9Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.add(c)
		}
		return next(ctx, cmds)
	}
}

func (h *p9Counter) snapshot(into map[string]int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, v := range h.n {
		into[k] = v
	}
}

// p9Host is one simulated host.
type p9Host struct {
	client redis.UniversalClient
	b      *budget.Budget
}

// p9Lanes are the counts of a worker's lanes.
type p9Lanes struct {
	started, admitted, errs, lost atomic.Int64
	waiting, holding              atomic.Int64 // gauges: lanes inside Acquire, and holding a lease
	perDomain                     []atomic.Int64
	mu                            sync.Mutex
	firstErr                      string
}

func p9WorkerMain(js string) int {
	var spec p9Spec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "p9 worker: bad spec:", err)
		return 2
	}
	out := json.NewEncoder(os.Stdout)
	if err := p9Work(spec, bufio.NewScanner(os.Stdin), out); err != nil {
		out.Encode(p9Reply{Err: err.Error()})
		return 1
	}
	return 0
}

func p9Work(spec p9Spec, in *bufio.Scanner, out *json.Encoder) error {
	counter := &p9Counter{n: map[string]int64{}}
	hosts, note := p9BuildHosts(spec, counter)
	defer func() { p9CloseHosts(hosts) }()
	if len(hosts) == 0 {
		return fmt.Errorf("no host could be built: %s", note)
	}
	out.Encode(p9Reply{Hosts: len(hosts), Note: note})

	reqs := make([]budget.Request, spec.Domains)
	for i := range reqs {
		reqs[i] = budget.Request{Domains: []budget.Domain{{Version: 1, ID: p9Domain(i)}}, Class: budget.OpGet}
	}
	lanes := &p9Lanes{perDomain: make([]atomic.Int64, spec.Domains)}
	counts := func() map[string]int64 {
		m := map[string]int64{}
		counter.snapshot(m)
		m["started"] = lanes.started.Load()
		m["admitted"] = lanes.admitted.Load()
		m["errors"] = lanes.errs.Load()
		m["lost"] = lanes.lost.Load()
		m["waiting"] = lanes.waiting.Load()
		m["holding"] = lanes.holding.Load()
		for i := range lanes.perDomain {
			m["adm."+p9Domain(i)] = lanes.perDomain[i].Load()
		}
		return m
	}
	reply := func() {
		r := p9Reply{Counts: counts()}
		lanes.mu.Lock()
		r.Note = lanes.firstErr // a lane's failure is counted, not fatal
		lanes.mu.Unlock()
		out.Encode(r)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	stop := func() {
		cancel()
		wg.Wait()
	}
	defer stop()
	for in.Scan() {
		var o p9Order
		if json.Unmarshal(in.Bytes(), &o) != nil {
			continue
		}
		switch o.Op {
		case "go":
			for i, h := range hosts {
				for j := range spec.Lanes {
					wg.Go(func() { p9Lane(ctx, spec, h.b, reqs, lanes, spec.First+i, j) })
				}
			}
			out.Encode(p9Reply{})
		case "mark":
			reply()
		case "stop":
			// Waiters leave their queues (a cancel call each, in the
			// background, which Close waits for), holders release.
			stop()
			p9CloseHosts(hosts)
			hosts = nil
			reply()
		}
	}
	return nil // stdin ended: the parent is done with this worker
}

// p9BuildHosts builds spec.Hosts hosts, the hosts of the whole run spread
// evenly over the stagger, as hosts started at different times would be:
// each host's keeper beats every TTL/3 from its start, so hosts built
// together would all beat in the same moment, and a window shorter than
// TTL/3 would see every beat or none. When a host cannot be built (the
// process is out of file descriptors, Redis refuses more clients), the
// later ones are not tried, and it says why: the parent reports the run as
// one of fewer hosts rather than failing it.
func p9BuildHosts(spec p9Spec, counter *p9Counter) ([]*p9Host, string) {
	hosts := make([]*p9Host, spec.Hosts)
	errs := make([]error, spec.Hosts)
	var failed atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for i := range spec.Hosts {
		at := start.Add(spec.Stagger * time.Duration(spec.First+i) / time.Duration(max(spec.Total, 1)))
		wg.Go(func() {
			time.Sleep(time.Until(at))
			if failed.Load() {
				return
			}
			if hosts[i], errs[i] = p9NewHost(spec, counter); errs[i] != nil {
				failed.Store(true)
			}
		})
	}
	wg.Wait()
	var built []*p9Host
	var why []string
	for i, h := range hosts {
		if h != nil {
			built = append(built, h)
		}
		if errs[i] != nil && len(why) < 3 {
			why = append(why, errs[i].Error())
		}
	}
	if len(why) > 0 {
		return built, fmt.Sprintf("%d of %d hosts built; first errors: %s", len(built), spec.Hosts, strings.Join(why, "; "))
	}
	return built, ""
}

func p9NewHost(spec p9Spec, counter *p9Counter) (*p9Host, error) {
	var c redis.UniversalClient
	if len(spec.Cluster) > 0 {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: spec.Cluster, PoolSize: spec.Pool, ContextTimeoutEnabled: true})
	} else {
		o, err := redis.ParseURL(spec.Redis)
		if err != nil {
			return nil, err
		}
		o.PoolSize, o.ContextTimeoutEnabled = spec.Pool, true
		c = redis.NewClient(o)
	}
	c.AddHook(counter)
	opts := []redisstore.Option{redisstore.WithLeaseTTL(spec.TTL)}
	if spec.Sharded {
		opts = append(opts, redisstore.WithShardKey(p9ShardKey))
	}
	s, err := redisstore.New(c, spec.Budget, opts...)
	if err != nil {
		c.Close()
		return nil, err
	}
	b, err := budget.New(spec.Limits, budget.WithStore(s))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &p9Host{client: c, b: b}, nil
}

// p9CloseHosts closes hosts' budgets (each waits for its waiters'
// cancellations) and clients, a few at a time.
func p9CloseHosts(hosts []*p9Host) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(hosts); i = int(next.Add(1) - 1) {
				hosts[i].b.Close()
				hosts[i].client.Close()
			}
		})
	}
	wg.Wait()
}

// p9Lane is one lane of a copy job: it waits for an admission on a domain
// drawn at random, holds the lease for a transfer's time, releases it, and
// starts over. Its first Acquire comes at a random moment within the
// stagger, as lanes of hosts started at different times would: a waiter's
// liveness calls follow its last call by TTL/3, so lanes started together
// would beat together.
func p9Lane(ctx context.Context, spec p9Spec, b *budget.Budget, reqs []budget.Request, n *p9Lanes, host, lane int) {
	t := time.NewTimer(time.Duration(rand.Int64N(int64(max(spec.Stagger, 1)))))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return
	}
	consumer := "host-" + strconv.Itoa(host) + "/" + strconv.Itoa(lane)
	for ctx.Err() == nil {
		k := rand.IntN(len(reqs))
		req := reqs[k]
		req.Consumer = consumer
		n.started.Add(1)
		n.waiting.Add(1)
		l, err := b.Acquire(ctx, req)
		n.waiting.Add(-1)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, budget.ErrClosed) {
				n.errs.Add(1)
				n.mu.Lock()
				if n.firstErr == "" {
					n.firstErr = fmt.Sprintf("host %d lane %d: %v", host, lane, err)
				}
				n.mu.Unlock()
				t.Reset(100 * time.Millisecond) // do not spin on a failing store
				select {
				case <-t.C:
				case <-ctx.Done():
				}
			}
			continue
		}
		n.admitted.Add(1)
		n.perDomain[k].Add(1)
		n.holding.Add(1)
		hold := spec.HoldMin
		if spec.HoldMax > spec.HoldMin {
			hold += time.Duration(rand.Int64N(int64(spec.HoldMax - spec.HoldMin)))
		}
		t.Reset(hold)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		select {
		case <-l.Lost():
			n.lost.Add(1)
		default:
		}
		l.Release()
		n.holding.Add(-1)
	}
}
