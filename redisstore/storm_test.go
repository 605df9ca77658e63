package redisstore

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
)

// TestStormStoreAtMaxClients: a Redis at maxclients accepts a connection, sends
// "-ERR max number of clients reached" and closes it. go-redis reads that
// reply as its HELLO's answer, takes it for a server without HELLO, and
// fails on its next write, so the store sees a broken connection rather
// than the reply (scenario 23 in FAULTS.md). The store must still fail
// closed with ErrUnavailable, never a permanent error, carry no secret,
// and work again on the first call once connections free up: the TCP
// dials succeed, so go-redis's dial backoff (a second at a time after
// failed dials, go-redis #3062) never starts.
func TestStormStoreAtMaxClients(t *testing.T) {
	const secret = "maxclients-Secret-7"
	srv := redistest.Start(t, redistest.WithConfig("requirepass "+secret))
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: secret, ContextTimeoutEnabled: true, PoolSize: 1})
	defer admin.Close()
	if err := admin.Do(ctx, "ACL", "SETUSER", "lane", "on", ">"+secret+"-lane", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "lane", Password: secret + "-lane",
		ContextTimeoutEnabled: true, PoolSize: 1})
	defer c.Close()
	s, err := New(c, "maxclients", WithLeaseTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
	if err := s.Register(ctx, l, false); err != nil {
		t.Fatal(err)
	}
	req := budget.Request{Domains: []budget.Domain{{Version: 1, ID: "a"}}, Class: budget.OpGet}
	acquire := func(id string) (time.Duration, error) {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		start := time.Now()
		att, err := s.TryAcquire(actx, id, req)
		if err == nil && att.Outcome != budget.Granted {
			t.Fatalf("%s: %v, want granted", id, att.Outcome)
		}
		if err == nil {
			s.Cancel(actx, id)
		}
		return time.Since(start), err
	}
	if _, err := acquire("before"); err != nil {
		t.Fatal(err)
	}
	// Room for none but the admin's connection, and the store's cut.
	roomy, err := admin.ConfigGet(ctx, "maxclients").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxclients", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := admin.ClientKillByFilter(ctx, "USER", "lane").Result(); err != nil || n != 2 {
		t.Fatalf("CLIENT KILL: %d connections, %v; want the store's 2", n, err)
	}
	took, err := acquire("refused")
	t.Logf("a call at maxclients: %v after %v", err, took.Round(time.Millisecond))
	switch {
	case err == nil:
		t.Fatal("granted with every connection refused")
	case !errors.Is(err, budget.ErrUnavailable) || errors.Is(err, budget.ErrInvalidRequest):
		t.Errorf("error %v, want one wrapping only ErrUnavailable: the budget retries it within its grace", err)
	case strings.Contains(err.Error(), secret):
		t.Errorf("error reveals the secret: %v", err)
	}
	// What go-redis does with the refusal, on a client of its own (the
	// store's also redials its pub/sub connection): it retries, and hands
	// over a network error. On a Cluster the store then asks for a
	// slot-map reload, as for a dead master it cannot tell apart (go-redis
	// spaces reloads 200 ms apart).
	dials := &countDials{}
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "lane", Password: secret + "-lane", ContextTimeoutEnabled: true})
	defer raw.Close()
	raw.AddHook(dials)
	rawErr := raw.Ping(ctx).Err()
	t.Logf("PING at maxclients: %v after %d dials", rawErr, dials.n.Load())
	if rawErr == nil {
		t.Fatal("PING answered at maxclients")
	}
	if dials.n.Load() < 2 {
		t.Errorf("%d dials: go-redis retries a refused handshake (MaxRetries), want at least 2", dials.n.Load())
	}
	if strings.Contains(strings.ToLower(rawErr.Error()), "max number of clients") {
		t.Logf("go-redis now reports the refusal itself: scenario 23's errors name it, and FAULTS.md can say so")
	} else if !topologyError(rawErr) {
		t.Errorf("topologyError(%v) = false, want true: a broken connection may be a dead master", rawErr)
	}

	// Room again: the first call goes through.
	if err := admin.ConfigSet(ctx, "maxclients", roomy["maxclients"]).Err(); err != nil {
		t.Fatal(err)
	}
	took, err = acquire("after")
	if err != nil {
		t.Fatalf("first call after maxclients was raised: %v", err)
	}
	t.Logf("first call after the raise: granted in %v", took.Round(time.Millisecond))
}

type countDials struct{ n atomic.Int64 }

func (d *countDials) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.n.Add(1)
		return next(ctx, network, addr)
	}
}
func (d *countDials) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (d *countDials) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A max-clients reply, as go-redis would return it if its handshake passed
// it on, says nothing about the slot map.
func TestStormMaxClientsReply(t *testing.T) {
	if topologyError(replyError("ERR max number of clients reached")) {
		t.Error("a max-clients reply asks for a slot-map reload")
	}
}
