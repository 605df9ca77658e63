// Package recpack reads a budget's lease and waiter records (a field of
// its session's hash lx:<ce>:<sid>, and the value of w:<id>) as the
// scripts write them (luascripts/lib.lua), for tests and tools that look
// at Redis directly instead of through a script. Each record has two forms: binary, where the
// server's Lua has the struct library (every Redis), and text, where it
// has not (miniredis), which builds before the binary form also wrote.
package recpack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Version is the first byte of a binary record. A text record starts with
// a digit.
const Version = 1

// LeaseKey is the key of session sid's leases in the group whose keys
// start with prefix ("rb:{<hex>}:"), where ce is the config's field of that
// name ("" reads as 0, as the scripts read a config without it):
// luascripts/lib.lua, lxkey.
func LeaseKey(prefix, ce, sid string) string {
	if ce == "" {
		ce = "0"
	}
	return prefix + "lx:" + ce + ":" + sid
}

// Lease is a lease record.
type Lease struct {
	Request, Body bool   // the parts still held
	Class         int    // the class index
	Granted       int64  // the grant's time, us, on the group's clock
	Session       string // the session it belongs to
	Domains       string // its domain encodings, joined by commas
	Consumer      string
}

// Waiter is a waiter record.
type Waiter struct {
	Ticket   int64
	Class    int
	Body     bool
	Arrived  int64 // us, on the group's clock
	TTL      int64 // its lease's and its liveness's, us
	Channel  string
	Session  string
	Domains  string // joined by commas
	Consumer string
}

// Binary reports whether v is a record in the binary form.
func Binary(v string) bool { return len(v) > 0 && v[0] == Version }

// reader takes a binary record apart, front to back.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.err = errors.New("record ends early")
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) byte() int {
	if b := r.take(1); b != nil {
		return int(b[0])
	}
	return 0
}

func (r *reader) word() int64 {
	if b := r.take(8); b != nil {
		return int64(binary.BigEndian.Uint64(b))
	}
	return 0
}

func (r *reader) str() string {
	b := r.take(4)
	if b == nil {
		return ""
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(r.b)) {
		r.err = errors.New("a string runs past the record's end")
		return ""
	}
	return string(r.take(int(n)))
}

func (r *reader) done() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%d bytes after the last field", len(r.b))
	}
	return r.err
}

func flag(n int) (bool, error) {
	if n != 0 && n != 1 {
		return false, fmt.Errorf("flag %d", n)
	}
	return n == 1, nil
}

// DecodeLease reads a lease record in either form.
func DecodeLease(v string) (Lease, error) {
	var l Lease
	if Binary(v) {
		r := &reader{b: []byte(v[1:])}
		hr, hb := r.byte(), r.byte()
		l.Class = r.byte()
		l.Granted = r.word()
		l.Session, l.Domains, l.Consumer = r.str(), r.str(), r.str()
		if err := r.done(); err != nil {
			return Lease{}, fmt.Errorf("recpack: lease %q: %w", v, err)
		}
		var err1, err2 error
		l.Request, err1 = flag(hr)
		l.Body, err2 = flag(hb)
		if err := errors.Join(err1, err2); err != nil {
			return Lease{}, fmt.Errorf("recpack: lease %q: %w", v, err)
		}
		return l, nil
	}
	// "<hr><hb> <class> <granted> <sid> <encs> <consumer>"
	f := strings.SplitN(v, " ", 6)
	if len(f) != 6 || len(f[0]) != 2 || strings.Trim(f[0], "01") != "" {
		return Lease{}, fmt.Errorf("recpack: lease %q: not a lease record", v)
	}
	c, err1 := strconv.Atoi(f[1])
	g, err2 := strconv.ParseInt(f[2], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return Lease{}, fmt.Errorf("recpack: lease %q: %w", v, err)
	}
	return Lease{Request: f[0][0] == '1', Body: f[0][1] == '1', Class: c, Granted: g,
		Session: f[3], Domains: f[4], Consumer: f[5]}, nil
}

// DecodeWaiter reads a waiter record in either form.
func DecodeWaiter(v string) (Waiter, error) {
	var w Waiter
	if Binary(v) {
		r := &reader{b: []byte(v[1:])}
		w.Ticket = r.word()
		w.Class = r.byte()
		b := r.byte()
		w.Arrived, w.TTL = r.word(), r.word()
		w.Channel, w.Session, w.Domains, w.Consumer = r.str(), r.str(), r.str(), r.str()
		err := r.done()
		if err == nil {
			w.Body, err = flag(b)
		}
		if err != nil {
			return Waiter{}, fmt.Errorf("recpack: waiter %q: %w", v, err)
		}
		return w, nil
	}
	// "<ticket> <class> <body> <arrived> <ttl> <ch> <sid> <encs> <consumer>"
	f := strings.SplitN(v, " ", 9)
	if len(f) != 9 {
		return Waiter{}, fmt.Errorf("recpack: waiter %q: not a waiter record", v)
	}
	var errs [5]error
	w.Ticket, errs[0] = strconv.ParseInt(f[0], 10, 64)
	w.Class, errs[1] = strconv.Atoi(f[1])
	var b int
	b, errs[2] = strconv.Atoi(f[2])
	w.Arrived, errs[3] = strconv.ParseInt(f[3], 10, 64)
	w.TTL, errs[4] = strconv.ParseInt(f[4], 10, 64)
	err := errors.Join(errs[:]...)
	if err == nil {
		w.Body, err = flag(b)
	}
	if err != nil {
		return Waiter{}, fmt.Errorf("recpack: waiter %q: %w", v, err)
	}
	w.Channel, w.Session, w.Domains, w.Consumer = f[5], f[6], f[7], f[8]
	return w, nil
}

// bit is a flag as the text forms write it.
func bit(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Text returns w in the text form.
func (w Waiter) Text() string {
	return fmt.Sprintf("%d %d %d %d %d %s %s %s %s", w.Ticket, w.Class, bit(w.Body), w.Arrived, w.TTL,
		w.Channel, w.Session, w.Domains, w.Consumer)
}

// Text returns l in the text form.
func (l Lease) Text() string {
	return fmt.Sprintf("%d%d %d %d %s %s %s", bit(l.Request), bit(l.Body), l.Class, l.Granted, l.Session, l.Domains, l.Consumer)
}
