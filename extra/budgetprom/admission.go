package budgetprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/runbudget/runbudget/admission"
)

// AdmissionOpts labels the metrics of one admission limiter.
type AdmissionOpts struct {
	// Limiter, when set, is the value of a "limiter" label, so that several
	// limiters of one process can share a registry (as with HostOpts.Budget:
	// set it on every collector of a kind registered together, or on none).
	Limiter string
	// ConstLabels are added to every metric. They must not reuse limiter.
	ConstLabels prometheus.Labels
}

// ConcurrencyCollector exports an admission.Concurrency's snapshot: its
// capacity and calls in flight as gauges, and its admitted, rejected and
// canceled counts as counters. Each scrape takes one Snapshot, so the
// values are consistent with one another.
type ConcurrencyCollector struct {
	c                            *admission.Concurrency
	capacity, inFlight           *prometheus.Desc
	admitted, rejected, canceled *prometheus.Desc
}

var _ prometheus.Collector = (*ConcurrencyCollector)(nil)

// NewConcurrencyCollector returns a collector of c. It fails on a nil c
// and on labels a registry would refuse.
func NewConcurrencyCollector(c *admission.Concurrency, opts AdmissionOpts) (*ConcurrencyCollector, error) {
	if c == nil {
		return nil, errors.New("budgetprom: NewConcurrencyCollector needs a Concurrency")
	}
	cl := constLabels(opts.ConstLabels, "limiter", opts.Limiter)
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("runbudget_admission_concurrency_"+name, help, nil, cl)
	}
	cc := &ConcurrencyCollector{
		c:        c,
		capacity: d("capacity", "Calls the concurrency limiter admits at once."),
		inFlight: d("in_flight", "Admitted calls whose endpoint has not yet returned; above capacity for a while after the capacity is lowered."),
		admitted: d("admitted_total", "Calls that got a permit."),
		rejected: d("rejected_total", `Calls refused as "overloaded" because every permit was taken.`),
		canceled: d("canceled_total", "Calls refused because their context was done on arrival."),
	}
	if err := prometheus.NewPedanticRegistry().Register(cc); err != nil {
		return nil, fmt.Errorf("budgetprom: concurrency collector: %w", err)
	}
	return cc, nil
}

// Describe sends the collector's five descriptors.
func (cc *ConcurrencyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- cc.capacity
	ch <- cc.inFlight
	ch <- cc.admitted
	ch <- cc.rejected
	ch <- cc.canceled
}

// Collect sends one snapshot's values.
func (cc *ConcurrencyCollector) Collect(ch chan<- prometheus.Metric) {
	s := cc.c.Snapshot()
	ch <- prometheus.MustNewConstMetric(cc.capacity, prometheus.GaugeValue, float64(s.Capacity))
	ch <- prometheus.MustNewConstMetric(cc.inFlight, prometheus.GaugeValue, float64(s.InFlight))
	ch <- prometheus.MustNewConstMetric(cc.admitted, prometheus.CounterValue, float64(s.Admitted))
	ch <- prometheus.MustNewConstMetric(cc.rejected, prometheus.CounterValue, float64(s.Rejected))
	ch <- prometheus.MustNewConstMetric(cc.canceled, prometheus.CounterValue, float64(s.Canceled))
}

// RateCollector exports an admission.Rate's policy: its refill rate, its
// burst and the policy's version, which grows by one on every change (so
// changes() over it shows when the policy was replaced). A Rate keeps no
// counts of its decisions, so there are none to export.
type RateCollector struct {
	r                         *admission.Rate
	perSecond, burst, version *prometheus.Desc
}

var _ prometheus.Collector = (*RateCollector)(nil)

// NewRateCollector returns a collector of r. It fails on a nil r and on
// labels a registry would refuse.
func NewRateCollector(r *admission.Rate, opts AdmissionOpts) (*RateCollector, error) {
	if r == nil {
		return nil, errors.New("budgetprom: NewRateCollector needs a Rate")
	}
	cl := constLabels(opts.ConstLabels, "limiter", opts.Limiter)
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("runbudget_admission_rate_"+name, help, nil, cl)
	}
	rc := &RateCollector{
		r:         r,
		perSecond: d("per_second", "Tokens the rate limiter's bucket gains each second; each admitted call spends one."),
		burst:     d("burst", "Tokens the rate limiter's bucket holds at most."),
		version:   d("policy_version", "Version of the rate policy in force: 1 at construction, one more for every change."),
	}
	if err := prometheus.NewPedanticRegistry().Register(rc); err != nil {
		return nil, fmt.Errorf("budgetprom: rate collector: %w", err)
	}
	return rc, nil
}

// Describe sends the collector's three descriptors.
func (rc *RateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- rc.perSecond
	ch <- rc.burst
	ch <- rc.version
}

// Collect sends the policy in force, read together with its version.
func (rc *RateCollector) Collect(ch chan<- prometheus.Metric) {
	p, v := rc.r.Policy()
	ch <- prometheus.MustNewConstMetric(rc.perSecond, prometheus.GaugeValue, p.PerSecond)
	ch <- prometheus.MustNewConstMetric(rc.burst, prometheus.GaugeValue, float64(p.Burst))
	ch <- prometheus.MustNewConstMetric(rc.version, prometheus.GaugeValue, float64(v))
}
