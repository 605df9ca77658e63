package redisstore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/dompack"
	"github.com/runbudget/runbudget/internal/recpack"
	"github.com/runbudget/runbudget/lease"
)

// Operator access: see and fix a live budget by name without joining it
// (no wake subscription, no limits registered). budgetctl is built on these.

// ErrNoBudget means no budget of that name exists in this Redis (never
// created, or expired after being idle).
var ErrNoBudget = errors.New("redisstore: no such budget")

// adminIdle is the idle TTL operator calls give keys they touch; the
// budget's own hosts set their own on their next call.
const adminIdle = 5 * time.Minute

// Admin runs operator commands on one Redis (or Cluster).
type Admin struct {
	client redis.UniversalClient

	mu sync.Mutex
	sc *scriptSet // probed on first use
}

// NewAdmin returns operator access through client.
func NewAdmin(client redis.UniversalClient) (*Admin, error) {
	if client == nil {
		return nil, errors.New("redisstore: NewAdmin needs a client")
	}
	return &Admin{client: client}, nil
}

func (a *Admin) scripts(ctx context.Context) (*scriptSet, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sc == nil {
		sc, err := scriptsFor(ctx, a.client)
		if err != nil {
			return nil, err
		}
		a.sc = sc
	}
	return a.sc, nil
}

// groups returns the config keys of every group budget name may have: its
// one group if it is unsharded, and every shard group its registry lists.
// Scripts run on a key whose group is gone report no config, which callers
// skip.
func (a *Admin) groups(ctx context.Context, name string) ([]string, error) {
	keys, err := listGroups(ctx, a.client, name, adminIdle, nil)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("redisstore: listing shard groups: %w: %v", budget.ErrUnavailable, err)
	}
	out := []string{keyPrefix(name) + "cfg"}
	for _, k := range keys {
		out = append(out, groupPrefix(name, true, k)+"cfg")
	}
	return out, nil
}

// eachGroup runs fn on every group of budget name, side by side, and returns
// the first error other than a group that is gone; found reports whether
// any group exists.
func (a *Admin) eachGroup(ctx context.Context, name string, fn func(cfgKey string) error) (found bool, err error) {
	keys, err := a.groups(ctx, name)
	if err != nil {
		return false, err
	}
	gs := make([]*group, len(keys))
	for i, k := range keys {
		gs[i] = &group{keys: []string{k}}
	}
	var mu sync.Mutex
	err = eachGroup(gs, func(g *group) error {
		err := fn(g.keys[0])
		if errors.Is(err, errNotRegistered) {
			return nil
		}
		if err == nil {
			mu.Lock()
			found = true
			mu.Unlock()
		}
		return err
	})
	return found, err
}

func (a *Admin) run(ctx context.Context, cfgKey, op string, pick func(*scriptSet) *redis.Script, own ...any) ([]string, error) {
	set, err := a.scripts(ctx)
	if err != nil {
		return nil, err
	}
	sc := pick(set)
	args := commonArgs(pubCommand(a.client), adminIdle, nil, own...)
	keys := []string{cfgKey}
	if _, cluster := a.client.(*redis.ClusterClient); cluster {
		// As a store's calls do (slotGuard): refused whole while the
		// group's slot migrates, never half-applied.
		keys = append(keys, strings.TrimSuffix(cfgKey, "cfg")+slotGuard)
	}
	res, err := sc.Run(ctx, a.client, keys, args...).StringSlice()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("redisstore: %s: %w: %v", op, budget.ErrUnavailable, err)
	}
	return res, nil
}

// noBudget turns a script's report of a missing config into ErrNoBudget.
func noBudget(name string, err error) error {
	if errors.Is(err, errNotRegistered) {
		return fmt.Errorf("%w: %q", ErrNoBudget, name)
	}
	return err
}

// BudgetSummary is one line of List.
type BudgetSummary struct {
	Name    string `json:"name"`
	Groups  int    `json:"groups"` // 1 for an unsharded budget
	Domains int    `json:"domains"`
	Leases  int    `json:"leases"`
	Waiters int    `json:"waiters"`
}

// List finds every budget in Redis (on a Cluster, on every master), sorted
// by name. Counts include entries that have expired but not yet been
// reclaimed.
func (a *Admin) List(ctx context.Context) ([]BudgetSummary, error) {
	var (
		mu   sync.Mutex
		keys []string
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, "rb:{*}:cfg", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	if err := eachServer(ctx, a.client, scan); err != nil {
		return nil, fmt.Errorf("redisstore: listing budgets: %w: %v", budget.ErrUnavailable, err)
	}
	byName := make(map[string]*BudgetSummary)
	for _, k := range keys {
		name, _, _, ok := parseGroupKey(k)
		if !ok {
			continue
		}
		p := strings.TrimSuffix(k, "cfg")
		pipe := a.client.Pipeline()
		doms := pipe.ZRange(ctx, p+"doms", 0, -1)
		oldWaiters := pipe.ZCard(ctx, p+"wexp") // layouts 1 and 2: a deadline per waiter
		cfg := pipe.HMGet(ctx, k, "ly", "ce")
		old := pipe.HLen(ctx, p+"lx") // layout 1: every lease in one hash
		sessions := pipe.ZRange(ctx, p+"sexp", 0, -1)
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("redisstore: listing budgets: %w: %v", budget.ErrUnavailable, err)
		}
		leases, waiters := old.Val(), oldWaiters.Val()
		if ly, _ := cfg.Val()[0].(string); ly != "" && ly != "1" {
			// A hash per session (lib.lua, lxkey), each with one field
			// that is no lease; in layout 3 the waiters' markers too,
			// which their domains count (nw less ns).
			ce, _ := cfg.Val()[1].(string)
			pipe := a.client.Pipeline()
			lens := make([]*redis.IntCmd, 0, len(sessions.Val()))
			for _, sid := range sessions.Val() {
				lens = append(lens, pipe.HLen(ctx, recpack.LeaseKey(p, ce, sid)))
			}
			var vals []*redis.StringCmd
			if ly != "2" {
				for _, enc := range doms.Val() {
					vals = append(vals, pipe.Get(ctx, p+"d:"+enc))
				}
			}
			if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				return nil, fmt.Errorf("redisstore: listing budgets: %w: %v", budget.ErrUnavailable, err)
			}
			for _, n := range lens {
				leases += max(n.Val()-1, 0)
			}
			if ly != "2" {
				waiters = 0
				for _, v := range vals {
					if d, err := dompack.Decode(v.Val(), budget.NumClasses); err == nil && d.Epoch == epochOf(cfg.Val()[1]) {
						waiters += int64(d.Waiters - d.Secondary)
					}
				}
				leases = max(leases-waiters, 0)
			}
		}
		b := byName[name]
		if b == nil {
			b = &BudgetSummary{Name: name}
			byName[name] = b
		}
		b.Groups++
		b.Domains += len(doms.Val())
		b.Leases += int(leases)
		b.Waiters += int(waiters)
	}
	out := make([]BudgetSummary, 0, len(byName))
	for _, b := range byName {
		out = append(out, *b)
	}
	slices.SortFunc(out, func(x, y BudgetSummary) int { return strings.Compare(x.Name, y.Name) })
	return out, nil
}

// Inspection is a full view of one budget at one instant of Redis time.
type Inspection struct {
	Name      string        `json:"name"`
	Now       time.Time     `json:"now"`     // Redis TIME
	Created   time.Time     `json:"created"` // when the limits were first stored
	Limits    budget.Limits `json:"limits"`  // the shared ceilings; MemoryBytes is each host's and never stored
	Domains   []DomainState `json:"domains"`
	Leases    []LeaseState  `json:"leases"`
	Waiters   []WaiterState `json:"waiters"`
	Truncated bool          `json:"truncated,omitempty"` // more leases or waiters than listed
	Groups    int           `json:"groups"`              // shard groups found (1 when unsharded)
}

// DomainState is one domain of an Inspection.
type DomainState struct {
	Domain     budget.Domain          `json:"domain"`
	InFlight   map[budget.OpClass]int `json:"in_flight"`
	OpenBodies int                    `json:"open_bodies"`
	// Tokens, Burst and Rate describe the domain's bucket; Rate is 0 when
	// starts on the domain are not rate limited.
	Tokens     float64       `json:"tokens"`
	Burst      float64       `json:"burst"`
	Rate       float64       `json:"rate"`
	RateFactor float64       `json:"rate_factor"`
	Throttled  bool          `json:"throttled"`
	Paused     time.Duration `json:"paused"`
	Waiters    int           `json:"waiters"`
}

// LeaseState is one lease of an Inspection.
type LeaseState struct {
	ID        string          `json:"id"`
	Consumer  string          `json:"consumer"`
	Domains   []budget.Domain `json:"domains"`
	Class     budget.OpClass  `json:"class"`
	Parts     string          `json:"parts"`
	Age       time.Duration   `json:"age"`
	ExpiresIn time.Duration   `json:"expires_in"` // its session's deadline
	// Session is the holder process's session in the lease's group: every
	// lease of one process there shares it, and its deadline.
	Session string `json:"session"`
}

// WaiterState is one waiter of an Inspection.
type WaiterState struct {
	ID        string          `json:"id"`
	Consumer  string          `json:"consumer"`
	Domains   []budget.Domain `json:"domains"`
	Class     budget.OpClass  `json:"class"`
	Ticket    int64           `json:"ticket"` // orders waiters by arrival: the group clock at its join, us
	Waiting   time.Duration   `json:"waiting"`
	ExpiresIn time.Duration   `json:"expires_in"`
}

// Inspect reads a whole budget, one script call per group (side by side):
// limits, every domain's counts, bucket, factor, pause and queue, and up to
// most leases and waiters (0 means 1000), oldest expiry first. Each group's
// part is one instant of its master's time; Now is the latest of them.
func (a *Admin) Inspect(ctx context.Context, name string, most int) (Inspection, error) {
	if most <= 0 {
		most = 1000
	}
	most = min(most, 999999)
	var (
		mu  sync.Mutex
		all = Inspection{Name: name}
	)
	found, err := a.eachGroup(ctx, name, func(cfgKey string) error {
		in, err := a.inspectGroup(ctx, cfgKey, name, most)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if all.Groups == 0 || in.Created.Before(all.Created) {
			all.Created, all.Limits = in.Created, in.Limits
		}
		all.Groups++
		if in.Now.After(all.Now) {
			all.Now = in.Now
		}
		all.Domains = append(all.Domains, in.Domains...)
		all.Leases = append(all.Leases, in.Leases...)
		all.Waiters = append(all.Waiters, in.Waiters...)
		all.Truncated = all.Truncated || in.Truncated
		return nil
	})
	if err != nil {
		return Inspection{}, err
	}
	if !found {
		return Inspection{}, fmt.Errorf("%w: %q", ErrNoBudget, name)
	}
	sortStates(all.Domains)
	slices.SortFunc(all.Leases, func(x, y LeaseState) int { return cmp.Compare(x.ExpiresIn, y.ExpiresIn) })
	slices.SortFunc(all.Waiters, func(x, y WaiterState) int { return cmp.Compare(y.Waiting, x.Waiting) })
	if len(all.Leases) > most || len(all.Waiters) > most {
		all.Truncated = true
		all.Leases = all.Leases[:min(len(all.Leases), most)]
		all.Waiters = all.Waiters[:min(len(all.Waiters), most)]
	}
	return all, nil
}

// inspectGroup inspects one group (errNotRegistered when it is gone).
func (a *Admin) inspectGroup(ctx context.Context, cfgKey, name string, most int) (Inspection, error) {
	// One more than asked: whether there are more than most is then known,
	// not guessed from a full page.
	res, err := a.run(ctx, cfgKey, "inspect", func(s *scriptSet) *redis.Script { return s.inspect }, most+1)
	if err != nil {
		return Inspection{}, err
	}
	doc, err := decodeInspect(res)
	if err != nil {
		return Inspection{}, err
	}
	var raw struct {
		Now, Epoch, Limits string
		Domains            luaList[map[string]string]
		Leases             luaList[map[string]string]
		Waiters            luaList[map[string]string]
	}
	if err := json.Unmarshal([]byte(doc), &raw); err != nil {
		return Inspection{}, fmt.Errorf("redisstore: inspect: malformed reply: %v", err)
	}
	p := parser{}
	now := p.us(raw.Now)
	in := Inspection{Name: name, Now: usTime(now), Created: usTime(p.us(raw.Epoch))}
	if raw.Limits != "" {
		if err := json.Unmarshal([]byte(raw.Limits), &in.Limits); err != nil {
			return Inspection{}, fmt.Errorf("redisstore: inspect: stored limits: %v", err)
		}
	}
	for _, r := range raw.Domains {
		d := p.domain(r["enc"])
		ds := DomainState{Domain: d, InFlight: map[budget.OpClass]int{}, OpenBodies: int(p.int(r["b"])),
			RateFactor: p.float(r["factor"]), Throttled: r["throttled"] == "1",
			Paused: time.Duration(p.int(r["pause_us"])) * time.Microsecond, Waiters: int(p.int(r["queue"]))}
		for i, c := range budget.Classes() {
			if n := p.int(r["f"+strconv.Itoa(i)]); n != 0 {
				ds.InFlight[c] = int(n)
			}
		}
		if r["rate"] != "" {
			ds.Tokens, ds.Burst, ds.Rate = p.float(r["tokens"]), p.float(r["burst"]), p.float(r["rate"])
		}
		in.Domains = append(in.Domains, ds)
	}
	sortStates(in.Domains)
	for _, r := range raw.Leases {
		in.Leases = append(in.Leases, LeaseState{ID: r["id"], Consumer: r["consumer"], Domains: p.domains(r["ds"]),
			Class: p.class(r["c"]), Parts: lease.Parts(p.int(r["parts"])).String(),
			Age: usSince(now, p.us(r["granted"])), ExpiresIn: -usSince(now, p.us(r["expires"])), Session: r["session"]})
	}
	for _, r := range raw.Waiters {
		in.Waiters = append(in.Waiters, WaiterState{ID: r["id"], Consumer: r["consumer"], Domains: p.domains(r["ds"]),
			Class: p.class(r["c"]), Ticket: p.int(r["ticket"]),
			Waiting: usSince(now, p.us(r["arrived"])), ExpiresIn: -usSince(now, p.us(r["expires"]))})
	}
	slices.SortFunc(in.Waiters, func(x, y WaiterState) int { return int(x.Ticket - y.Ticket) })
	if len(in.Leases) > most || len(in.Waiters) > most {
		in.Truncated = true
		in.Leases = in.Leases[:min(len(in.Leases), most)]
		in.Waiters = in.Waiters[:min(len(in.Waiters), most)]
	}
	if p.err != nil {
		return Inspection{}, fmt.Errorf("redisstore: inspect: malformed reply: %v", p.err)
	}
	return in, nil
}

// Throttle reports a provider throttle on d as a host would.
func (a *Admin) Throttle(ctx context.Context, name string, d budget.Domain, retryAfter time.Duration) error {
	if err := d.Validate(); err != nil {
		return err
	}
	if retryAfter < 0 {
		return fmt.Errorf("%w: negative retry-after", budget.ErrInvalidRequest)
	}
	cfgKey, err := a.groupOfDomain(ctx, name, d)
	if err != nil {
		return err
	}
	res, err := a.run(ctx, cfgKey, "throttle", func(s *scriptSet) *redis.Script { return s.throttle }, encodeDomain(d), strconv.FormatInt(retryAfter.Microseconds(), 10), ms(DefaultLeaseTTL))
	if err != nil {
		return err
	}
	_, err = decodeThrottle(res)
	return noBudget(name, err)
}

// groupOfDomain finds the group of budget name that holds domain d. Admin
// does not know the hosts' shard key, so it looks: the group whose domains
// include d, or else the budget's only group. A sharded budget whose groups
// do not hold d (unused, or idle long enough to expire) cannot say where d
// belongs: that is an error naming the domain.
func (a *Admin) groupOfDomain(ctx context.Context, name string, d budget.Domain) (string, error) {
	keys, err := a.groups(ctx, name)
	if err != nil {
		return "", err
	}
	enc := encodeDomain(d)
	pipe := a.client.Pipeline()
	held := make([]*redis.FloatCmd, len(keys))
	exists := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		p := strings.TrimSuffix(k, "cfg")
		held[i] = pipe.ZScore(ctx, p+"doms", enc)
		exists[i] = pipe.Exists(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("redisstore: finding the group of %s: %w: %v", d, budget.ErrUnavailable, err)
	}
	var live []string
	for i, k := range keys {
		if held[i].Err() == nil {
			return k, nil
		}
		if exists[i].Val() == 1 {
			live = append(live, k)
		}
	}
	switch len(live) {
	case 0:
		return "", fmt.Errorf("%w: %q", ErrNoBudget, name)
	case 1:
		return live[0], nil
	}
	return "", fmt.Errorf("redisstore: budget %q has %d shard groups and none holds %s: a domain's group is known once a host has used it", name, len(live), d)
}

// ResetThrottle clears d's throttle state (factor back to 1, no pause). It
// reports whether the domain had any state.
func (a *Admin) ResetThrottle(ctx context.Context, name string, d budget.Domain) (bool, error) {
	if err := d.Validate(); err != nil {
		return false, err
	}
	cfgKey, err := a.groupOfDomain(ctx, name, d)
	if err != nil {
		return false, err
	}
	res, err := a.run(ctx, cfgKey, "reset", func(s *scriptSet) *redis.Script { return s.reset }, encodeDomain(d))
	if err != nil {
		return false, err
	}
	had, err := decodeReset(res)
	return had, noBudget(name, err)
}

// ReplaceLimits stores new limits for an existing budget; hosts enforce
// them from their next call, and waiters re-check at once.
func (a *Admin) ReplaceLimits(ctx context.Context, name string, l budget.Limits) error {
	nl, err := l.Normalize()
	if err != nil {
		return err
	}
	if _, err := a.Inspect(ctx, name, 1); err != nil {
		return err // only existing budgets: a typo must not create one
	}
	set, err := a.scripts(ctx)
	if err != nil {
		return err
	}
	s := baseStore(a.client, name)
	s.sc, s.idle = set, adminIdle
	if n, err := a.client.Exists(ctx, limitsKey(name)).Result(); err == nil && n == 1 {
		// A sharded budget: hosts that start later check their limits
		// against the registry's copy.
		shared := nl
		shared.MemoryBytes = 0
		js, err := json.Marshal(shared)
		if err != nil {
			return fmt.Errorf("redisstore: encoding limits: %v", err)
		}
		if _, err := registryCall(ctx, a.client, name, adminIdle, nil, js, true); err != nil {
			return fmt.Errorf("redisstore: replacing limits: %w: %v", budget.ErrUnavailable, err)
		}
	}
	_, err = a.eachGroup(ctx, name, func(cfgKey string) error {
		if n, _ := a.client.Exists(ctx, cfgKey).Result(); n == 0 {
			return errNotRegistered // gone: do not bring it back
		}
		return s.register(ctx, &group{keys: []string{cfgKey}}, nl, true, false)
	})
	return err
}

// DropLeases returns, at once, the leases of consumer (or every lease when
// all is set), as if they had expired. It reports how many it dropped.
func (a *Admin) DropLeases(ctx context.Context, name, consumer string, all bool) (int, error) {
	if !all && consumer == "" {
		return 0, errors.New("redisstore: DropLeases needs a consumer or all")
	}
	flag := 0
	if all {
		flag = 1
	}
	var (
		mu    sync.Mutex
		total int
	)
	found, err := a.eachGroup(ctx, name, func(cfgKey string) error {
		res, err := a.run(ctx, cfgKey, "drop", func(s *scriptSet) *redis.Script { return s.drop }, consumer, flag)
		if err != nil {
			return err
		}
		n, err := decodeCount("drop", res)
		mu.Lock()
		total += n
		mu.Unlock()
		return err
	})
	if err == nil && !found {
		err = fmt.Errorf("%w: %q", ErrNoBudget, name)
	}
	return total, err
}

// luaList decodes a JSON array, and also the "{}" that Lua's cjson writes
// for an empty table.
type luaList[T any] []T

func (l *luaList[T]) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("{}")) {
		*l = nil
		return nil
	}
	return json.Unmarshal(b, (*[]T)(l))
}

// parser converts script strings, keeping the first error.
type parser struct{ err error }

func (p *parser) int(s string) int64 {
	if s == "" {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil && p.err == nil {
		p.err = err
	}
	return n
}

func (p *parser) us(s string) int64 { return p.int(s) }

func (p *parser) float(s string) float64 {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && p.err == nil {
		p.err = err
	}
	return f
}

func (p *parser) domain(enc string) budget.Domain {
	d, err := decodeDomain(enc)
	if err != nil && p.err == nil {
		p.err = err
	}
	return d
}

func (p *parser) domains(ds string) []budget.Domain {
	var out []budget.Domain
	for _, e := range strings.Fields(ds) {
		out = append(out, p.domain(e))
	}
	return out
}

func (p *parser) class(s string) budget.OpClass {
	i := p.int(s)
	if i < 0 || i >= int64(budget.NumClasses) {
		if p.err == nil {
			p.err = fmt.Errorf("class index %d", i)
		}
		return ""
	}
	return budget.Classes()[i]
}

func usTime(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}

func usSince(now, then int64) time.Duration {
	if then == 0 {
		return 0
	}
	return time.Duration(now-then) * time.Microsecond
}

func sortStates(ds []DomainState) {
	slices.SortFunc(ds, func(a, b DomainState) int {
		if a.Domain.Version != b.Domain.Version {
			return a.Domain.Version - b.Domain.Version
		}
		return strings.Compare(a.Domain.ID, b.Domain.ID)
	})
}

// Library is a runbudget function library held by Redis. Every build of
// runbudget loads its own (the name carries a hash of its scripts), so a
// Redis that served several versions holds one for each.
type Library struct {
	Name string `json:"name"`
	// Current is set for the library of this build.
	Current bool `json:"current"`
	// Functions is how many functions it registers.
	Functions int `json:"functions"`
}

// ErrNoFunctions is what Libraries and PruneLibraries report for a server
// without FUNCTION (before Redis 7, or an embedded test server).
var ErrNoFunctions = errors.New("redisstore: this Redis has no function libraries (FUNCTION is not supported); budgets here run their scripts by EVALSHA")

// Libraries lists the runbudget function libraries (on a Cluster, those of
// every master, once per name), sorted by name.
func (a *Admin) Libraries(ctx context.Context) ([]Library, error) {
	seen := map[string]Library{}
	var mu sync.Mutex
	err := eachServer(ctx, a.client, func(ctx context.Context, c redis.Cmdable) error {
		libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: libraryPrefix + "*"}).Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, l := range libs {
			seen[l.Name] = Library{Name: l.Name, Current: l.Name == budgetLibrary.name, Functions: len(l.Functions)}
		}
		return nil
	})
	if err != nil {
		return nil, a.functionError(ctx, "listing function libraries", err)
	}
	out := make([]Library, 0, len(seen))
	for _, l := range seen {
		out = append(out, l)
	}
	slices.SortFunc(out, func(x, y Library) int { return strings.Compare(x.Name, y.Name) })
	return out, nil
}

// PruneLibraries deletes every runbudget library but this build's, and
// returns the names it deleted. Hosts of another build that still run are
// not harmed: a call that finds its library missing loads it again (one
// extra round trip).
func (a *Admin) PruneLibraries(ctx context.Context) ([]string, error) {
	libs, err := a.Libraries(ctx)
	if err != nil {
		return nil, err
	}
	var deleted []string
	for _, l := range libs {
		if l.Current {
			continue
		}
		err := eachServer(ctx, a.client, func(ctx context.Context, c redis.Cmdable) error {
			err := c.FunctionDelete(ctx, l.Name).Err()
			if err != nil && strings.Contains(err.Error(), "not exist") {
				return nil // not on this master
			}
			return err
		})
		if err != nil {
			return deleted, a.functionError(ctx, "deleting function library "+l.Name, err)
		}
		deleted = append(deleted, l.Name)
	}
	return deleted, nil
}

func (a *Admin) functionError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if msg := strings.ToLower(err.Error()); strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand") {
		return ErrNoFunctions
	}
	return fmt.Errorf("redisstore: %s: %w: %v", what, budget.ErrUnavailable, err)
}

// epochOf reads the config's ce as HMGET gives it (0 when absent): the
// epoch domains' counts must be of to count (lib.lua, dload).
func epochOf(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
