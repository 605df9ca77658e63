package redisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/dompack"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/luascripts"
)

// Tests of the group commit (batch.go) on a real Redis 7: calls that meet
// an in-flight call of their group go together, each keeps its own reply
// and error, a caller that leaves while queued sends nothing, and an idle
// group sends a call at once, by its caller.

// scriptHook records the script calls a client sends (FCALL and EVALSHA)
// and, while held, stops each FCALL before it leaves: the test then gets
// the call's channel on arrived, and the call goes on once it is closed.
type scriptHook struct {
	mu      sync.Mutex
	calls   []sentCall
	all     []sentCall
	held    bool
	arrived chan chan struct{}
	fail    func(sentCall) error // when set and not nil for a call: its error, sent nowhere
}

type sentCall struct {
	cmd  string // fcall or evalsha
	fn   string // the function called (FCALL)
	args []any  // the script's ARGV
	gid  uint64 // the goroutine that sent it
	at   time.Time
}

func newScriptHook() *scriptHook { return &scriptHook{arrived: make(chan chan struct{})} }

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		name := strings.ToLower(fmt.Sprint(a[0]))
		if name != "fcall" && name != "evalsha" {
			return next(ctx, cmd)
		}
		nk, _ := strconv.Atoi(fmt.Sprint(a[2]))
		c := sentCall{cmd: name, args: a[3+nk:], gid: goid(), at: time.Now()}
		if name == "fcall" {
			c.fn = fmt.Sprint(a[1])
		}
		h.mu.Lock()
		h.calls = append(h.calls, c)
		h.all = append(h.all, c)
		held, fail := h.held && name == "fcall", h.fail
		h.mu.Unlock()
		if held {
			goOn := make(chan struct{})
			h.arrived <- goOn
			<-goOn
			if err := ctx.Err(); err != nil {
				return err // as go-redis gives up a call at its ctx's end
			}
		}
		if fail != nil {
			if err := fail(c); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (h *scriptHook) hold(on bool) {
	h.mu.Lock()
	h.held = on
	h.mu.Unlock()
}

// sent returns the calls recorded since the last reset, and resets.
func (h *scriptHook) sent() []sentCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.calls
	h.calls = nil
	return out
}

// goid is the current goroutine's id, from its stack header.
func goid() uint64 {
	var b [64]byte
	n := runtime.Stack(b[:], false)
	f := strings.Fields(string(b[:n]))
	id, _ := strconv.ParseUint(f[1], 10, 64)
	return id
}

// batchOps reads the operations a batch call carries: each script's name.
func batchOps(t testing.TB, c sentCall) []string {
	t.Helper()
	var out []string
	for i := 0; i < len(c.args); {
		m, err := strconv.Atoi(fmt.Sprint(c.args[i+1]))
		if err != nil {
			t.Fatalf("malformed batch %v", c.args)
		}
		out = append(out, fmt.Sprint(c.args[i]))
		i += 2 + m
	}
	return out
}

// batchStore opens budget name on a new client of srv, with the hook, and
// registers l.
func batchStore(t *testing.T, srv *redistest.Server, name string, l budget.Limits, opts ...Option) (*Store, *scriptHook, *redis.Client) {
	t.Helper()
	c := srv.Client(t)
	h := newScriptHook()
	c.AddHook(h)
	s, err := New(c, name, append([]Option{WithLeaseTTL(10 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	// Calls are held at the hook for as long as a test needs: none of
	// them is stuck.
	s.stuck = time.Hour
	t.Cleanup(func() { s.Close() })
	if err := s.Register(context.Background(), l, false); err != nil {
		t.Fatal(err)
	}
	h.sent()
	return s, h, c
}

// queued waits until n calls wait in g's queue.
func queued(t *testing.T, g *group, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.commit.mu.Lock()
		k := len(g.commit.queue)
		g.commit.mu.Unlock()
		if k == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", k, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func fcalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_fcall:calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

func getReq(ids ...string) budget.Request {
	var ds []budget.Domain
	for _, id := range ids {
		ds = append(ds, budget.Domain{Version: 1, ID: id})
	}
	return budget.Request{Domains: ds, Class: budget.OpGet, Consumer: "test"}
}

func oneSlot(n int) budget.Limits {
	return budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: n}}
}

// TestBatchCoalesces: calls that come while one is in flight go together in
// the next call, one FCALL for all of them, and each gets its own reply.
func TestBatchCoalesces(t *testing.T) {
	srv := redistest.Start(t)
	s, h, c := batchStore(t, srv, "coalesce", oneSlot(1))
	ctx := context.Background()
	before := fcalls(t, c)

	h.hold(true)
	first := make(chan error, 1)
	go func() {
		att, err := s.TryAcquire(ctx, "a", getReq("d"))
		if err == nil && att.Outcome != budget.Granted {
			err = fmt.Errorf("a: %v, want granted", att.Outcome)
		}
		first <- err
	}()
	goA := <-h.arrived // a is on its way, and stopped
	type result struct {
		att budget.Attempt
		err error
	}
	results := make([]chan result, 4)
	for i, id := range []string{"b", "c", "e"} {
		results[i] = make(chan result, 1)
		go func() {
			att, err := s.TryAcquire(ctx, id, getReq("d"))
			results[i] <- result{att, err}
		}()
		queued(t, s.single, i+1) // one at a time: the queue's order is known
	}
	results[3] = make(chan result, 1)
	go func() { results[3] <- result{err: s.Retire(ctx, "a", lease.Request)} }()
	queued(t, s.single, 4)
	close(goA)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	goBatch := <-h.arrived // the first caller queued leads, and sends them all
	h.hold(false)
	close(goBatch)
	for i, want := range []budget.Outcome{budget.Queued, budget.Queued, budget.Queued} {
		if r := <-results[i]; r.err != nil || r.att.Outcome != want {
			t.Errorf("op %d: %v, %v; want %v", i, r.att.Outcome, r.err, want)
		}
	}
	if r := <-results[3]; r.err != nil {
		t.Errorf("retire: %v", r.err)
	}
	calls := h.sent()
	if len(calls) != 2 {
		t.Fatalf("%d script calls sent, want 2 (the first alone, then one batch): %v", len(calls), calls)
	}
	if calls[0].fn != s.lib.function("acquire") {
		t.Errorf("first call is %s, want the acquire function", calls[0].fn)
	}
	if calls[1].fn != s.lib.function(luascripts.Batch) {
		t.Errorf("second call is %s, want the batch function", calls[1].fn)
	}
	if ops := batchOps(t, calls[1]); !slices.Equal(ops, []string{"acquire", "acquire", "acquire", "retire"}) {
		t.Errorf("batch carried %v", ops)
	}
	if n := fcalls(t, c) - before; n != 2 {
		t.Errorf("Redis ran %d FCALLs, want 2", n)
	}
	// The retirement handed the slot to b, the head of the line, in the
	// same batch: the store hears it on b's wake channel.
	u, err := s.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if u.Waiters != 2 || len(u.Domains) != 1 || u.Domains[0].InFlight[budget.OpGet] != 1 {
		t.Errorf("usage after the batch: %+v, want 1 in flight and 2 waiting", u)
	}
	att, err := s.TryAcquire(ctx, "b", getReq("d"))
	if err != nil || att.Outcome != budget.Granted {
		t.Errorf("b after the handoff: %v, %v", att.Outcome, err)
	}
}

// TestBatchErrorsStayPerOp: an operation refused by its script (a malformed
// argument) fails alone, its batch-mates go through; a call that fails on
// the network fails each operation of its batch with the same error.
func TestBatchErrorsStayPerOp(t *testing.T) {
	srv := redistest.Start(t)
	s, h, _ := batchStore(t, srv, "errors", oneSlot(4))
	ctx := context.Background()
	g := s.single

	acquire := func(id string) func() error {
		return func() error {
			att, err := s.TryAcquire(ctx, id, getReq("d"))
			if err == nil && att.Outcome != budget.Granted {
				err = fmt.Errorf("%s: %v", id, att.Outcome)
			}
			return err
		}
	}
	bad := func() error {
		_, err := s.call(ctx, g, "cancel", s.sc.cancel, s.args("a waiter id with spaces", 0)...)
		return err
	}
	// The first call is stopped at the hook, in flight, until the others
	// have queued behind it.
	h.hold(true)
	firstDone := make(chan error, 1)
	go func() { firstDone <- acquire("a")() }()
	goFirst := <-h.arrived
	errs := make([]chan error, 3)
	for i, op := range []func() error{acquire("b"), bad, acquire("c")} {
		errs[i] = make(chan error, 1)
		go func() { errs[i] <- op() }()
		queued(t, g, i+1)
	}
	close(goFirst)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	goBatch := <-h.arrived
	h.hold(false)
	close(goBatch)
	if err := <-errs[0]; err != nil {
		t.Errorf("b, before the bad operation: %v", err)
	}
	if err := <-errs[1]; !errors.Is(err, budget.ErrInvalidRequest) {
		t.Errorf("the malformed cancel: %v, want ErrInvalidRequest", err)
	}
	if err := <-errs[2]; err != nil {
		t.Errorf("c, after the bad operation: %v", err)
	}
	if calls := h.sent(); len(calls) != 2 || calls[1].fn != s.lib.function(luascripts.Batch) {
		t.Fatalf("calls sent: %v, want one alone and one batch", calls)
	}

	// The network fails the whole batch: every operation of it gets the
	// same error, classified as an outage.
	failed := errors.New("connection reset by peer (injected)")
	h.mu.Lock()
	h.fail = func(c sentCall) error {
		if c.fn == s.lib.function(luascripts.Batch) || c.fn == s.lib.function(luascripts.BatchOOM) {
			return failed
		}
		return nil
	}
	h.mu.Unlock()
	h.hold(true)
	go func() { firstDone <- s.Retire(ctx, "a", lease.Request) }()
	goFirst = <-h.arrived
	// (Cancels, not retirements: a final retirement queued behind a call
	// does not wait for its reply; see TestDetachedRetire.)
	for i, op := range []func() error{
		func() error { return s.Cancel(ctx, "b") },
		func() error { return s.Cancel(ctx, "c") },
	} {
		go func() { errs[i] <- op() }()
		queued(t, g, i+1)
	}
	close(goFirst)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	goBatch = <-h.arrived
	h.hold(false)
	close(goBatch)
	e0, e1 := <-errs[0], <-errs[1]
	for _, err := range []error{e0, e1} {
		if !errors.Is(err, budget.ErrUnavailable) || !errors.Is(err, failed) && !strings.Contains(err.Error(), failed.Error()) {
			t.Errorf("cancel in a failed batch: %v, want ErrUnavailable with the network's error", err)
		}
	}
	if e0 == nil || e1 == nil || e0.Error() != e1.Error() {
		t.Errorf("batch-mates got different errors: %v and %v", e0, e1)
	}
}

// TestBatchLeaveWhileQueued: a caller whose ctx ends while its call waits
// in the queue returns at once, and nothing of its call is sent.
func TestBatchLeaveWhileQueued(t *testing.T) {
	srv := redistest.Start(t)
	s, h, _ := batchStore(t, srv, "leave", oneSlot(1))
	ctx := context.Background()
	g := s.single

	h.hold(true)
	first := make(chan error, 1)
	go func() { _, err := s.TryAcquire(ctx, "a", getReq("d")); first <- err }()
	goFirst := <-h.arrived
	leaving, leave := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() { _, err := s.TryAcquire(leaving, "gone", getReq("d")); left <- err }()
	queued(t, g, 1)
	errs := make([]chan error, 2)
	for i, id := range []string{"b", "c"} {
		errs[i] = make(chan error, 1)
		go func() { _, err := s.TryAcquire(ctx, id, getReq("d")); errs[i] <- err }()
		queued(t, g, i+2)
	}
	leave()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Errorf("the caller that left: %v, want context.Canceled", err)
	}
	queued(t, g, 2)
	close(goFirst)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	goBatch := <-h.arrived
	h.hold(false)
	close(goBatch)
	for i := range errs {
		if err := <-errs[i]; err != nil {
			t.Errorf("op %d: %v", i, err)
		}
	}
	calls := h.sent()
	if len(calls) != 2 || len(batchOps(t, calls[1])) != 2 {
		t.Fatalf("calls sent: %v, want a alone, then b and c in one batch", calls)
	}
	for _, c := range calls {
		for _, a := range c.args {
			if a == "gone" {
				t.Errorf("the call of the caller that left was sent: %v", c)
			}
		}
	}
}

// TestBatchLeaderLeaves: the caller that sends a batch gives up while it is
// in flight. It returns its ctx's error; its batch-mates, whose callers
// still wait, go again in the next call instead of failing with it.
func TestBatchLeaderLeaves(t *testing.T) {
	srv := redistest.Start(t)
	s, h, _ := batchStore(t, srv, "leader", oneSlot(4))
	ctx := context.Background()
	g := s.single

	h.hold(true)
	first := make(chan error, 1)
	go func() { _, err := s.TryAcquire(ctx, "a", getReq("d")); first <- err }()
	goFirst := <-h.arrived
	leading, leave := context.WithCancel(ctx)
	led := make(chan error, 1)
	go func() { _, err := s.TryAcquire(leading, "lead", getReq("d")); led <- err }()
	queued(t, g, 1)
	mate := make(chan error, 1)
	go func() {
		att, err := s.TryAcquire(ctx, "mate", getReq("d"))
		if err == nil && att.Outcome != budget.Granted {
			err = fmt.Errorf("mate: %v", att.Outcome)
		}
		mate <- err
	}()
	queued(t, g, 2)
	close(goFirst)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	goBatch := <-h.arrived // "lead" sends both, and is stopped
	leave()
	h.hold(false)
	close(goBatch)
	if err := <-led; !errors.Is(err, context.Canceled) {
		t.Errorf("the leader that left: %v, want context.Canceled", err)
	}
	if err := <-mate; err != nil {
		t.Errorf("its batch-mate: %v", err)
	}
	calls := h.sent()
	if len(calls) != 3 || calls[2].fn != s.lib.function("acquire") {
		t.Fatalf("calls sent: %v, want a, the batch, then the mate's call again, alone", calls)
	}
}

// TestBatchIdleGoesAtOnce: with nothing in flight, a call goes out alone,
// as the plain call of its script, sent by its own caller before the call
// returns: nothing waits for a timer, another goroutine or a flush.
func TestBatchIdleGoesAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	s, h, _ := batchStore(t, srv, "idle", oneSlot(1))
	ctx := context.Background()
	me := goid()
	steps := []struct {
		script string
		call   func() error
	}{
		{"acquire", func() error { _, err := s.TryAcquire(ctx, "a", getReq("d")); return err }},
		{"retire", func() error { return s.Retire(ctx, "a", lease.Request) }},
		{"cancel", func() error { return s.Cancel(ctx, "a") }},
	}
	for _, st := range steps {
		if err := st.call(); err != nil {
			t.Fatalf("%s: %v", st.script, err)
		}
		calls := h.sent()
		if len(calls) != 1 {
			t.Fatalf("%s: %d calls sent, want 1", st.script, len(calls))
		}
		if calls[0].fn != s.lib.function(st.script) {
			t.Errorf("%s went as %s, want its own function", st.script, calls[0].fn)
		}
		if calls[0].gid != me {
			t.Errorf("%s was sent by goroutine %d, not by its caller (%d)", st.script, calls[0].gid, me)
		}
	}
}

// TestBatchOutOfMemory: Redis refuses a batch that carries an admitting
// call when it is out of memory, as it would refuse that call alone; the
// retirements of that batch go again in the allow-oom batch function and
// free their slots, as they would alone.
func TestBatchOutOfMemory(t *testing.T) {
	srv := redistest.Start(t, redistest.WithConfig("maxmemory-policy noeviction"))
	s, h, c := batchStore(t, srv, "oom", oneSlot(10))
	ctx := context.Background()
	g := s.single
	for _, id := range []string{"a", "b"} {
		if att, err := s.TryAcquire(ctx, id, getReq("d")); err != nil || att.Outcome != budget.Granted {
			t.Fatalf("%s: %v %v", id, att.Outcome, err)
		}
	}
	fillMemory(t, c)
	h.sent()

	h.hold(true)
	first := make(chan error, 1)
	go func() { first <- s.Retire(ctx, "a", lease.Request) }()
	goFirst := <-h.arrived
	admit := make(chan error, 1)
	go func() { _, err := s.TryAcquire(ctx, "x", getReq("d")); admit <- err }()
	queued(t, g, 1)
	free := make(chan error, 1)
	go func() { free <- s.Retire(ctx, "b", lease.Request) }()
	queued(t, g, 2)
	close(goFirst)
	if err := <-first; err != nil {
		t.Fatalf("a retirement alone, out of memory: %v", err)
	}
	goBatch := <-h.arrived
	h.hold(false)
	close(goBatch)
	if err := <-admit; !errors.Is(err, budget.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
		t.Errorf("an acquire out of memory: %v, want ErrUnavailable (OOM)", err)
	}
	if err := <-free; err != nil {
		t.Errorf("a retirement batched with it: %v", err)
	}
	calls := h.sent()
	if len(calls) != 3 || calls[1].fn != s.lib.function(luascripts.Batch) || calls[2].fn != s.lib.function(luascripts.BatchOOM) {
		t.Errorf("calls sent: %v, want retire, the mixed batch, the allow-oom batch", calls)
	}
	if n := c.HLen(ctx, g.prefix+"lx").Val(); n != 0 {
		t.Errorf("%d leases left after both were retired out of memory", n)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
}

// fillMemory puts Redis over a maxmemory of half what it uses, so that no
// growing write slips under it.
func fillMemory(t *testing.T, c *redis.Client) {
	t.Helper()
	ctx := context.Background()
	val := strings.Repeat("x", 8<<10)
	for i := range 200 {
		if err := c.Set(ctx, "filler:"+strconv.Itoa(i), val, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	info := c.Info(ctx, "memory").Val()
	var used int64
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used/2, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("Redis still takes writes over its limit: %v", err)
	}
}

// TestBatchNotByEvalsha: without the library (EVALSHA: miniredis, older
// servers) every call goes alone, however many run at once.
func TestBatchNotByEvalsha(t *testing.T) {
	srv := redistest.Start(t)
	s, h, _ := batchStore(t, srv, "evalsha", oneSlot(2), WithEvalOnly())
	ctx := context.Background()
	var wg sync.WaitGroup
	const n = 32
	for i := range n {
		wg.Go(func() {
			id := "w" + strconv.Itoa(i)
			if _, err := s.TryAcquire(ctx, id, getReq("d")); err != nil {
				t.Error(err)
			}
			if err := s.Cancel(ctx, id); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	calls := h.sent()
	evalsha := 0
	for _, c := range calls {
		if c.cmd != "evalsha" {
			t.Errorf("%s sent without the library", c.cmd)
			continue
		}
		evalsha++
	}
	if evalsha != 2*n {
		t.Errorf("%d EVALSHA calls for %d calls", evalsha, 2*n)
	}
}

// registeredStore returns a store for budget name on c, with limits l
// registered, closed when the test ends.
func registeredStore(t *testing.T, c redis.UniversalClient, name string, l budget.Limits, opts ...Option) *Store {
	t.Helper()
	s, err := New(c, name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Register(context.Background(), l, false); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBatchMatchesSingles: a batch leaves Redis in the state, and gives
// each operation the reply, that the same calls sent one by one do at the
// same clock, although an operation of a batch starts from what the one
// before it read (begin's keep, in lib.lua): two budgets, one fed batches
// and one fed single calls, are compared key by key.
func TestBatchMatchesSingles(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	var now time.Time = time.UnixMicro(1_700_000_000_000_000)
	clock := func() time.Time { return now }
	lim := budget.Limits{RequestsPerSecond: 100, Burst: 3, InFlight: map[budget.OpClass]int{budget.OpGet: 2}}
	open := func(name string) *Store {
		return registeredStore(t, c, name, lim, WithLeaseTTL(10*time.Second), withClock(clock))
	}
	batched, single := open("eq-batched"), open("eq-single")
	d1, d2 := encodeDomain(budget.Domain{Version: 1, ID: "d1"}), encodeDomain(budget.Domain{Version: 1, ID: "d2"})
	type op func(s *Store) *batchOp
	acquire := func(id string, encs ...string) op {
		return func(s *Store) *batchOp {
			args := s.args(id, s.proc, s.single.sid, budget.OpGet.Index(), 0, "c", ms(s.ttl), len(encs))
			for _, e := range encs {
				args = append(args, e)
			}
			args = append(args, s.single.sid) // the previous call's session
			return &batchOp{ctx: ctx, name: "acquire", sc: s.sc.acquire, args: args}
		}
	}
	retire := func(id string) op {
		return func(s *Store) *batchOp {
			return &batchOp{ctx: ctx, name: "retire", sc: s.sc.retire, args: s.args(id, 1, s.single.sid)}
		}
	}
	cancel := func(id string) op {
		return func(s *Store) *batchOp {
			return &batchOp{ctx: ctx, name: "cancel", sc: s.sc.cancel, args: s.args(id, 1, s.single.sid)}
		}
	}
	// Each step is one batch for one budget, and as many single calls for
	// the other, at one clock.
	// junk appends bytes to d1's queue that its domain does not count (a
	// state loss took a write), so the next join finds the string longer
	// than its domain says.
	junk := func(s *Store) {
		if err := c.Append(ctx, s.single.prefix+"q:"+d1, "junk").Err(); err != nil {
			t.Fatal(err)
		}
	}
	// wrongType puts a hash where d1's queue is: an operation that reads
	// the queue fails, after it has written what it must (dreturn).
	wrongType := func(s *Store) {
		q := s.single.prefix + "q:" + d1
		if err := c.Del(ctx, q).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.HSet(ctx, q, "not", "a queue").Err(); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		at     time.Duration
		before func(s *Store)
		ops    []op
	}{
		{0, nil, []op{
			acquire("a", d1), acquire("b", d1), // both slots, 2 of 3 tokens
			acquire("c", d1), acquire("d", d1, d2), acquire("e", d2), // in line
			// Joins behind a head the batch has read (acquire's shortcut),
			// then the same waiter again: it is queued, and stays so.
			acquire("i", d1), acquire("i", d1),
			retire("a"),                       // hands a's slot to c, with the last token
			cancel("d"),                       // e heads d2: handed a slot there
			cancel("a waiter id with spaces"), // refused, alone
			acquire("c", d1),                  // collects its handoff
			retire("b"), retire("c"),
			acquire("f", d1), // no token left: delayed
		}},
		{20 * time.Millisecond, nil, []op{acquire("f", d1), acquire("g", d1), acquire("h", d1, d2)}},
		{50 * time.Millisecond, nil, []op{retire("e"), acquire("g", d1), retire("f"), cancel("h"), acquire("g", d1), retire("g")}},
		// A waiter's call reads the head; then the shortcut's join finds
		// the queue's string longer than its domain says, and the line
		// starts again with the joiner.
		{80 * time.Millisecond, junk, []op{acquire("i", d1), acquire("j", d1), acquire("k", d1), retire("i")}},
		// An operation fails after the one before it saved a domain (the
		// batch writes that at its end) and after it saved one itself
		// (written, as alone); the next starts afresh.
		{100 * time.Millisecond, wrongType, []op{acquire("m", d2), retire("f"), acquire("n", d2), acquire("o", d2)}},
	}
	reply := func(res []string, err error) string {
		if err != nil {
			// Where in the library a call alone failed, Redis adds; a
			// batch catches the error first.
			msg, _, _ := strings.Cut(err.Error(), " script: ")
			return "error: " + msg
		}
		return strings.Join(res, " ")
	}
	t0 := now
	for i, st := range steps {
		now = t0.Add(st.at)
		if st.before != nil {
			st.before(batched)
			st.before(single)
		}
		ops := make([]*batchOp, len(st.ops))
		for j, o := range st.ops {
			ops[j] = o(batched)
		}
		got := batched.send(ctx, batched.single, ops, nil)
		for j, o := range st.ops {
			so := o(single)
			want := reply(single.run(ctx, single.single, so.name, so.sc, so.args...))
			if g := reply(got[j].res, got[j].err); g != want {
				t.Errorf("step %d, op %d (%s): batched %q, alone %q", i, j, so.name, g, want)
			} else if testing.Verbose() {
				t.Logf("step %d, op %d (%s): %q", i, j, so.name, g)
			}
		}
		if i == 0 {
			// A throttle between the steps: later refills run at a rate
			// that changes with time.
			for _, s := range []*Store{batched, single} {
				if _, err := s.Throttle(ctx, budget.Domain{Version: 1, ID: "d1"}, 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		if b, s := dumpBudget(t, c, batched), dumpBudget(t, c, single); !slices.Equal(b, s) {
			t.Errorf("after step %d the budgets differ:\nbatched: %q\nalone:   %q", i, b, s)
		}
	}
}

// dumpBudget lists every key of s's budget with its content, names and
// the process's id taken out, so two budgets can be compared.
func dumpBudget(t *testing.T, c *redis.Client, s *Store) []string {
	t.Helper()
	ctx := context.Background()
	p := s.single.prefix
	keys, err := c.Keys(ctx, p+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range keys {
		var v string
		switch c.Type(ctx, k).Val() {
		case "hash":
			m := c.HGetAll(ctx, k).Val()
			var fs []string
			for f, x := range m {
				if f == "rid" {
					continue // the server's run_id, as each budget first saw it
				}
				fs = append(fs, f+"="+x)
			}
			slices.Sort(fs)
			v = strings.Join(fs, ",")
		case "zset":
			for _, z := range c.ZRangeWithScores(ctx, k, 0, -1).Val() {
				v += fmt.Sprintf("%v:%v,", z.Member, z.Score)
			}
		case "set":
			m := c.SMembers(ctx, k).Val()
			slices.Sort(m)
			v = strings.Join(m, ",")
		default:
			v = c.Get(ctx, k).Val()
			if _, ok := strings.CutPrefix(strings.TrimPrefix(k, p), "d:"); ok {
				d, err := dompack.Decode(v, budget.NumClasses)
				if err != nil {
					t.Fatalf("%s: %v", k, err)
				}
				v = fmt.Sprintf("%+v", d)
			}
		}
		ttl := c.PTTL(ctx, k).Val() > 0
		out = append(out, fmt.Sprintf("%s ttl=%v %s", strings.ReplaceAll(strings.TrimPrefix(k, p), s.proc, "PROC"), ttl, strings.ReplaceAll(v, s.proc, "PROC")))
	}
	slices.Sort(out)
	return out
}

// TestBatchHammer: many lanes of two hosts acquire and release through the
// group commit, and many of them give up at random moments (queued, in
// flight, leading a batch). Afterwards nothing is held and nobody waits:
// every abandoned call was cleaned up, whatever became of it.
func TestBatchHammer(t *testing.T) {
	srv := redistest.Start(t)
	lim := oneSlot(3)
	var hosts []*budget.Budget
	var stores []*Store
	var hooks []*scriptHook
	for i := range 2 {
		s, h, _ := batchStore(t, srv, "hammer", lim)
		if i == 1 {
			s.stuck = 500 * time.Microsecond // calls often go beside a slow one
		}
		b, err := budget.New(lim, budget.WithStore(s))
		if err != nil {
			t.Fatal(err)
		}
		hosts, stores, hooks = append(hosts, b), append(stores, s), append(hooks, h)
	}
	stop := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	var granted, gaveUp atomic.Int64
	for lane := range 32 {
		b := hosts[lane%2]
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				// From no time at all (gone before it is sent) to long
				// enough to be granted through a queue, and every fourth
				// long enough for any machine.
				d := time.Duration((lane*7+i*13)%40) * 500 * time.Microsecond
				if i%4 == 0 {
					d = time.Second
				}
				ctx, cancel := context.WithTimeout(context.Background(), d)
				l, err := b.Acquire(ctx, getReq("d", "e"))
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("acquire: %v", err)
						return
					}
					gaveUp.Add(1)
					continue
				}
				granted.Add(1)
				l.Release()
			}
		})
	}
	wg.Wait()
	// A grant made by an acquire cut off on its way, read by Redis after
	// its cancel, is cancelled again by the group's next heartbeat (see
	// Cancel): beat once, holding a lease so that there is a beat.
	for i, b := range hosts {
		l, err := b.Acquire(context.Background(), getReq("d", "e"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stores[i].Heartbeat(context.Background(), []string{l.ID()}); err != nil {
			t.Fatal(err)
		}
		l.Release()
	}
	for _, b := range hosts {
		b.Close() // waits for the cleanup of every abandoned waiter
	}
	batches, ops := 0, 0
	for _, h := range hooks {
		for _, c := range h.sent() {
			if strings.Contains(c.fn, "_batch") {
				batches++
				ops += len(batchOps(t, c))
			}
		}
	}
	t.Logf("%d granted, %d gave up; %d batches carried %d calls", granted.Load(), gaveUp.Load(), batches, ops)
	if granted.Load() == 0 || gaveUp.Load() == 0 || batches == 0 {
		t.Fatalf("%d granted, %d gave up, %d batches: the hammer missed a path", granted.Load(), gaveUp.Load(), batches)
	}
	u, err := stores[0].Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range u.Domains {
		if d.InFlight[budget.OpGet] != 0 {
			t.Errorf("%s: %d still in flight", d.Domain, d.InFlight[budget.OpGet])
		}
	}
	if u.Waiters != 0 {
		t.Errorf("%d waiters left", u.Waiters)
	}
	if t.Failed() {
		// What each lease left behind was sent in, for the post-mortem.
		left := stores[0].client.HKeys(context.Background(), stores[0].single.prefix+"lx").Val()
		for _, id := range left {
			for hi, h := range hooks {
				for _, c := range h.all {
					for i, a := range c.args {
						if a == id {
							t.Logf("lease %s: host %d call %s gid %d at %d %s: %v", id, hi, c.fn, c.gid, i, c.at.Format("05.000000"), c.args)
						}
					}
				}
			}
		}
	}
}

// TestBatchStuckCallIsBypassed: once the call out has been out for longer
// than a round trip could explain (a dead node go-redis keeps dialling),
// the next caller sends a call of its own beside it, with what is queued,
// instead of waiting for it.
func TestBatchStuckCallIsBypassed(t *testing.T) {
	srv := redistest.Start(t)
	s, h, _ := batchStore(t, srv, "stuck", oneSlot(4))
	ctx := context.Background()
	g := s.single

	h.hold(true)
	first := make(chan error, 1)
	go func() { _, err := s.TryAcquire(ctx, "a", getReq("d")); first <- err }()
	goFirst := <-h.arrived // stuck, as far as the others can tell
	queuedErr := make(chan error, 1)
	go func() { _, err := s.TryAcquire(ctx, "b", getReq("d")); queuedErr <- err }()
	queued(t, g, 1)
	s.stuck = 0
	late := make(chan error, 1)
	go func() { _, err := s.TryAcquire(ctx, "c", getReq("d")); late <- err }()
	goBeside := <-h.arrived // sent while the first is still held
	h.hold(false)
	close(goBeside)
	if err := <-late; err != nil {
		t.Errorf("the caller that went beside: %v", err)
	}
	if err := <-queuedErr; err != nil {
		t.Errorf("the caller it took along: %v", err)
	}
	close(goFirst)
	if err := <-first; err != nil {
		t.Errorf("the stuck call: %v", err)
	}
	calls := h.sent()
	if len(calls) != 2 || !slices.Equal(batchOps(t, calls[1]), []string{"acquire", "acquire"}) {
		t.Fatalf("calls sent: %v, want a, then c and b in one batch beside it", calls)
	}
	g.commit.mu.Lock()
	defer g.commit.mu.Unlock()
	if g.commit.active != 0 || len(g.commit.queue) != 0 {
		t.Errorf("after all returned: %d leading, %d queued", g.commit.active, len(g.commit.queue))
	}
}
