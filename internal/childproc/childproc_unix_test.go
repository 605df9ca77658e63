//go:build unix

package childproc

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
)

func helperOS(role string) int {
	if role == "term" { // exits 3 on SIGTERM
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		fmt.Println("ready")
		<-ctx.Done()
		return 3
	}
	return helperLinux(role)
}

// TestContextEndAsksFirst: the end of Start's ctx sends SIGTERM, which the
// helper can catch to end cleanly, rather than killing it.
func TestContextEndAsksFirst(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	p := start(t, ctx, "term", 0)
	if line, ok := next(t, p); !ok || line != "ready" {
		t.Fatalf("first line %q, %v", line, ok)
	}
	cancel()
	var exit *exec.ExitError
	if err := p.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("Wait = %v (%s), want exit status 3 from the helper's SIGTERM handler", err, p.State())
	}
}
