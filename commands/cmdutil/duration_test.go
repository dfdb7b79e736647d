package cmdutil

import (
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"5": 5 * time.Second, "0.25": 250 * time.Millisecond, "30s": 30 * time.Second, "1m30s": 90 * time.Second, " 2 ": 2 * time.Second, "0": 0} {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "5x", "NaN", "Inf", "1e300", "s"} {
		if _, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) accepted", in)
		}
	}
}

func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"5", "1.5", "30s", "-1h", "1e9", "0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			return
		}
		var v time.Duration
		if err := (durationValue{&v}).Set(s); err != nil || v != d {
			t.Errorf("flag value %v %v, parse %v", v, err, d)
		}
	})
}
