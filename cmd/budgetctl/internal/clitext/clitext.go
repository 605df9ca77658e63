// Package clitext holds the text budgetctl shows and reads, shared by the
// operator commands and the demo: sizes, limits, tables and JSON lines, and
// quoting for text that comes from Redis.
package clitext

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/runbudget/runbudget/budget"
	"golang.org/x/term"
)

// JSON prints v as one line of JSON.
func JSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// Table returns a tabwriter for budgetctl's tables: columns two spaces
// apart, padded with spaces. Flush it when the table is done.
func Table(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// IsTerminal reports whether f (an *os.File) is a terminal.
func IsTerminal(f any) bool {
	file, ok := f.(*os.File)
	return ok && term.IsTerminal(int(file.Fd()))
}

// Quote prints operator-facing text from Redis (budget names, consumers)
// quoted, so that control characters in it cannot rewrite the terminal or
// forge lines.
func Quote(s string) string { return strconv.Quote(s) }

// Bytes prints a size in binary units, exact where it can be.
func Bytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f := float64(n)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 {
		return strconv.FormatInt(n, 10) + "B"
	}
	if f == float64(int64(f)) {
		return strconv.FormatInt(int64(f), 10) + units[i]
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + units[i]
}

// ExactBytes prints a size that ParseBytes reads back exactly: in binary
// units when it is a whole number of them, in bytes otherwise.
func ExactBytes(n int64) string {
	if s := Bytes(n); !strings.Contains(s, ".") {
		return s
	}
	return strconv.FormatInt(n, 10)
}

// Ceiling prints a limit, "-" when it is zero (unbounded).
func Ceiling(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

// Limits prints a host's limits on one line; "-" marks an unbounded
// dimension.
func Limits(l budget.Limits) string {
	mem := "-"
	if l.MemoryBytes > 0 {
		mem = Bytes(l.MemoryBytes)
	}
	return SharedLimits(l) + ";  memory " + mem
}

// SharedLimits prints the limits every host of a run shares, the ones a
// budget keeps in Redis: all but memory, which is each host's own.
func SharedLimits(l budget.Limits) string {
	var b strings.Builder
	if l.RequestsPerSecond > 0 {
		fmt.Fprintf(&b, "rate %s/s burst %d", strconv.FormatFloat(l.RequestsPerSecond, 'f', -1, 64), l.Burst)
	} else {
		b.WriteString("rate -")
	}
	b.WriteString(";  in flight")
	for _, c := range budget.Classes() {
		fmt.Fprintf(&b, " %s %s", c, Ceiling(l.InFlight[c]))
	}
	fmt.Fprintf(&b, ";  open bodies %s", Ceiling(l.OpenBodies))
	return b.String()
}

var byteUnits = []struct {
	suffix string
	n      int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"b", 1},
}

// ParseBytes reads a byte count: a whole number with an optional unit,
// KiB/MiB/GiB/TiB (or K/M/G, the same), KB/MB/GB/TB (powers of ten) or B.
func ParseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.n
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("want a size like 65536, 64KiB or 16MiB")
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size too large")
	}
	return n * mult, nil
}

// ByteSize is a pflag value for sizes with units.
type ByteSize int64

func (b *ByteSize) String() string { return Bytes(int64(*b)) }
func (b *ByteSize) Type() string   { return "size" }
func (b *ByteSize) Set(s string) error {
	n, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b = ByteSize(n)
	return nil
}
