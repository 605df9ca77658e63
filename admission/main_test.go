package admission

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/runbudget/runbudget/loom"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// wantServiceError fails the test unless err is a *loom.ServiceError with the
// given name and Temporary set, and returns it.
func wantServiceError(t *testing.T, err error, name string) *loom.ServiceError {
	t.Helper()
	var se *loom.ServiceError
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T): want a *loom.ServiceError named %q", err, err, name)
	}
	if se.Name != name {
		t.Fatalf("ServiceError name %q, want %q", se.Name, name)
	}
	if !se.Temporary {
		t.Fatalf("ServiceError %q: Temporary not set", se.Name)
	}
	if se.ID == "" {
		t.Fatalf("ServiceError %q: no ID", se.Name)
	}
	return se
}

// wantNoLeak fails the test if the error's text holds any of the secrets.
func wantNoLeak(t *testing.T, err error, secrets ...string) {
	t.Helper()
	for e := err; e != nil; e = errors.Unwrap(e) {
		for _, s := range secrets {
			if strings.Contains(e.Error(), s) {
				t.Fatalf("error %q (in the chain of %q) leaks %q", e.Error(), err.Error(), s)
			}
		}
	}
}
