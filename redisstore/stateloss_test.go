package redisstore_test

import (
	"context"
	"encoding/hex"
	"testing"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/recpack"
	"github.com/runbudget/runbudget/internal/redistest"
)

// TestStateLoss: Redis restarts empty, or from its AOF after kill -9, while
// one host holds the only slot and another waits for it. The holder puts
// its lease back (it is not lost), the quarantine keeps the waiter from
// being admitted on the forgotten counts, and the slot still passes to the
// waiter once the holder releases it.
func TestStateLoss(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []redistest.Option
	}{
		{"restart empty", nil},
		{"restart from AOF after kill -9", []redistest.Option{redistest.WithConfig("appendonly yes", "appendfsync everysec")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, tc.opts...)
			const ttl = 900 * time.Millisecond
			lim := slots(1)
			holder := open(t, srv.Client(t), "loss", lim, ttl)
			waiterHost := open(t, srv.Client(t), "loss", lim, ttl)
			a := dom("a")
			held := mustAcquire(t, holder, get(a))

			got := make(chan time.Time, 1)
			go func() {
				l, err := waiterHost.Acquire(context.Background(), get(a))
				if err != nil {
					t.Error(err)
					got <- time.Time{}
					return
				}
				at := time.Now()
				l.Release()
				got <- at
			}()
			for usage(t, waiterHost).Waiters != 1 {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(1100 * time.Millisecond) // let the AOF fsync the state
			srv.Kill()
			srv.Restart(t)
			// The waiter's host asks again at once, before the holder's next
			// heartbeat could re-assert: only the quarantine keeps it out.
			ctx, cancel := context.WithTimeout(context.Background(), 2*ttl)
			defer cancel()
			if l, err := waiterHost.Acquire(ctx, get(a)); err == nil {
				l.Release()
				t.Fatal("a host was admitted on the counts Redis forgot, while the holder still holds the only slot")
			}

			// Past the quarantine and several heartbeats: the waiter must
			// still be waiting, because the holder re-asserted.
			select {
			case at := <-got:
				t.Fatalf("waiter admitted at %v while the holder still holds the only slot", at)
			case <-held.Lost():
				t.Fatal("holder's lease declared lost instead of re-asserted")
			case <-time.After(3 * ttl):
			}
			if du := domainOf(usage(t, holder), a); du.InFlight[budget.OpGet] != 1 {
				t.Errorf("after the loss: %+v, want the held lease counted", du)
			}
			// Back under its session, which is alive and renewed.
			c, ctx := srv.Client(t), context.Background()
			p := "rb:{" + hex.EncodeToString([]byte("loss")) + "}:"
			v, _ := redistest.Lease(ctx, c, p, held.ID())
			rec, err := recpack.DecodeLease(v)
			if err != nil {
				t.Fatalf("lease record after the loss: %v", err)
			}
			sid := rec.Session
			deadline, err := c.ZScore(ctx, p+"sexp", sid).Result()
			in := c.HExists(ctx, redistest.LeaseKey(ctx, c, p, sid), held.ID()).Val()
			if !in || err != nil || time.UnixMicro(int64(deadline)).Before(time.Now()) {
				t.Errorf("lease not back in a live session: record %+v, in its hash %v, deadline %v (%v)",
					rec, in, deadline, err)
			}
			released := time.Now()
			held.Release()
			select {
			case at := <-got:
				if at.IsZero() {
					t.Fatal("waiter failed")
				}
				t.Logf("waiter admitted %v after the release", at.Sub(released))
			case <-time.After(10 * time.Second):
				t.Fatal("waiter not admitted after the release")
			}
			expectIdle(t, holder)
		})
	}
}

// TestNoHandoffDuringQuarantine: waiters survive a restart from AOF, and a
// release during the quarantine that follows must not hand them the slot.
func TestNoHandoffDuringQuarantine(t *testing.T) {
	srv := redistest.Start(t, redistest.WithConfig("appendonly yes", "appendfsync always"))
	const ttl = 2 * time.Second
	c := srv.Client(t)
	holder := open(t, c, "quarantine", slots(1), ttl)
	waiterHost := open(t, srv.Client(t), "quarantine", slots(1), ttl)
	a := dom("a")
	held := mustAcquire(t, holder, get(a))
	got := make(chan time.Time, 1)
	go func() {
		l, err := waiterHost.Acquire(context.Background(), get(a))
		if err != nil {
			t.Error(err)
			got <- time.Time{}
			return
		}
		got <- time.Now()
		l.Release()
	}()
	for usage(t, waiterHost).Waiters != 1 {
		time.Sleep(time.Millisecond)
	}
	srv.Kill()
	srv.Restart(t) // same data, new run_id
	// The holder's next heartbeat notices the restart and quarantines the
	// budget for one TTL; wait until it has.
	cfg := "rb:{" + hex.EncodeToString([]byte("quarantine")) + "}:cfg"
	deadline := time.Now().Add(5 * time.Second)
	var qu int64
	for qu == 0 && time.Now().Before(deadline) {
		qu, _ = srv.Client(t).HGet(context.Background(), cfg, "qu").Int64()
		time.Sleep(10 * time.Millisecond)
	}
	if qu == 0 {
		t.Fatal("no quarantine after the restart")
	}
	released := time.Now()
	held.Release() // during the quarantine: the waiter must not get the slot yet
	at := <-got
	if at.IsZero() {
		t.FailNow()
	}
	end := time.UnixMicro(qu)
	if at.Before(end.Add(-50 * time.Millisecond)) {
		t.Errorf("waiter granted %v after the release, %v before the quarantine ended", at.Sub(released), end.Sub(at))
	}
}

// TestStaleCopyQuarantinesFirstGrant: Redis comes back from a snapshot
// taken before a grant (as a replica promoted before it received the
// grant would), so its counts miss a lease its holder still holds. The
// first call that would grant on those counts, here another host's
// acquire sent before the holder's next heartbeat, must notice that
// another server wrote them and quarantine the budget, not admit above
// the ceiling. Function library only: through EVALSHA the check is left to
// the heartbeat (see vouch in lib.lua).
func TestStaleCopyQuarantinesFirstGrant(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const ttl = 3 * time.Second // the holder's heartbeats come a second apart
	holder := open(t, c, "stale", slots(1), ttl)
	other := open(t, srv.Client(t), "stale", slots(1), ttl)
	a := dom("a")
	if err := c.Save(ctx).Err(); err != nil { // registered, nothing held
		t.Fatal(err)
	}
	held := mustAcquire(t, holder, get(a))
	srv.Kill()
	srv.Restart(t) // from the snapshot: the lease is gone from Redis
	cfg := "rb:{" + hex.EncodeToString([]byte("stale")) + "}:cfg"
	got := make(chan time.Time, 1)
	go func() {
		l, err := other.Acquire(ctx, get(a))
		if err != nil {
			t.Error(err)
			got <- time.Time{}
			return
		}
		at := time.Now()
		l.Release() // before the send: the test checks usage after it
		got <- at
	}()
	// Within the quarantine (one TTL) the holder re-asserts its lease, so
	// the other host must wait for the release, however long that is.
	select {
	case at := <-got:
		qu, _ := srv.Client(t).HGet(ctx, cfg, "qu").Int64()
		t.Fatalf("admitted at %v on counts that miss the held lease (quarantine until %v)", at, time.UnixMicro(qu))
	case <-held.Lost():
		t.Fatal("the holder's lease was declared lost instead of re-asserted")
	case <-time.After(ttl + ttl/2):
	}
	if du := domainOf(usage(t, holder), a); du.InFlight[budget.OpGet] != 1 {
		t.Errorf("after the loss: %+v, want the held lease counted", du)
	}
	released := time.Now()
	held.Release()
	select {
	case at := <-got:
		if at.IsZero() {
			t.FailNow()
		}
		t.Logf("admitted %v after the release", at.Sub(released))
	case <-time.After(10 * time.Second):
		t.Fatal("not admitted after the release")
	}
	expectIdle(t, holder)
}

// TestReassertRetiresWhatTheHostReleased: Redis comes back from a snapshot
// taken before a host released one lease and finished another's request
// (as a replica promoted before it got those retires would). The host still
// holds the other lease's body and keeps its session alive, so nothing
// would expire the stale counts: its re-assertion states what it holds,
// and what Redis counts beyond that is retired.
func TestReassertRetiresWhatTheHostReleased(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const ttl = 900 * time.Millisecond
	holder := open(t, c, "released", slots(2), ttl)
	other := open(t, srv.Client(t), "released", slots(2), ttl)
	a := dom("a")
	withBody := get(a)
	withBody.OpensBody = true
	kept := mustAcquire(t, holder, withBody)
	gone := mustAcquire(t, holder, get(a))
	if err := c.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	gone.Release()
	kept.CompleteRequest() // the body stays open
	srv.Kill()
	srv.Restart(t) // counts 2 in flight again, both the holder's
	l, err := other.Acquire(within(t, 10*ttl), get(a))
	if err != nil {
		t.Fatalf("the slots the holder gave back never came back: %v", err)
	}
	du := domainOf(usage(t, holder), a)
	if du.InFlight[budget.OpGet] != 1 || du.OpenBodies != 1 {
		t.Errorf("after the re-assertion: %+v, want 1 in flight (the other host's) and the holder's body", du)
	}
	select {
	case <-kept.Lost():
		t.Error("the kept lease was declared lost")
	default:
	}
	l.Release()
	kept.Release()
	expectIdle(t, holder)
}
