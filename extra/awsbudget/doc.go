// Package awsbudget runs every request of an aws-sdk-go-v2 S3 client through
// a runbudget budget, so that all lanes and hosts of a run share one quota
// per bucket instead of each SDK client finding the provider's limits by
// drawing 503 SlowDown.
//
// One option installs it:
//
//	b, _ := budget.New(limits, budget.WithStore(store)) // one Budget per host
//	client := s3.NewFromConfig(cfg, awsbudget.WithBudget(b))
//
// or, for every client built from a config, APIOption in cfg.APIOptions.
//
// # One admission per attempt
//
// The admission is a Finalize-step middleware (AdmissionID) placed right
// after the SDK's "Retry" middleware. The retry loop runs above it, so every
// attempt, first or retried, is a new provider request and a new admission,
// and the SDK's backoff sleeps hold no slot. Identity resolution
// ("GetIdentity") and signing ("Signing") run below it, so an attempt is
// signed with fresh credentials after it is admitted, however long it
// waited: a wait never ages a signature. Each attempt's lease gives its
// request slot back when the response is in, and is released on every
// other path (an error, a cancelled context, a panic below it).
//
// If the context ends while an attempt waits, nothing is sent and the
// operation fails with an *aws.RequestCanceledError wrapping the context's
// error, which the SDK's retryers never retry. Budget errors (ErrUnavailable,
// ErrClosed, ErrInvalidDomain, ...) fail the attempt, wrapped, and are not
// retried either: the SDK's classifiers do not know them.
//
// # Classes, bodies and domains
//
// DefaultClass maps operations to classes (WithClass replaces it): listings
// to budget.OpList, HeadObject, HeadBucket and other metadata reads to
// OpHead, GetObject to OpGet, uploads and multipart steps to OpPut, deletes
// to OpDelete, and anything it does not know to OpPut, the cautious side.
// A provider counts a GET until its body is drained, so an OpGet attempt
// keeps a body slot after its response headers: closing the output's Body
// releases it, reaching EOF does not. Close every Body, as the SDK asks
// anyway; one never closed holds its slot, as it holds the connection.
//
// DefaultDomain gives each bucket its own domain,
// {Version: 1, ID: "s3:<region>:<bucket>"}; WithDomain replaces it, for
// example with one domain per partitioned prefix.
//
// # Copies
//
// CopyObject and UploadPartCopy touch two buckets: S3 reads the source and
// writes the destination, and meters the request as a write (it counts
// COPY with PUT, POST and DELETE, and the request goes to the destination
// bucket). A
// budget.Request has one class for all its domains, so the two sides cannot
// be charged as OpPut and OpCopySourceRead in one admission. They are not
// charged as two admissions either: a copy holding its destination slot
// while it waits for its source slot, under the budget's FIFO fairness,
// deadlocks as soon as the put class is at its ceiling, because every
// holder then waits behind an older waiter that needs a put slot on the
// same bucket (a bucket copied within, or two buckets copied both ways,
// is enough; TestCopiesCannotDeadlock reproduces the shape).
//
// So a copy is one atomic admission on both buckets' domains (one, when
// they are the same), with the destination's class, OpPut. The destination
// is charged as S3 meters it. The source is charged one start against its
// rate and a put slot while the copy runs, which over-counts by the put
// slot but never under-counts, and keeps the source's own traffic from
// crowding out the copy's read. A run that wants copies counted apart from
// uploads maps them to OpCopySourceRead with WithClass: both sides are then
// charged under that class, and InFlight[OpCopySourceRead] bounds copies.
// A throttled copy slows both domains, since S3 does not say which side
// was over its rate. With redisstore.WithShardKey, the two buckets of a
// copy must share a shard key, as any request's domains must.
//
// # Throttles
//
// An attempt is a throttle when the SDK's own classifier says so (the
// error codes of retry.DefaultThrottleErrorCodes, SlowDown among them, and
// an unmodeled 429: retry.DefaultThrottles; WithThrottleCheck replaces it)
// or its status is 503 or 429 (WithThrottleStatus). Budget.Throttle is then
// called for every domain of its request, so every host slows down, with
// the pause the response asks for: S3's x-amz-retry-after in milliseconds,
// else Retry-After (delta-seconds or an HTTP-date, read by
// httpbudget.ParseRetryAfter), at most DefaultMaxPause (20s, the SDK's own
// longest backoff; WithMaxPause). When both are valid x-amz-retry-after
// wins, being the precise form of the same advice. Absent or malformed
// advice still counts as a throttle, with no pause. The report is sent even
// when the caller's context has ended (bounded by 5s of its own); a report
// that fails is logged through the SDK's logger, and the caller always gets
// the provider's error unchanged.
//
// # The SDK's retry modes
//
// Use the standard retry mode (the SDK's default) with at least its
// default three attempts. With the budget pacing the run, retries are rare,
// and each one is admitted like any attempt; the retryer's backoff and its
// retry quota stay as they are, which is what an SDK client should still do
// when the provider pushes back.
//
// Do not use the adaptive mode. Its client-side token bucket is a second
// rate controller reacting to the same throttles: it cuts this one client's
// rate on a throttle that the budget has already answered for every host,
// so the throttle is counted twice, and its sleep sits inside the retry loop
// where the budget cannot see it. The shared budget does what adaptive mode
// does, once, for the whole run. WithBudget logs a warning on a client
// configured with the adaptive mode.
//
// # Goroutines
//
// The middleware starts none: it runs in the caller's goroutine, and a
// held body is released by the caller's Close.
package awsbudget
