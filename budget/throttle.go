package budget

import (
	"math"
	"time"
)

// Provider throttling is answered like congestion in TCP CUBIC, and like the
// AWS SDKs' adaptive retry mode, which borrowed from it: a multiplicative
// decrease when the provider pushes back, then a cubic recovery that climbs
// fast while far from the old rate, slows near it, and probes past it.
//
// The factor is a share of the domain's rate, not a rate. With a rate ceiling
// the budget runs at RequestsPerSecond x factor. Without one, the first
// decrease captures the domain's measured start rate and the budget runs at
// that x factor until the factor is back at 1, when the domain is unbounded
// again.
//
// Redis scripts implement the same curve (luascripts/lib.lua); change both
// together, and the conformance suite checks they agree.
const (
	// ThrottleBeta is the share kept at each decrease. 0.7 is CUBIC's beta
	// and the AWS adaptive-retry value: gentler than halving, because a
	// provider's throttle usually means "a little less", not "collapse".
	ThrottleBeta = 0.7
	// ThrottleFloor is the lowest factor. Repeated throttles can cut a
	// domain to 2% of its rate, never to zero, so the budget keeps probing
	// and notices when the provider recovers.
	ThrottleFloor = 0.02
	// ThrottleRecovery is how long the factor takes to climb back to its
	// level before a decrease (CUBIC's K) when that level was 1. Four seconds
	// is a few provider round trips of slow traffic: long enough not to
	// re-trigger a throttle at once, short enough that a single throttle is
	// forgotten before a human would notice the slowdown.
	ThrottleRecovery = 4 * time.Second
	// ThrottleWindow is the coalescing window. Reports that arrive within it
	// after a decrease, or while the domain is paused, describe requests that
	// started before the decrease took effect, so they are one congestion
	// event (TCP reduces once per round trip for the same reason). Fifty
	// consumers hitting the same throttle make one decrease, not fifty.
	ThrottleWindow = time.Second
	// startRateTau is the time constant of the measured start rate: a
	// decaying average over roughly the last couple of seconds.
	startRateTau = 2 * time.Second
	// startRateMemory is how long an idle domain keeps its start history:
	// five time constants, after which less than 1% of it is left.
	startRateMemory = 5 * startRateTau
	// minBaseRate is the rate used for a domain with no ceiling that is
	// throttled before it has started anything measurable.
	minBaseRate = 1.0
)

// throttleC is CUBIC's scaling constant in factor units per second cubed,
// chosen so a decrease from 1 recovers in ThrottleRecovery.
var throttleC = (1 - ThrottleBeta) / math.Pow(ThrottleRecovery.Seconds(), 3)

// throttleFactor returns the factor t seconds after a decrease from wmax.
// It is beta*wmax at t=0, wmax at t=K, and climbs past it after; the result
// is clamped to [ThrottleFloor, 1].
func throttleFactor(wmax, t float64) float64 {
	k := math.Cbrt(wmax * (1 - ThrottleBeta) / throttleC)
	d := t - k
	f := throttleC*d*d*d + wmax
	return min(1, max(ThrottleFloor, f))
}

// decayRate returns the decaying start sum dt seconds after its last update.
func decayRate(sum, dt float64) float64 {
	if dt <= 0 {
		return sum
	}
	x := dt / startRateTau.Seconds()
	if x < 1e-3 {
		// Back-to-back starts: three terms of the series are within 2e-10
		// of it here, and math.Exp was a twentieth of an uncontended
		// in-process Acquire.
		return sum * (1 - x + x*x/2)
	}
	return sum * math.Exp(-x)
}

// measuredRate turns the decaying start sum into starts per second. The sum
// alone underestimates a domain that has been busy for less than a few time
// constants (after one second at 100/s it reads 39/s), so it is divided by
// the weight the window has actually seen since the first start. That age is
// taken as at least one second, so a single start does not read as a flood.
func measuredRate(sum, sinceLast, age float64) float64 {
	w := 1 - math.Exp(-max(age, 1)/startRateTau.Seconds())
	return decayRate(sum, sinceLast) / w
}
