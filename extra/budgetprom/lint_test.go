package budgetprom_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/runbudget/runbudget/admission"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/extra/budgetprom"
	"github.com/runbudget/runbudget/internal/redistest"
)

// TestPromlint runs promlint over every metric of the package: names,
// units, suffixes and help must all pass.
func TestPromlint(t *testing.T) {
	for _, r := range everyMetric(t) {
		allSent(t, r)
		lint(t, r)
	}
}

// everyMetric registers every collector of the package and makes each of
// them send every metric it has. Domain labels change the label names,
// which one registry cannot hold both ways, so the labelled host collector
// has a registry of its own.
func everyMetric(t *testing.T) []*prometheus.Registry {
	reg := prometheus.NewPedanticRegistry()
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

	return []*prometheus.Registry{reg, labelled}
}

// TestDashboardQueries reads the Grafana dashboard and checks that every
// metric its queries name is one the package serves, and that the panels
// an operator needs first are there.
func TestDashboardQueries(t *testing.T) {
	served := map[string]bool{}
	for _, r := range everyMetric(t) {
		for name, mf := range families(t, r) {
			served[name] = true
			if mf.GetType() == dto.MetricType_HISTOGRAM {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					served[name+suffix] = true
				}
			}
		}
	}
	raw, err := os.ReadFile(filepath.Join("dashboards", "runbudget.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	names := regexp.MustCompile(`runbudget_[a-z_]+`)
	titles := map[string]bool{}
	for _, p := range dash.Panels {
		titles[p.Title] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range names.FindAllString(tg.Expr, -1) {
				if !served[n] {
					t.Errorf("panel %q queries %s, which nothing serves", p.Title, n)
				}
			}
		}
	}
	for _, want := range []string{"Waiting lanes", "Wait time p99", "Throttles", "Rate factor", "In flight vs ceiling"} {
		if !titles[want] {
			t.Errorf("no panel %q", want)
		}
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
