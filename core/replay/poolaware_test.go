package replay

import (
	"context"
	"testing"

	"github.com/kvctl/kvctl/core/router"
)

// The pool-aware router estimates only the prefill the pool does not hold: on a trace whose
// later turns repeat earlier prefixes, its summed estimate is below the work-aware one (prompt
// growth per conversation) and below the prompts.
func TestPoolAwareEstimatesUncachedPrefill(t *testing.T) {
	tr := readTrace(t, "testdata/conversation_head500.jsonl")
	estimated := map[string]int64{}
	var prompt int64
	for _, r := range tr.Requests {
		prompt += int64(r.InputLength)
	}
	for _, policy := range []string{router.PolicyWorkAware, router.PolicyPoolAware} {
		cfg := DefaultConfig()
		cfg.Ranks = 2
		cfg.Router = policy
		rep, err := Offline(context.Background(), tr, DefaultParams(), []Config{cfg})
		if err != nil {
			t.Fatal(err)
		}
		run := rep.Runs[0]
		if run.Router != policy {
			t.Fatalf("run reports router %q, want %q", run.Router, policy)
		}
		for _, l := range run.RankLoad {
			estimated[policy] += l.EstimatedTokens
		}
	}
	wa, pa := estimated[router.PolicyWorkAware], estimated[router.PolicyPoolAware]
	t.Logf("summed estimates: work-aware %d, pool-aware %d, prompts %d", wa, pa, prompt)
	if pa <= 0 || pa >= wa || pa > prompt {
		t.Fatalf("pool-aware estimated %d tokens, work-aware %d: the pool's hits did not lower the estimate", pa, wa)
	}
}
