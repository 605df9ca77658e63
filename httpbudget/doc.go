// Package httpbudget puts a budget.Budget under an http.Client, so that
// every provider request the client sends, on every host of a run, draws on
// one shared quota, and every throttle the provider answers slows all of
// them down together.
//
// A Transport wraps the RoundTripper the client would use anyway:
//
//	client := &http.Client{Transport: &httpbudget.Transport{Budget: b}}
//
// Each round trip waits for admission before anything is sent, holds its
// request slot until the response headers arrive, and holds a GET's body
// slot until the caller closes the body, because a provider counts a
// download until its connection is done. Responses with status 429 or 503
// are reported to the budget with the pause their Retry-After asks for
// (ParseRetryAfter reads it), and returned to the caller as they came.
//
// The package uses only the standard library and the budget packages.
package httpbudget
