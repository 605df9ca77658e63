package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Renewer is what a Keeper needs from a store that expires leases.
type Renewer interface {
	Retirer
	// Heartbeat extends the expiry of every listed lease that the store still
	// holds, in one call however many there are, and returns the IDs it no
	// longer holds. It never brings back a lease that was released or
	// reclaimed. A store whose leases live on several servers may renew
	// some and fail for others: it then returns a *PartialError naming the
	// IDs it could not renew, and missing for the others.
	Heartbeat(ctx context.Context, ids []string) (missing []string, err error)
}

// PartialError is a heartbeat that renewed some leases and not others
// (one of several servers was unreachable): every listed ID not in Failed
// was renewed, or is reported missing. Without it one dead server would
// cost a process every lease it holds anywhere.
type PartialError struct {
	Failed []string // IDs whose renewal is unconfirmed
	Err    error    // why
}

func (e *PartialError) Error() string {
	return fmt.Sprintf("lease: %d leases not renewed: %v", len(e.Failed), e.Err)
}

func (e *PartialError) Unwrap() error { return e.Err }

// Keeper renews every live lease of one process with one store call per
// interval, and tells a holder through Lost() when its lease is gone.
//
// A lease is declared lost when the store reports it missing, or when no
// renewal has been confirmed for LostAfter (the TTL less a margin) counted
// from the moment the last confirmed renewal was sent. The store's expiry is
// never earlier than that moment plus the TTL, so the holder hears of the
// loss before the store can act on it, by the margin: on a loaded host the
// keeper's timer and the holder's goroutine run late, and without it the
// store could give the slot away a few microseconds before the holder
// stops (seen in the fault suite under load).
type Keeper struct {
	r         Renewer
	lostAfter time.Duration
	interval  time.Duration
	now       func() time.Time
	onLost    func(id string)

	mu      sync.Mutex
	leases  map[string]*Lease
	stopped bool      // set by Stop under mu: Track after it marks the lease lost
	armed   time.Time // the deadline watch's timer is set for, zero for none

	track    chan struct{} // a deadline earlier than armed, or renewals ran: arm the expiry timer again
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// KeeperOption configures NewKeeper.
type KeeperOption func(*Keeper)

// WithClock makes the keeper read time from now instead of time.Now. Only
// differences between its readings matter, so a skewed clock is harmless.
func WithClock(now func() time.Time) KeeperOption {
	return func(k *Keeper) {
		if now != nil {
			k.now = now
		}
	}
}

// WithLostHook makes the keeper call f with a lease's ID each time it marks
// one of its leases lost (the store no longer has it, it went LostAfter
// unrenewed, or Stop found it still held). f runs on one of the keeper's
// goroutines (or Stop's) and must not block.
func WithLostHook(f func(id string)) KeeperOption {
	return func(k *Keeper) { k.onLost = f }
}

// NewKeeper starts a keeper that renews leases of r every ttl/3. Stop ends it.
func NewKeeper(r Renewer, ttl time.Duration, opts ...KeeperOption) (*Keeper, error) {
	if r == nil {
		return nil, errors.New("lease: NewKeeper needs a Renewer")
	}
	if ttl < 3*time.Millisecond {
		return nil, errors.New("lease: keeper TTL must be at least 3ms")
	}
	k := &Keeper{
		r:         r,
		lostAfter: ttl - lossMargin(ttl),
		interval:  ttl / 3,
		now:       time.Now,
		leases:    make(map[string]*Lease),
		track:     make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	for _, o := range opts {
		o(k)
	}
	go k.run()
	return k, nil
}

// Interval is the time between two renewals.
func (k *Keeper) Interval() time.Duration { return k.interval }

// LostAfter is how long a lease may go without a confirmed renewal before
// the keeper declares it lost: the TTL less a tenth of it, at most 250ms.
// The two renewals after a confirmed one may both fail; the lease is lost
// before a third is sent, or when the second is still out by then.
func (k *Keeper) LostAfter() time.Duration { return k.lostAfter }

// lossMargin is how much earlier than the store the keeper gives a lease
// up: enough for a timer and a goroutine that run late on a busy host, and
// a garbage collection, while short next to the TTL.
func lossMargin(ttl time.Duration) time.Duration {
	return min(ttl/10, 250*time.Millisecond)
}

// Track adds l to the renewals. sentAt is when the call that created the
// lease in the store was sent: the store's expiry counts from after it.
func (k *Keeper) Track(l *Lease, sentAt time.Time) {
	l.mu.Lock()
	l.keeper = k
	l.renewed = sentAt
	l.mu.Unlock()
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		l.markLost() // the keeper is gone: nobody will renew this lease
		return
	}
	k.leases[l.id] = l
	// Wake watch only for a deadline earlier than the one its timer is set
	// for: a lease granted now almost always expires after every other,
	// and each wake scans all leases, which made tracking cost in the
	// number held (20 us a lease with 10,000 held). A later deadline is
	// found when the timer fires, which scans anyway.
	early := k.armed.IsZero() || sentAt.Add(k.lostAfter).Before(k.armed)
	k.mu.Unlock()
	if early {
		k.rearm()
	}
}

// Len reports how many leases the keeper renews.
func (k *Keeper) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.leases)
}

func (k *Keeper) untrack(l *Lease) {
	k.mu.Lock()
	if k.leases[l.id] == l {
		delete(k.leases, l.id)
	}
	k.mu.Unlock()
}

// Stop ends renewals and waits for the keeper's goroutine to exit. Leases
// still tracked are marked lost, because nothing renews them any more. Later
// calls do nothing.
func (k *Keeper) Stop() {
	k.stopOnce.Do(func() {
		close(k.stop)
		<-k.done
		k.mu.Lock()
		k.stopped = true
		left := k.leases
		k.leases = make(map[string]*Lease)
		k.mu.Unlock()
		for _, l := range left {
			l.markLostIfHeld()
		}
	})
}

// run beats every interval, and watches, beside the beats, for the
// earliest moment a lease would go LostAfter unrenewed: a lease granted
// between two beats must not be declared lost up to an interval after the
// store already expired it, nor one whose deadline passes while a beat is
// out (Redis down, go-redis retrying) wait for that beat to give up. Such a
// beat may still renew it, but not in time to be sure of: the lease is
// declared lost at its deadline.
func (k *Keeper) run() {
	defer close(k.done)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		k.watch()
	}()
	defer func() { <-watched }()
	t := time.NewTicker(k.interval)
	defer t.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), k.interval)
			k.Beat(ctx)
			cancel()
			k.rearm() // renewals moved the deadlines
		}
	}
}

// rearm tells watch that deadlines changed.
func (k *Keeper) rearm() {
	select {
	case k.track <- struct{}{}:
	default:
	}
}

// watch declares leases lost at their deadlines until the keeper stops.
func (k *Keeper) watch() {
	expiry := time.NewTimer(time.Hour)
	expiry.Stop()
	defer expiry.Stop()
	arm := func() {
		if next, ok := k.nextExpiry(); ok {
			expiry.Reset(max(next.Sub(k.now()), 0))
		}
	}
	for {
		select {
		case <-k.stop:
			return
		case <-k.track:
			arm()
		case <-expiry.C:
			k.expire(k.now())
			arm()
		}
	}
}

// nextExpiry is the earliest renewed+TTL among tracked leases still held;
// watch sets its timer for it, and Track compares with it (armed), in the
// same critical section as the scan, so a lease tracked during a scan is
// either in it or compared with its result.
func (k *Keeper) nextExpiry() (time.Time, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var next time.Time
	for _, l := range k.leases {
		l.mu.Lock()
		d, held := l.renewed.Add(k.lostAfter), l.held != 0 && !l.isLost
		l.mu.Unlock()
		if held && (next.IsZero() || d.Before(next)) {
			next = d
		}
	}
	k.armed = next
	return next, !next.IsZero()
}

// expire marks lost every held lease whose last confirmed renewal was sent
// LostAfter ago: the store is about to expire it.
func (k *Keeper) expire(now time.Time) {
	k.mu.Lock()
	var gone []*Lease
	for _, l := range k.leases {
		l.mu.Lock()
		if now.Sub(l.renewed) >= k.lostAfter {
			gone = append(gone, l)
		}
		l.mu.Unlock()
	}
	k.mu.Unlock()
	for _, l := range gone {
		l.markLostIfHeld()
		k.untrack(l)
	}
}

// Beat runs one renewal round now: it retries retirements the store did not
// confirm, renews every lease still held in one Heartbeat call, and marks lost
// the leases the store no longer has or that went LostAfter unrenewed. It is
// exported so tests and tools can drive renewals without waiting.
func (k *Keeper) Beat(ctx context.Context) {
	now := k.now()
	k.mu.Lock()
	all := make([]*Lease, 0, len(k.leases))
	for _, l := range k.leases {
		all = append(all, l)
	}
	k.mu.Unlock()

	renew := make([]*Lease, 0, len(all))
	for _, l := range all {
		l.mu.Lock()
		expired := now.Sub(l.renewed) >= k.lostAfter
		lost := l.isLost
		pending := l.pending
		l.pending = 0
		held := l.held
		l.mu.Unlock()

		switch {
		case lost:
			k.untrack(l)
			continue
		case expired:
			l.markLostIfHeld()
			k.untrack(l)
			continue
		}
		if pending != 0 {
			if err := k.r.Retire(ctx, l.id, pending); err != nil {
				l.mu.Lock()
				l.pending |= pending
				l.mu.Unlock()
			} else if held == 0 {
				k.untrack(l)
				continue
			}
		}
		if held != 0 {
			renew = append(renew, l)
		}
	}
	if len(renew) == 0 {
		return
	}
	ids := make([]string, len(renew))
	for i, l := range renew {
		ids[i] = l.id
	}
	missing, err := k.r.Heartbeat(ctx, ids)
	var failed map[string]bool
	if err != nil {
		var pe *PartialError
		if !errors.As(err, &pe) {
			return // the TTL check above declares the loss if this persists
		}
		failed = make(map[string]bool, len(pe.Failed))
		for _, id := range pe.Failed {
			failed[id] = true
		}
	}
	gone := make(map[string]struct{}, len(missing))
	for _, id := range missing {
		gone[id] = struct{}{}
	}
	for _, l := range renew {
		if _, ok := gone[l.id]; ok {
			// A lease released while this beat was in flight is missing
			// because it was released, not lost.
			l.markLostIfHeld()
			k.untrack(l)
			continue
		}
		if failed[l.id] {
			continue // unconfirmed: the TTL check declares the loss if this persists
		}
		l.mu.Lock()
		if now.After(l.renewed) {
			l.renewed = now
		}
		l.mu.Unlock()
	}
}
