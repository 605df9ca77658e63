//go:build linux

package test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/redistest"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/redisstore"
	"github.com/runbudget/runbudget/test/history"
)

// The history checker in the fault suite (test/history): scenarios record
// every grant and retirement their hosts are told of, with the client's
// times of each call and reply, and porcupine checks the record against a
// sequential model of the budget. Here: scenario 15's load with every
// worker recording, and a planted over-admission that the checker must
// catch.

var historyDump = flag.String("history.dump", "", "write every checked history (JSON) and porcupine's view of it (HTML) to this directory")

// checkHistory checks h, logs the result as a FIGURE and, with
// -history.dump, writes h and porcupine's view of the check there. The
// caller decides what the result must be.
func checkHistory(t *testing.T, h history.History, opt history.Options) history.Result {
	t.Helper()
	res := history.Check(h, opt)
	figure(t, "history: %s", res.Summary())
	if *historyDump != "" {
		base := filepath.Join(*historyDump, strings.NewReplacer("/", "_", "=", "-").Replace(t.Name()))
		if err := os.MkdirAll(*historyDump, 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(base + ".json")
		if err != nil {
			t.Fatal(err)
		}
		err = h.Write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = res.Visualize(base + ".html")
		}
		if err != nil {
			t.Errorf("dumping the history: %v", err)
		}
		t.Logf("history written to %s.json and %s.html", base, base)
	}
	return res
}

// envHistoryDir, set in a lanes worker's environment beside envFault, makes
// the worker record its history and write it there as <consumer>.json.
const envHistoryDir = "RUNBUDGET_HISTORY_DIR"

// A recording worker is started as any other (startWorker), with
// envHistoryDir set in the parent's environment: it runs before TestMain
// would take the worker as a plain one.
func init() {
	dir, spec := os.Getenv(envHistoryDir), os.Getenv(envFault)
	if dir == "" || spec == "" {
		return
	}
	if err := runHistoryWorker(spec, dir); err != nil {
		fmt.Fprintln(os.Stderr, "history worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runHistoryWorker is runFaultWorker's lanes role with a recorder between
// the Budget and the store; after the lanes stop and the Budget is closed
// (every cancellation made), it writes the history to dir. Each grant is
// bounded below by the store's own time of it, read from the lease's record
// (grantClock): a handoff is otherwise bounded by the waiter's latest
// renewal, a fraction of a renewal interval earlier, and the long run's
// check took a minute. A grant the store made after its reply fails the
// worker.
func runHistoryWorker(spec, dir string) error {
	f, err := decodeFaultEnv(spec)
	if err != nil {
		return err
	}
	if f.Role != "lanes" {
		return fmt.Errorf("a recording worker runs lanes, not %q", f.Role)
	}
	c := redis.NewClient(&redis.Options{Addr: f.Redis, ContextTimeoutEnabled: true, DialTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer c.Close()
	s, err := redisstore.New(c, f.Name, redisstore.WithLeaseTTL(f.TTL))
	if err != nil {
		return err
	}
	rec := history.NewRecorder(s, f.Consumer)
	clock := newGrantClock(c, f.Name)
	b, err := budget.New(laneLimits(f.Slots, f.Domains), budget.WithStore(clock.wrap(rec)), budget.WithUnavailableGrace(time.Hour))
	if err != nil {
		return err
	}
	stdinClosed := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdinClosed) }()
	runErr := runLanes(b, f, &syncWriter{w: os.Stdout}, stdinClosed)
	b.Close()
	h := rec.History()
	if _, after := boundGrants(&h, clock.times()); after > 0 {
		runErr = errors.Join(runErr, fmt.Errorf("%d grants made, by the store's clock, after their holder was told of them", after))
	}
	out := filepath.Join(dir, f.Consumer+".json")
	tmp, err := os.CreateTemp(dir, ".history-*")
	if err != nil {
		return err
	}
	err = h.Write(tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), out)
	}
	if err != nil {
		return err
	}
	return runErr
}

// readHistories merges the histories the workers wrote to dir.
func readHistories(t *testing.T, dir string, want int) history.History {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != want {
		t.Fatalf("%d histories written, want %d", len(files), want)
	}
	var hs []history.History
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		h, err := history.Read(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		hs = append(hs, h)
	}
	return history.Merge(hs...)
}

// 15, recorded: scenario 15's load (processes x lanes on 8 slots over 4
// domains, each lease's request, body and memory retired apart), with
// every worker recording its history; the merged history is checked.
func TestFault15LoadHistory(t *testing.T) {
	schedule(t)
	r := newLoadRig(t, "f15h")
	dir := t.TempDir()
	t.Setenv(envHistoryDir, dir)
	failed := r.wait(t, r.start(t))
	over, overFor, starts := r.ref.report()
	figure(t, "%d processes x %d lanes, %v, 8 slots over 4 domains: %d holds reported; referee overshoot %d (for %v); %d workers failed",
		r.procs, r.lanes, r.dur, starts, over, overFor, failed)
	if over > 0 || failed > 0 {
		t.Errorf("referee overshoot %d, %d workers failed", over, failed)
	}
	res := checkHistory(t, readHistories(t, dir, r.procs), history.Options{Limits: laneLimits(loadSlots, 4), Timeout: 5 * time.Minute})
	if err := res.Err(); err != nil {
		t.Error(err)
	}
	if res.Grants == 0 {
		t.Error("the history holds no grant")
	}
	expectZeroUsage(t, r.obs, 3*faultL+slack)
}

// overGrantStore is a planted bug: now and then it tells a waiter the store
// queued that it is granted, at once, while the store's grant comes only
// when a slot frees (a goroutine keeps the waiter's place and collects the
// grant). Until then the run holds one more lease than the ceiling: for a
// few milliseconds, or for all of a short hold.
type overGrantStore struct {
	budget.Store
	every int // one queued answer in every this many is turned into a grant

	mu      sync.Mutex
	rng     *rand.Rand
	planted map[string]*plant // by waiter ID, until the store's grant is collected
	ids     []string          // every ID planted, in order
}

// plant is one early grant: a goroutine collecting the store's grant.
type plant struct {
	stop chan struct{}
	done chan struct{}
	real bool // the store's grant was collected
}

func newOverGrantStore(s budget.Store, every int, seed uint64) *overGrantStore {
	return &overGrantStore{Store: s, every: every, rng: rand.New(rand.NewPCG(seed, 0xbad)), planted: map[string]*plant{}}
}

func (s *overGrantStore) TryAcquire(ctx context.Context, id string, req budget.Request) (budget.Attempt, error) {
	att, err := s.Store.TryAcquire(ctx, id, req)
	if err != nil || att.Outcome == budget.Granted {
		return att, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.planted[id] != nil || s.rng.IntN(s.every) != 0 {
		return att, nil
	}
	p := &plant{stop: make(chan struct{}), done: make(chan struct{})}
	s.planted[id] = p
	s.ids = append(s.ids, id)
	go s.collect(id, req, att, p)
	return budget.Attempt{Outcome: budget.Granted}, nil
}

// collect keeps waiter id in line (its liveness call every third of the
// TTL, or sooner on a wake or when a delay is over) until the store grants
// it, or until stop.
func (s *overGrantStore) collect(id string, req budget.Request, att budget.Attempt, p *plant) {
	defer close(p.done)
	for {
		wait := s.LeaseTTL() / 3
		if att.Outcome == budget.Delayed {
			wait = min(wait, att.Wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-p.stop:
			t.Stop()
			return
		case <-att.Wake:
		case <-t.C:
		}
		t.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		a, err := s.Store.TryAcquire(ctx, id, req)
		cancel()
		if err == nil {
			if a.Outcome == budget.Granted {
				s.mu.Lock()
				p.real = true
				s.mu.Unlock()
				return
			}
			att = a
		}
	}
}

// settle stops collecting id's grant and reports whether the store made it.
func (s *overGrantStore) settle(id string) (planted, real bool) {
	s.mu.Lock()
	p := s.planted[id]
	s.mu.Unlock()
	if p == nil {
		return false, false
	}
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.planted, id)
	return true, p.real
}

// Retire gives back a planted lease the store never granted by taking its
// waiter out of line (and returning a grant that raced with that).
func (s *overGrantStore) Retire(ctx context.Context, id string, parts lease.Parts) error {
	if planted, real := s.settle(id); planted && !real {
		return s.Store.Cancel(ctx, id)
	}
	return s.Store.Retire(ctx, id, parts)
}

func (s *overGrantStore) Cancel(ctx context.Context, id string) error {
	s.settle(id)
	return s.Store.Cancel(ctx, id)
}

// Heartbeat hides that a planted lease is not in the store yet.
func (s *overGrantStore) Heartbeat(ctx context.Context, ids []string) ([]string, error) {
	missing, err := s.Store.Heartbeat(ctx, ids)
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := missing[:0]
	for _, id := range missing {
		if p := s.planted[id]; p == nil || p.real {
			kept = append(kept, id)
		}
	}
	return kept, err
}

func (s *overGrantStore) Close() error {
	s.mu.Lock()
	var ids []string
	for id := range s.planted {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.settle(id)
	}
	return s.Store.Close()
}

func (s *overGrantStore) plantedIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ids...)
}

// TestHistoryCatchesOverGrant: lanes on one budget through the planted
// overGrantStore. The history checker must find the run above its ceiling
// and name the planted grants; the referee's verdict is reported beside
// it. The same lanes without the plant pass.
func TestHistoryCatchesOverGrant(t *testing.T) {
	rng := schedule(t)
	srv := redistest.Start(t)
	t.Run("control", func(t *testing.T) { runOverGrant(t, srv, 0, 0) })
	t.Run("planted", func(t *testing.T) { runOverGrant(t, srv, 16, rng.Uint64()) })
}

// runOverGrant runs 8 lanes with 2ms holds for 1.5s on a ceiling of 2,
// one queued answer in every (0: none) turned into an early grant, and
// checks the history.
func runOverGrant(t *testing.T, srv *redistest.Server, every int, seed uint64) {
	const ceiling, lanes = 2, 8
	dur := 1500 * time.Millisecond
	lim := faultLimits(ceiling)
	s, err := redisstore.New(srv.Client(t), "planted-"+strconv.Itoa(every), redisstore.WithLeaseTTL(faultL))
	if err != nil {
		t.Fatal(err)
	}
	var st budget.Store = s
	var bug *overGrantStore
	if every > 0 {
		bug = newOverGrantStore(s, every, seed)
		st = bug
	}
	rec := history.NewRecorder(st, "host")
	b, err := budget.New(lim, budget.WithStore(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ref := startReferee(t, func(string) int { return ceiling })
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, lanes)
	for lane := range lanes {
		rc, err := dialReferee(ref.addr(), "lane"+strconv.Itoa(lane))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer rc.Close()
			req := budget.Request{Domains: []budget.Domain{faultDomain(0)}, Class: budget.OpGet}
			for ctx.Err() == nil {
				l, err := b.Acquire(ctx, req)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				err = rc.start("get")
				if err == nil {
					t := time.NewTimer(2 * time.Millisecond)
					<-t.C
					err = rc.end("get")
				}
				l.Release()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	b.Close() // every cancellation made: the history is whole

	h := rec.History()
	res := checkHistory(t, h, history.Options{Limits: lim})
	over, overFor, _ := ref.report()
	if bug == nil {
		figure(t, "no plant: %d grants; referee overshoot %d", res.Grants, over)
		if err := res.Err(); err != nil {
			t.Error(err)
		}
		return
	}
	planted := bug.plantedIDs()
	// A planted grant is named when an instant above the ceiling falls
	// while it was held for certain.
	held := map[string][2]int64{}
	for _, w := range h.Waiters {
		if w.Granted() {
			held[w.ID] = [2]int64{w.GrantTo, history.Open}
		}
	}
	for _, f := range h.Frees {
		if iv, ok := held[f.Lease]; ok && f.From < iv[1] {
			held[f.Lease] = [2]int64{iv[0], f.From}
		}
	}
	named := 0
	for _, id := range planted {
		iv := held[id]
		for _, o := range res.Over {
			if at := o.At.UnixNano(); at >= iv[0] && at <= iv[1] {
				named++
				break
			}
		}
	}
	figure(t, "planted: %d of %d grants told before the store made them (ceiling %d, %d lanes, 2ms holds); checker: porcupine %s, %d instants above the ceiling, %d of the %d planted grants held at one of them; referee: overshoot %d, %v above the ceiling in all",
		len(planted), res.Grants, ceiling, lanes, res.Verdict, len(res.Over), named, len(planted), over, overFor.Round(time.Microsecond))
	if len(planted) == 0 {
		t.Fatal("nothing was planted")
	}
	if res.Verdict != porcupine.Illegal {
		t.Errorf("porcupine said %s of a run with %d planted over-grants", res.Verdict, len(planted))
	}
	if named == 0 {
		t.Errorf("no instant above the ceiling falls in a planted grant")
	}
	if err := res.Err(); err != nil {
		t.Logf("the checker says: %v", err)
	}
}
