package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterSlots is the number of hash slots of every Redis Cluster.
const clusterSlots = 16384

// cluster is a Redis Cluster of masters without replicas, each its own
// loopback redis-server started by this program and killed when it ends.
// Master i serves the i-th equal range of slots, so the layout is the same
// in every run.
type cluster struct {
	nodes   []*server
	clients []*redis.Client // one per master: INFO and CLUSTER, never in a measured path
	ranges  [][2]int        // the first and last slot of each master
}

// startCluster starts n masters and forms a Cluster of them the way
// redis-cli --cluster create does without replicas: a distinct config
// epoch per node, each node's slots added, every node introduced to every
// other; then it waits until every node sees the whole cluster ok. Meeting
// every pair directly rather than one node and gossip makes that a matter
// of milliseconds instead of seconds.
func startCluster(ctx context.Context, bin string, n int) (c *cluster, err error) {
	c = &cluster{nodes: make([]*server, n)}
	defer func() {
		if err != nil {
			c.stop()
			c = nil
		}
	}()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { c.nodes[i], errs[i] = startServer(ctx, bin, true) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	for _, s := range c.nodes {
		c.clients = append(c.clients, redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: 2, ContextTimeoutEnabled: true}))
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for i, cl := range c.clients {
		lo, hi := i*clusterSlots/n, (i+1)*clusterSlots/n-1
		c.ranges = append(c.ranges, [2]int{lo, hi})
		if err := cl.Do(cctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return c, fmt.Errorf("CLUSTER SET-CONFIG-EPOCH on %s: %w", c.nodes[i].addr, err)
		}
		if err := cl.ClusterAddSlotsRange(cctx, lo, hi).Err(); err != nil {
			return c, fmt.Errorf("CLUSTER ADDSLOTS %d..%d on %s: %w", lo, hi, c.nodes[i].addr, err)
		}
	}
	for i, cl := range c.clients {
		for j, s := range c.nodes {
			if i == j {
				continue
			}
			host, port, _ := net.SplitHostPort(s.addr)
			if err := cl.ClusterMeet(cctx, host, port).Err(); err != nil {
				return c, fmt.Errorf("CLUSTER MEET %s from %s: %w", s.addr, c.nodes[i].addr, err)
			}
		}
	}
	// No event says a cluster has formed: poll CLUSTER INFO on every node.
	for {
		status, ok := c.formed(cctx)
		if ok {
			return c, nil
		}
		select {
		case <-cctx.Done():
			return c, fmt.Errorf("the Cluster did not form within 30s:\n%s", status)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// formed reports whether every node sees every other and all slots served,
// and a line per node for the error when it never happens.
func (c *cluster) formed(ctx context.Context) (string, bool) {
	var b strings.Builder
	ok := true
	for i, cl := range c.clients {
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", c.nodes[i].addr, err)
			ok = false
			continue
		}
		f := infoFields(info)
		fmt.Fprintf(&b, "%s: state=%s slots_ok=%s known_nodes=%s\n", c.nodes[i].addr, f["cluster_state"], f["cluster_slots_ok"], f["cluster_known_nodes"])
		if f["cluster_state"] != "ok" || f["cluster_slots_ok"] != strconv.Itoa(clusterSlots) || f["cluster_known_nodes"] != strconv.Itoa(len(c.nodes)) {
			ok = false
		}
	}
	return b.String(), ok
}

// stop kills every node. It is safe on a partly started cluster.
func (c *cluster) stop() {
	for _, cl := range c.clients {
		cl.Close()
	}
	for _, s := range c.nodes {
		if s != nil {
			s.stop()
		}
	}
}

// addrs are the masters' addresses, in master order.
func (c *cluster) addrs() []string {
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.addr
	}
	return out
}

// masterOf returns the master that serves key, as Redis says: the key's
// slot from CLUSTER KEYSLOT, its owner from CLUSTER SLOTS (both asked of
// the first master; the cluster has formed, so every node agrees).
func (c *cluster) masterOf(ctx context.Context, key string) (int, error) {
	slot, err := c.clients[0].ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return 0, fmt.Errorf("CLUSTER KEYSLOT %q: %w", key, err)
	}
	ranges, err := c.clients[0].ClusterSlots(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	for _, r := range ranges {
		if int(slot) < r.Start || int(slot) > r.End || len(r.Nodes) == 0 {
			continue
		}
		for i, s := range c.nodes {
			if s.addr == r.Nodes[0].Addr {
				return i, nil
			}
		}
		return 0, fmt.Errorf("slot %d is served by %s, not one of our masters", slot, r.Nodes[0].Addr)
	}
	return 0, fmt.Errorf("slot %d is not served", slot)
}

// keyOn returns a key that master m serves.
func (c *cluster) keyOn(ctx context.Context, m int, prefix string) (string, error) {
	for i := range 100000 {
		k := prefix + strconv.Itoa(i)
		if got, err := c.masterOf(ctx, k); err != nil {
			return "", err
		} else if got == m {
			return k, nil
		}
	}
	return "", fmt.Errorf("no key found on master %d", m)
}

// nodeSnap is what one INFO call tells of a master at one moment.
type nodeSnap struct {
	user, sys float64          // used_cpu_user and used_cpu_sys, seconds
	conns     int64            // total_connections_received
	cmds      stats            // INFO commandstats
	errors    map[string]int64 // INFO errorstats: error replies by type (MOVED, CROSSSLOT, ERR, ...)
	// The context switches of the server's main thread (the event loop),
	// where the system tells them (Linux /proc): voluntary when it went to
	// sleep waiting for work, involuntary when it was preempted.
	switches         bool
	vswitch, iswitch int64
}

func (s nodeSnap) cpu() float64 { return s.user + s.sys }

// snapshot reads a master's CPU, connection, command and error counts in
// one INFO call.
func snapshot(ctx context.Context, c *redis.Client) (nodeSnap, error) {
	info, err := c.Info(ctx, "cpu", "stats", "commandstats", "errorstats").Result()
	if err != nil {
		return nodeSnap{}, fmt.Errorf("INFO: %w", err)
	}
	s := nodeSnap{cmds: parseCommandStats(info), errors: map[string]int64{}}
	f := infoFields(info)
	for k, p := range map[string]*float64{"used_cpu_user": &s.user, "used_cpu_sys": &s.sys} {
		if *p, err = strconv.ParseFloat(f[k], 64); err != nil {
			return nodeSnap{}, fmt.Errorf("INFO cpu %s: %q", k, f[k])
		}
	}
	if s.conns, err = strconv.ParseInt(f["total_connections_received"], 10, 64); err != nil {
		return nodeSnap{}, fmt.Errorf("INFO stats total_connections_received: %q", f["total_connections_received"])
	}
	for k, v := range f {
		if t, ok := strings.CutPrefix(k, "errorstat_"); ok {
			n, _ := strconv.ParseInt(strings.TrimPrefix(v, "count="), 10, 64)
			s.errors[t] = n
		}
	}
	return s, nil
}

// snapshots reads every master.
func (c *cluster) snapshots(ctx context.Context) ([]nodeSnap, error) {
	out := make([]nodeSnap, len(c.clients))
	for i, cl := range c.clients {
		var err error
		if out[i], err = snapshot(ctx, cl); err != nil {
			return nil, fmt.Errorf("master %d: %w", i+1, err)
		}
		out[i].vswitch, out[i].iswitch, out[i].switches = contextSwitches(c.nodes[i].cmd.Process.Pid)
	}
	return out, nil
}

// contextSwitches reads the voluntary and involuntary context switches of
// process pid's main thread from /proc/<pid>/status; ok is false where
// there is no such file (not Linux).
func contextSwitches(pid int) (vol, invol int64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, false
	}
	f := infoFields(string(b))
	vol, err1 := strconv.ParseInt(strings.TrimSpace(f["voluntary_ctxt_switches"]), 10, 64)
	invol, err2 := strconv.ParseInt(strings.TrimSpace(f["nonvoluntary_ctxt_switches"]), 10, 64)
	return vol, invol, err1 == nil && err2 == nil
}

// slotErrors are the error replies by which a Cluster node refuses a call
// that is not for its slots, or not for one slot.
var slotErrors = []string{"MOVED", "ASK", "CROSSSLOT", "TRYAGAIN", "CLUSTERDOWN"}

// clusterErrors is what happened between two snapshots that would show a
// call reaching past one master: error replies of the slotErrors types,
// and script calls refused or failed (commandstats rejected_calls and
// failed_calls of FCALL, EVALSHA and EVAL: a script that reached for a key
// of another slot fails). A redirected script call counts in both. other
// counts the remaining error replies, which say nothing about slots.
func (after nodeSnap) clusterErrors(before nodeSnap) (slot, script, other int64) {
	for k, a := range after.errors {
		if slices.Contains(slotErrors, k) {
			slot += a - before.errors[k]
		} else {
			other += a - before.errors[k]
		}
	}
	for cmd, st := range after.cmds.since(before.cmds) {
		switch cmd {
		case "fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro":
			script += st.Failed + st.Rejected
		}
	}
	return slot, script, other
}

// checkErrorCounting makes master 1 answer three calls that break Cluster
// rules (a key it does not serve: MOVED; two slots in one call:
// CROSSSLOT; a script reaching for a key it did not declare, on another
// master) and checks that INFO errorstats counts all three. Only then does
// a count of zero in a window mean no call was refused or redirected.
func (c *cluster) checkErrorCounting(ctx context.Context) error {
	local, err := c.keyOn(ctx, 0, "bench-errcheck-local-")
	if err != nil {
		return err
	}
	remote, err := c.keyOn(ctx, 1, "bench-errcheck-remote-")
	if err != nil {
		return err
	}
	m := c.clients[0]
	before, err := snapshot(ctx, m)
	if err != nil {
		return err
	}
	calls := []struct {
		what string
		err  error
	}{
		{"GET of a key on another master", m.Get(ctx, remote).Err()},
		{"MSET of keys in two slots", m.MSet(ctx, local, "1", remote, "1").Err()},
		{"a script reading an undeclared key on another master",
			m.Eval(ctx, "return redis.call('GET', ARGV[1])", []string{local}, remote).Err()},
	}
	for _, call := range calls {
		if call.err == nil || errors.Is(call.err, redis.Nil) {
			return fmt.Errorf("error check: %s succeeded on a Cluster node", call.what)
		}
	}
	after, err := snapshot(ctx, m)
	if err != nil {
		return err
	}
	if slot, script, _ := after.clusterErrors(before); slot != 2 || script != 1 {
		return fmt.Errorf("error check: INFO errorstats and commandstats counted %d slot errors (want 2) and %d failed scripts (want 1): a count of zero would prove nothing", slot, script)
	}
	return nil
}

// infoFields parses the "key:value" lines of INFO and CLUSTER INFO.
func infoFields(s string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}
