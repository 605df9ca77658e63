package budget

import (
	"context"
	"sync/atomic"

	"github.com/runbudget/runbudget/lease"
	"golang.org/x/sync/semaphore"
)

// Memory is the host's. Provider-scoped ceilings are shared by every host
// of a run through the store, but a buffer lives in one process's heap, and
// a ceiling summed over hosts would protect none of them. So each Budget
// keeps its own memory line, before the store is asked; stores never see
// memory.
//
// The line is x/sync's weighted semaphore: waiters are served in arrival
// order and the line stops at the first that does not fit, so a large
// reservation is not starved by a stream of small ones; a request without
// memory never joins it.
type memLine struct {
	sem     *semaphore.Weighted // nil: memory unbounded, only counted
	held    atomic.Int64        // bytes reserved by leases and waiters of this Budget
	waiting atomic.Int64        // Acquire calls waiting in the line
}

func newMemLine(ceiling int64) *memLine {
	m := &memLine{}
	if ceiling > 0 {
		m.sem = semaphore.NewWeighted(ceiling)
	}
	return m
}

// tryReserve takes n bytes if they are free and nobody waits ahead.
func (m *memLine) tryReserve(n int64) bool {
	if m.sem != nil && !m.sem.TryAcquire(n) {
		return false
	}
	m.held.Add(n)
	return true
}

// reserve waits in line for n bytes. It returns ctx's error, or ErrClosed
// when closed is done first; either way it has taken nothing (the
// semaphore gives back a grant that races the cancellation).
func (m *memLine) reserve(ctx context.Context, closed context.Context, n int64) error {
	if m.tryReserve(n) {
		return nil
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(closed, cancel)
	defer stop()
	m.waiting.Add(1)
	err := m.sem.Acquire(wctx, n)
	m.waiting.Add(-1)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return ErrClosed
	}
	m.held.Add(n)
	return nil
}

// release gives n bytes back; the first waiter that now fits is admitted.
func (m *memLine) release(n int64) {
	m.held.Add(-n)
	if m.sem != nil {
		m.sem.Release(n)
	}
}

// memRetirer is the Retirer of a lease that holds memory: the Memory part
// goes back to this Budget's line (once, however often it is retired), the
// rest to the store.
type memRetirer struct {
	store Store
	line  *memLine
	n     int64
	done  atomic.Bool
}

func (r *memRetirer) Retire(ctx context.Context, id string, parts lease.Parts) error {
	if parts&lease.Memory != 0 && r.done.CompareAndSwap(false, true) {
		r.line.release(r.n)
	}
	if rest := parts &^ lease.Memory; rest != 0 {
		return r.store.Retire(ctx, id, rest)
	}
	return nil
}
