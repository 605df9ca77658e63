package redistest

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestCutReplication: a cut replica misses the master's writes, stays cut
// across its own attempts to re-sync, catches up when healed, and once
// promoted holds exactly what it had at the cut.
func TestCutReplication(t *testing.T) {
	t.Parallel()
	master := Start(t, WithConfig("requirepass pw", "repl-diskless-sync-delay 0"))
	replica := Start(t, WithConfig("requirepass pw", "masterauth pw", "replicaof 127.0.0.1 "+strconv.Itoa(master.Port())))
	mc, rc := master.Client(t), replica.Client(t)
	ctx := ctxTimeout(t, 30*time.Second)
	if err := mc.Set(ctx, "a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	WaitCaughtUp(t, master, replica)

	cut := CutReplication(t, master, replica)
	if err := mc.Set(ctx, "b", "2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := cut.Missed(t); n <= 0 {
		t.Fatalf("Missed() = %d after a write on the master, want > 0", n)
	}
	// The replica retries once a second; the cut must outlast a retry.
	// Only its log tells when one was refused: poll it.
	waitUntil(t, "a refused re-sync in the replica's log", 10*time.Second, func() bool {
		b, _ := os.ReadFile(replica.logPath)
		return strings.Contains(string(b), "Unable to AUTH to MASTER")
	})
	if n := cut.Missed(t); n <= 0 {
		t.Fatalf("Missed() = %d after a refused re-sync, want > 0", n)
	}
	if err := rc.Get(ctx, "b").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET b on the cut replica: %v, want nil", err)
	}

	cut.Heal(t)
	if got := rc.Get(ctx, "b").Val(); got != "2" {
		t.Fatalf("after Heal the replica has b = %q, want 2", got)
	}

	cut = CutReplication(t, master, replica)
	if err := mc.Set(ctx, "c", "3", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := cut.Missed(t); n <= 0 {
		t.Fatalf("Missed() = %d after the second cut, want > 0", n)
	}
	master.Kill()
	if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	if got := rc.Get(ctx, "b").Val(); got != "2" {
		t.Errorf("promoted replica: b = %q, want the write made before the cut", got)
	}
	if err := rc.Get(ctx, "c").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("promoted replica: GET c: %v, want nil (written during the cut)", err)
	}
}

// TestCutReplicationNeedsPassword: without requirepass a wrong masterauth
// would change nothing, so the cut refuses to pretend.
func TestCutReplicationNeedsPassword(t *testing.T) {
	t.Parallel()
	master := Start(t)
	replica := Start(t, WithConfig("replicaof 127.0.0.1 "+strconv.Itoa(master.Port())))
	_, err := cutReplication(ctxTimeout(t, 5*time.Second), master, replica)
	if err == nil || !strings.Contains(err.Error(), "requirepass") {
		t.Fatalf("cutReplication without a password: %v, want an error naming requirepass", err)
	}
}

// TestCutReplicationClusterFailover: a cut Cluster replica stays a healthy
// node, is promoted when its master dies, and lacks what the master took
// during the cut.
func TestCutReplicationClusterFailover(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3, 1, WithConfig("requirepass pw", "cluster-node-timeout 1000"))
	cc := c.Client(t)
	ctx := ctxTimeout(t, time.Minute)
	if err := cc.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	master := c.NodeForKey(t, "k")
	replica := replicaIn(t, c.Nodes(), master)
	WaitCaughtUp(t, master, replica)

	cut := CutReplication(t, master, replica)
	if err := cc.Set(ctx, "k", "during", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := cut.Missed(t); n <= 0 {
		t.Fatalf("Missed() = %d, want > 0", n)
	}
	// Every node still sees the cut replica healthy: not failing, not
	// suspected (its role there may lag, carried by gossip).
	id := strings.TrimSpace(replica.Client(t).Do(ctx, "CLUSTER", "MYID").Val().(string))
	for _, n := range c.Nodes() {
		for _, line := range strings.Split(n.Client(t).ClusterNodes(ctx).Val(), "\n") {
			if f := strings.Fields(line); len(f) > 2 && f[0] == id && strings.Contains(f[2], "fail") {
				t.Fatalf("%s sees the cut replica as %q", n.Addr(), f[2])
			}
		}
	}

	master.Kill()
	killed := time.Now()
	// The cluster announces a failover to nobody outside it: poll.
	waitUntil(t, "the cut replica to take over", 20*time.Second, func() bool { return c.NodeForKey(t, "k") == replica })
	t.Logf("cut replica promoted %v after kill -9", time.Since(killed).Round(time.Millisecond))
	if got := replica.Client(t).Get(ctx, "k").Val(); got != "before" {
		t.Fatalf("promoted replica: k = %q, want the value from before the cut", got)
	}
}

// TestCutReplicationSentinelFailover: the sentinels keep a cut replica as a
// candidate, promote it when the master dies, and it lacks what the master
// took during the cut.
func TestCutReplicationSentinelFailover(t *testing.T) {
	t.Parallel()
	sn := StartSentinel(t, 1, WithConfig("requirepass pw"))
	master, replica := sn.Nodes()[0], sn.Nodes()[1]
	c := sn.Client(t)
	ctx := ctxTimeout(t, time.Minute)
	if err := c.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	WaitCaughtUp(t, master, replica)

	cut := CutReplication(t, master, replica)
	if err := c.Set(ctx, "k", "during", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := cut.Missed(t); n <= 0 {
		t.Fatalf("Missed() = %d, want > 0", n)
	}
	for _, s := range sn.Sentinels() {
		reps, err := sentinelReplicas(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if len(reps) != 1 || reps[0]["flags"] != "slave" {
			t.Fatalf("sentinel %s sees the replicas %v, want the cut one flagged slave only", s.Addr(), reps)
		}
	}

	master.Kill()
	killed := time.Now()
	waitUntil(t, "the sentinels to promote the cut replica", 30*time.Second, func() bool { return sn.Master(t) == replica })
	t.Logf("cut replica named master %v after kill -9", time.Since(killed).Round(time.Millisecond))
	if got := replica.Client(t).Get(ctx, "k").Val(); got != "before" {
		t.Fatalf("promoted replica: k = %q, want the value from before the cut", got)
	}
}

// replicaIn returns the node of nodes that replicates master.
func replicaIn(t *testing.T, nodes []*Server, master *Server) *Server {
	t.Helper()
	for _, n := range nodes {
		if n == master {
			continue
		}
		f, err := infoOf(ctxTimeout(t, 2*time.Second), adminClientFor(t, n), "replication")
		if err != nil {
			t.Fatal(err)
		}
		if f["role"] == "slave" && f["master_port"] == strconv.Itoa(master.Port()) {
			return n
		}
	}
	t.Fatalf("no replica of %s", master.Addr())
	return nil
}

func adminClientFor(t *testing.T, s *Server) *redis.Client {
	c := adminClient(s)
	t.Cleanup(func() { _ = c.Close() })
	return c
}
