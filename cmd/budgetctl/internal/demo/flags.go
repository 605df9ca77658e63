package demo

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/cmd/budgetctl/internal/clitext"
	"github.com/spf13/pflag"
)

// The flags of the demo's three commands. Each set registers on a command's
// flag set and resolves, after parsing, to a checked configuration; an
// error from Resolve is the user's (a usage error). The worker's flags are
// also rendered back (hostArgs): the demo starts its hosts with them.

// LimitFlags are the budget's flags, shared by the demo and the worker.
type LimitFlags struct {
	rps                   float64
	burst                 int
	get, list, head, copy int
	bodies                int
	memory                clitext.ByteSize
}

// Register defines the budget's flags on f.
func (l *LimitFlags) Register(f *pflag.FlagSet) {
	l.memory = 512 << 10
	f.Float64Var(&l.rps, "rps", 180, "budget: requests per second per domain (demo default: 90% of --quota; 0: unbounded)")
	f.IntVar(&l.burst, "burst", 20, "budget: burst of starts (demo default: --quota/10; 0: one second's worth)")
	f.IntVar(&l.list, "list", 2, "budget: list requests in flight (0: unbounded)")
	f.IntVar(&l.head, "head", 4, "budget: head requests in flight (0: unbounded)")
	f.IntVar(&l.get, "get", 8, "budget: get requests in flight (0: unbounded)")
	f.IntVar(&l.copy, "copy-source-read", 0, "budget: copy_source_read requests in flight (unused by the demo; 0: unbounded)")
	f.IntVar(&l.bodies, "bodies", 12, "budget: open response bodies (0: unbounded)")
	f.Var(&l.memory, "memory", "budget: buffer memory each host may hold (0: unbounded)")
}

// Limits returns the budget.Limits the flags describe, normalized. With a
// quota (the demo), rps and burst that f did not set follow it: 90% of the
// quota, the headroom any client should leave for jitter, and a tenth of
// it. Invalid limits are an error wrapping budget.ErrInvalidLimits.
func (l *LimitFlags) Limits(f *pflag.FlagSet, quota float64) (budget.Limits, error) {
	rps, burst := l.rps, l.burst
	if quota > 0 && !f.Changed("rps") {
		rps = 0.9 * quota
	}
	if quota > 0 && !f.Changed("burst") {
		burst = max(1, int(quota/10))
	}
	lim := budget.Limits{RequestsPerSecond: rps, Burst: burst, OpenBodies: l.bodies, MemoryBytes: int64(l.memory),
		InFlight: map[budget.OpClass]int{budget.OpList: l.list, budget.OpHead: l.head, budget.OpGet: l.get, budget.OpCopySourceRead: l.copy}}
	n, err := lim.Normalize()
	if err != nil {
		return budget.Limits{}, fmt.Errorf("budget flags: %w", err)
	}
	return n, nil
}

// limitArgs renders limits as the flags LimitFlags defines, so that a host
// started by the demo runs with the demo's limits exactly.
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

// Flags are the demo command's flags.
type Flags struct {
	cfg    Config
	limits LimitFlags
	size   clitext.ByteSize
}

// Register defines the demo's flags on f.
func (d *Flags) Register(f *pflag.FlagSet) {
	d.size = 32 << 10
	f.IntVar(&d.cfg.Hosts, "hosts", 4, "worker processes")
	f.IntVar(&d.cfg.Lanes, "lanes", 8, "lanes per worker")
	f.IntVar(&d.cfg.Objects, "objects", 1200, "objects to copy")
	f.Var(&d.size, "size", "mean object size (sizes vary from half to one and a half times it)")
	f.Float64Var(&d.cfg.Quota, "quota", 200, "provider: requests per second it admits")
	f.IntVar(&d.cfg.MaxConcurrent, "max-concurrent", 24, "provider: requests served at once, open bodies included")
	f.StringVar(&d.cfg.Budget, "budget", "demo", "budget name in Redis")
	f.BoolVar(&d.cfg.NoBaseline, "no-baseline", false, "skip the comparison run without the budget")
	f.Float64Var(&d.cfg.RefusalCost, "refusal-cost", DefaultRefusalCost, "provider: what one 503 costs it, in requests of its quota (0: refusals are free)")
	f.IntVar(&d.cfg.Attempts, "attempts", DefaultAttempts, "client: attempts per request before a lane gives the object up")
	f.Uint64Var(&d.cfg.Seed, "seed", 1, "seed for object sizes and the provider's latency jitter")
	d.limits.Register(f)
}

// Resolve returns the run the parsed flags describe.
func (d *Flags) Resolve(f *pflag.FlagSet) (Config, error) {
	cfg := d.cfg
	if cfg.Hosts <= 0 || cfg.Lanes <= 0 || cfg.Objects <= 0 || cfg.Quota <= 0 || d.size <= 0 || cfg.Attempts <= 0 {
		return Config{}, errors.New("--hosts, --lanes, --objects, --quota, --size and --attempts must be positive")
	}
	if cfg.RefusalCost < 0 || cfg.RefusalCost > 1 {
		return Config{}, errors.New("--refusal-cost is between 0 and 1")
	}
	cfg.RefusalCost = refusalCostConfig(cfg.RefusalCost)
	if cfg.Objects > 999999 {
		return Config{}, errors.New("--objects is at most 999999")
	}
	cfg.Size = int64(d.size)
	var err error
	if cfg.Limits, err = d.limits.Limits(f, cfg.Quota); err != nil {
		return Config{}, err
	}
	if m, largest := cfg.Limits.MemoryBytes, cfg.Size*3/2+1; m > 0 && m < largest {
		return Config{}, fmt.Errorf("--memory %s is below the largest object (%s): no GET could ever be admitted",
			clitext.Bytes(m), clitext.Bytes(largest))
	}
	return cfg, nil
}

// WorkerFlags are the worker command's flags: what one host is told.
type WorkerFlags struct {
	cfg    WorkerConfig
	limits LimitFlags
	// ExitOnStdinEOF: the host stops when its stdin closes (the demo sets
	// it, and holds the host's stdin open while it runs).
	ExitOnStdinEOF bool
}

// Register defines the worker's flags on f.
func (w *WorkerFlags) Register(f *pflag.FlagSet) {
	f.StringVar(&w.cfg.Provider, "provider", "", "the provider's base URL, e.g. http://provider:8080")
	f.StringVar(&w.cfg.Budget, "budget", "demo", "budget name in Redis")
	f.StringVar(&w.cfg.Host, "host", "", "this host's name, used as the leases' consumer (default hostname-pid)")
	f.IntVar(&w.cfg.Lanes, "lanes", 8, "concurrent lanes on this host")
	f.BoolVar(&w.cfg.NoBudget, "no-budget", false, "baseline: per-lane limits instead of the shared budget")
	f.IntVar(&w.cfg.Attempts, "attempts", DefaultAttempts, "attempts per request before a lane gives the object up")
	f.DurationVar(&w.cfg.LeaseTTL, "lease-ttl", 5*time.Second, "lease TTL: a dead host's slots return within it")
	f.DurationVar(&w.cfg.Progress, "progress", 500*time.Millisecond, "how often to print a progress line")
	f.BoolVar(&w.ExitOnStdinEOF, "exit-on-stdin-eof", false, "exit when stdin closes (the demo sets it)")
	f.MarkHidden("exit-on-stdin-eof")
	w.limits.Register(f)
}

// Resolve returns the host the parsed flags describe; a host without
// --host is named after the machine and process.
func (w *WorkerFlags) Resolve(f *pflag.FlagSet) (WorkerConfig, error) {
	cfg := w.cfg
	if cfg.Provider == "" {
		return WorkerConfig{}, errors.New("worker needs --provider URL")
	}
	if cfg.Lanes <= 0 || cfg.Progress <= 0 || cfg.LeaseTTL <= 0 || cfg.Attempts <= 0 {
		return WorkerConfig{}, errors.New("--lanes, --attempts, --progress and --lease-ttl must be positive")
	}
	var err error
	if cfg.Limits, err = w.limits.Limits(f, 0); err != nil {
		return WorkerConfig{}, err
	}
	if cfg.Host == "" {
		h, _ := os.Hostname()
		cfg.Host = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	return cfg, nil
}

// hostArgs renders a host's configuration as the flags WorkerFlags
// defines, with --exit-on-stdin-eof: the command line of one of the demo's
// hosts, after the arguments that select the worker command. LeaseTTL is
// left to its default.
func hostArgs(cfg WorkerConfig) []string {
	args := []string{"--provider", cfg.Provider, "--budget", cfg.Budget, "--host", cfg.Host,
		"--lanes", strconv.Itoa(cfg.Lanes), "--attempts", strconv.Itoa(cfg.Attempts), "--progress", cfg.Progress.String(), "--exit-on-stdin-eof"}
	args = append(args, limitArgs(cfg.Limits)...)
	if cfg.NoBudget {
		args = append(args, "--no-budget")
	}
	return args
}

// ProviderFlags are the provider command's flags.
type ProviderFlags struct {
	cfg    ProviderConfig
	size   clitext.ByteSize
	listen string
	every  time.Duration
}

// Register defines the provider's flags on f.
func (p *ProviderFlags) Register(f *pflag.FlagSet) {
	p.size = 32 << 10
	f.StringVar(&p.listen, "listen", "127.0.0.1:8080", "address to serve on")
	f.Float64Var(&p.cfg.Quota, "quota", 200, "requests per second the provider admits")
	f.IntVar(&p.cfg.MaxConcurrent, "max-concurrent", 24, "requests served at once, open bodies included (0: unbounded)")
	f.IntVar(&p.cfg.Objects, "objects", 1200, "objects to serve")
	f.Var(&p.size, "size", "mean object size")
	f.Float64Var(&p.cfg.RefusalCost, "refusal-cost", DefaultRefusalCost, "what one 503 costs the provider, in requests of its quota (0: refusals are free)")
	f.Uint64Var(&p.cfg.Seed, "seed", 1, "seed for object sizes and latency jitter")
	f.DurationVar(&p.every, "log-every", 5*time.Second, "how often to log counters while requests arrive")
}

// Resolve returns the provider the parsed flags describe, the address to
// serve it on and how often to log its counters.
func (p *ProviderFlags) Resolve() (cfg ProviderConfig, listen string, every time.Duration, err error) {
	cfg = p.cfg
	if cfg.Objects <= 0 || cfg.Quota <= 0 || p.size <= 0 {
		return ProviderConfig{}, "", 0, errors.New("--objects, --quota and --size must be positive")
	}
	if p.every <= 0 {
		return ProviderConfig{}, "", 0, errors.New("--log-every must be positive")
	}
	if cfg.RefusalCost < 0 || cfg.RefusalCost > 1 {
		return ProviderConfig{}, "", 0, errors.New("--refusal-cost is between 0 and 1")
	}
	cfg.RefusalCost = refusalCostConfig(cfg.RefusalCost)
	cfg.Size = int64(p.size)
	return cfg, p.listen, p.every, nil
}
