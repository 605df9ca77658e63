// Package backoff is the pause between retries that every loop of
// runbudget uses while Redis fails. The hosts of one run all see an outage
// begin at the same moment; with plain doubling they would retry in
// lockstep and meet a recovering Redis all at once, so each pause is drawn
// at random from the upper half of its step.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Backoff hands out the pauses of one run of failures. The zero value is
// not usable; make one with New and start a fresh one when a call succeeds.
type Backoff struct {
	step, max time.Duration
}

// New returns a Backoff whose steps start at first and double up to max.
// It panics if first is not positive or max is below first (a programming
// error, never input).
func New(first, max time.Duration) Backoff {
	if first <= 0 || max < first {
		panic("backoff: New needs 0 < first <= max")
	}
	return Backoff{step: first, max: max}
}

// Next returns the pause before the next retry, somewhere in [step/2, step],
// and doubles the step for the one after.
func (b *Backoff) Next() time.Duration {
	d := Spread(b.step)
	b.step = min(2*b.step, b.max)
	return d
}

// Spread draws a pause uniformly from [d/2, d]: half of d is kept as a
// floor, so spreading never turns a backoff into a busy retry.
func Spread(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d-d/2+1)
}
