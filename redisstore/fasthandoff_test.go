package redisstore

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
)

// TestFastHandoffMatchesGeneral: in the function library, the retirement
// that hands its slot to the head of the line takes a short path
// (lib.lua, Q.fast_handoff) for the case that under contention is nearly
// every one; a script sent by EVALSHA never takes it. Two budgets, one on
// the library and one on EVALSHA, fed the same calls at the same clock,
// must answer each call alike, hold the same keys after every call and
// send the same wake messages.
// The steps run the short path (a line handed on, a line emptied, the
// queue compacted) and ways around it: a head of another class, a head
// on several domains or with a body, a lease with a body, a marked entry
// behind the head, a next head of another class that the release lets in
// too, a ceiling lowered below what is held, a throttled domain (with
// and without a pause), a head whose session died, a lease retired twice;
// then 800 calls drawn at random.
func TestFastHandoffMatchesGeneral(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	// The clock both budgets' scripts read; atomic, since a store's own
	// goroutines (its renewals) read it too.
	var nowUS atomic.Int64
	nowUS.Store(1_700_000_000_000_000)
	clock := func() time.Time { return time.UnixMicro(nowUS.Load()) }
	lim := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1, budget.OpPut: 1}, OpenBodies: 3}
	open := func(name string, opts ...Option) *Store {
		return registeredStore(t, c, name, lim, append(opts, WithLeaseTTL(10*time.Second), withClock(clock))...)
	}
	lib, eval := open("fast-lib"), open("fast-eval", WithEvalOnly())
	if lib.lib.function("retire") == "" || eval.lib.function("retire") != "" {
		t.Fatal("want one budget on the library and one on EVALSHA")
	}
	d1, d2 := encodeDomain(budget.Domain{Version: 1, ID: "d1"}), encodeDomain(budget.Domain{Version: 1, ID: "d2"})
	type call func(s *Store) (string, []any)
	acquire := func(id string, class budget.OpClass, body int, encs ...string) call {
		return func(s *Store) (string, []any) {
			args := s.args(id, s.proc, s.single.sid, class.Index(), body, "c", ms(s.ttl), len(encs))
			for _, e := range encs {
				args = append(args, e)
			}
			return "acquire", args
		}
	}
	get := func(id string, encs ...string) call { return acquire(id, budget.OpGet, 0, encs...) }
	// A waiter of a session of its own that lives 20 ms.
	shortLived := func(id string) call {
		return func(s *Store) (string, []any) {
			return "acquire", s.args(id, s.proc, s.single.sid+"-short", budget.OpGet.Index(), 0, "c", 20, 1, d1)
		}
	}
	ceilings := func(get int) func(s *Store) {
		return func(s *Store) {
			l := lim
			l.InFlight = map[budget.OpClass]int{budget.OpGet: get, budget.OpPut: 1}
			if err := s.Register(ctx, l, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	throttle := func(pause time.Duration) func(s *Store) {
		return func(s *Store) {
			if _, err := s.Throttle(ctx, budget.Domain{Version: 1, ID: "d1"}, pause); err != nil {
				t.Fatal(err)
			}
		}
	}
	retire := func(id string) call {
		return func(s *Store) (string, []any) { return "retire", s.args(id, 3, s.single.sid) }
	}
	cancel := func(id string) call {
		return func(s *Store) (string, []any) { return "cancel", s.args(id, 1, s.single.sid) }
	}
	sc := func(s *Store, name string) *redis.Script {
		switch name {
		case "acquire":
			return s.sc.acquire
		case "retire":
			return s.sc.retire
		}
		return s.sc.cancel
	}
	// Many waiters one after another, each granted by the retirement of
	// the one before: the line's string passes the compaction bound.
	var churn []call
	churn = append(churn, get("w0", d1))
	for i := 1; i <= 120; i++ {
		churn = append(churn, get("w"+strconv.Itoa(i), d1), retire("w"+strconv.Itoa(i-1)))
	}
	churn = append(churn, retire("w120"))
	steps := []struct {
		at     time.Duration
		before func(s *Store)
		calls  []call
	}{
		// The short path: a lease's slot to the head, the next head held
		// by the ceiling; then the line emptied.
		{0, nil, []call{get("a", d1), get("b", d1), get("c", d1), retire("a"), retire("b"), retire("c"), retire("c")}},
		// Heads it leaves to the general path: another class, several
		// domains, a body; a lease with a body; a next head of another
		// class, which the same release lets in.
		{time.Millisecond, nil, []call{
			get("e", d1), acquire("f", budget.OpPut, 0, d1), get("g", d1, d2), acquire("h", budget.OpGet, 1, d1), get("i", d1),
			retire("e"), retire("f"), retire("g"), retire("h"), retire("i"),
			acquire("j", budget.OpGet, 1, d1), get("k", d1), retire("j"), retire("k"),
			get("l", d1), get("m", d1), acquire("n", budget.OpPut, 0, d1), retire("l"), retire("m"), retire("n"),
		}},
		// A marked entry behind the head.
		{2 * time.Millisecond, nil, []call{get("o", d1), get("p", d1), get("q", d1), get("r", d1), cancel("q"), retire("o"), retire("p"), retire("r")}},
		{3 * time.Millisecond, nil, churn},
		// A ceiling lowered below what is held: the release leaves the
		// count at the new ceiling, which holds the head back.
		{500 * time.Millisecond, ceilings(2), []call{get("x1", d1), get("x2", d1), get("x3", d1), get("x4", d1)}},
		{600 * time.Millisecond, ceilings(1), []call{retire("x1"), retire("x2"), retire("x3"), retire("x4")}},
		// A head whose session has died (its process stopped renewing it):
		// the retirement's reclaim takes it out of line first.
		{time.Second, nil, []call{get("v1", d1), shortLived("v2"), get("v3", d1)}},
		{time.Second + 50*time.Millisecond, nil, []call{retire("v1"), retire("v3")}},
		// A throttled domain, then one throttled with a pause.
		{2 * time.Second, nil, []call{get("s1", d1), get("s2", d1)}},
		{2*time.Second + 10*time.Millisecond, throttle(0), []call{retire("s1"), retire("s2")}},
		{3 * time.Second, nil, []call{cancel("s2"), get("u1", d1), get("u2", d1)}},
		{3*time.Second + 10*time.Millisecond, throttle(10 * time.Millisecond), []call{retire("u1"), get("u2", d1), retire("u2")}},
	}
	// Then calls drawn at random (a fixed seed): joins of either class,
	// with or without a body, on d1, d2 or both, retirements and cancels
	// of any id drawn so far, now and then a throttle or new ceilings
	// (which may leave more held than a ceiling allows).
	rnd := rand.New(rand.NewPCG(13, 27))
	var ids []string
	var random []call
	oldest := 0
	for i := range 800 {
		switch x := rnd.IntN(100); {
		case x < 53 || len(ids) == 0:
			id := "r" + strconv.Itoa(i)
			ids = append(ids, id)
			class := budget.OpGet
			if rnd.IntN(8) == 0 {
				class = budget.OpPut
			}
			body := 0
			if rnd.IntN(10) == 0 {
				body = 1
			}
			encs := []string{d1}
			if x := rnd.IntN(10); x == 0 {
				encs = []string{d2}
			} else if x == 1 {
				encs = []string{d1, d2}
			}
			random = append(random, acquire(id, class, body, encs...))
		case x < 93:
			// Mostly the oldest id not yet retired: grants go in order of
			// arrival, so that is most often a holder.
			id := ids[rnd.IntN(len(ids))]
			if oldest < len(ids) && rnd.IntN(5) > 0 {
				id = ids[oldest]
				oldest++
			}
			random = append(random, retire(id))
		case x < 98:
			random = append(random, cancel(ids[rnd.IntN(len(ids))]))
		case x < 99:
			pause := time.Duration(rnd.IntN(2)) * 30 * time.Millisecond
			random = append(random, func(s *Store) (string, []any) {
				throttle(pause)(s)
				return "", nil
			})
		default:
			caps := map[budget.OpClass]int{budget.OpGet: 1 + rnd.IntN(3), budget.OpPut: 1 + rnd.IntN(2)}
			random = append(random, func(s *Store) (string, []any) {
				l := lim
				l.InFlight = caps
				if err := s.Register(ctx, l, true); err != nil {
					t.Fatal(err)
				}
				return "", nil
			})
		}
	}
	steps = append(steps, struct {
		at     time.Duration
		before func(s *Store)
		calls  []call
	}{10 * time.Second, nil, random})
	// The random calls 20 ms apart: a throttle's slowdown passes in a few
	// seconds (budget/throttle.go), and with it the general path's hold
	// on the domain.
	tick := func(i int) time.Duration {
		if i == len(steps)-1 {
			return 20 * time.Millisecond
		}
		return 137 * time.Microsecond
	}
	reply := func(res []string, err error) string {
		if err != nil {
			return "error: " + err.Error()
		}
		return strings.Join(res, " ")
	}
	// The wake messages of both, in order, to be compared at the end.
	ps := c.PSubscribe(ctx, "*wake:*")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	pairs := [][2]*Store{{lib, eval}}
	t0 := clock()
	for i, st := range steps {
		nowUS.Store(t0.Add(st.at).UnixMicro())
		if i == len(steps)-1 {
			// The random calls on twins of their own, with no history.
			lib, eval = open("fast-lib-r"), open("fast-eval-r", WithEvalOnly())
			pairs = append(pairs, [2]*Store{lib, eval})
		}
		if st.before != nil {
			st.before(lib)
			st.before(eval)
		}
		for j, cl := range st.calls {
			nowUS.Add(tick(i).Microseconds()) // each call at its own instant, the same for both
			var got [2]string
			for k, s := range []*Store{lib, eval} {
				if name, args := cl(s); name != "" {
					got[k] = reply(s.run(ctx, s.single, name, sc(s, name), args...))
				}
			}
			if got[0] != got[1] {
				t.Errorf("step %d, call %d: library %q, EVALSHA %q", i, j, got[0], got[1])
			}
			// After every call: a grant the one makes and the other does
			// not may be undone by the step's later calls.
			if a, b := dumpBudget(t, c, lib), dumpBudget(t, c, eval); !slices.Equal(a, b) {
				t.Fatalf("after step %d, call %d the budgets differ:\nlibrary: %q\nEVALSHA: %q", i, j, a, b)
			}
		}
	}
	if err := ps.Ping(ctx, "end"); err != nil {
		t.Fatal(err)
	}
	msgs := map[*Store][]string{}
	for {
		m, err := ps.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := m.(*redis.Pong); ok && p.Payload == "end" {
			break
		}
		if m, ok := m.(*redis.Message); ok {
			for _, p := range pairs {
				for _, s := range p {
					if strings.HasPrefix(m.Channel, s.single.prefix) {
						msgs[s] = append(msgs[s], strings.ReplaceAll(m.Payload, s.proc, "PROC"))
					}
				}
			}
		}
	}
	for i, p := range pairs {
		if a, b := msgs[p[0]], msgs[p[1]]; len(a) == 0 || !slices.Equal(a, b) {
			t.Errorf("twins %d: wake messages differ:\nlibrary: %q\nEVALSHA: %q", i, a, b)
		}
	}
}

// TestFastHandoffInBatches: the short handoff as P3 runs it, in batches of
// a retirement and the next join (one to three such pairs a batch), on a
// line long enough that its string is compacted several times. A budget
// fed the batches and its twin on EVALSHA, fed the same operations alone
// at the same instants, must answer alike and hold the same keys after
// every batch. Within a batch the short path leaves the line's next head
// read for the operations after it, and a compaction moves every entry
// (a head kept from before one would be read at the wrong place); a
// batch also writes each domain once, at its end, from what its last save
// left (BATCH.flush).
func TestFastHandoffInBatches(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	var nowUS atomic.Int64
	nowUS.Store(1_700_000_000_000_000)
	clock := func() time.Time { return time.UnixMicro(nowUS.Load()) }
	lim := budget.Limits{InFlight: map[budget.OpClass]int{budget.OpGet: 1}}
	open := func(name string, opts ...Option) *Store {
		return registeredStore(t, c, name, lim, append(opts, WithLeaseTTL(10*time.Second), withClock(clock))...)
	}
	batched, eval := open("fastb-lib"), open("fastb-eval", WithEvalOnly())
	d1 := encodeDomain(budget.Domain{Version: 1, ID: "d1"})
	acquire := func(s *Store, id string) *batchOp {
		return &batchOp{ctx: ctx, name: "acquire", sc: s.sc.acquire,
			args: s.args(id, s.proc, s.single.sid, budget.OpGet.Index(), 0, "c", ms(s.ttl), 1, d1)}
	}
	retire := func(s *Store, id string) *batchOp {
		return &batchOp{ctx: ctx, name: "retire", sc: s.sc.retire, args: s.args(id, 3, s.single.sid)}
	}
	reply := func(res []string, err error) string {
		if err != nil {
			return "error: " + err.Error()
		}
		return strings.Join(res, " ")
	}
	// ops builds one batch's operations for s.
	type build func(s *Store) []*batchOp
	run := func(i int, b build) {
		nowUS.Add(1000)
		got := batched.send(ctx, batched.single, b(batched), nil)
		for j, o := range b(eval) {
			want := reply(eval.run(ctx, eval.single, o.name, o.sc, o.args...))
			if g := reply(got[j].res, got[j].err); g != want {
				t.Fatalf("batch %d, op %d (%s): batched %q, alone on EVALSHA %q", i, j, o.name, g, want)
			}
		}
		if a, e := dumpBudget(t, c, batched), dumpBudget(t, c, eval); !slices.Equal(a, e) {
			t.Fatalf("after batch %d the budgets differ:\nbatched: %q\nEVALSHA: %q", i, a, e)
		}
	}
	// A holder and eight in line.
	line := []string{}
	for i := range 9 {
		id := "w" + strconv.Itoa(i)
		line = append(line, id)
		run(-1, func(s *Store) []*batchOp { return []*batchOp{acquire(s, id)} })
	}
	// Each pair retires the holder (its slot goes to the head) and queues
	// a new waiter at the back. A waiter's entry is about 130 bytes here,
	// so the line's string passes the compaction bound (16 KiB) about
	// every 125 handoffs.
	next := len(line)
	for i := range 300 {
		k := 1 + i%3
		var ids [][2]string
		for range k {
			ids = append(ids, [2]string{line[0], "w" + strconv.Itoa(next)})
			line = append(line[1:], "w"+strconv.Itoa(next))
			next++
		}
		run(i, func(s *Store) []*batchOp {
			var ops []*batchOp
			for _, p := range ids {
				ops = append(ops, retire(s, p[0]), acquire(s, p[1]))
			}
			return ops
		})
	}
	// The line emptied in one batch.
	run(300, func(s *Store) []*batchOp {
		var ops []*batchOp
		for _, id := range line {
			ops = append(ops, retire(s, id))
		}
		return ops
	})
	if a := dumpBudget(t, c, batched); len(a) == 0 {
		t.Fatal("the batched budget holds no keys")
	}
}
