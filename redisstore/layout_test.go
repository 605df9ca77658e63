package redisstore_test

import (
	"context"
	"encoding/hex"
	"errors"
	"maps"
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

// TestOldWaiterFormsRead: a queued waiter written by an older build is a
// hash (t, c, b, at, ttl, ch, sn, ds, cs; before the packed layout) or a
// text record (before the binary one, and miniredis's form still). This
// build reads it where it finds it: an operator's inspection lists it, a
// release hands the slot to it as before, and what is left is nothing.
func TestOldWaiterFormsRead(t *testing.T) {
	for _, tc := range bothServers() {
		for _, form := range []string{"hash", "text"} {
			t.Run(tc.name+"/"+form, func(t *testing.T) { oldWaiterRead(t, tc.client(t), form, tc.name == "redis") })
		}
	}
}

// oldWaiterRead is TestOldWaiterFormsRead on c; packed says the server's
// Lua has the struct library, so that this build writes the binary form.
func oldWaiterRead(t *testing.T, c *redis.Client, form string, packed bool) {
	ctx := context.Background()
	b := open(t, c, "oldwaiter", budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}, time.Minute)
	a := dom("a")
	held := mustAcquire(t, b, get(a))
	got := make(chan error, 1)
	go func() {
		l, err := b.Acquire(within(t, 30*time.Second), get(a))
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	prefix := "rb:{" + hex.EncodeToString([]byte("oldwaiter")) + "}:"
	var key, v string
	for deadline := time.Now().Add(10 * time.Second); key == ""; {
		if keys := c.Keys(ctx, prefix+"w:*").Val(); len(keys) == 1 {
			key = keys[0]
			v = c.Get(ctx, key).Val()
		} else if time.Now().After(deadline) {
			t.Fatal("no waiter queued")
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if packed != recpack.Binary(v) {
		t.Fatalf("waiter record %q: binary form %v, want %v", v, !packed, packed)
	}
	w, err := recpack.DecodeWaiter(v)
	if err != nil || w.Consumer != "test" || w.Domains != "1."+hex.EncodeToString([]byte("a")) {
		t.Fatalf("packed waiter %q: %+v, %v", v, w, err)
	}
	// Put it back the way an older build kept it.
	c.Del(ctx, key)
	if form == "hash" {
		b := "0"
		if w.Body {
			b = "1"
		}
		c.HSet(ctx, key, "t", w.Ticket, "c", w.Class, "b", b, "at", w.Arrived, "ttl", w.TTL, "ch", w.Channel,
			"sn", w.Session, "ds", strings.ReplaceAll(w.Domains, ",", " "), "cs", w.Consumer)
	} else {
		c.Set(ctx, key, w.Text(), 0)
	}
	c.PExpire(ctx, key, time.Minute)

	ad, err := redisstore.NewAdmin(c)
	if err != nil {
		t.Fatal(err)
	}
	in, err := ad.Inspect(ctx, "oldwaiter", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Waiters) != 1 || in.Waiters[0].Consumer != "test" || len(in.Waiters[0].Domains) != 1 ||
		in.Waiters[0].Domains[0] != a || in.Waiters[0].Class != budget.OpGet {
		t.Fatalf("inspection of the old waiter %s: %+v", form, in.Waiters)
	}
	if typ := c.Type(ctx, key).Val(); typ != "string" {
		t.Errorf("waiter key is a %s after a script read it, want string", typ)
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 {
		t.Errorf("converted waiter key has no TTL (%v)", ttl)
	}
	held.Release()
	if err := <-got; err != nil {
		t.Fatalf("the converted waiter: %v", err)
	}
	expectIdle(t, b)
	if n := len(c.Keys(ctx, prefix+"w:*").Val()); n != 0 {
		t.Errorf("%d waiter keys left", n)
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

// TestLayout1Converted: a budget kept in layout 1 (every lease in one hash,
// lx, and each session's lease ids in a set, sl:<sid>; no ly in its config,
// and the limits' JSON without the layout) is converted by the first call
// of this build: each lease moves to its session's hash, lx and the sets
// go, and the config names layout 2 with its JSON as this build sends it,
// so a host of this build registers the same limits without a conflict. A
// lease held across the conversion is released as usual, and a waiter
// queued before it is granted in turn. On a real Redis (through the
// library, and by EVALSHA) and on miniredis.
func TestLayout1Converted(t *testing.T) {
	for _, tc := range layoutServers() {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			ctx := context.Background()
			limits := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
			b, err := budget.New(limits, budget.WithStore(mustStore(t, c, "layout1", append([]redisstore.Option{redisstore.WithLeaseTTL(time.Minute)}, tc.opts...)...)))
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
			prefix := "rb:{" + hex.EncodeToString([]byte("layout1")) + "}:"
			cfg := prefix + "cfg"
			recs, sessions := redistest.Leases(ctx, c, prefix)
			sid := sessions[held.ID()]
			stored := c.HGet(ctx, cfg, "json").Val()
			if !strings.HasPrefix(stored, `{"layout":2,`) || c.HGet(ctx, cfg, "ly").Val() != "2" {
				t.Fatalf("config of this build: ly %q, json %s", c.HGet(ctx, cfg, "ly").Val(), stored)
			}
			// Put the budget back the way layout 1 kept it, in one step.
			if _, err := c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
				tx.Del(ctx, redistest.LeaseKey(ctx, c, prefix, sid))
				tx.HSet(ctx, prefix+"lx", held.ID(), recs[held.ID()])
				tx.SAdd(ctx, prefix+"sl:"+sid, held.ID(), "")
				tx.HDel(ctx, cfg, "ly")
				tx.HSet(ctx, cfg, "json", "{"+strings.TrimPrefix(stored, `{"layout":2,`))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if du := domainOf(usage(t, b), a); du.InFlight[budget.OpGet] != 1 { // the first call converts
				t.Fatalf("usage after the conversion: %+v", du)
			}
			if ly, js := c.HGet(ctx, cfg, "ly").Val(), c.HGet(ctx, cfg, "json").Val(); ly != "2" || js != stored {
				t.Errorf("converted config: ly %q, json %s; want 2, %s", ly, js, stored)
			}
			if n := c.Exists(ctx, prefix+"lx", prefix+"sl:"+sid).Val(); n != 0 {
				t.Errorf("%d keys of layout 1 left", n)
			}
			k := redistest.LeaseKey(ctx, c, prefix, sid)
			if v := c.HGet(ctx, k, held.ID()).Val(); v != recs[held.ID()] || c.PTTL(ctx, k).Val() <= 0 {
				t.Errorf("the held lease in its session's hash: %q (TTL %v), want %q", v, c.PTTL(ctx, k).Val(), recs[held.ID()])
			}
			again, err := budget.New(limits, budget.WithStore(mustStore(t, c, "layout1", tc.opts...)))
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
		})
	}
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
			for _, ly := range []string{"3", "x"} {
				c.HSet(ctx, cfg, "ly", ly, "json", json+" ")
				before := snapshot()
				_, err := b.Acquire(ctx, get(dom("a")))
				if !errors.Is(err, budget.ErrLimitsConflict) || !strings.Contains(err.Error(), "layout "+ly+" is newer than this build reads (2)") {
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
