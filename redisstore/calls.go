package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/lease"
)

// The store's calls: each budget.Store method is one script call (two when
// Redis lost the budget and it is registered again first).

// Register implements budget.Store. The limits' MemoryBytes is not sent:
// memory is each host's own (the Budget keeps its line), and Redis stores
// only the shared ceilings; the limits a conflict compares are the JSON of
// l without it.
//
// An unsharded budget registers in its one group. A sharded one registers
// in every group the registry lists, so a conflict with any of them is
// found now; a group first used later registers (or is checked) then.
func (s *Store) Register(ctx context.Context, l budget.Limits, replace bool) error {
	l.MemoryBytes = 0
	s.mu.Lock()
	s.limits, s.replace = l, replace
	s.mu.Unlock()
	if s.shardKey != nil {
		// The registry holds the budget's limits too: a host whose limits
		// differ is refused even before any group exists.
		js, err := json.Marshal(l)
		if err != nil {
			return fmt.Errorf("redisstore: encoding limits: %v", err)
		}
		if _, err := registryCall(ctx, s.client, s.name, s.idle, s.clock, js, replace); err != nil {
			if errors.Is(err, budget.ErrLimitsConflict) {
				return err
			}
			return s.classify(ctx, "register", err)
		}
	}
	gs, err := s.knownGroups(ctx)
	if err != nil {
		return err
	}
	return eachGroup(gs, func(g *group) error { return s.register(ctx, g, l, replace, false) })
}

// layout is the layout of a budget's keys that this build reads and
// writes (luascripts/lib.lua, LAYOUT).
const layout = 3

// storedLimits is the JSON of l as a group's config holds it: the layout
// first, then l's fields (map keys sorted: canonical). A build that moves
// a budget to a newer layout changes the bytes of its JSON so, and hosts
// of the older build that cached the old JSON then read the layout again
// and step aside; lib.lua's convert_layout writes the same bytes from the
// JSON of layout 1, so a host of this build finds its own limits there.
func storedLimits(l budget.Limits) ([]byte, error) {
	return json.Marshal(struct {
		Layout int `json:"layout"`
		budget.Limits
	}{layout, l})
}

// register stores l in group g. lost says this store held state under an
// epoch that Redis no longer has: a group created now starts under
// quarantine.
func (s *Store) register(ctx context.Context, g *group, l budget.Limits, replace, lost bool) error {
	l.MemoryBytes = 0
	js, err := storedLimits(l)
	if err != nil {
		return fmt.Errorf("redisstore: encoding limits: %v", err)
	}
	args := s.args(string(js), strconv.FormatFloat(l.RequestsPerSecond, 'f', -1, 64), l.Burst,
		l.OpenBodies, flag(replace), flag(lost), ms(s.ttl), 0)
	for _, c := range budget.Classes() {
		args = append(args, l.InFlight[c])
	}
	res, err := s.run(ctx, g, "register", s.sc.register, args...)
	if err != nil {
		return err
	}
	epoch, err := decodeRegister(res, s.name, js)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if g.epoch == "" {
		g.epoch = epoch
	}
	s.mu.Unlock()
	return nil
}

func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// reregister stores the limits again after Redis lost a group's config
// (a restart without persistence, a failover that lost writes): the first
// host to notice starts the group anew under a quarantine of one lease
// TTL, and every host puts back the leases it still holds there. A group
// this store never saw registered is not lost, only new: it is registered
// plainly.
func (s *Store) reregister(ctx context.Context, g *group) error {
	s.mu.Lock()
	l, replace, lost := s.limits, s.replace, g.epoch != ""
	s.mu.Unlock()
	if !lost {
		return s.register(ctx, g, l, replace, false)
	}
	if err := s.register(ctx, g, l, false, true); err != nil {
		return err
	}
	return s.reassert(ctx, g, "")
}

// reassert puts this process's leases in group g back into Redis after the
// group's epoch changed, in its session, then records the new epoch (empty:
// read it from Redis). Until it succeeds the old epoch stays, so the next
// heartbeat tries again rather than declaring the leases lost.
func (s *Store) reassert(ctx context.Context, g *group, epoch string) error {
	s.reasserting.Lock()
	defer s.reasserting.Unlock()
	s.mu.Lock()
	type one struct {
		id string
		h  heldLease
	}
	sid := g.sid
	all := make([]one, 0, len(s.leases))
	for id, h := range s.leases {
		if h.g == g && h.sid == sid {
			all = append(all, one{id, *h})
		}
	}
	s.mu.Unlock()
	sent := s.now()
	const chunk = 500
	for start := 0; start < len(all) || start == 0; start += chunk {
		part := all[start:min(start+chunk, len(all))]
		// The script learns which call starts and which ends the
		// re-assertion: after the last, what the session holds in Redis
		// and the host did not name is retired.
		flags := 0
		if start == 0 {
			flags |= 1
		}
		if start+chunk >= len(all) {
			flags |= 2
		}
		args := s.args(ms(s.ttl), sid, flags, len(part))
		for _, x := range part {
			args = append(args, x.id, x.h.class, int(x.h.held), x.h.consumer, len(x.h.encs))
			for _, e := range x.h.encs {
				args = append(args, e)
			}
		}
		res, err := s.run(ctx, g, "reassert", s.sc.reassert, args...)
		if err != nil {
			return err
		}
		if _, err := decodeCount("reassert", res); errors.Is(err, errNotRegistered) {
			return fmt.Errorf("redisstore: reassert: %w: budget config disappeared again", budget.ErrUnavailable)
		} else if err != nil {
			return err
		}
		if len(all) == 0 {
			break
		}
	}
	if epoch == "" {
		e, err := s.client.HGet(ctx, g.keys[0], "epoch").Result()
		if err != nil {
			return s.classify(ctx, "reassert", err)
		}
		epoch = e
	}
	s.mu.Lock()
	g.epoch = epoch
	if len(all) > 0 {
		s.confirmLocked(g, sid, sent) // the session lives a TTL from the call
	}
	s.mu.Unlock()
	return nil
}

// TryAcquire implements budget.Store. A request's MemoryBytes is ignored:
// memory is the host's, reserved by the Budget before it asks the store.
// With WithShardKey, a request whose domains fall in two groups is refused
// with an error wrapping budget.ErrInvalidRequest. A grant joins this
// process's session in the group; GrantedAgo counts the lease's TTL from
// the session's last renewal, so the keeper never counts it past the
// session's deadline.
func (s *Store) TryAcquire(ctx context.Context, id string, req budget.Request) (budget.Attempt, error) {
	g, err := s.groupOf(ctx, req.Domains)
	if err != nil {
		return budget.Attempt{}, err
	}
	held := req.Parts() &^ lease.Memory
	encs := make([]string, len(req.Domains))
	for i, d := range req.Domains {
		encs[i] = encodeDomain(d)
	}
	record := func(sid string, basis time.Time) {
		s.leases[id] = &heldLease{g: g, sid: sid, encs: encs, class: req.Class.Index(), consumer: req.Consumer, held: held, listed: s.now()}
		s.confirmLocked(g, sid, basis)
	}
	s.mu.Lock()
	w := s.wakes[id]
	if w != nil && w.granted && w.grantSid == g.sid {
		// Granted by handoff: the script said so, no call needed. Its
		// session ends short of the waiter's own liveness deadline by
		// w.short, and that deadline is a TTL after some call Redis ran,
		// so after liveFrom: count renewals from there, less short, which
		// can only be early, never late. A lost message falls back to the
		// waiter's next call, which finds the lease. A grant into a
		// session this store has given up since is collected by a call,
		// which moves it into the current one.
		delete(s.wakes, id)
		basis := w.liveFrom().Add(-w.short)
		// The lease lives as long as its session, which Redis keeps for
		// a TTL from g.renewed at least; and the grant came after the
		// waiter's call that liveFrom is, so no basis later than that
		// makes the lease look younger than it is.
		b := g.renewed
		if lf := w.liveFrom(); lf.Before(b) {
			b = lf
		}
		if b.After(basis) {
			basis = b
		}
		record(g.sid, basis)
		s.mu.Unlock()
		return budget.Attempt{Outcome: budget.Granted, GrantedAgo: s.now().Sub(basis)}, nil
	}
	if w == nil {
		w = &waiting{g: g, wake: make(chan struct{}, 1), encs: encs}
		s.wakes[id] = w
	}
	sent := s.now()
	if w.first.IsZero() {
		w.first = sent
	}
	w.granted, w.queued, w.called = false, false, sent
	g.used = sent
	wake := w.wake
	sid := s.sessionLocked(g, sent)
	// A grant may wait in the session the previous call named (a
	// handoff's, or one whose reply was lost): the call looks there too.
	psid := w.sid
	if psid == "" {
		psid = sid
	}
	w.sid = sid
	s.mu.Unlock()
	body := 0
	if req.OpensBody {
		body = 1
	}
	args := s.args(id, s.proc, sid, req.Class.Index(), body, req.Consumer, ms(s.ttl))
	const sidArg = 5 // after the three common arguments, the id and the channel
	args = append(args, len(encs))
	for _, e := range encs {
		args = append(args, e)
	}
	// named moves the call on to session next: the previous one is where
	// a grant of the call just made would be.
	named := func(next string) {
		s.mu.Lock()
		w.sid = next
		s.mu.Unlock()
		args[sidArg], psid, sid = next, sid, next
	}
	base := len(args)
	for range 4 {
		// The previous session goes only where it differs (acquire.lua's
		// last argument, optional): most calls name the same one.
		args = args[:base]
		if psid != sid {
			args = append(args, psid)
		}
		res, err := s.call(ctx, g, "acquire", s.sc.acquire, args...)
		if err != nil {
			if ctx.Err() != nil {
				s.mu.Lock()
				w.cutOff = true
				s.mu.Unlock()
			}
			return budget.Attempt{}, err
		}
		r, err := decodeAcquire(res)
		switch {
		case errors.Is(err, errNotRegistered):
			if err := s.reregister(ctx, g); err != nil {
				return budget.Attempt{}, err
			}
			continue
		case errors.Is(err, errSessionGone):
			s.sessionGone(g, sid)
			s.mu.Lock()
			next := s.sessionLocked(g, s.now())
			s.mu.Unlock()
			named(next)
			continue
		case err != nil:
			return budget.Attempt{}, err
		}
		switch r.outcome {
		case budget.Granted:
			s.mu.Lock()
			if g.sid != sid {
				// The session was given up while the call was out: call
				// again, which moves the lease into the current one.
				next := g.sid
				s.mu.Unlock()
				named(next)
				continue
			}
			record(sid, sent.Add(-r.age))
			s.mu.Unlock()
			s.unwatch(id)
			return budget.Attempt{Outcome: budget.Granted, GrantedAgo: r.age}, nil
		case budget.Delayed:
			s.mu.Lock()
			w.queued, w.delayed = true, true
			s.mu.Unlock()
			return budget.Attempt{Outcome: budget.Delayed, Wait: r.wait, Wake: wake, Renewed: !s.noRenew}, nil
		}
		// Queued: this call set the waiter's liveness deadline (a delay
		// may come before it does, in a quarantine), which a handoff's
		// grant counts from.
		s.mu.Lock()
		if sent.After(w.answered) {
			w.answered = sent
		}
		if r.left > 0 {
			// The call ran after it was sent, so the session's deadline
			// is at least left past the sending.
			s.confirmLocked(g, sid, sent.Add(r.left-s.ttl))
		}
		w.queued, w.delayed = true, false
		s.mu.Unlock()
		return budget.Attempt{Outcome: budget.Queued, Wake: wake, Renewed: !s.noRenew}, nil
	}
	return budget.Attempt{}, fmt.Errorf("redisstore: acquire: %w: budget config or session keeps disappearing", budget.ErrUnavailable)
}

// groupOfID returns the group where this process placed waiter or lease
// id: the one group of an unsharded budget, or nil for an ID this store
// never sent, which has nothing in Redis to cancel or retire.
func (s *Store) groupOfID(id string) *group {
	if s.single != nil {
		return s.single
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.wakes[id]; w != nil {
		return w.g
	}
	if h := s.leases[id]; h != nil {
		return h.g
	}
	return nil
}

// Cancel implements budget.Store.
func (s *Store) Cancel(ctx context.Context, id string) error {
	s.reasserting.RLock()
	defer s.reasserting.RUnlock()
	g := s.groupOfID(id)
	if g == nil {
		s.mu.Lock()
		delete(s.wakes, id)
		s.mu.Unlock()
		return nil
	}
	s.mu.Lock()
	w := s.wakes[id]
	late := w != nil && w.cutOff
	sids := s.sessionsOfLocked(id, w, g)
	delete(s.wakes, id)
	s.mu.Unlock()
	args := s.args(id, len(sids))
	for _, sid := range sids {
		args = append(args, sid)
	}
	res, err := s.call(ctx, g, "cancel", s.sc.cancel, args...)
	if err == nil {
		err = decodeOK("cancel", res)
	}
	s.mu.Lock()
	delete(s.leases, id)
	if err != nil || late {
		// A grant under id whose reply was lost would otherwise live as
		// long as this process's session: the group's next heartbeat
		// cancels it again. So would one made by an acquire cut off on
		// its way by its ctx: written to one connection, it can be read
		// by Redis after this cancel on another (measured: a slot lost
		// in 10 of 30 runs of TestBatchHammer's load before this).
		for _, sid := range sids {
			g.done[doneID{id, sid}] = struct{}{}
		}
	}
	s.mu.Unlock()
	return err
}

// sessionsOfLocked lists the sessions of group g where a grant under id
// may be (at most four): the lease's as this store recorded it, the one
// the waiter's latest call named, a handoff's it heard of, and the
// current one.
func (s *Store) sessionsOfLocked(id string, w *waiting, g *group) []string {
	var out []string
	add := func(sid string) {
		if sid != "" && !slices.Contains(out, sid) {
			out = append(out, sid)
		}
	}
	if h := s.leases[id]; h != nil && h.g == g {
		add(h.sid)
	}
	if w != nil {
		add(w.sid)
		add(w.grantSid)
	}
	add(g.sid)
	return out
}

// Retire implements budget.Store. The Memory part is not the store's (the
// Budget returns it to its own line) and is ignored here.
func (s *Store) Retire(ctx context.Context, id string, parts lease.Parts) error {
	parts &= lease.Request | lease.Body
	if parts == 0 {
		return nil
	}
	s.reasserting.RLock()
	defer s.reasserting.RUnlock()
	g := s.groupOfID(id)
	if g == nil {
		return nil
	}
	// The lease's session as this store recorded it; for one it no longer
	// knows (lost with a session, dropped, cancelled), the current one,
	// where nothing is found if it is gone.
	s.mu.Lock()
	sid := g.sid
	final := false
	if h := s.leases[id]; h != nil && h.g == g {
		sid = h.sid
		final = h.held&^parts == 0
	}
	s.mu.Unlock()
	if sid == "" {
		return nil // no session yet: nothing was granted
	}
	if final && s.retireDetached(g, id, parts, sid) {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		// Leases retire with a background context: bound the call here.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, lease.RetireTimeout)
		defer cancel()
	}
	res, err := s.call(ctx, g, "retire", s.sc.retire, s.args(id, int(parts), sid)...)
	if err == nil {
		err = decodeOK("retire", res)
	}
	if err != nil {
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

// retireDetached queues the final retirement of lease id, in session sid,
// into the next call to g, when a call to g is in flight, and reports
// whether it did (see Flush). The lease is forgotten at once, as after a
// retirement confirmed; if Redis then refuses the call, the lease joins
// what the group's next heartbeat retires (or, with no heartbeat going
// there, what the renewals cancel a TTL later).
func (s *Store) retireDetached(g *group, id string, parts lease.Parts, sid string) bool {
	then := func(res []string, err error) {
		if err == nil {
			err = decodeOK("retire", res)
		}
		if err != nil {
			s.mu.Lock()
			g.done[doneID{id, sid}] = struct{}{}
			s.mu.Unlock()
		}
	}
	if !s.detach(g, "retire", s.sc.retire, then, s.args(id, int(parts), sid)...) {
		return false
	}
	s.mu.Lock()
	delete(s.leases, id)
	s.mu.Unlock()
	return true
}

// Heartbeat implements budget.Store: one script call per group renews this
// process's session there, which keeps every lease of the session alive,
// and keeps the keys of their domains alive (the calls to different
// groups run side by side). It also lists again, in one call, the groups
// whose registry entry is due (a quarter of the idle TTL old) and that
// this process used since.
//
// The IDs missing are those this store no longer holds: released, dropped
// by an operator (the beat hears of it from Redis), or in a session that
// is dead. A lease of a group beaten now that no heartbeat has listed for
// a TTL is one its holder stopped renewing: it is retired with the beat,
// as it would have expired in Redis without sessions. When the beats of
// some groups fail and others go through, the error is a
// *lease.PartialError naming the leases that were not renewed.
func (s *Store) Heartbeat(ctx context.Context, ids []string) ([]string, error) {
	start := s.now()
	byGroup := make(map[*group][]string)
	var due []*group
	var missing []string
	s.mu.Lock()
	for _, id := range ids {
		h := s.leases[id]
		if h == nil {
			missing = append(missing, id) // released meanwhile, or its session is gone
			continue
		}
		h.listed = start
		byGroup[h.g] = append(byGroup[h.g], id)
	}
	for id, h := range s.leases {
		if _, ok := byGroup[h.g]; ok && start.Sub(h.listed) >= s.ttl {
			h.g.done[doneID{id, h.sid}] = struct{}{}
			delete(s.leases, id)
		}
	}
	for _, g := range s.groups {
		if start.Sub(g.listed) > s.idle/4 && g.used.After(g.listed) {
			due = append(due, g)
		}
		if _, ok := byGroup[g]; ok && start.Sub(g.listed) > s.idle/4 && !g.used.After(g.listed) {
			due = append(due, g) // its leases are in use even without new calls
		}
	}
	s.mu.Unlock()
	if len(due) > 0 {
		if err := s.list(ctx, due...); err != nil {
			return nil, err
		}
	}
	gs := make([]*group, 0, len(byGroup))
	for g := range byGroup {
		gs = append(gs, g)
	}
	// Groups beat apart: one on an unreachable master must not cost the
	// leases of the others (the keeper would hear no renewal at all).
	var (
		mu       sync.Mutex
		failed   []string
		firstErr error
		beaten   int
	)
	eachGroup(gs, func(g *group) error {
		m, err := s.beat(ctx, g, byGroup[g], start)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed = append(failed, byGroup[g]...)
			if firstErr == nil {
				firstErr = err
			}
			return nil
		}
		beaten++
		missing = append(missing, m...)
		return nil
	})
	switch {
	case firstErr == nil:
		return missing, nil
	case beaten == 0:
		return nil, firstErr
	}
	return missing, &lease.PartialError{Failed: failed, Err: firstErr}
}

// doneID is what a heartbeat cancels for a lease or waiter this process
// is done with: its id, and a session a grant under it may be in.
type doneID struct{ id, sid string }

// maxDone bounds the ids one beat cancels (see heartbeat.lua): the rest
// wait for the next beats, so no beat runs long after many leases were
// given up at once.
const maxDone = 1000

// beat renews this process's session in group g, as Heartbeat does for one
// group, and returns the ids among ids it no longer holds.
func (s *Store) beat(ctx context.Context, g *group, ids []string, start time.Time) ([]string, error) {
	s.mu.Lock()
	sid := g.sid
	live := 0
	for _, id := range ids {
		if s.leases[id] != nil {
			live++
		}
	}
	if live == 0 {
		// Every one was released, or lost with a session given up since
		// Heartbeat listed them: nothing to renew, and the current session
		// may not exist yet.
		s.mu.Unlock()
		return ids, nil
	}
	// Domain keys must outlive the leases counting in them: each is
	// checked once a quarter of the idle TTL (its TTL is renewed when less
	// than half is left), not on every beat.
	var encs []string
	kept := make(map[string]time.Time, len(g.domsRenewed))
	for _, id := range ids {
		h := s.leases[id]
		if h == nil {
			continue
		}
		for _, e := range h.encs {
			if _, ok := kept[e]; ok {
				continue
			}
			t := g.domsRenewed[e]
			kept[e] = t
			if start.Sub(t) > s.idle/4 {
				encs = append(encs, e)
			}
		}
	}
	g.domsRenewed = kept
	renew := start.Sub(g.keysRenewed) > s.idle/4
	doneIDs := make([]doneID, 0, min(len(g.done), maxDone))
	for d := range g.done {
		if len(doneIDs) == maxDone {
			break
		}
		doneIDs = append(doneIDs, d)
	}
	s.mu.Unlock()
	var r heartbeatReply
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		epoch := g.epoch
		s.mu.Unlock()
		args := s.args(ms(s.ttl), sid, flag(renew), len(encs))
		for _, e := range encs {
			args = append(args, e)
		}
		args = append(args, len(doneIDs))
		for _, d := range doneIDs {
			args = append(args, d.id, d.sid)
		}
		args = append(args, epoch)
		res, err := s.run(ctx, g, "heartbeat", s.sc.heartbeat, args...)
		if err != nil {
			return nil, err
		}
		r, err = decodeHeartbeat(res)
		if err == nil && r.newEpoch == "" {
			break
		}
		if attempt == 2 {
			return nil, fmt.Errorf("redisstore: heartbeat: %w: the budget's epoch keeps changing", budget.ErrUnavailable)
		}
		switch {
		case errors.Is(err, errNotRegistered): // Redis lost the group
			err = s.reregister(ctx, g)
		case err == nil: // a new epoch: put our leases back before renewing them
			err = s.reassert(ctx, g, r.newEpoch)
		}
		if err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range doneIDs {
		delete(g.done, d) // the script cancelled them
	}
	if r.gone {
		if g.sid == sid {
			s.newSessionLocked(g) // its leases are lost
		}
	} else {
		s.confirmLocked(g, sid, start)
		if renew && g.sid == sid {
			g.keysRenewed = start
		}
		for _, e := range encs {
			g.domsRenewed[e] = start
		}
		for _, id := range r.dropped {
			if h := s.leases[id]; h != nil && h.g == g {
				delete(s.leases, id)
			}
			g.done[doneID{id, sid}] = struct{}{} // acknowledged on the next beat
		}
	}
	var missing []string
	for _, id := range ids {
		if _, ok := s.leases[id]; !ok {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

// Throttle implements budget.Store. It returns the domain's rate factor
// after the report.
func (s *Store) Throttle(ctx context.Context, d budget.Domain, retryAfter time.Duration) (float64, error) {
	g, err := s.groupOf(ctx, []budget.Domain{d})
	if err != nil {
		return 0, err
	}
	args := s.args(encodeDomain(d), strconv.FormatInt(retryAfter.Microseconds(), 10), ms(s.ttl))
	for range 2 {
		res, err := s.run(ctx, g, "throttle", s.sc.throttle, args...)
		if err != nil {
			return 0, err
		}
		f, err := decodeThrottle(res)
		if errors.Is(err, errNotRegistered) {
			if err := s.reregister(ctx, g); err != nil {
				return 0, err
			}
			continue
		}
		return f, err
	}
	return 0, fmt.Errorf("redisstore: throttle: %w: budget config keeps disappearing", budget.ErrUnavailable)
}

// Usage implements budget.Store: one call per group (side by side), merged.
// Each group's part is a consistent snapshot; the groups are independent,
// so together they are as consistent as a view of independent budgets can
// be. It flushes first, so every lease this store released is out of the
// snapshot. MemoryHeld is always 0: Redis holds no memory, and the Budget
// reports its own.
func (s *Store) Usage(ctx context.Context) (budget.Usage, error) {
	if err := s.Flush(ctx); err != nil {
		return budget.Usage{}, err
	}
	gs, err := s.knownGroups(ctx)
	if err != nil {
		return budget.Usage{}, err
	}
	var (
		mu  sync.Mutex
		all budget.Usage
	)
	err = eachGroup(gs, func(g *group) error {
		res, err := s.run(ctx, g, "usage", s.sc.usage, s.args()...)
		if err != nil {
			return err
		}
		u, err := decodeUsage(res)
		if errors.Is(err, errNotRegistered) {
			return nil // nothing stored: nothing held
		}
		if err != nil {
			return err
		}
		mu.Lock()
		all.Waiters += u.Waiters
		all.Domains = append(all.Domains, u.Domains...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return budget.Usage{}, err
	}
	sortDomains(all.Domains)
	return all, nil
}
