package httpbudget

import (
	"net/http"
	"strings"
	"time"
)

// maxDeltaSeconds bounds a delta-seconds value before it becomes a
// time.Duration: anything larger would overflow, and no caller waits that
// long anyway (Transport caps the pause far lower).
const maxDeltaSeconds = int64(1<<63-1) / int64(time.Second)

// ParseRetryAfter reads a Retry-After value: delta-seconds or an HTTP-date (relative to now). ok is false for an absent or malformed value; a date in the past is 0, true.
//
// Leading and trailing spaces and tabs are ignored. Delta-seconds is one or
// more ASCII digits (no sign, no fraction); a value too large for a
// time.Duration saturates at the largest one. An HTTP-date is any of the
// three forms net/http accepts (IMF-fixdate, RFC 850, ANSI C asctime).
func ParseRetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	v := strings.Trim(value, " \t")
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		var secs int64
		for i := 0; i < len(v); i++ {
			secs = secs*10 + int64(v[i]-'0')
			if secs > maxDeltaSeconds {
				return time.Duration(1<<63 - 1), true
			}
		}
		return time.Duration(secs) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d = at.Sub(now)
	if d < 0 {
		d = 0
	}
	return d, true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
