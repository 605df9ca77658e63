package admission

import (
	goa "goa.design/goa/v3/pkg"

	"github.com/runbudget/runbudget/loom"
)

// Error names a service design declares to map admission refusals.
const (
	nameOverloaded      = "overloaded"
	nameRateUnavailable = "rate_limit_unavailable"
)

// errOverloaded is returned by Concurrency.Middleware when no permit is free.
// Each refusal gets a fresh error, because Goa gives every occurrence its own
// ID and callers may mutate what they receive.
func errOverloaded() *loom.ServiceError {
	return goa.TemporaryError(nameOverloaded, "too many calls in progress; retry later")
}

// errRateUnavailable is returned when a rate decision could not be obtained.
// The message is fixed on purpose: it must carry neither the backend's error
// text nor the grouping key, both of which may be sensitive.
func errRateUnavailable() *loom.ServiceError {
	return goa.TemporaryError(nameRateUnavailable, "rate limit check unavailable; retry later")
}

// errRateTimeout is errRateUnavailable for a check that ran out of its time
// budget; it also sets Timeout, so a transport may tell the two apart.
func errRateTimeout() *loom.ServiceError {
	return goa.TemporaryTimeoutError(nameRateUnavailable, "rate limit check timed out; retry later")
}
