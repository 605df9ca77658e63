package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
)

// TestRefusalNamed: once Redis refuses the store's new connections for
// maxclients, the error a caller gets says so, though go-redis reports only
// the closed socket; and with room again the store works without it.
func TestRefusalNamed(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: 1})
	defer admin.Close()
	if err := admin.Do(ctx, "CLIENT", "SETNAME", "admin").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: 1})
	defer c.Close()
	s, err := New(c, "refused", WithLeaseTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
	if err := s.Register(ctx, l, false); err != nil {
		t.Fatal(err)
	}
	req := budget.Request{Domains: []budget.Domain{{Version: 1, ID: "a"}}, Class: budget.OpGet}
	try := func(id string) error {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		att, err := s.TryAcquire(actx, id, req)
		if err == nil {
			if att.Outcome != budget.Granted {
				t.Fatalf("%s: %v, want granted", id, att.Outcome)
			}
			s.Cancel(actx, id)
		}
		return err
	}
	if err := try("before"); err != nil {
		t.Fatal(err)
	}
	if s.refusals.recent(time.Now()) {
		t.Fatal("a refusal recorded before any")
	}
	if err := admin.ConfigSet(ctx, "maxclients", "1").Err(); err != nil {
		t.Fatal(err)
	}
	// Every connection but the admin's goes; the store's come back refused.
	if _, err := admin.Do(ctx, "CLIENT", "KILL", "SKIPME", "yes").Result(); err != nil {
		t.Fatal(err)
	}
	err = try("refused")
	t.Logf("at maxclients: %v", err)
	if err == nil {
		t.Fatal("granted with every connection refused")
	}
	if !errors.Is(err, budget.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v wraps neither ErrUnavailable nor the deadline", err)
	}
	if !strings.Contains(err.Error(), "max number of clients") {
		t.Errorf("error %q does not name the refusal", err)
	}
	if err := admin.ConfigSet(ctx, "maxclients", "10000").Err(); err != nil {
		t.Fatal(err)
	}
	if err := try("after"); err != nil {
		t.Fatalf("with room again: %v", err)
	}
}
