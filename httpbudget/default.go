package httpbudget

import (
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/runbudget/runbudget/budget"
)

// DomainPrefix starts the ID of every domain DefaultRequest and HostDomain
// name, so plain-HTTP quotas never collide with a provider adapter's.
const DomainPrefix = "http:"

// HostDomain is the quota domain of one host: Version 1, ID "http:" followed
// by host lower-cased. host is taken as the URL has it (host, or host:port),
// with no other normalization: "example.com" and "example.com:443" are two
// domains, because a budget never guesses that two names share a quota.
// host must be valid UTF-8 (lower-casing replaces invalid bytes);
// DefaultRequest refuses a host that is not.
func HostDomain(host string) budget.Domain {
	return budget.Domain{Version: 1, ID: DomainPrefix + strings.ToLower(host)}
}

// DefaultRequest is the mapping a Transport uses when its Request field is
// nil: one domain per host (HostDomain of req.URL.Host) and a class by
// method:
//
//	GET (or "", which net/http sends as GET)  budget.OpGet, OpensBody true
//	HEAD                                      budget.OpHead
//	PUT, POST, PATCH                          budget.OpPut
//	DELETE                                    budget.OpDelete
//
// Any other method (OPTIONS, CONNECT, TRACE, an extension method, or a
// known one in other letter case, since HTTP methods are case-sensitive) is
// an error wrapping budget.ErrInvalidRequest: no class fits them all, and
// charging one to a guessed class would hide it. So is a URL without a
// host; a host that is not valid UTF-8 wraps budget.ErrInvalidDomain. Wrap DefaultRequest to charge such requests, or to add a Consumer,
// MemoryBytes or further domains:
//
//	t.Request = func(r *http.Request) (budget.Request, error) {
//		if r.Method == http.MethodOptions {
//			return budget.Request{Domains: []budget.Domain{httpbudget.HostDomain(r.URL.Host)}, Class: budget.OpHead}, nil
//		}
//		return httpbudget.DefaultRequest(r)
//	}
//
// Only GET holds a body slot: a HEAD, write or delete response carries
// little or nothing, and its lease ends when its headers arrive.
func DefaultRequest(req *http.Request) (budget.Request, error) {
	var r budget.Request
	switch req.Method {
	case http.MethodGet, "":
		r.Class, r.OpensBody = budget.OpGet, true
	case http.MethodHead:
		r.Class = budget.OpHead
	case http.MethodPut, http.MethodPost, http.MethodPatch:
		r.Class = budget.OpPut
	case http.MethodDelete:
		r.Class = budget.OpDelete
	default:
		return budget.Request{}, fmt.Errorf("%w: httpbudget.DefaultRequest has no class for method %q (wrap it to charge one)",
			budget.ErrInvalidRequest, req.Method)
	}
	if req.URL == nil || req.URL.Host == "" {
		return budget.Request{}, fmt.Errorf("%w: httpbudget.DefaultRequest needs a URL with a host", budget.ErrInvalidRequest)
	}
	if !utf8.ValidString(req.URL.Host) {
		// Checked before lower-casing, which would replace the invalid bytes
		// and merge distinct hosts into one domain.
		return budget.Request{}, fmt.Errorf("%w: host %q is not valid UTF-8", budget.ErrInvalidDomain, req.URL.Host)
	}
	r.Domains = []budget.Domain{HostDomain(req.URL.Host)}
	return r, nil
}
