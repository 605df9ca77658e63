//go:build linux

package history

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/lease"
)

// Options say what a history is checked against.
type Options struct {
	// Limits are the budget's (as given to budget.New; Normalize fills in
	// the burst). Memory is each host's and not the store's: not checked.
	Limits budget.Limits
	// RateSlack is the clock tolerance of the token bucket: a start may
	// come up to this much earlier than the bucket allows, so up to
	// Burst + rate x (t + RateSlack) starts in any t. The store meters with
	// its own clock and the history with the client's. Default 1 ms.
	RateSlack time.Duration
	// Losses are windows in which the store may have lost state (a master
	// killed, its replica promoted): leases granted before one may have
	// been dropped as it began, and arrival order does not hold across it.
	// A window should run to the end of the quarantine that follows the
	// loss: a waiter answered "wait" during a quarantine was not put in
	// line, so arrival order starts again after it.
	Losses []Window
	// Outages are windows in which the store refused calls but kept its
	// state: a waiter that could not renew its place may have lost it, so
	// arrival order does not hold across one either.
	Outages []Window
	// Timeout bounds porcupine's search (default 60 s); a search cut short
	// is reported as Unknown, never as a pass.
	Timeout time.Duration
}

// Window is a stretch of time on Domains (nil: every domain).
type Window struct {
	Domains  []budget.Domain
	From, To time.Time
}

func (l Window) covers(d budget.Domain) bool {
	return l.Domains == nil || slices.Contains(l.Domains, d)
}

// Result is what Check found.
type Result struct {
	// Verdict is porcupine's: Ok, Illegal (no order of the recorded calls,
	// each taking effect inside its interval, keeps the model's
	// ceilings and bucket), or Unknown (the search hit the timeout).
	Verdict porcupine.CheckResult
	// Illegal names, per domain porcupine refused, where its longest
	// legal prefix ended.
	Illegal []string
	// Grants, Frees and Waiters count what was checked; Domains the
	// partitions.
	Grants, Frees, Waiters, Domains int
	// Over lists instants at which more leases were held for certain
	// (granted for sure, not yet retired for sure) than a ceiling allows:
	// the explanation of an Illegal verdict on ceilings.
	Over []Over
	// Inversions lists grants that passed a waiter that was in line before
	// the later one arrived, and still waiting when it was granted.
	Inversions []Inversion
	// GrantWindow50 and GrantWindow99 are quantiles of the grants'
	// intervals (how long before its reply a grant may have happened): the
	// wider they are, the more orders porcupine must try.
	GrantWindow50, GrantWindow99 time.Duration
	// Took is how long the check ran.
	Took time.Duration

	info  porcupine.LinearizationInfo
	model porcupine.Model
}

// Over is one instant above a ceiling.
type Over struct {
	Domain  budget.Domain
	What    string // a class, or "bodies"
	Held    int
	Ceiling int
	At      time.Time
	Lease   string // the grant that went over
}

// Inversion is a grant out of arrival order.
type Inversion struct {
	Domain         budget.Domain
	Earlier, Later string // waiter IDs: Later was granted while Earlier waited
	By             time.Duration
}

// Err returns nil when the history passed every check, else what failed.
func (r Result) Err() error {
	var errs []error
	switch r.Verdict {
	case porcupine.Ok:
	case porcupine.Illegal:
		errs = append(errs, fmt.Errorf("history: not linearizable against the budget's model: %s", strings.Join(r.Illegal, "; ")))
	default:
		errs = append(errs, fmt.Errorf("history: porcupine gave %s (timed out?)", r.Verdict))
	}
	for i, o := range r.Over {
		if i == 3 {
			errs = append(errs, fmt.Errorf("history: ... %d instants above a ceiling in all", len(r.Over)))
			break
		}
		errs = append(errs, fmt.Errorf("history: %d %s held on %s at %s (ceiling %d), with lease %s",
			o.Held, o.What, o.Domain, o.At.Format("15:04:05.000000"), o.Ceiling, o.Lease))
	}
	for i, v := range r.Inversions {
		if i == 3 {
			errs = append(errs, fmt.Errorf("history: ... %d grants out of arrival order in all", len(r.Inversions)))
			break
		}
		errs = append(errs, fmt.Errorf("history: on %s, %s was granted at least %v before %s, which was in line before it arrived",
			v.Domain, v.Later, v.By, v.Earlier))
	}
	return errors.Join(errs...)
}

// Summary is one line for a FIGURE.
func (r Result) Summary() string {
	return fmt.Sprintf("porcupine %s on %d grants (intervals p50 %v, p99 %v) and %d retirements over %d domain(s) in %v; %d instants above a ceiling; %d grants out of arrival order among %d waiters",
		r.Verdict, r.Grants, r.GrantWindow50.Round(time.Microsecond), r.GrantWindow99.Round(time.Microsecond),
		r.Frees, r.Domains, r.Took.Round(time.Millisecond), len(r.Over), len(r.Inversions), r.Waiters)
}

// Visualize writes porcupine's HTML view of the check (per domain, every
// operation and the longest linearization found) to path.
func (r Result) Visualize(path string) error {
	return porcupine.VisualizePath(r.model, r.info, path)
}

// input is one operation of the model: a grant or a retirement of parts of
// one lease, on one domain (the partition). Call and Return are its
// interval, which the timed token bucket needs.
type input struct {
	grant     bool
	class     int // index in budget.Classes; -1 unknown (unbounded)
	parts     lease.Parts
	lease     string
	call, ret int64
}

// state is one domain's: requests in flight per class, open bodies, and
// the token bucket as of the last start (tokens after it, and when it was
// made). The bucket is full before the first start.
type state struct {
	inflight [budget.NumClasses]int
	bodies   int
	tokens   float64
	at       int64 // 0: no start yet
}

// Check checks h against the budget of opt.Limits.
//
// Porcupine looks for an order of every grant and retirement, each taking
// effect at one instant inside its recorded interval, in which one
// domain's model never goes above a ceiling: a grant adds one to its
// class (and one open body if it opens one); a retirement takes away the
// parts it returned. With a rate, each start also takes a token from a
// bucket of Burst tokens refilled at the rate, and is placed at the
// earliest instant inside its interval, no earlier than the previous
// start, at which a token is there (the earliest is never worse for the
// starts that follow). Domains are checked apart (porcupine partitions):
// each one's ceilings and bucket are its own. A multi-domain grant is
// checked on each of its domains, which is weaker than one order for all.
//
// Arrival order is checked apart, on the intervals alone: if waiter A had
// its answer (so it was in line) before B's first call went out, and B was
// told of its grant before A's grant could have been made (A was still
// in line then), B passed A. Losses excuse a waiter whose wait overlaps
// one, and so do Outages. There is no tolerance beyond the clocks' (ageSlack): a blocked
// waiter holds back every younger one on its domains.
func Check(h History, opt Options) Result {
	begin := time.Now()
	lim, err := opt.Limits.Normalize()
	if err != nil {
		return Result{Verdict: porcupine.Unknown, Illegal: []string{err.Error()}}
	}
	if opt.RateSlack == 0 {
		opt.RateSlack = time.Millisecond
	}
	if opt.Timeout == 0 {
		opt.Timeout = 60 * time.Second
	}
	byID := make(map[string]*Waiter, len(h.Waiters))
	for i := range h.Waiters {
		byID[h.Waiters[i].ID] = &h.Waiters[i]
	}

	var ops []porcupine.Operation
	clients := map[string]int{}
	clientOf := func(w *Waiter) int {
		c, ok := clients[w.Client]
		if !ok {
			c = len(clients)
			clients[w.Client] = c
		}
		return c
	}
	res := Result{Waiters: len(h.Waiters)}
	// opDomains keeps each operation's domains for the partition.
	var opDomains [][]budget.Domain
	var widths []int64
	for i := range h.Waiters {
		w := &h.Waiters[i]
		if !w.Granted() {
			continue
		}
		res.Grants++
		widths = append(widths, w.GrantTo-w.GrantFrom)
		parts := lease.Request
		if w.Body {
			parts |= lease.Body
		}
		ops = append(ops, porcupine.Operation{ClientId: clientOf(w), Call: w.GrantFrom, Return: w.GrantTo,
			Input: input{grant: true, class: w.Class.Index(), parts: parts, lease: w.ID, call: w.GrantFrom, ret: w.GrantTo}})
		opDomains = append(opDomains, w.Domains)
	}
	if len(widths) > 0 {
		slices.Sort(widths)
		res.GrantWindow50 = time.Duration(widths[len(widths)/2])
		res.GrantWindow99 = time.Duration(widths[len(widths)*99/100])
	}
	for _, f := range h.Frees {
		w := byID[f.Lease]
		if w == nil || !w.Granted() {
			continue // a retirement of a grant never seen: nothing to give back
		}
		res.Frees++
		from := f.From
		for _, l := range opt.Losses {
			// A lease granted before a loss may have been dropped with it.
			if w.GrantFrom < l.From.UnixNano() && from > l.From.UnixNano() && slices.ContainsFunc(w.Domains, l.covers) {
				from = l.From.UnixNano()
			}
		}
		// A retirement follows its grant: the holder retires what it was told
		// it holds. Strictly after, so porcupine never orders them the other
		// way (its intervals are closed).
		from = max(from, w.GrantTo+1)
		to := max(f.To, from)
		ops = append(ops, porcupine.Operation{ClientId: clientOf(w), Call: from, Return: to,
			Input: input{class: w.Class.Index(), parts: f.Parts, lease: f.Lease, call: from, ret: to}})
		opDomains = append(opDomains, w.Domains)
	}
	for i := range ops {
		ops[i].Metadata = i
	}

	var caps [budget.NumClasses]int
	for c, n := range lim.InFlight {
		if i := c.Index(); i >= 0 {
			caps[i] = n
		}
	}
	rps, burst := lim.RequestsPerSecond, float64(lim.Burst)
	slack := opt.RateSlack.Nanoseconds()
	var partDomains []budget.Domain
	model := porcupine.Model{
		Partition: func(hist []porcupine.Operation) [][]porcupine.Operation {
			idx := map[budget.Domain]int{}
			var parts [][]porcupine.Operation
			partDomains = partDomains[:0]
			for _, op := range hist {
				for _, d := range opDomains[op.Metadata.(int)] {
					i, ok := idx[d]
					if !ok {
						i = len(parts)
						idx[d] = i
						parts = append(parts, nil)
						partDomains = append(partDomains, d)
					}
					parts[i] = append(parts[i], op)
				}
			}
			return parts
		},
		Init: func() any { return state{} },
		Step: func(st, in, _ any) (bool, any) {
			s, op := st.(state), in.(input)
			if !op.grant {
				if op.class >= 0 && op.parts&lease.Request != 0 {
					if s.inflight[op.class] == 0 {
						return false, s
					}
					s.inflight[op.class]--
				}
				if op.parts&lease.Body != 0 {
					if s.bodies == 0 {
						return false, s
					}
					s.bodies--
				}
				return true, s
			}
			if op.class >= 0 {
				if caps[op.class] > 0 && s.inflight[op.class] >= caps[op.class] {
					return false, s
				}
				s.inflight[op.class]++
			}
			if op.parts&lease.Body != 0 {
				if lim.OpenBodies > 0 && s.bodies >= lim.OpenBodies {
					return false, s
				}
				s.bodies++
			}
			if rps > 0 {
				t, tok := max(s.at, op.call), burst
				if s.at != 0 {
					tok = min(burst, s.tokens+rps*float64(t-s.at)/1e9)
				}
				if tok < 1 {
					t += int64(math.Ceil((1 - tok) / rps * 1e9))
					tok = 1
				}
				if t > op.ret+slack {
					return false, s
				}
				s.tokens, s.at = tok-1, t
			}
			return true, s
		},
		Hash: func(st any) uint64 {
			s := st.(state)
			h := uint64(s.bodies)*1000003 ^ uint64(s.at)
			for _, n := range s.inflight {
				h = h*31 + uint64(n)
			}
			return h
		},
		DescribeOperation: func(in, _ any) string {
			op := in.(input)
			cls := "?"
			if op.class >= 0 {
				cls = string(budget.Classes()[op.class])
			}
			if op.grant {
				return fmt.Sprintf("grant %s %s (%s)", short(op.lease), cls, op.parts)
			}
			return fmt.Sprintf("free %s %s (%s)", short(op.lease), cls, op.parts)
		},
		DescribeState: func(st any) string {
			s := st.(state)
			var b strings.Builder
			for i, n := range s.inflight {
				if n > 0 {
					fmt.Fprintf(&b, "%s=%d ", budget.Classes()[i], n)
				}
			}
			fmt.Fprintf(&b, "bodies=%d", s.bodies)
			if rps > 0 {
				fmt.Fprintf(&b, " tokens=%.2f", s.tokens)
			}
			return b.String()
		},
	}
	res.model = model
	res.Verdict, res.info = porcupine.CheckOperationsVerbose(model, ops, opt.Timeout)
	res.Domains = len(partDomains)
	if res.Verdict == porcupine.Illegal {
		res.Illegal = illegalAt(res.info, partDomains)
	}
	res.Over = overs(h, byID, lim, opt.Losses)
	res.Inversions = inversions(h, append(slices.Clone(opt.Losses), opt.Outages...))
	res.Took = time.Since(begin)
	return res
}

// illegalAt says, for each partition whose longest linearization does not
// cover it, how far that got: the operation it could not place next.
func illegalAt(info porcupine.LinearizationInfo, doms []budget.Domain) []string {
	var out []string
	ops := info.PartialLinearizationsOperations()
	for p, lins := range ops {
		best := -1
		for i, l := range lins {
			if best < 0 || len(l) > len(lins[best]) {
				best = i
			}
		}
		if best < 0 {
			continue
		}
		l := lins[best]
		d := "?"
		if p < len(doms) {
			d = doms[p].String()
		}
		var last string
		if len(l) > 0 {
			op := l[len(l)-1]
			last = fmt.Sprintf("; its last op returned at %s", time.Unix(0, op.Return).Format("15:04:05.000000"))
		}
		out = append(out, fmt.Sprintf("domain %s: %d operations linearized at most%s", d, len(l), last))
	}
	return out
}

// short returns the start of an ID, enough to tell leases apart.
func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// overs sweeps each domain's leases held for certain: from the reply that
// reported the grant to the call that first retired the part (as early as
// possible inside a loss that may have dropped it).
func overs(h History, byID map[string]*Waiter, lim budget.Limits, losses []Window) []Over {
	type edge struct {
		at    int64
		delta int
		what  string
		lease string
	}
	per := map[budget.Domain][]edge{}
	add := func(w *Waiter, at int64, delta int, parts lease.Parts) {
		for _, d := range w.Domains {
			if parts&lease.Request != 0 {
				per[d] = append(per[d], edge{at, delta, string(w.Class), w.ID})
			}
			if parts&lease.Body != 0 {
				per[d] = append(per[d], edge{at, delta, "bodies", w.ID})
			}
		}
	}
	for i := range h.Waiters {
		w := &h.Waiters[i]
		if w.Granted() {
			p := lease.Request
			if w.Body {
				p |= lease.Body
			}
			add(w, w.GrantTo, 1, p)
		}
	}
	for _, f := range h.Frees {
		w := byID[f.Lease]
		if w == nil || !w.Granted() {
			continue
		}
		from := f.From
		if f.Missing {
			from = w.GrantTo
		}
		for _, l := range losses {
			if w.GrantFrom < l.From.UnixNano() && from > l.From.UnixNano() && slices.ContainsFunc(w.Domains, l.covers) {
				from = l.From.UnixNano()
			}
		}
		add(w, max(from, w.GrantTo), -1, f.Parts)
	}
	ceiling := func(what string) int {
		if what == "bodies" {
			return lim.OpenBodies
		}
		return lim.InFlight[budget.OpClass(what)]
	}
	var out []Over
	for d, es := range per {
		// Closed intervals: at one instant a retirement may come first.
		slices.SortFunc(es, func(a, b edge) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta)) })
		n := map[string]int{}
		for _, e := range es {
			n[e.what] += e.delta
			if c := ceiling(e.what); e.delta > 0 && c > 0 && n[e.what] > c {
				out = append(out, Over{Domain: d, What: e.what, Held: n[e.what], Ceiling: c, At: time.Unix(0, e.at), Lease: e.lease})
			}
		}
	}
	slices.SortFunc(out, func(a, b Over) int { return a.At.Compare(b.At) })
	return out
}

// inversions finds, per domain, grants that passed an earlier waiter.
// Waiter A was in line before B if A's first answer came back before B's
// first call went out. B passed A if B was told of its grant before the
// earliest moment A could have been granted: the last call A was answered
// "wait" on, or the start of its grant's interval (AgedFrom when later).
func inversions(h History, losses []Window) []Inversion {
	type entry struct {
		w      *Waiter
		lower  int64 // A could not have been granted before this
		waitTo int64 // end of A's wait, for the loss windows
	}
	per := map[budget.Domain][]entry{}
	for i := range h.Waiters {
		w := &h.Waiters[i]
		e := entry{w: w, lower: w.Pending, waitTo: Open}
		switch {
		case w.Granted():
			e.lower, e.waitTo = max(w.GrantFrom, w.AgedFrom), w.GrantTo
		case w.Left != 0:
			e.waitTo = w.Left
		}
		for _, d := range w.Domains {
			per[d] = append(per[d], e)
		}
	}
	var out []Inversion
	for d, es := range per {
		excused := func(e entry) bool {
			for _, l := range losses {
				if l.covers(d) && e.w.FirstCall <= l.To.UnixNano() && e.waitTo >= l.From.UnixNano() {
					return true
				}
			}
			return false
		}
		// As: in line for sure, in order of arrival; Bs: granted, in order
		// of their first call. For each B, the As in line before it went
		// out; it passed one if that one could not be granted before B's
		// grant was reported.
		var as, bs []entry
		for _, e := range es {
			if e.w.Arrived != 0 && e.lower != 0 && !excused(e) {
				as = append(as, e)
			}
			if e.w.Granted() {
				bs = append(bs, e)
			}
		}
		slices.SortFunc(as, func(a, b entry) int { return cmp.Compare(a.w.Arrived, b.w.Arrived) })
		slices.SortFunc(bs, func(a, b entry) int { return cmp.Compare(a.w.FirstCall, b.w.FirstCall) })
		var worst *entry
		i := 0
		for _, b := range bs {
			for ; i < len(as) && as[i].w.Arrived < b.w.FirstCall; i++ {
				if worst == nil || as[i].lower > worst.lower {
					worst = &as[i]
				}
			}
			if worst != nil && worst.w != b.w && b.w.GrantTo < worst.lower {
				out = append(out, Inversion{Domain: d, Earlier: worst.w.ID, Later: b.w.ID,
					By: time.Duration(worst.lower - b.w.GrantTo)})
			}
		}
	}
	return out
}
