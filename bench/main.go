// Command bench measures runbudget against what sits under it (a Redis round
// trip, a bare wake handoff) and against peers doing a similar job
// (go-redis/redis_rate, x/sync/semaphore), all in one run, and reports each
// claim as a ratio to something measured in that same run: on shared, noisy
// machines absolute times mean little, ratios of neighbours much more.
//
//	go run ./bench                 # full run, a few minutes; own redis-server
//	go run ./bench -short          # about 15 s: checks that the program works
//	go run ./bench -redis URL      # use an existing Redis instead
//	go run ./bench -only P9        # 1,000 simulated hosts, minutes; never by default
//
// Every figure is repeated over rounds (5 by default); the table shows the
// median over rounds and their range, and each ratio is the median of
// per-round ratios of figures measured side by side within a round. The
// full results go to a JSON file (-json, default bench/results.json).
// BENCHMARKS.md explains each figure and target.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// config is what the flags set.
type config struct {
	short       bool
	redisURL    string
	redisServer string
	jsonPath    string
	rounds      int
	only        string
	cpuProfile  string
	workerProf  string // directory for the CPU profiles of P3's budget lanes
	workerProcs int    // GOMAXPROCS of P3's and P4's worker processes; 0 leaves Go's default
	progress    io.Writer
}

func main() {
	if isWorker() {
		os.Exit(workerMain())
	}
	var cfg config
	flag.BoolVar(&cfg.short, "short", false, "a run of about 15 s with small samples: checks that the program works, proves nothing")
	flag.StringVar(&cfg.redisURL, "redis", "", "`URL` of a Redis to measure instead of starting one (its other clients will disturb the figures)")
	flag.StringVar(&cfg.redisServer, "redis-server", "auto", "redis-server binary to start on loopback, or auto to find it on PATH")
	flag.StringVar(&cfg.jsonPath, "json", filepath.Join("bench", "results.json"), "`file` for the machine-readable results")
	flag.IntVar(&cfg.rounds, "rounds", 0, "repetitions of every figure (default 5, or 3 with -short)")
	flag.StringVar(&cfg.only, "only", "", "comma-separated `sections` to run (floors,P1,P2,P3,P4,P5,P6,P7,P8,scripts,scale; P9 only when named); default all but P9")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of P7's uncontended in-process loop to `file`")
	flag.StringVar(&cfg.workerProf, "workerprofile", "", "write a CPU profile of each budget-lane worker of P3 and P4 into `dir` (<host>.pprof)")
	flag.IntVar(&cfg.workerProcs, "workerprocs", 0, "GOMAXPROCS of P3's and P4's worker processes, no-op and budget lanes alike (default: Go's, the machine's CPUs); an experiment, not a target's setting")
	flag.Parse()
	cfg.progress = os.Stderr
	if cfg.workerProcs < 0 {
		fmt.Fprintln(os.Stderr, "bench: -workerprocs must be 0 (Go's default) or more")
		os.Exit(2)
	}
	if cfg.workerProf != "" {
		// The workers write there; an absolute path survives their own
		// working directory, and a missing one is made or refused here.
		dir, err := filepath.Abs(cfg.workerProf)
		if err == nil {
			err = os.MkdirAll(dir, 0o755)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: -workerprofile:", err)
			os.Exit(2)
		}
		cfg.workerProf = dir
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// Report is the whole run, as written to the JSON file.
type Report struct {
	Started      time.Time `json:"started"`
	Took         string    `json:"took"`
	Short        bool      `json:"short"`
	Rounds       int       `json:"rounds"`
	GOOS         string    `json:"goos"`
	GOARCH       string    `json:"goarch"`
	CPUs         int       `json:"cpus"`
	GoVersion    string    `json:"go_version"`
	RedisVersion string    `json:"redis_version"`
	RedisMode    string    `json:"redis_mode"` // "own loopback redis-server" or "external"
	Figures      []*Figure `json:"figures"`
	Targets      []*Target `json:"targets"`
	Notes        []string  `json:"notes,omitempty"`
}

// sizes scales the run: the full run proves, the short one only exercises.
type sizes struct {
	rounds       int
	rtCalls      int           // round-trip floor calls per round, 1 goroutine
	rtCalls64    int           // ... 64 goroutines
	p1Calls      int           // uncontended budget calls per round
	scriptCalls  int           // calls per script per round
	wakes        int           // handoffs per round (P2)
	warm, window time.Duration // P3 and P4: warm-up, then the measured window
	depths       []int         // P4 queue depths
	hbLeases     int           // P5
	hbFewLeases  int           // P5b: the small budget beside it
	hbWindows    int           // P5: renewal intervals per round
	hbTTL        time.Duration // P5
	rcCalls      int           // P6 calls per round, 1 goroutine
	rcCalls64    int           // ... 64 goroutines
	inproc       time.Duration // P7 time per figure per round
	p8Run        time.Duration // P8 run per round
	scaleDomains []int         // admission cost against domains in the budget
	shardGroups  []int         // shard groups of the Cluster run (warm and window as P3's)
	memItems     int           // domains, leases, waiters measured for memory
}

func sizesFor(short bool) sizes {
	if short {
		return sizes{rounds: 3, rtCalls: 200, rtCalls64: 2000, p1Calls: 50, scriptCalls: 20, wakes: 20,
			warm: 150 * time.Millisecond, window: 300 * time.Millisecond, depths: []int{10, 100},
			hbLeases: 1000, hbFewLeases: 100, hbWindows: 1, hbTTL: 900 * time.Millisecond, rcCalls: 300, rcCalls64: 2000,
			inproc: 20 * time.Millisecond, p8Run: time.Second, scaleDomains: []int{1, 100}, memItems: 100,
			shardGroups: []int{1, 4, 16}}
	}
	return sizes{rounds: 5, rtCalls: 2000, rtCalls64: 20000, p1Calls: 400, scriptCalls: 200, wakes: 200,
		warm: 300 * time.Millisecond, window: 1500 * time.Millisecond, depths: []int{10, 100, 1000},
		hbLeases: 10000, hbFewLeases: 100, hbWindows: 3, hbTTL: 3 * time.Second, rcCalls: 2000, rcCalls64: 20000,
		inproc: 150 * time.Millisecond, p8Run: 10 * time.Second, scaleDomains: []int{1, 100, 1000, 10000}, memItems: 1000,
		shardGroups: []int{1, 4, 16}}
}

// env is what every section shares.
type env struct {
	cfg      config
	sz       sizes
	base     *redis.Options // every client is a copy of these
	url      string         // for workers
	admin    *redis.Client  // INFO, MEMORY, SLOWLOG: never in a measured path
	own      bool           // we started the server: CONFIG SET is ours
	bin      string         // redis-server to start more servers with (the Cluster of scale); "" if none
	run      string         // unique prefix of this run's names and keys
	rep      *Report
	clients  []*redis.Client
	progress io.Writer
}

// client returns a new client with ContextTimeoutEnabled (the store insists)
// and a pool of the given size; it is closed at the end of the run.
func (e *env) client(pool int) *redis.Client {
	o := *e.base
	o.ContextTimeoutEnabled = true
	o.PoolSize = pool
	c := redis.NewClient(&o)
	e.clients = append(e.clients, c)
	return c
}

// name gives budgets and keys of this run a common, unique prefix.
func (e *env) name(s string) string { return e.run + s }

func (e *env) figure(section, id, name, unit string, latency bool) *Figure {
	f := &Figure{Section: section, ID: id, Name: name, Unit: unit, Latency: latency}
	e.rep.Figures = append(e.rep.Figures, f)
	return f
}

func (e *env) target(t *Target) { e.rep.Targets = append(e.rep.Targets, t) }

func (e *env) note(format string, args ...any) {
	e.rep.Notes = append(e.rep.Notes, fmt.Sprintf(format, args...))
}

func (e *env) logf(format string, args ...any) {
	if e.progress != nil {
		fmt.Fprintf(e.progress, "bench: "+format+"\n", args...)
	}
}

// section is one group of measurements.
type section struct {
	name string
	run  func(context.Context, *env) error
}

var sections = []section{
	{"floors", floors},
	{"P1", p1},
	{"scripts", scriptCosts},
	{"P2", p2},
	{"P3", p3p4},
	{"P5", p5},
	{"P6", p6},
	{"P7", p7},
	{"P8", p8},
	{"scale", scale},
}

// optInSections are long sections (minutes) that run only when -only names
// them, never by default or in the short run. Their figures are merged
// into the results file instead of replacing it (see mergeResults), so a
// run of one of them keeps the full run's figures.
var optInSections = []section{
	{"P9", p9},
}

// run does the whole measurement, prints the table to out and writes the
// JSON file. Every process it starts is gone when it returns.
func run(ctx context.Context, cfg config, out io.Writer) (*Report, error) {
	sz := sizesFor(cfg.short)
	if cfg.rounds > 0 {
		sz.rounds = cfg.rounds
	}
	start := time.Now()
	rep := &Report{Started: start, Short: cfg.short, Rounds: sz.rounds, GOOS: runtime.GOOS, GOARCH: runtime.GOARCH,
		CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	e := &env{cfg: cfg, sz: sz, rep: rep, run: "bench-" + uuid.NewString()[:8] + "-", progress: cfg.progress}

	bin, binErr := cfg.redisServer, error(nil)
	if bin == "" || bin == "auto" {
		bin, binErr = exec.LookPath("redis-server")
	}
	e.bin = bin
	if cfg.redisURL != "" {
		o, err := redis.ParseURL(cfg.redisURL)
		if err != nil {
			return nil, fmt.Errorf("-redis: %v", err) // the parse error never quotes the URL
		}
		e.base, e.url, rep.RedisMode = o, cfg.redisURL, "external"
	} else {
		if binErr != nil {
			return nil, fmt.Errorf("no redis-server on PATH (Debian/Ubuntu: apt-get install redis-server), or give -redis URL: %w", binErr)
		}
		srv, err := startServer(ctx, bin, false)
		if err != nil {
			return nil, err
		}
		defer srv.stop()
		e.base, e.url, e.own, rep.RedisMode = &redis.Options{Addr: srv.addr}, "redis://"+srv.addr+"/0", true, "own loopback redis-server"
	}
	e.admin = e.client(4)
	defer func() {
		for _, c := range e.clients {
			c.Close()
		}
	}()
	if v, err := infoField(ctx, e.admin, "server", "redis_version"); err == nil {
		rep.RedisVersion = v
	} else {
		return nil, fmt.Errorf("reaching Redis: %v", err)
	}
	if !e.own {
		e.note("measured on an external Redis: other clients of it disturb every figure and the command counts")
		defer func() {
			// Budgets and keys of this run: "rb:{<hex of name>}:..." and our own.
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			unlinkMatching(cctx, e.admin, "rb:{"+fmt.Sprintf("%x", e.run)+"*")
			unlinkMatching(cctx, e.admin, e.run+"*")
			unlinkMatching(cctx, e.admin, "rate:"+e.run+"*")
		}()
	}

	want := map[string]bool{}
	for _, s := range strings.Split(cfg.only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			want[strings.ToLower(s)] = true
		}
	}
	var merge []string // opt-in sections run: their figures replace their own in the results file
	for i, s := range slices.Concat(sections, optInSections) {
		optIn := i >= len(sections)
		if (len(want) > 0 || optIn) && !want[strings.ToLower(s.name)] && !(s.name == "P3" && want["p4"]) {
			continue
		}
		if optIn {
			merge = append(merge, s.name)
		}
		t0 := time.Now()
		e.logf("%s ...", s.name)
		if err := s.run(ctx, e); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		e.logf("%s done in %v", s.name, time.Since(t0).Round(time.Millisecond))
	}

	for _, f := range rep.Figures {
		f.summarize()
	}
	// Floors and peers first, then runbudget's figures in section order.
	slices.SortStableFunc(rep.Figures, func(a, b *Figure) int {
		return boolInt(a.Section != sectionFloors) - boolInt(b.Section != sectionFloors)
	})
	rep.Took = time.Since(start).Round(time.Second).String()
	printTable(out, rep)
	if cfg.jsonPath != "" {
		if len(merge) > 0 {
			if err := mergeResults(cfg.jsonPath, rep, merge); err != nil {
				return rep, err
			}
		}
		if err := writeJSON(cfg.jsonPath, rep); err != nil {
			return rep, err
		}
		fmt.Fprintf(out, "\nresults: %s\n", cfg.jsonPath)
	}
	return rep, nil
}

const sectionFloors = "floors and peers"

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func writeJSON(path string, rep *Report) error {
	if dir := filepath.Dir(path); dir != "." {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
