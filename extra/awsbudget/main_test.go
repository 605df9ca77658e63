package awsbudget_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: the middleware
// starts none, and the tests own every lane, server and budget they start.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
