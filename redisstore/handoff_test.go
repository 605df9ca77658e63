package redisstore_test

import (
	"context"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/lease"
)

// TestHandoffJudgesEachHeadByItsOwnRequest: a release grants the head of
// the queue, then tries the waiter behind it on that waiter's own request:
// one of the class the grant filled waits, and is granted by the next
// release, and a waiter of a class without a ceiling behind it is granted
// by that same release, which takes the head out of the queue with the
// waiter it read after it (lib.lua, NEXT).
func TestHandoffJudgesEachHeadByItsOwnRequest(t *testing.T) {
	for _, tc := range bothServers() {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := sessionStore(t, tc.client(t), "heads", 30*time.Second, nil, 1)
			put := budget.Request{Domains: []budget.Domain{dom("a")}, Class: budget.OpPut, Consumer: "test"}
			inFlight := func() (gets, puts int) {
				t.Helper()
				u, err := s.Usage(ctx)
				if err != nil {
					t.Fatal(err)
				}
				du := domainOf(u, dom("a"))
				return du.InFlight[budget.OpGet], du.InFlight[budget.OpPut]
			}
			grantNow(t, s, "held")
			a1 := queueNow(t, s, "a1", get(dom("a")))
			a2 := queueNow(t, s, "a2", get(dom("a")))
			p1 := queueNow(t, s, "p1", put) // behind a2 in arrival order: FIFO holds it there
			handOff(t, s, "held", a1)
			if g, p := inFlight(); g != 1 || p != 0 {
				t.Fatalf("after the first release: %d gets and %d puts in flight, want 1 and 0 (a2 blocked, p1 behind it)", g, p)
			}
			select {
			case <-a2.Wake:
				t.Error("a2, blocked by the grant before it, was woken")
			default:
			}
			// The grants are the release's own: counted when it returns
			// (a renewal, a TTL/3 later, would grant p1 too).
			if err := s.Retire(ctx, "a1", lease.All); err != nil {
				t.Fatal(err)
			}
			if g, p := inFlight(); g != 1 || p != 1 {
				t.Fatalf("after the second release: %d gets and %d puts in flight, want 1 and 1 (a2, then p1, whose class has no ceiling)", g, p)
			}
			for _, w := range []budget.Attempt{a2, p1} {
				select {
				case <-w.Wake:
				case <-time.After(10 * time.Second):
					t.Fatal("no wake event for the second release's grants")
				}
			}
		})
	}
}

// TestReleaseSavesItsDomainWhenNoHandoffFollows: a release leaves the
// save of a domain with waiters to the end of its call, where the grant
// it hands the slot to usually saves it (lib.lua, dreturn). When the head
// cannot be granted (here it also waits on a second, full domain) the
// release must still save the slot it returned.
func TestReleaseSavesItsDomainWhenNoHandoffFollows(t *testing.T) {
	for _, tc := range bothServers() {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := sessionStore(t, tc.client(t), "late", 30*time.Second, nil, 1)
			grantNow(t, s, "on-a")
			req, _ := get(dom("b")).Normalize()
			if att, err := s.TryAcquire(ctx, "on-b", req); err != nil || att.Outcome != budget.Granted {
				t.Fatalf("TryAcquire(on-b) = %+v, %v", att, err)
			}
			queueNow(t, s, "both", get(dom("a"), dom("b")))
			if err := s.Retire(ctx, "on-a", lease.All); err != nil {
				t.Fatal(err)
			}
			if n := inFlightOf(t, s); n != 0 {
				t.Fatalf("domain a after its lease's release: %d in flight, want 0 (the head waits on b)", n)
			}
			u, err := s.Usage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n := domainOf(u, dom("b")).InFlight[budget.OpGet]; n != 1 {
				t.Errorf("domain b: %d in flight, want 1", n)
			}
		})
	}
}

// TestReleaseSavesItsDomainWhenTheHandoffFails: the end-of-call save of a
// release's domain happens even when the handoff after it fails, here on
// a queue's key an operator replaced with a list: the script's other
// writes stay, and the returned slot must be among them.
func TestReleaseSavesItsDomainWhenTheHandoffFails(t *testing.T) {
	for _, tc := range bothServers() {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := tc.client(t)
			s := sessionStore(t, c, "broken", 30*time.Second, nil, 1)
			grantNow(t, s, "held")
			queueNow(t, s, "w1", get(dom("a")))
			key := "rb:{" + hex.EncodeToString([]byte("broken")) + "}:q:1." + hex.EncodeToString([]byte("a"))
			if err := c.Del(ctx, key).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.RPush(ctx, key, "not a waiter").Err(); err != nil {
				t.Fatal(err)
			}
			err := s.Retire(ctx, "held", lease.All)
			if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Fatalf("Retire over a broken queue key = %v, want its WRONGTYPE", err)
			}
			if n := inFlightOf(t, s); n != 0 {
				t.Fatalf("domain a after the failed handoff: %d in flight, want 0 (the release's own write)", n)
			}
		})
	}
}
