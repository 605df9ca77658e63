package awsbudget

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/runbudget/runbudget/httpbudget"
)

// DefaultMaxPause caps the pause a throttled response can impose on a
// domain. It is the SDK's own longest backoff (retry.DefaultMaxBackoff):
// a provider that asks for more than that is asking every host of the run
// to stop for longer than any one SDK client would wait, and a corrupt or
// hostile header must not stall a whole run.
const DefaultMaxPause = retry.DefaultMaxBackoff

// DefaultThrottleStatus are the HTTP statuses counted as throttles whatever
// the error code says: 503 is how S3 says SlowDown (and a HEAD, which has no
// body to carry the code, shows nothing else), and 429 is the generic
// Too Many Requests of S3-compatible servers.
var DefaultThrottleStatus = []int{http.StatusServiceUnavailable, http.StatusTooManyRequests}

// defaultThrottleCheck is the SDK's own throttle classifier: the error codes
// of retry.DefaultThrottleErrorCodes (SlowDown, Throttling, RequestLimitExceeded,
// ...) and an unmodeled 429, the same checks the adaptive retry mode uses.
var defaultThrottleCheck retry.IsErrorThrottle = retry.IsErrorThrottles(retry.DefaultThrottles)

// maxMillis is the largest millisecond count a time.Duration holds.
const maxMillis = int64(1<<63-1) / int64(time.Millisecond)

// parseMillis reads an x-amz-retry-after value: a whole number of
// milliseconds, ASCII digits only, spaces and tabs around it ignored.
// A value too large for a time.Duration saturates.
func parseMillis(v string) (time.Duration, bool) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return 0, false
	}
	var ms int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		ms = ms*10 + int64(c-'0')
		if ms > maxMillis {
			return time.Duration(1<<63 - 1), true
		}
	}
	return time.Duration(ms) * time.Millisecond, true
}

// pauseFrom returns how long a throttled response asks every consumer of the
// domain to hold off, at most max; 0 when it says nothing usable.
//
// S3's x-amz-retry-after (milliseconds) wins over Retry-After when both are
// valid: Retry-After carries whole seconds, so when a server sends both it
// is the rounded-up form of the same advice. A malformed value is ignored,
// and the other header, if valid, is used.
func pauseFrom(h http.Header, now time.Time, max time.Duration) time.Duration {
	d, ok := parseMillis(h.Get("X-Amz-Retry-After"))
	if !ok {
		d, ok = httpbudget.ParseRetryAfter(h.Get("Retry-After"), now)
	}
	if !ok || d < 0 {
		return 0
	}
	return min(d, max)
}

// rawResponse finds the HTTP response of an attempt: in the metadata the
// SDK's AddRawResponseToMetadata middleware fills, or in the error it
// returns for a non-2xx status. nil when the attempt got no response.
func rawResponse(md middleware.Metadata, err error) *http.Response {
	if r, ok := middlewareRawResponse(md); ok {
		return r
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.Response != nil {
		return re.Response.Response
	}
	return nil
}

// isThrottle reports whether an attempt's outcome is a provider throttle.
func (c *config) isThrottle(err error, resp *http.Response) bool {
	if err == nil {
		return false
	}
	if c.throttleCheck != nil && c.throttleCheck.IsErrorThrottle(err) == aws.TrueTernary {
		return true
	}
	if resp != nil {
		for _, s := range c.throttleStatus {
			if resp.StatusCode == s {
				return true
			}
		}
	}
	return false
}
