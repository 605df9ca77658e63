package redistest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name the sentinels of StartSentinel monitor their
// master under.
const SentinelMaster = "redistest"

// SentinelDownAfter is how long a sentinel of StartSentinel waits for a
// silent master before it calls it down (down-after-milliseconds). A
// failover takes about this long plus the agreement and promotion steps,
// and up to a second more: while a failover runs, a sentinel sends INFO to
// the replica it promoted once a second (fixed in Redis), and it names the
// new master only once an INFO reply shows the promotion. On Redis 7.0 on
// loopback that came to 2.2-2.3s from kill -9 of the master to the switch.
const SentinelDownAfter = time.Second

// sentinelCount is how many sentinels StartSentinel runs: three, so that
// a majority (two) can still elect a leader and agree on a failover.
const sentinelCount = 3

// sentinelDefaults come before the caller's WithSentinelConfig lines, which
// may override them. %[1]s is the master's name.
var sentinelDefaults = []string{
	"sentinel down-after-milliseconds %[1]s " + strconv.Itoa(int(SentinelDownAfter/time.Millisecond)),
	// failover-timeout bounds one failover attempt, and a failed attempt is
	// retried only after twice this: 180s by default, far too long for a
	// test that is measuring how quickly a failover completes.
	"sentinel failover-timeout %[1]s 3000",
	"sentinel parallel-syncs %[1]s 1",
}

// WithSentinelConfig appends sentinel.conf lines for every sentinel of
// StartSentinel, after the harness's own (down-after 1s, failover-timeout
// 3s, parallel-syncs 1), so they override them; for example
// "sentinel down-after-milliseconds redistest 500". Other servers ignore
// it. The directives WithConfig refuses are refused here too.
func WithSentinelConfig(lines ...string) Option {
	return func(c *config) {
		for _, l := range lines {
			c.sentinel = append(c.sentinel, strings.Split(l, "\n")...)
		}
	}
}

// Sentinel is a master, its replicas and three Redis Sentinels monitoring
// them, all owned by a test.
type Sentinel struct {
	nodes     []*Server // the data servers: the first master, then its replicas
	sentinels []*Server
	password  string
}

// StartSentinel starts a master and replicas replicas of it, then three
// sentinels (redis-server --sentinel) that monitor the master with a quorum
// of two, every process on its own random loopback port. It returns once
// every replica is in sync and every sentinel names the same master, sees
// every replica linked to it and knows both other sentinels, so a failover
// can start as soon as the master fails. Data-node options (WithConfig)
// apply to the master and the replicas; a requirepass line also sets
// masterauth and the sentinels' auth-pass. Sentinel options come from
// WithSentinelConfig.
//
// Like StartCluster it skips or fails the test when redis-server is
// missing, fails the test when the setup is not complete within 30s, and
// kills every process when the test finishes: the sentinels first, so none
// starts a failover while the data servers go down. Every process dies
// with a crashed test binary too, as with Start.
func StartSentinel(t testing.TB, replicas int, opts ...Option) *Sentinel {
	t.Helper()
	if replicas < 1 {
		t.Fatalf("redistest: StartSentinel(%d replicas): a failover needs at least one replica", replicas)
	}
	bin := requireTool(t, "redis-server")
	var user config
	for _, o := range opts {
		o(&user)
	}
	password, err := checkLines(user.lines)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkLines(user.sentinel); err != nil {
		t.Fatal(err)
	}
	if user.movable {
		t.Fatal("redistest: WithMovableClock applies to Start only")
	}
	pick := freePort
	if user.pickPort != nil {
		pick = user.pickPort
	}
	// As in a cluster: no 5s wait before the first full sync.
	data := []string{"repl-diskless-sync-delay 0"}
	if password != "" {
		// Every node may become a replica of another after a failover.
		data = append(data, "masterauth "+quoteArg(password))
	}
	data = append(data, user.lines...)

	sn := &Sentinel{password: password}
	master := sn.startNode(t, bin, config{lines: data, pickPort: pick})
	replicaLines := append([]string{"replicaof 127.0.0.1 " + strconv.Itoa(master.Port())}, data...)
	for range replicas {
		sn.startNode(t, bin, config{lines: replicaLines, pickPort: pick})
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	// A sentinel learns the replicas from the master's INFO, asked at once
	// when it connects and then every 10s: start the sentinels only once the
	// master lists every replica, or the first INFO may miss one.
	if err := sn.waitReplicated(ctx, master); err != nil {
		t.Fatal(err)
	}

	lines := []string{fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", SentinelMaster, master.Port())}
	for _, l := range sentinelDefaults {
		lines = append(lines, fmt.Sprintf(l, SentinelMaster))
	}
	if password != "" {
		lines = append(lines, fmt.Sprintf("sentinel auth-pass %s %s", SentinelMaster, quoteArg(password)))
	}
	lines = append(lines, user.sentinel...)
	for range sentinelCount {
		s, err := newServer(t, bin, config{lines: lines})
		if err != nil {
			t.Fatal(err)
		}
		s.args = []string{"--sentinel"}
		if err := s.startFresh(pick); err != nil {
			t.Fatal(err)
		}
		sn.sentinels = append(sn.sentinels, s)
	}
	if err := sn.waitAgreed(ctx, master); err != nil {
		t.Fatal(err)
	}
	return sn
}

func (sn *Sentinel) startNode(t testing.TB, bin string, cfg config) *Server {
	t.Helper()
	s, err := newServer(t, bin, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.startFresh(cfg.pickPort); err != nil {
		t.Fatal(err)
	}
	sn.nodes = append(sn.nodes, s)
	return s
}

// waitReplicated polls until master lists every replica and every replica's
// link to it is up.
func (sn *Sentinel) waitReplicated(ctx context.Context, master *Server) error {
	return poll(ctx, "replicas not in sync with the master", func(ctx context.Context) (string, bool) {
		var b strings.Builder
		ok := true
		for _, n := range sn.nodes {
			info, err := sn.nodeInfo(ctx, n, "replication")
			if err != nil {
				fmt.Fprintf(&b, "%s: %v\n", n.Addr(), err)
				ok = false
				continue
			}
			f := infoFields(info)
			fmt.Fprintf(&b, "%s: role=%s connected_slaves=%s master_link_status=%s\n",
				n.Addr(), f["role"], f["connected_slaves"], f["master_link_status"])
			switch {
			case n == master:
				ok = ok && f["role"] == "master" && f["connected_slaves"] == strconv.Itoa(len(sn.nodes)-1)
			default:
				ok = ok && f["role"] == "slave" && f["master_link_status"] == "up"
			}
		}
		return b.String(), ok
	})
}

// waitAgreed polls every sentinel until each names master, counts every
// replica as a linked replica and knows the other sentinels.
func (sn *Sentinel) waitAgreed(ctx context.Context, master *Server) error {
	return poll(ctx, "sentinels not agreed on the master, its replicas and each other", func(ctx context.Context) (string, bool) {
		var b strings.Builder
		ok := true
		for _, s := range sn.sentinels {
			m, err := sentinelMaster(ctx, s)
			if err != nil {
				fmt.Fprintf(&b, "sentinel %s: %v\n", s.Addr(), err)
				ok = false
				continue
			}
			fmt.Fprintf(&b, "sentinel %s: master %s:%s flags=%s num-slaves=%s num-other-sentinels=%s\n",
				s.Addr(), m["ip"], m["port"], m["flags"], m["num-slaves"], m["num-other-sentinels"])
			ok = ok && m["ip"] == "127.0.0.1" && m["port"] == strconv.Itoa(master.Port()) && m["flags"] == "master" &&
				m["num-slaves"] == strconv.Itoa(len(sn.nodes)-1) && m["num-other-sentinels"] == strconv.Itoa(sentinelCount-1)
			reps, err := sentinelReplicas(ctx, s)
			if err != nil {
				fmt.Fprintf(&b, "  replicas: %v\n", err)
				ok = false
				continue
			}
			for _, r := range reps {
				fmt.Fprintf(&b, "  replica %s:%s flags=%s master-link-status=%s\n", r["ip"], r["port"], r["flags"], r["master-link-status"])
				ok = ok && r["flags"] == "slave" && r["master-link-status"] == "ok"
			}
		}
		return b.String(), ok
	})
}

// poll runs check every pollInterval, each time with a second to answer,
// until it reports done or ctx ends; the error then carries what and
// check's last summary. No event says that other processes have reached a
// state, so polling is the honest tool here.
func poll(ctx context.Context, what string, check func(context.Context) (string, bool)) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		status, ok := check(cctx)
		cancel()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: %s: %w:\n%s", what, ctx.Err(), status)
		case <-tick.C:
		}
	}
}

// nodeInfo runs INFO section on data node n over a short-lived connection.
func (sn *Sentinel) nodeInfo(ctx context.Context, n *Server, section string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), Password: sn.password, MaxRetries: -1, DialerRetries: 1,
		PoolSize: 1, ContextTimeoutEnabled: true})
	defer c.Close()
	return c.Info(ctx, section).Result()
}

// sentinelDo runs one command on sentinel s over a short-lived connection.
// The sentinels of this harness have no password of their own.
func sentinelDo(ctx context.Context, s *Server, args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialerRetries: 1, PoolSize: 1,
		ContextTimeoutEnabled: true, Protocol: 2})
	defer c.Close()
	return c.Do(ctx, args...).Result()
}

// sentinelMaster returns SENTINEL MASTER's fields for the monitored master.
func sentinelMaster(ctx context.Context, s *Server) (map[string]string, error) {
	v, err := sentinelDo(ctx, s, "SENTINEL", "MASTER", SentinelMaster)
	if err != nil {
		return nil, err
	}
	return pairs(v)
}

// sentinelReplicas returns SENTINEL REPLICAS's fields, one map per replica.
func sentinelReplicas(ctx context.Context, s *Server) ([]map[string]string, error) {
	v, err := sentinelDo(ctx, s, "SENTINEL", "REPLICAS", SentinelMaster)
	if err != nil {
		return nil, err
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("SENTINEL REPLICAS replied %T", v)
	}
	out := make([]map[string]string, 0, len(list))
	for _, e := range list {
		m, err := pairs(e)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// pairs decodes a RESP2 flat array of field names and values.
func pairs(v any) (map[string]string, error) {
	list, ok := v.([]any)
	if !ok || len(list)%2 != 0 {
		return nil, fmt.Errorf("want a flat array of field-value pairs, got %T", v)
	}
	m := make(map[string]string, len(list)/2)
	for i := 0; i < len(list); i += 2 {
		k, kok := list[i].(string)
		val, vok := list[i+1].(string)
		if !kok || !vok {
			return nil, fmt.Errorf("field %d is %T=%T, want strings", i/2, list[i], list[i+1])
		}
		m[k] = val
	}
	return m, nil
}

// MasterName returns the name the sentinels monitor the master under, the
// FailoverOptions.MasterName of a client.
func (sn *Sentinel) MasterName() string { return SentinelMaster }

// SentinelAddrs returns every sentinel's "127.0.0.1:port".
func (sn *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(sn.sentinels))
	for i, s := range sn.sentinels {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Sentinels returns the sentinel processes, so a test can stop or pause
// one. A sentinel rewrites its own config file; Restart writes the
// harness's again, so a restarted sentinel forgets what it learnt and
// relearns it from the master it was first told to monitor.
func (sn *Sentinel) Sentinels() []*Server { return append([]*Server(nil), sn.sentinels...) }

// Nodes returns the data servers: the first master, then its replicas.
// Which one is master changes with failovers: use Master.
func (sn *Sentinel) Nodes() []*Server { return append([]*Server(nil), sn.nodes...) }

// Master returns the data server that the first answering sentinel names
// as master now (SENTINEL GET-MASTER-ADDR-BY-NAME). During a failover the
// answer is the old master until the sentinels switch. It fails the test
// when no sentinel answers or the address is not one of the data servers.
func (sn *Sentinel) Master(t testing.TB) *Server {
	t.Helper()
	addr, err := sn.masterAddr(context.Background())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	for _, n := range sn.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	t.Fatalf("redistest: the sentinels name %s as master, not a node of this setup", addr)
	return nil
}

func (sn *Sentinel) masterAddr(ctx context.Context) (string, error) {
	lastErr := errors.New("every sentinel is stopped or paused")
	for _, s := range sn.sentinels {
		if !s.answering() {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		v, err := sentinelDo(cctx, s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster)
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		hp, ok := v.([]any)
		if !ok || len(hp) != 2 {
			lastErr = fmt.Errorf("sentinel %s: GET-MASTER-ADDR-BY-NAME replied %v", s.Addr(), v)
			continue
		}
		host, _ := hp[0].(string)
		port, _ := hp[1].(string)
		return host + ":" + port, nil
	}
	return "", fmt.Errorf("no sentinel names a master: %w", lastErr)
}

// Debug sets Sentinel's internal timings on every answering sentinel with
// SENTINEL DEBUG (Redis 7.0 and later), for example
// Debug(t, "ping-period", "100", "ask-period", "100"). These are knobs
// Redis provides for its own tests; production sentinels keep their
// defaults. Not every period is among them: the one-second INFO to
// replicas while a failover runs is fixed, whatever info-period says (that
// applies otherwise). It fails the test when a sentinel refuses.
func (sn *Sentinel) Debug(t testing.TB, paramValues ...string) {
	t.Helper()
	if len(paramValues) == 0 || len(paramValues)%2 != 0 {
		t.Fatalf("redistest: Debug wants parameter-value pairs, got %q", paramValues)
	}
	args := []any{"SENTINEL", "DEBUG"}
	for _, p := range paramValues {
		args = append(args, p)
	}
	for _, s := range sn.sentinels {
		if !s.answering() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := sentinelDo(ctx, s, args...)
		cancel()
		if err != nil {
			t.Fatalf("redistest: sentinel %s: SENTINEL DEBUG %q: %v", s.Addr(), paramValues, err)
		}
	}
}

// Client returns a client of the monitored master through the sentinels
// (redis.NewFailoverClient) with ContextTimeoutEnabled, closed when the test
// finishes. It returns once a write through it succeeds, and fails the test
// if none does within 10s.
//
// The client keeps go-redis's defaults otherwise. After the master fails it
// finds the new one through the sentinels: by asking one when a dial fails,
// and by the +switch-master event it subscribes to.
func (sn *Sentinel) Client(t testing.TB) *redis.Client {
	t.Helper()
	return sn.ClientWith(t, nil)
}

// ClientWith is Client with options changed by set (nil: none) before the
// client is made.
func (sn *Sentinel) ClientWith(t testing.TB, set func(*redis.FailoverOptions)) *redis.Client {
	t.Helper()
	opt := &redis.FailoverOptions{
		MasterName:            SentinelMaster,
		SentinelAddrs:         sn.SentinelAddrs(),
		Password:              sn.password,
		ContextTimeoutEnabled: true,
	}
	if set != nil {
		set(opt)
	}
	c := redis.NewFailoverClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	err := poll(ctx, "no write through the failover client succeeded", func(ctx context.Context) (string, bool) {
		if err := c.Set(ctx, "redistest:probe", "probe", 0).Err(); err != nil {
			return err.Error(), false
		}
		return "", c.Del(ctx, "redistest:probe").Err() == nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
