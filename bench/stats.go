package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Round is one repetition of a figure.
type Round struct {
	// V is the figure's value in this round: the median latency for a
	// latency figure, else the measured quantity.
	V float64 `json:"v"`
	// P99 is the round's 99th-percentile latency (latency figures only).
	P99 float64 `json:"p99,omitempty"`
	// Rate is operations per second over the round, where meaningful.
	Rate float64 `json:"rate,omitempty"`
	// N is how many operations the round measured.
	N int `json:"n,omitempty"`
}

// Figure is one measured quantity, repeated over rounds. Its headline
// numbers are medians over the rounds, and its spread is their range.
type Figure struct {
	ID      string  `json:"id"`
	Section string  `json:"section"`
	Name    string  `json:"name"`
	Unit    string  `json:"unit"`
	Latency bool    `json:"latency,omitempty"` // V is a p50 and P99 is set
	Rounds  []Round `json:"rounds"`

	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	P99    float64 `json:"p99,omitempty"`  // median over rounds
	Rate   float64 `json:"rate,omitempty"` // median over rounds
	Note   string  `json:"note,omitempty"`
	// Mix is, for a script figure, the commands each call ran inside
	// Redis, per call (from the last round).
	Mix map[string]float64 `json:"commands_per_call,omitempty"`
}

func (f *Figure) add(r Round) { f.Rounds = append(f.Rounds, r) }

// summarize fills the medians and the spread from the rounds.
func (f *Figure) summarize() {
	vs := make([]float64, len(f.Rounds))
	var p99s, rates []float64
	for i, r := range f.Rounds {
		vs[i] = r.V
		if r.P99 != 0 {
			p99s = append(p99s, r.P99)
		}
		if r.Rate != 0 {
			rates = append(rates, r.Rate)
		}
	}
	f.Median, f.Min, f.Max = median(vs), minOf(vs), maxOf(vs)
	f.P99, f.Rate = median(p99s), median(rates)
}

// Target is one claim checked against the measurements of this run.
type Target struct {
	ID    string `json:"id"`
	Claim string `json:"claim"`
	// Measured is the median over rounds of the per-round value (a ratio of
	// two figures measured side by side, or a count); Min and Max are its
	// spread.
	Measured float64 `json:"measured"`
	Min      float64 `json:"min"`
	Max      float64 `json:"max"`
	Unit     string  `json:"unit,omitempty"` // "x" for ratios
	Op       string  `json:"op"`             // "<=", ">=" or "=="
	Limit    float64 `json:"limit"`
	Met      bool    `json:"met"`
	Skipped  bool    `json:"skipped,omitempty"`
	Note     string  `json:"note,omitempty"`
}

// check sets Met from Measured, Op and Limit.
func (t *Target) check() {
	switch t.Op {
	case "<=":
		t.Met = t.Measured <= t.Limit
	case ">=":
		t.Met = t.Measured >= t.Limit
	case "==":
		t.Met = math.Abs(t.Measured-t.Limit) < 1e-9
	}
}

// perRound builds a target from one value per round.
func perRound(id, claim, unit, op string, limit float64, vs []float64) *Target {
	t := &Target{ID: id, Claim: claim, Unit: unit, Op: op, Limit: limit,
		Measured: median(vs), Min: minOf(vs), Max: maxOf(vs)}
	if len(vs) == 0 {
		t.Skipped, t.Note = true, "not measured"
		return t
	}
	t.check()
	return t
}

// ratios divides the rounds of num by the rounds of den pairwise: both were
// measured in the same round, next to each other, so drift of a shared and
// noisy machine between rounds cancels. pick chooses which number of a round.
func ratios(num, den *Figure, pick func(Round) float64) []float64 {
	n := min(len(num.Rounds), len(den.Rounds))
	out := make([]float64, 0, n)
	for i := range n {
		d := pick(den.Rounds[i])
		if d != 0 {
			out = append(out, pick(num.Rounds[i])/d)
		}
	}
	return out
}

func p50(r Round) float64  { return r.V }
func p99(r Round) float64  { return r.P99 }
func rate(r Round) float64 { return r.Rate }

// latencyRound turns samples into a round: median, p99 and the rate over
// wall (zero wall: no rate).
func latencyRound(samples []time.Duration, wall time.Duration) Round {
	if len(samples) == 0 {
		return Round{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	r := Round{V: us(quantile(s, 0.50)), P99: us(quantile(s, 0.99)), N: len(s)}
	if wall > 0 {
		r.Rate = float64(len(s)) / wall.Seconds()
	}
	return r
}

// quantile of sorted samples, nearest rank.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

func minOf(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	return slices.Min(vs)
}

func maxOf(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	return slices.Max(vs)
}

// windowExcess checks a series of start times (any unit, sorted) against a
// token bucket of the given burst and rate (per unit of time): in every
// window [t_i, t_j] at most burst + rate*(t_j - t_i) starts may fall. It
// returns the worst excess over that bound (<= 0 when none is exceeded) and
// how many starts end a window that exceeds it by more than slack.
//
// The window [t_i, t_j] holds j-i+1 starts, so its excess is
// (j+1 - rate*t_j) - (i - rate*t_i) - burst: for each j it is worst at the
// i <= j with the least i - rate*t_i, which one pass keeps.
func windowExcess(times []float64, burst, rate, slack float64) (worst float64, over int) {
	worst = math.Inf(-1)
	best := math.Inf(1) // min over i <= j of i - rate*t_i
	for j, t := range times {
		best = math.Min(best, float64(j)-rate*t)
		e := float64(j+1) - rate*t - best - burst
		worst = math.Max(worst, e)
		if e > slack {
			over++
		}
	}
	if len(times) == 0 {
		worst = 0
	}
	return worst, over
}

// num formats a number with about three significant digits.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case math.IsNaN(v):
		return "-"
	case a == 0:
		return "0"
	case a >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case a >= 1e4:
		return fmt.Sprintf("%.3gk", v/1e3)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func withUnit(v float64, unit string) string {
	switch unit {
	case "", "x":
		return num(v) + unit
	case "ops/s":
		return num(v) + "/s"
	}
	return num(v) + " " + unit
}

// printTable writes the report as text: the figures by section, then the
// targets.
func printTable(w io.Writer, r *Report) {
	fmt.Fprintf(w, "runbudget bench, %s: %s/%s, %d CPUs, %s, redis %s (%s); %d rounds per figure; took %s\n",
		r.Started.Format("2006-01-02 15:04 MST"), r.GOOS, r.GOARCH, r.CPUs, r.GoVersion, r.RedisVersion, r.RedisMode,
		r.Rounds, r.Took)
	if r.Short {
		fmt.Fprintln(w, "SHORT MODE: small samples, for checking that the program works; the numbers mean little.")
	}
	section := ""
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range r.Figures {
		if f.Section != section {
			section = f.Section
			fmt.Fprintf(tw, "\n%s\tmedian\tp99\tspread (min..max)\tops/s\n", strings.ToUpper(section))
		}
		p99s, rates := "", ""
		if f.P99 != 0 {
			p99s = withUnit(f.P99, f.Unit)
		}
		if f.Rate != 0 {
			rates = num(f.Rate)
		}
		name := f.Name
		if f.Note != "" {
			name += " (" + f.Note + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s..%s\t%s\n", name, withUnit(f.Median, f.Unit), p99s, num(f.Min), num(f.Max), rates)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "TARGETS\tmeasured\tspread (min..max)\ttarget\tresult\n")
	for _, t := range r.Targets {
		res := "MISSED"
		if t.Met {
			res = "met"
		}
		if t.Skipped {
			res = "not measured"
		}
		fmt.Fprintf(tw, "  %s %s\t%s\t%s..%s\t%s %s\t%s\n", t.ID, t.Claim, withUnit(t.Measured, t.Unit),
			num(t.Min), num(t.Max), t.Op, withUnit(t.Limit, t.Unit), res)
	}
	tw.Flush()
	for _, t := range r.Targets {
		if t.Note != "" {
			fmt.Fprintf(w, "  %s: %s\n", t.ID, t.Note)
		}
	}
	for _, f := range r.Figures {
		if len(f.Mix) == 0 {
			continue
		}
		keys := make([]string, 0, len(f.Mix))
		for k := range f.Mix {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b string) int {
			if f.Mix[a] != f.Mix[b] {
				return cmpFloat(f.Mix[b], f.Mix[a])
			}
			return strings.Compare(a, b)
		})
		var parts []string
		var total float64
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %s", k, num(f.Mix[k])))
			total += f.Mix[k]
		}
		fmt.Fprintf(w, "commands inside one call of %s: %s per call: %s\n", f.Name, num(total), strings.Join(parts, ", "))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
