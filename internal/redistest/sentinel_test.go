package redistest

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestSentinelFailsOver: the harness reports a ready setup (the first node
// is master, the sentinels name it), its client writes through the
// sentinels, and after kill -9 of the master the sentinels promote the
// replica, which keeps the data and takes the client's writes.
func TestSentinelFailsOver(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	sn := StartSentinel(t, 1)
	t.Logf("master, replica and %d sentinels ready in %v", sentinelCount, time.Since(begin).Round(time.Millisecond))

	if got := len(sn.SentinelAddrs()); got != sentinelCount {
		t.Fatalf("SentinelAddrs() has %d addresses, want %d", got, sentinelCount)
	}
	nodes := sn.Nodes()
	if len(nodes) != 2 {
		t.Fatalf("Nodes() = %d servers, want a master and one replica", len(nodes))
	}
	for _, a := range append(sn.SentinelAddrs(), nodes[0].Addr(), nodes[1].Addr()) {
		if !strings.HasPrefix(a, "127.0.0.1:") {
			t.Fatalf("address %q is not on loopback", a)
		}
	}
	if sn.MasterName() != SentinelMaster {
		t.Fatalf("MasterName() = %q, want %q", sn.MasterName(), SentinelMaster)
	}
	master, replica := nodes[0], nodes[1]
	if got := sn.Master(t); got != master {
		t.Fatalf("Master() = %s, want the first node %s", got.Addr(), master.Addr())
	}
	c := sn.Client(t)
	ctx := ctxTimeout(t, time.Minute)
	if err := c.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The promoted replica must keep what it had: wait until it has it.
	waitUntil(t, "the replica to hold the write", 10*time.Second, func() bool {
		return replica.Client(t).Get(ctx, "k").Val() == "before"
	})

	master.Kill()
	killed := time.Now()
	waitUntil(t, "the sentinels to name the replica as master", 30*time.Second, func() bool {
		return sn.Master(t) == replica
	})
	t.Logf("sentinels switched %v after kill -9", time.Since(killed).Round(time.Millisecond))
	if got := c.Get(ctx, "k").Val(); got != "before" {
		t.Fatalf("through the client after the failover k = %q, want the write made before it", got)
	}
	waitUntil(t, "a write through the failover client", 30*time.Second, func() bool {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return c.Set(wctx, "k", "after", 0).Err() == nil
	})
	if got := replica.Client(t).Get(ctx, "k").Val(); got != "after" {
		t.Fatalf("the promoted replica holds %q, want the write made through the client", got)
	}
	if info := replica.Client(t).Info(ctx, "replication").Val(); !strings.Contains(info, "role:master") {
		t.Fatalf("the promoted replica reports:\n%s", info)
	}
}

// TestSentinelOptions: a password reaches the replicas (masterauth), the
// sentinels (auth-pass) and the client; WithSentinelConfig lines override
// the harness's sentinel defaults; Debug changes every sentinel's timings.
func TestSentinelOptions(t *testing.T) {
	t.Parallel()
	sn := StartSentinel(t, 2, WithConfig("requirepass s3cret"),
		WithSentinelConfig("sentinel down-after-milliseconds "+SentinelMaster+" 1500"))
	if got := len(sn.Nodes()); got != 3 {
		t.Fatalf("Nodes() = %d servers, want a master and two replicas", got)
	}
	ctx := ctxTimeout(t, 10*time.Second)
	c := sn.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("write through the sentinels with the password: %v", err)
	}
	sn.Debug(t, "info-period", "500")
	for _, s := range sn.Sentinels() {
		m, err := sentinelMaster(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if m["down-after-milliseconds"] != "1500" || m["num-slaves"] != "2" {
			t.Errorf("sentinel %s: down-after-milliseconds %s, num-slaves %s; want 1500 and 2",
				s.Addr(), m["down-after-milliseconds"], m["num-slaves"])
		}
		v, err := sentinelDo(ctx, s, "SENTINEL", "DEBUG")
		if err != nil {
			t.Fatal(err)
		}
		d, err := pairs(v)
		if err != nil {
			t.Fatal(err)
		}
		if d["INFO-PERIOD"] != "500" {
			t.Errorf("sentinel %s: INFO-PERIOD %q after Debug, want 500", s.Addr(), d["INFO-PERIOD"])
		}
	}
}

// waitUntil polls cond until it holds, failing the test after within.
func waitUntil(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := poll(ctx, what, func(context.Context) (string, bool) { return "", cond() }); err != nil {
		t.Fatal(err)
	}
}
