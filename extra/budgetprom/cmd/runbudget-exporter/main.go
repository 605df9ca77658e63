// Command runbudget-exporter serves the state of every runbudget budget in
// one Redis as Prometheus metrics: an operator's view of the whole run,
// whatever hosts take part and whether or not they export metrics of their
// own.
//
//	runbudget-exporter --redis redis://redis:6379/0 --listen 127.0.0.1:9479
//
// Each scrape of /metrics reads Redis afresh (one List and one Inspect per
// budget, bounded by --scrape-timeout). When Redis is down or slow the
// scrape still answers, at once, with runbudget_exporter_scrape_error 1.
// The Redis URL may also come from REDIS_URL; its credentials never appear
// in the metrics or the log.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/extra/budgetprom"
	"github.com/runbudget/runbudget/redisstore"
)

// defaultListen is loopback: metrics name budgets and domains, which are
// not for every network the host is on. Containers pass --listen :9479.
const defaultListen = "127.0.0.1:9479"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "runbudget-exporter:", err)
		os.Exit(1)
	}
}

type config struct {
	redisURL   string
	cluster    bool
	listen     string
	path       string
	timeout    time.Duration
	maxDomains int
}

// run parses args, serves until ctx ends, and then shuts the server down.
// listening, if set, is told the address once the listener is open.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, listening func(net.Addr)) error {
	fs := flag.NewFlagSet("runbudget-exporter", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	fs.StringVar(&cfg.redisURL, "redis", "", "Redis URL, redis://[user:password@]host[:port][/db] or rediss://... (default $REDIS_URL)")
	fs.BoolVar(&cfg.cluster, "cluster", false, "the URL names a Redis Cluster (more nodes as ?addr=host:port)")
	fs.StringVar(&cfg.listen, "listen", defaultListen, "address to serve metrics on")
	fs.StringVar(&cfg.path, "path", "/metrics", "URL path of the metrics")
	fs.DurationVar(&cfg.timeout, "scrape-timeout", budgetprom.DefaultScrapeTimeout, "bound on reading Redis per scrape; keep it below Prometheus's scrape_timeout")
	fs.IntVar(&cfg.maxDomains, "max-domains", budgetprom.DefaultMaxDomains, "most domains per budget given series of their own (the busiest are kept)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q; every setting is a flag", fs.Args())
	}
	if cfg.redisURL == "" {
		cfg.redisURL = getenv("REDIS_URL")
	}
	if cfg.timeout <= 0 || cfg.maxDomains <= 0 || !strings.HasPrefix(cfg.path, "/") {
		return errors.New("--scrape-timeout and --max-domains must be positive, and --path must start with /")
	}
	red := redactor(urlSecrets(cfg.redisURL))
	log := slog.New(slog.NewTextHandler(stderr, nil))
	// go-redis logs every failed dial on its own, through a process-wide
	// logger; the scrape log below already says what failed, once, so its
	// lines go to debug level (masked like everything else).
	redis.SetLogger(redisLog{log, red})

	client, where, err := newClient(cfg.redisURL, cfg.cluster, cfg.timeout)
	if err != nil {
		return errors.New(red(err.Error()))
	}
	defer client.Close()
	admin, err := redisstore.NewAdmin(client)
	if err != nil {
		return err
	}
	sl := &scrapeLog{log: log, redact: red}
	exp, err := budgetprom.NewExporter(admin, budgetprom.ExporterOpts{Timeout: cfg.timeout, MaxDomains: cfg.maxDomains, OnScrape: sl.report})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(exp, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	mux := http.NewServeMux()
	mux.Handle(cfg.path, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// A gathering problem (say, two budgets whose names collide as
		// label values) costs those series, not the whole page.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      promLogger{log, red},
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "runbudget-exporter: metrics at %s\n", cfg.path)
	})

	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving budgets", "listen", ln.Addr().String(), "path", cfg.path, "redis", where)
	if listening != nil {
		listening(ln.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// A scrape in progress ends within the scrape timeout; give it that.
	sctx, cancel := context.WithTimeout(context.Background(), cfg.timeout+time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// newClient builds a client for raw with deadlines fit for scrapes, and
// returns where it points (addresses only, never the URL). Errors never
// quote the URL: url.Parse puts the whole input, password included, into
// its errors, so a failed parse gets a fixed message instead.
func newClient(raw string, cluster bool, timeout time.Duration) (redis.UniversalClient, string, error) {
	const want = "want redis://[user:password@]host[:port][/db] or rediss://..."
	if raw == "" {
		return nil, "", errors.New("no Redis given: pass --redis URL or set REDIS_URL")
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, "", fmt.Errorf("bad Redis URL: no scheme (%s)", want)
	}
	if scheme != "redis" && scheme != "rediss" && (cluster || scheme != "unix") {
		return nil, "", fmt.Errorf("bad Redis URL: scheme %q is not redis or rediss (or unix, without --cluster)", scheme)
	}
	if _, err := url.Parse(raw); err != nil {
		return nil, "", fmt.Errorf("bad Redis URL: it does not parse (%s; not shown, since it may hold a password)", want)
	}
	// Short per-call timeouts, one retry and one dial attempt: a scrape
	// must answer within its own bound even when Redis does not, and a
	// refused connection should show as a scrape error at once (the next
	// scrape tries again).
	dial, rw := min(2*time.Second, timeout), min(3*time.Second, timeout)
	if cluster {
		opt, err := redis.ParseClusterURL(raw)
		if err != nil {
			return nil, "", fmt.Errorf("bad Redis URL: %v", err)
		}
		opt.ContextTimeoutEnabled, opt.MaxRetries, opt.DialerRetries = true, 1, 1
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = dial, rw, rw
		return redis.NewClusterClient(opt), strings.Join(opt.Addrs, ","), nil
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return nil, "", fmt.Errorf("bad Redis URL: %v", err)
	}
	opt.ContextTimeoutEnabled, opt.MaxRetries, opt.DialerRetries, opt.PoolSize = true, 1, 1, 4
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = dial, rw, rw
	return redis.NewClient(opt), opt.Addr, nil
}

// urlSecrets returns what in a Redis URL may be a credential: the password
// of its user info, as written and decoded, and the value of any query
// option whose name mentions a password. It reads text that does not parse
// too, taking the user info to be what stands between "://" and the last
// "@".
func urlSecrets(raw string) []string {
	var out []string
	add := func(s string) {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	rest := raw
	if _, after, ok := strings.Cut(rest, "://"); ok {
		rest = after
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		if _, pw, ok := strings.Cut(rest[:i], ":"); ok {
			add(pw)
			if dec, err := url.PathUnescape(pw); err == nil {
				add(dec)
			}
		}
	}
	if u, err := url.Parse(raw); err == nil {
		if pw, ok := u.User.Password(); ok {
			add(pw)
		}
		for k, vs := range u.Query() {
			if strings.Contains(strings.ToLower(k), "pass") {
				for _, v := range vs {
					add(v)
				}
			}
		}
	}
	// Longest first, so that a secret holding a shorter one is masked whole.
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// redactor returns a function that masks every secret in a text.
func redactor(secrets []string) func(string) string {
	return func(s string) string {
		for _, sec := range secrets {
			s = strings.ReplaceAll(s, sec, "[redacted]")
		}
		return s
	}
}

// scrapeLog logs scrape failures when they start or change and says when
// Redis can be read again, instead of a line per failed scrape.
type scrapeLog struct {
	log    *slog.Logger
	redact func(string) string

	mu   sync.Mutex
	last string // the failure last logged; "" while scrapes succeed
}

func (s *scrapeLog) report(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		if s.last != "" {
			s.log.Info("scrape succeeded again")
			s.last = ""
		}
		return
	}
	msg := s.redact(err.Error())
	if msg != s.last {
		s.log.Warn("scrape failed; serving runbudget_exporter_scrape_error 1", "err", msg)
		s.last = msg
	}
}

// promLogger is promhttp's error log, masked.
type promLogger struct {
	log    *slog.Logger
	redact func(string) string
}

func (p promLogger) Println(v ...any) {
	p.log.Error(p.redact(strings.TrimSuffix(fmt.Sprintln(v...), "\n")))
}

// redisLog is go-redis's logger, masked and at debug level.
type redisLog struct {
	log    *slog.Logger
	redact func(string) string
}

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	r.log.DebugContext(ctx, r.redact(fmt.Sprintf(format, v...)), "from", "go-redis")
}
