package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
)

// replyError is a server reply, as go-redis reports one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var _ redis.Error = replyError("")

func TestTopologyError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true},
		{fmt.Errorf("wrapped: %w", &net.OpError{Op: "read", Err: errors.New("i/o timeout")}), true},
		{context.DeadlineExceeded, true}, // a call that hung on a dead master
		{replyError("CLUSTERDOWN The cluster is down"), true},
		{replyError("MASTERDOWN Link with MASTER is down"), true},
		{replyError("READONLY You can't write against a read only replica."), true},
		{replyError("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{replyError("LOADING Redis is loading the dataset in memory"), true},
		{context.Canceled, false},
		{replyError("ERR RBINVAL class is out of range"), false},
		{replyError("OOM command not allowed when used memory > 'maxmemory'"), false},
		{replyError("NOSCRIPT No matching script"), false},
	} {
		if got := topologyError(tc.err); got != tc.want {
			t.Errorf("topologyError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
