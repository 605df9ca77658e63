package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/cmd/budgetctl/internal/demo"
	"github.com/runbudget/runbudget/internal/redistest"
)

// TestDemo runs a short demo with the built binary (embedded Redis, worker
// processes) and checks what its report claims: with the budget the
// provider saw no more than its quota, far fewer throttles than without,
// and never more in flight than the ceilings.
func TestDemo(t *testing.T) {
	r := cli(t, nil, "demo", "--hosts", "2", "--lanes", "4", "--objects", "150", "--quota", "100", "--json")
	want(t, r, exitOK, "run 1 of 2", "run 2 of 2")
	var rep demo.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, r)
	}
	if len(rep.Runs) != 2 || rep.Runs[0].Mode != demo.ModeBudget || rep.Runs[1].Mode != demo.ModeLanes {
		t.Fatalf("runs: %+v", rep.Runs)
	}
	on, off := rep.Runs[0], rep.Runs[1]
	t.Logf("with budget: %+v\nwithout: %+v", on.Provider, off.Provider)
	for _, run := range rep.Runs {
		if run.Copied != 150 || len(run.Hosts) != 2 {
			t.Errorf("%s run copied %d objects on %d hosts, want 150 on 2", run.Mode, run.Copied, len(run.Hosts))
		}
	}
	if rep.Limits.RequestsPerSecond != 90 || rep.Limits.Burst != 10 {
		t.Errorf("limits %+v: want rps and burst derived from the quota (90, 10)", rep.Limits)
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
		"peak in flight, get", "(ceiling 3)")
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
