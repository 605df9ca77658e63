package redisstore_test

import (
	"context"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/dompack"
	"github.com/runbudget/runbudget/internal/redistest"
)

// TestOldDomainHashConverted: a domain written by a build before the packed
// layout is a hash (f<class index>, b, bk, tk, ta, ep, rx, ...). This build
// converts it where it finds it, counts and TTL kept: a lease counted in
// the hash still blocks, its release returns the slot, and what is left
// is a packed value with a TTL.
func TestOldDomainHashConverted(t *testing.T) {
	for _, tc := range []struct {
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
	} {
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
