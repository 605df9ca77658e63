// Package loopback picks free loopback ports for the redis-server processes
// that tests and the bench start: one place for the one subtle rule (a
// Cluster node needs its bus port free too).
package loopback

import (
	"fmt"
	"net"
	"strconv"
)

// BusPortOffset is the distance from a Cluster node's client port to its
// cluster bus port (Redis's default when cluster-port is not set).
const BusPortOffset = 10000

// FreePort returns a loopback port that was free a moment ago; for a
// Cluster node, one whose bus port (BusPortOffset above it, so the port is
// at most 55535) was free as well. Nothing reserves the ports after return:
// callers retry on a bind failure.
func FreePort(cluster bool) (int, error) {
	var lastErr error
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("picking a loopback port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !cluster {
			l.Close()
			return port, nil
		}
		if port+BusPortOffset > 65535 {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+BusPortOffset)))
		l.Close()
		if err != nil {
			lastErr = err
			continue
		}
		bus.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free loopback port pair for a Cluster node: %v", lastErr)
}
