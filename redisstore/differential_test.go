package redisstore_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/redisstore"
)

// The differential test: one seeded random sequence of Store calls, applied
// to the in-process store and to the Redis store, both reading one fake
// time (the scripts through the test clock), with every outcome and the
// full Usage compared after each step. The two stores are meant to take
// the same decisions, so any difference is a drift in one of them.
//
// The short run (12 seeds of 300 steps, and seeds the long run once
// failed on) is part of the normal suite.
// The long run is behind a flag:
//
//	go test ./redisstore -run TestDifferential -differential.long
//
// A failure names its seed and the first step that differed, with every
// step before it; -differential.seed=N (with -differential.steps=M) runs
// that one seed again.
var (
	diffLong  = flag.Bool("differential.long", false, "TestDifferential*: 100 seeds of 2000 steps instead of the short run")
	diffSeed  = flag.Uint64("differential.seed", 0, "TestDifferential*: run only this seed")
	diffSteps = flag.Int("differential.steps", 0, "TestDifferential*: steps per seed (default 300, 2000 with -differential.long)")
)

// diffTTL is the lease TTL of the Redis store. The in-process store never
// expires anything, so the sequence keeps every lease and waiter renewed
// well within it (see differ.advance): expiry is the one thing the two
// stores are not meant to agree on.
const diffTTL = time.Hour

func TestDifferentialMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	runDifferential(t, c)
}

func TestDifferentialRedis(t *testing.T) {
	runDifferential(t, redistest.Start(t).Client(t))
}

// TestDifferentialRedisEval runs the scripts by EVALSHA on Redis 7: there
// lib.lua reads the limits afresh on every call instead of caching them.
func TestDifferentialRedisEval(t *testing.T) {
	if testing.Short() {
		t.Skip("the library path is covered by TestDifferentialRedis")
	}
	runDifferential(t, redistest.Start(t).Client(t), redisstore.WithEvalOnly())
}

func runDifferential(t *testing.T, c redis.UniversalClient, opts ...redisstore.Option) {
	seeds, steps := 12, 300
	if *diffLong {
		seeds, steps = 100, 2000
	}
	if *diffSteps > 0 {
		steps = *diffSteps
	}
	list := make([]uint64, seeds)
	for i := range list {
		list[i] = uint64(i + 1)
	}
	if !*diffLong {
		// Seeds the long run once failed on, within the short run's steps:
		// 12, a bucket refilled by a handoff's try and not kept, then the
		// clock stepped back behind the refill (lib.lua, try_grant).
		list = append(list, 12)
	}
	if *diffSeed != 0 {
		list = []uint64{*diffSeed}
	}
	start := time.Now()
	seen := map[string]int{}
	for _, seed := range list {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			d := newDiffer(t, c, seed, opts)
			d.run(steps)
			for k, n := range d.seen {
				seen[k] += n
			}
		})
	}
	keys := slices.Sorted(maps.Keys(seen))
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, seen[k])
	}
	t.Logf("%d seeds x %d steps in %v; outcomes:%s", len(list), steps, time.Since(start).Round(time.Millisecond), b.String())
}

// fakeClock is the one time both stores read: the scripts as Redis TIME,
// the in-process store as its clock. It can step back, as Redis TIME can;
// Mono is the same time without the steps back, the hosts' monotonic
// clock, which redisstore's own bookkeeping and this test's read.
type fakeClock struct {
	mu   sync.Mutex
	now  time.Time
	back time.Duration // every step back so far
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Mono() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now.Add(c.back)
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	if d < 0 {
		c.back -= d
	}
	c.mu.Unlock()
}

// diffWaiter is a waiter both stores answered Queued or Delayed for. One of
// them may since have been granted by another call's handoff: its next
// TryAcquire says so.
type diffWaiter struct {
	id       string
	req      budget.Request
	lastCall time.Time
	wakeAt   time.Time // Delayed: when its wait runs out; zero when Queued
}

// diffLease is a lease both stores granted.
type diffLease struct {
	id      string
	req     budget.Request
	held    lease.Parts
	renewed time.Time // no later than its last grant or renewal
}

type differ struct {
	t      *testing.T
	c      redis.UniversalClient
	cfg    string // the budget's config key
	seed   uint64
	rng    *rand.Rand
	clock  *fakeClock
	mem    budget.Store
	red    budget.Store
	limits budget.Limits
	pool   []budget.Domain

	ops     int // random operations drawn so far, the one running included
	next    int
	waiters []*diffWaiter
	leases  []*diffLease
	gone    []string       // ids no longer held, for heartbeats to report missing
	steps   []string       // what ran, for the failure report
	seen    map[string]int // outcomes by kind, to show what a run covered
}

func newDiffer(t *testing.T, c redis.UniversalClient, seed uint64, opts []redisstore.Option) *differ {
	rng := rand.New(rand.NewPCG(seed, 0xd1ff))
	clock := &fakeClock{now: time.UnixMicro(1_700_000_000_000_000)}
	name := fmt.Sprintf("differential/%s/%d", t.Name(), seed)
	red, err := redisstore.New(c, name, append([]redisstore.Option{
		redisstore.WithLeaseTTL(diffTTL), redisstore.WithTestClocks(clock.Now, clock.Mono)}, opts...)...)
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	t.Cleanup(func() { red.Close() })
	mem := budget.NewLocalStore(budget.LocalClock(clock.Now))
	t.Cleanup(func() { mem.Close() })
	pool := []budget.Domain{{Version: 1, ID: "a"}, {Version: 1, ID: "b"}, {Version: 2, ID: "a"}, {Version: 1, ID: "{c}:d"}, {Version: 1, ID: "e f"}}
	pool = pool[:3+rng.IntN(3)]
	return &differ{t: t, c: c, cfg: "rb:{" + hex.EncodeToString([]byte(name)) + "}:cfg",
		seed: seed, rng: rng, clock: clock, mem: mem, red: red, pool: pool, seen: map[string]int{}}
}

// randomLimits draws limits of every shape: a rate with or without its own
// burst, in-flight ceilings on some classes, bodies, and mixes. Memory is
// not among them: it is each Budget's own, and neither store sees it (the
// budget package tests the memory line).
func (d *differ) randomLimits() budget.Limits {
	for {
		var l budget.Limits
		if d.rng.IntN(3) > 0 {
			rates := []float64{0.5, 1, 2.5, 5, 10, 40}
			l.RequestsPerSecond = rates[d.rng.IntN(len(rates))]
			if d.rng.IntN(2) == 0 {
				l.Burst = 1 + d.rng.IntN(6)
			}
		}
		for _, c := range budget.Classes() {
			if d.rng.IntN(3) == 0 {
				if l.InFlight == nil {
					l.InFlight = map[budget.OpClass]int{}
				}
				l.InFlight[c] = 1 + d.rng.IntN(4)
			}
		}
		if d.rng.IntN(3) == 0 {
			l.OpenBodies = 1 + d.rng.IntN(3)
		}
		if n, err := l.Normalize(); err == nil {
			return n
		}
	}
}

func (d *differ) run(steps int) {
	d.limits = d.randomLimits()
	d.register(d.limits, false)
	for d.ops = 1; d.ops <= steps; d.ops++ {
		switch r := d.rng.IntN(100); {
		case r < 24:
			if len(d.waiters) < 12 {
				d.acquire()
			} else {
				d.poll() // keep lines short enough that leases come and go
			}
		case r < 40:
			d.poll()
		case r < 58:
			d.retire()
		case r < 63:
			d.cancel()
		case r < 70:
			d.throttle()
		case r < 88:
			d.advance()
		case r < 94:
			d.toWake()
		case r < 97:
			d.heartbeat()
		case r < 99:
			d.reregister()
		default:
			d.drain()
		}
	}
}

// step records what ran and its outcome, then compares the stores' Usage.
func (d *differ) step(format string, a ...any) {
	d.steps = append(d.steps, fmt.Sprintf(format, a...))
	d.compareUsage()
	if err := packedConfigAgrees(d.ctx(), d.c, d.cfg); err != nil {
		d.fail("%v", err)
	}
}

// packedConfigAgrees checks the config's pc (lib.lua: the per-call fields
// packed, which the scripts read in place of the fields) against the
// fields themselves, which budgetctl, the tests and older builds read.
// A config without pc (miniredis has no struct library) passes.
func packedConfigAgrees(ctx context.Context, c redis.UniversalClient, cfg string) error {
	h, err := c.HGetAll(ctx, cfg).Result()
	if err != nil {
		return err
	}
	pc, ok := h["pc"]
	if !ok {
		return nil
	}
	fields := []string{"qu", "rx", "rc", "lt", "co", "tl", "ce"}
	if len(pc) < 8*len(fields) {
		return fmt.Errorf("config %s: pc is %d bytes, want at least %d", cfg, len(pc), 8*len(fields))
	}
	for i, f := range fields {
		packed := int64(binary.BigEndian.Uint64([]byte(pc[8*i:])))
		var stored int64
		if v, ok := h[f]; ok {
			if stored, err = strconv.ParseInt(v, 10, 64); err != nil {
				return fmt.Errorf("config %s: field %s is %q", cfg, f, v)
			}
		}
		if packed != stored {
			return fmt.Errorf("config %s: pc says %s = %d, the field %d", cfg, f, packed, stored)
		}
	}
	if rid := pc[8*len(fields):]; rid != h["rid"] {
		return fmt.Errorf("config %s: pc says rid = %q, the field %q", cfg, rid, h["rid"])
	}
	return nil
}

// fail reports the first step that differed, with the sequence up to it.
func (d *differ) fail(format string, a ...any) {
	d.t.Helper()
	var b strings.Builder
	for i, s := range d.steps {
		fmt.Fprintf(&b, "  %3d %s\n", i, s)
	}
	d.t.Fatalf("seed %d: step %d differs: %s\nlimits %+v\nsteps:\n%srerun: go test ./redisstore -run '%s' -differential.seed=%d -differential.steps=%d",
		d.seed, len(d.steps)-1, fmt.Sprintf(format, a...), d.limits, b.String(), strings.SplitN(d.t.Name(), "/", 2)[0], d.seed, d.ops)
}

func (d *differ) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	d.t.Cleanup(cancel)
	return ctx
}

// errKind names an error by the sentinel it wraps, for comparing the
// stores' errors (their texts differ).
func errKind(err error) string {
	for _, s := range []error{budget.ErrLimitsConflict, budget.ErrNeverAdmissible, budget.ErrInvalidRequest, budget.ErrUnavailable} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	if err != nil {
		return "error: " + err.Error()
	}
	return "ok"
}

func (d *differ) register(l budget.Limits, replace bool) {
	em := d.mem.Register(d.ctx(), l, replace)
	er := d.red.Register(d.ctx(), l, replace)
	d.steps = append(d.steps, fmt.Sprintf("register %+v replace=%v -> %s", l, replace, errKind(em)))
	d.seen["register "+errKind(em)]++
	if errKind(em) != errKind(er) {
		d.fail("register: in-process %v, redis %v", em, er)
	}
	if em == nil {
		d.limits = l
	}
	d.compareUsage()
}

// reregister registers the same limits again, other limits without
// replace (a conflict), or other limits with replace.
func (d *differ) reregister() {
	switch d.rng.IntN(3) {
	case 0:
		d.register(d.limits, false)
	case 1:
		d.register(d.randomLimits(), false)
	default:
		d.register(d.randomLimits(), true)
	}
}

func (d *differ) randomRequest() budget.Request {
	n := 1 + d.rng.IntN(3)
	req := budget.Request{Consumer: "differential"}
	for range n {
		req.Domains = append(req.Domains, d.pool[d.rng.IntN(len(d.pool))])
	}
	classes := budget.Classes()
	req.Class = classes[d.rng.IntN(len(classes))]
	req.OpensBody = d.rng.IntN(3) == 0
	nreq, err := req.Normalize()
	if err != nil {
		d.t.Fatalf("Normalize(%+v): %v", req, err)
	}
	return nreq
}

func describe(req budget.Request) string {
	ids := make([]string, len(req.Domains))
	for i, dom := range req.Domains {
		ids[i] = dom.String()
	}
	return fmt.Sprintf("[%s] %s body=%v", strings.Join(ids, " "), req.Class, req.OpensBody)
}

func describeAttempt(a budget.Attempt, err error) string {
	if err != nil {
		return errKind(err)
	}
	switch a.Outcome {
	case budget.Delayed:
		return fmt.Sprintf("delayed %v", a.Wait)
	case budget.Granted:
		if a.GrantedAgo > 0 {
			return fmt.Sprintf("granted %v ago", a.GrantedAgo)
		}
	}
	return a.Outcome.String()
}

// try runs TryAcquire on both stores and compares: the outcome, the error's
// kind, and a Delayed wait within 1us (the scripts count microseconds,
// rounded up; the in-process store nanoseconds). A grant's age may be
// larger in Redis, never smaller: a grant learned from a handoff message
// counts from the waiter's previous call, before the grant.
func (d *differ) try(what, id string, req budget.Request) (budget.Attempt, bool) {
	am, em := d.mem.TryAcquire(d.ctx(), id, req)
	ar, er := d.red.TryAcquire(d.ctx(), id, req)
	d.steps = append(d.steps, fmt.Sprintf("%s %s %s -> in-process %s, redis %s", what, id, describe(req), describeAttempt(am, em), describeAttempt(ar, er)))
	kind := what + " " + errKind(em)
	if em == nil {
		kind = what + " " + am.Outcome.String()
		if am.GrantedAgo > 0 {
			kind += " by handoff"
		}
	}
	d.seen[kind]++
	switch {
	case errKind(em) != errKind(er):
		d.fail("TryAcquire errors: in-process %v, redis %v", em, er)
	case em != nil:
		d.compareUsage()
		return budget.Attempt{}, false
	case am.Outcome != ar.Outcome:
		d.fail("TryAcquire outcomes: in-process %v, redis %v", am.Outcome, ar.Outcome)
	case am.Outcome == budget.Delayed && (am.Wait-ar.Wait).Abs() > time.Microsecond:
		d.fail("TryAcquire waits: in-process %v, redis %v", am.Wait, ar.Wait)
	case am.Outcome == budget.Granted && ar.GrantedAgo < am.GrantedAgo-time.Microsecond:
		d.fail("grant ages: in-process %v, redis %v (earlier than the grant)", am.GrantedAgo, ar.GrantedAgo)
	}
	d.compareUsage()
	return am, true
}

func (d *differ) acquire() {
	d.next++
	id := fmt.Sprintf("s%d.%d", d.seed, d.next)
	req := d.randomRequest()
	now := d.clock.Mono()
	a, ok := d.try("acquire", id, req)
	if ok {
		d.record(id, req, a, now, now)
	}
}

// record files id after an attempt made at now: a lease, or a waiter.
// since is no later than the grant could have been made.
func (d *differ) record(id string, req budget.Request, a budget.Attempt, now, since time.Time) {
	if a.Outcome == budget.Granted {
		d.leases = append(d.leases, &diffLease{id: id, req: req, held: req.Parts(), renewed: since})
		return
	}
	w := &diffWaiter{id: id, req: req, lastCall: now}
	if a.Outcome == budget.Delayed {
		w.wakeAt = now.Add(a.Wait)
	}
	d.waiters = append(d.waiters, w)
}

// poll is a waiter's next call: after a wake, a wait, or as its liveness
// beat.
func (d *differ) poll() {
	if len(d.waiters) == 0 {
		d.acquire()
		return
	}
	d.pollWaiter(d.rng.IntN(len(d.waiters)))
}

func (d *differ) pollWaiter(i int) {
	w := d.waiters[i]
	d.waiters = slices.Delete(d.waiters, i, i+1)
	now := d.clock.Mono()
	if a, ok := d.try("poll", w.id, w.req); ok {
		d.record(w.id, w.req, a, now, w.lastCall)
	} else {
		d.gone = append(d.gone, w.id)
	}
}

// retire returns a random set of parts of a lease, some perhaps returned
// already.
func (d *differ) retire() {
	if len(d.leases) == 0 {
		d.acquire()
		return
	}
	i := d.rng.IntN(len(d.leases))
	l := d.leases[i]
	parts := lease.Parts(1 + d.rng.IntN(int(lease.All)))
	em := d.mem.Retire(d.ctx(), l.id, parts)
	er := d.red.Retire(d.ctx(), l.id, parts)
	if l.held &^= parts; l.held == 0 {
		d.leases = slices.Delete(d.leases, i, i+1)
		d.gone = append(d.gone, l.id)
	}
	d.step("retire %s %v -> %s (held %v)", l.id, parts, errKind(em), l.held)
	if errKind(em) != errKind(er) {
		d.fail("Retire: in-process %v, redis %v", em, er)
	}
}

// cancel gives up a waiter, or (rarely) cancels a lease's id or one that
// is gone, which returns whatever is held under it.
func (d *differ) cancel() {
	var id string
	switch r := d.rng.IntN(10); {
	case r < 7 && len(d.waiters) > 0:
		i := d.rng.IntN(len(d.waiters))
		id = d.waiters[i].id
		d.waiters = slices.Delete(d.waiters, i, i+1)
	case r < 9 && len(d.leases) > 0:
		i := d.rng.IntN(len(d.leases))
		id = d.leases[i].id
		d.leases = slices.Delete(d.leases, i, i+1)
	case len(d.gone) > 0:
		id = d.gone[d.rng.IntN(len(d.gone))]
	default:
		d.acquire()
		return
	}
	d.gone = append(d.gone, id)
	em := d.mem.Cancel(d.ctx(), id)
	er := d.red.Cancel(d.ctx(), id)
	d.step("cancel %s -> %s", id, errKind(em))
	if errKind(em) != errKind(er) {
		d.fail("Cancel: in-process %v, redis %v", em, er)
	}
}

// drain cancels every waiter and releases every lease, as when a run's
// lanes all finish: domains go idle, and both stores must agree on what an
// idle domain keeps (its bucket, its throttle, its start history).
func (d *differ) drain() {
	for len(d.waiters) > 0 {
		w := d.waiters[len(d.waiters)-1]
		d.waiters = d.waiters[:len(d.waiters)-1]
		d.gone = append(d.gone, w.id)
		em := d.mem.Cancel(d.ctx(), w.id)
		er := d.red.Cancel(d.ctx(), w.id)
		d.step("drain: cancel %s -> %s", w.id, errKind(em))
		if errKind(em) != errKind(er) {
			d.fail("Cancel: in-process %v, redis %v", em, er)
		}
	}
	for len(d.leases) > 0 {
		l := d.leases[len(d.leases)-1]
		d.leases = d.leases[:len(d.leases)-1]
		d.gone = append(d.gone, l.id)
		em := d.mem.Retire(d.ctx(), l.id, lease.All)
		er := d.red.Retire(d.ctx(), l.id, lease.All)
		d.step("drain: retire %s -> %s", l.id, errKind(em))
		if errKind(em) != errKind(er) {
			d.fail("Retire: in-process %v, redis %v", em, er)
		}
	}
	d.seen["drain"]++
}

// throttle reports a provider throttle on a domain, with or without a
// retry-after, and half the time more reports on it spread over the next
// second or two, as when many consumers hit one throttle: the coalescing
// window decides which count as new decreases.
func (d *differ) throttle() {
	dom := d.pool[d.rng.IntN(len(d.pool))]
	d.report(dom)
	if d.rng.IntN(2) == 0 {
		for n := 1 + d.rng.IntN(3); n > 0; n-- {
			d.advanceBy(time.Duration(50_000+d.rng.Int64N(650_000)) * time.Microsecond)
			d.report(dom)
		}
	}
}

// report is one throttle report on dom, with a retry-after half the time
// (whole microseconds: the scripts' unit).
func (d *differ) report(dom budget.Domain) {
	var pause time.Duration
	if d.rng.IntN(2) == 0 {
		pause = time.Duration(1+d.rng.Int64N(3_000_000)) * time.Microsecond
	}
	fm, em := d.mem.Throttle(d.ctx(), dom, pause)
	fr, er := d.red.Throttle(d.ctx(), dom, pause)
	d.steps = append(d.steps, fmt.Sprintf("throttle %s retry-after %v -> in-process %s %.6f, redis %s %.6f", dom, pause, errKind(em), fm, errKind(er), fr))
	d.seen[fmt.Sprintf("throttle pause=%v", pause > 0)]++
	switch {
	case errKind(em) != errKind(er):
		d.fail("Throttle: in-process %v, redis %v", em, er)
	case math.Abs(fm-fr) > 1e-9:
		d.fail("Throttle factors: in-process %v, redis %v", fm, fr)
	}
	d.compareUsage()
}

// advance lets time pass: a little, a lot, past throttle recovery (4s) and
// buckets refilling (up to a burst of 6 at 0.5/s, 12s), or minutes; or,
// now and then, steps it back.
func (d *differ) advance() {
	if d.rng.IntN(12) == 0 {
		d.stepBack()
		return
	}
	var us int64
	switch r := d.rng.IntN(10); {
	case r < 4:
		us = 1 + d.rng.Int64N(20_000)
	case r < 7:
		us = 20_000 + d.rng.Int64N(2_000_000)
	case r < 9:
		us = 2_000_000 + d.rng.Int64N(20_000_000)
	default:
		us = 20_000_000 + d.rng.Int64N(300_000_000)
	}
	d.advanceBy(time.Duration(us) * time.Microsecond)
}

// stepBack moves the time both stores read back, as when Redis TIME jumps
// back: by less than the scripts' STEP (1s), where a store may be set back
// that much, or by up to minutes, where both must go on from where they
// were. Mono, and so every renewal this test schedules, does not go back.
func (d *differ) stepBack() {
	us := 1 + d.rng.Int64N(2_000_000)
	if d.rng.IntN(2) == 0 {
		us = 2_000_000 + d.rng.Int64N(300_000_000)
	}
	step := time.Duration(us) * time.Microsecond
	d.clock.advance(-step)
	d.step("step back %v", step)
	d.seen["step back"]++
}

// toWake moves time just past the earliest Delayed waiter's wait, so that
// delayed waiters get to go; never exactly to it, where one store's
// rounding could see a token the other does not yet.
func (d *differ) toWake() {
	var at time.Time
	for _, w := range d.waiters {
		if !w.wakeAt.IsZero() && (at.IsZero() || w.wakeAt.Before(at)) {
			at = w.wakeAt
		}
	}
	if at.IsZero() {
		d.advance()
		return
	}
	jitter := time.Duration(500+d.rng.Int64N(50_000)) * time.Microsecond
	d.advanceBy(max(0, at.Sub(d.clock.Mono())) + jitter)
}

// advanceBy moves the fake time by step, first renewing what would get
// within half a TTL of expiring: heartbeats for leases, and a call for each
// waiter, as a Budget's keeper and waiters do.
func (d *differ) advanceBy(step time.Duration) {
	// Whole microseconds: the scripts see no finer time, so a clock between
	// two would show the stores two different instants.
	step = min(step, diffTTL/4).Truncate(time.Microsecond)
	later := d.clock.Mono().Add(step)
	for _, l := range d.leases {
		if later.Sub(l.renewed) > diffTTL/2 {
			d.heartbeat()
			break
		}
	}
	for i := 0; i < len(d.waiters); {
		if later.Sub(d.waiters[i].lastCall) > diffTTL/2 {
			d.pollWaiter(i) // re-filed at the end, or granted
			continue
		}
		i++
	}
	d.clock.advance(step)
	d.step("advance %v", step)
	d.seen["advance"]++
}

// heartbeat renews every lease and asks after a few ids that are gone.
func (d *differ) heartbeat() {
	var ids []string
	for _, l := range d.leases {
		ids = append(ids, l.id)
	}
	var want []string
	for range min(2, len(d.gone)) {
		id := d.gone[d.rng.IntN(len(d.gone))]
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
			want = append(want, id)
		}
	}
	mm, em := d.mem.Heartbeat(d.ctx(), ids)
	mr, er := d.red.Heartbeat(d.ctx(), ids)
	slices.Sort(mm)
	slices.Sort(mr)
	d.step("heartbeat %d ids -> in-process missing %v, redis missing %v", len(ids), mm, mr)
	d.seen["heartbeat"]++
	switch {
	case errKind(em) != errKind(er):
		d.fail("Heartbeat: in-process %v, redis %v", em, er)
	case !slices.Equal(mm, mr):
		d.fail("Heartbeat missing: in-process %v, redis %v", mm, mr)
	}
	now := d.clock.Mono()
	for _, l := range d.leases {
		l.renewed = now
	}
}

// compareUsage compares the stores' full Usage: per domain, in flight by
// class, open bodies, rate factor (1e-9), pause (1us) and queue length;
// waiters in all.
func (d *differ) compareUsage() {
	d.t.Helper()
	um, em := d.mem.Usage(d.ctx())
	ur, er := d.red.Usage(d.ctx())
	if em != nil || er != nil {
		d.fail("Usage errors: in-process %v, redis %v", em, er)
	}
	if um.Waiters != ur.Waiters {
		d.fail("usage:\n  in-process %s\n  redis      %s", describeUsage(um), describeUsage(ur))
	}
	if len(um.Domains) != len(ur.Domains) {
		d.fail("usage domains:\n  in-process %s\n  redis      %s", describeUsage(um), describeUsage(ur))
	}
	for i, m := range um.Domains {
		r := ur.Domains[i]
		same := m.Domain == r.Domain && m.OpenBodies == r.OpenBodies && m.Waiters == r.Waiters &&
			math.Abs(m.RateFactor-r.RateFactor) <= 1e-9 && (m.Paused-r.Paused).Abs() <= time.Microsecond
		for _, c := range budget.Classes() {
			same = same && m.InFlight[c] == r.InFlight[c]
		}
		if !same {
			d.fail("usage of %s:\n  in-process %s\n  redis      %s", m.Domain, describeUsage(um), describeUsage(ur))
		}
	}
}

func describeUsage(u budget.Usage) string {
	var b strings.Builder
	fmt.Fprintf(&b, "waiters %d", u.Waiters)
	for _, du := range u.Domains {
		fmt.Fprintf(&b, " | %s in-flight %v bodies %d factor %.12f paused %v queue %d",
			du.Domain, du.InFlight, du.OpenBodies, du.RateFactor, du.Paused, du.Waiters)
	}
	return b.String()
}
