package demo

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that everything the tests started (workers, providers,
// budgets, views) has stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
	)
}
