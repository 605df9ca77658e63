package loopback

import (
	"net"
	"strconv"
	"testing"
)

func TestFreePort(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		port, err := FreePort(cluster)
		if err != nil {
			t.Fatal(err)
		}
		ports := []int{port}
		if cluster {
			if port+BusPortOffset > 65535 {
				t.Fatalf("cluster port %d has no bus port", port)
			}
			ports = append(ports, port+BusPortOffset)
		}
		for _, p := range ports {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				t.Fatalf("FreePort(%v) gave %d, and %d is taken: %v", cluster, port, p, err)
			}
			l.Close()
		}
	}
}
