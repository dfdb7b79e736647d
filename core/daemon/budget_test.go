package daemon

import "testing"

// TestTrackedBudget: the budget comes from the flag when given, else from a quarter of the
// available memory at 16 bytes a token, never below the minimum; a connection gets half and a
// uid three quarters; a negative budget is refused.
func TestTrackedBudget(t *testing.T) {
	known := func(n uint64) func() (uint64, bool) { return func() (uint64, bool) { return n, true } }
	unknown := func() (uint64, bool) { return 0, false }
	cases := []struct {
		name                   string
		flag                   int64
		avail                  func() (uint64, bool)
		total, perConn, perUID int64
	}{
		{"flag", 1000, known(1 << 40), 1000, 500, 750},
		{"16 GiB available", 0, known(16 << 30), 1 << 28, 1 << 27, 3 << 26},
		{"tiny host", 0, known(1 << 20), minTrackedTokens, minTrackedTokens / 2, minTrackedTokens * 3 / 4},
		{"unknown memory", 0, unknown, minTrackedTokens, minTrackedTokens / 2, minTrackedTokens * 3 / 4},
	}
	for _, c := range cases {
		b, err := newTrackedBudget(c.flag, c.avail)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if b.total != c.total || b.perConn != c.perConn || b.perUID != c.perUID {
			t.Errorf("%s: budget %d, connection %d, uid %d; want %d, %d, %d", c.name, b.total, b.perConn, b.perUID, c.total, c.perConn, c.perUID)
		}
	}
	if _, err := newTrackedBudget(-1, unknown); err == nil {
		t.Error("a negative budget was accepted")
	}
}
