package httpbudget_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/runbudget/runbudget/httpbudget"
)

// retryNow is the clock every date case is read against.
var retryNow = time.Date(2024, time.January, 2, 15, 4, 5, 0, time.UTC)

const maxDuration = time.Duration(math.MaxInt64)

func TestParseRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value string
		want  time.Duration
		ok    bool
	}{
		// Absent and malformed: not ok, and zero.
		{"empty", "", 0, false},
		{"space", " ", 0, false},
		{"spaces and tabs", " \t \t", 0, false},
		{"negative", "-1", 0, false},
		{"plus sign", "+1", 0, false},
		{"fraction", "1.5", 0, false},
		{"word", "abc", 0, false},
		{"unit suffix", "5s", 0, false},
		{"two numbers", "1 2", 0, false},
		{"hex", "0x10", 0, false},
		{"inner newline", "1\n2", 0, false},
		{"unicode digit", "\u0661", 0, false},
		{"date without zone", "Tue, 02 Jan 2024 15:04:35", 0, false},
		{"day out of range", "Tue, 32 Jan 2024 15:04:35 GMT", 0, false},
		{"ISO 8601", "2024-01-02T15:04:35Z", 0, false},

		// Delta-seconds.
		{"zero", "0", 0, true},
		{"seconds", "120", 120 * time.Second, true},
		{"leading zeros", "007", 7 * time.Second, true},
		{"leading and trailing space", " 5 ", 5 * time.Second, true},
		{"tabs", "\t5\t", 5 * time.Second, true},
		{"largest that fits", "9223372036", 9223372036 * time.Second, true},
		{"one past what fits saturates", "9223372037", maxDuration, true},
		{"twenty digits saturates", "99999999999999999999", maxDuration, true},
		{"hundred digits saturates", strings.Repeat("9", 100), maxDuration, true},

		// HTTP-dates, in the three forms net/http accepts, read against
		// retryNow (15:04:05).
		{"IMF-fixdate", "Tue, 02 Jan 2024 15:04:35 GMT", 30 * time.Second, true},
		{"RFC 850", "Tuesday, 02-Jan-24 15:04:35 GMT", 30 * time.Second, true},
		{"ANSI C", "Tue Jan  2 15:04:35 2024", 30 * time.Second, true},
		{"date with spaces around", "  Tue, 02 Jan 2024 15:05:05 GMT ", time.Minute, true},
		{"date next day", "Wed, 03 Jan 2024 15:04:05 GMT", 24 * time.Hour, true},
		{"date now", "Tue, 02 Jan 2024 15:04:05 GMT", 0, true},
		{"date in the past", "Tue, 02 Jan 2024 15:03:05 GMT", 0, true},
		{"date long past", "Sun, 06 Nov 1994 08:49:37 GMT", 0, true},
		{"RFC 850 in the past", "Sunday, 06-Nov-94 08:49:37 GMT", 0, true},
		{"ANSI C in the past", "Sun Nov  6 08:49:37 1994", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, ok := httpbudget.ParseRetryAfter(tc.value, retryNow)
			if d != tc.want || ok != tc.ok {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tc.value, d, ok, tc.want, tc.ok)
			}
		})
	}
}

// A date is relative to the now passed in, not to the wall clock.
func TestParseRetryAfterDateUsesNow(t *testing.T) {
	const v = "Tue, 02 Jan 2024 15:04:35 GMT"
	for _, tc := range []struct {
		now  time.Time
		want time.Duration
	}{
		{retryNow, 30 * time.Second},
		{retryNow.Add(10 * time.Second), 20 * time.Second},
		{retryNow.Add(500 * time.Millisecond), 29500 * time.Millisecond},
		{retryNow.In(time.FixedZone("UTC+5", 5*3600)), 30 * time.Second},
		{retryNow.Add(time.Hour), 0},
	} {
		if d, ok := httpbudget.ParseRetryAfter(v, tc.now); !ok || d != tc.want {
			t.Errorf("ParseRetryAfter(%q, %v) = %v, %v; want %v, true", v, tc.now, d, ok, tc.want)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{
		"", " ", "0", "5", " 5 ", "-1", "1.5", "abc", "99999999999999999999",
		"9223372036", "9223372037",
		"Tue, 02 Jan 2024 15:04:35 GMT", "Tuesday, 02-Jan-24 15:04:35 GMT",
		"Tue Jan  2 15:04:35 2024", "Sun, 06 Nov 1994 08:49:37 GMT",
		"Fri, 31 Dec 9999 23:59:59 GMT",
	} {
		f.Add(s, retryNow.Unix())
	}
	f.Fuzz(func(t *testing.T, v string, unix int64) {
		now := time.Unix(unix, 0)
		d, ok := httpbudget.ParseRetryAfter(v, now)
		if d < 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, negative", v, d)
		}
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, false: a failed parse must be zero", v, d)
		}
		trimmed := strings.Trim(v, " \t")
		if trimmed != "" && strings.Trim(trimmed, "0123456789") == "" {
			if !ok {
				t.Fatalf("ParseRetryAfter(%q): digits refused", v)
			}
			if d%time.Second != 0 && d != maxDuration {
				t.Fatalf("ParseRetryAfter(%q) = %v: delta-seconds must be whole seconds or saturate", v, d)
			}
		}
		if ok && trimmed == "" {
			t.Fatalf("ParseRetryAfter(%q) accepted a blank value", v)
		}
	})
}
