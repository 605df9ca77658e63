package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
)

// A hub is one pub/sub connection carrying the wake channels of every group
// this process uses on one server: on a plain Redis (or behind Sentinel)
// one hub for all groups, on a Cluster one per master that holds a group.
// A channel is added with its own SUBSCRIBE (SSUBSCRIBE on a Cluster) on
// the hub's connection; Redis accepts shard channels of different slots
// on one connection as long as one node serves them all, so a host using
// 1,000 groups over three masters holds three pub/sub connections, not
// 1,000. If a group's slot later moves to another master (a resharding),
// its wakes stop reaching this hub; the waiters' own liveness calls, every
// third of the lease TTL, keep them moving meanwhile.
type hub struct {
	ps      *redis.PubSub
	sharded bool
	done    chan struct{} // closed when dispatch returns

	mu      sync.Mutex
	pending map[string]chan struct{} // channels subscribed, awaiting confirmation
}

// subscribeGroup subscribes this process to group g's wake channel, on
// the hub of g's server (starting the hub if it is the first there), and
// waits, within ctx, until Redis has confirmed it, so that no wake
// published after it can be missed. Store.mu is not held.
func (s *Store) subscribeGroup(ctx context.Context, g *group) error {
	addr := ""
	cc, cluster := s.client.(*redis.ClusterClient)
	if cluster {
		m, err := cc.MasterForKey(ctx, g.keys[0])
		if err != nil {
			return fmt.Errorf("redisstore: finding the master of a group: %w: %v", budget.ErrUnavailable, err)
		}
		addr = m.Options().Addr
	}
	confirmed := make(chan struct{})
	s.hubMu.Lock()
	if s.hubs == nil {
		s.hubMu.Unlock()
		return budget.ErrClosed
	}
	h := s.hubs[addr]
	var err error
	if h == nil {
		// A new hub connects with its first channel: a cluster PubSub
		// connects to the node serving its first channel's slot (and, after
		// a reconnect, to whichever node serves it then: a failover promotes
		// a replica of the same shard). Started empty, it would connect to
		// a random node.
		h = &hub{sharded: cluster, done: make(chan struct{}), pending: map[string]chan struct{}{g.channel: confirmed}}
		if cluster {
			h.ps = cc.SSubscribe(ctx, g.channel)
		} else {
			h.ps = s.client.Subscribe(ctx, g.channel)
		}
		s.hubs[addr] = h
		go s.dispatch(h)
	} else {
		h.mu.Lock()
		h.pending[g.channel] = confirmed
		h.mu.Unlock()
		if h.sharded {
			err = h.ps.SSubscribe(ctx, g.channel)
		} else {
			err = h.ps.Subscribe(ctx, g.channel)
		}
	}
	s.hubMu.Unlock()
	if err == nil {
		select {
		case <-confirmed:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err != nil {
		h.mu.Lock()
		delete(h.pending, g.channel)
		h.mu.Unlock()
		return fmt.Errorf("redisstore: subscribing to wake events: %w: %v", budget.ErrUnavailable, err)
	}
	return nil
}

// grantedPrefix marks a wake event that carries a grant: a script handed
// the waiter a slot (see the package doc), so it need not call to learn it.
// The message is "granted <id> <session> <age us>".
const grantedPrefix = "granted "

// parseWake reads a wake event: the waiter's id, and for a grant its
// session and how much of the session's TTL the lease had already spent.
// A grant message that does not parse is taken as a plain wake: the
// waiter's call then finds its lease.
func parseWake(payload string) (id string, granted bool, sid string, age time.Duration) {
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
// subscription confirmations to subscribe, until h is closed.
func (s *Store) dispatch(h *hub) {
	defer close(h.done)
	for m := range h.ps.ChannelWithSubscriptions() {
		switch m := m.(type) {
		case *redis.Subscription:
			h.mu.Lock()
			if c := h.pending[m.Channel]; c != nil {
				close(c)
				delete(h.pending, m.Channel)
			}
			h.mu.Unlock()
		case *redis.Message:
			id, granted, sid, age := parseWake(m.Payload)
			s.mu.Lock()
			w := s.wakes[id]
			if w != nil && granted {
				w.granted, w.grantSid, w.grantAge = true, sid, age
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
}

// closeHubs ends every hub and waits for its dispatch goroutine; no hub can
// start after it.
func (s *Store) closeHubs() {
	s.hubMu.Lock()
	hubs := s.hubs
	s.hubs = nil
	s.hubMu.Unlock()
	for _, h := range hubs {
		h.ps.Close()
		<-h.done
	}
}
