package budgetprom_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/extra/budgetprom"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

var (
	domA = budget.Domain{Version: 1, ID: "bucket-a"}
	domB = budget.Domain{Version: 1, ID: "bucket-b\n{x}"} // a newline and braces survive into the label
	domC = budget.Domain{Version: 2, ID: "bucket-c"}
)

var exportLimits = budget.Limits{RequestsPerSecond: 50, InFlight: map[budget.OpClass]int{budget.OpGet: 5, budget.OpHead: 3}, OpenBodies: 4}

func newAdmin(t *testing.T, c redis.UniversalClient) *redisstore.Admin {
	t.Helper()
	adm, err := redisstore.NewAdmin(c)
	if err != nil {
		t.Fatal(err)
	}
	return adm
}

func newExporter(t *testing.T, in budgetprom.Inspector, opts budgetprom.ExporterOpts) *prometheus.Registry {
	t.Helper()
	e, err := budgetprom.NewExporter(in, opts)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e)
	return reg
}

// holdExportState puts a budget in the state the exporter tests read:
// three GETs on A (one with its body open), two HEADs on A and B together,
// and B paused by a provider's 30 s retry-after.
func holdExportState(t *testing.T, c redis.UniversalClient, name string) *budget.Budget {
	t.Helper()
	b := redisBudget(t, c, name, exportLimits, 5*time.Second)
	for i := range 3 {
		mustAcquire(t, b, budget.Request{Domains: []budget.Domain{domA}, Class: budget.OpGet, OpensBody: i == 0})
	}
	for range 2 {
		mustAcquire(t, b, budget.Request{Domains: []budget.Domain{domA, domB}, Class: budget.OpHead})
	}
	if err := b.Throttle(context.Background(), domB, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestExporterMatchesInspect scrapes a registry holding an Exporter and
// checks every budget and domain series against Admin.List and Inspect
// read just before.
func TestExporterMatchesInspect(t *testing.T) {
	ctx := context.Background()
	client := redistest.Start(t).Client(t)
	adm := newAdmin(t, client)
	name := randomName("export")
	holdExportState(t, client, name)
	reg := newExporter(t, adm, budgetprom.ExporterOpts{})

	start := time.Now()
	in, err := adm.Inspect(ctx, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	list, err := adm.List(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %+v, %v", list, err)
	}
	mfs := families(t, reg)
	elapsed := time.Since(start).Seconds()

	checkGauge(t, mfs, "runbudget_exporter_scrape_error", 0)
	checkGauge(t, mfs, "runbudget_exporter_budgets", 1)
	if d := value(t, mfs, "runbudget_exporter_scrape_duration_seconds"); d <= 0 || d > elapsed {
		t.Errorf("scrape duration %v s, want in (0, %v]", d, elapsed)
	}
	bl := []string{"budget", name}
	checkGauge(t, mfs, "runbudget_budget_leases", float64(list[0].Leases), bl...)
	checkGauge(t, mfs, "runbudget_budget_leases", 5, bl...)
	checkGauge(t, mfs, "runbudget_budget_waiters", float64(list[0].Waiters), bl...)
	checkGauge(t, mfs, "runbudget_budget_domains", float64(len(in.Domains)), bl...)
	checkGauge(t, mfs, "runbudget_exporter_domains_omitted", 0, bl...)

	checkGauge(t, mfs, "runbudget_budget_limit_requests_per_second", in.Limits.RequestsPerSecond, bl...)
	checkGauge(t, mfs, "runbudget_budget_limit_burst", float64(in.Limits.Burst), bl...)
	checkGauge(t, mfs, "runbudget_budget_limit_open_bodies", float64(in.Limits.OpenBodies), bl...)
	for _, c := range budget.Classes() {
		m := find(mfs, "runbudget_budget_limit_in_flight", "budget", name, "class", string(c))
		switch n := in.Limits.InFlight[c]; {
		case n == 0 && m != nil:
			t.Errorf("ceiling series for unbounded class %s", c)
		case n > 0:
			checkGauge(t, mfs, "runbudget_budget_limit_in_flight", float64(n), "budget", name, "class", string(c))
		}
	}
	if hasPrefixFamily(mfs, "runbudget_budget_memory") || hasPrefixFamily(mfs, "runbudget_budget_limit_memory") {
		t.Error("memory series served from Redis, which never sees memory")
	}

	if len(in.Domains) != 2 {
		t.Fatalf("Inspect domains = %+v, want A and B", in.Domains)
	}
	for _, ds := range in.Domains {
		dl := []string{"budget", name, "domain", ds.Domain.String()}
		for _, c := range budget.Classes() {
			checkGauge(t, mfs, "runbudget_domain_in_flight", float64(ds.InFlight[c]), append(dl, "class", string(c))...)
		}
		checkGauge(t, mfs, "runbudget_domain_open_bodies", float64(ds.OpenBodies), dl...)
		checkGauge(t, mfs, "runbudget_domain_waiters", float64(ds.Waiters), dl...)
		checkGauge(t, mfs, "runbudget_domain_throttled", map[bool]float64{true: 1}[ds.Throttled], dl...)
		if f := value(t, mfs, "runbudget_domain_rate_factor", dl...); math.Abs(f-ds.RateFactor) > 0.05 {
			t.Errorf("%s rate factor %v, Inspect says %v", ds.Domain, f, ds.RateFactor)
		}
		// The pause runs down between Inspect and the scrape.
		if p := value(t, mfs, "runbudget_domain_pause_remaining_seconds", dl...); p > ds.Paused.Seconds() || p < ds.Paused.Seconds()-elapsed {
			t.Errorf("%s pause %v s, Inspect says %v", ds.Domain, p, ds.Paused)
		}
		if ds.Rate <= 0 {
			t.Fatalf("%s has no rate in Inspect: %+v", ds.Domain, ds)
		}
		if tok := value(t, mfs, "runbudget_domain_tokens", dl...); math.Abs(tok-ds.Tokens) > ds.Rate*elapsed+1e-6 {
			t.Errorf("%s tokens %v, Inspect says %v (%v s apart at %v/s)", ds.Domain, tok, ds.Tokens, elapsed, ds.Rate)
		}
		if r := value(t, mfs, "runbudget_domain_rate_per_second", dl...); math.Abs(r-ds.Rate) > 0.05*ds.Rate {
			t.Errorf("%s rate %v/s, Inspect says %v/s", ds.Domain, r, ds.Rate)
		}
	}
	// The state held, independently of Inspect.
	a := []string{"budget", name, "domain", domA.String()}
	b := []string{"budget", name, "domain", domB.String()}
	checkGauge(t, mfs, "runbudget_domain_in_flight", 3, append(a, "class", "get")...)
	checkGauge(t, mfs, "runbudget_domain_in_flight", 2, append(a, "class", "head")...)
	checkGauge(t, mfs, "runbudget_domain_in_flight", 2, append(b, "class", "head")...)
	checkGauge(t, mfs, "runbudget_domain_in_flight", 0, append(b, "class", "get")...)
	checkGauge(t, mfs, "runbudget_domain_open_bodies", 1, a...)
	checkGauge(t, mfs, "runbudget_domain_throttled", 1, b...)
	checkGauge(t, mfs, "runbudget_domain_throttled", 0, a...)
	if p := value(t, mfs, "runbudget_domain_pause_remaining_seconds", b...); p < 25 || p > 30 {
		t.Errorf("B's pause %v s, want about 30", p)
	}
	if f := value(t, mfs, "runbudget_domain_rate_factor", b...); f >= 1 {
		t.Errorf("B's rate factor %v after a throttle, want below 1", f)
	}
}

// TestExporterBudgetsApart serves two budgets, one with a name that is not
// valid UTF-8 (legal for a budget, not for a label value: it is quoted).
func TestExporterBudgetsApart(t *testing.T) {
	client := redistest.Start(t).Client(t)
	plain, odd := randomName("plain"), "odd\xff"+randomName("")
	bp := redisBudget(t, client, plain, exportLimits, 5*time.Second)
	bo := redisBudget(t, client, odd, exportLimits, 5*time.Second)
	mustAcquire(t, bp, budget.Request{Domains: []budget.Domain{domA}, Class: budget.OpGet})
	for range 2 {
		mustAcquire(t, bo, budget.Request{Domains: []budget.Domain{domA}, Class: budget.OpGet})
	}
	mfs := families(t, newExporter(t, newAdmin(t, client), budgetprom.ExporterOpts{}))
	checkGauge(t, mfs, "runbudget_exporter_scrape_error", 0)
	checkGauge(t, mfs, "runbudget_exporter_budgets", 2)
	checkGauge(t, mfs, "runbudget_domain_in_flight", 1, "budget", plain, "domain", domA.String(), "class", "get")
	checkGauge(t, mfs, "runbudget_domain_in_flight", 2, "budget", `"`+"odd\\xff"+odd[4:]+`"`, "domain", domA.String(), "class", "get")
}

// TestExporterMaxDomains keeps the busiest domains past the bound: the
// paused one first, then by load, and counts the rest.
func TestExporterMaxDomains(t *testing.T) {
	client := redistest.Start(t).Client(t)
	name := randomName("bound")
	b := redisBudget(t, client, name, exportLimits, 5*time.Second)
	for range 2 {
		mustAcquire(t, b, budget.Request{Domains: []budget.Domain{domA}, Class: budget.OpGet})
	}
	mustAcquire(t, b, budget.Request{Domains: []budget.Domain{domB}, Class: budget.OpGet})
	if err := b.Throttle(context.Background(), domC, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	mfs := families(t, newExporter(t, newAdmin(t, client), budgetprom.ExporterOpts{MaxDomains: 2}))
	checkGauge(t, mfs, "runbudget_budget_domains", 3, "budget", name)
	checkGauge(t, mfs, "runbudget_exporter_domains_omitted", 1, "budget", name)
	want := []string{domA.String(), domC.String()}
	for _, fam := range []string{"runbudget_domain_in_flight", "runbudget_domain_rate_factor", "runbudget_domain_pause_remaining_seconds"} {
		if got := labelValues(mfs, fam, "domain"); !equal(got, want) {
			t.Errorf("%s domains = %q, want %q", fam, got, want)
		}
	}
}

// slowInspector stands in for a Redis that stopped answering: Inspect
// returns only when its context ends.
type slowInspector struct{ budgetprom.Inspector }

func (slowInspector) Inspect(ctx context.Context, name string, most int) (redisstore.Inspection, error) {
	<-ctx.Done()
	return redisstore.Inspection{}, ctx.Err()
}

// TestExporterBoundedTime: a scrape against a Redis that hangs returns
// after the timeout, says so, and tells OnScrape why.
func TestExporterBoundedTime(t *testing.T) {
	client := redistest.Start(t).Client(t)
	name := randomName("slow")
	redisBudget(t, client, name, exportLimits, 5*time.Second)
	const timeout = 200 * time.Millisecond
	reported := make(chan error, 1)
	reg := newExporter(t, slowInspector{newAdmin(t, client)}, budgetprom.ExporterOpts{Timeout: timeout,
		OnScrape: func(err error) { reported <- err }})
	start := time.Now()
	mfs := families(t, reg)
	if took := time.Since(start); took < timeout || took > timeout+2*time.Second {
		t.Errorf("scrape took %v with a %v timeout", took, timeout)
	}
	checkGauge(t, mfs, "runbudget_exporter_scrape_error", 1)
	if d := value(t, mfs, "runbudget_exporter_scrape_duration_seconds"); d < timeout.Seconds() {
		t.Errorf("scrape duration %v s, below the %v it waited", d, timeout)
	}
	if find(mfs, "runbudget_budget_leases", "budget", name) != nil {
		t.Error("series served for a budget that was not read")
	}
	if err := <-reported; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("OnScrape got %v, want a deadline error", err)
	}
}

// ghostInspector lists one budget more than Redis holds, as when a budget
// expires between List and Inspect.
type ghostInspector struct{ *redisstore.Admin }

func (g ghostInspector) List(ctx context.Context) ([]redisstore.BudgetSummary, error) {
	l, err := g.Admin.List(ctx)
	return append(l, redisstore.BudgetSummary{Name: "ghost"}), err
}

func TestExporterBudgetGoneMidScrape(t *testing.T) {
	client := redistest.Start(t).Client(t)
	name := randomName("real")
	redisBudget(t, client, name, exportLimits, 5*time.Second)
	mfs := families(t, newExporter(t, ghostInspector{newAdmin(t, client)}, budgetprom.ExporterOpts{}))
	checkGauge(t, mfs, "runbudget_exporter_scrape_error", 0)
	checkGauge(t, mfs, "runbudget_exporter_budgets", 1)
	if find(mfs, "runbudget_budget_leases", "budget", "ghost") != nil {
		t.Error("series served for a budget that no longer exists")
	}
}

func TestNewExporterRefuses(t *testing.T) {
	if _, err := budgetprom.NewExporter(nil, budgetprom.ExporterOpts{}); err == nil {
		t.Error("NewExporter(nil) accepted")
	}
	in := slowInspector{}
	for _, o := range []budgetprom.ExporterOpts{{Timeout: -1}, {MaxDomains: -1}, {ConstLabels: prometheus.Labels{"budget": "x"}}} {
		if _, err := budgetprom.NewExporter(in, o); err == nil {
			t.Errorf("NewExporter accepted %+v", o)
		}
	}
}
