package clitext

import "testing"

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "65536": 65536, "64KiB": 64 << 10, "64kib": 64 << 10, "64K": 64 << 10, "16MiB": 16 << 20,
		"1GiB": 1 << 30, "2TiB": 2 << 40, "1KB": 1000, "3MB": 3e6, "1GB": 1e9, "10B": 10, " 5 MiB ": 5 << 20,
	} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1.5MiB", "12XB", "9999999999TiB"} {
		if got, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", in, got)
		}
	}
	for _, n := range []int64{0, 1, 1023, 1 << 10, 1536, 512 << 10, 64 << 20, 3 << 30} {
		if back, err := ParseBytes(ExactBytes(n)); err != nil || back != n {
			t.Errorf("ExactBytes(%d) = %s, parses back to %d, %v", n, ExactBytes(n), back, err)
		}
	}
}
