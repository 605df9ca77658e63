package budgetprom

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/runbudget/runbudget/budget"
)

// DefaultWaitBuckets are the wait histogram's bounds in seconds: from an
// uncontended in-process grant (well under a millisecond) to a lane held
// back by a provider's minute-long retry-after.
var DefaultWaitBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// HostOpts configures a HostCollector. The zero value is ready to use: no
// budget or domain label, DefaultWaitBuckets.
type HostOpts struct {
	// Budget, when set, is the value of a "budget" label on every metric, so
	// that several budgets of one process can share a registry. Metrics of
	// one name must carry the same label names in a registry: give every
	// HostCollector registered together a Budget, or none (and DomainLabels
	// on every one of them, or on none).
	Budget string
	// ConstLabels are added to every metric (a run or deployment name, say).
	// They must not reuse budget, class, outcome, domain or op.
	ConstLabels prometheus.Labels
	// Buckets are the wait histogram's upper bounds in seconds, strictly
	// increasing; nil means DefaultWaitBuckets. More buckets cost memory
	// and scrape size per class and outcome seen.
	Buckets []float64
	// DomainLabels, when positive, adds a "domain" label to the acquire and
	// throttle metrics, and is the most distinct domains that get a value
	// of their own: the first DomainLabels domains seen keep theirs for the
	// collector's life, and every later one is counted under domain="other"
	// (runbudget_domain_label_folds_total counts those observations). Zero,
	// the default, means no domain label. The bound is there because each
	// labelled domain costs a histogram per class and outcome seen, and
	// provider domains can number in the millions, which would sink
	// Prometheus.
	//
	// With the label, a request naming several domains is counted once
	// under each of them, so a sum over domains counts it more than once;
	// requests that fail validation never claim a value of their own.
	DomainLabels int
}

// HostCollector is the metrics of one Budget on one host. It is a
// budget.Observer, to be given to budget.New with budget.WithObserver, and
// a prometheus.Collector, to be registered; Attach then hands it the Budget
// for the gauges read at scrape time. Its methods are safe for concurrent
// use, and the observer methods neither block nor allocate once a label
// combination has been seen.
//
// One HostCollector observes one Budget: give each Budget its own, told
// apart by HostOpts.Budget.
type HostCollector struct {
	budget atomic.Pointer[budget.Budget]

	wait        *prometheus.HistogramVec
	acquires    *prometheus.CounterVec
	throttles   *prometheus.CounterVec
	leasesLost  prometheus.Counter
	storeErrors *prometheus.CounterVec
	folds       prometheus.Counter // nil without domain labels

	leasesDesc, waitersDesc, memoryDesc, memLimitDesc *prometheus.Desc

	acq      *cellTable         // without domain labels
	throttle prometheus.Counter // without domain labels
	domains  *domainSet         // nil without domain labels
	storeErr [len(storeOps) + 1]prometheus.Counter
}

var (
	_ budget.Observer      = (*HostCollector)(nil)
	_ prometheus.Collector = (*HostCollector)(nil)
)

// classNames are the class label values by index: budget.Classes, then
// "unknown" for a class no budget knows (a request refused as invalid).
var classNames = func() []string {
	var names []string
	for _, c := range budget.Classes() {
		names = append(names, string(c))
	}
	return append(names, "unknown")
}()

// outcomeNames are the outcome label values, indexed by AcquireOutcome;
// index 0 is "unknown". Counting up to the first unknown outcome keeps the
// table in step with the budget package when it adds one.
var outcomeNames = func() []string {
	names := []string{"unknown"}
	for o := budget.AcquireOutcome(1); o.String() != "unknown"; o++ {
		names = append(names, o.String())
	}
	return names
}()

// storeOps are the store calls a budget.StoreErrorEvent names; any other
// is counted as "other".
var storeOps = [...]string{"register", "acquire", "cancel", "retire", "heartbeat", "throttle", "usage"}

func classIndex(c budget.OpClass) int {
	if i := c.Index(); i >= 0 {
		return i
	}
	return budget.NumClasses
}

func outcomeIndex(o budget.AcquireOutcome) int {
	if int(o) < len(outcomeNames) {
		return int(o)
	}
	return 0
}

func opIndex(op string) int {
	for i, o := range storeOps {
		if o == op {
			return i
		}
	}
	return len(storeOps)
}

// NewHost returns a HostCollector. It fails on buckets that are not
// strictly increasing and on labels the registry would refuse.
func NewHost(opts HostOpts) (*HostCollector, error) {
	buckets := opts.Buckets
	if buckets == nil {
		buckets = DefaultWaitBuckets
	}
	if len(buckets) == 0 {
		return nil, errors.New("budgetprom: HostOpts.Buckets is empty; leave it nil for DefaultWaitBuckets")
	}
	for i, b := range buckets {
		if math.IsNaN(b) || (i > 0 && b <= buckets[i-1]) {
			return nil, fmt.Errorf("budgetprom: HostOpts.Buckets must be strictly increasing, got %v", buckets)
		}
	}
	if opts.DomainLabels < 0 {
		return nil, fmt.Errorf("budgetprom: HostOpts.DomainLabels is negative (%d)", opts.DomainLabels)
	}
	cl := constLabels(opts.ConstLabels, "budget", opts.Budget)
	c := &HostCollector{}
	acqLabels, thrLabels := []string{"class", "outcome"}, []string(nil)
	if opts.DomainLabels > 0 {
		acqLabels, thrLabels = append(acqLabels, "domain"), []string{"domain"}
	}
	c.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:        "runbudget_acquire_wait_seconds",
		Help:        "Time Acquire calls took to return, by class and outcome: the time a lane waited for its turn.",
		ConstLabels: cl,
		Buckets:     buckets,
	}, acqLabels)
	c.acquires = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "runbudget_acquires_total",
		Help:        "Acquire calls that returned, by class and outcome.",
		ConstLabels: cl,
	}, acqLabels)
	c.throttles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "runbudget_throttles_total",
		Help:        "Provider throttles this host reported to the budget.",
		ConstLabels: cl,
	}, thrLabels)
	c.leasesLost = prometheus.NewCounter(prometheus.CounterOpts{
		Name:        "runbudget_leases_lost_total",
		Help:        "Leases found gone from the store while their holder still held them (expired during a pause or partition).",
		ConstLabels: cl,
	})
	c.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "runbudget_store_errors_total",
		Help:        "Store calls that failed, retried or not, by call.",
		ConstLabels: cl,
	}, []string{"op"})
	c.leasesDesc = prometheus.NewDesc("runbudget_host_leases_held",
		"Leases granted on this host that their holders have not yet released in full.", nil, cl)
	c.waitersDesc = prometheus.NewDesc("runbudget_host_waiters",
		"Acquire calls of this host waiting for their turn.", nil, cl)
	c.memoryDesc = prometheus.NewDesc("runbudget_host_memory_held_bytes",
		"Buffer memory this host's leases and waiters hold.", nil, cl)
	c.memLimitDesc = prometheus.NewDesc("runbudget_host_limit_memory_bytes",
		"Ceiling on the buffer memory this host holds (absent when unbounded).", nil, cl)

	for i, op := range storeOps {
		c.storeErr[i] = c.storeErrors.WithLabelValues(op)
	}
	c.storeErr[len(storeOps)] = c.storeErrors.WithLabelValues("other")
	if opts.DomainLabels > 0 {
		c.folds = prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "runbudget_domain_label_folds_total",
			Help:        `Observations counted under domain="other" because HostOpts.DomainLabels domains already had a label value of their own.`,
			ConstLabels: cl,
		})
		c.domains = newDomainSet(opts.DomainLabels, c.folds, func(value string) *domainSeries {
			return &domainSeries{acq: newCellTable(c.wait, c.acquires, value), throttles: c.throttles.WithLabelValues(value)}
		})
	} else {
		c.acq = newCellTable(c.wait, c.acquires, "")
		c.throttle = c.throttles.WithLabelValues()
		// Counters of every known class and outcome exist from the start, at
		// zero, so that rate() and increase() see their first increment.
		// Histograms appear on first use: each is a dozen series or more.
		for ci := range budget.NumClasses {
			for oi := 1; oi < len(outcomeNames); oi++ {
				c.acquires.WithLabelValues(classNames[ci], outcomeNames[oi])
			}
		}
	}
	// A throwaway pedantic registry reports what a real one would refuse
	// (an invalid or clashing const label), here rather than at Register.
	if err := prometheus.NewPedanticRegistry().Register(c); err != nil {
		return nil, fmt.Errorf("budgetprom: %w", err)
	}
	return c, nil
}

// constLabels returns base plus name=value when value is set, as a copy.
func constLabels(base prometheus.Labels, name, value string) prometheus.Labels {
	out := prometheus.Labels{}
	for k, v := range base {
		out[k] = v
	}
	if value != "" {
		out[name] = value
	}
	return out
}

// Attach gives the collector the Budget whose HostStats and limits the
// gauges read at scrape time; until it is called the gauges are left out.
// A later call replaces the Budget.
func (c *HostCollector) Attach(b *budget.Budget) { c.budget.Store(b) }

// ObserveAcquire counts the call and its wait under its class and outcome
// (and, with domain labels, each of its domains).
func (c *HostCollector) ObserveAcquire(ev budget.AcquireEvent) {
	ci, oi := classIndex(ev.Class), outcomeIndex(ev.Outcome)
	waited := ev.Waited.Seconds()
	if c.domains == nil {
		c.acq.get(ci, oi).observe(waited)
		return
	}
	if len(ev.Domains) == 0 { // refused as invalid; still counted
		c.folds.Inc()
		c.domains.other.acq.get(ci, oi).observe(waited)
		return
	}
	mayAdd := ev.Outcome != budget.AcquireInvalid
	// Each series is counted once per call, however many of the request's
	// domains map to it (duplicates, or several folded into "other"). The
	// first few series are remembered on the stack; past that, only equal
	// domains are recognized as repeats.
	var seen [8]*domainSeries
	n := 0
	for i, d := range ev.Domains {
		if repeated(ev.Domains[:i], d) {
			continue
		}
		s := c.domains.series(d, mayAdd)
		if contains(seen[:n], s) {
			continue
		}
		if n < len(seen) {
			seen[n] = s
			n++
		}
		s.acq.get(ci, oi).observe(waited)
	}
}

func repeated(ds []budget.Domain, d budget.Domain) bool {
	for _, e := range ds {
		if e == d {
			return true
		}
	}
	return false
}

func contains(ss []*domainSeries, s *domainSeries) bool {
	for _, t := range ss {
		if t == s {
			return true
		}
	}
	return false
}

// ObserveThrottle counts one throttle report (with domain labels, under
// its domain).
func (c *HostCollector) ObserveThrottle(ev budget.ThrottleEvent) {
	if c.domains == nil {
		c.throttle.Inc()
		return
	}
	c.domains.series(ev.Domain, true).throttles.Inc()
}

// ObserveLeaseLost counts one lost lease.
func (c *HostCollector) ObserveLeaseLost(budget.LeaseLostEvent) { c.leasesLost.Inc() }

// ObserveStoreError counts one failed store call under its op. The error
// text is not used: it could name a key or an address.
func (c *HostCollector) ObserveStoreError(ev budget.StoreErrorEvent) {
	c.storeErr[opIndex(ev.Op)].Inc()
}

// Describe sends the descriptors of every metric the collector may send.
func (c *HostCollector) Describe(ch chan<- *prometheus.Desc) {
	c.wait.Describe(ch)
	c.acquires.Describe(ch)
	c.throttles.Describe(ch)
	c.leasesLost.Describe(ch)
	c.storeErrors.Describe(ch)
	if c.folds != nil {
		c.folds.Describe(ch)
	}
	ch <- c.leasesDesc
	ch <- c.waitersDesc
	ch <- c.memoryDesc
	ch <- c.memLimitDesc
}

// Collect sends the counters and histograms and, once a Budget is
// attached, its HostStats and memory ceiling. It never asks the store.
func (c *HostCollector) Collect(ch chan<- prometheus.Metric) {
	c.wait.Collect(ch)
	c.acquires.Collect(ch)
	c.throttles.Collect(ch)
	c.leasesLost.Collect(ch)
	c.storeErrors.Collect(ch)
	if c.folds != nil {
		c.folds.Collect(ch)
	}
	b := c.budget.Load()
	if b == nil {
		return
	}
	hs := b.HostStats()
	ch <- prometheus.MustNewConstMetric(c.leasesDesc, prometheus.GaugeValue, float64(hs.Leases))
	ch <- prometheus.MustNewConstMetric(c.waitersDesc, prometheus.GaugeValue, float64(hs.Waiters))
	ch <- prometheus.MustNewConstMetric(c.memoryDesc, prometheus.GaugeValue, float64(hs.MemoryHeld))
	if m := b.Limits().MemoryBytes; m > 0 {
		ch <- prometheus.MustNewConstMetric(c.memLimitDesc, prometheus.GaugeValue, float64(m))
	}
}

// cellTable holds the wait histogram and acquire counter children of one
// domain label value (or of none), resolved on first use and then read
// with one atomic load, so that observing allocates nothing.
type cellTable struct {
	wait   *prometheus.HistogramVec
	count  *prometheus.CounterVec
	domain string // the domain label value; "" without domain labels
	cells  []atomic.Pointer[cell]
}

type cell struct {
	wait  prometheus.Observer
	count prometheus.Counter
}

func (c *cell) observe(seconds float64) {
	c.wait.Observe(seconds)
	c.count.Inc()
}

func newCellTable(wait *prometheus.HistogramVec, count *prometheus.CounterVec, domain string) *cellTable {
	return &cellTable{wait: wait, count: count, domain: domain,
		cells: make([]atomic.Pointer[cell], len(classNames)*len(outcomeNames))}
}

func (t *cellTable) get(ci, oi int) *cell {
	p := &t.cells[ci*len(outcomeNames)+oi]
	if c := p.Load(); c != nil {
		return c
	}
	values := []string{classNames[ci], outcomeNames[oi]}
	if t.domain != "" {
		values = append(values, t.domain)
	}
	// Two first uses racing both resolve the same children (WithLabelValues
	// returns the existing one), so whichever store wins is right.
	c := &cell{wait: t.wait.WithLabelValues(values...), count: t.count.WithLabelValues(values...)}
	p.CompareAndSwap(nil, c)
	return p.Load()
}
