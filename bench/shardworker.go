package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/redisstore"
)

// shardBudget is one budget of the scale section's Cluster run: Domains
// domains spread evenly over Groups shard groups.
type shardBudget struct {
	Budget  string `json:"budget"`
	Groups  int    `json:"groups"`
	Domains int    `json:"domains"` // in all; a multiple of Groups
}

// groupName is the shard key of group i, and shardDomain the ID of domain
// j of group i: "g<i>/d<j>", whose shard key is the part before the "/".
func groupName(i int) string      { return "g" + strconv.Itoa(i) }
func shardDomain(i, j int) string { return groupName(i) + "/d" + strconv.Itoa(j) }

// shardKey is the key function of the scale budgets.
func shardKey(d budget.Domain) string {
	k, _, _ := strings.Cut(d.ID, "/")
	return k
}

// requests returns one request per domain of b, in order: domain k is in
// group k / (Domains/Groups).
func (b shardBudget) requests(consumer string) []budget.Request {
	per := b.Domains / b.Groups
	out := make([]budget.Request, 0, b.Domains)
	for i := range b.Groups {
		for j := range per {
			out = append(out, budget.Request{Domains: []budget.Domain{{Version: 1, ID: shardDomain(i, j)}},
				Class: budget.OpGet, Consumer: consumer})
		}
	}
	return out
}

// scriptCounter is a go-redis hook that counts the script calls a client
// sends (FCALL, EVALSHA, EVAL), by their first key, which names the slot
// the call runs in. Its gate lets a pause wait for every call in flight,
// heartbeats included, and hold back new ones, so that the counts and a
// server's commandstats can be read at a moment when nothing is between
// the two.
type scriptCounter struct {
	gate sync.RWMutex
	mu   sync.Mutex
	by   map[string]int64
}

func newScriptCounter() *scriptCounter { return &scriptCounter{by: map[string]int64{}} }

// scriptKey returns the first key of a script call, and whether cmd is one.
func scriptKey(cmd redis.Cmder) (string, bool) {
	switch cmd.Name() {
	case "fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro":
	default:
		return "", false
	}
	args := cmd.Args()
	if len(args) < 4 || fmt.Sprint(args[2]) == "0" {
		return "", true // no key: it could run anywhere, and is counted under ""
	}
	return fmt.Sprint(args[3]), true
}

func (h *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		key, ok := scriptKey(cmd)
		if !ok {
			return next(ctx, cmd)
		}
		h.gate.RLock()
		defer h.gate.RUnlock()
		h.count(key)
		return next(ctx, cmd)
	}
}

func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.gate.RLock()
		defer h.gate.RUnlock()
		for _, cmd := range cmds {
			if key, ok := scriptKey(cmd); ok {
				h.count(key)
			}
		}
		return next(ctx, cmds)
	}
}

func (h *scriptCounter) count(key string) {
	h.mu.Lock()
	h.by[key]++
	h.mu.Unlock()
}

func (h *scriptCounter) snapshot() map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int64, len(h.by))
	for k, v := range h.by {
		out[k] = v
	}
	return out
}

// shards runs the worker of the scale section's Cluster run: one budget per
// entry of Shards on a ClusterClient, and on "go" Lanes lanes on budget
// Config, each admission on a domain drawn at random. "pause" waits until
// every lane is between two admissions and no script call is in flight,
// holds them there and reports the admissions per group and the script
// calls per key so far; "resume" lets them go on; "stop" ends the lanes.
func (w *child) shards(ctx context.Context) error {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: w.spec.Cluster, ContextTimeoutEnabled: true, PoolSize: 64})
	defer cc.Close()
	calls := newScriptCounter()
	cc.AddHook(calls)
	type config struct {
		s    *redisstore.Store
		b    *budget.Budget
		reqs []budget.Request
		per  int // domains per group
	}
	var cfgs []config
	defer func() {
		for _, c := range cfgs {
			c.b.Close()
		}
	}()
	for _, sb := range w.spec.Shards {
		if sb.Groups < 1 || sb.Domains%sb.Groups != 0 {
			return fmt.Errorf("budget %q: %d domains do not split into %d groups", sb.Budget, sb.Domains, sb.Groups)
		}
		s, err := redisstore.New(cc, sb.Budget, redisstore.WithLeaseTTL(w.spec.LeaseTTL), redisstore.WithShardKey(shardKey))
		if err != nil {
			return err
		}
		b, err := budget.New(w.spec.Limits, budget.WithStore(s))
		if err != nil {
			s.Close()
			return err
		}
		cfgs = append(cfgs, config{s: s, b: b, reqs: sb.requests(w.spec.Host), per: sb.Domains / sb.Groups})
	}
	w.reply(msg{Ready: true})

	var (
		lanes    sync.RWMutex // held for reading by a lane through one admission, for writing by a pause
		paused   bool
		wg       sync.WaitGroup
		cur      = struct{ stop context.CancelFunc }{func() {}}
		total    atomic.Int64
		groups   []atomic.Int64
		mu       sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	status := func() msg {
		m := msg{N: total.Load(), Groups: make([]int64, len(groups))}
		for i := range groups {
			m.Groups[i] = groups[i].Load()
		}
		mu.Lock()
		if firstErr != nil {
			m.Err = firstErr.Error()
		}
		mu.Unlock()
		return m
	}
	resume := func() {
		if paused {
			calls.gate.Unlock()
			lanes.Unlock()
			paused = false
		}
	}
	end := func() {
		cur.stop()
		resume() // lanes held at a pause see the end and leave
		wg.Wait()
	}
	defer end()
	for m, ok := w.next(); ok; m, ok = w.next() {
		switch m.Op {
		case "go":
			end()
			if m.Config < 0 || m.Config >= len(cfgs) {
				return fmt.Errorf("no budget %d", m.Config)
			}
			c := cfgs[m.Config]
			var run context.Context
			run, cur.stop = context.WithCancel(ctx)
			total.Store(0)
			groups = make([]atomic.Int64, len(c.reqs)/c.per)
			mu.Lock()
			firstErr = nil
			mu.Unlock()
			for range m.Lanes {
				wg.Go(func() {
					for {
						lanes.RLock()
						if run.Err() != nil {
							lanes.RUnlock()
							return
						}
						k := rand.IntN(len(c.reqs))
						l, err := c.b.Acquire(run, c.reqs[k])
						if err != nil {
							lanes.RUnlock()
							if !errors.Is(err, context.Canceled) {
								fail(err)
							}
							return
						}
						l.Release()
						groups[k/c.per].Add(1)
						total.Add(1)
						lanes.RUnlock()
					}
				})
			}
			w.reply(msg{})
		case "pause":
			if !paused {
				lanes.Lock() // every lane between two admissions
				// A released lease's retirement may still wait for the next
				// call of its group (redisstore.Store.Flush); it must be out
				// before the gate closes, or a waiter of another process
				// it would wake waits for the resume.
				for _, c := range cfgs {
					if err := c.s.Flush(ctx); err != nil {
						lanes.Unlock()
						return err
					}
				}
				calls.gate.Lock() // and no script call of anyone in flight
				paused = true
			}
			m := status()
			m.Calls = calls.snapshot()
			w.reply(m)
		case "resume":
			resume()
			w.reply(msg{})
		case "stop":
			end()
			w.reply(status())
		}
	}
	return nil
}
