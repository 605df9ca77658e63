package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/lease"
)

// DefaultLeaseTTL is how long a lease or waiter survives without renewal
// when WithLeaseTTL is not given. Renewals run every third of it, so a
// holder can miss two in a row (a GC pause, a slow network) without losing
// its lease, and a crashed host's slots come back within 15 seconds.
const DefaultLeaseTTL = 15 * time.Second

// minLeaseTTL keeps renewals (every TTL/3) well above a round trip.
const minLeaseTTL = 30 * time.Millisecond

// Option configures New.
type Option func(*Store)

// WithLeaseTTL sets how long a lease or a waiter lives without renewal
// (default DefaultLeaseTTL, at least 30ms). Renewals run every d/3. Shorter
// brings a crashed host's slots back sooner; longer tolerates longer pauses
// before a live holder is declared lost.
func WithLeaseTTL(d time.Duration) Option { return func(s *Store) { s.ttl = d } }

// withClock makes every script take now() as the time instead of Redis
// TIME, and the store's own bookkeeping (renewal ages, grant ages) read it
// instead of time.Now: tests step one fake time for the scripts and the
// in-process store alike. Production never sets it: hosts with skewed
// clocks must share one budget, which only Redis TIME gives them.
func withClock(now func() time.Time) Option { return func(s *Store) { s.clock, s.own = now, now } }

// withClocks is withClock with the store's own bookkeeping on a clock of
// its own: a test that steps the scripts' time back gives the store a
// clock that never goes back, as time.Now's monotonic reading never does.
func withClocks(scripts, own func() time.Time) Option {
	return func(s *Store) { s.clock, s.own = scripts, own }
}

// Store is a budget.Store kept in Redis, shared by every host that opens it
// with the same name. Build a budget on it with budget.New(limits,
// budget.WithStore(store)); the budget then owns the store and closes it.
type Store struct {
	client redis.UniversalClient
	sc     *scriptSet
	lib    *library // nil: run scripts with EVALSHA
	name   string
	ttl    time.Duration
	// evalOnly keeps scripts on EVALSHA even where the library could be
	// loaded (tests of that path on Redis 7).
	evalOnly bool
	idle     time.Duration
	refusals *refusalWatch    // connections Redis refused for maxclients
	pubCmd   string           // PUBLISH, or SPUBLISH on a Cluster
	stuck    time.Duration    // see stuckAfter (batch.go)
	proc     string           // this process's name in wake channels
	clock    func() time.Time // nil: Redis TIME (see withClock)
	own      func() time.Time // nil: time.Now, for the store's bookkeeping
	// noRenew turns off the waiter renewals (renew.go), for tests that
	// drive time themselves.
	noRenew   bool
	renewStop context.CancelFunc // ends the renewals; nil when none run
	renewDone chan struct{}      // closed when they have ended

	// shardKey spreads domains over groups (WithShardKey); nil: one group,
	// single, for the whole budget.
	shardKey func(budget.Domain) string
	single   *group

	// reasserting is held for writing while leases are put back after a
	// state loss, and for reading by retirements and cancellations, so a
	// lease released meanwhile is never put back from a stale snapshot.
	reasserting sync.RWMutex

	mu      sync.Mutex
	limits  budget.Limits         // last registered, to register again after a state loss
	replace bool                  // this host's limits replace stored ones, in every group it uses
	groups  map[string]*group     // shard groups this process uses, by key (sharded only)
	wakes   map[string]*waiting   // this process's waiters, by ID
	leases  map[string]*heldLease // leases granted through this store, for heartbeats

	hubMu     sync.Mutex
	hubs      map[string]*hub // wake subscriptions, by server ("" off a Cluster); nil once closed
	closeOnce sync.Once

	// closing stops retirements from detaching once Close has begun, and
	// detachedLeads counts the goroutines leading a batch for detached
	// operations (batch.go), which Close waits for.
	closing       atomic.Bool
	detachedLeads sync.WaitGroup
}

// heldLease is what this process knows of a lease it holds: enough to renew
// its domains' keys, and to put it back after Redis lost the budget.
type heldLease struct {
	g        *group
	sid      string // the session it is in: its group's current one
	encs     []string
	class    int
	consumer string
	held     lease.Parts
	// listed is when a heartbeat last listed it (or when it was granted):
	// one not listed for a TTL is no longer renewed by its holder, and is
	// retired (see Heartbeat).
	listed time.Time
}

var _ budget.Store = (*Store)(nil)

// New opens the budget called name (any bytes) on client and subscribes to
// this process's wake channel. The client must have ContextTimeoutEnabled
// set, so a context's deadline bounds a call to a hung Redis; New refuses
// a client without it. It also refuses a Redis whose maxmemory-policy could
// evict the budget's keys (anything but noeviction), since an evicted lease
// would silently free its slots. Errors when Redis cannot be reached wrap
// budget.ErrUnavailable.
func New(client redis.UniversalClient, name string, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: New needs a client")
	}
	if name == "" {
		return nil, errors.New("redisstore: budget name is empty")
	}
	if len(name) > 1024 {
		return nil, fmt.Errorf("redisstore: budget name is %d bytes, at most 1024", len(name))
	}
	if err := checkClient(client); err != nil {
		return nil, err
	}
	s := baseStore(client, name)
	for _, o := range opts {
		o(s)
	}
	if s.ttl < minLeaseTTL {
		return nil, fmt.Errorf("redisstore: lease TTL %v is below %v", s.ttl, minLeaseTTL)
	}
	// Idle keys outlive any lease by far, so the reclaim step (run by every
	// script) always gets to an expired lease before its keys could expire.
	s.idle = max(20*s.ttl, 5*time.Minute)
	s.proc = uuid.NewString()
	if s.shardKey == nil {
		s.single = s.newGroup("")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.refusals = watchRefusals(ctx, client)
	if err := checkEviction(ctx, client); err != nil {
		return nil, s.explain(err)
	}
	var err error
	if s.sc, err = scriptsFor(ctx, client); err != nil {
		return nil, s.explain(err)
	}
	// Redis 7 runs the scripts as a function library. Where it cannot
	// (miniredis, older servers, an ACL without FUNCTION), EVALSHA runs the
	// same scripts, a little slower.
	if !s.evalOnly && loadLibrary(ctx, client) == nil {
		s.lib = budgetLibrary
	}
	// One group is set up at once, as a budget always was; shard groups
	// are set up on first use.
	if s.single != nil {
		if err := s.subscribeGroup(ctx, s.single); err != nil {
			s.closeHubs()
			return nil, s.explain(err)
		}
	}
	s.startRenewals()
	return s, nil
}

// baseStore returns what every Store of budget name on client shares: its
// keys, its publish command and its maps. New adds the rest; operator
// commands use it bare.
func baseStore(client redis.UniversalClient, name string) *Store {
	return &Store{
		client: client,
		name:   name,
		ttl:    DefaultLeaseTTL,
		stuck:  stuckAfter,
		pubCmd: pubCommand(client),
		groups: make(map[string]*group),
		wakes:  make(map[string]*waiting),
		leases: make(map[string]*heldLease),
		hubs:   make(map[string]*hub),
	}
}

// pubCommand is what scripts publish wake events with: on a Cluster,
// sharded pub/sub keeps the message on the shard that owns the budget's
// slot instead of broadcasting it to every node.
func pubCommand(c redis.UniversalClient) string {
	if _, ok := c.(*redis.ClusterClient); ok {
		return "SPUBLISH"
	}
	return "PUBLISH"
}

// checkClient refuses clients whose calls would not honor a context's
// deadline: with a hung Redis, Acquire could then block past its deadline.
func checkClient(c redis.UniversalClient) error {
	var enabled bool
	switch c := c.(type) {
	case *redis.Client:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return errors.New("redisstore: a Ring spreads keys over shards without a shared slot; use a Client or ClusterClient")
	default:
		return nil // an unknown implementation: trust it
	}
	if !enabled {
		return errors.New("redisstore: the client must set ContextTimeoutEnabled: true, so that deadlines bound calls to a hung Redis")
	}
	return nil
}

// checkEviction refuses a Redis that may evict keys. Where CONFIG is not
// allowed (managed Redis, ACLs), the check is skipped.
func checkEviction(ctx context.Context, c redis.UniversalClient) error {
	var (
		mu     sync.Mutex
		policy string
	)
	eachServer(ctx, c, func(ctx context.Context, m redis.Cmdable) error {
		if p := evictionPolicy(ctx, m); p != "" && p != "noeviction" {
			mu.Lock()
			policy = p
			mu.Unlock()
		}
		return nil
	})
	if policy != "" && policy != "noeviction" {
		return fmt.Errorf("redisstore: Redis maxmemory-policy is %q, which can evict lease keys and free slots that are still in use; set it to noeviction", policy)
	}
	return nil
}

func evictionPolicy(ctx context.Context, c redis.Cmdable) string {
	m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return ""
	}
	return m["maxmemory-policy"]
}

// now is the store's time for its own bookkeeping: time.Now, or the test
// clock given with withClock (withClocks: its own).
func (s *Store) now() time.Time {
	if s.own != nil {
		return s.own()
	}
	return time.Now()
}

// Name is the budget's name.
func (s *Store) Name() string { return s.name }

// LeaseTTL implements budget.Store.
func (s *Store) LeaseTTL() time.Duration { return s.ttl }

// Flush waits until Redis has answered every retirement this store queued
// before the call, or ctx ends (its error is returned then).
//
// A Release that finds a call of its group in flight does not wait for its
// own: its retirement goes with the next call, and Release returns at
// once, so a lane that releases and asks again pays one round trip, not
// two. Until that call is answered, Redis, and so every other process,
// may still count the lease as held. Usage and Close flush first, so this
// store's own view never lags; call Flush where another process must see
// the releases of this one (a test, a hand-over). A retirement Redis
// refused counts as answered: the store retires the lease with its next
// heartbeat, or Redis reclaims it within a TTL.
func (s *Store) Flush(ctx context.Context) error {
	return settle(ctx, s.pending())
}

// pending returns a channel for each retirement queued and not answered
// yet, closed when it is. Those queued later are not among them, so a
// Flush is not held up for ever by lanes that go on releasing.
func (s *Store) pending() []chan struct{} {
	s.mu.Lock()
	gs := s.allGroupsLocked()
	s.mu.Unlock()
	var waits []chan struct{}
	for _, g := range gs {
		waits = g.commit.pending(waits)
	}
	return waits
}

// settle waits until every channel of waits is closed, or ctx ends.
func settle(ctx context.Context, waits []chan struct{}) error {
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Close waits for the retirements still queued (see Flush; each is bounded
// by lease.RetireTimeout), ends the waiter renewals and the wake
// subscriptions, and waits for their goroutines. The client stays open: it
// belongs to the caller. Later calls do nothing.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		s.Flush(context.Background())
		s.detachedLeads.Wait()
		s.stopRenewals()
		s.closeHubs()
	})
	return nil
}
