package mooncake

import (
	"errors"
	"testing"
	"time"
)

// TestSegmentHealthStates walks the health state machine on a fixed clock: concurrent
// failures count once, no probe before the backoff, a failed probe doubles the wait, an answer
// or a transfer makes the segment healthy, and a segment the master dropped is forgotten.
func TestSegmentHealthStates(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newSegmentHealth(100*time.Millisecond, 400*time.Millisecond)
	h.now = func() time.Time { return now }
	if h.unhealthy("a") || h.any() {
		t.Fatal("a fresh state marks a segment unhealthy")
	}
	for range 32 {
		h.fail("a")
	}
	if !h.unhealthy("a") || h.unhealthy("b") {
		t.Fatal("a failed transfer did not mark only its segment")
	}
	if st := h.stats(); st.Unhealthy != 1 || st.ToUnhealthy != 1 {
		t.Fatalf("after 32 failures together: %+v, want one unhealthy, one transition", st)
	}
	if d := h.due(); len(d) != 0 {
		t.Fatalf("probe due before the backoff: %v", d)
	}
	now = now.Add(100 * time.Millisecond) // the first wait is at most Min
	if d := h.due(); len(d) != 1 || d[0] != "a" {
		t.Fatalf("probe due after the backoff: %v, want [a]", d)
	}
	if d := h.due(); len(d) != 0 {
		t.Fatalf("a segment being probed is due again: %v", d)
	}
	h.probed("a", errors.New("connection refused"), true)
	if !h.unhealthy("a") {
		t.Fatal("a failed probe made the segment healthy")
	}
	now = now.Add(99 * time.Millisecond) // the second wait is in [100, 200] ms
	if d := h.due(); len(d) != 0 {
		t.Fatalf("probe due before the doubled backoff: %v", d)
	}
	now = now.Add(101 * time.Millisecond)
	if d := h.due(); len(d) != 1 {
		t.Fatalf("probe not due after the doubled backoff: %v", d)
	}
	h.probed("a", nil, true)
	if h.unhealthy("a") || h.stats().ToHealthy != 1 {
		t.Fatalf("an answering probe: unhealthy %t, %+v", h.unhealthy("a"), h.stats())
	}

	h.fail("b")
	h.ok("b")
	if h.unhealthy("b") || h.stats().ToHealthy != 2 {
		t.Fatalf("a successful transfer did not make b healthy: %+v", h.stats())
	}
	h.fail("c")
	now = now.Add(time.Second)
	_ = h.due()
	h.probed("c", nil, false)
	if st := h.stats(); h.unhealthy("c") || st.Forgotten != 1 || st.Unhealthy != 0 || st.Probes != 3 {
		t.Fatalf("a segment the master dropped: %+v", st)
	}
}
