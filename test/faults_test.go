//go:build linux

package test

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/recpack"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/redisstore"
)

// The fault scenarios of FAULTS.md, one test each (TestFaultNN...). L is the
// lease TTL, H = L/3 the renewal interval. Every scenario logs its seed;
// run one again with: go test ./test/ -run TestFault01 -faults.seed=N

var faultSeed = flag.Uint64("faults.seed", 0, "seed of the fault schedule (0: from the clock)")

const (
	faultL = time.Second
	faultH = faultL / 3
	// slack covers process scheduling on a loaded 2-core machine (several
	// worker processes, -race), on top of each pass bar.
	slack = 700 * time.Millisecond
)

func schedule(t *testing.T) *rand.Rand {
	s := *faultSeed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: -faults.seed=%d)", s, s)
	return rand.New(rand.NewPCG(s, 0x5eed))
}

// figure logs a named measurement in a form FAULTS.md collects.
func figure(t *testing.T, format string, args ...any) {
	t.Logf("FIGURE %s: %s", t.Name(), fmt.Sprintf(format, args...))
}

func hostOn(t testing.TB, c redis.UniversalClient, name string, slots int, opts ...budget.Option) *budget.Budget {
	t.Helper()
	s, err := redisstore.New(c, name, redisstore.WithLeaseTTL(faultL))
	if err != nil {
		t.Fatal(err)
	}
	b, err := budget.New(faultLimits(slots), append([]budget.Option{budget.WithStore(s)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func waitersOf(t testing.TB, b *budget.Budget) int {
	u, err := b.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return u.Waiters
}

func waitFor(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func expectZeroUsage(t testing.TB, b *budget.Budget, within time.Duration) {
	t.Helper()
	waitFor(t, "usage back to zero", within, func() bool {
		u, err := b.Usage(context.Background())
		if err != nil {
			return false
		}
		for _, du := range u.Domains {
			if len(du.InFlight) != 0 || du.OpenBodies != 0 || du.Waiters != 0 {
				return false
			}
		}
		return u.Waiters == 0 && u.MemoryHeld == 0
	})
}

// expectKeysHaveTTL: after a run, every key of the budget expires on its own.
func expectKeysHaveTTL(t testing.TB, c *redis.Client, name string) {
	t.Helper()
	keys, err := c.Keys(context.Background(), "rb:{"+hex.EncodeToString([]byte(name))+"}:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		// PTTL says -2 for a key that is gone: one a script deleted after
		// KEYS listed it (a queue emptied by a last call) has no TTL to
		// lack. -1 is a key that lives with none.
		if ttl := c.PTTL(context.Background(), k).Val(); ttl <= 0 && ttl != -2 {
			t.Errorf("key %s has no TTL (%v)", k, ttl)
		}
	}
}

func holdWorker(t *testing.T, srv *redistest.Server, name, consumer string) *proc {
	return startWorker(t, faultEnv{Role: "hold", Redis: srv.Addr(), Name: name, TTL: faultL, Slots: 1, Consumer: consumer})
}

func waitWorker(t *testing.T, srv *redistest.Server, name, consumer string) *proc {
	return startWorker(t, faultEnv{Role: "wait", Redis: srv.Addr(), Name: name, TTL: faultL, Slots: 1, Consumer: consumer})
}

// holderAndWaiter starts a worker holding the only slot of budget name and
// a second one queued behind it, and returns them with an observing host.
func holderAndWaiter(t *testing.T, srv *redistest.Server, name string) (obs *budget.Budget, holder, waiter *proc) {
	t.Helper()
	obs = hostOn(t, srv.Client(t), name, 1)
	holder = holdWorker(t, srv, name, "holder")
	if _, err := holder.expect("HELD", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	waiter = waitWorker(t, srv, name, "waiter")
	waitFor(t, "waiter queued", 20*time.Second, func() bool { return waitersOf(t, obs) == 1 })
	return obs, holder, waiter
}

// 1. Holder kill -9: the next waiter is granted within L + H.
func TestFault01KillHolder(t *testing.T) {
	schedule(t)
	srv := redistest.Start(t)
	name := "f01"
	obs, holder, waiter := holderAndWaiter(t, srv, name)
	smp := startSampler(t, srv.Client(t), name, []budget.Domain{faultDomain(0)}, 1)
	killed := time.Now()
	holder.kill9()
	if _, err := waiter.expect("GRANTED", faultL+faultH+slack+5*time.Second); err != nil {
		t.Fatal(err)
	}
	took := time.Since(killed)
	over, n := smp.overshoot()
	figure(t, "next waiter granted %v after kill -9 (bar L+H = %v); server-side overshoot %d in %d samples", took.Round(time.Millisecond), faultL+faultH, over, n)
	if took > faultL+faultH+slack {
		t.Errorf("granted %v after the kill, bar %v (+%v slack)", took, faultL+faultH, slack)
	}
	if over != 0 {
		t.Errorf("Redis counted %d above the ceiling", over)
	}
	if err := waiter.finish(); err != nil {
		t.Fatal(err)
	}
	expectZeroUsage(t, obs, 5*time.Second)
	expectKeysHaveTTL(t, srv.Client(t), name)
}

// 2. Holder SIGSTOP for 2L, then SIGCONT: Redis never counts above the
// ceiling; the paused holder hears Lost() at once on waking.
func TestFault02PauseHolder(t *testing.T) {
	schedule(t)
	srv := redistest.Start(t)
	name := "f02"
	obs, holder, waiter := holderAndWaiter(t, srv, name)
	smp := startSampler(t, srv.Client(t), name, []budget.Domain{faultDomain(0)}, 1)
	paused := time.Now()
	holder.signal(syscall.SIGSTOP)
	if _, err := waiter.expect("GRANTED", faultL+faultH+slack+5*time.Second); err != nil {
		t.Fatal(err)
	}
	granted := time.Since(paused)
	time.Sleep(2*faultL - granted)
	holder.signal(syscall.SIGCONT)
	resumed := time.Now()
	if _, err := holder.expect("LOST", faultH+slack); err != nil {
		t.Fatalf("paused holder: %v", err)
	}
	lostAfter := time.Since(resumed)
	over, n := smp.overshoot()
	// While paused the holder could not act on anything: from the waiter's
	// grant until the holder hears Lost(), two parties believe they hold the
	// slot. That is the effective overshoot a lease TTL allows.
	figure(t, "waiter granted %v into the pause; holder heard Lost() %v after SIGCONT; server-side overshoot %d (%d samples); effective overshoot 1 for %v (the pause after the lease expired)",
		granted.Round(time.Millisecond), lostAfter.Round(time.Millisecond), over, n, (2*faultL - granted + lostAfter).Round(time.Millisecond))
	if over != 0 {
		t.Errorf("Redis counted %d above the ceiling", over)
	}
	if err := waiter.finish(); err != nil {
		t.Fatal(err)
	}
	if err := holder.finish(); err != nil {
		t.Fatal(err)
	}
	expectZeroUsage(t, obs, 5*time.Second)
}

// 3. The waiter at the head of the queue is killed: the next live waiter is
// granted within L + H of the release, and no younger waiter passes it.
func TestFault03KillHeadWaiter(t *testing.T) {
	schedule(t)
	srv := redistest.Start(t)
	name := "f03"
	obs := hostOn(t, srv.Client(t), name, 1)
	hold, err := obs.Acquire(context.Background(), budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet})
	if err != nil {
		t.Fatal(err)
	}
	var ws []*proc
	for i := range 3 {
		w := waitWorker(t, srv, name, fmt.Sprintf("w%d", i))
		waitFor(t, "waiter queued", 20*time.Second, func() bool { return waitersOf(t, obs) == i+1 })
		ws = append(ws, w)
	}
	ws[0].kill9()
	released := time.Now()
	hold.Release()
	if _, err := ws[1].expect("GRANTED", faultL+faultH+slack+5*time.Second); err != nil {
		t.Fatal(err)
	}
	took := time.Since(released)
	select {
	case l := <-ws[2].lines:
		if strings.HasPrefix(l, "GRANTED") {
			t.Fatal("the youngest waiter was granted while an older live one held the slot")
		}
	default:
	}
	figure(t, "next live waiter granted %v after the release (bar L+H = %v)", took.Round(time.Millisecond), faultL+faultH)
	if took > faultL+faultH+slack {
		t.Errorf("granted %v after the release, bar %v", took, faultL+faultH)
	}
	if err := ws[1].finish(); err != nil {
		t.Fatal(err)
	}
	if _, err := ws[2].expect("GRANTED", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := ws[2].finish(); err != nil {
		t.Fatal(err)
	}
	expectZeroUsage(t, obs, 5*time.Second)
}

// leaseWrites counts, through MONITOR (which shows the commands scripts
// run), the grants written under each lease ID of a budget: a grant is an
// HSET of the lease's record in the budget's lease hash, with its request
// slot held and its grant time. A record written again with the same grant
// time is the same grant (moved to another session of its process); a
// second grant time under one ID would be a second grant.
type leaseWrites struct {
	mu     sync.Mutex
	grants map[string]map[int64]bool // lease ID -> grant times seen
	unread int                       // lease writes whose record would not decode
	conn   net.Conn
	marks  chan string // ECHO markers seen
	done   chan struct{}
	once   sync.Once
}

func watchLeaseWrites(t *testing.T, addr, name string) *leaseWrites {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		t.Fatalf("MONITOR: %q %v", line, err)
	}
	lw := &leaseWrites{grants: map[string]map[int64]bool{}, conn: conn, marks: make(chan string, 1), done: make(chan struct{})}
	// A session's lease hash: rb:{<hex>}:lx:<ce>:<sid> (lib.lua, lxkey).
	hset := `"HSET" "rb:{` + hex.EncodeToString([]byte(name)) + `}:lx:`
	go func() {
		defer close(lw.done)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if i := strings.Index(strings.ToUpper(line), `"ECHO" "`); i >= 0 { // as sent: go-redis writes "echo"
				select {
				case lw.marks <- strings.TrimSuffix(strings.TrimSpace(line[i+8:]), `"`):
				default:
				}
				continue
			}
			i := strings.Index(line, hset)
			if i < 0 {
				continue
			}
			_, fields, ok := strings.Cut(line[i+len(hset):], `" "`) // past the rest of the key
			if !ok {
				continue
			}
			id, quoted, ok := strings.Cut(fields, `" "`)
			if !ok {
				continue
			}
			v, ok := unquoteMonitor(quoted)
			if _, waiter := recpack.DecodeMarker(v); ok && (waiter || id == "") {
				continue // a queued waiter's marker, or the key's own field (lib.lua, Queues, lease_put)
			}
			var rec recpack.Lease
			if ok {
				var err error
				rec, err = recpack.DecodeLease(v)
				ok = err == nil
			}
			if !ok {
				lw.mu.Lock()
				lw.unread++
				lw.mu.Unlock()
				continue
			}
			if !rec.Request {
				continue // a partial retirement, not a grant
			}
			lw.mu.Lock()
			if lw.grants[id] == nil {
				lw.grants[id] = map[int64]bool{}
			}
			lw.grants[id][rec.Granted] = true
			lw.mu.Unlock()
		}
	}()
	t.Cleanup(lw.stop)
	return lw
}

func (lw *leaseWrites) stop() {
	lw.once.Do(func() {
		lw.conn.Close()
		<-lw.done
	})
}

// maxPerID waits until MONITOR has shown every command sent before it (an
// ECHO sent through c comes after them), and returns the largest number of
// grants under one lease ID and the number of IDs granted. It fails t when
// it saw fewer IDs than the granted grants the test counted, or a write it
// could not read.
func (lw *leaseWrites) maxPerID(t *testing.T, c *redis.Client, granted int64) (most, ids int) {
	mark := fmt.Sprintf("end-of-run-%d", time.Now().UnixNano())
	if err := c.Echo(context.Background(), mark).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-lw.marks:
		if m != mark {
			t.Fatalf("MONITOR showed marker %q, want %q", m, mark)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("MONITOR never showed the end marker")
	}
	lw.stop()
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.unread > 0 {
		t.Errorf("MONITOR showed %d lease writes this test could not read", lw.unread)
	}
	for _, g := range lw.grants {
		most = max(most, len(g))
	}
	if int64(len(lw.grants)) < granted {
		t.Errorf("MONITOR showed %d lease IDs written for %d grants", len(lw.grants), granted)
	}
	return most, len(lw.grants)
}

// unquoteMonitor reads one argument as MONITOR quotes it (the part after
// its opening quote): backslash escapes for \\, \", \n, \r, \t, \a, \b
// and \xHH for other bytes outside printable ASCII. It returns the bytes,
// and false when the closing quote is missing or an escape is malformed.
func unquoteMonitor(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), true
		case '\\':
			if i+1 >= len(s) {
				return "", false
			}
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 'x':
				if i+2 >= len(s) {
					return "", false
				}
				v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
				if err != nil {
					return "", false
				}
				b.WriteByte(byte(v))
				i += 2
			default:
				b.WriteByte(s[i]) // \\ and \"
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", false
}

// 4. 1000 acquires cancelled at random points, some of them after the
// script granted and before the reply arrived: no ghost waiter, no orphaned
// lease after L, at most one grant per waiter ID.
func TestFault04RandomCancels(t *testing.T) {
	rng := schedule(t)
	srv := redistest.Start(t)
	name := "f04"
	lw := watchLeaseWrites(t, srv.Addr(), name)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	b := hostOn(t, c, name, 4)
	if l, err := b.Acquire(context.Background(), budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet}); err == nil {
		l.Release() // scripts loaded
	}
	// Deadlines from 0 to 30ms: 40 lanes on 4 slots queue for a few ms, so
	// cancellations land before the first call, while queued, and around
	// grants (a deadline that fires mid-call drops the reply of a script
	// that may have granted).
	deadlines := make([]time.Duration, 1000)
	for i := range deadlines {
		deadlines[i] = time.Duration(rng.IntN(30000)) * time.Microsecond
	}
	var granted, cancelled atomic.Int64
	var wg sync.WaitGroup
	for g := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < len(deadlines); i += 40 {
				ctx, cancel := context.WithTimeout(context.Background(), deadlines[i])
				l, err := b.Acquire(ctx, budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet})
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("Acquire: %v", err)
					}
					cancelled.Add(1)
					continue
				}
				granted.Add(1)
				l.Release()
			}
		}()
	}
	wg.Wait()
	expectZeroUsage(t, b, faultL+faultH+slack)
	most, ids := lw.maxPerID(t, srv.Client(t), granted.Load())
	p := "rb:{" + hex.EncodeToString([]byte(name)) + "}:"
	keys := srv.Client(t).Keys(context.Background(), p+"w:*").Val()
	recs, _ := redistest.Leases(context.Background(), srv.Client(t), p)
	for id := range recs {
		keys = append(keys, "lease "+id)
	}
	figure(t, "1000 acquires: %d granted, %d cancelled; %d lease IDs written, at most %d grant(s) per ID; %d lease records or waiter keys left after L",
		granted.Load(), cancelled.Load(), ids, most, len(keys))
	if most > 1 {
		t.Errorf("a waiter ID was granted %d times", most)
	}
	if len(keys) != 0 {
		t.Errorf("left over after L: %v", keys)
	}
}

// 5. Double release, a release after the lease expired and its slot went
// to someone else, and a forged lease ID: none of them affects others.
func TestFault05BadReleases(t *testing.T) {
	schedule(t)
	srv := redistest.Start(t)
	name := "f05"
	c := srv.Client(t)
	b := hostOn(t, c, name, 2)
	d := faultDomain(0)
	req := budget.Request{Domains: []budget.Domain{d}, Class: budget.OpGet}
	inFlight := func() int {
		u, err := b.Usage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, du := range u.Domains {
			if du.Domain == d {
				return du.InFlight[budget.OpGet]
			}
		}
		return 0
	}
	other, _ := b.Acquire(context.Background(), req)
	l, _ := b.Acquire(context.Background(), req)
	l.Release()
	l.Release()
	l.CompleteRequest()
	if n := inFlight(); n != 1 {
		t.Fatalf("after a double release: %d in flight, want 1 (the other lease)", n)
	}

	// A raw store whose lease nobody renews: it expires, the slot is given
	// to another holder, and then the stale holder retires it.
	stale, err := redisstore.New(c, name, redisstore.WithLeaseTTL(faultL))
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()
	nreq, _ := req.Normalize()
	if att, err := stale.TryAcquire(context.Background(), "stale-lease", nreq); err != nil || att.Outcome != budget.Granted {
		t.Fatalf("stale grant: %+v %v", att, err)
	}
	regrant, err := b.Acquire(context.Background(), req) // waits out the expiry
	if err != nil {
		t.Fatal(err)
	}
	if err := stale.Retire(context.Background(), "stale-lease", 7); err != nil {
		t.Fatal(err)
	}
	if err := stale.Cancel(context.Background(), "stale-lease"); err != nil {
		t.Fatal(err)
	}
	for _, forged := range []string{"forged", regrant.ID() + "x", "00000000-0000-0000-0000-000000000000.1"} {
		stale.Retire(context.Background(), forged, 7)
		stale.Cancel(context.Background(), forged)
	}
	if n := inFlight(); n != 2 {
		t.Fatalf("after a stale release and forged IDs: %d in flight, want 2 (other and the re-grant)", n)
	}
	figure(t, "double release, release after expiry and re-grant, 3 forged IDs: others' counts unchanged")
	other.Release()
	regrant.Release()
	expectZeroUsage(t, b, 5*time.Second)
}

// 6. Lost wake: the waiters' notification connections are killed right
// before each release. Grants still come within H + a round trip, from the
// waiters' own liveness calls.
func TestFault06LostWake(t *testing.T) {
	schedule(t)
	srv := redistest.Start(t)
	name := "f06"
	admin := srv.Client(t)
	holder := hostOn(t, srv.Client(t), name, 1)
	waiter := hostOn(t, srv.Client(t), name, 1)
	d := faultDomain(0)
	req := budget.Request{Domains: []budget.Domain{d}, Class: budget.OpGet}
	var worst time.Duration
	for range 3 {
		h, err := holder.Acquire(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			l, err := waiter.Acquire(context.Background(), req)
			if err != nil {
				t.Error(err)
				got <- time.Time{}
				return
			}
			at := time.Now()
			l.Release()
			got <- at
		}()
		waitFor(t, "waiter queued", 10*time.Second, func() bool { return waitersOf(t, holder) == 1 })
		if err := admin.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err(); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		h.Release()
		at := <-got
		if at.IsZero() {
			t.FailNow()
		}
		worst = max(worst, at.Sub(released))
	}
	figure(t, "worst grant after a release with the wake connection killed: %v (bar H + RTT = %v + RTT)", worst.Round(time.Millisecond), faultH)
	if worst > faultH+slack {
		t.Errorf("grant %v after the release, bar H = %v", worst, faultH)
	}
}

// 7. Redis killed: nothing is granted while it is down; Acquire returns
// ErrUnavailable after the grace, or the caller's deadline error no later
// than 100ms past it; held leases are declared lost within L.
func TestFault07RedisKilled(t *testing.T) {
	schedule(t)
	srv := redistest.Start(t)
	name := "f07"
	const grace = 1500 * time.Millisecond
	b := hostOn(t, srv.Client(t), name, 2, budget.WithUnavailableGrace(grace))
	req := budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet}
	held, err := b.Acquire(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	down := time.Now()
	lostAt := make(chan time.Duration, 1)
	go func() {
		select {
		case <-held.Lost():
			lostAt <- time.Since(down)
		case <-time.After(faultL + slack):
			lostAt <- -1
		}
	}()

	_, err = b.Acquire(context.Background(), req)
	graceTook := time.Since(down)
	if !errors.Is(err, budget.ErrUnavailable) {
		t.Fatalf("Acquire with Redis down = %v, want ErrUnavailable", err)
	}
	var late time.Duration
	for _, dl := range []time.Duration{50 * time.Millisecond, 300 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), dl)
		start := time.Now()
		_, err := b.Acquire(ctx, req)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Acquire with a %v deadline = %v", dl, err)
		}
		late = max(late, time.Since(start)-dl)
	}
	lostAfter := <-lostAt
	if lostAfter < 0 {
		t.Fatal("held lease not declared lost with Redis down")
	}
	figure(t, "ErrUnavailable after %v (grace %v); deadline errors at most %v late; held lease lost %v after the kill (bar L = %v, + 50ms for the timer)",
		graceTook.Round(time.Millisecond), grace, late.Round(time.Millisecond), lostAfter.Round(time.Millisecond), faultL)
	if late > 100*time.Millisecond {
		t.Errorf("deadline error %v late, bar 100ms", late)
	}
	if graceTook < grace || graceTook > grace+slack {
		t.Errorf("ErrUnavailable after %v, want about %v", graceTook, grace)
	}
	// Lost fires the keeper's LostAfter (L less a tenth) after the last
	// renewal sent before the kill, which is no later than the kill: before
	// Redis could have expired the lease, by a margin for a timer that fires
	// late on a loaded machine. The bar allows 50ms past L for the timer
	// beyond that margin: under -race on a loaded machine one fired 100ms
	// late (1.001s), and before the margin one 77ms late (1.077s).
	if lostAfter > faultL+50*time.Millisecond {
		t.Errorf("lease declared lost %v after the kill, bar L = %v (+50ms timer latency)", lostAfter, faultL)
	}
	held.Release()
	srv.Restart(t)
	l, err := b.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("no recovery after Redis came back: %v", err)
	}
	l.Release()
}

// 9. Redis hung (SIGSTOP) and Redis BUSY with a long script: calls honor
// their deadlines, nothing is granted, and work resumes afterwards.
func TestFault09HungAndBusy(t *testing.T) {
	schedule(t)
	srv := redistest.Start(t, redistest.WithConfig("busy-reply-threshold 50"))
	name := "f09"
	b := hostOn(t, srv.Client(t), name, 2, budget.WithUnavailableGrace(time.Hour))
	req := budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet}
	b.Acquire(context.Background(), req) // scripts loaded, connection warm
	try := func(what string) time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		l, err := b.Acquire(ctx, req)
		if err == nil {
			l.Release()
			t.Errorf("%s: granted", what)
		} else if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %v, want DeadlineExceeded", what, err)
		}
		return time.Since(start) - 300*time.Millisecond
	}

	srv.Pause()
	hungLate := try("hung")
	srv.Resume()

	busy := make(chan error, 1)
	go func() {
		busy <- srv.Client(t).Eval(context.Background(),
			"local t = redis.call('TIME') repeat local n = redis.call('TIME') until (n[1] - t[1]) * 1000000 + (n[2] - t[2]) > 1500000 return 1", nil).Err()
	}()
	time.Sleep(200 * time.Millisecond) // past busy-reply-threshold: others now get BUSY
	busyLate := try("busy")
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	l, err := b.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("no recovery: %v", err)
	}
	l.Release()
	figure(t, "deadline errors %v late with Redis stopped, %v late with Redis BUSY (bar 100ms); no grant; recovered", hungLate.Round(time.Millisecond), busyLate.Round(time.Millisecond))
	if hungLate > 100*time.Millisecond || busyLate > 100*time.Millisecond {
		t.Errorf("deadline honored late: %v hung, %v busy", hungLate, busyLate)
	}
}

// 10. SCRIPT FLUSH and FUNCTION FLUSH every 100ms under load (Redis
// forgetting the scripts and the library, as after a restart without
// persistence): callers see no error at all.
func TestFault10ScriptFlush(t *testing.T) {
	schedule(t)
	srv := redistest.Start(t)
	name := "f10"
	b := hostOn(t, srv.Client(t), name, 4)
	admin := srv.Client(t)
	stop := make(chan struct{})
	var flushes atomic.Int64
	go func() {
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				admin.ScriptFlush(context.Background())
				admin.FunctionFlush(context.Background())
				flushes.Add(1)
			}
		}
	}()
	dur := 1500 * time.Millisecond
	if long {
		dur = 15 * time.Second
	}
	var ops, errs atomic.Int64
	var wg sync.WaitGroup
	begin := time.Now()
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(begin) < dur {
				l, err := b.Acquire(context.Background(), budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet})
				if err != nil {
					errs.Add(1)
					continue
				}
				if _, err := b.Usage(context.Background()); err != nil {
					errs.Add(1)
				}
				l.Release()
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	figure(t, "%d acquire/usage/release rounds under %d script and function flushes: %d caller-visible errors", ops.Load(), flushes.Load(), errs.Load())
	if errs.Load() != 0 {
		t.Errorf("%d errors", errs.Load())
	}
	expectZeroUsage(t, b, 5*time.Second)
}

// 12. go-redis retries a command it already wrote (the server was paused
// with CLIENT PAUSE past the read timeout): every script is idempotent by
// ID, so at most one grant per ID, and usage returns to zero.
func TestFault12RetryAfterWrite(t *testing.T) {
	schedule(t)
	srv := redistest.Start(t)
	name := "f12"
	lw := watchLeaseWrites(t, srv.Addr(), name)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, ReadTimeout: 50 * time.Millisecond,
		MaxRetries: 5, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	b := hostOn(t, c, name, 4, budget.WithUnavailableGrace(time.Hour))
	admin := srv.Client(t)
	before := commandCalls(t, admin, "evalsha") + commandCalls(t, admin, "fcall")
	sent := &countingHook{}
	c.AddHook(sent)
	stop := make(chan struct{})
	var pauses atomic.Int64
	go func() {
		for {
			// Longer than the client's read timeout: it gives up on a
			// command Redis will still run, and go-redis retries it.
			admin.Do(context.Background(), "CLIENT", "PAUSE", "120", "ALL")
			pauses.Add(1)
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	dur := 1500 * time.Millisecond
	if long {
		dur = 15 * time.Second
	}
	begin := time.Now()
	var wg sync.WaitGroup
	var granted atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(begin) < dur {
				l, err := b.Acquire(context.Background(), budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet})
				if err != nil {
					t.Error(err)
					return
				}
				granted.Add(1)
				l.Release()
			}
		}()
	}
	wg.Wait()
	close(stop)
	expectZeroUsage(t, b, faultL+slack)
	most, ids := lw.maxPerID(t, srv.Client(t), granted.Load())
	ran := commandCalls(t, admin, "evalsha") + commandCalls(t, admin, "fcall") - before
	figure(t, "%d grants under %d pauses; Redis ran %d script calls, the client issued %d (go-redis resent those its read timeout cut off; a cut-off command dies with its connection); %d lease IDs, at most %d grant(s) per ID",
		granted.Load(), pauses.Load(), ran, sent.n.Load(), ids, most)
	if most > 1 {
		t.Errorf("an ID was granted %d times", most)
	}
}

type countingHook struct{ n atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "fcall" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func commandCalls(t testing.TB, c *redis.Client, cmd string) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			var n int64
			fmt.Sscanf(rest, "%d", &n)
			return n
		}
	}
	return 0
}
