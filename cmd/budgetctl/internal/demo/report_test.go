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
	stats := func(requests, throttled, get, bodies int) ProviderStats {
		return ProviderStats{Quota: 200, Burst: 40, MaxConcurrent: 24, Requests: requests, Throttled: throttled,
			RequestsPerSecond: float64(requests) / 12, PeakPerSecond: requests / 10, PeakOpenBodies: bodies, PeakConcurrent: 9,
			Classes: map[budget.OpClass]ClassStats{budget.OpGet: {PeakInFlight: get}, budget.OpHead: {PeakInFlight: 3}, budget.OpList: {PeakInFlight: 1}}}
	}
	rep := Report{Hosts: 4, Lanes: 8, Objects: 1200, Size: 32 << 10, Quota: 200, MaxConcurrent: 24, Limits: lim,
		Budget: "demo", Redis: "embedded", Runs: []RunReport{
			{Mode: ModeBudget, Copied: 1200, Seconds: 14.2, Provider: stats(2412, 0, 8, 12)},
			{Mode: ModeLanes, Copied: 1200, Seconds: 12.1, Provider: stats(6030, 3600, 20, 15)},
		}}
	var buf bytes.Buffer
	if err := RenderReport(&buf, rep); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, w := range []string{
		"4 hosts x 8 lanes copied 1200 objects", "200 requests/s (bucket of 40)",
		"shared budget", "per-lane limits, no budget", "1200 of 1200", "14.2s", "12.1s", "2412", "6030",
		"201 (quota 200)", "502 (quota 200)", "throttled (503, Retry-After)", "3600",
		"peak in flight, get", "8 (ceiling 8)", "20 (ceiling 8)", "12 (ceiling 12)", "15 (ceiling 12)",
		"drew no throttle and stayed within every ceiling",
		"2412 requests at 180/s take at least 13.4s",
		"sent 6030 requests (2.5x as many), 3600 of them refused with 503; in flight they exceeded the ceilings for get, open bodies",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("report lacks %q:\n%s", w, out)
		}
	}
	// A budget run over a ceiling is reported as such, not as a success.
	rep.Runs[0].Provider = stats(2412, 3, 9, 12)
	buf.Reset()
	RenderReport(&buf, rep)
	if out := buf.String(); !strings.Contains(out, "more than the ceiling for get") || strings.Contains(out, "stayed within") {
		t.Errorf("report over a ceiling:\n%s", out)
	}
}
