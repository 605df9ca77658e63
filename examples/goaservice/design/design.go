// Package design is the Goa design of the objects service: a small
// in-memory object store whose errors include the three refusals of package
// admission, each declared and mapped to its HTTP status here, so that the
// generated encoders know them.
//
// Regenerate the code in ../gen after editing this file (from
// examples/goaservice):
//
//	go run goa.design/goa/v3/cmd/goa@v3.25.3 gen github.com/runbudget/runbudget/examples/goaservice/design
package design

import (
	. "goa.design/goa/v3/dsl"
)

var _ = API("objects", func() {
	Title("Objects")
	Description("An in-memory object store guarded by runbudget's admission middleware.")
	Server("objects", func() {
		Host("localhost", func() { URI("http://127.0.0.1:8080") })
	})
})

// RateLimited is the error a denied rate decision becomes. It is a type of
// its own, not Goa's ErrorResult, because it carries the retry-after value
// that the HTTP response moves into a Retry-After header.
var RateLimited = Type("RateLimited", func() {
	Description("The caller's request rate is above its allowance.")
	Attribute("message", String, "What happened, for people.", func() {
		Example("rate limit exceeded; retry later")
	})
	Attribute("retry_after", Int64, "Whole seconds until the caller has allowance again; absent when not known.", func() {
		Minimum(1)
		Example(2)
	})
	Required("message")
})

var Object = Type("Object", func() {
	Description("What the store knows about one object.")
	Attribute("key", String, "The object's key.")
	Attribute("size", Int64, "The object's size in bytes.")
	Required("key", "size")
})

var _ = Service("objects", func() {
	Description("Stores objects by key and copies them.")

	// The caller's identity is the rate group key. A real service would
	// take it from its authentication (a Security scheme); a header keeps
	// the example short.
	Error("rate_limited", RateLimited, "The caller is over its rate; see Retry-After.")
	Error("overloaded", ErrorResult, "Too many calls in progress in this process; retry later.", func() {
		Temporary()
	})
	Error("rate_limit_unavailable", ErrorResult, "The shared rate backend could not decide; retry later.", func() {
		Temporary()
	})

	HTTP(func() {
		Path("/objects")
		// Explicit statuses for every admission refusal. Without a Response
		// clause Goa's fallback encoder picks the status from the error's
		// flags, and admission marks a rate check that ran out of time as a
		// timeout, which the fallback would send as 504.
		Response("rate_limited", StatusTooManyRequests, func() {
			Header("retry_after:Retry-After")
		})
		Response("overloaded", StatusServiceUnavailable)
		Response("rate_limit_unavailable", StatusServiceUnavailable)
	})

	Method("put", func() {
		Description("Store content under key, replacing any object already there.")
		Payload(func() {
			Attribute("client", String, "Who calls: the rate group.", func() { MinLength(1) })
			Attribute("key", String, "The object's key.", func() { MinLength(1) })
			Attribute("content", String, "The object's content.")
			Required("client", "key", "content")
		})
		Result(Object)
		HTTP(func() {
			PUT("/{key}")
			Header("client:X-Client")
			Body(func() { Attribute("content") })
			Response(StatusOK)
		})
	})

	Method("copy", func() {
		Description("Copy the object at key to a new key.")
		Payload(func() {
			Attribute("client", String, "Who calls: the rate group.", func() { MinLength(1) })
			Attribute("key", String, "The source object's key.", func() { MinLength(1) })
			Attribute("to", String, "The destination key.", func() { MinLength(1) })
			Required("client", "key", "to")
		})
		Result(Object)
		Error("not_found", ErrorResult, "No object has the source key.")
		HTTP(func() {
			POST("/{key}/copy")
			Header("client:X-Client")
			Body(func() { Attribute("to") })
			Response(StatusOK)
			Response("not_found", StatusNotFound)
		})
	})
})
