package recpack

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// Entry is one entry of a domain's queue, q:<enc> (luascripts/lib.lua,
// Queues): a waiter's whole record, at Offset bytes into the string.
type Entry struct {
	Offset   int
	Dead     bool // marked: cancelled, or its session reclaimed
	Class    int
	Body     bool
	TTL      int64 // us
	Arrived  int64 // us, on the group's clock
	ID       string
	Session  string
	Channel  string
	Domains  string // joined by commas; empty for a request on this domain alone
	Consumer string
}

// DecodeQueue reads every entry of queue string q, from its start: binary
// where the server's Lua has the struct library, else text.
func DecodeQueue(q string) ([]Entry, error) {
	var out []Entry
	for off := 0; off < len(q); {
		e, n, err := decodeEntry(q[off:])
		if err != nil {
			return out, fmt.Errorf("recpack: queue entry at %d: %w", off, err)
		}
		e.Offset = off
		out = append(out, e)
		off += n
	}
	return out, nil
}

func decodeEntry(s string) (Entry, int, error) {
	var e Entry
	if len(s) >= 8 && s[0] >= '0' && s[0] <= '9' {
		n, err := strconv.Atoi(s[:8])
		if err != nil || n < 10 || n > len(s) || s[8] != 'T' {
			return e, 0, fmt.Errorf("not a text entry")
		}
		t := s[:n]
		e.Dead = t[9] == '1'
		f := strings.SplitN(t[11:], " ", 5)
		if len(f) != 5 {
			return e, 0, fmt.Errorf("text entry ends early")
		}
		var b int
		var errs [4]error
		e.Class, errs[0] = strconv.Atoi(f[0])
		b, errs[1] = strconv.Atoi(f[1])
		e.TTL, errs[2] = strconv.ParseInt(f[2], 10, 64)
		e.Arrived, errs[3] = strconv.ParseInt(f[3], 10, 64)
		for _, err := range errs {
			if err != nil {
				return e, 0, err
			}
		}
		e.Body = b == 1
		rest := f[4]
		var strs [5]string
		for i := range strs {
			c := strings.IndexByte(rest, ':')
			if c < 0 {
				return e, 0, fmt.Errorf("text entry: string %d has no length", i)
			}
			m, err := strconv.Atoi(rest[:c])
			if err != nil || c+1+m > len(rest) {
				return e, 0, fmt.Errorf("text entry: string %d runs past its end", i)
			}
			strs[i], rest = rest[c+1:c+1+m], rest[c+1+m:]
		}
		e.ID, e.Session, e.Channel, e.Domains, e.Consumer = strs[0], strs[1], strs[2], strs[3], strs[4]
		return e, n, nil
	}
	if len(s) < 4 {
		return e, 0, fmt.Errorf("entry ends early")
	}
	n := int(binary.BigEndian.Uint32([]byte(s[:4])))
	if n < 44 || n > len(s) {
		return e, 0, fmt.Errorf("entry length %d out of range", n)
	}
	r := &reader{b: []byte(s[4:n])}
	if v := r.byte(); v != 1 {
		return e, 0, fmt.Errorf("entry version %d", v)
	}
	e.Dead = r.byte() != 0
	e.Class = r.byte()
	e.Body = r.byte() == 1
	e.TTL, e.Arrived = r.word(), r.word()
	e.ID, e.Session, e.Channel, e.Domains, e.Consumer = r.str(), r.str(), r.str(), r.str(), r.str()
	if err := r.done(); err != nil {
		return e, 0, err
	}
	return e, n, nil
}

// Marker is a queued waiter's field in its session's hash: where its
// entries are (the queue's base plus the offset, one per domain) and its
// domains, joined by commas.
type Marker struct {
	Places  []int64
	Domains string
}

// DecodeMarker reads a marker, "W<places> <domains>"; ok is false for a
// value that is none (a lease record).
func DecodeMarker(v string) (m Marker, ok bool) {
	rest, found := strings.CutPrefix(v, "W")
	if !found {
		return m, false
	}
	ps, ds, found := strings.Cut(rest, " ")
	if !found || ds == "" {
		return m, false
	}
	for p := range strings.SplitSeq(ps, ",") {
		x, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return m, false
		}
		m.Places = append(m.Places, x)
	}
	m.Domains = ds
	return m, true
}
