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
const Version = 3

// Domain is one domain's state as stored. Times are microseconds since the
// Unix epoch, as Redis TIME gives them.
type Domain struct {
	Waiters      int // live entries in its queue
	Secondary    int // of Waiters, those of requests on several domains whose first this is not
	QueueHead    int64
	QueueLen     int64
	QueueBase    int64
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
// (lib.lua's DFIX); the first ints are integers, the rest doubles.
const (
	fixed = 19
	ints  = 6
)

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
			if i <= ints || i > fixed {
				f = append(f, float64(int64(word(i))))
			} else {
				f = append(f, math.Float64frombits(word(i)))
			}
		}
	default:
		return Domain{}, ErrLayout
	}
	d := Domain{
		Waiters: int(f[0]), Bodies: int(f[1]), Secondary: int(f[2]),
		QueueHead: int64(f[3]), QueueLen: int64(f[4]), QueueBase: int64(f[5]),
		BucketInUse: f[6] == 1, Tokens: f[7], TokensAt: int64(f[8]),
		Throttled: f[9] == 1, PauseEnd: int64(f[10]), TTLEnd: int64(f[11]),
		FactorBefore: f[12], DecreasedAt: int64(f[13]), StartBase: f[14], StartSum: f[15],
		LastStart: int64(f[16]), FirstStart: int64(f[17]), Epoch: int64(f[18]),
	}
	for _, x := range f[fixed:] {
		d.InFlight = append(d.InFlight, int(x))
	}
	return d, nil
}
