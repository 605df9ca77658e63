// Package lease holds an admitted request's share of a run budget, and keeps
// the shares of one process alive in a store that expires them otherwise.
//
// A lease has three parts that end at different moments: the request slot
// (the provider call), the open body (the connection still streaming), and the
// memory reservation (a buffer decoded from the body). Each is retired on its
// own, so a consumer never has to choose between holding a ceiling it no
// longer needs and releasing one it still does.
package lease

import (
	"context"
	"strconv"
	"sync"
	"time"
)

// Parts is a set of a lease's reservations.
type Parts uint8

// The reservations a lease can hold.
const (
	Request Parts = 1 << iota // the in-flight request slot of its class
	Body                      // the open-body slot
	Memory                    // the memory reservation, held in this process

	All = Request | Body | Memory
)

// String names the parts, for logs and errors.
func (p Parts) String() string {
	if p == 0 {
		return "none"
	}
	if p&^All != 0 {
		return "parts(" + strconv.Itoa(int(p)) + ")"
	}
	s := ""
	for _, x := range []struct {
		p    Parts
		name string
	}{{Request, "request"}, {Body, "body"}, {Memory, "memory"}} {
		if p&x.p != 0 {
			if s != "" {
				s += "+"
			}
			s += x.name
		}
	}
	return s
}

// Retirer gives parts of a lease back to the store that granted it. Retire
// must be idempotent: retiring a part twice, or a lease the store no longer
// knows, changes nothing and is not an error.
type Retirer interface {
	Retire(ctx context.Context, id string, parts Parts) error
}

// RetireTimeout is how long a remote store should allow one retirement
// call. Retirement has no context of its own (it is usually deferred), so
// the lease passes context.Background() and a store that talks to a server
// bounds the call itself; a call that fails is retried by the Keeper, and a
// lease that is never renewed again is reclaimed within one TTL anyway.
const RetireTimeout = 5 * time.Second

// Lease is one admitted request's hold on a budget. Its methods are safe to
// call from any goroutine, any number of times.
type Lease struct {
	id string
	r  Retirer

	mu      sync.Mutex
	held    Parts // parts the holder has not retired
	pending Parts // retired by the holder, not yet confirmed by the store
	isLost  bool  // beside the two above: a lease is allocated on every Acquire, and this order keeps it in the 96-byte size class
	lost    chan struct{}
	keeper  *Keeper
	renewed time.Time // when the last renewal that covered this lease was sent
	// released, when set, is called once, when the holder has retired
	// every part.
	released func()
}

// New returns a lease holding parts under id, retired through r. It is for
// the budget package (and a Budget-like wrapper of a Store): consumers get
// leases from Budget.Acquire, never from New.
func New(id string, held Parts, r Retirer) *Lease {
	return &Lease{id: id, r: r, held: held & All}
}

// NewReleased is New for a lease that calls released once, when its
// holder has retired every part (whether or not the store confirmed it):
// a Budget counts the leases its holders still hold this way. Pass the
// same func to every lease: it then costs none an allocation.
func NewReleased(id string, held Parts, r Retirer, released func()) *Lease {
	return &Lease{id: id, r: r, held: held & All, released: released}
}

// ID returns the lease's identifier, as the store knows it.
func (l *Lease) ID() string { return l.id }

// Held reports the parts the holder has not yet retired.
func (l *Lease) Held() Parts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

// CompleteRequest retires the request slot once the provider call has
// returned. Any open body and the memory reservation stay held.
func (l *Lease) CompleteRequest() { l.retire(Request) }

// CloseBody retires the open-body slot once the response body is closed. The
// body slot stands for the provider connection, so close it as soon as the
// body is drained rather than at Release.
func (l *Lease) CloseBody() { l.retire(Body) }

// ReleaseMemory retires the memory reservation once the buffer is gone.
func (l *Lease) ReleaseMemory() { l.retire(Memory) }

// Release retires whatever the lease still holds. It is the safety net for
// paths that did not retire each part as it ended; deferring it right after
// Acquire is always correct, whatever was retired before.
func (l *Lease) Release() { l.retire(All) }

// Lost returns a channel that is closed when the lease stopped being held
// before it was released: the store expired it (a long pause, a partition, a
// Redis restart) or the budget was closed under it. A holder that sees it
// closed should stop the work the lease covered; retiring afterwards is still
// safe and does nothing harmful.
func (l *Lease) Lost() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost == nil {
		// Allocated on first use: most leases are released without anyone
		// ever asking, and the hot path should not pay for a channel.
		l.lost = make(chan struct{})
		if l.isLost {
			close(l.lost)
		}
	}
	return l.lost
}

// retire takes parts out of held and asks the store to return them. A part
// the store could not confirm stays pending for the keeper to retry.
func (l *Lease) retire(parts Parts) {
	l.mu.Lock()
	parts &= l.held
	if parts == 0 {
		l.mu.Unlock()
		return
	}
	l.held &^= parts
	parts |= l.pending
	l.pending = 0
	lost := l.isLost
	k := l.keeper
	done := l.held == 0
	l.mu.Unlock()
	if done && l.released != nil {
		l.released() // once: held reaches zero only once
	}

	if lost {
		// The store already dropped this lease; nothing of it is left
		// there. Memory is the holder's own (its process's buffers), so it
		// still goes back.
		if parts&Memory != 0 {
			l.r.Retire(context.Background(), l.id, Memory)
		}
		return
	}
	if err := l.r.Retire(context.Background(), l.id, parts); err != nil {
		l.mu.Lock()
		l.pending |= parts
		l.mu.Unlock()
		return // the keeper (if any) retries; without one the store never fails
	}
	if done && k != nil {
		k.untrack(l)
	}
}

// markLostIfHeld closes Lost() unless the holder already released
// everything: a lease given back (even if the store has not confirmed it
// yet) is finished, not lost.
func (l *Lease) markLostIfHeld() {
	l.mu.Lock()
	held := l.held != 0
	l.mu.Unlock()
	if held {
		l.markLost()
	}
}

// markLost closes Lost() once, and tells the keeper's lost hook. It reports
// whether this call made the change.
func (l *Lease) markLost() bool {
	l.mu.Lock()
	if l.isLost {
		l.mu.Unlock()
		return false
	}
	l.isLost = true
	if l.lost != nil {
		close(l.lost)
	}
	k := l.keeper
	l.mu.Unlock()
	if k != nil && k.onLost != nil {
		k.onLost(l.id)
	}
	return true
}
