package redistest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
)

// ReplicationCut is a replica cut off from its master's replication stream
// by CutReplication: the master goes on accepting writes the replica never
// receives, so a failover that promotes it loses them, as an asynchronous
// failover can.
//
// Pausing the replica (SIGSTOP, DEBUG SLEEP) does not do this: what the
// master already sent waits in the replica's socket buffer and is applied
// as soon as it runs again, before anything can promote it. The cut gives
// the replica a wrong masterauth and then drops its link, so the replica
// closes the connection (discarding what it had not read) and every attempt
// to re-sync, one a second, fails at AUTH. Nothing else changes: the
// replica keeps answering, a cluster node keeps its bus links, sentinels
// keep seeing it as a replica, so it stays a failover candidate.
//
// Keep a cut short when a failover must pick the replica. A Cluster replica
// refuses to fail over once its link has been down longer than
// cluster-node-timeout x cluster-replica-validity-factor (10) plus
// repl-ping-replica-period (10s), counted from after the node timeout; 0 as
// the factor lifts the limit. Sentinel skips a replica whose link has been
// down longer than ten down-after periods plus the time the master has been
// down.
type ReplicationCut struct {
	master, replica *Server
	auth            string // the replica's masterauth before the cut
	offset          int64  // the replica's replication offset when its link dropped
}

// CutReplication cuts replica off from master (see ReplicationCut) and
// returns once the replica reports its link down. Both must run with a
// password (WithConfig("requirepass ...")): a wrong masterauth fails only
// against a master that asks for one; StartCluster and StartSentinel set
// every node's masterauth from requirepass. It fails the test when replica
// is not a linked replica of master.
func CutReplication(t testing.TB, master, replica *Server) *ReplicationCut {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	c, err := cutReplication(ctx, master, replica)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func cutReplication(ctx context.Context, master, replica *Server) (*ReplicationCut, error) {
	if master.password == "" || replica.password == "" {
		return nil, errors.New("redistest: CutReplication needs servers with a password (requirepass): a wrong masterauth fails only against a master that asks for one")
	}
	rc := adminClient(replica)
	defer rc.Close()
	f, err := infoOf(ctx, rc, "replication")
	if err != nil {
		return nil, fmt.Errorf("redistest: cut replication: replica %s: %w", replica.Addr(), err)
	}
	if f["role"] != "slave" || f["master_port"] != strconv.Itoa(master.Port()) || f["master_link_status"] != "up" {
		return nil, fmt.Errorf("redistest: cut replication: %s is not a linked replica of %s (role %s, master port %s, link %s)",
			replica.Addr(), master.Addr(), f["role"], f["master_port"], f["master_link_status"])
	}
	cfg, err := rc.ConfigGet(ctx, "masterauth").Result()
	if err != nil {
		return nil, fmt.Errorf("redistest: cut replication: %w", err)
	}
	c := &ReplicationCut{master: master, replica: replica, auth: cfg["masterauth"]}
	// Wrong first, then the link: the replica's next attempt already fails.
	if err := rc.ConfigSet(ctx, "masterauth", c.auth+"-cut").Err(); err != nil {
		return nil, fmt.Errorf("redistest: cut replication: %w", err)
	}
	if err := rc.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		return nil, fmt.Errorf("redistest: cut replication: %w", err)
	}
	err = poll(ctx, "the replica's link to its master is still up", func(ctx context.Context) (string, bool) {
		f, err := infoOf(ctx, rc, "replication")
		if err != nil {
			return err.Error(), false
		}
		if f["master_link_status"] != "down" {
			return "master_link_status:" + f["master_link_status"], false
		}
		c.offset, err = strconv.ParseInt(f["master_repl_offset"], 10, 64)
		return fmt.Sprint(err), err == nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Missed returns how many bytes of the master's replication stream the
// replica lacks, once it has checked that the cut holds: the replica's link
// is still down and it has applied nothing since the cut. It fails the test
// otherwise, or when either server does not answer.
func (c *ReplicationCut) Missed(t testing.TB) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	n, err := c.missed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (c *ReplicationCut) missed(ctx context.Context) (int64, error) {
	rc, mc := adminClient(c.replica), adminClient(c.master)
	defer rc.Close()
	defer mc.Close()
	r, err := infoOf(ctx, rc, "replication")
	if err != nil {
		return 0, fmt.Errorf("redistest: replica %s: %w", c.replica.Addr(), err)
	}
	if r["master_link_status"] != "down" {
		return 0, fmt.Errorf("redistest: the cut replica %s is linked to its master again", c.replica.Addr())
	}
	if r["master_repl_offset"] != strconv.FormatInt(c.offset, 10) {
		return 0, fmt.Errorf("redistest: the cut replica %s moved from offset %d to %s", c.replica.Addr(), c.offset, r["master_repl_offset"])
	}
	m, err := replOffset(ctx, mc)
	if err != nil {
		return 0, fmt.Errorf("redistest: master %s: %w", c.master.Addr(), err)
	}
	return m - c.offset, nil
}

// Heal gives the replica its masterauth back and returns once it has
// re-synced and caught up with the master (see WaitCaughtUp). The replica
// retries once a second, so this takes about a second.
func (c *ReplicationCut) Heal(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	rc := adminClient(c.replica)
	defer rc.Close()
	if err := rc.ConfigSet(ctx, "masterauth", c.auth).Err(); err != nil {
		t.Fatalf("redistest: heal replication: %v", err)
	}
	if err := waitCaughtUp(ctx, c.master, c.replica); err != nil {
		t.Fatal(err)
	}
}

// WaitCaughtUp returns once replica's link to master is up and it has
// applied everything master had written when WaitCaughtUp was called. It
// fails the test if that takes more than 10s.
func WaitCaughtUp(t testing.TB, master, replica *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := waitCaughtUp(ctx, master, replica); err != nil {
		t.Fatal(err)
	}
}

func waitCaughtUp(ctx context.Context, master, replica *Server) error {
	mc, rc := adminClient(master), adminClient(replica)
	defer mc.Close()
	defer rc.Close()
	want, err := replOffset(ctx, mc)
	if err != nil {
		return fmt.Errorf("redistest: master %s: %w", master.Addr(), err)
	}
	// Replication reports no event to an outsider: poll the replica's INFO.
	return poll(ctx, fmt.Sprintf("replica %s not caught up with offset %d of %s", replica.Addr(), want, master.Addr()),
		func(ctx context.Context) (string, bool) {
			f, err := infoOf(ctx, rc, "replication")
			if err != nil {
				return err.Error(), false
			}
			got, err := strconv.ParseInt(f["master_repl_offset"], 10, 64)
			return fmt.Sprintf("link %s, offset %s", f["master_link_status"], f["master_repl_offset"]),
				err == nil && f["master_link_status"] == "up" && got >= want
		})
}

// adminClient is a one-connection client for the harness's own commands,
// which never retries: a failure must show, not be papered over.
func adminClient(s *Server) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr(), Password: s.password, MaxRetries: -1, DialerRetries: 1,
		PoolSize: 1, ContextTimeoutEnabled: true})
}

func infoOf(ctx context.Context, c *redis.Client, section string) (map[string]string, error) {
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	return infoFields(info), nil
}

// replOffset is a server's master_repl_offset: on a master, how far its
// replication stream goes; on a replica, how much of it the replica applied.
func replOffset(ctx context.Context, c *redis.Client) (int64, error) {
	f, err := infoOf(ctx, c, "replication")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(f["master_repl_offset"], 10, 64)
}
