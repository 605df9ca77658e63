package redisstore_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"maps"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/dompack"
	"github.com/runbudget/runbudget/internal/recpack"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

// bothServers are a real Redis and miniredis: the layout conversions run
// the same Lua on both, and miniredis has neither struct nor cmsgpack.
func bothServers() []struct {
	name   string
	client func(t *testing.T) *redis.Client
} {
	return []struct {
		name   string
		client func(t *testing.T) *redis.Client
	}{
		{"redis", func(t *testing.T) *redis.Client { return redistest.Start(t).Client(t) }},
		{"miniredis", func(t *testing.T) *redis.Client {
			m := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { c.Close() })
			return c
		}},
	}
}

// layoutServer is a server a layout test runs on, with the store's options
// there.
type layoutServer struct {
	name   string
	client func(t *testing.T) *redis.Client
	opts   []redisstore.Option
}

// layoutServers are bothServers and a real Redis again by EVALSHA, where
// lib.lua reads the layout on every call instead of with the cached
// limits.
func layoutServers() []layoutServer {
	var out []layoutServer
	for _, s := range bothServers() {
		out = append(out, layoutServer{s.name, s.client, nil})
	}
	return append(out, layoutServer{"redis-evalsha", out[0].client, []redisstore.Option{redisstore.WithEvalOnly()}})
}

// TestOldDomainHashConverted: a domain written by a build before the packed
// layout is a hash (f<class index>, b, bk, tk, ta, ep, rx, ...). This build
// converts it where it finds it, counts and TTL kept: a lease counted in
// the hash still blocks, its release returns the slot, and what is left
// is a packed value with a TTL.
func TestOldDomainHashConverted(t *testing.T) {
	for _, tc := range bothServers() {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			ctx := context.Background()
			b := open(t, c, "oldlayout", budget.Limits{RequestsPerSecond: 100, InFlight: map[budget.OpClass]int{budget.OpGet: 1}}, time.Minute)
			a, other := dom("a"), dom("b")
			held := mustAcquire(t, b, get(a))
			key := "rb:{" + hex.EncodeToString([]byte("oldlayout")) + "}:d:1." + hex.EncodeToString([]byte("a"))
			d, err := dompack.Decode(c.Get(ctx, key).Val(), budget.NumClasses)
			if err != nil || d.InFlight[budget.OpGet.Index()] != 1 {
				t.Fatalf("packed value after a grant: %+v, %v", d, err)
			}
			// Put it back the way the previous build kept it.
			f := "f" + strconv.Itoa(budget.OpGet.Index())
			c.Del(ctx, key)
			c.HSet(ctx, key, f, "1", "bk", "1", "tk", strconv.FormatFloat(d.Tokens, 'g', 17, 64),
				"ta", strconv.FormatInt(d.TokensAt, 10), "rx", strconv.FormatInt(d.TTLEnd, 10), "ep", strconv.FormatInt(d.Epoch, 10))
			c.PExpire(ctx, key, time.Minute)

			if du := domainOf(usage(t, b), a); du.InFlight[budget.OpGet] != 1 {
				t.Errorf("usage of the converted domain: %+v", du)
			}
			if typ := c.Type(ctx, key).Val(); typ != "string" {
				t.Errorf("domain key is a %s after a script read it, want string", typ)
			}
			tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			if l, err := b.Acquire(tctx, get(a, other)); err == nil {
				l.Release()
				t.Error("granted a second slot over a count kept in the old hash")
			}
			cancel()
			held.Release()
			l := mustAcquire(t, b, get(a))
			l.Release()
			expectIdle(t, b)
			if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 {
				t.Errorf("converted domain key has no TTL (%v)", ttl)
			}
		})
	}
}

// TestOldLeaseTextRead: a lease record an older build wrote is text. This
// build reads it where it finds it: its request slot and then its body
// slot are retired apart (the partial retirement writes the record again,
// in this build's form), and what is left is nothing.
func TestOldLeaseTextRead(t *testing.T) {
	for _, tc := range bothServers() {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			ctx := context.Background()
			b := open(t, c, "oldlease", budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}, OpenBodies: 1}, time.Minute)
			a := dom("a")
			req := get(a)
			req.OpensBody = true
			l := mustAcquire(t, b, req)
			prefix := "rb:{" + hex.EncodeToString([]byte("oldlease")) + "}:"
			_, sessions := redistest.Leases(ctx, c, prefix)
			lx := redistest.LeaseKey(ctx, c, prefix, sessions[l.ID()])
			v := c.HGet(ctx, lx, l.ID()).Val()
			rec, err := recpack.DecodeLease(v)
			if err != nil || !rec.Request || !rec.Body || rec.Domains != "1."+hex.EncodeToString([]byte("a")) {
				t.Fatalf("lease record %q: %+v, %v", v, rec, err)
			}
			if err := c.HSet(ctx, lx, l.ID(), rec.Text()).Err(); err != nil {
				t.Fatal(err)
			}
			l.CompleteRequest()
			v = c.HGet(ctx, lx, l.ID()).Val()
			if rec, err = recpack.DecodeLease(v); err != nil || rec.Request || !rec.Body {
				t.Fatalf("after the request slot's retirement, lease record %q: %+v, %v", v, rec, err)
			}
			if du := domainOf(usage(t, b), a); du.InFlight[budget.OpGet] != 0 || du.OpenBodies != 1 {
				t.Fatalf("after the request slot's retirement: %+v", du)
			}
			l.Release()
			expectIdle(t, b)
			if n := sessionLeases(c, lx); n != 0 {
				t.Errorf("%d lease records left", n)
			}
		})
	}
}

// TestOlderLayoutsConverted: a budget kept in layout 2 (each queue a
// sorted set of waiter ids by ticket, a record per waiter, w:<id>, and
// their deadlines in wexp; domain values of version 2) or in layout 1
// (that, and every lease in one hash, lx, with each session's lease ids in
// a set, sl:<sid>; no ly in its config, and the limits' JSON without the
// layout) is converted by the first call of this build: each lease moves
// to its session's hash, each queue becomes a string of entries with each
// waiter's marker, the old keys go, and the config names layout 3 with its
// JSON as this build sends it, so a host of this build registers the same
// limits without a conflict. A lease held across the conversion is
// released as usual, and a waiter queued before it keeps its place and is
// granted in turn. On a real Redis (through the library, and by EVALSHA)
// and on miniredis (whose records are text).
func TestOlderLayoutsConverted(t *testing.T) {
	for _, tc := range layoutServers() {
		for _, ly := range []string{"1", "2"} {
			t.Run(tc.name+"/layout"+ly, func(t *testing.T) { olderLayoutConverted(t, tc, ly) })
		}
	}
}

func olderLayoutConverted(t *testing.T, tc layoutServer, ly string) {
	c := tc.client(t)
	ctx := context.Background()
	name := "older" + ly
	limits := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
	b, err := budget.New(limits, budget.WithStore(mustStore(t, c, name, append([]redisstore.Option{redisstore.WithLeaseTTL(time.Minute)}, tc.opts...)...)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a := dom("a")
	held := mustAcquire(t, b, get(a))
	got := make(chan error, 1)
	go func() {
		l, err := b.Acquire(ctx, get(a))
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for usage(t, b).Waiters != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	prefix := "rb:{" + hex.EncodeToString([]byte(name)) + "}:"
	cfg := prefix + "cfg"
	recs, sessions := redistest.Leases(ctx, c, prefix)
	sid := sessions[held.ID()]
	stored := c.HGet(ctx, cfg, "json").Val()
	if !strings.HasPrefix(stored, `{"layout":3,`) || c.HGet(ctx, cfg, "ly").Val() != "3" {
		t.Fatalf("config of this build: ly %q, json %s", c.HGet(ctx, cfg, "ly").Val(), stored)
	}
	enc := "1." + hex.EncodeToString([]byte("a"))
	q, dk := prefix+"q:"+enc, prefix+"d:"+enc
	es, err := recpack.DecodeQueue(c.Get(ctx, q).Val())
	if err != nil || len(es) != 1 || es[0].Dead {
		t.Fatalf("queue of this build: %+v, %v; want one live entry", es, err)
	}
	e := es[0]
	d, err := dompack.Decode(c.Get(ctx, dk).Val(), budget.NumClasses)
	if err != nil || d.Waiters != 1 || d.QueueLen != int64(len(c.Get(ctx, q).Val())) {
		t.Fatalf("domain of this build: %+v, %v", d, err)
	}
	// Put the budget back the way the older layout kept it, in one step.
	old := recpack.Waiter{Ticket: 7, Class: e.Class, Body: e.Body, Arrived: e.Arrived, TTL: e.TTL,
		Channel: e.Channel, Session: e.Session, Domains: enc, Consumer: e.Consumer}
	js := `{"layout":2,` + strings.TrimPrefix(stored, `{"layout":3,`)
	if _, err := c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.HDel(ctx, redistest.LeaseKey(ctx, c, prefix, e.Session), e.ID)
		tx.Del(ctx, q)
		tx.ZAdd(ctx, q, redis.Z{Score: 7, Member: e.ID})
		tx.PExpire(ctx, q, time.Minute)
		tx.Set(ctx, prefix+"w:"+e.ID, old.Text(), time.Minute)
		tx.ZAdd(ctx, prefix+"wexp", redis.Z{Score: float64(e.Arrived + e.TTL), Member: e.ID})
		tx.Set(ctx, dk, domainV2(d, tc.name == "miniredis"), redis.KeepTTL)
		tx.HSet(ctx, cfg, "ly", "2", "json", js)
		if ly == "1" {
			tx.Del(ctx, redistest.LeaseKey(ctx, c, prefix, sid))
			tx.HSet(ctx, prefix+"lx", held.ID(), recs[held.ID()])
			tx.SAdd(ctx, prefix+"sl:"+sid, held.ID(), "")
			tx.HDel(ctx, cfg, "ly")
			tx.HSet(ctx, cfg, "json", "{"+strings.TrimPrefix(stored, `{"layout":3,`))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	u := usage(t, b) // the first call converts
	if du := domainOf(u, a); du.InFlight[budget.OpGet] != 1 || u.Waiters != 1 {
		t.Fatalf("usage after the conversion: %+v, %d waiters", du, u.Waiters)
	}
	if ly, js := c.HGet(ctx, cfg, "ly").Val(), c.HGet(ctx, cfg, "json").Val(); ly != "3" || js != stored {
		t.Errorf("converted config: ly %q, json %s; want 3, %s", ly, js, stored)
	}
	if n := c.Exists(ctx, prefix+"lx", prefix+"sl:"+sid, prefix+"w:"+e.ID, prefix+"wexp").Val(); n != 0 {
		t.Errorf("%d keys of the older layout left", n)
	}
	if es, err := recpack.DecodeQueue(c.Get(ctx, q).Val()); err != nil || len(es) != 1 || es[0].ID != e.ID || es[0].Session != e.Session ||
		es[0].Consumer != e.Consumer || c.PTTL(ctx, q).Val() <= 0 {
		t.Errorf("converted queue: %+v, %v (TTL %v)", es, err, c.PTTL(ctx, q).Val())
	}
	k := redistest.LeaseKey(ctx, c, prefix, sid)
	if v := c.HGet(ctx, k, held.ID()).Val(); v != recs[held.ID()] || c.PTTL(ctx, k).Val() <= 0 {
		t.Errorf("the held lease in its session's hash: %q (TTL %v), want %q", v, c.PTTL(ctx, k).Val(), recs[held.ID()])
	}
	ad, err := redisstore.NewAdmin(c)
	if err != nil {
		t.Fatal(err)
	}
	in, err := ad.Inspect(ctx, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Waiters) != 1 || in.Waiters[0].ID != e.ID || len(in.Waiters[0].Domains) != 1 ||
		in.Waiters[0].Domains[0] != a || in.Waiters[0].Class != budget.OpGet {
		t.Fatalf("inspection of the converted waiter: %+v", in.Waiters)
	}
	again, err := budget.New(limits, budget.WithStore(mustStore(t, c, name, tc.opts...)))
	if err != nil {
		t.Fatalf("a host of this build with the same limits, after the conversion: %v", err)
	}
	again.Close()
	held.Release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the waiter queued before the conversion: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter queued before the conversion was not granted")
	}
	expectIdle(t, b)
}

// domainV2 is d as layout 2 packed a domain's value (version 2: the queue
// flag and open bodies as integers, thirteen doubles, then the counts), in
// binary or, for a server without Lua's struct library, as text.
func domainV2(d dompack.Domain, text bool) string {
	qf := 0.0
	if d.Waiters > 0 {
		qf = 1
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	fs := []float64{2, qf, float64(d.Bodies), b2f(d.BucketInUse), d.Tokens, float64(d.TokensAt), b2f(d.Throttled),
		float64(d.PauseEnd), float64(d.TTLEnd), d.FactorBefore, float64(d.DecreasedAt), d.StartBase, d.StartSum,
		float64(d.LastStart), float64(d.FirstStart), float64(d.Epoch)}
	for _, n := range d.InFlight {
		fs = append(fs, float64(n))
	}
	if text {
		out := []string{"t"}
		for _, f := range fs {
			out = append(out, strconv.FormatFloat(f, 'g', 17, 64))
		}
		return strings.Join(out, " ")
	}
	var buf []byte
	for i, f := range fs {
		if i <= 2 || i > 15 {
			buf = binary.BigEndian.AppendUint64(buf, uint64(int64(f)))
		} else {
			buf = binary.BigEndian.AppendUint64(buf, math.Float64bits(f))
		}
	}
	return string(buf)
}

// TestNewerLayoutRefused: a budget whose config says it is kept in a
// layout newer than this build's is left alone: every call fails at once
// with an error wrapping ErrLimitsConflict (retrying cannot help) that
// names both layouts, and changes nothing; a config naming this build's layout, or none, is served.
// On a real Redis (through the library, and by EVALSHA) and on miniredis.
func TestNewerLayoutRefused(t *testing.T) {
	for _, sv := range layoutServers() {
		t.Run(sv.name, func(t *testing.T) {
			c := sv.client(t)
			ctx := context.Background()
			b, err := budget.New(slots(2), budget.WithStore(mustStore(t, c, "layout", sv.opts...)),
				budget.WithUnavailableGrace(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			held := mustAcquire(t, b, get(dom("a")))
			cfg := "rb:{" + hex.EncodeToString([]byte("layout")) + "}:cfg"
			snapshot := func() map[string]string {
				out := map[string]string{}
				for _, k := range c.Keys(ctx, "rb:{"+hex.EncodeToString([]byte("layout"))+"}:*").Val() {
					out[k] = c.Dump(ctx, k).Val()
				}
				return out
			}
			// A build that moves a budget to a newer layout writes ly with
			// the limits' JSON changed in its bytes (lib.lua, LAYOUT).
			json := c.HGet(ctx, cfg, "json").Val()
			for _, ly := range []string{"4", "x"} {
				c.HSet(ctx, cfg, "ly", ly, "json", json+" ")
				before := snapshot()
				_, err := b.Acquire(ctx, get(dom("a")))
				if !errors.Is(err, budget.ErrLimitsConflict) || !strings.Contains(err.Error(), "layout "+ly+" is newer than this build reads (3)") {
					t.Fatalf("ly %s: Acquire error %v; want ErrLimitsConflict naming both layouts", ly, err)
				}
				if _, err := b.Usage(ctx); !errors.Is(err, budget.ErrLimitsConflict) {
					t.Fatalf("ly %s: Usage error %v; want ErrLimitsConflict", ly, err)
				}
				if after := snapshot(); !maps.Equal(before, after) {
					t.Fatalf("ly %s: the refused calls changed the budget's keys", ly)
				}
				if _, err := budget.New(slots(2), budget.WithStore(mustStore(t, c, "layout", sv.opts...)),
					budget.WithUnavailableGrace(200*time.Millisecond)); !errors.Is(err, budget.ErrLimitsConflict) {
					t.Fatalf("ly %s: budget.New error %v; want ErrLimitsConflict", ly, err)
				}
			}
			for _, ly := range []string{"1", ""} {
				if ly == "" {
					c.HDel(ctx, cfg, "ly")
				} else {
					c.HSet(ctx, cfg, "ly", ly, "json", json)
				}
				mustAcquire(t, b, get(dom("a"))).Release()
			}
			held.Release()
		})
	}
}

func mustStore(t *testing.T, c redis.UniversalClient, name string, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
