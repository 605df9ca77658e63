package backoff

import (
	"testing"
	"time"
)

// TestSpread: every pause lies in [d/2, d], and the draws do spread (a
// constant would put hosts back in lockstep).
func TestSpread(t *testing.T) {
	for _, d := range []time.Duration{10 * time.Millisecond, time.Second} {
		lo, hi := d, time.Duration(0)
		for range 1000 {
			p := Spread(d)
			if p < d/2 || p > d {
				t.Fatalf("Spread(%v) = %v, want in [%v, %v]", d, p, d/2, d)
			}
			lo, hi = min(lo, p), max(hi, p)
		}
		// 1000 uniform draws leave less than a quarter of the range
		// uncovered with probability far below 1e-100.
		if hi-lo < d/4 {
			t.Errorf("Spread(%v) drew only [%v, %v] in 1000 tries", d, lo, hi)
		}
	}
	if p := Spread(0); p != 0 {
		t.Errorf("Spread(0) = %v, want 0", p)
	}
}

// TestNextDoublesToMax: the steps double from first and stop at max, each
// pause within its step's upper half.
func TestNextDoublesToMax(t *testing.T) {
	b := New(10*time.Millisecond, time.Second)
	step := 10 * time.Millisecond
	for i := range 12 {
		p := b.Next()
		if p < step/2 || p > step {
			t.Fatalf("pause %d = %v, want in [%v, %v]", i, p, step/2, step)
		}
		step = min(2*step, time.Second)
	}
	if step != time.Second {
		t.Fatalf("test reached step %v, want the max", step)
	}
}

func TestNewRefusesBadSteps(t *testing.T) {
	for _, c := range []struct{ first, max time.Duration }{{0, time.Second}, {-1, time.Second}, {time.Second, time.Millisecond}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%v, %v) did not panic", c.first, c.max)
				}
			}()
			New(c.first, c.max)
		}()
	}
}
