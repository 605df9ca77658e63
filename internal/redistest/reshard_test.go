package redistest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestMoveSlot: a slot moves, keys and all, step by step and in one call,
// and while it is open the source answers as the cluster spec says (served
// while its keys are there, ASK once they are gone, TRYAGAIN when split).
func TestMoveSlot(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3, 0)
	cc := c.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	keys := []string{"{mv}a", "{mv}b", "{mv}c"}
	for _, k := range keys {
		if err := cc.Set(ctx, k, "v"+k, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	slot := Slot(keys[0])
	from := c.NodeForKey(t, keys[0])
	var to *Server
	for _, n := range c.Nodes() {
		if n != from {
			to = n
			break
		}
	}
	if _, err := c.BeginSlotMove(ctx, slot, from); err == nil {
		t.Error("BeginSlotMove to the slot's own master succeeded")
	}

	m, err := c.BeginSlotMove(ctx, slot, to)
	if err != nil {
		t.Fatal(err)
	}
	if m.From != from || m.To != to || m.Opened.IsZero() {
		t.Fatalf("move %+v, want from %s to %s, opened", m, from.Addr(), to.Addr())
	}
	src := from.Client(t)
	if got, err := src.Get(ctx, keys[1]).Result(); err != nil || got != "v"+keys[1] {
		t.Errorf("GET of a key still on the source while migrating = %q, %v", got, err)
	}
	if n, err := m.Migrate(ctx, keys[0]); err != nil || n != 1 {
		t.Fatalf("Migrate(%s) = %d, %v", keys[0], n, err)
	}
	if err := src.Get(ctx, keys[0]).Err(); err == nil || !strings.HasPrefix(err.Error(), "ASK ") {
		t.Errorf("GET of a migrated key on the source = %v, want ASK", err)
	}
	if err := src.MGet(ctx, keys[0], keys[1]).Err(); err == nil || !strings.HasPrefix(err.Error(), "TRYAGAIN") {
		t.Errorf("MGET of split keys on the source = %v, want TRYAGAIN", err)
	}
	if n, err := m.Migrate(ctx); err != nil || n != 2 {
		t.Fatalf("Migrate() of the rest = %d, %v; want 2", n, err)
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Keys != 3 || m.Closed.Before(m.Opened) {
		t.Errorf("move %+v: want 3 keys, closed after opened", m)
	}
	if got := c.NodeForKey(t, keys[0]); got != to {
		t.Fatalf("slot %d served by %s after the move, want %s", slot, got.Addr(), to.Addr())
	}
	if left, err := src.ClusterCountKeysInSlot(ctx, slot).Result(); err != nil || left != 0 {
		t.Errorf("keys of slot %d left on the source: %d, %v", slot, left, err)
	}
	assertValues(ctx, t, cc, keys)

	// And back, in one call.
	m, err = c.MoveSlot(ctx, slot, from)
	if err != nil {
		t.Fatal(err)
	}
	if m.Keys != 3 || c.NodeForKey(t, keys[0]) != from {
		t.Fatalf("MoveSlot back: %d keys moved, served by %s; want 3 and %s", m.Keys, c.NodeForKey(t, keys[0]).Addr(), from.Addr())
	}
	assertValues(ctx, t, cc, keys)
}

// assertValues reads keys through a cluster client, which follows MOVED to
// wherever they are now.
func assertValues(ctx context.Context, t *testing.T, cc *redis.ClusterClient, keys []string) {
	t.Helper()
	for _, k := range keys {
		if got, err := cc.Get(ctx, k).Result(); err != nil || got != "v"+k {
			t.Errorf("GET %s after the move = %q, %v", k, got, err)
		}
	}
}
