//go:build linux

package history

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/lease"
)

var dom = budget.Domain{Version: 1, ID: "d"}

// ms is a time on the test's line: t0 plus n milliseconds.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

func ms(n float64) int64 { return t0 + int64(n*1e6) }

// hold is a lease granted in [g0, g1] and retired in [f0, f1], on dom.
type hold struct {
	id             string
	g0, g1, f0, f1 float64
	pending        float64 // its last "wait" answer went out then (0: never)
	first, arrived float64
}

func build(hs ...hold) History {
	var h History
	for _, x := range hs {
		first, arrived := x.first, x.arrived
		if first == 0 && arrived == 0 {
			first, arrived = x.g0, x.g0
		}
		w := Waiter{ID: x.id, Domains: []budget.Domain{dom}, Class: budget.OpGet, FirstCall: ms(first), Arrived: ms(arrived),
			GrantFrom: ms(x.g0), GrantTo: ms(x.g1)}
		if x.pending != 0 {
			w.Pending = ms(x.pending)
		}
		h.Waiters = append(h.Waiters, w)
		to := ms(x.f1)
		if x.f1 < 0 {
			to = Open
		}
		h.Frees = append(h.Frees, Free{Lease: x.id, Parts: lease.Request, From: ms(x.f0), To: to})
	}
	return h
}

func getLimits(n int) budget.Limits {
	return budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: n}}
}

func TestCheck(t *testing.T) {
	rate := budget.Limits{RequestsPerSecond: 10, Burst: 1}
	for _, tc := range []struct {
		name     string
		h        History
		lim      budget.Limits
		verdict  porcupine.CheckResult
		over     int
		inverted int
	}{
		{name: "one after the other", lim: getLimits(1), verdict: porcupine.Ok,
			h: build(hold{id: "a", g0: 0, g1: 1, f0: 5, f1: 6}, hold{id: "b", g0: 2, g1: 7, f0: 8, f1: 9})},
		// b was told of its grant (at 4) before a's retirement went out (5).
		{name: "one over for a millisecond", lim: getLimits(1), verdict: porcupine.Illegal, over: 1,
			h: build(hold{id: "a", g0: 0, g1: 1, f0: 5, f1: 6}, hold{id: "b", g0: 2, g1: 4, f0: 8, f1: 9})},
		// b's grant and a's retirement overlap: the retirement may have come first.
		{name: "grant during a retirement", lim: getLimits(1), verdict: porcupine.Ok,
			h: build(hold{id: "a", g0: 0, g1: 1, f0: 5, f1: 6}, hold{id: "b", g0: 2, g1: 5.5, f0: 8, f1: 9})},
		{name: "two under a ceiling of two", lim: getLimits(2), verdict: porcupine.Ok,
			h: build(hold{id: "a", g0: 0, g1: 1, f0: 5, f1: 6}, hold{id: "b", g0: 2, g1: 4, f0: 8, f1: 9})},
		// A retirement never confirmed: it may have happened any time after 5.
		{name: "retirement left open", lim: getLimits(1), verdict: porcupine.Ok,
			h: build(hold{id: "a", g0: 0, g1: 1, f0: 5, f1: -1}, hold{id: "b", g0: 2, g1: 7, f0: 8, f1: 9})},
		// Burst 1 at 10/s: starts 100ms apart pass, three in 150ms do not.
		{name: "within the rate", lim: rate, verdict: porcupine.Ok,
			h: build(hold{id: "a", g0: 0, g1: 1, f0: 2, f1: 3}, hold{id: "b", g0: 90, g1: 101, f0: 102, f1: 103},
				hold{id: "c", g0: 150, g1: 201, f0: 202, f1: 203})},
		{name: "above the rate", lim: rate, verdict: porcupine.Illegal,
			h: build(hold{id: "a", g0: 0, g1: 1, f0: 2, f1: 3}, hold{id: "b", g0: 90, g1: 101, f0: 102, f1: 103},
				hold{id: "c", g0: 150, g1: 160, f0: 162, f1: 163})},
		// b arrived (first call at 3) after a was in line (answered at 2),
		// and was told of its grant (at 6) before a's last wait answer (7).
		{name: "passed an earlier waiter", lim: getLimits(2), verdict: porcupine.Ok, inverted: 1,
			h: build(hold{id: "a", first: 1, arrived: 2, pending: 7, g0: 7, g1: 8, f0: 9, f1: 10},
				hold{id: "b", first: 3, arrived: 4, g0: 5, g1: 6, f0: 9, f1: 10})},
		{name: "arrivals that overlap", lim: getLimits(2), verdict: porcupine.Ok,
			h: build(hold{id: "a", first: 1, arrived: 3.5, pending: 7, g0: 7, g1: 8, f0: 9, f1: 10},
				hold{id: "b", first: 3, arrived: 4, g0: 5, g1: 6, f0: 9, f1: 10})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(tc.h, Options{Limits: tc.lim})
			if r.Verdict != tc.verdict || len(r.Over) != tc.over || len(r.Inversions) != tc.inverted {
				t.Errorf("verdict %s, %d over, %d inversions; want %s, %d, %d (%v)", r.Verdict, len(r.Over), len(r.Inversions),
					tc.verdict, tc.over, tc.inverted, r.Err())
			}
			if (r.Err() == nil) != (tc.verdict == porcupine.Ok && tc.inverted == 0) {
				t.Errorf("Err() = %v", r.Err())
			}
		})
	}
}

// TestLoss: a state loss may drop a lease, so a grant after it does not
// count the lease still held, and arrival order across it is excused.
func TestLoss(t *testing.T) {
	h := build(hold{id: "a", first: 0, arrived: 1, g0: 0, g1: 1, f0: 50, f1: 60},
		hold{id: "b", first: 2, arrived: 3, pending: 28, g0: 28, g1: 30, f0: 70, f1: 80},
		hold{id: "c", first: 4, arrived: 5, g0: 25, g1: 26, f0: 70, f1: 80})
	if r := Check(h, Options{Limits: getLimits(1)}); r.Verdict != porcupine.Illegal || len(r.Inversions) != 1 {
		t.Fatalf("without the loss: %s, %d inversions; want Illegal and 1", r.Verdict, len(r.Inversions))
	}
	loss := Window{Domains: []budget.Domain{dom}, From: time.Unix(0, ms(10)), To: time.Unix(0, ms(15))}
	// a dropped at 10; b and c still both held from 30 to 70 against one slot.
	if r := Check(h, Options{Limits: getLimits(2), Losses: []Window{loss}}); r.Err() != nil {
		t.Fatalf("with the loss: %v", r.Err())
	}
}

// TestRecorder: lanes on the in-process store, recorded, pass; the same
// history with one grant moved earlier than a retirement fails.
func TestRecorder(t *testing.T) {
	lim := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 2}, OpenBodies: 1, RequestsPerSecond: 2000, Burst: 4}
	rec := NewRecorder(budget.NewLocalStore(), "local")
	b, err := budget.New(lim, budget.WithStore(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var wg sync.WaitGroup
	for lane := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				l, err := b.Acquire(context.Background(), budget.Request{Domains: []budget.Domain{dom}, Class: budget.OpGet,
					OpensBody: lane%2 == 0})
				if err != nil {
					t.Error(err)
					return
				}
				l.CompleteRequest()
				l.Release()
			}
		}()
	}
	wg.Wait()
	h := rec.History()
	r := Check(h, Options{Limits: lim})
	t.Log(r.Summary())
	if err := r.Err(); err != nil || r.Grants != 320 || r.Frees < 320 {
		t.Fatalf("%d grants, %d frees: %v", r.Grants, r.Frees, err)
	}
	// Plant an overlap: report a body grant as made before the previous
	// body holder's retirement went out.
	var prev *Free
	for i := range h.Frees {
		if h.Frees[i].Parts == lease.Body {
			prev = &h.Frees[i]
			break
		}
	}
	for i := range h.Waiters {
		w := &h.Waiters[i]
		if w.Body && w.GrantTo > prev.From && w.ID != prev.Lease {
			w.GrantFrom, w.GrantTo = prev.From-2, prev.From-1
			break
		}
	}
	if r := Check(h, Options{Limits: lim}); r.Verdict != porcupine.Illegal || len(r.Over) == 0 {
		t.Fatalf("planted overlap: %s, %d over", r.Verdict, len(r.Over))
	} else {
		t.Log(fmt.Sprint(r.Err()))
	}
}
