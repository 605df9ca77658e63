package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/redisstore"
)

// workerSpec is what a worker process is started with.
type workerSpec struct {
	// Role is what the worker does:
	//   "pubsub"  subscribes to Key and answers each message with the moment
	//             it arrived (the bare pub/sub wake floor);
	//   "blpop"   on "arm", blocks in BLPOP on Key and answers with the
	//             moment it returned (the bare BLPOP wake floor);
	//   "waiter"  on "arm", blocks in Acquire on Budget and answers with the
	//             moment it was admitted, after releasing (P2);
	//   "lanes"   runs lanes that Acquire and Release in a loop, or run a
	//             no-op script when Noop is set, or redis_rate Allow on
	//             100 keys under Key when Allow is set, until "stop" (P3,
	//             P4, P8);
	//   "shards"  runs lanes on the sharded budgets of Shards on the
	//             Cluster of Cluster, with pauses (scale).
	Role     string        `json:"role"`
	Host     string        `json:"host"`
	Redis    string        `json:"redis"` // a redis:// URL
	Key      string        `json:"key,omitempty"`
	Budget   string        `json:"budget,omitempty"`
	Limits   budget.Limits `json:"limits"`
	LeaseTTL time.Duration `json:"lease_ttl,omitempty"`
	Domain   string        `json:"domain,omitempty"`
	Noop     bool          `json:"noop,omitempty"`
	Allow    bool          `json:"allow,omitempty"`
	Cluster  []string      `json:"cluster,omitempty"` // node addresses (role "shards")
	Shards   []shardBudget `json:"shards,omitempty"`
	Profile  string        `json:"profile,omitempty"` // a directory: write a CPU profile there, <Host>.pprof
	Procs    int           `json:"procs,omitempty"`   // GOMAXPROCS, when set
}

func isWorker() bool { return os.Getenv(envWorker) != "" }

// workerMain runs a worker to the end and returns its exit code. Replies go
// to stdout as JSON lines; orders come on stdin, and its end means exit.
func workerMain() int {
	var spec workerSpec
	if err := json.Unmarshal([]byte(os.Getenv(envWorker)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "worker: bad spec:", err)
		return 2
	}
	if spec.Procs > 0 {
		runtime.GOMAXPROCS(spec.Procs)
	}
	if spec.Profile != "" {
		f, err := os.Create(filepath.Join(spec.Profile, spec.Host+".pprof"))
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker: profile:", err)
			return 2
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	w := &child{spec: spec, out: json.NewEncoder(os.Stdout), in: bufio.NewScanner(os.Stdin)}
	if err := w.run(); err != nil {
		w.reply(msg{Err: err.Error()})
		return 1
	}
	return 0
}

type child struct {
	spec workerSpec
	mu   sync.Mutex
	out  *json.Encoder
	in   *bufio.Scanner
}

func (w *child) reply(m msg) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.out.Encode(m)
}

// next returns the next order, or false at the end of stdin.
func (w *child) next() (msg, bool) {
	for w.in.Scan() {
		var m msg
		if json.Unmarshal(w.in.Bytes(), &m) == nil {
			return m, true
		}
	}
	return msg{}, false
}

func (w *child) client(pool int) (*redis.Client, error) {
	opts, err := redis.ParseURL(w.spec.Redis)
	if err != nil {
		return nil, err
	}
	opts.ContextTimeoutEnabled = true
	opts.PoolSize = pool
	return redis.NewClient(opts), nil
}

func (w *child) budget(c *redis.Client) (*budget.Budget, error) {
	var opts []redisstore.Option
	if w.spec.LeaseTTL > 0 {
		opts = append(opts, redisstore.WithLeaseTTL(w.spec.LeaseTTL))
	}
	s, err := redisstore.New(c, w.spec.Budget, opts...)
	if err != nil {
		return nil, err
	}
	return budget.New(w.spec.Limits, budget.WithStore(s))
}

func (w *child) run() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if w.spec.Role == "shards" {
		return w.shards(ctx)
	}
	c, err := w.client(64)
	if err != nil {
		return err
	}
	defer c.Close()
	switch w.spec.Role {
	case "pubsub":
		return w.pubsub(ctx, cancel, c)
	case "blpop":
		return w.blpop(ctx, c)
	case "waiter":
		return w.waiter(ctx, c)
	case "lanes":
		return w.lanes(ctx, c)
	}
	return fmt.Errorf("unknown role %q", w.spec.Role)
}

func (w *child) pubsub(ctx context.Context, cancel context.CancelFunc, c *redis.Client) error {
	sub := c.Subscribe(ctx, w.spec.Key)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		return err
	}
	w.reply(msg{Ready: true})
	go func() {
		for _, ok := w.next(); ok; _, ok = w.next() {
		}
		// The end of stdin: stop. A blocked read does not watch ctx, but it
		// returns when the connection closes.
		cancel()
		sub.Close()
	}()
	for {
		// ReceiveMessage, not Channel: the barest way to hear a message,
		// so the floor has no hop the mechanism does not need.
		if _, err := sub.ReceiveMessage(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		w.reply(msg{T: time.Now().UnixNano()})
	}
}

func (w *child) blpop(ctx context.Context, c *redis.Client) error {
	w.reply(msg{Ready: true})
	for m, ok := w.next(); ok; m, ok = w.next() {
		if m.Op != "arm" {
			continue
		}
		if err := c.BLPop(ctx, 0, w.spec.Key).Err(); err != nil {
			return err
		}
		w.reply(msg{T: time.Now().UnixNano()})
	}
	return nil
}

func (w *child) waiter(ctx context.Context, c *redis.Client) error {
	b, err := w.budget(c)
	if err != nil {
		return err
	}
	defer b.Close()
	req := budget.Request{Domains: []budget.Domain{{Version: 1, ID: w.spec.Domain}}, Class: budget.OpGet, Consumer: w.spec.Host}
	w.reply(msg{Ready: true})
	for m, ok := w.next(); ok; m, ok = w.next() {
		if m.Op != "arm" {
			continue
		}
		l, err := b.Acquire(ctx, req)
		if err != nil {
			return err
		}
		t := time.Now().UnixNano()
		l.Release()
		w.reply(msg{T: t})
	}
	return nil
}

// lanes runs lanes between "go" and "stop", counting what they complete;
// "mark" reports the count so far, so the parent can cut a window out of
// a steady run.
func (w *child) lanes(ctx context.Context, c *redis.Client) error {
	var (
		b   *budget.Budget
		err error
		ops = &opCounter{}
		// call, when set, is what each lane repeats instead of an
		// admission: a floor or a peer's call.
		call func(context.Context) error
	)
	switch {
	case w.spec.Allow:
		call = gcraAllow(redis_rate.NewLimiter(c), w.spec.Key)
	case w.spec.Noop:
		noop := redis.NewScript(noopScript)
		if err := noop.Load(ctx, c).Err(); err != nil {
			return err
		}
		call = func(ctx context.Context) error { return noop.EvalSha(ctx, c, nil).Err() }
	default:
		c.AddHook(ops)
		if b, err = w.budget(c); err != nil {
			return err
		}
		defer b.Close()
	}
	req := budget.Request{Domains: []budget.Domain{{Version: 1, ID: w.spec.Domain}}, Class: budget.OpGet, Consumer: w.spec.Host}
	w.reply(msg{Ready: true})

	var (
		n        atomic.Int64
		mu       sync.Mutex
		firstErr error
		kept     []*budget.Lease
		times    []int64
		wg       sync.WaitGroup
		cur      = struct{ stop context.CancelFunc }{func() {}}
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	status := func() msg {
		mu.Lock()
		defer mu.Unlock()
		m := msg{N: n.Load(), Ops: ops.n.Load()}
		m.CPU, m.Waits = ownCPU()
		if firstErr != nil {
			m.Err = firstErr.Error()
		}
		return m
	}
	defer func() { cur.stop(); wg.Wait() }()
	for m, ok := w.next(); ok; m, ok = w.next() {
		switch m.Op {
		case "go":
			cur.stop() // a "go" while running replaces the run
			wg.Wait()
			var run context.Context
			run, cur.stop = context.WithCancel(ctx)
			n.Store(0)
			for range m.Lanes {
				wg.Go(func() {
					for run.Err() == nil {
						if call != nil {
							if err := call(run); err != nil {
								if run.Err() == nil {
									fail(err)
								}
								return
							}
							n.Add(1)
							continue
						}
						l, err := b.Acquire(run, req)
						if err != nil {
							if !errors.Is(err, context.Canceled) {
								fail(err)
							}
							return
						}
						n.Add(1)
						if m.Keep {
							t := time.Now().UnixNano()
							mu.Lock()
							kept, times = append(kept, l), append(times, t)
							mu.Unlock()
						} else {
							l.Release()
						}
					}
				})
			}
			w.reply(msg{})
		case "mark":
			w.reply(status())
		case "stop":
			cur.stop()
			wg.Wait()
			m := status()
			mu.Lock()
			m.Times, times = times, nil
			mu.Unlock()
			w.reply(m)
		case "release":
			mu.Lock()
			ls := kept
			kept = nil
			mu.Unlock()
			releaseAll(ls)
			w.reply(msg{})
		}
	}
	return nil
}

// releaseAll releases leases from a few goroutines at once.
func releaseAll(ls []*budget.Lease) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(ls)); i = next.Add(1) - 1 {
				ls[i].Release()
			}
		})
	}
	wg.Wait()
}

// noopScript is the cheapest script there is: EVALSHA's own floor.
const noopScript = "return 1"

// opCounter is a go-redis hook counting the script operations a client
// sends: one per script call, and one per operation a batch carries (the
// store's group commit sends the calls a process queued for a group as one
// FCALL of a batch function). Without batching the count equals the
// script calls.
type opCounter struct{ n atomic.Int64 }

func (h *opCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *opCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(scriptOps(cmd.Args()))
		return next(ctx, cmd)
	}
}
func (h *opCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.n.Add(scriptOps(cmd.Args()))
		}
		return next(ctx, cmds)
	}
}

// scriptOps is the number of script operations in one command: 0 for a
// command that runs no script, 1 for a script call, and for an FCALL of a
// batch function the operations it carries (batchScripts).
func scriptOps(args []any) int64 {
	if len(args) == 0 {
		return 0
	}
	name, _ := args[0].(string)
	switch strings.ToLower(name) {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall_ro":
		return 1
	case "fcall":
	default:
		return 0
	}
	if ops, ok := batchScripts(args); ok {
		return int64(len(ops))
	}
	return 1
}

// batchScripts returns the script of each operation an FCALL of a batch
// function (named "..._batch" or "..._batch_oom") carries, and false for
// any other command. A batch's arguments are, per operation, the script's
// name, its argument count m, then the m arguments.
func batchScripts(args []any) ([]string, bool) {
	if len(args) < 3 || !strings.EqualFold(fmt.Sprint(args[0]), "fcall") {
		return nil, false
	}
	fn, _ := args[1].(string)
	if !strings.HasSuffix(fn, "_batch") && !strings.HasSuffix(fn, "_batch_oom") {
		return nil, false
	}
	numKeys, ok := asInt(args[2])
	if !ok {
		return nil, false
	}
	var ops []string
	for i := 3 + numKeys; i+1 < len(args); {
		m, ok := asInt(args[i+1])
		if !ok {
			break
		}
		ops = append(ops, fmt.Sprint(args[i]))
		i += 2 + m
	}
	return ops, true
}

func asInt(v any) (int, bool) {
	switch v := v.(type) {
	case int:
		return v, true
	case int64:
		return int(v), true
	case string:
		n, err := strconv.Atoi(v)
		return n, err == nil
	}
	return 0, false
}
