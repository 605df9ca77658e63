package redistest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Resharding. A slot moves with the raw steps of the Redis Cluster
// specification rather than with redis-cli --cluster reshard, for two
// reasons: reshard is told how many slots to move and picks them itself,
// so it cannot move the one slot a test cares about; and it migrates keys
// in batches of --cluster-pipeline (10 by default), so how long a slot's
// keys stay split between the two masters is its choice, not the test's.
// The steps below are the ones reshard sends for each slot, with every key
// moved by one MIGRATE unless the test names the keys of each:
//
//	target: CLUSTER SETSLOT <slot> IMPORTING <source id>
//	source: CLUSTER SETSLOT <slot> MIGRATING <target id>
//	source: CLUSTER GETKEYSINSLOT, MIGRATE ... KEYS k1 k2 ..., until none is left
//	target, source, every other master: CLUSTER SETSLOT <slot> NODE <target id>
//
// The steps can also be run one at a time (BeginSlotMove, Migrate, Finish),
// so a test can act while the slot is open.

// migrateBatch bounds the keys of one MIGRATE, and migrateTimeout is its
// timeout on the wire (MIGRATE's own argument, in milliseconds).
const (
	migrateBatch   = 1000
	migrateTimeout = 5 * time.Second
	// settleTimeout bounds the wait until every node names the new owner.
	settleTimeout = 10 * time.Second
)

// SlotMove is one hash slot being moved from one master to another.
type SlotMove struct {
	Slot     int
	From, To *Server
	// Opened is when the source's MIGRATING was set, Closed when the last
	// SETSLOT NODE returned; Keys counts the keys migrated so far.
	Opened, Closed time.Time
	Keys           int

	c            *Cluster
	fromID, toID string
}

// MoveSlot moves slot from the master serving it to master to: BeginSlotMove,
// Migrate of every key, Finish. It returns the finished move.
func (c *Cluster) MoveSlot(ctx context.Context, slot int, to *Server) (*SlotMove, error) {
	m, err := c.BeginSlotMove(ctx, slot, to)
	if err != nil {
		return nil, err
	}
	if _, err := m.Migrate(ctx); err != nil {
		return m, err
	}
	return m, m.Finish(ctx)
}

// BeginSlotMove opens the move of slot from the master serving it to master
// to: IMPORTING on the target first, then MIGRATING on the source (in the
// other order, the source would redirect clients with ASK to a target that
// does not accept them yet). From then on the source serves a command only
// when every key it names is still there, redirects one whose keys are all
// gone with ASK, and refuses one whose keys are split with TRYAGAIN.
func (c *Cluster) BeginSlotMove(ctx context.Context, slot int, to *Server) (*SlotMove, error) {
	if slot < 0 || slot >= clusterSlots {
		return nil, fmt.Errorf("redistest: slot %d out of range", slot)
	}
	from, err := c.masterOfSlot(ctx, slot)
	if err != nil {
		return nil, err
	}
	if from == to {
		return nil, fmt.Errorf("redistest: slot %d is already served by %s", slot, to.Addr())
	}
	m := &SlotMove{Slot: slot, From: from, To: to, c: c}
	if m.fromID, err = c.nodeID(ctx, from); err != nil {
		return nil, err
	}
	if m.toID, err = c.nodeID(ctx, to); err != nil {
		return nil, err
	}
	if err := c.do(ctx, to, "cluster", "setslot", slot, "importing", m.fromID); err != nil {
		return nil, fmt.Errorf("redistest: SETSLOT %d IMPORTING on %s: %w", slot, to.Addr(), err)
	}
	if err := c.do(ctx, from, "cluster", "setslot", slot, "migrating", m.toID); err != nil {
		return nil, fmt.Errorf("redistest: SETSLOT %d MIGRATING on %s: %w", slot, from.Addr(), err)
	}
	m.Opened = time.Now()
	return m, nil
}

// Migrate moves keys of the slot from the source to the target with one
// MIGRATE; with no keys named, every key the slot holds, asking the source
// again until it lists none (a batch of at most 1000 keys per MIGRATE). It
// returns how many keys it moved.
func (m *SlotMove) Migrate(ctx context.Context, keys ...string) (int, error) {
	cl := m.c.nodeClient(m.From)
	defer cl.Close()
	all := len(keys) == 0
	moved := 0
	for {
		if all {
			var err error
			keys, err = cl.ClusterGetKeysInSlot(ctx, m.Slot, migrateBatch).Result()
			if err != nil {
				return moved, fmt.Errorf("redistest: GETKEYSINSLOT %d on %s: %w", m.Slot, m.From.Addr(), err)
			}
		}
		if len(keys) == 0 {
			return moved, nil
		}
		host, port, _ := strings.Cut(m.To.Addr(), ":")
		args := []any{"migrate", host, port, "", 0, migrateTimeout.Milliseconds()}
		if m.c.password != "" {
			args = append(args, "auth", m.c.password)
		}
		args = append(args, "keys")
		for _, k := range keys {
			args = append(args, k)
		}
		// NOKEY: the named keys were gone already (expired, deleted).
		if err := cl.Do(ctx, args...).Err(); err != nil && !strings.HasPrefix(err.Error(), "NOKEY") {
			return moved, fmt.Errorf("redistest: MIGRATE of %d keys of slot %d to %s: %w", len(keys), m.Slot, m.To.Addr(), err)
		}
		moved += len(keys)
		m.Keys += len(keys)
		if !all {
			return moved, nil
		}
	}
}

// Finish gives the slot to the target: SETSLOT NODE on the target first (so
// it serves the slot before the source stops redirecting there), then on
// the source, then on every other master; then waits until every node that
// answers names the target as the slot's master (replicas and masters that
// were not told hear of it by gossip, which gives no event: it polls, for
// at most 10s). Keys left on the source are not moved: call Migrate first.
func (m *SlotMove) Finish(ctx context.Context) error {
	if err := m.c.do(ctx, m.To, "cluster", "setslot", m.Slot, "node", m.toID); err != nil {
		return fmt.Errorf("redistest: SETSLOT %d NODE on the target %s: %w", m.Slot, m.To.Addr(), err)
	}
	if err := m.c.do(ctx, m.From, "cluster", "setslot", m.Slot, "node", m.toID); err != nil {
		return fmt.Errorf("redistest: SETSLOT %d NODE on the source %s: %w", m.Slot, m.From.Addr(), err)
	}
	for _, n := range m.c.nodes {
		if n == m.To || n == m.From || !n.answering() {
			continue
		}
		if role, err := m.c.role(ctx, n); err != nil || role != "master" {
			continue // a replica refuses SETSLOT; it follows its master
		}
		if err := m.c.do(ctx, n, "cluster", "setslot", m.Slot, "node", m.toID); err != nil {
			return fmt.Errorf("redistest: SETSLOT %d NODE on %s: %w", m.Slot, n.Addr(), err)
		}
	}
	m.Closed = time.Now()
	return m.c.waitSlotOwner(ctx, m.Slot, m.To)
}

// waitSlotOwner polls every answering node until each names owner as the
// master of slot.
func (c *Cluster) waitSlotOwner(ctx context.Context, slot int, owner *Server) error {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		var pending []string
		for _, n := range c.nodes {
			if !n.answering() {
				continue
			}
			if got, err := c.ownerSeenBy(ctx, n, slot); err != nil || got != owner.Addr() {
				pending = append(pending, fmt.Sprintf("%s says %q (%v)", n.Addr(), got, err))
			}
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: slot %d: not every node names %s as its master within %v: %s",
				slot, owner.Addr(), settleTimeout, strings.Join(pending, "; "))
		case <-tick.C:
		}
	}
}

// masterOfSlot returns the master that the first answering node says
// serves slot.
func (c *Cluster) masterOfSlot(ctx context.Context, slot int) (*Server, error) {
	var lastErr error
	for _, n := range c.nodes {
		if !n.answering() {
			continue
		}
		addr, err := c.ownerSeenBy(ctx, n, slot)
		if err != nil {
			lastErr = err
			continue
		}
		for _, s := range c.nodes {
			if s.Addr() == addr {
				return s, nil
			}
		}
		return nil, fmt.Errorf("redistest: slot %d is served by %s, not a node of this cluster", slot, addr)
	}
	return nil, fmt.Errorf("redistest: no node says who serves slot %d: %v", slot, lastErr)
}

// ownerSeenBy is the address of slot's master in n's CLUSTER SLOTS.
func (c *Cluster) ownerSeenBy(ctx context.Context, n *Server, slot int) (string, error) {
	cl := c.nodeClient(n)
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ranges, err := cl.ClusterSlots(cctx).Result()
	if err != nil {
		return "", err
	}
	for _, r := range ranges {
		if slot >= r.Start && slot <= r.End && len(r.Nodes) > 0 {
			return r.Nodes[0].Addr, nil
		}
	}
	return "", fmt.Errorf("slot %d is not served", slot)
}

// nodeID is n's cluster node ID.
func (c *Cluster) nodeID(ctx context.Context, n *Server) (string, error) {
	cl := c.nodeClient(n)
	defer cl.Close()
	id, err := cl.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		return "", fmt.Errorf("redistest: CLUSTER MYID on %s: %w", n.Addr(), err)
	}
	return id, nil
}

// role is "master" or "slave", from n's INFO.
func (c *Cluster) role(ctx context.Context, n *Server) (string, error) {
	cl := c.nodeClient(n)
	defer cl.Close()
	info, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return "", err
	}
	return infoFields(info)["role"], nil
}

// do sends one command to node n.
func (c *Cluster) do(ctx context.Context, n *Server, args ...any) error {
	cl := c.nodeClient(n)
	defer cl.Close()
	return cl.Do(ctx, args...).Err()
}

// nodeClient is a plain client of one node that does not retry: each step
// of a move is sent once, and a failure is the caller's to see.
func (c *Cluster) nodeClient(n *Server) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: n.Addr(), Password: c.password, MaxRetries: -1, DialerRetries: 1,
		PoolSize: 1, ContextTimeoutEnabled: true,
	})
}
