package disagg

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/config"
)

// A work_aware router whose servers are all at max_num_active_requests holds a pick only until
// its context ends (the proxy bounds it by request_timeout_s), and a release wakes a waiter.
func TestCappedPickWaitsBoundedAndWakes(t *testing.T) {
	ups := []*upstream{{addr: "a:1", role: RoleContext}}
	pk, err := newPicker(config.DisaggRouter{Type: config.RouterWorkAware, MaxActiveRequests: 1}, ups, newMetrics(), nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err := pk.pick(context.Background(), &routeInfo{id: "1", promptTokens: 100}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := pk.pick(ctx, &routeInfo{id: "2", promptTokens: 100}, nil); err == nil || !strings.Contains(err.Error(), "max_num_active_requests") {
		t.Fatalf("a pick past its deadline: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the pick waited %s", d)
	}
	got := make(chan error, 1)
	go func() {
		r, err := pk.pick(context.Background(), &routeInfo{id: "3", promptTokens: 100}, nil)
		if err == nil {
			r.done()
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	first.done()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a release did not wake the waiting pick")
	}
	if n := ups[0].inFlight.Load(); n != 0 {
		t.Fatalf("%d reservations left", n)
	}
}
