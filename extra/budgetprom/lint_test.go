package budgetprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/runbudget/runbudget/admission"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/extra/budgetprom"
	"github.com/runbudget/runbudget/internal/redistest"
)

// TestPromlint registers every collector of the package in one registry,
// makes each of them send every metric it has, and runs promlint over the
// lot: names, units, suffixes and help must all pass.
func TestPromlint(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	// Domain labels change the label names, which one registry cannot hold
	// both ways: the labelled collector is linted in a registry of its own.
	labelled := prometheus.NewPedanticRegistry()
	for _, opts := range []budgetprom.HostOpts{{Budget: "plain"}, {Budget: "labelled", DomainLabels: 1}} {
		c, err := budgetprom.NewHost(opts)
		if err != nil {
			t.Fatal(err)
		}
		if opts.DomainLabels > 0 {
			labelled.MustRegister(c)
		} else {
			reg.MustRegister(c)
		}
		b := newBudget(t, budget.Limits{RequestsPerSecond: 100, MemoryBytes: 1 << 20}, budget.WithObserver(c))
		c.Attach(b)
		mustAcquire(t, b, budget.Request{Domains: []budget.Domain{acct}, Class: budget.OpGet, MemoryBytes: 10})
		mustAcquire(t, b, budget.Request{Domains: []budget.Domain{other}, Class: budget.OpGet}) // folded when labelled
		if err := b.Throttle(context.Background(), acct, time.Millisecond); err != nil {
			t.Fatal(err)
		}
		c.ObserveLeaseLost(budget.LeaseLostEvent{})
		c.ObserveStoreError(budget.StoreErrorEvent{Op: "usage"})
	}

	conc, err := admission.NewConcurrency(4)
	if err != nil {
		t.Fatal(err)
	}
	rate, err := admission.NewRate(admission.RatePolicy{PerSecond: 1, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := budgetprom.NewConcurrencyCollector(conc, budgetprom.AdmissionOpts{})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := budgetprom.NewRateCollector(rate, budgetprom.AdmissionOpts{})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(cc, rc)

	client := redistest.Start(t).Client(t)
	holdExportState(t, client, randomName("lint"))
	e, err := budgetprom.NewExporter(newAdmin(t, client), budgetprom.ExporterOpts{MaxDomains: 1})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(e)

	for _, r := range []*prometheus.Registry{reg, labelled} {
		allSent(t, r)
		lint(t, r)
	}
}

// allSent fails the test unless every metric r describes was gathered at
// least once: promlint only sees what is gathered.
func allSent(t *testing.T, r *prometheus.Registry) {
	t.Helper()
	mfs := families(t, r)
	descs := make(chan *prometheus.Desc, 256)
	r.Describe(descs)
	close(descs)
	n := 0
	for range descs {
		n++
	}
	if len(mfs) != n {
		var names []string
		for name := range mfs {
			names = append(names, name)
		}
		t.Fatalf("%d families gathered, %d described: %q", len(mfs), n, names)
	}
}
