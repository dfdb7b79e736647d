package mooncake

import (
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/masterrpc"
)

// TestKeptListAnswers: a kept list answers a lookup only inside its fresh part, with no master
// connection lost since it was kept and its host not found unhealthy.
func TestKeptListAnswers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s locatedSet
	rep := masterrpc.Replica{Endpoint: "host-a"}
	s.put(t0, "k", located{rep: rep, fresh: t0.Add(time.Second), use: t0.Add(2 * time.Second), gen: 3})
	healthy := func(string) bool { return false }
	for _, c := range []struct {
		name      string
		now       time.Duration
		gen       uint64
		key       string
		unhealthy func(string) bool
		want      bool
	}{
		{"inside", 999 * time.Millisecond, 3, "k", healthy, true},
		{"at fresh", time.Second, 3, "k", healthy, false},
		{"usable by a get but not fresh", 1500 * time.Millisecond, 3, "k", healthy, false},
		{"a lost master connection", 0, 4, "k", healthy, false},
		{"an unhealthy host", 0, 3, "k", func(seg string) bool { return seg == "host-a" }, false},
		{"another key", 0, 3, "j", healthy, false},
	} {
		if got := s.answers(t0.Add(c.now), c.gen, c.key, c.unhealthy); got != c.want {
			t.Errorf("%s: answers %t, want %t", c.name, got, c.want)
		}
	}
}
