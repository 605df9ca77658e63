//go:build linux

package test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runbudget/runbudget/test/history"
)

// stallWatch notes when this test process stopped running: a goroutine
// that ticks every stallTick and records each gap between its ticks well
// above that. The fault scenarios run every host in this one process, on
// a shared machine; when the machine is loaded the process can stall for
// longer than a lease TTL. A stall that long is a process pause (scenario
// 4): a host's session or a waiter's place can expire in Redis with no
// fault of the budget, and when the process runs again its goroutines
// resume in any order, so another host's new grant may be reported a few
// microseconds before the old holder's keeper fires Lost(). Scenarios
// whose bars assume hosts run on time use the windows to tell a stall's
// effects from the budget's.
type stallWatch struct {
	mu    sync.Mutex
	gaps  []stallGap
	stop  chan struct{}
	done  chan struct{}
	worst time.Duration
}

// stallGap is one stall: the process ran nothing between From and To.
type stallGap struct{ From, To time.Time }

func (g stallGap) len() time.Duration { return g.To.Sub(g.From) }

const (
	stallTick = 5 * time.Millisecond
	// stallNoted: gaps shorter than this are ordinary timer latency.
	stallNoted = 50 * time.Millisecond
)

// watchStalls starts a watch, stopped by t's cleanup.
func watchStalls(t testing.TB) *stallWatch {
	w := &stallWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tk := time.NewTicker(stallTick)
		defer tk.Stop()
		last := time.Now()
		for {
			select {
			case <-w.stop:
				return
			case now := <-tk.C:
				// The ticker's own time is when it should have fired; the
				// clock read here is when this goroutine ran.
				now = time.Now()
				if gap := now.Sub(last) - stallTick; gap > stallNoted {
					w.mu.Lock()
					w.gaps = append(w.gaps, stallGap{From: last, To: now})
					w.worst = max(w.worst, gap)
					w.mu.Unlock()
				}
				last = now
			}
		}
	}()
	t.Cleanup(w.close)
	return w
}

func (w *stallWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// longer returns the stalls of at least min, in order.
func (w *stallWatch) longer(min time.Duration) []stallGap {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []stallGap
	for _, g := range w.gaps {
		if g.len() >= min {
			out = append(out, g)
		}
	}
	return out
}

// longest is the longest stall seen.
func (w *stallWatch) longest() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.worst
}

// windows turns stalls of at least min into windows for the history
// check (every domain), each extended by after. As Losses (after: the
// referee's slack): a host's session may have expired during the stall,
// its holder still unaware. As Outages (after: a liveness interval or
// more): a waiter whose place expired queues again on its next call, and
// until then arrival order does not hold.
func (w *stallWatch) windows(min, after time.Duration) []history.Window {
	var out []history.Window
	for _, g := range w.longer(min) {
		out = append(out, history.Window{From: g.From, To: g.To.Add(after)})
	}
	return out
}

// during is how long this process stalled between from and to.
func (w *stallWatch) during(from, to time.Time) time.Duration {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	for _, g := range w.gaps {
		if lo, hi := later(g.From, from), earlier(g.To, to); hi.After(lo) {
			d += hi.Sub(lo)
		}
	}
	return d
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// explains reports whether every instant in at falls in a stall of at
// least min (up to slack after its end), and describes the stalls.
func (w *stallWatch) explains(at []time.Time, min, slack time.Duration) (bool, string) {
	gs := w.longer(min)
	var parts []string
	for _, g := range gs {
		parts = append(parts, g.len().Round(time.Millisecond).String())
	}
	desc := fmt.Sprintf("%d stalls of this process of %v or more (%s); longest %v", len(gs), min.Round(time.Millisecond),
		strings.Join(parts, ", "), w.longest().Round(time.Millisecond))
	if len(at) == 0 {
		return true, desc
	}
	for _, a := range at {
		in := false
		for _, g := range gs {
			if !a.Before(g.From) && !a.After(g.To.Add(slack)) {
				in = true
				break
			}
		}
		if !in {
			return false, desc
		}
	}
	return true, desc
}
