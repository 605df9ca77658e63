package budgetprom

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/redisstore"
)

// Inspector is what the Exporter reads budgets through; *redisstore.Admin
// is one.
type Inspector interface {
	List(ctx context.Context) ([]redisstore.BudgetSummary, error)
	Inspect(ctx context.Context, name string, most int) (redisstore.Inspection, error)
}

var _ Inspector = (*redisstore.Admin)(nil)

// Defaults of ExporterOpts.
const (
	DefaultScrapeTimeout = 5 * time.Second
	DefaultMaxDomains    = 500
)

// ExporterOpts configures an Exporter. The zero value is ready to use.
type ExporterOpts struct {
	// Timeout bounds one whole scrape: listing the budgets and inspecting
	// each. Zero means DefaultScrapeTimeout. Keep it below Prometheus's
	// scrape_timeout, or Prometheus gives up first and records nothing.
	Timeout time.Duration
	// MaxDomains bounds how many domains of one budget get series of their
	// own; zero means DefaultMaxDomains. Past it the busiest domains are
	// kept (throttled or paused ones first, then by requests in flight,
	// open bodies and waiters) and the rest are counted in
	// runbudget_exporter_domains_omitted.
	MaxDomains int
	// ConstLabels are added to every metric. They must not reuse budget,
	// domain or class.
	ConstLabels prometheus.Labels
	// OnScrape, if set, is called after every scrape with what went wrong
	// (nil when nothing did). It runs on the scraping goroutine, so it must
	// not block. The error names budgets and Redis addresses, never a
	// credential that go-redis was given, but a caller that logs it should
	// still mask what its Redis URL carries.
	OnScrape func(error)
}

// Exporter is a prometheus.Collector that reads every budget of one Redis
// (or Cluster) on each scrape: per budget its limits, leases and waiters,
// and per domain requests in flight by class, open bodies,
// waiters, rate factor, pause left and tokens. Each scrape is one List and
// one Inspect per budget, all within ExporterOpts.Timeout; whatever was
// read before a failure is still served, and
// runbudget_exporter_scrape_error says the scrape was not complete.
//
// Memory is not here: each host bounds and holds its own, and Redis never
// sees it (HostCollector exports it). Ceilings are exported only for
// bounded dimensions (a zero limit means
// unbounded and has no series), so a dashboard draws a ceiling line
// exactly where there is one.
type Exporter struct {
	in         Inspector
	timeout    time.Duration
	maxDomains int
	onScrape   func(error)

	scrapeError, scrapeDuration, budgets, omitted     *prometheus.Desc
	bDomains, bLeases, bWaiters                       *prometheus.Desc
	limRate, limBurst, limInFlight, limBodies         *prometheus.Desc
	dInFlight, dBodies, dWaiters, dFactor, dThrottled *prometheus.Desc
	dPause, dTokens, dRate                            *prometheus.Desc
}

var _ prometheus.Collector = (*Exporter)(nil)

// NewExporter returns an Exporter reading through in. It fails on a nil
// in, on negative options and on labels a registry would refuse.
func NewExporter(in Inspector, opts ExporterOpts) (*Exporter, error) {
	if in == nil {
		return nil, errors.New("budgetprom: NewExporter needs an Inspector")
	}
	if opts.Timeout < 0 || opts.MaxDomains < 0 {
		return nil, fmt.Errorf("budgetprom: ExporterOpts has a negative Timeout (%v) or MaxDomains (%d)", opts.Timeout, opts.MaxDomains)
	}
	e := &Exporter{in: in, timeout: cmp.Or(opts.Timeout, DefaultScrapeTimeout),
		maxDomains: cmp.Or(opts.MaxDomains, DefaultMaxDomains), onScrape: opts.OnScrape}
	cl := constLabels(opts.ConstLabels, "", "")
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, cl)
	}
	b, dom := []string{"budget"}, []string{"budget", "domain"}
	e.scrapeError = d("runbudget_exporter_scrape_error", "1 when the last scrape could not read every budget (Redis down or slow, a malformed reply), else 0.")
	e.scrapeDuration = d("runbudget_exporter_scrape_duration_seconds", "How long the last scrape of Redis took.")
	e.budgets = d("runbudget_exporter_budgets", "Budgets found in Redis by the last scrape.")
	e.omitted = d("runbudget_exporter_domains_omitted", "Domains of a budget left without series of their own because the budget has more than the exporter's domain bound.", b...)
	e.bDomains = d("runbudget_budget_domains", "Domains with something held, queued or throttled.", b...)
	e.bLeases = d("runbudget_budget_leases", "Leases held on the budget by every host; may include leases expired less than a lease TTL ago and not yet reclaimed.", b...)
	e.bWaiters = d("runbudget_budget_waiters", "Acquire calls waiting on the budget on every host; may include waiters of crashed hosts for up to a lease TTL.", b...)
	e.limRate = d("runbudget_budget_limit_requests_per_second", "Ceiling on request starts per domain per second (absent when unbounded).", b...)
	e.limBurst = d("runbudget_budget_limit_burst", "Starts that may bunch together on one domain (absent without a rate ceiling).", b...)
	e.limInFlight = d("runbudget_budget_limit_in_flight", "Ceiling on requests in flight per domain, by class (absent for unbounded classes).", "budget", "class")
	e.limBodies = d("runbudget_budget_limit_open_bodies", "Ceiling on response bodies open at once per domain (absent when unbounded).", b...)
	e.dInFlight = d("runbudget_domain_in_flight", "Requests in flight on the domain, by class, over every host.", "budget", "domain", "class")
	e.dBodies = d("runbudget_domain_open_bodies", "Response bodies open on the domain, over every host.", dom...)
	e.dWaiters = d("runbudget_domain_waiters", "Requests queued on the domain, over every host.", dom...)
	e.dFactor = d("runbudget_domain_rate_factor", "Share of the domain's rate in force after provider throttles: 1 when unthrottled.", dom...)
	e.dThrottled = d("runbudget_domain_throttled", "1 while the domain is backing off from a provider throttle, else 0.", dom...)
	e.dPause = d("runbudget_domain_pause_remaining_seconds", "Time before new starts on the domain may resume after a provider's retry-after; 0 when not paused.", dom...)
	e.dTokens = d("runbudget_domain_tokens", "Tokens in the domain's start bucket (absent when starts are not rate limited).", dom...)
	e.dRate = d("runbudget_domain_rate_per_second", "Rate the domain's start bucket refills at now: the rate ceiling, or the measured start rate of a throttled domain without one, times the rate factor.", dom...)
	if err := prometheus.NewPedanticRegistry().Register(e); err != nil {
		return nil, fmt.Errorf("budgetprom: exporter: %w", err)
	}
	return e, nil
}

// Describe sends every descriptor the exporter uses.
func (e *Exporter) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{e.scrapeError, e.scrapeDuration, e.budgets, e.omitted,
		e.bDomains, e.bLeases, e.bWaiters,
		e.limRate, e.limBurst, e.limInFlight, e.limBodies,
		e.dInFlight, e.dBodies, e.dWaiters, e.dFactor, e.dThrottled, e.dPause, e.dTokens, e.dRate} {
		ch <- d
	}
}

// Collect reads Redis once, within the timeout, and sends what it read
// and how the read went.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	defer cancel()
	ms, err := e.scrape(ctx)
	for _, m := range ms {
		ch <- m
	}
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(e.scrapeError, prometheus.GaugeValue, failed)
	ch <- prometheus.MustNewConstMetric(e.scrapeDuration, prometheus.GaugeValue, time.Since(start).Seconds())
	if e.onScrape != nil {
		e.onScrape(err)
	}
}

// scrape lists the budgets and inspects each, returning the metrics of
// every budget it read and the errors of those it could not.
func (e *Exporter) scrape(ctx context.Context) ([]prometheus.Metric, error) {
	list, err := e.in.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("budgetprom: listing budgets: %w", err)
	}
	var (
		out   []prometheus.Metric
		errs  []error
		found int
		used  = map[string]bool{}
	)
	for _, s := range list {
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("budgetprom: scrape ran out of time (%v) with budgets left to read: %w", e.timeout, ctx.Err()))
			break
		}
		in, err := e.in.Inspect(ctx, s.Name, 1)
		if errors.Is(err, redisstore.ErrNoBudget) {
			continue // gone (expired, idle) between List and Inspect
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("budgetprom: inspecting budget %s: %w", strconv.Quote(s.Name), err))
			found++
			continue
		}
		found++
		label := budgetLabel(s.Name)
		if used[label] {
			errs = append(errs, fmt.Errorf("budgetprom: budget %s has the same label value as another budget; left out", strconv.Quote(s.Name)))
			continue
		}
		used[label] = true
		out = e.budgetMetrics(out, label, s, in)
	}
	out = append(out, prometheus.MustNewConstMetric(e.budgets, prometheus.GaugeValue, float64(found)))
	return out, errors.Join(errs...)
}

// budgetLabel is a budget's name as a label value: the name itself, or,
// when it is not valid UTF-8 (which a label value must be), its quoted
// form.
func budgetLabel(name string) string {
	if utf8.ValidString(name) {
		return name
	}
	return strconv.Quote(name)
}

func (e *Exporter) budgetMetrics(out []prometheus.Metric, label string, s redisstore.BudgetSummary, in redisstore.Inspection) []prometheus.Metric {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		out = append(out, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...))
	}
	gauge(e.bDomains, float64(len(in.Domains)), label)
	gauge(e.bLeases, float64(s.Leases), label)
	gauge(e.bWaiters, float64(s.Waiters), label)
	l := in.Limits
	if l.RequestsPerSecond > 0 {
		gauge(e.limRate, l.RequestsPerSecond, label)
		gauge(e.limBurst, float64(l.Burst), label)
	}
	for _, c := range budget.Classes() {
		if n := l.InFlight[c]; n > 0 {
			gauge(e.limInFlight, float64(n), label, string(c))
		}
	}
	if l.OpenBodies > 0 {
		gauge(e.limBodies, float64(l.OpenBodies), label)
	}

	doms := in.Domains
	if len(doms) > e.maxDomains {
		doms = slices.Clone(doms)
		slices.SortStableFunc(doms, busier)
		doms = doms[:e.maxDomains]
	}
	gauge(e.omitted, float64(len(in.Domains)-len(doms)), label)
	for _, ds := range doms {
		dl := ds.Domain.String()
		for _, c := range budget.Classes() {
			gauge(e.dInFlight, float64(ds.InFlight[c]), label, dl, string(c))
		}
		gauge(e.dBodies, float64(ds.OpenBodies), label, dl)
		gauge(e.dWaiters, float64(ds.Waiters), label, dl)
		gauge(e.dFactor, ds.RateFactor, label, dl)
		gauge(e.dThrottled, boolValue(ds.Throttled), label, dl)
		gauge(e.dPause, ds.Paused.Seconds(), label, dl)
		if ds.Rate > 0 {
			gauge(e.dTokens, ds.Tokens, label, dl)
			gauge(e.dRate, ds.Rate, label, dl)
		}
	}
	return out
}

// busier orders the domains an operator most needs to see first: those
// backing off from a throttle or paused, then by load.
func busier(a, b redisstore.DomainState) int {
	if c := cmp.Compare(boolValue(b.Throttled || b.Paused > 0), boolValue(a.Throttled || a.Paused > 0)); c != 0 {
		return c
	}
	return cmp.Compare(load(b), load(a))
}

func load(d redisstore.DomainState) int {
	n := d.OpenBodies + d.Waiters
	for _, v := range d.InFlight {
		n += v
	}
	return n
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
