package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/luascripts"
)

// scriptSet holds the budget scripts, built once; Run uses EVALSHA and falls
// back to EVAL (which also reloads the script) when Redis answers NOSCRIPT.
type scriptSet struct {
	register, acquire, cancel, retire, heartbeat, throttle, usage, reassert, inspect, reset, drop *redis.Script
}

func newScriptSet(shebang bool) *scriptSet {
	load := func(name string) *redis.Script {
		src := luascripts.Source(name)
		if !shebang {
			src = luascripts.WithoutShebang(src)
		}
		return redis.NewScript(src)
	}
	return &scriptSet{
		register: load("register"), acquire: load("acquire"), cancel: load("cancel"), retire: load("retire"),
		heartbeat: load("heartbeat"), throttle: load("throttle"), usage: load("usage"), reassert: load("reassert"),
		inspect: load("inspect"), reset: load("reset"), drop: load("drop"),
	}
}

var (
	// withShebang declares each script's flags: on Redis 7 a full Redis
	// (maxmemory, noeviction) refuses an admitting script as a whole rather
	// than at its first growing write, so nothing is admitted and nothing is
	// half-applied, while retirements (flagged allow-oom) still free slots.
	withShebang = newScriptSet(true)
	// noShebang serves servers that do not parse a shebang line (Redis
	// before 7, miniredis). There, a script that has already written goes on
	// writing past maxmemory.
	noShebang = newScriptSet(false)
)

// library is the budget scripts as one Redis function library (Redis 7):
// FCALL runs a script without building lib.lua's helpers on every call,
// which is most of what an uncontended release costs Redis.
type library struct {
	name, src string
	functions map[string]string // script name -> function name
}

// libraryPrefix starts the name of every runbudget library.
const libraryPrefix = "runbudget_"

var budgetLibrary = func() *library {
	name, src, fns := luascripts.Library()
	return &library{name: name, src: src, functions: fns}
}()

// loadLibrary loads the library on c (on every master of a Cluster). A
// library of the same name already there is the same code: fine.
func loadLibrary(ctx context.Context, c redis.UniversalClient) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, budgetLibrary.src).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	return eachServer(ctx, c, load)
}

// eachServer runs fn on the one server, or on every master of a Cluster
// (concurrently): for what is per server rather than per key.
func eachServer(ctx context.Context, c redis.UniversalClient, fn func(context.Context, redis.Cmdable) error) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return fn(ctx, m) })
	}
	return fn(ctx, c)
}

// function is the library's function for script op, or "" when l is nil.
func (l *library) function(op string) string {
	if l == nil {
		return ""
	}
	return l.functions[op]
}

// functionMissing reports an FCALL refused because Redis does not have the
// library (a restart without persistence, FUNCTION FLUSH, a new master).
func functionMissing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// scriptsFor asks the server which script set it understands. A reply lost
// on the way is asked again (a few times, within ctx), so one network blip
// does not fail a host's start.
func scriptsFor(ctx context.Context, c redis.UniversalClient) (*scriptSet, error) {
	var err error
	for attempt := range 4 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("redisstore: probing the server: %w: %v", budget.ErrUnavailable, ctx.Err())
			case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
			}
		}
		err = c.Eval(ctx, "#!lua flags=no-writes\nreturn 1", nil).Err()
		switch {
		case err == nil:
			return withShebang, nil
		case strings.Contains(strings.ToLower(err.Error()), "compil"), strings.Contains(err.Error(), "syntax"):
			return noShebang, nil
		}
	}
	return nil, fmt.Errorf("redisstore: probing the server: %w: %v", budget.ErrUnavailable, err)
}

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

// Store is a budget.Store kept in Redis, shared by every host that opens it
// with the same name. Build a budget on it with budget.New(limits,
// budget.WithStore(store)); the budget then owns the store and closes it.
type Store struct {
	client redis.UniversalClient
	sc     *scriptSet
	lib    *library // nil: run scripts with EVALSHA
	name   string
	prefix string
	keys   []string // KEYS of every script: the config hash
	ttl    time.Duration
	// evalOnly keeps scripts on EVALSHA even where the library could be
	// loaded (tests of that path on Redis 7).
	evalOnly bool
	idle     time.Duration
	pubCmd   string // PUBLISH, or SPUBLISH on a Cluster
	channel  string // this process's wake channel

	// reasserting is held for writing while leases are put back after a
	// state loss, and for reading by retirements and cancellations, so a
	// lease released meanwhile is never put back from a stale snapshot.
	reasserting sync.RWMutex

	mu     sync.Mutex
	limits budget.Limits         // last registered, to register again after a state loss
	epoch  string                // the budget's epoch this store last saw; see reassert
	wakes  map[string]*waiting   // this process's waiters, by ID
	leases map[string]*heldLease // leases granted through this store, for heartbeats

	sub       *redis.PubSub
	subDone   chan struct{}
	closeOnce sync.Once
}

// heldLease is what this process knows of a lease it holds: enough to renew
// its domains' keys, and to put it back after Redis lost the budget.
// waiting is what the store knows of one of this process's waiters.
type waiting struct {
	wake     chan struct{} // signalled by wake events
	lastCall time.Time     // when its latest acquire call was sent
	granted  bool          // a script granted it by handoff and said so
}

type heldLease struct {
	encs     []string
	class    int
	mem      int64
	consumer string
	held     lease.Parts
	// renewed is no later than when Redis last set the idle TTL of the
	// lease's hash: heartbeats ask for a renewal once a quarter of it is
	// spent, rather than renewing every hash on every beat.
	renewed time.Time
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
	s.channel = uuid.NewString()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := checkEviction(ctx, client); err != nil {
		return nil, err
	}
	var err error
	if s.sc, err = scriptsFor(ctx, client); err != nil {
		return nil, err
	}
	// Redis 7 runs the scripts as a function library. Where it cannot
	// (miniredis, older servers, an ACL without FUNCTION), EVALSHA runs the
	// same scripts, a little slower.
	if !s.evalOnly && loadLibrary(ctx, client) == nil {
		s.lib = budgetLibrary
	}
	wakeChannel := s.prefix + "wake:" + s.channel
	if s.pubCmd == "SPUBLISH" {
		s.sub = client.SSubscribe(ctx, wakeChannel)
	} else {
		s.sub = client.Subscribe(ctx, wakeChannel)
	}
	if _, err := s.sub.Receive(ctx); err != nil {
		s.sub.Close()
		return nil, fmt.Errorf("redisstore: subscribing to wake events: %w: %v", budget.ErrUnavailable, err)
	}
	s.subDone = make(chan struct{})
	go s.dispatch(s.sub.Channel())
	return s, nil
}

// baseStore returns what every Store of budget name on client shares: its
// keys, its publish command and its maps. New adds the rest; operator
// commands use it bare.
func baseStore(client redis.UniversalClient, name string) *Store {
	prefix := keyPrefix(name)
	return &Store{
		client: client,
		name:   name,
		prefix: prefix,
		keys:   []string{prefix + "cfg"},
		ttl:    DefaultLeaseTTL,
		pubCmd: pubCommand(client),
		wakes:  make(map[string]*waiting),
		leases: make(map[string]*heldLease),
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

// Name is the budget's name.
func (s *Store) Name() string { return s.name }

// LeaseTTL implements budget.Store.
func (s *Store) LeaseTTL() time.Duration { return s.ttl }

// Close ends the wake subscription and waits for its goroutine. The client
// stays open: it belongs to the caller. Later calls do nothing.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.sub.Close()
		<-s.subDone
	})
	return nil
}

// grantedPrefix marks a wake event that carries a grant: a script handed
// the waiter a slot (see the package doc), so it need not call to learn it.
const grantedPrefix = "granted "

// dispatch delivers wake events to the waiters of this process.
func (s *Store) dispatch(msgs <-chan *redis.Message) {
	defer close(s.subDone)
	for m := range msgs {
		id, granted := strings.CutPrefix(m.Payload, grantedPrefix)
		s.mu.Lock()
		w := s.wakes[id]
		if w != nil && granted {
			w.granted = true
		}
		s.mu.Unlock()
		if w != nil {
			select {
			case w.wake <- struct{}{}:
			default: // already signalled
			}
		}
	}
}

func (s *Store) unwatch(id string) {
	s.mu.Lock()
	delete(s.wakes, id)
	s.mu.Unlock()
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// args prefixes a script's own arguments with the common ones.
func (s *Store) args(own ...any) []any {
	return append([]any{s.pubCmd, ms(s.idle)}, own...)
}

// run runs the script named op and returns its reply as strings: the
// library's function where the server has the library, else sc by EVALSHA.
func (s *Store) run(ctx context.Context, op string, sc *redis.Script, args ...any) ([]string, error) {
	var res []string
	var err error
	if fn := s.lib.function(op); fn != "" {
		res, err = s.client.FCall(ctx, fn, s.keys, args...).StringSlice()
		// Nothing ran: load the library again and call again (a few times:
		// it can be flushed again in between).
		for try := 0; functionMissing(err) && try < 3; try++ {
			if err = loadLibrary(ctx, s.client); err == nil {
				res, err = s.client.FCall(ctx, fn, s.keys, args...).StringSlice()
			}
		}
	} else {
		res, err = sc.Run(ctx, s.client, s.keys, args...).StringSlice()
	}
	if err != nil {
		return nil, s.classify(ctx, op, err)
	}
	return res, nil
}

// classify maps a failed call to the budget's errors: a script's refusal of
// an argument to ErrInvalidRequest, the caller's cancellation to ctx.Err(),
// anything else (network, BUSY, OOM, LOADING, failover) to ErrUnavailable,
// which the budget retries within its grace.
func (s *Store) classify(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	msg := err.Error()
	if i := strings.Index(msg, "RBINVAL "); i >= 0 {
		return fmt.Errorf("redisstore: %s: %w: %s", op, budget.ErrInvalidRequest, trimScriptNoise(msg[i+len("RBINVAL "):]))
	}
	return fmt.Errorf("redisstore: %s: %w: %v", op, budget.ErrUnavailable, err)
}

// trimScriptNoise drops the script location Redis appends to error replies.
func trimScriptNoise(msg string) string {
	if i := strings.Index(msg, " script:"); i >= 0 {
		msg = msg[:i]
	}
	return strings.TrimSpace(msg)
}

// Register implements budget.Store.
func (s *Store) Register(ctx context.Context, l budget.Limits, replace bool) error {
	return s.register(ctx, l, replace, false)
}

// register stores l. lost says this store held state under an epoch that
// Redis no longer has: a budget created now starts under quarantine.
func (s *Store) register(ctx context.Context, l budget.Limits, replace, lost bool) error {
	js, err := json.Marshal(l) // map keys sorted: canonical
	if err != nil {
		return fmt.Errorf("redisstore: encoding limits: %v", err)
	}
	args := s.args(string(js), strconv.FormatFloat(l.RequestsPerSecond, 'f', -1, 64), l.Burst,
		l.OpenBodies, l.MemoryBytes, flag(replace), flag(lost), ms(s.ttl), 0)
	for _, c := range budget.Classes() {
		args = append(args, l.InFlight[c])
	}
	res, err := s.run(ctx, "register", s.sc.register, args...)
	if err != nil {
		return err
	}
	switch res[0] {
	case "1":
		s.mu.Lock()
		s.limits = l
		if s.epoch == "" {
			s.epoch = res[1]
		}
		s.mu.Unlock()
		return nil
	case "-3":
		return fmt.Errorf("%w: budget %q holds %s, this host has %s", budget.ErrLimitsConflict, s.name, res[1], js)
	}
	return fmt.Errorf("redisstore: register: unexpected reply %q", res)
}

func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// reregister stores the limits again after Redis lost the budget's config
// (a restart without persistence, a failover that lost writes): the first
// host to notice starts the budget anew under a quarantine of one lease
// TTL, and every host puts back the leases it still holds.
func (s *Store) reregister(ctx context.Context) error {
	s.mu.Lock()
	l := s.limits
	s.mu.Unlock()
	if err := s.register(ctx, l, false, true); err != nil {
		return err
	}
	return s.reassert(ctx, "")
}

// reassert puts this process's leases back into Redis after the budget's
// epoch changed, then records the new epoch (empty: read it from Redis).
// Until it succeeds the old epoch stays, so the next heartbeat tries again
// rather than declaring the leases lost.
func (s *Store) reassert(ctx context.Context, epoch string) error {
	s.reasserting.Lock()
	defer s.reasserting.Unlock()
	s.mu.Lock()
	type one struct {
		id string
		h  heldLease
	}
	all := make([]one, 0, len(s.leases))
	for id, h := range s.leases {
		all = append(all, one{id, *h})
	}
	s.mu.Unlock()
	const chunk = 500
	for start := 0; start < len(all) || start == 0; start += chunk {
		part := all[start:min(start+chunk, len(all))]
		args := s.args(ms(s.ttl), len(part))
		for _, x := range part {
			args = append(args, x.id, x.h.class, x.h.mem, int(x.h.held), x.h.consumer, len(x.h.encs))
			for _, e := range x.h.encs {
				args = append(args, e)
			}
		}
		res, err := s.run(ctx, "reassert", s.sc.reassert, args...)
		if err != nil {
			return err
		}
		if res[0] == "-2" {
			return fmt.Errorf("redisstore: reassert: %w: budget config disappeared again", budget.ErrUnavailable)
		}
		if len(all) == 0 {
			break
		}
	}
	if epoch == "" {
		e, err := s.client.HGet(ctx, s.keys[0], "epoch").Result()
		if err != nil {
			return s.classify(ctx, "reassert", err)
		}
		epoch = e
	}
	s.mu.Lock()
	s.epoch = epoch
	s.mu.Unlock()
	return nil
}

// TryAcquire implements budget.Store.
func (s *Store) TryAcquire(ctx context.Context, id string, req budget.Request) (budget.Attempt, error) {
	encs := make([]string, len(req.Domains))
	for i, d := range req.Domains {
		encs[i] = encodeDomain(d)
	}
	s.mu.Lock()
	w := s.wakes[id]
	if w != nil && w.granted {
		// Granted by handoff: the script said so, no call needed. The
		// lease's TTL started at the grant, which came after this waiter's
		// previous call (it was queued then): count renewals from that call,
		// which can only be early, never late. A lost message falls back to
		// the waiter's next call, which finds the lease.
		delete(s.wakes, id)
		s.leases[id] = &heldLease{encs: encs, class: req.Class.Index(), mem: req.MemoryBytes, consumer: req.Consumer, held: req.Parts(), renewed: w.lastCall}
		s.mu.Unlock()
		return budget.Attempt{Outcome: budget.Granted, GrantedAgo: time.Since(w.lastCall)}, nil
	}
	first := 0
	if w == nil {
		// No call was ever sent for this id: the script need not look for
		// a lease or a waiter of it.
		first = 1
		w = &waiting{wake: make(chan struct{}, 1)}
		s.wakes[id] = w
	}
	w.lastCall = time.Now()
	sent := w.lastCall
	wake := w.wake
	s.mu.Unlock()
	body := 0
	if req.OpensBody {
		body = 1
	}
	args := s.args(id, s.channel, req.Class.Index(), req.MemoryBytes, body, req.Consumer, ms(s.ttl), first)
	firstArg := len(args) - 1
	args = append(args, len(encs))
	for _, e := range encs {
		args = append(args, e)
	}
	for try := range 2 {
		if try > 0 {
			args[firstArg] = 0 // the first call went out: no longer a first call
		}
		res, err := s.run(ctx, "acquire", s.sc.acquire, args...)
		if err != nil {
			return budget.Attempt{}, err
		}
		switch res[0] {
		case "1":
			var ago time.Duration
			if len(res) > 1 {
				us, err := strconv.ParseInt(res[1], 10, 64)
				if err != nil || us < 0 {
					return budget.Attempt{}, fmt.Errorf("redisstore: acquire: malformed grant age %q", res[1])
				}
				ago = time.Duration(us) * time.Microsecond
			}
			s.unwatch(id)
			s.mu.Lock()
			s.leases[id] = &heldLease{encs: encs, class: req.Class.Index(), mem: req.MemoryBytes, consumer: req.Consumer, held: req.Parts(), renewed: sent.Add(-ago)}
			s.mu.Unlock()
			return budget.Attempt{Outcome: budget.Granted, GrantedAgo: ago}, nil
		case "2":
			return budget.Attempt{Outcome: budget.Queued, Wake: wake}, nil
		case "3":
			us, err := strconv.ParseInt(res[1], 10, 64)
			if err != nil || us <= 0 {
				return budget.Attempt{}, fmt.Errorf("redisstore: acquire: malformed wait %q", res[1])
			}
			return budget.Attempt{Outcome: budget.Delayed, Wait: time.Duration(us) * time.Microsecond, Wake: wake}, nil
		case "-1":
			s.unwatch(id)
			return budget.Attempt{}, fmt.Errorf("%w: %d bytes of memory asked, the run's ceiling is %s",
				budget.ErrNeverAdmissible, req.MemoryBytes, res[1])
		case "-2":
			if err := s.reregister(ctx); err != nil {
				return budget.Attempt{}, err
			}
			continue
		}
		return budget.Attempt{}, fmt.Errorf("redisstore: acquire: unexpected reply %q", res)
	}
	return budget.Attempt{}, fmt.Errorf("redisstore: acquire: %w: budget config keeps disappearing", budget.ErrUnavailable)
}

// Cancel implements budget.Store.
func (s *Store) Cancel(ctx context.Context, id string) error {
	s.reasserting.RLock()
	defer s.reasserting.RUnlock()
	s.unwatch(id)
	if _, err := s.run(ctx, "cancel", s.sc.cancel, s.args(id)...); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.leases, id)
	s.mu.Unlock()
	return nil
}

// Retire implements budget.Store.
func (s *Store) Retire(ctx context.Context, id string, parts lease.Parts) error {
	parts &= lease.All
	if parts == 0 {
		return nil
	}
	s.reasserting.RLock()
	defer s.reasserting.RUnlock()
	if _, ok := ctx.Deadline(); !ok {
		// Leases retire with a background context: bound the call here.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, lease.RetireTimeout)
		defer cancel()
	}
	if _, err := s.run(ctx, "retire", s.sc.retire, s.args(id, int(parts))...); err != nil {
		return err
	}
	s.mu.Lock()
	if h := s.leases[id]; h != nil {
		if h.held &^= parts; h.held == 0 {
			delete(s.leases, id)
		}
	}
	s.mu.Unlock()
	return nil
}

// Heartbeat implements budget.Store: one script call renews every listed
// lease and keeps the hashes of their domains alive.
func (s *Store) Heartbeat(ctx context.Context, ids []string) ([]string, error) {
	seen := make(map[string]struct{})
	var encs, renew []string
	start := time.Now()
	s.mu.Lock()
	for _, id := range ids {
		if h := s.leases[id]; h != nil {
			if start.Sub(h.renewed) > s.idle/4 {
				renew = append(renew, id)
			}
			for _, e := range h.encs {
				if _, ok := seen[e]; !ok {
					seen[e] = struct{}{}
					encs = append(encs, e)
				}
			}
		}
	}
	s.mu.Unlock()
	var missing []string
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		epoch := s.epoch
		s.mu.Unlock()
		args := s.args(ms(s.ttl), len(ids))
		for _, id := range ids {
			args = append(args, id)
		}
		args = append(args, len(encs))
		for _, e := range encs {
			args = append(args, e)
		}
		args = append(args, len(renew))
		for _, id := range renew {
			args = append(args, id)
		}
		args = append(args, epoch)
		res, err := s.run(ctx, "heartbeat", s.sc.heartbeat, args...)
		if err != nil {
			return nil, err
		}
		if res[0] == "1" {
			missing = res[1:]
			break
		}
		if attempt == 2 {
			return nil, fmt.Errorf("redisstore: heartbeat: %w: the budget's epoch keeps changing", budget.ErrUnavailable)
		}
		switch res[0] {
		case "-2": // the config is gone: Redis lost the budget
			err = s.reregister(ctx)
		case "-3": // a new epoch: put our leases back before renewing them
			err = s.reassert(ctx, res[1])
		default:
			err = fmt.Errorf("redisstore: heartbeat: unexpected reply %q", res[0])
		}
		if err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	for _, id := range renew {
		if h := s.leases[id]; h != nil {
			h.renewed = start
		}
	}
	for _, id := range missing {
		delete(s.leases, id)
	}
	s.mu.Unlock()
	return missing, nil
}

// Throttle implements budget.Store.
func (s *Store) Throttle(ctx context.Context, d budget.Domain, retryAfter time.Duration) (float64, error) {
	args := s.args(encodeDomain(d), strconv.FormatInt(retryAfter.Microseconds(), 10), ms(s.ttl))
	for range 2 {
		res, err := s.run(ctx, "throttle", s.sc.throttle, args...)
		if err != nil {
			return 0, err
		}
		if res[0] == "-2" {
			if err := s.reregister(ctx); err != nil {
				return 0, err
			}
			continue
		}
		if len(res) < 2 {
			return 0, fmt.Errorf("redisstore: throttle: unexpected reply %q", res)
		}
		f, err := strconv.ParseFloat(res[1], 64)
		if err != nil || !(f > 0 && f <= 1) {
			return 0, fmt.Errorf("redisstore: throttle: malformed factor %q", res[1])
		}
		return f, nil
	}
	return 0, fmt.Errorf("redisstore: throttle: %w: budget config keeps disappearing", budget.ErrUnavailable)
}

// Usage implements budget.Store.
func (s *Store) Usage(ctx context.Context) (budget.Usage, error) {
	res, err := s.run(ctx, "usage", s.sc.usage, s.args()...)
	if err != nil {
		return budget.Usage{}, err
	}
	if len(res) == 1 && res[0] == "-2" {
		return budget.Usage{}, nil // nothing stored: nothing held
	}
	return decodeUsage(res)
}

func decodeUsage(res []string) (budget.Usage, error) {
	const row = budget.NumClasses + 5 // enc, counts by class, bodies, factor, pause, queue
	if len(res) < 2 || (len(res)-2)%row != 0 {
		return budget.Usage{}, fmt.Errorf("redisstore: usage: malformed reply of %d fields", len(res))
	}
	var u budget.Usage
	var err error
	bad := func(what string) (budget.Usage, error) {
		return budget.Usage{}, fmt.Errorf("redisstore: usage: malformed %s", what)
	}
	if u.MemoryHeld, err = strconv.ParseInt(res[0], 10, 64); err != nil {
		return bad("memory")
	}
	if u.Waiters, err = strconv.Atoi(res[1]); err != nil {
		return bad("waiter count")
	}
	for r := res[2:]; len(r) >= row; r = r[row:] {
		d, err := decodeDomain(r[0])
		if err != nil {
			return budget.Usage{}, err
		}
		du := budget.DomainUsage{Domain: d}
		for i, c := range budget.Classes() {
			n, err := strconv.Atoi(r[1+i])
			if err != nil {
				return bad("in-flight count")
			}
			if n > 0 {
				if du.InFlight == nil {
					du.InFlight = make(map[budget.OpClass]int)
				}
				du.InFlight[c] = n
			}
		}
		tail := r[1+budget.NumClasses : row]
		if du.OpenBodies, err = strconv.Atoi(tail[0]); err != nil {
			return bad("body count")
		}
		if du.RateFactor, err = strconv.ParseFloat(tail[1], 64); err != nil {
			return bad("rate factor")
		}
		pause, err := strconv.ParseInt(tail[2], 10, 64)
		if err != nil {
			return bad("pause")
		}
		du.Paused = time.Duration(pause) * time.Microsecond
		if du.Waiters, err = strconv.Atoi(tail[3]); err != nil {
			return bad("queue length")
		}
		u.Domains = append(u.Domains, du)
	}
	sortDomains(u.Domains)
	return u, nil
}
