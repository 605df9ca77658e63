// Package dompack reads the value of a budget's domain key, d:<enc>, as the
// scripts pack it (luascripts/lib.lua), for tests and tools that look at
// Redis directly instead of through a script.
package dompack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Version is the layout version, the value's first byte (or, in the text
// form, its second field).
const Version = 2

// Domain is one domain's state as stored. Times are microseconds since the
// Unix epoch, as Redis TIME gives them.
type Domain struct {
	InFlight     []int // by class index
	Bodies       int
	BucketInUse  bool
	Tokens       float64
	TokensAt     int64
	Throttled    bool
	PauseEnd     int64
	TTLEnd       int64 // when the key's TTL runs out, as a script last set it
	FactorBefore float64
	DecreasedAt  int64
	StartBase    float64
	StartSum     float64
	LastStart    int64
	FirstStart   int64
	QueueMayHold bool
}

// fixed is the number of fields before the counts (lib.lua's DFIX).
const fixed = 14

// ErrLayout is returned for a value in no layout this package knows.
var ErrLayout = errors.New("dompack: not a packed domain value")

// Decode reads v, a domain value of a budget with nclass operation classes:
// the binary form (Redis, struct.pack of little-endian doubles after a
// version byte) or the text form (servers without the struct library).
func Decode(v string, nclass int) (Domain, error) {
	var f []float64
	switch {
	case strings.HasPrefix(v, "t "):
		parts := strings.Fields(v)
		if len(parts) != 2+fixed+nclass || parts[1] != strconv.Itoa(Version) {
			return Domain{}, ErrLayout
		}
		for _, p := range parts[2:] {
			x, err := strconv.ParseFloat(p, 64)
			if err != nil {
				return Domain{}, fmt.Errorf("%w: %v", ErrLayout, err)
			}
			f = append(f, x)
		}
	case len(v) == 1+8*(fixed+nclass) && v[0] == Version:
		for i := 1; i < len(v); i += 8 {
			f = append(f, math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[i:i+8]))))
		}
	default:
		return Domain{}, ErrLayout
	}
	d := Domain{
		Bodies: int(f[0]), BucketInUse: f[1] == 1, Tokens: f[2], TokensAt: int64(f[3]),
		Throttled: f[4] == 1, PauseEnd: int64(f[5]), TTLEnd: int64(f[6]),
		FactorBefore: f[7], DecreasedAt: int64(f[8]), StartBase: f[9], StartSum: f[10],
		LastStart: int64(f[11]), FirstStart: int64(f[12]), QueueMayHold: f[13] == 1,
	}
	for _, x := range f[fixed:] {
		d.InFlight = append(d.InFlight, int(x))
	}
	return d, nil
}
