package admission

import (
	"testing"
	"time"
)

// FuzzRetryAfterSeconds: the header value is the delay rounded up to whole
// seconds, never negative, never overflowing, and zero only when unknown.
func FuzzRetryAfterSeconds(f *testing.F) {
	for _, d := range []int64{0, -1, 1, int64(time.Second) - 1, int64(time.Second), int64(time.Second) + 1, 1<<63 - 1, -1 << 63} {
		f.Add(d)
	}
	f.Fuzz(func(t *testing.T, ns int64) {
		d := time.Duration(ns)
		s := RateDecision{RetryAfter: d}.RetryAfterSeconds()
		if d <= 0 {
			if s != 0 {
				t.Fatalf("%v: %d, want 0 for an unknown delay", d, s)
			}
			return
		}
		if s <= 0 {
			t.Fatalf("%v: %d, want a positive number of seconds", d, s)
		}
		// The ceiling of ns/1e9, in quotient and remainder (s*1e9 itself
		// could overflow for the longest delays).
		want := ns / int64(time.Second)
		if ns%int64(time.Second) != 0 {
			want++
		}
		if s != want {
			t.Fatalf("%v: %d, want %d (rounded up)", d, s, want)
		}
	})
}
