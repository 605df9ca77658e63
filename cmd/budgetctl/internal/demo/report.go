package demo

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/cmd/budgetctl/internal/clitext"
)

// The run modes of the demo's report.
const (
	ModeBudget = "budget"   // every host drew on one shared budget
	ModeLanes  = "per-lane" // each lane limited itself, as if alone
)

// Report is what the demo prints at the end; --json prints it as is.
type Report struct {
	Hosts         int           `json:"hosts"`
	Lanes         int           `json:"lanes"`
	Objects       int           `json:"objects"`
	Size          int64         `json:"size"`
	Quota         float64       `json:"quota"`
	MaxConcurrent int           `json:"max_concurrent"`
	RefusalCost   float64       `json:"refusal_cost"` // what a 503 cost the provider, in requests
	Attempts      int           `json:"attempts"`     // per request, before a lane gave the object up
	Limits        budget.Limits `json:"limits"`
	Budget        string        `json:"budget"`
	Redis         string        `json:"redis"` // "embedded", or host:port
	Runs          []RunReport   `json:"runs"`
}

// RunReport is one run: the provider's view, and each host's last word.
// Copied and Failed are the hosts' sums: objects copied and checked, and
// objects given up on when their retries ran out.
type RunReport struct {
	Mode     string        `json:"mode"`
	Copied   int64         `json:"copied"`
	Failed   int64         `json:"failed"`
	Seconds  float64       `json:"seconds"`
	Provider ProviderStats `json:"provider"`
	Hosts    []WorkerEvent `json:"hosts"`
}

// RenderReport prints the report as a table, one column per run, and a
// conclusion drawn from the numbers.
func RenderReport(w io.Writer, r Report) error {
	fmt.Fprintf(w, "%d hosts x %d lanes copied %d objects (about %s each) from a provider with a quota of\n",
		r.Hosts, r.Lanes, r.Objects, clitext.Bytes(r.Size))
	burst := 0
	if len(r.Runs) > 0 {
		burst = r.Runs[0].Provider.Burst
	}
	refusal := "a 503 costs it nothing"
	switch {
	case r.RefusalCost >= 1:
		refusal = "a 503 uses up quota as a served request does"
	case r.RefusalCost > 0:
		refusal = "a 503 uses up " + strconv.FormatFloat(r.RefusalCost, 'f', -1, 64) + " of a request's quota"
	}
	fmt.Fprintf(w, "%s requests/s (bucket of %d) and at most %d requests at once; %s.\n",
		num(r.Quota), burst, r.MaxConcurrent, refusal)
	fmt.Fprintf(w, "Every lane's client makes %d attempts per request, then gives the object up.\n", r.Attempts)
	fmt.Fprintf(w, "Budget %s in Redis (%s): %s\n\n", clitext.Quote(r.Budget), r.Redis, clitext.Limits(r.Limits))

	tw := clitext.Table(w)
	fmt.Fprint(tw, " ")
	for _, run := range r.Runs {
		switch run.Mode {
		case ModeBudget:
			fmt.Fprint(tw, "\tshared budget")
		default:
			fmt.Fprint(tw, "\tper-lane limits, no budget")
		}
	}
	fmt.Fprintln(tw)
	row := func(label string, cell func(run RunReport) string) {
		fmt.Fprint(tw, label)
		for _, run := range r.Runs {
			fmt.Fprint(tw, "\t"+cell(run))
		}
		fmt.Fprintln(tw)
	}
	row("objects copied", func(run RunReport) string { return fmt.Sprintf("%d of %d", run.Copied, r.Objects) })
	row("objects failed (retries ran out)", func(run RunReport) string { return strconv.FormatInt(run.Failed, 10) })
	row("duration", func(run RunReport) string { return strconv.FormatFloat(run.Seconds, 'f', 1, 64) + "s" })
	row("requests the provider received", func(run RunReport) string { return strconv.Itoa(run.Provider.Requests) })
	row("  refused (503 SlowDown)", func(run RunReport) string { return strconv.Itoa(run.Provider.Throttled) })
	row("  served", func(run RunReport) string { return strconv.Itoa(run.Provider.Served) })
	row("  per second, mean", func(run RunReport) string {
		return fmt.Sprintf("%s (quota %s)", num(run.Provider.RequestsPerSecond), num(r.Quota))
	})
	row("  in the busiest second", func(run RunReport) string { return strconv.Itoa(run.Provider.PeakPerSecond) })
	row("quota used (served / quota x time)", func(run RunReport) string { return percent(run.Provider.Utilization) })
	for _, c := range providerClasses {
		row("peak in flight, "+string(c), func(run RunReport) string {
			return fmt.Sprintf("%d (ceiling %s)", run.Provider.Classes[c].PeakInFlight, clitext.Ceiling(r.Limits.InFlight[c]))
		})
	}
	row("peak open bodies", func(run RunReport) string {
		return fmt.Sprintf("%d (ceiling %s)", run.Provider.PeakOpenBodies, clitext.Ceiling(r.Limits.OpenBodies))
	})
	row("peak served at once", func(run RunReport) string {
		return fmt.Sprintf("%d (provider max %s)", run.Provider.PeakConcurrent, clitext.Ceiling(r.MaxConcurrent))
	})
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, line := range conclusions(r) {
		fmt.Fprintln(w, line)
	}
	return nil
}

// conclusions says in words what the table shows, from the numbers only:
// where a run broke a ceiling or the quota, it says so.
func conclusions(r Report) []string {
	var out []string
	lanes := r.Hosts * r.Lanes
	var on, off *RunReport
	for i := range r.Runs {
		if r.Runs[i].Mode == ModeBudget {
			on = &r.Runs[i]
		} else {
			off = &r.Runs[i]
		}
	}
	if on != nil {
		lost := "lost no object"
		if on.Failed > 0 {
			lost = fmt.Sprintf("lost %d object(s)", on.Failed)
		}
		broke := OverCeilings(r.Limits, on.Provider)
		switch {
		case len(broke) == 0 && on.Provider.Throttled == 0:
			out = append(out, fmt.Sprintf("With the shared budget, %d lanes on %d hosts %s, drew no throttle and stayed within every ceiling.", lanes, r.Hosts, lost))
		case len(broke) == 0:
			out = append(out, fmt.Sprintf("With the shared budget, %d lanes on %d hosts %s and stayed within every ceiling; the provider throttled %d request(s), and every host slowed down together.", lanes, r.Hosts, lost, on.Provider.Throttled))
		default:
			out = append(out, fmt.Sprintf("With the shared budget the provider saw more than the ceiling for %s (and the run %s): look into it.", strings.Join(broke, ", "), lost))
		}
		if rps := r.Limits.RequestsPerSecond; rps > 0 && on.Provider.Requests > 0 {
			out = append(out, fmt.Sprintf("Its duration follows the budget's rate: %d requests at %s/s take at least %.1fs.",
				on.Provider.Requests, num(rps), float64(on.Provider.Requests)/rps))
		}
	}
	if off != nil {
		line := fmt.Sprintf("With per-lane limits the same lanes sent %d requests", off.Provider.Requests)
		if on != nil && on.Provider.Requests > 0 {
			line += fmt.Sprintf(" (%.1fx as many)", float64(off.Provider.Requests)/float64(on.Provider.Requests))
		}
		line += fmt.Sprintf(", %d of them refused with 503", off.Provider.Throttled)
		if broke := OverCeilings(r.Limits, off.Provider); len(broke) > 0 {
			line += "; in flight they exceeded the ceilings for " + strings.Join(broke, ", ")
		}
		out = append(out, line+": limits right for one lane multiply by the number of lanes.")
		line = fmt.Sprintf("Each 503 cost quota and a backoff: the provider served %s of its quota", percent(off.Provider.Utilization))
		if on != nil {
			line += fmt.Sprintf(" (%s with the budget)", percent(on.Provider.Utilization))
		}
		line += fmt.Sprintf(", %d object(s) ran out of retries and were lost", off.Failed)
		if on != nil {
			line += fmt.Sprintf(", and the run took %.1fs against the budget's %.1fs", off.Seconds, on.Seconds)
		}
		out = append(out, line+".")
	}
	return out
}

func percent(f float64) string {
	return strconv.FormatFloat(100*f, 'f', 0, 64) + "%"
}

// OverCeilings names the dimensions where the provider saw more in flight
// than the budget's ceilings.
func OverCeilings(l budget.Limits, s ProviderStats) []string {
	var out []string
	for _, c := range providerClasses {
		if n := l.InFlight[c]; n > 0 && s.Classes[c].PeakInFlight > n {
			out = append(out, string(c))
		}
	}
	if l.OpenBodies > 0 && s.PeakOpenBodies > l.OpenBodies {
		out = append(out, "open bodies")
	}
	return out
}

func num(f float64) string {
	if f >= 100 || f == float64(int64(f)) {
		return strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'f', 1, 64)
}
