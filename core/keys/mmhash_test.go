package keys

import (
	"strings"
	"testing"
)

// TestParseMultimodalAllDigits checks that 64 hex characters are read as hex even when every
// one is a decimal digit, and that one decimal chunk is still refused.
func TestParseMultimodalAllDigits(t *testing.T) {
	for _, s := range []string{strings.Repeat("0", 64), strings.Repeat("1234567890", 6) + "1234"} {
		d, err := ParseMultimodal(s)
		if err != nil {
			t.Errorf("%s: %v", s, err)
			continue
		}
		if got := hexString(d[:]); got != s {
			t.Errorf("%s read as %s", s, got)
		}
	}
	if _, err := ParseMultimodal("12345"); err == nil || !strings.Contains(err.Error(), "1 chunk") {
		t.Errorf("one decimal chunk: %v", err)
	}
	if _, err := ParseMultimodal(strings.Repeat("0", 63) + "g"); err == nil {
		t.Error("a non-hex character among 64 was accepted")
	}
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}
