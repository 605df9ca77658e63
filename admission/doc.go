// Package admission decides, at the entry of a loom endpoint, whether a call
// may run now: Concurrency caps how many calls run at once in this process,
// and RateAdmission caps how often calls of one group arrive, against a local
// Rate or a shared backend such as redisstore.NewRateCheck.
//
// Both plug into the middleware hook a service already has (a Goa-generated
// Endpoints.Use, or a hand-written constructor) and refuse at once rather
// than queue: there are no worker goroutines, retries or waiting lines here.
// What stays with the application is the choice of budgets, how calls are
// grouped into keys, where each middleware is installed, and how the two
// refusals map onto the transport, for example:
//
//   - a *loom.ServiceError named "overloaded" (Temporary set) when
//     Concurrency is saturated: HTTP 503;
//   - the application's own denial error for a denied RateDecision: HTTP 429,
//     with Retry-After set from RateDecision.RetryAfterSeconds only when it is
//     positive;
//   - a *loom.ServiceError named "rate_limit_unavailable" when the rate
//     backend failed, timed out or answered nonsense: the call is refused,
//     never let through.
//
// A caller whose context is already done gets ctx.Err() back, unchanged.
//
// Concurrency and Rate hold a mutex and must not be copied after first use;
// go vet's copylocks check reports a copy.
package admission
