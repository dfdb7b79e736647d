package backoff

import (
	"testing"
	"time"
)

// TestNext pins the schedule: steps double from Min to Max, every wait lies in the upper half
// of its step, two hosts with different draws wait different times, and Reset starts over.
func TestNext(t *testing.T) {
	for _, r := range []float64{0, 0.5, 0.999} {
		b := Backoff{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond, Rand: func() float64 { return r }}
		want := []time.Duration{10, 20, 40, 80, 80}
		for i, step := range want {
			step *= time.Millisecond
			got := b.Next()
			if b.Step() != step || got < step/2 || got > step {
				t.Fatalf("rand %v, attempt %d: wait %v step %v, want step %v and a wait in [%v, %v]", r, i, got, b.Step(), step, step/2, step)
			}
		}
		b.Reset()
		if b.Next(); b.Step() != 10*time.Millisecond {
			t.Errorf("after Reset the step is %v, want Min", b.Step())
		}
	}
	a := Backoff{Min: time.Second, Max: time.Minute, Rand: func() float64 { return 0.1 }}
	c := Backoff{Min: time.Second, Max: time.Minute, Rand: func() float64 { return 0.9 }}
	if a.Next() == c.Next() {
		t.Error("two draws gave the same wait: no jitter")
	}
}
