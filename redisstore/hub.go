package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
	"github.com/runbudget/runbudget/internal/backoff"
)

// A hub is one pub/sub connection carrying the wake channels of every group
// this process uses on one server: on a plain Redis (or behind Sentinel)
// one hub for all groups, on a Cluster one per master that holds a group.
// A channel is added with its own SUBSCRIBE (SSUBSCRIBE on a Cluster) on
// the hub's connection; Redis accepts shard channels of different slots
// on one connection as long as one node serves them all, so a host using
// 1,000 groups over three masters holds three pub/sub connections, not
// 1,000.
//
// A shard channel lives on its slot's master, so a hub follows its
// channels when the cluster changes under it:
//   - A slot moved to another master (a resharding, or a failover that
//     demoted a live master): Redis drops the channel and says so with a
//     sunsubscribe push. The hub subscribes it again where it was; the
//     MOVED reply names the new master, and the channel goes to the hub
//     there (started if this process had none).
//   - A reconnect: go-redis subscribes every channel of the connection
//     again with one SSUBSCRIBE, which Redis refuses (CROSSSLOT) when they
//     lie in several slots, so the hub then subscribes each on its own.
//
// Either way wakes published while a channel was nowhere are lost, so once
// it is subscribed again the group's waiters here are woken: each calls,
// and finds its grant or its place. Without that, each would wait for its
// next liveness call, up to a third of the lease TTL.
type hub struct {
	addr    string // its key in Store.hubs: the server it was started for ("" off a Cluster)
	ps      *redis.PubSub
	sharded bool
	done    chan struct{} // closed when dispatch returns
	// ctx ends when the store closes; it bounds the hub's re-subscriptions,
	// counted by homing.
	ctx    context.Context
	cancel context.CancelFunc
	homing sync.WaitGroup

	// Guarded by Store.hubMu: closed once its last channel left (a hub
	// with none would connect to a random node after a reconnect), and
	// the closed hubs it replaced, which closeHubs still waits for.
	closed bool
	prev   []*hub

	mu      sync.Mutex
	groups  map[string]*group      // the channels this hub carries, by channel
	pending map[string]chan string // subscribed, awaiting Redis's answer: "" confirmed, else the master a MOVED reply named
}

const (
	// hubPing is how long a hub's connection may stay silent before the hub
	// pings it, as go-redis's own channel reader does, so that a dead
	// connection fails and is dialled again.
	hubPing = 3 * time.Second
	// homeTimeout bounds one attempt to subscribe a dropped channel again;
	// attempts go on, further apart, until one succeeds or the store
	// closes.
	homeTimeout = 2 * time.Second
	// maxHops bounds the MOVED replies one subscription follows.
	maxHops = 4
)

// subscribeGroup subscribes this process to group g's wake channel, on
// the hub of g's server (starting the hub if it is the first there), and
// waits, within ctx, until Redis has confirmed it, so that no wake
// published after it can be missed. Store.mu is not held.
func (s *Store) subscribeGroup(ctx context.Context, g *group) error {
	addr := ""
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, g.keys[0])
		if err != nil {
			return fmt.Errorf("redisstore: finding the master of a group: %w: %v", budget.ErrUnavailable, err)
		}
		addr = m.Options().Addr
	}
	if err := s.place(ctx, g, addr); err != nil {
		if errors.Is(err, budget.ErrClosed) {
			return err
		}
		return fmt.Errorf("redisstore: subscribing to wake events: %w: %v", budget.ErrUnavailable, err)
	}
	return nil
}

// place subscribes g's channel on the hub of server addr and waits until
// Redis confirms it. A MOVED answer (the slot is on another master now)
// takes it to the hub of the master named, at most maxHops times.
func (s *Store) place(ctx context.Context, g *group, addr string) error {
	for hop := 0; ; hop++ {
		h, answer, err := s.subscribeOn(ctx, g, addr)
		if err != nil {
			return err
		}
		select {
		case to := <-answer:
			if to == "" {
				return nil
			}
			s.leave(ctx, h, g.channel)
			if hop == maxHops {
				return fmt.Errorf("the wake channel's slot moved %d times in a row", hop+1)
			}
			addr = to
		case <-ctx.Done():
			h.forget(g.channel, answer)
			return ctx.Err()
		}
	}
}

// subscribeOn sends the subscription of g's channel to the hub of server
// addr, starting one there if there is none, and returns the hub and where
// its answer will come.
func (s *Store) subscribeOn(ctx context.Context, g *group, addr string) (*hub, chan string, error) {
	answer := make(chan string, 1)
	cc, cluster := s.client.(*redis.ClusterClient)
	for {
		s.hubMu.Lock()
		if s.hubs == nil {
			s.hubMu.Unlock()
			return nil, nil, budget.ErrClosed
		}
		if h := s.hubs[addr]; h != nil && !h.closed {
			h.mu.Lock()
			h.groups[g.channel] = g
			h.pending[g.channel] = answer
			h.mu.Unlock()
			s.hubMu.Unlock()
			var err error
			if h.sharded {
				err = h.ps.SSubscribe(ctx, g.channel)
			} else {
				err = h.ps.Subscribe(ctx, g.channel)
			}
			if err != nil {
				h.forget(g.channel, answer)
				return nil, nil, err
			}
			return h, answer, nil
		}
		s.hubMu.Unlock()
		// A cluster PubSub connects to the node that the client's slot
		// map says serves its first channel (and, after a reconnect, one
		// of its channels): the map must name addr first.
		if cluster {
			if err := awaitSlotMap(ctx, cc, g.keys[0], addr); err != nil {
				return nil, nil, err
			}
		}
		s.hubMu.Lock()
		prev := s.hubs[addr]
		if s.hubs == nil || prev != nil && !prev.closed {
			s.hubMu.Unlock()
			continue // closed, or another call started it meanwhile
		}
		// A new hub connects with its first channel. Started empty, it
		// would connect to a random node.
		hctx, cancel := context.WithCancel(context.Background())
		h := &hub{addr: addr, sharded: cluster, done: make(chan struct{}), ctx: hctx, cancel: cancel,
			groups: map[string]*group{g.channel: g}, pending: map[string]chan string{g.channel: answer}}
		if cluster {
			h.ps = cc.SSubscribe(ctx, g.channel)
		} else {
			h.ps = s.client.Subscribe(ctx, g.channel)
		}
		if prev != nil {
			h.prev = append(prev.prev, prev)
		}
		s.hubs[addr] = h
		go s.dispatch(h)
		s.hubMu.Unlock()
		return h, answer, nil
	}
}

// awaitSlotMap waits, within ctx, until c's slot map names addr as the
// master of key. After a MOVED reply go-redis reloads its map in the
// background, and says nothing when it is done: this asks for a reload and
// reads the map again every 20ms.
func awaitSlotMap(ctx context.Context, c *redis.ClusterClient, key, addr string) error {
	for {
		m, err := c.MasterForKey(ctx, key)
		if err == nil && m.Options().Addr == addr {
			return nil
		}
		c.ReloadState(ctx)
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("the client's slot map does not name %s as the group's master: %w", addr, ctx.Err())
		}
	}
}

// forget drops a subscription's pending answer, if it is still answer.
func (h *hub) forget(channel string, answer chan string) {
	h.mu.Lock()
	if h.pending[channel] == answer {
		delete(h.pending, channel)
	}
	h.mu.Unlock()
}

// leave takes channel off h, whose server no longer serves its slot; off
// go-redis's list too, or its next reconnect would subscribe it here
// again. Redis answers the unsubscription with MOVED, which dispatch
// ignores: h has nothing pending in that slot any more. A hub left with no
// channel is closed: after a reconnect it would be connected to a random
// node, where later channels of its server would not be served.
func (s *Store) leave(ctx context.Context, h *hub, channel string) {
	h.mu.Lock()
	delete(h.groups, channel)
	delete(h.pending, channel)
	h.mu.Unlock()
	if h.sharded {
		_ = h.ps.SUnsubscribe(ctx, channel)
	} else {
		_ = h.ps.Unsubscribe(ctx, channel)
	}
	s.hubMu.Lock()
	h.mu.Lock()
	empty := len(h.groups) == 0 && len(h.pending) == 0
	h.mu.Unlock()
	if empty && s.hubs != nil && !h.closed {
		h.closed = true // subscribeOn adds channels under hubMu: none comes now
		h.ps.Close()    // its dispatch returns; its re-subscriptions go on
	}
	s.hubMu.Unlock()
}

// grantedPrefix marks a wake event that carries a grant: a script handed
// the waiter a slot (see the package doc), so it need not call to learn it.
// The message is "granted <id> <session> <short us>", short being how much
// earlier than the waiter's own liveness deadline the session ends.
const grantedPrefix = "granted "

// parseWake reads a wake event: the waiter's id, and for a grant its
// session and how much earlier than the waiter's liveness deadline that
// session ends. A grant message that does not parse is taken as a plain
// wake: the waiter's call then finds its lease.
func parseWake(payload string) (id string, granted bool, sid string, short time.Duration) {
	rest, ok := strings.CutPrefix(payload, grantedPrefix)
	if !ok {
		return payload, false, "", 0
	}
	f := strings.Split(rest, " ")
	if len(f) != 3 {
		return f[0], false, "", 0
	}
	us, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || us < 0 {
		return f[0], false, "", 0
	}
	return f[0], true, f[1], time.Duration(us) * time.Microsecond
}

// dispatch delivers the wake events of h to this process's waiters, and
// Redis's answers to subscriptions, until h is closed. It reads the
// connection itself rather than through go-redis's channel, which drops
// the error replies (MOVED, CROSSSLOT) a hub needs to follow its channels.
func (s *Store) dispatch(h *hub) {
	defer close(h.done)
	failures := 0
	for {
		m, err := h.ps.ReceiveTimeout(h.ctx, hubPing)
		if err != nil {
			if errors.Is(err, redis.ErrClosed) || h.ctx.Err() != nil {
				return
			}
			var nerr net.Error
			var rerr redis.Error
			switch {
			case errors.As(err, &nerr) && nerr.Timeout():
				pctx, cancel := context.WithTimeout(h.ctx, hubPing)
				_ = h.ps.Ping(pctx) // a failed ping makes go-redis dial again
				cancel()
			case errors.As(err, &rerr) && s.hubError(h, rerr.Error()):
				// An answer on a live connection: nothing to back off from.
			default:
				// The connection failed, or its set-up was refused (a
				// server at maxclients, a wrong password); the next read
				// dials again. Back off after the second failure in a row,
				// as go-redis's reader does, so a server that refuses is
				// not dialled in a loop.
				if failures++; failures > 1 {
					t := time.NewTimer(100 * time.Millisecond)
					select {
					case <-t.C:
					case <-h.ctx.Done():
						t.Stop()
					}
				}
			}
			continue
		}
		failures = 0
		switch m := m.(type) {
		case *redis.Subscription:
			s.subscription(h, m)
		case *redis.Message:
			s.deliver(m.Payload)
		}
	}
}

// subscription handles Redis's word on one of h's channels: a confirmation
// (awaited, or after go-redis subscribed the channel again on a new
// connection), or a shard channel dropped because its slot left the server.
func (s *Store) subscription(h *hub, m *redis.Subscription) {
	confirmed := m.Kind == "subscribe" || m.Kind == "ssubscribe"
	h.mu.Lock()
	g, answer := h.groups[m.Channel], h.pending[m.Channel]
	if confirmed {
		delete(h.pending, m.Channel)
	}
	h.mu.Unlock()
	switch {
	case confirmed && answer != nil:
		answer <- ""
	case confirmed && g != nil:
		s.poke(g) // subscribed again after a reconnect: wakes may have been lost
	case m.Kind == "sunsubscribe" && g != nil && answer == nil:
		// Dropped by Redis (a channel that leave took off is no longer
		// in groups; one being subscribed gets its own answer).
		s.startRehome(h, g)
	}
}

// hubError handles an error reply on h's connection that answers a
// subscription, or go-redis's resubscription of every channel on a new
// connection, and reports whether it was one. MOVED <slot> <addr>
// concerns the channels of that slot: one being subscribed goes to addr,
// and one thought subscribed was not (the resubscription reached a server
// that no longer serves it). CROSSSLOT (go-redis resubscribes every
// channel with one SSUBSCRIBE, which Redis refuses across slots) and
// CLUSTERDOWN (a resubscription during a failover) may have cost every
// channel of h: each is subscribed again on its own, which, for one that
// was not lost, Redis merely confirms. Channels being subscribed get
// their own answer, or time out and retry. Other errors (a refused
// connection set-up) are not answers: go-redis subscribes everything again
// once it connects.
func (s *Store) hubError(h *hub, msg string) bool {
	slot, to := -1, ""
	switch f := strings.Fields(msg); {
	case len(f) == 3 && f[0] == "MOVED":
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return false
		}
		slot, to = n, f[2]
	case strings.HasPrefix(msg, "CROSSSLOT"), strings.HasPrefix(msg, "CLUSTERDOWN"):
	default:
		return false
	}
	var lost []*group
	h.mu.Lock()
	for ch, g := range h.groups {
		answer := h.pending[ch]
		switch {
		case slot >= 0 && g.slot != slot:
		case answer == nil:
			lost = append(lost, g)
		case slot >= 0:
			answer <- to
			delete(h.pending, ch)
		}
	}
	h.mu.Unlock()
	for _, g := range lost {
		s.startRehome(h, g)
	}
	return true
}

// startRehome subscribes g's channel again, in the background, after Redis
// dropped it from h; one at a time per group.
func (s *Store) startRehome(h *hub, g *group) {
	s.hubMu.Lock()
	if s.hubs == nil || g.homing {
		s.hubMu.Unlock()
		return
	}
	g.homing = true
	h.homing.Add(1) // before closeHubs can wait: it sets s.hubs to nil first
	s.hubMu.Unlock()
	go func() {
		defer h.homing.Done()
		s.rehome(h, g)
		s.hubMu.Lock()
		g.homing = false
		s.hubMu.Unlock()
	}()
}

// rehome subscribes g's channel on whichever master serves its slot now,
// starting from h, then wakes g's waiters. It tries until it succeeds or
// the store closes.
func (s *Store) rehome(h *hub, g *group) {
	pause := backoff.New(50*time.Millisecond, time.Second)
	for {
		ctx, cancel := context.WithTimeout(h.ctx, homeTimeout)
		err := s.place(ctx, g, h.addr)
		cancel()
		if err == nil {
			s.poke(g)
			return
		}
		if h.ctx.Err() != nil || errors.Is(err, budget.ErrClosed) {
			return
		}
		t := time.NewTimer(pause.Next())
		select {
		case <-t.C:
		case <-h.ctx.Done():
			t.Stop()
			return
		}
	}
}

// closeHubs ends every hub, and the closed hubs they replaced, and waits
// for their goroutines; no hub can start after it.
func (s *Store) closeHubs() {
	s.hubMu.Lock()
	var hubs []*hub
	for _, h := range s.hubs {
		hubs = append(hubs, h)
		hubs = append(hubs, h.prev...)
	}
	s.hubs = nil
	s.hubMu.Unlock()
	for _, h := range hubs {
		h.cancel()
		h.ps.Close()
	}
	for _, h := range hubs {
		<-h.done
		h.homing.Wait()
	}
}

// slotOf is the Cluster hash slot of key: CRC16 (XMODEM) of its hash tag,
// or of the whole key without one, modulo 16384, as Redis computes it. A
// hub matches a MOVED reply, which names a slot, to its channels with it.
func slotOf(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc % 16384)
}
