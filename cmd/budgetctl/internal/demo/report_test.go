package demo

import (
	"bytes"
	"strings"
	"testing"

	"github.com/runbudget/runbudget/budget"
)

func TestRenderReport(t *testing.T) {
	lim := budget.Limits{RequestsPerSecond: 180, Burst: 20, OpenBodies: 12, MemoryBytes: 512 << 10,
		InFlight: map[budget.OpClass]int{budget.OpGet: 8, budget.OpHead: 4, budget.OpList: 2}}
	stats := func(requests, throttled, get, bodies int, utilization float64) ProviderStats {
		return ProviderStats{Quota: 200, Burst: 40, MaxConcurrent: 24, RefusalCost: 0.5, Requests: requests, Throttled: throttled,
			Served: requests - throttled, RequestsPerSecond: float64(requests) / 12, PeakPerSecond: requests / 10,
			PeakOpenBodies: bodies, PeakConcurrent: 9, Utilization: utilization,
			Classes: map[budget.OpClass]ClassStats{budget.OpGet: {PeakInFlight: get}, budget.OpHead: {PeakInFlight: 3}, budget.OpList: {PeakInFlight: 1}}}
	}
	rep := Report{Hosts: 4, Lanes: 8, Objects: 1200, Size: 32 << 10, Quota: 200, MaxConcurrent: 24, RefusalCost: 0.5, Attempts: 3,
		Limits: lim, Budget: "demo", Redis: "embedded", Runs: []RunReport{
			{Mode: ModeBudget, Copied: 1200, Seconds: 13.4, Provider: stats(2416, 0, 8, 12, 0.905)},
			{Mode: ModeLanes, Copied: 1196, Failed: 4, Seconds: 15.3, Provider: stats(2760, 350, 20, 15, 0.79)},
		}}
	var buf bytes.Buffer
	if err := RenderReport(&buf, rep); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, w := range []string{
		"4 hosts x 8 lanes copied 1200 objects", "200 requests/s (bucket of 40)", "a 503 uses up 0.5 of a request's quota",
		"makes 3 attempts per request",
		"shared budget", "per-lane limits, no budget", "1200 of 1200", "1196 of 1200", "13.4s", "15.3s", "2416", "2760",
		"objects failed (retries ran out)", "refused (503 SlowDown)", "350", "2410",
		"quota used (served / quota x time)", "90%", "79%",
		"201 (quota 200)", "230 (quota 200)",
		"peak in flight, get", "8 (ceiling 8)", "20 (ceiling 8)", "12 (ceiling 12)", "15 (ceiling 12)",
		"lost no object, drew no throttle and stayed within every ceiling",
		"2416 requests at 180/s take at least 13.4s",
		"sent 2760 requests (1.1x as many), 350 of them refused with 503; in flight they exceeded the ceilings for get, open bodies",
		"Each 503 cost quota and a backoff: the provider served 79% of its quota (90% with the budget), 4 object(s) ran out of retries and were lost, and the run took 15.3s against the budget's 13.4s",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("report lacks %q:\n%s", w, out)
		}
	}
	// A budget run over a ceiling, or one that lost objects, is reported
	// as such, not as a success.
	rep.Runs[0].Provider = stats(2416, 3, 9, 12, 0.9)
	rep.Runs[0].Copied, rep.Runs[0].Failed = 1199, 1
	buf.Reset()
	RenderReport(&buf, rep)
	if out := buf.String(); !strings.Contains(out, "more than the ceiling for get (and the run lost 1 object(s))") || strings.Contains(out, "stayed within") {
		t.Errorf("report over a ceiling:\n%s", out)
	}
}
