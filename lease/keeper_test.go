package lease_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runbudget/runbudget/lease"
)

const ttl = 3 * time.Second // the keeper beats every second

// keeper starts a keeper over s, stopped at cleanup. Inside a synctest
// bubble, its ticks fall on whole seconds from the bubble's start.
func keeper(t *testing.T, s *fakeStore) *lease.Keeper {
	t.Helper()
	k, err := lease.NewKeeper(s, ttl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	return k
}

// track makes n leases holding every part and tracks them as sent now.
func track(k *lease.Keeper, s *fakeStore, prefix string, n int) []*lease.Lease {
	ls := make([]*lease.Lease, n)
	for i := range ls {
		ls[i] = lease.New(fmt.Sprintf("%s%03d", prefix, i), lease.All, s)
		k.Track(ls[i], time.Now())
	}
	return ls
}

// advance moves the bubble's clock by d and lets every goroutine settle.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

func ids(ls []*lease.Lease) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.ID()
	}
	slices.Sort(out)
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestNewKeeperValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    lease.Renewer
		ttl  time.Duration
	}{
		{"nil renewer", nil, time.Second},
		{"zero TTL", &fakeStore{}, 0},
		{"negative TTL", &fakeStore{}, -time.Second},
		{"TTL just under 3ms", &fakeStore{}, 3*time.Millisecond - 1},
	} {
		k, err := lease.NewKeeper(tc.r, tc.ttl)
		if err == nil || k != nil {
			t.Errorf("%s: NewKeeper = %v, %v; want an error", tc.name, k, err)
			if k != nil {
				k.Stop()
			}
		}
	}
	k, err := lease.NewKeeper(&fakeStore{}, 3*time.Millisecond)
	if err != nil {
		t.Fatalf("NewKeeper(3ms): %v", err)
	}
	defer k.Stop()
	if k.Interval() != time.Millisecond {
		t.Errorf("Interval() = %v, want TTL/3 = 1ms", k.Interval())
	}
}

// TestKeeperOneHeartbeatPerBeat: however many leases are live, each beat is
// one Heartbeat call naming all of them, and no call is made when none is.
func TestKeeperOneHeartbeatPerBeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{}
		k := keeper(t, s)
		advance(3 * time.Second)
		if n := len(s.heartbeats()); n != 0 {
			t.Fatalf("%d Heartbeat calls with no lease, want 0", n)
		}

		ls := track(k, s, "L", 100)
		advance(time.Second)
		beats := s.heartbeats()
		if len(beats) != 1 || !slices.Equal(sorted(beats[0]), ids(ls)) {
			t.Fatalf("after one interval: Heartbeat calls %d (first names %d leases), want 1 naming all 100", len(beats), len(beats[0]))
		}

		// Released leases leave the renewals; the rest are still one call.
		for _, l := range ls[:40] {
			l.Release()
		}
		if k.Len() != 60 {
			t.Errorf("Len() = %d after releasing 40 of 100, want 60", k.Len())
		}
		advance(time.Second)
		beats = s.heartbeats()
		if len(beats) != 2 || !slices.Equal(sorted(beats[1]), ids(ls[40:])) {
			t.Fatalf("second beat: %d calls, last naming %d leases; want 2 calls, the last naming the 60 held", len(beats), len(beats[len(beats)-1]))
		}

		// Beat runs a round on demand, also as one call.
		k.Beat(context.Background())
		if n := len(s.heartbeats()); n != 3 {
			t.Errorf("Beat made %d calls in all, want 3", n-2)
		}
		for _, l := range ls {
			if isClosed(l.Lost()) {
				t.Fatalf("lease %s lost while the store renews it", l.ID())
			}
		}
	})
}

// TestKeeperKeepsLeasesAlive: renewals that succeed keep a lease held for
// many TTLs.
func TestKeeperKeepsLeasesAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{}
		k := keeper(t, s)
		l := track(k, s, "L", 1)[0]
		advance(10 * ttl)
		if isClosed(l.Lost()) || k.Len() != 1 {
			t.Errorf("after 10 TTLs of renewals: lost %v, Len %d; want held and tracked", isClosed(l.Lost()), k.Len())
		}
		if n := len(s.heartbeats()); n != 30 {
			t.Errorf("%d Heartbeat calls in 10 TTLs, want 30", n)
		}
	})
}

// TestKeeperMissingIsLost: an ID the store reports missing closes that
// lease's Lost() and leaves the renewals; the others stay untouched.
func TestKeeperMissingIsLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{}
		k := keeper(t, s)
		ls := track(k, s, "L", 3)
		ls[1].CompleteRequest() // partly retired is still held
		gone := ls[1]
		s.set(func(s *fakeStore) { s.missing = map[string]bool{gone.ID(): true} })
		lost := gone.Lost() // asked before the loss
		advance(time.Second)
		if !isClosed(lost) {
			t.Errorf("lease reported missing is not lost")
		}
		if isClosed(ls[0].Lost()) || isClosed(ls[2].Lost()) {
			t.Errorf("leases the store still holds were marked lost")
		}
		if k.Len() != 2 {
			t.Errorf("Len() = %d, want 2: a lost lease is not renewed", k.Len())
		}
		advance(time.Second)
		beats := s.heartbeats()
		if last := beats[len(beats)-1]; slices.Contains(last, gone.ID()) {
			t.Errorf("lost lease %s still renewed: %v", gone.ID(), last)
		}
		// Retiring a lost lease is safe, and of its parts only memory, which
		// is the holder's own buffer, is still given back.
		before := len(s.retired())
		gone.Release()
		if got := s.retired()[before:]; len(got) != 1 || got[0].parts != lease.Memory {
			t.Errorf("Release of a lost lease called Retire %v, want the memory part alone", got)
		}
	})
}

// TestKeeperLostAskedAfterLoss: Lost() asked for only after the loss is
// already closed.
func TestKeeperLostAskedAfterLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{missing: map[string]bool{"L000": true}}
		k := keeper(t, s)
		l := track(k, s, "L", 1)[0]
		advance(time.Second)
		if !isClosed(l.Lost()) {
			t.Errorf("Lost() asked after the loss is not closed")
		}
	})
}

// TestKeeperReleasedDuringBeatIsNotLost: a lease released while a heartbeat
// is in flight comes back missing because it was released; that is not a
// loss. A lease still held and missing in the same reply is.
func TestKeeperReleasedDuringBeatIsNotLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{block: make(chan struct{}), entered: make(chan struct{})}
		k := keeper(t, s)
		ls := track(k, s, "L", 2)
		released, held := ls[0], ls[1]

		advance(time.Second - time.Millisecond)
		time.Sleep(time.Millisecond) // the tick: the keeper's Heartbeat starts
		<-s.entered
		released.Release()
		s.set(func(s *fakeStore) {
			s.missing = map[string]bool{released.ID(): true, held.ID(): true}
		})
		s.block <- struct{}{}
		synctest.Wait()

		if isClosed(released.Lost()) {
			t.Errorf("lease released during the beat was marked lost")
		}
		if !isClosed(held.Lost()) {
			t.Errorf("lease still held and missing was not marked lost")
		}
		if k.Len() != 0 {
			t.Errorf("Len() = %d, want 0", k.Len())
		}
		s.set(func(s *fakeStore) { s.block = nil })
	})
}

// TestKeeperLostAfterTTLWithoutRenewal: with every Heartbeat failing, a lease
// is declared lost once LostAfter has passed since the last renewal that was
// confirmed, counted from when it was sent, and not before.
func TestKeeperLostAfterTTLWithoutRenewal(t *testing.T) {
	t.Run("never renewed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := &fakeStore{failBeat: true}
			k := keeper(t, s)
			l := track(k, s, "L", 1)[0]
			advance(k.LostAfter() - time.Nanosecond)
			if isClosed(l.Lost()) {
				t.Fatalf("lost before LostAfter passed")
			}
			advance(time.Nanosecond)
			if !isClosed(l.Lost()) {
				t.Fatalf("not lost LostAfter after the grant with every renewal failing")
			}
			if k.Len() != 0 {
				t.Errorf("Len() = %d, want the lost lease untracked", k.Len())
			}
			if n := len(s.heartbeats()); n != 2 {
				t.Errorf("%d Heartbeat attempts, want 2 (at 1s and 2s)", n)
			}
		})
	})
	t.Run("renewed then failing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := &fakeStore{}
			k := keeper(t, s)
			l := track(k, s, "L", 1)[0]
			advance(2 * time.Second) // renewals sent at 1s and 2s are confirmed
			s.set(func(s *fakeStore) { s.failBeat = true })
			advance(k.LostAfter() - time.Nanosecond)
			if isClosed(l.Lost()) {
				t.Fatalf("lost before LostAfter passed since the last confirmed renewal")
			}
			advance(time.Nanosecond)
			if !isClosed(l.Lost()) {
				t.Fatalf("not lost LostAfter after the last confirmed renewal")
			}
		})
	})
}

// TestKeeperLostWhileABeatHangs: a lease's deadline that passes while a
// beat is out (Redis down, the client retrying until the beat's deadline)
// is acted on at once, not when the beat gives up: the keeper once served
// its deadlines and its beats from one loop, so Lost() came up to an
// interval late (scenario 7: 1.0s after the kill where 0.9s was due).
func TestKeeperLostWhileABeatHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{}
		k := keeper(t, s)
		l := track(k, s, "L", 1)[0]
		advance(time.Second) // the beat at 1s renews it
		s.set(func(s *fakeStore) {
			s.block = make(chan struct{}) // every beat from now on hangs to its deadline
			s.entered = make(chan struct{}, 16)
		})
		advance(k.LostAfter() - time.Nanosecond)
		if isClosed(l.Lost()) {
			t.Fatalf("lost before LostAfter passed since the renewal at 1s")
		}
		advance(time.Nanosecond)
		if !isClosed(l.Lost()) {
			t.Fatalf("not lost at its deadline while a beat hangs")
		}
	})
}

// TestKeeperEarlierDeadlineTrackedLater: Track wakes the watcher only for
// a deadline earlier than the one it waits for (a wake per lease scanned
// every lease held). A lease whose call was sent before the other's, and
// tracked after it, must still be given up at its own deadline, not at
// the later one the watcher was waiting for, nor at the next beat's
// rescan. (Its call was sent 2s before: its deadline, 0.75s on, comes
// before the first beat, at 1s.)
func TestKeeperEarlierDeadlineTrackedLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{failBeat: true}
		k := keeper(t, s)
		late := lease.New("late", lease.All, s)
		k.Track(late, time.Now())
		synctest.Wait() // the watcher waits for late's deadline
		early := lease.New("early", lease.All, s)
		k.Track(early, time.Now().Add(-2*time.Second))
		advance(k.LostAfter() - 2*time.Second - time.Nanosecond)
		if isClosed(early.Lost()) {
			t.Fatal("the lease sent 2s earlier is lost before its deadline")
		}
		advance(time.Nanosecond)
		if !isClosed(early.Lost()) {
			t.Fatal("the lease sent 2s earlier is not lost at its own deadline")
		}
		if isClosed(late.Lost()) {
			t.Fatal("the later lease is lost before its deadline")
		}
		advance(2 * time.Second)
		if !isClosed(late.Lost()) {
			t.Fatal("the later lease is not lost at its deadline")
		}
	})
}

// TestKeeperLostAfter: the keeper gives a lease up a tenth of the TTL
// before the store's expiry, at most 250ms before it.
func TestKeeperLostAfter(t *testing.T) {
	for _, tc := range []struct{ ttl, want time.Duration }{
		{30 * time.Millisecond, 27 * time.Millisecond},
		{500 * time.Millisecond, 450 * time.Millisecond},
		{time.Second, 900 * time.Millisecond},
		{3 * time.Second, 2750 * time.Millisecond},
		{15 * time.Second, 14750 * time.Millisecond},
	} {
		k, err := lease.NewKeeper(&fakeStore{}, tc.ttl)
		if err != nil {
			t.Fatal(err)
		}
		if got := k.LostAfter(); got != tc.want {
			t.Errorf("TTL %v: LostAfter() = %v, want %v", tc.ttl, got, tc.want)
		}
		k.Stop()
	}
}

// TestKeeperLostBeforeStoreExpiry guards the Keeper's documented promise
// that a holder hears of a loss before the store acts on it. A lease
// granted between two ticks expires in the store at grant + TTL; with every
// renewal failing, the keeper must have closed Lost() a margin before then,
// or a holder whose goroutine runs late works on while the store hands its
// slot to someone else. (Loss was once checked only on the tick grid, so it
// came up to an interval after the store's expiry.)
func TestKeeperLostBeforeStoreExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{failBeat: true}
		k := keeper(t, s)
		advance(k.Interval() / 2)
		l := track(k, s, "L", 1)[0]
		advance(ttl - 250*time.Millisecond)
		if !isClosed(l.Lost()) {
			t.Errorf("the store expires the lease at grant + TTL, but Lost() is still open 250ms before")
		}
	})
}

// TestKeeperRetriesPendingRetire: a retirement the store did not confirm
// stays pending; each beat sends it again until the store confirms, and a
// lease with nothing held is not renewed meanwhile.
func TestKeeperRetriesPendingRetire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{failRetire: true}
		k := keeper(t, s)
		l := track(k, s, "L", 1)[0]
		l.Release()
		if l.Held() != 0 || k.Len() != 1 {
			t.Fatalf("after a failed Release: Held %v, Len %d; want none held and still tracked", l.Held(), k.Len())
		}
		advance(time.Second) // the beat retries, and fails again
		s.set(func(s *fakeStore) { s.failRetire = false })
		advance(time.Second) // the beat retries, and succeeds
		want := []call{{"L000", lease.All}, {"L000", lease.All}, {"L000", lease.All}}
		if got := s.retired(); !slices.Equal(got, want) {
			t.Errorf("Retire calls %v, want %v", got, want)
		}
		if k.Len() != 0 {
			t.Errorf("Len() = %d once the store confirmed, want 0", k.Len())
		}
		if n := len(s.heartbeats()); n != 0 {
			t.Errorf("%d Heartbeat calls for a released lease, want 0", n)
		}
		advance(time.Second)
		if n := len(s.retired()); n != 3 {
			t.Errorf("Retire sent again after the store confirmed it: %v", s.retired())
		}
		if isClosed(l.Lost()) {
			t.Errorf("released lease marked lost")
		}
	})
}

// TestKeeperRetriesPartialRetire: a pending part of a lease still held is
// retried and the lease is renewed in the same beat.
func TestKeeperRetriesPartialRetire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{failRetire: true}
		k := keeper(t, s)
		l := track(k, s, "L", 1)[0]
		l.CompleteRequest()
		s.set(func(s *fakeStore) { s.failRetire = false })
		advance(time.Second)
		want := []call{{"L000", lease.Request}, {"L000", lease.Request}}
		if got := s.retired(); !slices.Equal(got, want) {
			t.Errorf("Retire calls %v, want %v", got, want)
		}
		if beats := s.heartbeats(); len(beats) != 1 || !slices.Equal(beats[0], []string{"L000"}) {
			t.Errorf("Heartbeat calls %v, want the held lease renewed once", beats)
		}
		l.Release()
		if got := s.retired()[2:]; !slices.Equal(got, []call{{"L000", lease.Body | lease.Memory}}) {
			t.Errorf("Release sent %v, want only body+memory", got)
		}
		if k.Len() != 0 {
			t.Errorf("Len() = %d after Release, want 0", k.Len())
		}
	})
}

// TestKeeperReleasedLeaseNotLost guards Lost()'s contract (closed only when
// the lease is gone while still held): a lease that was released, but whose
// retirement the store has not confirmed, must not be reported lost when a
// TTL passes or when the keeper stops. The store reclaims it either way.
//
// It fails today (bug: Beat's TTL check and Stop call markLost whatever the
// lease still holds; the missing-ID path checks Held() but these do not).
func TestKeeperReleasedLeaseNotLost(t *testing.T) {
	t.Run("TTL passes", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := &fakeStore{failRetire: true}
			k := keeper(t, s)
			l := track(k, s, "L", 1)[0]
			l.Release()
			advance(2 * ttl)
			if isClosed(l.Lost()) {
				t.Errorf("a released lease was reported lost")
			}
			if k.Len() != 0 {
				t.Errorf("Len() = %d after a TTL, want the keeper to give up on it", k.Len())
			}
		})
	})
	t.Run("Stop", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := &fakeStore{failRetire: true}
			k := keeper(t, s)
			l := track(k, s, "L", 1)[0]
			l.Release()
			k.Stop()
			if isClosed(l.Lost()) {
				t.Errorf("a released lease was reported lost by Stop")
			}
		})
	})
}

// TestKeeperStop: leases still tracked are lost once nothing renews them,
// released ones are not, renewals end, and Stop is idempotent and safe to
// call from several goroutines.
func TestKeeperStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{}
		k := keeper(t, s)
		ls := track(k, s, "L", 3)
		ls[0].Release()
		ls[1].CloseBody()
		advance(time.Second)
		beatsBefore := len(s.heartbeats())

		var wg sync.WaitGroup
		for range 4 {
			wg.Go(k.Stop)
		}
		wg.Wait()
		k.Stop()

		if isClosed(ls[0].Lost()) {
			t.Errorf("released lease marked lost by Stop")
		}
		if !isClosed(ls[1].Lost()) || !isClosed(ls[2].Lost()) {
			t.Errorf("leases still held are not lost after Stop")
		}
		if k.Len() != 0 {
			t.Errorf("Len() = %d after Stop, want 0", k.Len())
		}
		advance(5 * time.Second)
		if n := len(s.heartbeats()); n != beatsBefore {
			t.Errorf("%d Heartbeat calls after Stop", n-beatsBefore)
		}
	})
}

// TestKeeperTrackAfterStop: a lease tracked by a stopped keeper is lost at
// once, since nothing will renew it.
func TestKeeperTrackAfterStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{}
		k := keeper(t, s)
		k.Stop()
		l := track(k, s, "L", 1)[0]
		if !isClosed(l.Lost()) {
			t.Errorf("lease tracked after Stop is not lost")
		}
		if k.Len() != 0 {
			t.Errorf("Len() = %d, want 0", k.Len())
		}
		advance(5 * time.Second)
		if n := len(s.heartbeats()); n != 0 {
			t.Errorf("%d Heartbeat calls after Stop", n)
		}
	})
}

// TestKeeperTrackRacingStop hammers Track against Stop on real goroutines:
// once both have returned, the lease must be lost (nothing renews it) and
// the keeper must track nothing.
//
// It can fail today (bug: Track checks the stop channel, then adds the lease
// to the map under the lock in a separate step, so a Stop that runs entirely
// between the two leaves the lease tracked by a dead keeper, never renewed
// and never reported lost). The window is narrow, so it fails only on some
// runs.
func TestKeeperTrackRacingStop(t *testing.T) {
	for i := range 5000 {
		s := &fakeStore{}
		k, err := lease.NewKeeper(s, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		l := lease.New("L", lease.All, s)
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; k.Track(l, time.Now()) })
		wg.Go(func() { <-start; k.Stop() })
		close(start)
		wg.Wait()
		if !isClosed(l.Lost()) || k.Len() != 0 {
			t.Fatalf("round %d: after Track and Stop, lost %v and Len %d; want lost and 0", i, isClosed(l.Lost()), k.Len())
		}
	}
}

// TestLostHammer marks leases lost (through Stop) while other goroutines ask
// for Lost() and retire parts: the channel closes exactly once, for every
// caller.
func TestLostHammer(t *testing.T) {
	for round := range 100 {
		s := &fakeStore{}
		k, err := lease.NewKeeper(s, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		l := lease.New(fmt.Sprint("L", round), lease.All, s)
		k.Track(l, time.Now())
		var wg sync.WaitGroup
		chans := make([]<-chan struct{}, 8)
		for i := range chans {
			wg.Go(func() { chans[i] = l.Lost() })
		}
		wg.Go(k.Stop)
		wg.Go(l.CompleteRequest)
		wg.Wait()
		for i, ch := range chans {
			if ch != chans[0] {
				t.Fatalf("round %d: Lost() returned different channels", round)
			}
			if !isClosed(ch) {
				t.Fatalf("round %d: channel %d not closed after Stop", round, i)
			}
		}
	}
}

// TestKeeperPartialRenewal: a heartbeat that renewed some leases and not
// others (one of several servers down) keeps the renewed ones alive; only
// those it could not renew are lost once a TTL passes unconfirmed. The
// regression: fault scenario 20, where every lease of a host holding one
// on a dead master was declared lost, on healthy masters too.
func TestKeeperPartialRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{}
		k := keeper(t, s)
		ls := track(k, s, "P", 3)
		s.set(func(s *fakeStore) { s.unrenewed = map[string]bool{ls[1].ID(): true} })
		for range 6 { // two TTLs of beats
			advance(ttl / 3)
		}
		if !isClosed(ls[1].Lost()) {
			t.Errorf("lease whose renewal never succeeded is not lost after two TTLs")
		}
		if isClosed(ls[0].Lost()) || isClosed(ls[2].Lost()) {
			t.Errorf("leases renewed by a partial heartbeat were marked lost")
		}
		if k.Len() != 2 {
			t.Errorf("Len() = %d, want the two renewed leases", k.Len())
		}
	})
}
