// Package demo is budgetctl's demo: a copy job spread over several worker
// processes, run against a simulated provider that enforces its own quota,
// once with one shared budget and once with each lane limiting itself, and
// a report of what the provider saw. budgetctl's main package wires its
// commands (demo, worker, provider) into the CLI; everything they do is here.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/cmd/budgetctl/internal/clitext"
	"github.com/runbudget/runbudget/internal/childproc"
	"github.com/runbudget/runbudget/redisstore"
)

// Config describes one demo: the job, the provider's quota and the budget.
type Config struct {
	Hosts, Lanes, Objects int
	Size                  int64 // mean object size
	Quota                 float64
	MaxConcurrent         int
	RefusalCost           float64 // as ProviderConfig.RefusalCost
	Attempts              int     // per request, as WorkerConfig.Attempts
	Limits                budget.Limits
	Budget                string // budget name in Redis
	NoBaseline            bool   // skip the run without the budget
	Seed                  uint64
	// RedisURL names a real Redis for the budget; empty starts an embedded
	// one (miniredis, on loopback) for the demo's lifetime.
	RedisURL string
}

// Env is what Run takes from the command that starts it.
type Env struct {
	// Progress receives the progress view: bars on a terminal, a status
	// line per second otherwise.
	Progress io.Writer
	// Connect opens a client for a Redis URL and checks it; its errors are
	// returned from Run as they are.
	Connect func(ctx context.Context, url string) (*redis.Client, error)
	// Redact masks credentials in the lines the hosts write on stderr.
	Redact func(string) string
	// HostArgs are the arguments that make this program one host of the
	// job (budgetctl's "worker"); Run appends the host's flags.
	HostArgs []string
	// Timeout bounds how long storing the budget's limits may wait for an
	// unavailable Redis.
	Timeout time.Duration
}

// hostProgress is how often a host reports its progress.
const hostProgress = 250 * time.Millisecond

// Run runs the job with the budget and, unless NoBaseline, without, and
// returns the report. It stops early, with an error, when ctx ends (every
// host is stopped first) or a host fails.
func Run(ctx context.Context, cfg Config, env Env) (Report, error) {
	redisURL, where := cfg.RedisURL, "embedded"
	if redisURL == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.StartAddr("127.0.0.1:0"); err != nil {
			return Report{}, fmt.Errorf("starting the embedded Redis: %v", err)
		}
		defer mr.Close()
		redisURL = "redis://" + mr.Addr() + "/0"
	}
	rdb, err := env.Connect(ctx, redisURL)
	if err != nil {
		return Report{}, err
	}
	defer rdb.Close()
	if cfg.RedisURL != "" {
		where = rdb.Options().Addr
	}

	if cfg.Attempts <= 0 {
		cfg.Attempts = DefaultAttempts
	}
	rep := Report{Hosts: cfg.Hosts, Lanes: cfg.Lanes, Objects: cfg.Objects, Size: cfg.Size, Quota: cfg.Quota,
		MaxConcurrent: cfg.MaxConcurrent, Attempts: cfg.Attempts, Limits: cfg.Limits, Budget: cfg.Budget, Redis: where}
	modes := []bool{true}
	if !cfg.NoBaseline {
		modes = append(modes, false)
	}
	pol := sdkRetry(cfg.Attempts)
	fmt.Fprintf(env.Progress, "Every lane retries like an SDK client: %d attempts per request, full-jitter backoff (base %v after a 503, doubling, capped at %v), or the provider's Retry-After when longer; an object whose attempts run out is lost.\n",
		pol.Attempts, pol.ThrottleBase, pol.Cap)
	for i, withBudget := range modes {
		r, err := runOnce(ctx, cfg, env, withBudget, redisURL, rdb, fmt.Sprintf("run %d of %d", i+1, len(modes)))
		if err != nil {
			return Report{}, err
		}
		rep.Runs = append(rep.Runs, r)
		rep.RefusalCost = r.Provider.RefusalCost // the provider's, defaults filled in
	}
	return rep, nil
}

// runOnce starts a provider and the hosts, follows their progress, and
// returns what the provider saw.
func runOnce(ctx context.Context, cfg Config, env Env, withBudget bool, redisURL string, rdb *redis.Client,
	label string) (RunReport, error) {
	out := env.Progress
	p := newProvider(ProviderConfig{Quota: cfg.Quota, MaxConcurrent: cfg.MaxConcurrent, RefusalCost: cfg.RefusalCost,
		Objects: cfg.Objects, Size: cfg.Size, Seed: cfg.Seed})
	provURL, stopProvider, err := serveProvider(p, "127.0.0.1:0")
	if err != nil {
		return RunReport{}, err
	}
	defer stopProvider()

	mode := ModeBudget
	if withBudget {
		// Store this run's limits, replacing any left by an earlier demo,
		// so the hosts join with limits that match.
		s, err := redisstore.New(rdb, cfg.Budget)
		if err != nil {
			return RunReport{}, fmt.Errorf("opening budget %s: %v", clitext.Quote(cfg.Budget), err)
		}
		b, err := budget.New(cfg.Limits, budget.WithStore(s), budget.WithReplaceLimits(), budget.WithUnavailableGrace(env.Timeout))
		if err != nil {
			return RunReport{}, fmt.Errorf("storing the budget's limits: %v", err)
		}
		b.Close()
		fmt.Fprintf(out, "%s: %d hosts x %d lanes sharing budget %s (%s)\n", label, cfg.Hosts, cfg.Lanes, clitext.Quote(cfg.Budget), clitext.Limits(cfg.Limits))
	} else {
		mode = ModeLanes
		fmt.Fprintf(out, "%s: %d hosts x %d lanes, no budget: each lane limits itself (rate %s/s, one request at a time)\n",
			label, cfg.Hosts, cfg.Lanes, strconv.FormatFloat(cfg.Limits.RequestsPerSecond, 'f', -1, 64))
	}

	// Cancelling runCtx stops every host started so far (SIGTERM, then a
	// kill after the grace period): on interrupt, and when a later host
	// fails to start.
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	view := newProgressView(out, label, cfg.Hosts, cfg.Objects)
	events := make(chan hostEvent, 64)
	var (
		hosts    []*childproc.Proc
		readers  sync.WaitGroup
		startErr error
	)
	start := time.Now()
	for i := range cfg.Hosts {
		host := "host-" + strconv.Itoa(i+1)
		args := append(append([]string(nil), env.HostArgs...), hostArgs(WorkerConfig{Provider: provURL, Budget: cfg.Budget,
			Host: host, Lanes: cfg.Lanes, NoBudget: !withBudget, Limits: cfg.Limits, Attempts: cfg.Attempts, Progress: hostProgress})...)
		// The URL goes by environment, not argv, where ps would show a
		// password to every user of the machine. The host watches its
		// stdin: the Proc holds it open until it is closed on return, or
		// this process dies, and the host then stops.
		h, err := childproc.Start(runCtx, childproc.Config{Name: host, Args: args, Env: []string{"REDIS_URL=" + redisURL},
			Stderr: &lineWriter{prefix: host + ": ", out: view.log, redact: env.Redact}})
		if err != nil {
			startErr = err
			cancelRun()
			break
		}
		defer h.Close()
		hosts = append(hosts, h)
		readers.Go(func() {
			for line := range h.Lines() {
				var ev WorkerEvent
				if err := json.Unmarshal(line, &ev); err != nil || ev.Type == "" {
					view.log(host + ": " + env.Redact(string(line)))
					continue
				}
				events <- hostEvent{i, ev}
			}
		})
	}
	go func() {
		readers.Wait()
		close(events)
	}()
	last := make([]WorkerEvent, cfg.Hosts)
	for ev := range events {
		last[ev.host] = ev.WorkerEvent
		view.update(ev.host, ev.WorkerEvent)
	}
	var errs []error
	for i, h := range hosts {
		if err := h.Wait(); err != nil {
			msg := last[i].Error
			if msg == "" {
				msg = err.Error()
			}
			errs = append(errs, fmt.Errorf("host-%d: %s", i+1, msg))
		}
	}
	elapsed := time.Since(start)
	view.finish()
	switch {
	case ctx.Err() != nil:
		return RunReport{}, errors.New("interrupted")
	case startErr != nil:
		return RunReport{}, startErr
	}
	if err := errors.Join(errs...); err != nil {
		return RunReport{}, fmt.Errorf("%s failed: %v", label, err)
	}
	r := RunReport{Mode: mode, Seconds: elapsed.Seconds(), Provider: p.stats()}
	for _, ev := range last {
		r.Copied += ev.Copied
		r.Failed += ev.Failed
		r.Hosts = append(r.Hosts, ev)
	}
	return r, nil
}

type hostEvent struct {
	host int
	WorkerEvent
}

// lineWriter passes a child's stderr on line by line, prefixed and
// redacted.
type lineWriter struct {
	prefix string
	out    func(string)
	redact func(string) string
	buf    bytes.Buffer
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line) // incomplete: keep it for the next write
			return len(p), nil
		}
		w.out(w.prefix + w.redact(line[:len(line)-1]))
	}
}
