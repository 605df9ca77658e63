package redisstore_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/recpack"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/luascripts"
	"github.com/runbudget/runbudget/redisstore"
)

// testClock is a fake time for a store and its scripts.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock { return &testClock{now: time.Unix(1_900_000_000, 0)} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) step(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// scriptFaults fails calls of one budget script on purpose: before they
// are sent (nothing runs), or after Redis ran them (the reply is lost).
type scriptFaults struct {
	mu     sync.Mutex
	before map[string]int // script name -> calls to fail before sending
	after  map[string]int // script name -> replies to lose
	calls  map[string]int // script name -> calls seen
}

func newScriptFaults() *scriptFaults {
	return &scriptFaults{before: map[string]int{}, after: map[string]int{}, calls: map[string]int{}}
}

func (f *scriptFaults) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *scriptFaults) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// script names the budget script cmd calls, by its library function name
// (rb_<tag>_<script>), or "" for anything else.
func (f *scriptFaults) script(cmd redis.Cmder) string {
	args := cmd.Args()
	if len(args) < 2 || cmd.Name() != "fcall" {
		return ""
	}
	fn, _ := args[1].(string)
	if i := strings.LastIndex(fn, "_"); i >= 0 && strings.HasPrefix(fn, "rb_") {
		return fn[i+1:]
	}
	return ""
}

func (f *scriptFaults) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := f.script(cmd)
		f.mu.Lock()
		f.calls[name]++
		failBefore := f.before[name] > 0
		if failBefore {
			f.before[name]--
		}
		f.mu.Unlock()
		if failBefore {
			cmd.SetErr(&net.OpError{Op: "write", Net: "tcp", Err: errors.New("not sent (test)")})
			return cmd.Err()
		}
		err := next(ctx, cmd)
		f.mu.Lock()
		lose := err == nil && f.after[name] > 0
		if lose {
			f.after[name]--
		}
		f.mu.Unlock()
		if lose {
			cmd.SetErr(&net.OpError{Op: "read", Net: "tcp", Err: errors.New("reply lost (test)")})
			return cmd.Err()
		}
		return err
	}
}

func (f *scriptFaults) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *scriptFaults) set(m map[string]int, name string, n int) {
	f.mu.Lock()
	m[name] = n
	f.mu.Unlock()
}

// sessionStore opens a bare store of budget name on c with lease TTL ttl
// and, when clock is set, the test clock, with limits of n slots.
func sessionStore(t *testing.T, c redis.UniversalClient, name string, ttl time.Duration, clock *testClock, n int) *redisstore.Store {
	t.Helper()
	opts := []redisstore.Option{redisstore.WithLeaseTTL(ttl)}
	if clock != nil {
		opts = append(opts, redisstore.WithTestClock(clock.Now))
	}
	s, err := redisstore.New(c, name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Register(context.Background(), slots(n), false); err != nil {
		t.Fatal(err)
	}
	return s
}

// twoHosts starts a Redis and opens two bare stores of budget name on it,
// sharing one test clock, with lease TTL ttl and n slots.
func twoHosts(t *testing.T, name string, ttl time.Duration, n int) (redis.UniversalClient, *testClock, *redisstore.Store, *redisstore.Store) {
	t.Helper()
	c := redistest.Start(t).Client(t)
	clock := newTestClock()
	return c, clock, sessionStore(t, c, name, ttl, clock, n), sessionStore(t, c, name, ttl, clock, n)
}

// handOff retires lease id of holder, which hands its slot to the waiter
// queued as att, and waits for the waiter's wake event.
func handOff(t *testing.T, holder *redisstore.Store, id string, att budget.Attempt) {
	t.Helper()
	if err := holder.Retire(context.Background(), id, lease.All); err != nil {
		t.Fatal(err)
	}
	select {
	case <-att.Wake:
	case <-time.After(10 * time.Second):
		t.Fatal("no wake event for the handoff")
	}
}

func grantNow(t *testing.T, s *redisstore.Store, id string) budget.Attempt {
	t.Helper()
	req, _ := get(dom("a")).Normalize()
	att, err := s.TryAcquire(context.Background(), id, req)
	if err != nil || att.Outcome != budget.Granted {
		t.Fatalf("TryAcquire(%s) = %+v, %v; want granted", id, att, err)
	}
	return att
}

// queueNow makes waiter id's first call for r on s, which must queue.
func queueNow(t *testing.T, s *redisstore.Store, id string, r budget.Request) budget.Attempt {
	t.Helper()
	req, _ := r.Normalize()
	att, err := s.TryAcquire(context.Background(), id, req)
	if err != nil || att.Outcome != budget.Queued {
		t.Fatalf("TryAcquire(%s) = %+v, %v; want queued", id, att, err)
	}
	return att
}

// sessionLeases counts the lease ids in a session's set, which also keeps
// an empty member of its own (lib.lua, join).
// sessionLeases counts the leases in a session's hash (key), which has
// one field that is no lease (lib.lua, lease_put).
func sessionLeases(c redis.UniversalClient, key string) int {
	n := 0
	for f := range c.HGetAll(context.Background(), key).Val() {
		if f != "" {
			n++
		}
	}
	return n
}

func inFlightOf(t *testing.T, s *redisstore.Store) int {
	t.Helper()
	u, err := s.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return domainOf(u, dom("a")).InFlight[budget.OpGet]
}

// TestDeadSessionReclaimedInBoundedSteps: a crashed process's session of 40
// leases is reclaimed 16 leases per script (the bound every script keeps),
// each script going on where the last stopped (reclaim stays due while a
// dead session has leases left), and then ended.
func TestDeadSessionReclaimedInBoundedSteps(t *testing.T) {
	ctx := context.Background()
	const ttl = time.Second
	c, clock, dead, live := twoHosts(t, "bounded", ttl, 100)
	for i := range 40 {
		grantNow(t, dead, fmt.Sprintf("d%d", i))
	}
	p := "rb:{" + hex.EncodeToString([]byte("bounded")) + "}:"
	sid := redisstore.SessionID(dead)
	clock.step(ttl / 2)
	if n := inFlightOf(t, live); n != 40 {
		t.Fatalf("in flight before the deadline: %d, want 40", n)
	}
	clock.step(ttl/2 + time.Millisecond) // past the session's deadline
	for _, want := range []int{24, 8, 0} {
		if n := inFlightOf(t, live); n != want {
			t.Fatalf("in flight after one more script: %d, want %d (16 leases reclaimed per script)", n, want)
		}
		if n := sessionLeases(c, redistest.LeaseKey(ctx, c, p, sid)); n != want {
			t.Fatalf("dead session's hash holds %d, want %d", n, want)
		}
	}
	// The last script found 8 left, fewer than its bound: the session is
	// ended, and its name kept so that nothing renews or re-creates it.
	if c.ZScore(ctx, p+"sexp", sid).Err() == nil || c.ZScore(ctx, p+"sgone", sid).Err() != nil {
		t.Fatalf("session not ended: sexp %v, sgone %v", c.ZRange(ctx, p+"sexp", 0, -1).Val(), c.ZRange(ctx, p+"sgone", 0, -1).Val())
	}
	if recs, _ := redistest.Leases(ctx, c, p); len(recs) != 0 || c.Exists(ctx, redistest.LeaseKey(ctx, c, p, sid)).Val() != 0 {
		t.Fatalf("%d lease records left, or the ended session's hash", len(recs))
	}
	// The dead process, back, hears of it on its next call and starts a new
	// session: its old leases are missing, a new grant works.
	if missing, err := dead.Heartbeat(ctx, []string{"d0", "d1"}); err != nil || len(missing) != 2 {
		t.Fatalf("Heartbeat of the dead session: missing %v, %v; want both", missing, err)
	}
	grantNow(t, dead, "again")
	if next := redisstore.SessionID(dead); next == sid || !c.HExists(ctx, redistest.LeaseKey(ctx, c, p, next), "again").Val() {
		t.Fatalf("new grant not in a new session: %q (dead one %q)", next, sid)
	}
}

// TestGrantAgeCountsFromSessionRenewal: a lease lives as long as its
// session, so a grant reports as its age the part of the session's TTL
// already spent, and a grant into a session with less than two thirds of
// a TTL left extends it; a process whose session went a TTL unconfirmed
// starts a new one without a round trip to learn it.
func TestGrantAgeCountsFromSessionRenewal(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	faults := newScriptFaults()
	c.AddHook(faults)
	clock := newTestClock()
	const ttl = 30 * time.Second
	s := sessionStore(t, c, "ages", ttl, clock, 100)
	p := "rb:{" + hex.EncodeToString([]byte("ages")) + "}:"
	deadline := func() time.Time {
		t.Helper()
		v, err := c.ZScore(ctx, p+"sexp", redisstore.SessionID(s)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return time.UnixMicro(int64(v))
	}
	if a := grantNow(t, s, "l1"); a.GrantedAgo != 0 {
		t.Errorf("first grant (new session): age %v, want 0", a.GrantedAgo)
	}
	start := clock.Now()
	if d := deadline(); !d.Equal(start.Add(ttl)) {
		t.Fatalf("new session's deadline %v, want %v", d, start.Add(ttl))
	}
	clock.step(5 * time.Second)
	if a := grantNow(t, s, "l2"); a.GrantedAgo != 5*time.Second {
		t.Errorf("grant 5s into the session: age %v, want 5s", a.GrantedAgo)
	}
	if d := deadline(); !d.Equal(start.Add(ttl)) {
		t.Errorf("a grant with two thirds left moved the deadline to %v", d)
	}
	clock.step(6 * time.Second) // 11 s spent: less than two thirds left
	if a := grantNow(t, s, "l3"); a.GrantedAgo != 0 {
		t.Errorf("grant that extends the session: age %v, want 0", a.GrantedAgo)
	}
	if d, want := deadline(), clock.Now().Add(ttl); !d.Equal(want) {
		t.Errorf("extended deadline %v, want %v", d, want)
	}
	sid := redisstore.SessionID(s)
	for _, id := range []string{"l1", "l2", "l3"} {
		if err := s.Retire(ctx, id, lease.All); err != nil {
			t.Fatal(err)
		}
	}
	clock.step(ttl) // no lease, no beat: the session is never confirmed again
	before := faults.count("acquire")
	grantNow(t, s, "l4")
	if n := faults.count("acquire") - before; n != 1 {
		t.Errorf("grant after a TTL without renewal took %d calls, want 1", n)
	}
	if next := redisstore.SessionID(s); next == sid {
		t.Errorf("still session %q after a TTL without renewal", sid)
	}
	if err := s.Retire(ctx, "l4", lease.All); err != nil {
		t.Fatal(err)
	}
}

// TestFailedCancelRetriedByHeartbeat: a grant whose reply was lost, and
// whose cancellation never reached Redis, would hold its slot as long as
// the process's session lives; the next heartbeat cancels it again.
func TestFailedCancelRetriedByHeartbeat(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	faults := newScriptFaults()
	c.AddHook(faults)
	ctx := context.Background()
	s := sessionStore(t, c, "orphan", time.Minute, nil, 4)
	if !redisstore.UsesLibrary(s) {
		t.Skip("the fault hook names scripts by their library functions")
	}
	grantNow(t, s, "held")
	req, _ := get(dom("a")).Normalize()
	faults.set(faults.after, "acquire", 1)
	if _, err := s.TryAcquire(ctx, "orphan", req); !errors.Is(err, budget.ErrUnavailable) {
		t.Fatalf("TryAcquire with its reply lost: %v, want ErrUnavailable", err)
	}
	faults.set(faults.before, "cancel", 1)
	if err := s.Cancel(ctx, "orphan"); err == nil {
		t.Fatal("Cancel that never reached Redis reported success")
	}
	if n := inFlightOf(t, s); n != 2 {
		t.Fatalf("in flight with the orphaned grant: %d, want 2", n)
	}
	if missing, err := s.Heartbeat(ctx, []string{"held"}); err != nil || len(missing) != 0 {
		t.Fatalf("Heartbeat: %v %v", missing, err)
	}
	if n := inFlightOf(t, s); n != 1 {
		t.Fatalf("in flight after the heartbeat: %d, want 1 (the orphan cancelled)", n)
	}
	if err := s.Retire(ctx, "held", lease.All); err != nil {
		t.Fatal(err)
	}
}

// TestDroppedLeaseReportedUntilAcknowledged: the heartbeat that tells a
// holder of a dropped lease may lose its reply; the next one tells it
// again, and only a beat that acknowledges it clears it.
func TestDroppedLeaseReportedUntilAcknowledged(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	faults := newScriptFaults()
	c.AddHook(faults)
	ctx := context.Background()
	s := sessionStore(t, c, "acked", time.Minute, nil, 4)
	if !redisstore.UsesLibrary(s) {
		t.Skip("the fault hook names scripts by their library functions")
	}
	grantNow(t, s, "kept")
	grantNow(t, s, "dropped")
	admin, err := redisstore.NewAdmin(c)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := admin.DropLeases(ctx, "acked", "test", true); err != nil || n != 2 {
		t.Fatalf("DropLeases: %d %v", n, err)
	}
	ids := []string{"kept", "dropped"}
	faults.set(faults.after, "heartbeat", 1)
	if _, err := s.Heartbeat(ctx, ids); err == nil {
		t.Fatal("heartbeat with its reply lost reported success")
	}
	missing, err := s.Heartbeat(ctx, ids)
	if err != nil || len(missing) != 2 {
		t.Fatalf("heartbeat after a lost reply: missing %v, %v; want both dropped leases", missing, err)
	}
	p := "rb:{" + hex.EncodeToString([]byte("acked")) + "}:"
	sd := p + "sd:" + redisstore.SessionID(s)
	if n := c.SCard(ctx, sd).Val(); n != 2 {
		t.Fatalf("dropped set before the acknowledging beat: %d, want 2", n)
	}
	grantNow(t, s, "new")
	if missing, err := s.Heartbeat(ctx, []string{"new"}); err != nil || len(missing) != 0 {
		t.Fatalf("heartbeat: %v %v", missing, err)
	}
	if n := c.SCard(ctx, sd).Val(); n != 0 {
		t.Fatalf("dropped set after the acknowledging beat: %d, want 0", n)
	}
	if err := s.Retire(ctx, "new", lease.All); err != nil {
		t.Fatal(err)
	}
}

// TestGrantMovesToTheSessionNamed: a lease granted in an earlier session of
// the process (its reply was lost, or a handoff granted it while the
// process gave that session up) is collected by a call naming the current
// session, and moves there, without a second grant.
func TestGrantMovesToTheSessionNamed(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	b := open(t, c, "move", slots(1), time.Hour) // registers the budget
	p := "rb:{" + hex.EncodeToString([]byte("move")) + "}:"
	cfg := []string{p + "cfg"}
	src := luascripts.Source("acquire")
	// The second call names the first's session as its previous one
	// (ARGV[12+n]), where the grant is.
	call := func(sid string) []string {
		t.Helper()
		res, err := c.Eval(ctx, src, cfg, "PUBLISH", "600000", "", "w1", "proc", sid, "2", "0", "c", "60000", "1", "1.61", "proc.0").StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := call("proc.0"); res[0] != "1" {
		t.Fatalf("first call: %q, want granted", res)
	}
	if res := call("proc.1"); res[0] != "1" {
		t.Fatalf("call naming the next session: %q, want granted", res)
	}
	k0, k1 := redistest.LeaseKey(ctx, c, p, "proc.0"), redistest.LeaseKey(ctx, c, p, "proc.1")
	if c.HExists(ctx, k0, "w1").Val() || !c.HExists(ctx, k1, "w1").Val() {
		t.Errorf("lease not moved: proc.0 %v, proc.1 %v", c.HKeys(ctx, k0).Val(), c.HKeys(ctx, k1).Val())
	}
	rec := c.HGet(ctx, k1, "w1").Val()
	if l, err := recpack.DecodeLease(rec); err != nil || l.Session != "proc.1" {
		t.Errorf("lease record %q (%+v, %v) does not name its new session", rec, l, err)
	}
	u := usage(t, b)
	if n := domainOf(u, budget.Domain{Version: 1, ID: "a"}).InFlight[budget.OpGet]; n != 1 {
		t.Errorf("in flight: %d, want 1 (granted once)", n)
	}
}

// TestHeartbeatCostFlat: a beat runs the same Redis commands whatever the
// number of leases in the session.
func TestHeartbeatCostFlat(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	admin := srv.Client(t)
	ctx := context.Background()
	// A clock that stands still: reclaim's once-a-second scan never falls
	// inside the beats measured.
	s := sessionStore(t, c, "flat", time.Hour, newTestClock(), 100_000)
	var ids []string
	perBeat := func() int64 {
		t.Helper()
		if _, err := s.Heartbeat(ctx, ids); err != nil { // settles what a first beat renews
			t.Fatal(err)
		}
		before := commandStats(t, admin)
		const beats = 10
		for range beats {
			if missing, err := s.Heartbeat(ctx, ids); err != nil || len(missing) != 0 {
				t.Fatalf("Heartbeat: %v %v", missing, err)
			}
		}
		after := commandStats(t, admin)
		var n int64
		for k, v := range after {
			if k != "info" && k != "fcall" && k != "evalsha" {
				n += v - before[k]
			}
		}
		return n / beats
	}
	grow := func(to int) {
		for len(ids) < to {
			id := fmt.Sprintf("l%d", len(ids))
			grantNow(t, s, id)
			ids = append(ids, id)
		}
	}
	grow(1)
	one := perBeat()
	grow(2000)
	many := perBeat()
	t.Logf("Redis commands inside one heartbeat: %d with 1 lease, %d with 2000", one, many)
	if many != one {
		t.Errorf("a beat of 2000 leases runs %d commands, one of 1 lease %d: want the same", many, one)
	}
}

// TestHandoffExtendsSessionOnlyAsFarAsTheWaiterVouches: a handoff grants a
// queued waiter into its process's session, extending the session when
// little of it is left, but no further than the waiter's own liveness
// deadline: a process that crashed with leases held and a waiter queued
// gets its slots back within a TTL of its last call.
func TestHandoffExtendsSessionOnlyAsFarAsTheWaiterVouches(t *testing.T) {
	ctx := context.Background()
	const ttl = 30 * time.Second
	c, clock, dead, live := twoHosts(t, "vouch", ttl, 2)
	t0 := clock.Now()
	grantNow(t, dead, "held")
	grantNow(t, live, "other")
	clock.step(ttl / 2)
	req, _ := get(dom("a")).Normalize()
	if att, err := dead.TryAcquire(ctx, "queued", req); err != nil || att.Outcome != budget.Queued {
		t.Fatalf("waiter: %+v %v", att, err)
	}
	vouched := clock.Now().Add(ttl) // the waiter's liveness deadline
	clock.step(ttl / 10)
	if err := live.Retire(ctx, "other", lease.All); err != nil { // hands the slot to the waiter
		t.Fatal(err)
	}
	p := "rb:{" + hex.EncodeToString([]byte("vouch")) + "}:"
	sid := redisstore.SessionID(dead)
	if k := redistest.LeaseKey(ctx, c, p, sid); !c.HExists(ctx, k, "queued").Val() {
		t.Fatalf("the handoff did not grant the waiter into its session: %v", c.HKeys(ctx, k).Val())
	}
	got, err := c.ZScore(ctx, p+"sexp", sid).Result()
	if err != nil {
		t.Fatal(err)
	}
	if d := time.UnixMicro(int64(got)); !d.Equal(vouched) {
		t.Errorf("session deadline after the handoff: %v after the first grant, want %v (the waiter's liveness), not %v (a TTL from the handoff)",
			d.Sub(t0), vouched.Sub(t0), clock.Now().Add(ttl).Sub(t0))
	}
}

// TestHandoffAgeCountsFromTheWaitersCall: a waiter last heard of a third of
// a TTL before a handoff grants it gets a lease whose age is that third,
// counted from its call, and whose keeper deadline (grant - age + TTL)
// still falls no later than the session's deadline in Redis. An age that
// also counted the session's spent TTL from the call, as the wake message
// once did, made it two thirds: under load, a lease its keeper gave up
// before the next heartbeat, or that Acquire refused as stale.
func TestHandoffAgeCountsFromTheWaitersCall(t *testing.T) {
	ctx := context.Background()
	const ttl = 30 * time.Second
	c, clock, holder, waiter := twoHosts(t, "handage", ttl, 1)
	grantNow(t, holder, "held")
	req, _ := get(dom("a")).Normalize()
	att, err := waiter.TryAcquire(ctx, "w", req)
	if err != nil || att.Outcome != budget.Queued {
		t.Fatalf("waiter: %+v %v", att, err)
	}
	called := clock.Now()
	clock.step(ttl / 3)
	handOff(t, holder, "held", att)
	got, err := waiter.TryAcquire(ctx, "w", req)
	if err != nil || got.Outcome != budget.Granted {
		t.Fatalf("after the handoff: %+v %v", got, err)
	}
	if want := clock.Now().Sub(called); got.GrantedAgo != want {
		t.Errorf("handoff grant's age %v, want %v (since the waiter's call)", got.GrantedAgo, want)
	}
	p := "rb:{" + hex.EncodeToString([]byte("handage")) + "}:"
	d, err := c.ZScore(ctx, p+"sexp", redisstore.SessionID(waiter)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if keeper, session := clock.Now().Add(ttl-got.GrantedAgo), time.UnixMicro(int64(d)); keeper.After(session) {
		t.Errorf("the keeper would count the lease alive until %v, past its session's deadline %v", keeper, session)
	}
}

// TestHandoffLeavesTheSession: a handoff grants into the waiter's
// session as it is, without extending it (its process may have died since
// its last call: a dead process's waiters must not keep its session, and
// with it their leases, alive by being granted), and the waiter counts its
// lease from the session's own last confirmed renewal, here the grant that
// opened it. A join that finds less than two thirds of a TTL left extends
// the session, as a grant does ("late"); one that finds more leaves it
// ("early").
func TestHandoffLeavesTheSession(t *testing.T) {
	const ttl = 30 * time.Second
	for _, tc := range []struct {
		name   string
		called time.Duration // when the waiter queues, after its session opened
		extend bool          // the join extends the session
	}{
		{"early", ttl / 5, false},
		{"late", ttl / 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c, clock, holder, waiter := twoHosts(t, tc.name, ttl, 2)
			grantNow(t, holder, "held")
			grantNow(t, waiter, "mine") // opens the waiter's session: deadline a TTL from now
			opened := clock.Now()
			clock.step(tc.called)
			att := queueNow(t, waiter, "queued", get(dom("a")))
			called := clock.Now()
			wantDeadline, basis := opened.Add(ttl), opened
			if tc.extend {
				wantDeadline, basis = called.Add(ttl), called
			}
			clock.step(ttl / 10)
			handOff(t, holder, "held", att)
			p := "rb:{" + hex.EncodeToString([]byte(tc.name)) + "}:"
			d, err := c.ZScore(ctx, p+"sexp", redisstore.SessionID(waiter)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got := time.UnixMicro(int64(d)); !got.Equal(wantDeadline) {
				t.Errorf("session deadline after the handoff %v, want %v", got.Sub(opened), wantDeadline.Sub(opened))
			}
			req, _ := get(dom("a")).Normalize()
			got, err := waiter.TryAcquire(ctx, "queued", req)
			if err != nil || got.Outcome != budget.Granted {
				t.Fatalf("after the handoff: %+v %v", got, err)
			}
			if want := clock.Now().Sub(basis); got.GrantedAgo != want {
				t.Errorf("handoff grant's age %v, want %v", got.GrantedAgo, want)
			}
		})
	}
}
