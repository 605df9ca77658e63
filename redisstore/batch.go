package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/lease"
	"github.com/runbudget/runbudget/luascripts"
)

// Group commit. While a call of this process to a group is in flight, the
// acquire attempts (a waiter's liveness calls too), retirements and
// cancellations that come for the same group queue, and when the call
// returns they go together, as one FCALL of a batch function (batch.lua)
// that runs each operation's script in turn. Under contention a script
// call's fixed costs (the round trip, the FCALL itself, the syscalls on
// both sides) are paid once per batch instead of once per operation; an
// idle group sends each call at once, alone, exactly as without batching.
//
// There is no goroutine of its own (but see detached operations, below):
// the caller whose call is in flight leads. When its call returns it hands
// the lead to the first caller queued, which sends the whole queue (up to
// maxBatch, in the order it came) on behalf of all, and so on until the
// queue is empty. A caller whose ctx ends while queued
// leaves the queue and nothing of it is sent; one whose operation is
// already on its way returns ctx.Err() as a timed-out call does, and what
// comes back for it is dropped (ids are the client's, so the waiter's
// cleanup by ID is the same as after a lost reply).
//
// A call that takes far longer than a round trip holds up everything
// queued behind it. That happens when a master dies: go-redis goes on
// dialling the dead node, with pauses, for a second or two per call, while
// calls sent a moment later reach the promoted replica (in fault scenario
// 20, the killed group's first grant came 1.0-1.5 s later than with calls
// sent alone). So once the call out has been out for stuckAfter, the
// next caller does not queue behind it: it sends a call of its own, with
// whatever is queued, and a call that is stuck costs the others at most
// stuckAfter. One thing must not go beside it: an operation for the id of
// a caller that left while its operation was in that call (its cleanup,
// a cancel). The call may reach Redis later still, and a waiter's cancel
// must run after its last acquire; so those wait for it (orphans).
//
// A final retirement (Store.Retire of all a lease still holds) that finds
// a call of its group in flight need not wait for anything: it queues
// detached, with a context of its own, and Retire returns at once. Its
// reply goes to a callback instead of a caller; when a detached operation
// is the only one queued, a goroutine is started to lead its batch
// (Store.detachedLeads), else a waiting caller leads it with its own. The
// point is the lane that releases and at once asks again: its next
// attempt rides in the same batch as its retirement, so a release costs
// that lane no round trip of its own. Store.Flush waits for the detached
// operations queued so far; Usage and Close flush first.
//
// Only the function library batches: by EVALSHA (miniredis, older
// servers) every call goes alone.

// maxBatch bounds the operations of one batch, so one script run (and the
// time Redis serves nobody else) stays short: an acquire costs Redis up to
// about 100 us on a loaded machine.
const maxBatch = 32

// stuckAfter is how long a call may be out before the calls that come
// after it stop waiting for it (Store.stuck; tests change it). Far above a
// round trip, even on a loaded machine (tens of ms under the race
// detector), so that batches form whenever Redis answers at all.
const stuckAfter = 100 * time.Millisecond

var (
	// batched holds the scripts a batch may carry, and oomScript the
	// allow-oom ones among them.
	batched   = make(map[string]bool)
	oomScript = make(map[string]bool)
)

func init() {
	for _, n := range luascripts.Batched {
		batched[n] = true
		oomScript[n] = luascripts.AllowOOM(n)
	}
}

type opState uint8

const (
	opQueued  opState = iota // waiting in the queue
	opLeading                // in the queue, and told to send a batch
	opSent                   // in a batch in flight
	opDone                   // its reply or error is in
	opGone                   // its caller left: whatever comes back is dropped
)

// batchOp is one script call waiting for, or riding in, a batch.
type batchOp struct {
	ctx   context.Context // the caller's: it classifies the op's error
	name  string          // the script
	id    string          // the waiter or lease it is for (ARGV[4] of every batched script)
	sc    *redis.Script
	args  []any
	ready chan struct{} // signalled when it is told to lead, and when its reply is in

	// A detached operation has no caller waiting: its reply goes to then,
	// after which cancel ends its context and answered is closed.
	detached bool
	then     func(res []string, err error)
	cancel   context.CancelFunc
	answered chan struct{}

	// Guarded by committer.mu.
	state  opState
	orphan bool // its caller left while it was in flight
	res    []string
	err    error
}

// committer is one group's queue of calls.
type committer struct {
	mu sync.Mutex
	// active counts the callers that lead: sending a call, or told to and
	// on their way. Calls queue only while one does, and each of them,
	// when done, hands the lead on (next), so nothing queued is left
	// without a leader.
	active int
	since  time.Time // when the latest call went out, or the lead last passed
	queue  []*batchOp
	// orphans counts, by id, the operations in flight whose callers left:
	// nothing else for those ids is sent until their calls are back.
	orphans map[string]int
	// unanswered holds the detached operations whose callbacks have not
	// run yet (see pending).
	unanswered map[*batchOp]struct{}
	// spawn starts a goroutine to lead a batch for o, a detached operation
	// told to lead (set by Store.newGroup).
	spawn func(o *batchOp)
}

// free reports whether o may be sent now: no call in flight carries an
// operation for its id whose caller left. c.mu is held.
func (c *committer) free(o *batchOp) bool { return c.orphans[o.id] == 0 }

func signal(o *batchOp) {
	select {
	case o.ready <- struct{}{}:
	default: // already signalled; it reads its state under the lock
	}
}

// next ends one caller's lead: it hands the lead to the first caller
// queued, unless one already has it. A caller waiting is preferred to a
// detached operation, which needs a goroutine started to lead. c.mu is
// held.
func (c *committer) next() {
	c.active--
	var first, detached *batchOp
	for _, o := range c.queue {
		if o.state == opLeading {
			return // on its way: it takes the rest
		}
		if o.state != opQueued || !c.free(o) {
			continue
		}
		switch {
		case !o.detached && first == nil:
			first = o
		case o.detached && detached == nil:
			detached = o
		}
	}
	if first == nil {
		first = detached
	}
	if first != nil {
		first.state = opLeading
		c.active++
		c.since = time.Now()
		if first.detached {
			c.spawn(first)
		} else {
			signal(first)
		}
	}
}

// pending appends to waits a channel for each detached operation not
// answered yet, closed when it is (see Store.Flush).
func (c *committer) pending(waits []chan struct{}) []chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	for o := range c.unanswered {
		waits = append(waits, o.answered)
	}
	return waits
}

// remove takes o out of the queue. c.mu is held.
func (c *committer) remove(o *batchOp) {
	if i := slices.Index(c.queue, o); i >= 0 {
		c.queue = slices.Delete(c.queue, i, i+1)
	}
}

// call runs script name (one of luascripts.Batched) for group g and returns
// its reply, as run does: through g's committer where the library is
// loaded, else alone.
func (s *Store) call(ctx context.Context, g *group, name string, sc *redis.Script, args ...any) ([]string, error) {
	if s.lib == nil || !batched[name] {
		return s.run(ctx, g, name, sc, args...)
	}
	c := &g.commit
	c.mu.Lock()
	if c.active == 0 {
		// Idle: out at once, alone, with no queue to wait for.
		c.active = 1
		c.since = time.Now()
		c.mu.Unlock()
		res, err := s.run(ctx, g, name, sc, args...)
		c.mu.Lock()
		c.next()
		c.mu.Unlock()
		return res, err
	}
	id, _ := args[3].(string) // after the common arguments (lib.lua)
	o := &batchOp{ctx: ctx, name: name, id: id, sc: sc, args: args, ready: make(chan struct{}, 1)}
	c.queue = append(c.queue, o)
	if time.Since(c.since) > s.stuck && c.free(o) {
		// The call out looks stuck: lead a call of its own, with what is
		// queued, beside it.
		o.state = opLeading
		c.active++
		c.mu.Unlock()
		s.lead(ctx, g, o)
		c.mu.Lock()
		defer c.mu.Unlock()
		return o.res, o.err
	}
	c.mu.Unlock()
	for {
		select {
		case <-o.ready:
		case <-ctx.Done():
		}
		c.mu.Lock()
		switch o.state {
		case opDone:
			c.mu.Unlock()
			return o.res, o.err
		case opLeading:
			if ctx.Err() == nil {
				c.mu.Unlock()
				s.lead(ctx, g, o)
				c.mu.Lock()
				defer c.mu.Unlock()
				return o.res, o.err
			}
			// Told to lead just as it gave up: pass the lead on.
			c.remove(o)
			c.next()
		case opQueued:
			if ctx.Err() == nil {
				c.mu.Unlock()
				continue // put back in line after its leader gave up
			}
			c.remove(o) // never sent
		case opSent:
			if ctx.Err() == nil {
				c.mu.Unlock()
				continue
			}
			// On its way: its reply is dropped, as a timed-out call's is.
			o.orphan = true
			if c.orphans == nil {
				c.orphans = make(map[string]int)
			}
			c.orphans[o.id]++
		}
		o.state = opGone
		c.mu.Unlock()
		return nil, ctx.Err()
	}
}

// detach queues a detached operation of script name for group g, whose
// reply goes to then, and reports whether it did. It does not when the
// operation would be sent alone at once (no call in flight), when the call
// in flight looks stuck, when a call for its id is still out for a caller
// that left, or when the store is closing: then the caller makes the call
// itself.
func (s *Store) detach(g *group, name string, sc *redis.Script, then func([]string, error), args ...any) bool {
	if s.lib == nil || !batched[name] {
		return false
	}
	id, _ := args[3].(string)
	c := &g.commit
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.active == 0 || time.Since(c.since) > s.stuck || c.orphans[id] > 0 || s.closing.Load() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), lease.RetireTimeout)
	o := &batchOp{ctx: ctx, name: name, id: id, sc: sc, args: args, detached: true,
		then: then, cancel: cancel, answered: make(chan struct{})}
	c.queue = append(c.queue, o)
	if c.unanswered == nil {
		c.unanswered = make(map[*batchOp]struct{})
	}
	c.unanswered[o] = struct{}{}
	return true
}

// lead sends a batch of self and the callers queued (not those told to
// lead, which send their own), in the order they came, hands every reply
// to its caller, and ends self's lead.
func (s *Store) lead(ctx context.Context, g *group, self *batchOp) {
	c := &g.commit
	c.mu.Lock()
	batch := make([]*batchOp, 0, min(len(c.queue), maxBatch))
	rest := c.queue[:0]
	others := 0
	for _, o := range c.queue {
		switch {
		case o == self:
			batch = append(batch, o)
		case o.state == opQueued && others < maxBatch-1 && c.free(o):
			batch = append(batch, o)
			others++
		default:
			rest = append(rest, o)
		}
	}
	clear(c.queue[len(rest):])
	c.queue = rest
	for _, o := range batch {
		o.state = opSent
	}
	c.since = time.Now()
	c.mu.Unlock()
	replies := s.send(ctx, g, batch, self)
	c.mu.Lock()
	var again, answered []*batchOp
	for i, o := range batch {
		if o.orphan {
			if c.orphans[o.id]--; c.orphans[o.id] == 0 {
				delete(c.orphans, o.id)
			}
		}
		if o.state != opSent {
			continue // its caller left
		}
		r := replies[i]
		if r.again && o != self {
			// The batch failed because this leader's ctx ended, not for
			// anything of o's: o goes in the next batch, first.
			o.state = opQueued
			again = append(again, o)
			continue
		}
		o.res, o.err, o.state = r.res, r.err, opDone
		switch {
		case o.detached:
			answered = append(answered, o)
		case o != self:
			signal(o)
		}
	}
	if len(again) > 0 {
		c.queue = append(again, c.queue...)
	}
	c.next()
	c.mu.Unlock()
	// Callbacks run unlocked (they take Store.mu); an operation counts as
	// answered once its callback is done.
	for _, o := range answered {
		o.then(o.res, o.err)
		o.cancel()
		c.mu.Lock()
		delete(c.unanswered, o)
		c.mu.Unlock()
		close(o.answered)
	}
}

// opReply is what one operation of a batch got back. again says the call
// failed only because the leader's ctx ended: the operation may be sent
// again (ids make every operation idempotent).
type opReply struct {
	res   []string
	err   error
	again bool
}

// send runs batch in one call and returns each operation's reply, errors
// classified by each operation's own ctx. A batch of self alone is the
// plain call of its script.
func (s *Store) send(ctx context.Context, g *group, batch []*batchOp, self *batchOp) []opReply {
	out := make([]opReply, len(batch))
	if len(batch) == 1 && batch[0] == self {
		out[0].res, out[0].err = s.run(ctx, g, self.name, self.sc, self.args...)
		return out
	}
	oom := true
	size := 0
	for _, o := range batch {
		oom = oom && oomScript[o.name]
		size += 2 + len(o.args)
	}
	fn := luascripts.Batch
	if oom {
		fn = luascripts.BatchOOM
	}
	args := make([]any, 0, size)
	for _, o := range batch {
		args = append(args, o.name, len(o.args))
		args = append(args, o.args...)
	}
	vals, err := s.fcall(ctx, g, s.lib.function(fn), args).Slice()
	if err != nil && !oom && strings.HasPrefix(err.Error(), "OOM ") {
		// Redis refused the batch whole for its memory. Alone, the
		// admitting operations would have been refused the same way, and
		// the retirements and cancellations (allow-oom) would have run:
		// those go again, without the others.
		var frees []*batchOp
		var at []int
		for i, o := range batch {
			if oomScript[o.name] {
				frees, at = append(frees, o), append(at, i)
			} else {
				out[i].err = s.classify(o.ctx, o.name, err)
			}
		}
		if len(frees) > 0 {
			for j, r := range s.send(ctx, g, frees, self) {
				out[at[j]] = r
			}
		}
		return out
	}
	if err != nil {
		reloadSlots(ctx, s.client, err)
		for i, o := range batch {
			out[i].err = s.classify(o.ctx, o.name, err)
			out[i].again = ctx.Err() != nil
		}
		return out
	}
	if len(vals) != len(batch) {
		err := fmt.Errorf("redisstore: batch: %d replies for %d operations", len(vals), len(batch))
		for i := range out {
			out[i].err = err
		}
		return out
	}
	for i, o := range batch {
		out[i].res, out[i].err = s.opReply(o, vals[i])
	}
	return out
}

// opReply decodes one operation's entry in a batch's reply into the
// strings its script's decoder takes, or its error.
func (s *Store) opReply(o *batchOp, v any) ([]string, error) {
	switch v := v.(type) {
	case []any:
		res := make([]string, len(v))
		for i, f := range v {
			str, ok := f.(string)
			if !ok {
				return nil, fmt.Errorf("redisstore: %s: unexpected field of type %T in its reply", o.name, f)
			}
			res[i] = str
		}
		return res, nil
	case error: // an error reply for this operation alone
		return nil, s.classify(o.ctx, o.name, v)
	}
	return nil, fmt.Errorf("redisstore: %s: unexpected reply of type %T", o.name, v)
}
