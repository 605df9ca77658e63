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

// Version is the layout version, the value's first word (or, in the text
// form, its second field).
const Version = 2

// Domain is one domain's state as stored. Times are microseconds since the
// Unix epoch, as Redis TIME gives them.
type Domain struct {
	QueueMayHold bool
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
	Epoch        int64 // the epoch its counts are of
	InFlight     []int // by class index
}

// fixed is the number of fields between the version and the counts
// (lib.lua's DFIX); the first two are integers, the rest doubles.
const fixed = 15

// ErrLayout is returned for a value in no layout this package knows.
var ErrLayout = errors.New("dompack: not a packed domain value")

// Decode reads v, a domain value of a budget with nclass operation classes:
// the binary form (Redis: big-endian 64-bit words, integers for the
// version, the first two fields and the counts, doubles for the rest) or
// the text form (servers without Lua's struct library).
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
	case len(v) == 8*(1+fixed+nclass):
		word := func(i int) uint64 { return binary.BigEndian.Uint64([]byte(v[8*i : 8*i+8])) }
		if int64(word(0)) != Version {
			return Domain{}, ErrLayout
		}
		for i := 1; i <= fixed+nclass; i++ {
			if i <= 2 || i > fixed {
				f = append(f, float64(int64(word(i))))
			} else {
				f = append(f, math.Float64frombits(word(i)))
			}
		}
	default:
		return Domain{}, ErrLayout
	}
	d := Domain{
		QueueMayHold: f[0] == 1, Bodies: int(f[1]), BucketInUse: f[2] == 1, Tokens: f[3], TokensAt: int64(f[4]),
		Throttled: f[5] == 1, PauseEnd: int64(f[6]), TTLEnd: int64(f[7]),
		FactorBefore: f[8], DecreasedAt: int64(f[9]), StartBase: f[10], StartSum: f[11],
		LastStart: int64(f[12]), FirstStart: int64(f[13]), Epoch: int64(f[14]),
	}
	for _, x := range f[fixed:] {
		d.InFlight = append(d.InFlight, int(x))
	}
	return d, nil
}
