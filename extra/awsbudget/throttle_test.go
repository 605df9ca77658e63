package awsbudget

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
)

func TestPauseFrom(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	for _, tc := range []struct {
		name      string
		amz, ra   string // "" means absent
		max, want time.Duration
	}{
		{name: "absent", want: 0},
		{name: "ms", amz: "1500", want: 1500 * time.Millisecond},
		{name: "ms zero", amz: "0", want: 0},
		{name: "ms with spaces", amz: " \t250 ", want: 250 * time.Millisecond},
		{name: "retry-after seconds", ra: "3", want: 3 * time.Second},
		{name: "retry-after date", ra: date(7 * time.Second), want: 7 * time.Second},
		{name: "retry-after date in the past", ra: date(-time.Minute), want: 0},
		{name: "both: ms wins", amz: "1200", ra: "2", want: 1200 * time.Millisecond},
		{name: "both: ms wins even when longer", amz: "4000", ra: "2", want: 4 * time.Second},
		{name: "ms malformed, retry-after used", amz: "soon", ra: "2", want: 2 * time.Second},
		{name: "ms negative is malformed", amz: "-5", ra: "1", want: time.Second},
		{name: "ms fraction is malformed", amz: "1.5", want: 0},
		{name: "ms plus sign is malformed", amz: "+5", want: 0},
		{name: "retry-after malformed", ra: "in a bit", want: 0},
		{name: "retry-after negative", ra: "-3", want: 0},
		{name: "both malformed", amz: "x", ra: "y", want: 0},
		{name: "ms capped", amz: "90000", want: DefaultMaxPause},
		{name: "ms overflow saturates then caps", amz: strings.Repeat("9", 40), want: DefaultMaxPause},
		{name: "retry-after capped", ra: "3600", want: DefaultMaxPause},
		{name: "retry-after date capped", ra: date(time.Hour), want: DefaultMaxPause},
		{name: "custom cap", amz: "5000", max: 2 * time.Second, want: 2 * time.Second},
		{name: "zero cap: no pause", amz: "5000", max: -1, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			if tc.amz != "" {
				h.Set("X-Amz-Retry-After", tc.amz)
			}
			if tc.ra != "" {
				h.Set("Retry-After", tc.ra)
			}
			limit := tc.max
			switch {
			case limit == 0:
				limit = DefaultMaxPause
			case limit < 0:
				limit = 0
			}
			if got := pauseFrom(h, now, limit); got != tc.want {
				t.Errorf("pauseFrom(x-amz-retry-after %q, Retry-After %q, cap %v) = %v, want %v", tc.amz, tc.ra, limit, got, tc.want)
			}
		})
	}
}

func TestDefaultMaxPause(t *testing.T) {
	if DefaultMaxPause != 20*time.Second {
		t.Errorf("DefaultMaxPause = %v; the package documents 20s (the SDK's DefaultMaxBackoff)", DefaultMaxPause)
	}
}

// FuzzParseMillis checks that any header value either parses to a
// non-negative duration made only of digits, or is refused, and never panics.
func FuzzParseMillis(f *testing.F) {
	for _, s := range []string{"0", "1500", " 7 ", "-1", "1e3", "99999999999999999999999", "", "\t", "١٢"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := parseMillis(s)
		trimmed := strings.Trim(s, " \t")
		digits := trimmed != "" && strings.Trim(trimmed, "0123456789") == ""
		if ok != digits {
			t.Fatalf("parseMillis(%q) ok = %v, want %v", s, ok, digits)
		}
		if d < 0 || (!ok && d != 0) {
			t.Fatalf("parseMillis(%q) = %v, %v", s, d, ok)
		}
	})
}

// TestRetryID ties the anchor of the admission to the SDK's own ID for its
// retry loop, so an SDK that renamed it fails here and not in production.
func TestRetryID(t *testing.T) {
	if id := (&retry.Attempt{}).ID(); id != retryID {
		t.Errorf("the SDK's retry middleware is %q, the package anchors on %q", id, retryID)
	}
}
