package redisstore

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Redis at maxclients accepts the TCP connection, answers its first
// command with "-ERR max number of clients reached" and closes it. go-redis
// takes that reply to its HELLO for a server without HELLO, falls back, and
// fails on the closed socket, so what reaches the store is a broken pipe or
// a timeout that does not say why (scenario 23 in FAULTS.md). The store
// therefore watches the first reply on each new connection of its client,
// and an unavailable error names the refusal when one was seen recently.

// maxClientsReply starts Redis's refusal of a connection over maxclients.
var maxClientsReply = []byte("-ERR max number of clients reached")

// refusalMemory is how long a seen refusal explains later failures.
const refusalMemory = 10 * time.Second

// refusalWatch is a go-redis hook that records when a new connection was
// refused for maxclients. Each store adds its own to its client (a hook
// stays for the client's life, and costs a flag test per read).
type refusalWatch struct {
	last  atomic.Int64 // UnixNano of the latest refusal; 0: none
	nodes sync.Map     // cluster node clients already hooked
}

// watchRefusals hooks a new watch into c, on every node of a Cluster,
// present and future.
func watchRefusals(ctx context.Context, c redis.UniversalClient) *refusalWatch {
	w := &refusalWatch{}
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		c.AddHook(w)
		return w
	}
	// A ClusterClient dials through its node clients, whose hooks are
	// their own.
	hook := func(n *redis.Client) {
		if _, done := w.nodes.LoadOrStore(n, true); !done {
			n.AddHook(w)
		}
	}
	cc.OnNewNode(hook)
	_ = cc.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error {
		hook(n)
		return nil
	})
	return w
}

// recent reports whether a refusal was seen within refusalMemory.
func (w *refusalWatch) recent(now time.Time) bool {
	if w == nil {
		return false
	}
	at := w.last.Load()
	return at != 0 && now.Sub(time.Unix(0, at)) < refusalMemory
}

func (w *refusalWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return conn, err
		}
		fr := firstReply{Conn: conn, w: w}
		if _, ok := conn.(syscall.Conn); ok {
			// go-redis checks an idle connection's health through its
			// file descriptor; keep that working.
			return &firstReplySys{fr}, nil
		}
		return &fr, nil
	}
}

func (w *refusalWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (w *refusalWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// firstReply looks at the first bytes read from a connection; after them
// it only passes reads through. go-redis reads a connection from one
// goroutine at a time, so seen needs no lock.
type firstReply struct {
	net.Conn
	w    *refusalWatch
	seen bool
}

func (c *firstReply) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.seen && n > 0 {
		c.seen = true
		if bytes.HasPrefix(p[:n], maxClientsReply) {
			c.w.last.Store(time.Now().UnixNano())
		}
	}
	return n, err
}

// firstReplySys is a firstReply over a connection with a file descriptor.
type firstReplySys struct{ firstReply }

func (c *firstReplySys) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}
