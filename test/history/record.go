//go:build linux

package history

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/lease"
)

// Open is the end of an interval that had not closed when the history was
// taken: a retirement never confirmed (the lease expired, or the call kept
// failing), or a grant still in flight. The checker may place what it
// bounds anywhere after its start.
const Open int64 = math.MaxInt64

// Times are nanoseconds since the Unix epoch, read from the wall clock, so
// that histories recorded by different processes on one machine merge on
// one time line. The scripts do not return Redis time; every interval is
// the client's: read just before a call went out and just after its reply
// came back, so whatever the store did during the call happened inside it.
// That is what linearizability asks for.

// Waiter is one Acquire as the store saw it: a waiter ID, placed in line on
// its first call and granted (or not) on a later one.
type Waiter struct {
	ID      string          `json:"id"`
	Client  string          `json:"client,omitempty"`
	Domains []budget.Domain `json:"domains"`
	Class   budget.OpClass  `json:"class"`
	Body    bool            `json:"body,omitempty"`
	// FirstCall is when its first TryAcquire went out; Arrived when the
	// first one that was answered came back (zero: none was), by which
	// time the waiter was in line.
	FirstCall int64 `json:"first"`
	Arrived   int64 `json:"arrived,omitempty"`
	// Pending is when the last TryAcquire answered without a grant went out
	// (zero: none was). A grant, seen or not, came after it.
	Pending int64 `json:"pending,omitempty"`
	// GrantFrom and GrantTo bound the grant when the store reported one
	// (GrantTo zero: it did not, by the end of the history).
	GrantFrom int64 `json:"grantFrom,omitempty"`
	GrantTo   int64 `json:"grantTo,omitempty"`
	// AgedFrom is a later start for the grant than GrantFrom, from the
	// age the store reported with it (zero: none). It is sound, and the
	// arrival check uses it, but porcupine is given GrantFrom (see
	// Recorder).
	AgedFrom int64 `json:"agedFrom,omitempty"`
	// Left is when a Cancel for a waiter never seen granted went out.
	Left int64 `json:"left,omitempty"`
}

// Granted reports whether the store told the waiter it was granted.
func (w *Waiter) Granted() bool { return w.GrantTo != 0 }

// Free is parts of a granted lease given back: the retirement that first
// named them went out at From, and the store confirmed them gone by To
// (Open: never, within the history).
type Free struct {
	Lease string      `json:"lease"`
	Parts lease.Parts `json:"parts"`
	From  int64       `json:"from"`
	To    int64       `json:"to"`
	// Missing says a heartbeat found the lease gone: it expired or was
	// dropped at a time the client cannot know, so From is the grant.
	Missing bool `json:"missing,omitempty"`
}

// History is what one or more recorders saw.
type History struct {
	Waiters []Waiter `json:"waiters"`
	Frees   []Free   `json:"frees"`
}

// Merge returns the histories of several processes as one.
func Merge(hs ...History) History {
	var out History
	for _, h := range hs {
		out.Waiters = append(out.Waiters, h.Waiters...)
		out.Frees = append(out.Frees, h.Frees...)
	}
	return out
}

// Write encodes h as JSON, for a worker process to hand its history to the
// test that checks it.
func (h History) Write(w io.Writer) error { return json.NewEncoder(w).Encode(h) }

// Read decodes a history written by Write.
func Read(r io.Reader) (History, error) {
	var h History
	err := json.NewDecoder(r).Decode(&h)
	return h, err
}

// ageSlack is how far the store's clock and this process's may drift apart
// over a grant's age (below a second in these runs, between two clocks of
// one machine).
const ageSlack = time.Millisecond

// Recorder is a budget.Store that records every grant and retirement its
// Budget is told of, and passes every call to the store it wraps unchanged.
// Build the Budget on it (budget.WithStore) so it sees what the Budget
// sees.
//
// A grant is bounded by the last TryAcquire of the waiter that was answered
// without one (a handoff may grant a queued waiter from another's call at
// any moment after its place was taken) and the reply that reported it.
// A reply with GrantedAgo zero says the grant was made by that very call,
// which then bounds it. A positive GrantedAgo does not move the interval:
// redisstore answers a handoff it learnt of from a wake message with an age
// meant for lease renewals, an upper bound that lands anywhere between the
// waiter's last call and the grant (kept as AgedFrom, for the arrival
// check). Starting intervals there would be sound, but it
// reorders their starts against the order the store granted them in, and
// porcupine's search, which tries operations in the order they start,
// then backtracks over it: scenario 22's history took 13-41 s to check
// that way, against under a second from the waiter's last call. A test
// that needs tighter bounds reads the store's own time of each grant
// (test/grantclock_test.go), which keeps that order.
//
// The recorder hides the store's Handoff flag from the Budget, which then
// asks again after a wake and is answered Granted (as the Store contract
// allows): the grant is then seen on a call the recorder times.
type Recorder struct {
	budget.Store
	client string

	mu      sync.Mutex
	waiters map[string]*Waiter
	order   []*Waiter
	leases  map[string]*held
	frees   []Free
}

// held is a granted lease's parts as the recorder tracks them.
type held struct {
	w       *Waiter
	parts   lease.Parts // granted parts the store holds: Request, and Body when it opens one
	from    map[lease.Parts]int64
	missing bool
}

var _ budget.Store = (*Recorder)(nil)

// NewRecorder wraps s; client names the recording host in messages.
func NewRecorder(s budget.Store, client string) *Recorder {
	return &Recorder{Store: s, client: client, waiters: map[string]*Waiter{}, leases: map[string]*held{}}
}

func now() int64 { return time.Now().UnixNano() }

// TryAcquire implements budget.Store.
func (r *Recorder) TryAcquire(ctx context.Context, id string, req budget.Request) (budget.Attempt, error) {
	r.mu.Lock()
	w := r.waiters[id]
	start := now()
	if w == nil {
		w = &Waiter{ID: id, Client: r.client, Domains: slices.Clone(req.Domains), Class: req.Class, Body: req.OpensBody,
			FirstCall: start}
		r.waiters[id] = w
		r.order = append(r.order, w)
	}
	r.mu.Unlock()

	att, err := r.Store.TryAcquire(ctx, id, req)
	end := now()
	att.Handoff = nil

	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		return att, err
	}
	if w.Arrived == 0 {
		w.Arrived = end
	}
	if att.Outcome != budget.Granted {
		w.Pending = start
		return att, nil
	}
	if w.Granted() {
		return att, nil // asked again after a grant: the first report stands
	}
	from, to := w.Pending, end
	if from == 0 {
		from = w.FirstCall
	}
	if att.GrantedAgo <= 0 {
		from = max(from, start) // this call made the grant
	} else if aged := start - att.GrantedAgo.Nanoseconds() - int64(ageSlack); aged > from {
		w.AgedFrom = aged
	}
	w.GrantFrom, w.GrantTo = from, to
	parts := lease.Request
	if w.Body {
		parts |= lease.Body
	}
	r.leases[id] = &held{w: w, parts: parts, from: map[lease.Parts]int64{}}
	return att, nil
}

// Cancel implements budget.Store. A cancelled grant gives back all of it.
func (r *Recorder) Cancel(ctx context.Context, id string) error {
	start := now()
	r.mu.Lock()
	if w := r.waiters[id]; w != nil && !w.Granted() && w.Left == 0 {
		w.Left = start
	}
	r.mu.Unlock()
	return r.retire(ctx, id, lease.All, start, func() error { return r.Store.Cancel(ctx, id) })
}

// Retire implements budget.Store.
func (r *Recorder) Retire(ctx context.Context, id string, parts lease.Parts) error {
	return r.retire(ctx, id, parts, now(), func() error { return r.Store.Retire(ctx, id, parts) })
}

// retire runs call, a retirement of parts of lease id that went out at
// start, and records the parts it confirmed gone.
func (r *Recorder) retire(_ context.Context, id string, parts lease.Parts, start int64, call func() error) error {
	r.mu.Lock()
	if h := r.leases[id]; h != nil {
		for _, p := range []lease.Parts{lease.Request, lease.Body} {
			if parts&p != 0 && h.parts&p != 0 {
				if _, ok := h.from[p]; !ok {
					h.from[p] = start
				}
			}
		}
	}
	r.mu.Unlock()
	err := call()
	end := now()
	if err == nil {
		r.mu.Lock()
		r.confirm(id, parts, end)
		r.mu.Unlock()
	}
	return err
}

// confirm records parts of lease id gone by end; r.mu is held.
func (r *Recorder) confirm(id string, parts lease.Parts, end int64) {
	h := r.leases[id]
	if h == nil {
		return
	}
	for _, p := range []lease.Parts{lease.Request, lease.Body} {
		if parts&p == 0 || h.parts&p == 0 {
			continue
		}
		from, ok := h.from[p]
		if !ok || h.missing {
			from = h.w.GrantTo
		}
		r.frees = append(r.frees, Free{Lease: id, Parts: p, From: from, To: end, Missing: h.missing})
		h.parts &^= p
	}
	if h.parts == 0 {
		delete(r.leases, id)
	}
}

// Heartbeat implements budget.Store. A lease the store no longer holds
// expired (or was dropped) at a moment the client cannot know: anywhere
// after its grant, before this reply.
func (r *Recorder) Heartbeat(ctx context.Context, ids []string) ([]string, error) {
	missing, err := r.Store.Heartbeat(ctx, ids)
	end := now()
	if err == nil && len(missing) > 0 {
		r.mu.Lock()
		for _, id := range missing {
			if h := r.leases[id]; h != nil {
				h.missing = true
				r.confirm(id, lease.All, end)
			}
		}
		r.mu.Unlock()
	}
	return missing, err
}

// History returns what was recorded so far. Parts never confirmed gone
// are open: given back from their first retirement (or their grant, when
// none was sent) to some time after the end.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := History{Frees: slices.Clone(r.frees)}
	for _, w := range r.order {
		h.Waiters = append(h.Waiters, *w)
	}
	for id, l := range r.leases {
		for _, p := range []lease.Parts{lease.Request, lease.Body} {
			if l.parts&p == 0 {
				continue
			}
			from, ok := l.from[p]
			if !ok {
				from = l.w.GrantTo
			}
			h.Frees = append(h.Frees, Free{Lease: id, Parts: p, From: from, To: Open})
		}
	}
	return h
}
