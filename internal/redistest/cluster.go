package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/internal/childproc"
)

// clusterSlots is the number of hash slots of every Redis Cluster.
const clusterSlots = 16384

// clusterDefaults come before the caller's WithConfig lines, which may
// override them.
var clusterDefaults = []string{
	"cluster-enabled yes",
	"cluster-config-file nodes.conf",
	// Redis's default is 15s. A failover takes about node-timeout plus one
	// or two seconds, so the default would make every failover test slow; 2s
	// is still far above any stall a healthy local node shows under -race.
	"cluster-node-timeout 2000",
	// Redis 7.0 waits 5s (repl-diskless-sync-delay) before a diskless full
	// sync, hoping more replicas join it; here that is only a 5s stall before
	// each replica is in sync.
	"repl-diskless-sync-delay 0",
}

// Cluster is a Redis Cluster of redis-server processes owned by a test.
type Cluster struct {
	nodes    []*Server
	password string
	masters  int
	replicas int
}

// StartCluster starts masters*(1+replicas) redis-server processes with
// cluster-enabled yes on random loopback ports, forms a cluster with
// `redis-cli --cluster create ... --cluster-replicas replicas`, and returns
// once every node reports cluster_state:ok with all 16384 slots served, every
// node knows every other, and every replica's link to its master is up.
// masters must be at least 3 (the minimum redis-cli accepts).
//
// Options apply to every node; a requirepass line also sets masterauth, so
// replicas can sync. Like Start, it skips or fails the test when redis-server
// or redis-cli is missing, fails the test when the cluster does not form
// within 30s, and kills every node when the test finishes.
func StartCluster(t testing.TB, masters, replicas int, opts ...Option) *Cluster {
	t.Helper()
	if masters < 3 || replicas < 0 {
		t.Fatalf("redistest: StartCluster(%d masters, %d replicas): need at least 3 masters and no negative replicas", masters, replicas)
	}
	bin := requireTool(t, "redis-server")
	cli := requireTool(t, "redis-cli")

	var user config
	for _, o := range opts {
		o(&user)
	}
	password, err := checkLines(user.lines)
	if err != nil {
		t.Fatal(err)
	}
	if user.movable {
		t.Fatal("redistest: WithMovableClock applies to Start only")
	}
	cfg := config{cluster: true, pickPort: freePort}
	if user.pickPort != nil {
		cfg.pickPort = user.pickPort
	}
	cfg.lines = append(cfg.lines, clusterDefaults...)
	if password != "" {
		cfg.lines = append(cfg.lines, "masterauth "+quoteArg(password))
	}
	cfg.lines = append(cfg.lines, user.lines...)

	c := &Cluster{password: password, masters: masters, replicas: replicas}
	for range masters * (1 + replicas) {
		s, err := newServer(t, bin, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.startFresh(cfg.pickPort); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, s)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	childproc.DieWithParent(cmd)
	if password != "" {
		// The environment rather than -a keeps the password out of ps.
		cmd.Env = append(os.Environ(), "REDISCLI_AUTH="+password)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitOK(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitOK polls every node until the cluster is fully formed; see StartCluster.
func (c *Cluster) waitOK(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.nodes))
	for i, s := range c.nodes {
		clients[i] = redis.NewClient(&redis.Options{
			Addr: s.Addr(), Password: c.password, MaxRetries: -1, DialerRetries: 1,
			PoolSize: 1, ContextTimeoutEnabled: true,
		})
		defer clients[i].Close()
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		status, ok := c.status(ctx, clients)
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: cluster not ok within %v:\n%s", clusterTimeout, status)
		case <-tick.C:
		}
	}
}

// status reports whether every node sees a complete, ok cluster with linked
// replicas, and a per-node summary for the failure message.
func (c *Cluster) status(ctx context.Context, clients []*redis.Client) (string, bool) {
	var b strings.Builder
	ok := true
	linkedReplicas := 0
	for i, cl := range clients {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		info, err := cl.ClusterInfo(cctx).Result()
		var repl string
		if err == nil {
			repl, err = cl.Info(cctx, "replication").Result()
		}
		cancel()
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", c.nodes[i].Addr(), err)
			ok = false
			continue
		}
		ci, ri := infoFields(info), infoFields(repl)
		fmt.Fprintf(&b, "%s: state=%s slots_ok=%s known_nodes=%s role=%s master_link_status=%s\n",
			c.nodes[i].Addr(), ci["cluster_state"], ci["cluster_slots_ok"], ci["cluster_known_nodes"],
			ri["role"], ri["master_link_status"])
		if ci["cluster_state"] != "ok" ||
			ci["cluster_slots_ok"] != strconv.Itoa(clusterSlots) ||
			ci["cluster_known_nodes"] != strconv.Itoa(len(c.nodes)) {
			ok = false
		}
		if ri["role"] == "slave" && ri["master_link_status"] == "up" {
			linkedReplicas++
		}
	}
	return b.String(), ok && linkedReplicas == c.masters*c.replicas
}

// infoFields parses the "key:value" lines of CLUSTER INFO and INFO.
func infoFields(s string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}

// Addrs returns every node's "127.0.0.1:port", in the order of Nodes.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Nodes returns the cluster's servers, in start order, so a test can kill,
// pause or restart one. Which are masters is redis-cli's choice and changes
// with failovers: use NodeForKey to find the master serving a key.
func (c *Cluster) Nodes() []*Server { return append([]*Server(nil), c.nodes...) }

// Client returns a cluster client with ContextTimeoutEnabled, closed when the
// test finishes. It returns once writes to a key in every master's slot range
// succeed through it, so the client's slot map is loaded and every master
// accepts writes; the probe keys are deleted again. It fails the test if that
// does not happen within 10s.
//
// The client keeps go-redis's defaults otherwise, so tests see what
// production code sees. One of them matters in fault tests: go-redis reloads
// its slot map on MOVED, ASK or READONLY replies, or every
// ClusterStateReloadInterval (60s), but not when a master refuses
// connections. After killing a master, call ReloadState after each command
// that fails once the cluster has failed over (NodeForKey names the new
// master), or commands for its slots keep dialing the dead node. One call is
// not enough: the reload asks some node for the slot map, and that node may
// not have heard of the failover yet.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 c.Addrs(),
		Password:              c.password,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		err := probeWrites(ctx, cc)
		if err == nil {
			return cc
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: cluster client: writes to every slot range did not succeed within %v: %v", readyTimeout, err)
		case <-tick.C:
		}
	}
}

// probeWrites writes, then deletes, one key in each slot range the cluster
// reports.
func probeWrites(ctx context.Context, cc *redis.ClusterClient) error {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ranges, err := cc.ClusterSlots(cctx).Result()
	if err != nil {
		return err
	}
	for _, r := range ranges {
		key := keyInSlots(r.Start, r.End)
		if err := cc.Set(cctx, key, "probe", 0).Err(); err != nil {
			return fmt.Errorf("SET %s (slot %d): %w", key, Slot(key), err)
		}
		if err := cc.Del(cctx, key).Err(); err != nil {
			return fmt.Errorf("DEL %s (slot %d): %w", key, Slot(key), err)
		}
	}
	return nil
}

// keyInSlots returns a key whose slot lies in [start, end]. The search ends:
// keys of this form cover every one of the 16384 slots within a few hundred
// thousand tries.
func keyInSlots(start, end int) string {
	for i := 0; ; i++ {
		k := "redistest:probe:" + strconv.Itoa(i)
		if s := Slot(k); s >= start && s <= end {
			return k
		}
	}
}

// NodeForKey returns the node that the first running, unpaused node says is
// the master serving key's slot now; during a failover the answer may lag. It
// fails the test when no node answers or the master is not one of the
// cluster's nodes.
func (c *Cluster) NodeForKey(t testing.TB, key string) *Server {
	t.Helper()
	slot := Slot(key)
	lastErr := errors.New("every node is stopped or paused")
	for _, s := range c.nodes {
		if !s.answering() {
			continue
		}
		cl := redis.NewClient(&redis.Options{
			Addr: s.Addr(), Password: c.password, MaxRetries: -1, DialerRetries: 1,
			ContextTimeoutEnabled: true,
		})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ranges, err := cl.ClusterSlots(ctx).Result()
		cancel()
		cl.Close()
		if err != nil {
			lastErr = err
			continue
		}
		for _, r := range ranges {
			if slot < r.Start || slot > r.End || len(r.Nodes) == 0 {
				continue
			}
			for _, n := range c.nodes {
				if n.Addr() == r.Nodes[0].Addr {
					return n
				}
			}
			t.Fatalf("redistest: slot %d of %q is served by %s, not a node of this cluster", slot, key, r.Nodes[0].Addr)
		}
		lastErr = fmt.Errorf("slot %d is not served", slot)
	}
	t.Fatalf("redistest: no master found for %q: %v", key, lastErr)
	return nil
}

// Slot returns the Redis Cluster hash slot of key: CRC16 of the key, or of its
// hash tag (the text between the first "{" and the next "}", when not empty),
// modulo 16384. Tests use it to check that keys meant to share a slot do.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % clusterSlots)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the variant
// Redis Cluster uses for key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
