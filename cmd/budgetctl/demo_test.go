package main

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/cmd/budgetctl/internal/demo"
	"github.com/runbudget/runbudget/internal/redistest"
)

// TestDemo runs a short demo with the built binary (embedded Redis, worker
// processes) and checks what its report claims: with the budget every
// object is copied, the provider saw no more than its quota, far fewer
// throttles than without, and never more in flight than the ceilings;
// without it, every object is accounted for (copied, or failed when its
// retries ran out), and the 503s are there; both runs report the share of
// the quota they used.
func TestDemo(t *testing.T) {
	r := cli(t, nil, "demo", "--hosts", "2", "--lanes", "4", "--objects", "150", "--quota", "100", "--json")
	want(t, r, exitOK, "run 1 of 2", "run 2 of 2", "3 attempts per request")
	var rep demo.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, r)
	}
	if len(rep.Runs) != 2 || rep.Runs[0].Mode != demo.ModeBudget || rep.Runs[1].Mode != demo.ModeLanes {
		t.Fatalf("runs: %+v", rep.Runs)
	}
	on, off := rep.Runs[0], rep.Runs[1]
	t.Logf("with budget: %.1fs, failed %d, %+v\nwithout: %.1fs, failed %d, %+v", on.Seconds, on.Failed, on.Provider, off.Seconds, off.Failed, off.Provider)
	if on.Copied != 150 || on.Failed != 0 {
		t.Errorf("with the budget %d objects were copied and %d lost, want 150 and none", on.Copied, on.Failed)
	}
	for _, run := range rep.Runs {
		get := run.Provider.Classes[budget.OpGet]
		if run.Copied+run.Failed != 150 || len(run.Hosts) != 2 || int64(get.Requests-get.Throttled) != run.Copied {
			t.Errorf("%s run: %d copied + %d failed on %d hosts, %d GETs served; want 150 objects on 2 hosts, one served GET per copy",
				run.Mode, run.Copied, run.Failed, len(run.Hosts), get.Requests-get.Throttled)
		}
		var failed int64
		for _, h := range run.Hosts {
			failed += h.Failed
		}
		if failed != run.Failed {
			t.Errorf("%s run reports %d failed, its hosts %d", run.Mode, run.Failed, failed)
		}
		// Utilization is served over quota x the provider's busy time.
		p := run.Provider
		if u := float64(p.Served) / (p.Quota * math.Max(p.Seconds, 1)); p.Served != p.Requests-p.Throttled || p.Utilization <= 0 || p.Utilization > 1 ||
			math.Abs(p.Utilization-u) > 1e-9 {
			t.Errorf("%s run: served %d of %d, utilization %v; want requests - throttled, and %v in (0, 1]", run.Mode, p.Served, p.Requests, p.Utilization, u)
		}
	}
	if rep.Limits.RequestsPerSecond != 90 || rep.Limits.Burst != 10 {
		t.Errorf("limits %+v: want rps and burst derived from the quota (90, 10)", rep.Limits)
	}
	if rep.Attempts != 3 || rep.RefusalCost != demo.DefaultRefusalCost {
		t.Errorf("report: %d attempts, refusal cost %v; want 3 and the default", rep.Attempts, rep.RefusalCost)
	}
	if off.Provider.Throttled == 0 {
		t.Errorf("without the budget the provider throttled nothing: the demo shows no contrast")
	}
	if on.Provider.Throttled*10 > off.Provider.Throttled {
		t.Errorf("throttles: %d with the budget, %d without; want at most a tenth", on.Provider.Throttled, off.Provider.Throttled)
	}
	if rps := on.Provider.RequestsPerSecond; rps > rep.Quota*1.1 {
		t.Errorf("with the budget the provider saw %.1f req/s, above the quota %v by more than 10%%", rps, rep.Quota)
	}
	if broke := demo.OverCeilings(rep.Limits, on.Provider); len(broke) > 0 {
		t.Errorf("with the budget the provider saw more than the ceilings for %v: %+v", broke, on.Provider)
	}
	// The provider meters the three classes a copy's source side uses.
	for _, c := range []budget.OpClass{budget.OpList, budget.OpHead, budget.OpGet} {
		if on.Provider.Classes[c].Requests == 0 {
			t.Errorf("no %s requests reached the provider", c)
		}
	}
}

// TestDemoRealRedis runs the demo against a real redis-server with a
// password: the password appears nowhere, and afterwards the budget is
// there to inspect, holding nothing.
func TestDemoRealRedis(t *testing.T) {
	const pw = "demo-Pa55word"
	srv := redistest.Start(t, redistest.WithConfig("requirepass "+pw))
	r := cli(t, nil, "demo", "--redis", srv.URL(), "--no-baseline", "--hosts", "2", "--lanes", "2", "--objects", "40",
		"--budget", "real demo", "--get", "3")
	want(t, r, exitOK, "run 1 of 1", "shared budget", "40 of 40", `Budget "real demo" in Redis (`+srv.Addr()+")",
		"peak in flight, get", "(ceiling 3)", "objects failed (retries ran out)", "quota used (served / quota x time)", "lost no object")
	if strings.Contains(r.stdout, "per-lane") {
		t.Errorf("--no-baseline still ran the baseline:\n%s", r)
	}
	if strings.Contains(r.stdout+r.stderr, pw) {
		t.Errorf("the demo's output shows the password:\n%s", r)
	}
	env := []string{"REDIS_URL=" + srv.URL()}
	r = cli(t, env, "inspect", "real demo", "--json")
	want(t, r, exitOK)
	var in struct {
		Limits  budget.Limits
		Leases  []any
		Waiters []any
	}
	if err := json.Unmarshal([]byte(r.stdout), &in); err != nil {
		t.Fatal(err)
	}
	if in.Limits.InFlight[budget.OpGet] != 3 || len(in.Leases) != 0 || len(in.Waiters) != 0 {
		t.Errorf("after the demo: %+v", in)
	}
}
