package budget

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/runbudget/runbudget/lease"
)

// Errors. Each is wrapped with detail; test for them with errors.Is.
var (
	// ErrInvalidLimits: New was given Limits that bound nothing or hold a
	// value no budget can enforce (negative, NaN, infinite, unknown class).
	ErrInvalidLimits = errors.New("budget: invalid limits")
	// ErrInvalidDomain: a Domain in a request or a throttle report fails
	// Domain.Validate.
	ErrInvalidDomain = errors.New("budget: invalid domain")
	// ErrInvalidRequest: a request has no domains, an unknown class or a
	// negative memory reservation, or a throttle has a negative retry-after.
	ErrInvalidRequest = errors.New("budget: invalid request")
	// ErrNeverAdmissible: the request asks for more than a ceiling allows
	// (memory above the host's MemoryBytes), so waiting could never end.
	ErrNeverAdmissible = errors.New("budget: request can never be admitted")
	// ErrLimitsConflict: the store already holds different limits for this
	// budget, and WithReplaceLimits was not given.
	ErrLimitsConflict = errors.New("budget: limits differ from the stored limits")
	// ErrUnavailable: the store could not be reached for longer than the
	// grace period. Nothing was admitted without it.
	ErrUnavailable = errors.New("budget: store unavailable")
	// ErrClosed: the budget was closed.
	ErrClosed = errors.New("budget: closed")
)

// Domain names one provider quota: the scope within which requests contend
// for rate and concurrency. Two requests share a budget when, and only when,
// their domains are equal in both fields.
//
// The ID is opaque provider text. This package never parses, trims or
// case-folds it, and never infers that one domain contains another: only the
// provider knows what it meters. A Domain must never carry credentials.
type Domain struct {
	// Version is the provider's naming scheme. Bumping it on a scheme change
	// turns old and new names into separate budgets, never into an accidental
	// shared one.
	Version int `json:"version"`
	// ID names the quota within that scheme.
	ID string `json:"id"`
}

// String renders the domain for logs with its ID quoted, so an ID holding
// newlines or control characters cannot forge log lines.
func (d Domain) String() string {
	return "v" + strconv.Itoa(d.Version) + ":" + strconv.Quote(d.ID)
}

// Validate reports whether d can key a budget: its ID is not empty and comes
// back byte-for-byte from a JSON round trip (which rules out invalid UTF-8).
// A valid ID is never altered; an ID of spaces is a legal opaque value.
func (d Domain) Validate() error {
	if d.ID == "" {
		return fmt.Errorf("%w: empty ID (version %d)", ErrInvalidDomain, d.Version)
	}
	// encoding/json writes valid UTF-8 back exactly as it read it (escapes
	// decode to the same runes) and replaces invalid bytes with U+FFFD, so
	// "survives a round trip" is exactly "is valid UTF-8"; the check is
	// done directly because it sits on every Acquire. A test holds the two
	// equivalent.
	if !utf8.ValidString(d.ID) {
		return fmt.Errorf("%w: %s is not valid UTF-8, so it would not survive serialization", ErrInvalidDomain, d)
	}
	return nil
}

// compare orders domains by version, then ID bytes.
func (d Domain) compare(e Domain) int {
	if d.Version != e.Version {
		if d.Version < e.Version {
			return -1
		}
		return 1
	}
	return strings.Compare(d.ID, e.ID)
}

// OpClass is the kind of provider request. Classes are counted apart because
// they load a provider differently: a listing and a large ranged read are not
// interchangeable, and pooling them would let one starve the other.
type OpClass string

// The operation classes. The first four are reads; OpPut and OpDelete are
// the destination side of a copy job, which providers meter apart from
// reads (S3 counts PUT, COPY, POST and DELETE against one rate per prefix and
// GET and HEAD against another).
const (
	OpList           OpClass = "list"             // an object listing
	OpHead           OpClass = "head"             // a metadata request
	OpGet            OpClass = "get"              // a whole or ranged content read
	OpCopySourceRead OpClass = "copy_source_read" // the source read of a server-side copy; no body reaches the client
	OpPut            OpClass = "put"              // an object or part written (PUT, POST, a multipart step)
	OpDelete         OpClass = "delete"           // an object deleted
)

// NumClasses is how many classes there are.
const NumClasses = len(classTable)

// classTable is the one list of classes. A class's position in it is its
// index everywhere: the in-process store's counters, the Redis hash fields
// and script arguments, budgetctl's columns. Append only: a reordering
// would make stored state count under the wrong class.
var classTable = [...]OpClass{OpList, OpHead, OpGet, OpCopySourceRead, OpPut, OpDelete}

// Classes returns every known class, in index order. The array is a copy:
// changing it changes nothing here.
func Classes() [NumClasses]OpClass { return classTable }

// Index returns the class's position in Classes, or -1 if it is unknown.
func (c OpClass) Index() int {
	// A switch, not a scan of classTable: Index runs several times per
	// Acquire, and a scan cost an uncontended in-process Acquire about a
	// tenth. TestOpClassIndex holds the switch to the table.
	switch c {
	case OpList:
		return 0
	case OpHead:
		return 1
	case OpGet:
		return 2
	case OpCopySourceRead:
		return 3
	case OpPut:
		return 4
	case OpDelete:
		return 5
	}
	return -1
}

// Limits are the ceilings a run places on its own work. Zero in any dimension
// means that dimension is unbounded, but a Limits that bounds nothing at all
// is refused, so "no budget" is never reached by leaving fields out.
//
// Rate, burst, in-flight and open bodies apply to each quota domain and are
// shared by every host of the run: they describe load leaving the run, which
// the provider meters per domain. Memory is each host's: it describes
// buffers held in one process's heap, and one buffer is one buffer however
// many domains its request touches. Two hosts with MemoryBytes of 1 GiB may
// each hold 1 GiB.
type Limits struct {
	// RequestsPerSecond bounds request starts per domain per second.
	RequestsPerSecond float64 `json:"requests_per_second,omitempty"`
	// Burst is how many starts may bunch together on one domain. Zero with a
	// rate set means one second's worth of the rate, at least 1. A burst with
	// no rate bounds nothing and is refused.
	Burst int `json:"burst,omitempty"`
	// InFlight bounds concurrent requests per class, per domain. Classes
	// absent (or zero) are unbounded; an unknown class is refused.
	InFlight map[OpClass]int `json:"in_flight,omitempty"`
	// OpenBodies bounds response bodies held open at once per domain. A body
	// counts until it is closed, since that is how long the provider's
	// connection is held, not until the request completes.
	OpenBodies int `json:"open_bodies,omitempty"`
	// MemoryBytes bounds the buffer reservations one Budget (one process)
	// holds at once. The Budget enforces it itself, in a FIFO line of its
	// own, before it asks the store; stores never see it, and hosts of one
	// run may set it differently.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
}

// maxRate keeps rates in the range where float64 token arithmetic in Lua and
// Go stays exact enough; no provider meters more than a billion per second.
const maxRate = 1e9

// Normalize validates l and returns it with defaults filled in: Burst set
// from the rate, and zero InFlight entries dropped. Errors wrap
// ErrInvalidLimits and name the field.
func (l Limits) Normalize() (Limits, error) {
	bad := func(format string, a ...any) (Limits, error) {
		return Limits{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidLimits}, a...)...)
	}
	r := l.RequestsPerSecond
	switch {
	case math.IsNaN(r) || math.IsInf(r, 0):
		return bad("RequestsPerSecond is %v", r)
	case r < 0:
		return bad("RequestsPerSecond %v is negative", r)
	case r > maxRate:
		return bad("RequestsPerSecond %v is above %g", r, float64(maxRate))
	case l.Burst < 0:
		return bad("Burst %d is negative", l.Burst)
	case l.Burst > 0 && r == 0:
		return bad("Burst %d is set without RequestsPerSecond", l.Burst)
	case l.OpenBodies < 0:
		return bad("OpenBodies %d is negative", l.OpenBodies)
	case l.MemoryBytes < 0:
		return bad("MemoryBytes %d is negative", l.MemoryBytes)
	}
	out := Limits{RequestsPerSecond: r, Burst: l.Burst, OpenBodies: l.OpenBodies, MemoryBytes: l.MemoryBytes}
	if r > 0 && out.Burst == 0 {
		out.Burst = max(1, int(math.Ceil(r)))
	}
	for c, n := range l.InFlight {
		if c.Index() < 0 {
			return bad("unknown class %q in InFlight", string(c))
		}
		if n < 0 {
			return bad("InFlight[%s] %d is negative", c, n)
		}
		if n > 0 {
			if out.InFlight == nil {
				out.InFlight = make(map[OpClass]int, len(l.InFlight))
			}
			out.InFlight[c] = n
		}
	}
	if out.RequestsPerSecond == 0 && out.InFlight == nil && out.OpenBodies == 0 && out.MemoryBytes == 0 {
		return bad("every dimension is zero, so nothing would be bounded")
	}
	return out, nil
}

// shared is what the store keeps of l: the provider-scoped ceilings, shared
// by every host of a run. Memory is each host's own, so hosts with
// different MemoryBytes (different heaps) do not conflict.
func (l Limits) shared() Limits {
	l.MemoryBytes = 0
	return l
}

// Equal reports whether two normalized Limits are the same.
func (l Limits) Equal(m Limits) bool {
	if l.RequestsPerSecond != m.RequestsPerSecond || l.Burst != m.Burst ||
		l.OpenBodies != m.OpenBodies || l.MemoryBytes != m.MemoryBytes || len(l.InFlight) != len(m.InFlight) {
		return false
	}
	for c, n := range l.InFlight {
		if m.InFlight[c] != n {
			return false
		}
	}
	return true
}

// inFlightCaps returns the in-flight ceilings indexed like Classes.
func (l Limits) inFlightCaps() [NumClasses]int {
	var caps [NumClasses]int
	for c, n := range l.InFlight {
		caps[c.Index()] = n
	}
	return caps
}

// Request describes one provider request a consumer wants to start.
type Request struct {
	// Domains are every quota the request draws on; it is admitted only when
	// all of them can admit it, at once. Duplicates count once.
	Domains []Domain
	// Class is the kind of request.
	Class OpClass
	// MemoryBytes is the buffer reserved until ReleaseMemory, charged once
	// against this host's ceiling however many domains the request names.
	MemoryBytes int64
	// OpensBody says the request will hold a response body open until
	// CloseBody.
	OpensBody bool
	// Consumer names the caller (a lane, a pool) for diagnostics only.
	// Admission ignores it: fairness is by arrival, so lane count never buys
	// a larger share.
	Consumer string
}

// Normalize validates r and returns a copy whose Domains are sorted and free
// of duplicates, which is the form every Store receives. It never keeps the
// caller's slice.
func (r Request) Normalize() (Request, error) { return r.normalize(false) }

// normalize is Normalize; with share set, it keeps the caller's slice when
// that is already in normal form (one domain, or sorted without
// duplicates), saving an allocation on every Acquire. Stores never keep
// a request's Domains past a call, so sharing is safe there.
func (r Request) normalize(share bool) (Request, error) {
	if len(r.Domains) == 0 {
		return Request{}, fmt.Errorf("%w: no domains", ErrInvalidRequest)
	}
	if r.Class.Index() < 0 {
		return Request{}, fmt.Errorf("%w: unknown class %q", ErrInvalidRequest, string(r.Class))
	}
	if r.MemoryBytes < 0 {
		return Request{}, fmt.Errorf("%w: negative MemoryBytes %d", ErrInvalidRequest, r.MemoryBytes)
	}
	for _, d := range r.Domains {
		if err := d.Validate(); err != nil {
			return Request{}, err
		}
	}
	out := r
	if share && slices.IsSortedFunc(r.Domains, func(a, b Domain) int {
		if c := a.compare(b); c != 0 {
			return c
		}
		return -1 // equal neighbours: a duplicate, so not in normal form
	}) {
		out.Domains = r.Domains[:len(r.Domains):len(r.Domains)]
		return out, nil
	}
	if len(r.Domains) == 1 {
		out.Domains = []Domain{r.Domains[0]}
		return out, nil
	}
	ds := slices.Clone(r.Domains)
	slices.SortFunc(ds, Domain.compare)
	out.Domains = slices.CompactFunc(ds, func(a, b Domain) bool { return a == b })
	return out, nil
}

// Parts is what a grant of r holds: always the request slot, the body slot
// when it opens a body, and memory when it reserves any.
func (r Request) Parts() lease.Parts {
	p := lease.Request
	if r.OpensBody {
		p |= lease.Body
	}
	if r.MemoryBytes > 0 {
		p |= lease.Memory
	}
	return p
}

// DomainUsage is a point-in-time view of one domain.
type DomainUsage struct {
	Domain     Domain
	InFlight   map[OpClass]int // classes with requests in flight
	OpenBodies int
	// RateFactor is the share of the domain's rate in force after provider
	// throttling: 1 when unthrottled, lower while the budget backs off.
	RateFactor float64
	// Paused is how long new starts on the domain remain paused by a
	// provider's retry-after; zero when not paused.
	Paused time.Duration
	// Waiters counts requests queued on the domain.
	Waiters int
}

// Usage is a point-in-time view of a whole budget: progress reporting, and
// evidence that adding consumers did not multiply provider load. Domains
// lists, sorted, every domain with something held, queued or throttled.
type Usage struct {
	Domains    []DomainUsage
	MemoryHeld int64
	Waiters    int
}
