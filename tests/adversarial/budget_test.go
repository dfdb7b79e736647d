package adversarial

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// TestTrackedStateBudget: one engine connection with three scheduler ranks that never finish
// their 2M-token lookups is stopped at its connection's share of the daemon-wide budget
// (ResourceExhausted naming the budget) instead of taking the host's memory; an engine on
// another connection still looks up within the budget, and the attacker's requests already
// tracked keep working (looked up again and finished).
func TestTrackedStateBudget(t *testing.T) {
	const budget = 12 << 20 // tokens: a connection may hold 6M, a uid 9M
	p := startServe(t, serveOpts{args: []string{"--max-tracked-tokens", fmt.Sprint(budget)}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dial := func() *engineapi.Client {
		c, err := engineapi.Dial(p.socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	prompt := make([]int64, 1<<21)
	for i := range prompt {
		prompt[i] = int64(i % 50000)
	}
	lookup := func(c *engineapi.Client, engine, id string) error {
		_, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: engine, Request: &enginepb.Request{Id: id, TokensPacked: engineapi.PackTokens(nil, prompt)}})
		return err
	}
	attacker := dial()
	for i := range 3 {
		registerShm(t, ctx, attacker, fmt.Sprintf("a%d", i), "m", "", 8)
	}
	rss0, _, _ := procStats(p.cmd.Process.Pid)
	held, refused := 0, 0
	var firstRefusal error
	for i := range 12 {
		err := lookup(attacker, fmt.Sprintf("a%d", i%3), fmt.Sprintf("r%d", i))
		switch {
		case err == nil:
			held++
		case status.Code(err) == codes.ResourceExhausted:
			refused++
			if firstRefusal == nil {
				firstRefusal = err
			}
		default:
			t.Fatalf("lookup %d: %v", i, err)
		}
	}
	if held != 3 || refused != 9 || !strings.Contains(fmt.Sprint(firstRefusal), "share") {
		t.Errorf("one connection held %d never-finished 2M-token lookups and was refused %d times (%v), want 3 held (its share of %d) and the rest refused", held, refused, firstRefusal, budget/2)
	}
	rss1, _, _ := procStats(p.cmd.Process.Pid)
	t.Logf("daemon RSS %d MiB -> %d MiB with %d requests held", rss0>>10, rss1>>10, held)

	// Another connection still gets its lookups within the budget.
	victim := dial()
	registerShm(t, ctx, victim, "v", "m", "", 8)
	if err := lookup(victim, "v", "v1"); err != nil {
		t.Errorf("another connection's lookup within the budget: %v", err)
	}
	// The attacker's tracked requests keep working: looked up again, then finished, which
	// frees their share for new ones.
	if err := lookup(attacker, "a0", "r0"); err != nil {
		t.Errorf("a request already tracked, looked up again: %v", err)
	}
	if _, err := attacker.RequestFinished(ctx, &enginepb.RequestRef{Engine: "a0", RequestId: "r0"}); err != nil {
		t.Errorf("finishing a tracked request: %v", err)
	}
	if err := lookup(attacker, "a0", "r-new"); err != nil {
		t.Errorf("a new lookup after a request finished: %v", err)
	}
	p.healthy(t)
}
