package daemon

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/sysmem"
)

// The daemon-wide budget for tracked request state. Each scheduler rank is bounded by
// Limits.MaxTrackedTokens, but 1,024 ranks may register, so without a budget over all of them
// one engine connection with a few ranks and never-finished long lookups could take all of the
// host's memory. The budget counts the tokens every scheduler rank tracks (a request's chain
// of block hashes and its offers grow with its tokens); a Lookup of a request not yet tracked
// that would take the total past the budget, its connection past its share or its uid past its
// share is refused with ResourceExhausted. Requests already tracked keep working.
const (
	// trackedBytesPerToken is what the daemon holds for one tracked token: the token itself
	// (8 bytes) and its part of the request's hash chain and offers, measured at about 12
	// bytes (issue 40: 402 M tokens took RSS to 4.9 GB), with headroom.
	trackedBytesPerToken = 16
	// trackedMemoryFraction is the part of the memory available at start that tracked state
	// may take by default.
	trackedMemoryFraction = 4
	// minTrackedTokens is the smallest derived budget: enough for a few long prompts when
	// available memory is unknown or tiny.
	minTrackedTokens = 1 << 23
	// The shares of one connection and of one uid, in halves and quarters of the budget.
	connShareNum, connShareDen = 1, 2
	uidShareNum, uidShareDen   = 3, 4
)

// trackedBudget is the resolved budget and shares, in tokens.
type trackedBudget struct {
	total, perConn, perUID int64
	derived                string // how the total was chosen, for the start-up log
}

// newTrackedBudget resolves the configured budget; 0 derives it from available memory.
func newTrackedBudget(tokens int64, avail func() (uint64, bool)) (trackedBudget, error) {
	b := trackedBudget{total: tokens, derived: "--max-tracked-tokens"}
	if tokens < 0 {
		return b, fmt.Errorf("max tracked tokens %d is negative", tokens)
	}
	if tokens == 0 {
		b.total, b.derived = minTrackedTokens, "the minimum (available memory unknown)"
		if a, ok := avail(); ok {
			b.total = max(int64(min(a, 1<<60)/trackedMemoryFraction/trackedBytesPerToken), minTrackedTokens)
			b.derived = fmt.Sprintf("a quarter of the %d MiB available at start", a>>20)
		}
	}
	b.perConn = max(b.total*connShareNum/connShareDen, 1)
	b.perUID = max(b.total*uidShareNum/uidShareDen, 1)
	return b, nil
}

// checkBudget refuses a lookup of a request e's scheduler does not track yet when its tokens
// would take the daemon, e's connection or e's uid past their part of the budget.
func (d *Daemon) checkBudget(call string, e *engine, id string, tokens int) error {
	b := d.sec.budget
	if e.scheduler == nil || b.total == 0 || e.scheduler.Tracks(id) {
		return nil
	}
	var total, conn, uid int64
	d.mu.RLock()
	for _, o := range d.engines {
		if o.scheduler == nil {
			continue
		}
		_, n := o.scheduler.Tracked()
		total += int64(n)
		if o.conn == e.conn {
			conn += int64(n)
		}
		if o.deploy.uid == e.deploy.uid {
			uid += int64(n)
		}
	}
	d.mu.RUnlock()
	t := int64(tokens)
	switch {
	case total+t > b.total:
		return status.Errorf(codes.ResourceExhausted, "%s: the daemon tracks %d tokens of unfinished requests; %d more would pass its budget of %d (--max-tracked-tokens); requests already looked up keep working", call, total, t, b.total)
	case conn+t > b.perConn:
		return status.Errorf(codes.ResourceExhausted, "%s: engine %q's connection tracks %d tokens of unfinished requests; %d more would pass its share of %d (half of --max-tracked-tokens); finish or reset some first", call, e.name, conn, t, b.perConn)
	case uid+t > b.perUID:
		return status.Errorf(codes.ResourceExhausted, "%s: the engines of uid %d track %d tokens of unfinished requests; %d more would pass the uid's share of %d (three quarters of --max-tracked-tokens); finish or reset some first", call, e.deploy.uid, uid, t, b.perUID)
	}
	return nil
}

// systemAvailable is the memory the budget is derived from.
var systemAvailable = sysmem.Available
