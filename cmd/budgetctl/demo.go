package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/redisstore"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// demoLimits are the budget's flags, shared by demo and worker.
type demoLimits struct {
	rps                   float64
	burst                 int
	get, list, head, copy int
	bodies                int
	memory                byteSize
}

func (l *demoLimits) register(f *pflag.FlagSet) {
	l.memory = 512 << 10
	f.Float64Var(&l.rps, "rps", 180, "budget: requests per second per domain (demo default: 90% of --quota; 0: unbounded)")
	f.IntVar(&l.burst, "burst", 20, "budget: burst of starts (demo default: --quota/10; 0: one second's worth)")
	f.IntVar(&l.list, "list", 2, "budget: list requests in flight (0: unbounded)")
	f.IntVar(&l.head, "head", 4, "budget: head requests in flight (0: unbounded)")
	f.IntVar(&l.get, "get", 8, "budget: get requests in flight (0: unbounded)")
	f.IntVar(&l.copy, "copy-source-read", 0, "budget: copy_source_read requests in flight (unused by the demo; 0: unbounded)")
	f.IntVar(&l.bodies, "bodies", 12, "budget: open response bodies (0: unbounded)")
	f.Var(&l.memory, "memory", "budget: buffer memory for the whole run (0: unbounded)")
}

// limits returns the budget.Limits the flags describe. With a quota (the
// demo), rps and burst that were not given follow it: 90% of the quota, the
// headroom any client should leave for jitter, and a tenth of it.
func (l *demoLimits) limits(cmd *cobra.Command, quota float64) (budget.Limits, error) {
	rps, burst := l.rps, l.burst
	if quota > 0 && !cmd.Flags().Changed("rps") {
		rps = 0.9 * quota
	}
	if quota > 0 && !cmd.Flags().Changed("burst") {
		burst = max(1, int(quota/10))
	}
	lim := budget.Limits{RequestsPerSecond: rps, Burst: burst, OpenBodies: l.bodies, MemoryBytes: int64(l.memory),
		InFlight: map[budget.OpClass]int{budget.OpList: l.list, budget.OpHead: l.head, budget.OpGet: l.get, budget.OpCopySourceRead: l.copy}}
	n, err := lim.Normalize()
	if err != nil {
		return budget.Limits{}, usageError("budget flags: %v", err)
	}
	return n, nil
}

// args renders limits as worker flags.
func limitArgs(l budget.Limits) []string {
	return []string{
		"--rps", strconv.FormatFloat(l.RequestsPerSecond, 'f', -1, 64),
		"--burst", strconv.Itoa(l.Burst),
		"--list", strconv.Itoa(l.InFlight[budget.OpList]),
		"--head", strconv.Itoa(l.InFlight[budget.OpHead]),
		"--get", strconv.Itoa(l.InFlight[budget.OpGet]),
		"--copy-source-read", strconv.Itoa(l.InFlight[budget.OpCopySourceRead]),
		"--bodies", strconv.Itoa(l.OpenBodies),
		"--memory", strconv.FormatInt(l.MemoryBytes, 10),
	}
}

type demoConfig struct {
	Hosts, Lanes, Objects int
	Size                  int64
	Quota                 float64
	MaxConcurrent         int
	Limits                budget.Limits
	Budget                string
	NoBaseline            bool
	Seed                  uint64
}

func (a *app) demoCommand() *cobra.Command {
	var (
		cfg  demoConfig
		lim  demoLimits
		size = byteSize(32 << 10)
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a simulated copy job over several processes, with and without a shared budget",
		Long: `demo runs a copy job spread over --hosts worker processes (this binary,
started again as "worker") with --lanes lanes each, copying --objects
objects from a simulated provider that enforces its own quota: --quota
requests per second (a token bucket holding a fifth of a second's worth)
and at most --max-concurrent requests at once, and answers 503 with a
Retry-After when they are exceeded. The provider runs in this process, so
its quota covers every host, and it measures everything from its side.

The budget lives in an embedded Redis (miniredis, on loopback) unless
--redis names a real one (REDIS_URL is not used here). Each object takes a
HEAD and a GET; hosts share listing pages through a counter in Redis.

Two runs, the second for comparison (skip it with --no-baseline):
  shared budget   every request first acquires from one budget in Redis
                  (--rps, --burst, in-flight ceilings per class, --bodies,
                  --memory); a 503 is reported to it, so all hosts slow down
  per-lane limits each lane keeps the same limits for itself alone, as a
                  lane tuned in isolation would: a rate limiter at --rps and
                  one request at a time (so in-flight ceilings never bind),
                  and it waits out its own 503s. Load multiplies by lanes.

The report compares, from the provider's side: objects copied, duration,
requests per second against the quota, 503s, and the peak in flight per
class against the budget's ceilings. Progress shows as bars on a terminal,
as periodic lines otherwise; with --json the report is JSON on stdout and
progress goes to stderr.`,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if cfg.Hosts <= 0 || cfg.Lanes <= 0 || cfg.Objects <= 0 || cfg.Quota <= 0 || size <= 0 {
				return usageError("--hosts, --lanes, --objects, --quota and --size must be positive")
			}
			if cfg.Objects > 999999 {
				return usageError("--objects is at most 999999")
			}
			cfg.Size = int64(size)
			var err error
			if cfg.Limits, err = lim.limits(cmd, cfg.Quota); err != nil {
				return err
			}
			if m := cfg.Limits.MemoryBytes; m > 0 && m < cfg.Size*3/2+1 {
				return usageError("--memory %s is below the largest object (%s): no GET could ever be admitted", formatBytes(m), formatBytes(cfg.Size*3/2+1))
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return a.runDemo(ctx, cfg)
		}),
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Hosts, "hosts", 4, "worker processes")
	f.IntVar(&cfg.Lanes, "lanes", 8, "lanes per worker")
	f.IntVar(&cfg.Objects, "objects", 1200, "objects to copy")
	f.Var(&size, "size", "mean object size (sizes vary from half to one and a half times it)")
	f.Float64Var(&cfg.Quota, "quota", 200, "provider: requests per second it admits")
	f.IntVar(&cfg.MaxConcurrent, "max-concurrent", 24, "provider: requests served at once, open bodies included")
	f.StringVar(&cfg.Budget, "budget", "demo", "budget name in Redis")
	f.BoolVar(&cfg.NoBaseline, "no-baseline", false, "skip the comparison run without the budget")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed for object sizes and the provider's latency jitter")
	lim.register(f)
	return cmd
}

// runDemo runs the job with the budget and, unless NoBaseline, without, and
// prints the report.
func (a *app) runDemo(ctx context.Context, cfg demoConfig) error {
	redisURL, where := "", "embedded"
	if a.redisURL != "" {
		redisURL = a.redisURL
		a.secrets = append(a.secrets, urlSecrets(redisURL)...)
	} else {
		mr := miniredis.NewMiniRedis()
		if err := mr.StartAddr("127.0.0.1:0"); err != nil {
			return failure("starting the embedded Redis: %v", err)
		}
		defer mr.Close()
		redisURL = "redis://" + mr.Addr() + "/0"
	}
	opt, err := redisOptions(redisURL)
	if err != nil {
		return err
	}
	if a.redisURL != "" {
		where = opt.Addr
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	pctx, cancel := a.opContext(ctx)
	err = rdb.Ping(pctx).Err()
	cancel()
	if err != nil {
		return describeRedisError(opt.Addr, err)
	}

	progress := a.stdout
	if a.json {
		progress = a.stderr
	}
	rep := demoReport{Hosts: cfg.Hosts, Lanes: cfg.Lanes, Objects: cfg.Objects, Size: cfg.Size, Quota: cfg.Quota,
		MaxConcurrent: cfg.MaxConcurrent, Limits: cfg.Limits, Budget: cfg.Budget, Redis: where}
	modes := []bool{true}
	if !cfg.NoBaseline {
		modes = append(modes, false)
	}
	for i, withBudget := range modes {
		r, err := a.demoRun(ctx, cfg, withBudget, redisURL, rdb, progress, fmt.Sprintf("run %d of %d", i+1, len(modes)))
		if err != nil {
			return err
		}
		rep.Runs = append(rep.Runs, r)
	}
	if a.json {
		return writeJSON(a.stdout, rep)
	}
	fmt.Fprintln(a.stdout)
	return renderReport(a.stdout, rep)
}

// demoRun starts a provider and the hosts, follows their progress, and
// returns what the provider saw.
func (a *app) demoRun(ctx context.Context, cfg demoConfig, withBudget bool, redisURL string, rdb *redis.Client,
	out io.Writer, label string) (runReport, error) {
	p := newProvider(providerConfig{Quota: cfg.Quota, MaxConcurrent: cfg.MaxConcurrent, Objects: cfg.Objects, Size: cfg.Size, Seed: cfg.Seed})
	provURL, stopProvider, err := serveProvider(p, "127.0.0.1:0")
	if err != nil {
		return runReport{}, failure("%v", err)
	}
	defer stopProvider()

	mode := modeBudget
	if withBudget {
		// Store this run's limits, replacing any left by an earlier demo,
		// so the hosts join with limits that match.
		s, err := redisstore.New(rdb, cfg.Budget)
		if err != nil {
			return runReport{}, failure("opening budget %s: %v", quote(cfg.Budget), err)
		}
		b, err := budget.New(cfg.Limits, budget.WithStore(s), budget.WithReplaceLimits(), budget.WithUnavailableGrace(a.timeout))
		if err != nil {
			return runReport{}, failure("storing the budget's limits: %v", err)
		}
		b.Close()
		fmt.Fprintf(out, "%s: %d hosts x %d lanes sharing budget %s (%s)\n", label, cfg.Hosts, cfg.Lanes, quote(cfg.Budget), formatLimits(cfg.Limits))
	} else {
		mode = modeLanes
		fmt.Fprintf(out, "%s: %d hosts x %d lanes, no budget: each lane limits itself (rate %s/s, one request at a time)\n",
			label, cfg.Hosts, cfg.Lanes, strconv.FormatFloat(cfg.Limits.RequestsPerSecond, 'f', -1, 64))
	}

	exe, err := os.Executable()
	if err != nil {
		return runReport{}, failure("finding this program to start the hosts: %v", err)
	}
	// Cancelling runCtx stops every host started so far (SIGTERM, then
	// SIGKILL after WaitDelay): on interrupt, and when a later host fails to
	// start.
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	view := newProgressView(out, label, cfg.Hosts, cfg.Objects)
	events := make(chan hostEvent, 64)
	var (
		hosts    []*exec.Cmd
		readers  sync.WaitGroup
		startErr error
	)
	start := time.Now()
	for i := range cfg.Hosts {
		host := "host-" + strconv.Itoa(i+1)
		args := []string{"worker", "--provider", provURL, "--budget", cfg.Budget, "--host", host,
			"--lanes", strconv.Itoa(cfg.Lanes), "--progress", "250ms", "--exit-on-stdin-eof"}
		args = append(args, limitArgs(cfg.Limits)...)
		if !withBudget {
			args = append(args, "--no-budget")
		}
		cmd := exec.CommandContext(runCtx, exe, args...)
		// The URL goes by environment, not argv, where ps would show a
		// password to every user of the machine.
		cmd.Env = append(os.Environ(), "REDIS_URL="+redisURL)
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 5 * time.Second
		dieWithParent(cmd)
		cmd.Stderr = &lineWriter{prefix: host + ": ", out: view.log, redact: a.redact}
		// The host watches its stdin: this end closes when we return, or
		// when this process dies, and the host then stops.
		stdin, err := cmd.StdinPipe()
		if err == nil {
			defer stdin.Close()
		}
		var stdout io.ReadCloser
		if err == nil {
			stdout, err = cmd.StdoutPipe()
		}
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			startErr = fmt.Errorf("starting %s: %v", host, err)
			cancelRun()
			break
		}
		hosts = append(hosts, cmd)
		readers.Go(func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				var ev workerEvent
				if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Type == "" {
					view.log(host + ": " + a.redact(sc.Text()))
					continue
				}
				events <- hostEvent{i, ev}
			}
			io.Copy(io.Discard, stdout)
		})
	}
	go func() {
		readers.Wait()
		close(events)
	}()
	last := make([]workerEvent, cfg.Hosts)
	for ev := range events {
		last[ev.host] = ev.workerEvent
		view.update(ev.host, ev.workerEvent)
	}
	var errs []error
	for i, cmd := range hosts {
		if err := cmd.Wait(); err != nil {
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
		return runReport{}, failure("interrupted")
	case startErr != nil:
		return runReport{}, failure("%v", startErr)
	}
	if err := errors.Join(errs...); err != nil {
		return runReport{}, failure("%s failed: %v", label, err)
	}
	r := runReport{Mode: mode, Seconds: elapsed.Seconds(), Provider: p.stats()}
	for _, ev := range last {
		r.Copied += ev.Copied
		r.Hosts = append(r.Hosts, ev)
	}
	return r, nil
}

type hostEvent struct {
	host int
	workerEvent
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
