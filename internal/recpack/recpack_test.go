package recpack

import (
	"encoding/binary"
	"testing"
)

// bin builds a binary record: the version byte, then each part (a byte,
// an int64 word, or a string after its 32-bit length).
func bin(parts ...any) string {
	b := []byte{Version}
	for _, p := range parts {
		switch p := p.(type) {
		case byte:
			b = append(b, p)
		case int64:
			b = binary.BigEndian.AppendUint64(b, uint64(p))
		case string:
			b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
			b = append(b, p...)
		}
	}
	return string(b)
}

func TestLeaseBothForms(t *testing.T) {
	want := Lease{Request: true, Body: false, Class: 2, Granted: 1_900_000_000_123_456, Session: "s.1",
		Domains: "1.61,1.62", Consumer: "copy job 7"}
	for name, v := range map[string]string{
		"binary": bin(byte(1), byte(0), byte(2), int64(1_900_000_000_123_456), "s.1", "1.61,1.62", "copy job 7"),
		"text":   "10 2 1900000000123456 s.1 1.61,1.62 copy job 7",
	} {
		got, err := DecodeLease(v)
		if err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, want)
		}
	}
	if got := want.Text(); got != "10 2 1900000000123456 s.1 1.61,1.62 copy job 7" {
		t.Errorf("Text() = %q", got)
	}
}

func TestWaiterBothForms(t *testing.T) {
	want := Waiter{Ticket: 12, Class: 0, Body: true, Arrived: 1_900_000_000_123_456, TTL: 30_000_000,
		Channel: "ch.1", Session: "s.1", Domains: "1.61", Consumer: ""}
	for name, v := range map[string]string{
		"binary": bin(int64(12), byte(0), byte(1), int64(1_900_000_000_123_456), int64(30_000_000), "ch.1", "s.1", "1.61", ""),
		"text":   "12 0 1 1900000000123456 30000000 ch.1 s.1 1.61 ",
	} {
		got, err := DecodeWaiter(v)
		if err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, want)
		}
	}
	if got, err := DecodeWaiter(want.Text()); err != nil || got != want {
		t.Errorf("Text() does not read back: %+v, %v", got, err)
	}
}

func TestMalformedRecords(t *testing.T) {
	full := bin(byte(1), byte(1), byte(0), int64(5), "s", "d", "c")
	for name, v := range map[string]string{
		"empty":          "",
		"cut short":      full[:len(full)-1],
		"trailing bytes": full + "x",
		"flag not 0/1":   bin(byte(2), byte(1), byte(0), int64(5), "s", "d", "c"),
		// The consumer's length says 9 bytes; 1 follows.
		"string too long": bin(byte(1), byte(1), byte(0), int64(5), "s", "d") + "\x00\x00\x00\x09c",
		"text, bad parts": "21 0 5 s d c",
		"text, short":     "10 0 5 s",
	} {
		if l, err := DecodeLease(v); err == nil {
			t.Errorf("lease %s: %+v, want an error", name, l)
		}
	}
	if w, err := DecodeWaiter("12 0 2 1 1 ch s d c"); err == nil {
		t.Errorf("waiter with body flag 2: %+v, want an error", w)
	}
}
