package mooncake_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// The differential test runs random operation sequences against the real mooncake_master and
// against the embedded pool, and after every step compares the codes each returned and which
// keys exist. Time runs for real on the master, so the embedded pool is driven by a manual clock
// that replays the same history: operations are a few microseconds apart, and a wait step moves
// it by diffWait, which the test also sleeps. The sequence is built so that every lease and
// soft-pin deadline falls on the same side of every step on both:
//
//   - a lease (diffLease) runs out during the wait that follows the step granting it: between
//     two waits at most diffLease/4 of real time passes (the test inserts a wait when it would),
//     and a wait is longer than a lease;
//   - a request-level soft pin (diffSoftTTL = 1.5 waits) runs out during the second wait after
//     its put; the default soft-pin TTL outlives every sequence;
//   - nothing happens on the master's eviction thread during a wait: before a wait the test
//     force-removes the newest objects until the pool is at or below the high watermark, and
//     puts that would not fit are not issued, so the allocation-failure flag never stays set;
//   - lookups and puts name one key each: the master stamps every key of a batch with its own
//     clock reading, in an order of its shards, where the embedded pool gives the batch one.
//
// The master's eviction thread runs every 10 ms on its own, so a round can fall between a put's
// PutStart and PutEnd (the new object then counts in the used bytes but not in the eviction
// base). Each put is therefore checked against every interleaving (no round before the end, one,
// two, or all of them) and the history keeps the one the master took.
//
// Where the master's choice depends on the order of its metadata shards (pass 1 making up a
// shortfall, package doc), no interleaving predicts it: the test checks that the master evicted
// the whole frontier the embedded pool evicted, took at least as many objects, created nothing,
// and then ends the sequence there.

var (
	diffSequences = flag.Int("diff.sequences", 0, "differential test: number of random sequences (0: "+strconv.Itoa(diffCISequences)+", or KVCTL_DIFF_SEQUENCES)")
	diffSteps     = flag.Int("diff.steps", 40, "differential test: operations per sequence")
	diffShrink    = flag.Bool("diff.shrink", false, "differential test: shrink a diverging sequence (reruns it once per step removed)")
	diffSeed      = flag.Uint64("diff.seed", 0, "differential test: first sequence seed (0: 1)")
)

// The lease and the waits derived from it; TestPoolDifferentialCases lengthens the lease for
// scripts that must not reach a wait.
var (
	diffLease   = 600 * time.Millisecond
	diffWait    = diffLease + 150*time.Millisecond
	diffSoftTTL = diffWait * 3 / 2
)

const (
	diffCISequences = 2
	diffOpTick      = 10 * time.Microsecond
	diffSlot        = 64 << 10 // every object is one slot
	diffSlots       = 16
	diffHW          = 0.75
	diffRatio       = 0.1
)

// diffOp is one step of a sequence.
type diffOp struct {
	Kind  string // put, get, exist, remove, wait
	Key   string
	Soft  int // put: 0 no pin, 1 soft pin with the default TTL, 2 soft pin for diffSoftTTL
	Hard  bool
	Group string
	Force bool
	// Early is, for a put, how many eviction rounds ran between its start and its end on the
	// master (-1: all that the trigger asked for). The test finds it by matching the master.
	Early int
}

func (o diffOp) String() string {
	switch o.Kind {
	case "put":
		var b strings.Builder
		fmt.Fprintf(&b, "put %s", o.Key)
		switch o.Soft {
		case 1:
			b.WriteString(" soft")
		case 2:
			b.WriteString(" soft-ttl")
		}
		if o.Hard {
			b.WriteString(" hard")
		}
		if o.Group != "" {
			b.WriteString(" group=" + o.Group)
		}
		if o.Early != 0 {
			fmt.Fprintf(&b, " early=%d", o.Early)
		}
		return b.String()
	case "remove":
		if o.Force {
			return "remove " + o.Key + " force"
		}
		return "remove " + o.Key
	case "wait":
		return "wait"
	}
	return o.Kind + " " + o.Key
}

func (o diffOp) config() pool.ReplicateConfig {
	var c pool.ReplicateConfig
	switch o.Soft {
	case 1:
		c.SoftPinAction = pool.SoftPinEnable
	case 2:
		c.SoftPinAction = pool.SoftPinEnable
		c.SoftPinTTL = diffSoftTTL
	}
	c.HardPin = o.Hard
	if o.Group != "" {
		c.GroupIDs = []string{o.Group}
	}
	return c
}

var diffPages sync.Map // key → its page

func diffPage(key string) []byte {
	if b, ok := diffPages.Load(key); ok {
		return b.([]byte)
	}
	b := interopPage(key, diffSlot)
	diffPages.Store(key, b)
	return b
}

// diffModel is the embedded pool a history leads to.
type diffModel struct {
	p     *embedded.Embedded
	clk   *embedded.ManualClock
	codes []int64 // the code (or, for a get, the size) of every step
	// refilled reports whether a round of the last step took objects to make up a shortfall
	// of pass 1, and frontier the keys its rounds took otherwise.
	refilled bool
	frontier []string
}

func diffOptions(clk embedded.Clock) embedded.Options {
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "diff", Capacity: diffSlot * diffSlots}}
	o.LeaseTTL = diffLease
	o.SoftPinTTL = time.Hour
	o.HighWatermark = diffHW
	o.EvictionRatio = diffRatio
	o.EvictionPeriod = 0
	o.Clock = clk
	return o
}

// diffReplay builds the embedded pool hist leads to, each step followed by eviction rounds until
// the trigger stops firing or a round takes nothing, as the master's thread does.
func diffReplay(t testing.TB, hist []diffOp) *diffModel {
	t.Helper()
	clk := embedded.NewManualClock(time.Unix(1_700_000_000, 0))
	p, err := embedded.NewEmbedded(diffOptions(clk))
	if err != nil {
		t.Fatal(err)
	}
	m := &diffModel{p: p, clk: clk}
	var last bool
	p.SetEvictionHook(func(r embedded.EvictionRound) {
		if !last {
			return
		}
		for _, e := range r.Evicted {
			if e.Refill {
				m.refilled = true
			} else {
				m.frontier = append(m.frontier, e.Key)
			}
		}
	})
	ctx := context.Background()
	for i, op := range hist {
		last = i == len(hist)-1
		clk.Advance(diffOpTick)
		var code int64
		switch op.Kind {
		case "put":
			if op.Early == 0 {
				code = int64(p.BatchPut(ctx, []string{op.Key}, [][]byte{diffPage(op.Key)}, op.config())[0])
				break
			}
			r := p.BatchPutStart(ctx, []string{op.Key}, []int64{diffSlot}, op.config())
			settle(p, op.Early)
			if r.Bufs[0] != nil {
				copy(r.Bufs[0], diffPage(op.Key))
			}
			code = int64(r.End()[0])
		case "get":
			code = p.BatchGet(ctx, []string{op.Key}, [][]byte{make([]byte, diffSlot)})[0]
		case "exist":
			code = int64(p.BatchIsExist(ctx, []string{op.Key})[0])
		case "remove":
			code = int64(p.Remove(ctx, op.Key, op.Force))
		case "wait":
			clk.Advance(diffWait)
		}
		settle(p, -1)
		m.codes = append(m.codes, code)
	}
	t.Cleanup(func() { _ = p.Close() })
	return m
}

// settle runs up to n eviction rounds (n < 0: until the trigger stops firing or a round takes
// nothing).
func settle(p *embedded.Embedded, n int) {
	for i := 0; n < 0 || i < n; i++ {
		r, ran := p.EvictNow()
		if !ran || len(r.Evicted) == 0 || i > 10_000 {
			return
		}
	}
}

var diffKeyNames = func() []string {
	ks := make([]string, 40)
	for i := range ks {
		ks[i] = fmt.Sprintf("d%02d", i)
	}
	return ks
}()

// diffGen draws the next operation for a pool in state m (whose keys are present).
func diffGen(r *rand.Rand, present []string, used int, sinceWait int) diffOp {
	if sinceWait > 30 || r.IntN(14) == 0 {
		return diffOp{Kind: "wait"}
	}
	pick := func() string {
		if len(present) > 0 && r.IntN(4) != 0 {
			return present[r.IntN(len(present))]
		}
		return diffKeyNames[r.IntN(len(diffKeyNames))]
	}
	switch n := r.IntN(20); {
	case n < 9:
		if used+1 > diffSlots {
			return diffOp{Kind: "remove", Key: pick(), Force: true}
		}
		op := diffOp{Kind: "put", Key: diffKeyNames[r.IntN(len(diffKeyNames))]}
		switch r.IntN(8) {
		case 0:
			op.Soft = 1
		case 1:
			op.Soft = 2
		}
		op.Hard = r.IntN(12) == 0
		if r.IntN(3) == 0 {
			op.Group = fmt.Sprintf("g%d", r.IntN(4))
		}
		return op
	case n < 13:
		return diffOp{Kind: "get", Key: pick()}
	case n < 16:
		return diffOp{Kind: "exist", Key: pick()}
	default:
		return diffOp{Kind: "remove", Key: pick(), Force: r.IntN(3) == 0}
	}
}

// diffMaster is one real master and a kvctl client that contributes the pool's only segment.
type diffMaster struct {
	m     *mooncaketest.Master
	n     *mooncake.Native
	admin *mooncake.AdminClient
}

func startDiffMaster(t *testing.T) *diffMaster {
	t.Helper()
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{
		LeaseTTL:      diffLease,
		SoftPinTTL:    time.Hour,
		HighWatermark: diffHW,
		EvictionRatio: diffRatio,
	})
	admin, err := mooncake.NewAdminClient(m.AdminURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &diffMaster{m: m, n: newNative(t, m, diffSlot*diffSlots), admin: admin}
}

func (d *diffMaster) apply(op diffOp) int64 {
	ctx := context.Background()
	switch op.Kind {
	case "put":
		return int64(d.n.BatchPut(ctx, []string{op.Key}, [][]byte{diffPage(op.Key)}, op.config())[0])
	case "get":
		return d.n.BatchGet(ctx, []string{op.Key}, [][]byte{make([]byte, diffSlot)})[0]
	case "exist":
		return int64(d.n.BatchIsExist(ctx, []string{op.Key})[0])
	case "remove":
		return int64(d.n.Remove(ctx, op.Key, op.Force))
	case "wait":
		time.Sleep(diffWait)
	}
	return 0
}

func (d *diffMaster) keys(t testing.TB) []string {
	t.Helper()
	ks, err := d.admin.AllKeys(context.Background())
	if err != nil {
		t.Fatalf("master /get_all_keys: %v", err)
	}
	sort.Strings(ks)
	return ks
}

// diffResult is how one sequence ended.
type diffResult struct {
	steps      int
	divergence string   // "" when the master and the embedded pool agreed at every step
	hist       []diffOp // the history up to the divergence
	shardOrder bool     // ended at a step the master decides by its shard order
	refills    int      // steps whose pass 1 made up a shortfall (matched or ended on)
}

// runDiffSequence runs steps operations drawn from seed (or, with script, those) against a
// fresh master and the embedded pool.
func runDiffSequence(t *testing.T, seed uint64, steps int, script []diffOp) diffResult {
	t.Helper()
	d := startDiffMaster(t)
	r := rand.New(rand.NewPCG(seed, 0x6d6f6f6e63616b65))
	var hist []diffOp
	var refills int
	segStart := time.Now()
	sinceWait := 0
	// Scripts hold no soft pin that runs out across a wait, so only the lease bounds them.
	guard := diffLease / 4
	if script != nil {
		guard = diffLease / 2
	}
	model := diffReplay(t, nil)
	for step := 0; step < steps; step++ {
		present := model.keysQuiet()
		var op diffOp
		if script != nil {
			if step >= len(script) {
				break
			}
			op = script[step]
		} else {
			op = diffGen(r, present, len(present), sinceWait)
		}
		// Keep every lease on the same side of every step on both pools.
		if op.Kind != "wait" && time.Since(segStart) > guard {
			op = diffOp{Kind: "wait"}
			step--
		}
		if op.Kind == "wait" {
			// Nothing may happen on the master's eviction thread while the test sleeps.
			for _, k := range model.newestFirst(hist) {
				if model.usedSlots() <= int(diffHW*diffSlots) {
					break
				}
				rm := diffOp{Kind: "remove", Key: k, Force: true}
				var res *diffResult
				if model, res = diffStep(t, d, &hist, &refills, model, rm); res != nil {
					return *res
				}
			}
		} else if op.Kind == "put" && script == nil && model.usedSlots()+1 > diffSlots {
			continue
		}
		var res *diffResult
		if model, res = diffStep(t, d, &hist, &refills, model, op); res != nil {
			return *res
		}
		if op.Kind == "wait" {
			segStart = time.Now()
			sinceWait = 0
		} else {
			sinceWait++
		}
	}
	return diffResult{steps: len(hist), hist: hist, refills: refills}
}

// diffStep applies op to the master, appends it (with the interleaving the master took) to
// hist, and compares. before is the model hist led to. It returns the model of the new history
// to go on, or how the sequence ended.
func diffStep(t *testing.T, d *diffMaster, hist *[]diffOp, refills *int, before *diffModel, op diffOp) (*diffModel, *diffResult) {
	t.Helper()
	got := d.apply(op)
	var cands []diffOp
	if op.Kind == "put" {
		for _, e := range []int{0, 1, 2, -1} {
			o := op
			o.Early = e
			cands = append(cands, o)
		}
	} else {
		cands = []diffOp{op}
	}
	type want struct {
		op   diffOp
		m    *diffModel
		keys []string
	}
	var wants []want
	for _, c := range cands {
		h := append(slices.Clone(*hist), c)
		m := diffReplay(t, h)
		w := want{op: c, m: m, keys: m.keysQuiet()}
		dup := false
		for _, x := range wants {
			if slices.Equal(x.keys, w.keys) && x.m.codes[len(x.m.codes)-1] == m.codes[len(m.codes)-1] {
				dup = true
			}
		}
		if !dup {
			wants = append(wants, w)
		}
	}
	fail := func(format string, a ...any) *diffResult {
		h := append(slices.Clone(*hist), op)
		return &diffResult{steps: len(h), hist: h, divergence: fmt.Sprintf(format, a...)}
	}
	// The master's thread evicts within a tick or two; poll until it matches, then check that
	// it stays so.
	deadline := time.Now().Add(3 * time.Second)
	var held []string
	for {
		held = d.keys(t)
		for _, w := range wants {
			if !slices.Equal(held, w.keys) {
				continue
			}
			if len(w.m.frontier) > 0 || w.m.refilled || w.m.usedSlots() > int(diffHW*diffSlots) {
				// The master's thread ran rounds: check that it has stopped.
				time.Sleep(25 * time.Millisecond)
				if again := d.keys(t); !slices.Equal(again, held) {
					return nil, fail("after %s the master's keys moved on from %v to %v", op, held, again)
				}
			}
			if wc := w.m.codes[len(w.m.codes)-1]; wc != got {
				return nil, fail("%s returned %d on the master, %d on the embedded pool", op, got, wc)
			}
			*hist = append(*hist, w.op)
			if w.m.refilled {
				t.Logf("after %s pass 1 made up a shortfall; the master took the same keys: %v", op, held)
				*refills++
			}
			return w.m, nil
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	pre := before.keysQuiet()
	var why []string
	for _, w := range wants {
		if !w.m.refilled {
			continue
		}
		// The master made up pass 1's shortfall in the order of its shards: check what does
		// not depend on that order, then end the sequence.
		if bad := refillInvariants(op, pre, held, w.keys, w.m.frontier); bad != "" {
			why = append(why, fmt.Sprintf("%s: %s", w.op, bad))
			continue
		}
		h := append(slices.Clone(*hist), w.op)
		t.Logf("after %s pass 1 made up a shortfall: master %v, embedded %v", op, held, w.keys)
		return nil, &diffResult{steps: len(h), hist: h, shardOrder: true, refills: *refills + 1}
	}
	if len(why) > 0 {
		return nil, fail("after %s the master broke the invariants of a pass 1 refill: %s", op, strings.Join(why, "; "))
	}
	var exp []string
	for _, w := range wants {
		exp = append(exp, fmt.Sprintf("%s → %v (code %d)", w.op, w.keys, w.m.codes[len(w.m.codes)-1]))
	}
	return nil, fail("after %s (master code %d) the master holds %v; the embedded pool predicts %s", op, got, held, strings.Join(exp, " or "))
}

// refillInvariants checks a master's key set after a step whose pass 1 made up a shortfall:
// every key the embedded pool evicted from the frontier is gone, nothing appeared but the key
// put, and the master took at least as many objects as the frontier gave plus one.
func refillInvariants(op diffOp, pre, held, model, frontier []string) string {
	for _, k := range frontier {
		if slices.Contains(held, k) {
			return fmt.Sprintf("kept %s from the oldest frontier (master %v, embedded %v)", k, held, model)
		}
	}
	gone := 0
	for _, k := range pre {
		if !slices.Contains(held, k) {
			gone++
		}
	}
	for _, k := range held {
		if !slices.Contains(pre, k) && k != op.Key {
			return fmt.Sprintf("holds %s, which was not stored", k)
		}
	}
	if gone < len(frontier)+1 {
		return fmt.Sprintf("evicted %d objects, no more than the frontier's %d: no shortfall was made up (master %v, embedded %v)", gone, len(frontier), held, model)
	}
	return ""
}

// keysQuiet lists the keys the model holds, sorted, without granting leases.
func (m *diffModel) keysQuiet() []string {
	var ks []string
	for _, k := range diffKeyNames {
		if _, ok := m.p.LeaseDeadline(k); ok {
			ks = append(ks, k)
		}
	}
	return ks
}

func (m *diffModel) usedSlots() int {
	st, err := m.p.Stats(context.Background())
	if err != nil {
		return diffSlots
	}
	return int(st.UsedBytes / diffSlot)
}

// newestFirst lists the model's keys, the most recently put first (hist led to the model).
func (m *diffModel) newestFirst(hist []diffOp) []string {
	ks := m.keysQuiet()
	last := map[string]int{}
	for i, op := range hist {
		if op.Kind == "put" {
			last[op.Key] = i
		}
	}
	sort.Slice(ks, func(i, j int) bool { return last[ks[i]] > last[ks[j]] })
	return ks
}

func diffSequenceCount() int {
	if *diffSequences > 0 {
		return *diffSequences
	}
	if v, err := strconv.Atoi(os.Getenv("KVCTL_DIFF_SEQUENCES")); err == nil && v > 0 {
		return v
	}
	return diffCISequences
}

// TestPoolDifferential runs random sequences against the real master and the embedded pool
// (diffCISequences in CI; -diff.sequences=N or KVCTL_DIFF_SEQUENCES=N for a longer run, see
// docs/perf/pool-differential.md). A divergence fails the test with the seed and the history,
// shrunk to the fewest steps that still diverge.
func TestPoolDifferential(t *testing.T) {
	first := *diffSeed
	if first == 0 {
		first = 1
	}
	n := diffSequenceCount()
	var steps, shardOrder, refills int
	for i := 0; i < n; i++ {
		seed := first + uint64(i)
		res := runDiffSequence(t, seed, *diffSteps, nil)
		steps += res.steps
		refills += res.refills
		if res.shardOrder {
			shardOrder++
		}
		if res.divergence != "" {
			t.Errorf("seed %d diverged after %d steps: %s\nhistory:\n%s", seed, res.steps, res.divergence, formatHist(res.hist))
			if *diffShrink {
				small := shrinkDiff(t, res.hist)
				t.Errorf("shrunk to %d steps (keep it in TestPoolDifferentialCases):\n%s", len(small), formatHist(small))
			}
			return
		}
	}
	t.Logf("%d sequences, %d steps compared, %d pass 1 shortfalls made up, %d sequences ended at one the master decides by its shard order", n, steps, refills, shardOrder)
}

func formatHist(h []diffOp) string {
	var b strings.Builder
	for i, op := range h {
		fmt.Fprintf(&b, "  %2d %s\n", i, op)
	}
	return b.String()
}

// shrinkDiff removes steps from a diverging history while it still diverges.
func shrinkDiff(t *testing.T, h []diffOp) []diffOp {
	t.Helper()
	cur := slices.Clone(h)
	for i := range cur {
		cur[i].Early = 0
	}
	for changed := true; changed; {
		changed = false
		for i := len(cur) - 1; i >= 0; i-- {
			try := slices.Delete(slices.Clone(cur), i, i+1)
			var res diffResult
			t.Run(fmt.Sprintf("shrink-%d", len(try)), func(t *testing.T) {
				res = runDiffSequence(t, 0, len(try), try)
			})
			if res.divergence != "" {
				cur = try
				changed = true
			}
		}
	}
	return cur
}

// TestPoolDifferentialCases replays, against the real master and the embedded pool, every
// divergence the random sequences found, shrunk to the fewest steps that showed it.
func TestPoolDifferentialCases(t *testing.T) {
	put := func(k string) diffOp { return diffOp{Kind: "put", Key: k} }
	wait := diffOp{Kind: "wait"}
	for _, c := range []struct {
		name   string
		script []diffOp
		lease  time.Duration // 0: diffLease
	}{
		// The master removes a hard-pinned object whose lease ran out without force; the
		// embedded pool used to refuse it with OBJECT_HAS_LEASE (found by seed 3).
		{"hard pin does not block remove", []diffOp{
			{Kind: "put", Key: "d31", Hard: true}, wait,
			{Kind: "remove", Key: "d31"},
			{Kind: "put", Key: "d32", Hard: true},
			{Kind: "remove", Key: "d32", Force: true},
		}, 0},
		// Pass 1's frontier holds a group member whose group has a leased member: the master
		// evicts the rest of the frontier and makes up the shortfall from its other candidates
		// in shard order, leaving a hole among the younger objects (seed text, issue 36). The
		// embedded pool used to take the next oldest instead.
		{"pass 1 makes up a shortfall in shard order", refillScript(), 3 * time.Second},
		// A leased object is kept by a plain remove and removed by a forced one.
		{"lease blocks plain remove only", []diffOp{
			put("d01"), {Kind: "get", Key: "d01"},
			{Kind: "remove", Key: "d01"},
			{Kind: "remove", Key: "d01", Force: true},
		}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.lease > 0 {
				saved := diffLease
				diffLease = c.lease
				defer func() { diffLease = saved }()
			}
			res := runDiffSequence(t, 0, len(c.script), c.script)
			if res.divergence != "" {
				t.Fatalf("diverged: %s\nhistory:\n%s", res.divergence, formatHist(res.hist))
			}
			if refill := strings.HasPrefix(c.name, "pass 1"); refill != (res.refills > 0) {
				t.Fatalf("pass 1 made up a shortfall %d times, want %v\nhistory:\n%s", res.refills, refill, formatHist(res.hist))
			}
		})
	}
}

// refillScript puts a group member, leases it, puts a second member (not leased), then fills
// the pool until a round runs: the second member is in the frontier but its group is skipped.
func refillScript() []diffOp {
	s := []diffOp{
		{Kind: "put", Key: "d00", Group: "g0"},
		{Kind: "exist", Key: "d00"},
		{Kind: "put", Key: "d01", Group: "g0"},
	}
	for i := 2; i <= 12; i++ {
		s = append(s, diffOp{Kind: "put", Key: fmt.Sprintf("d%02d", i)})
	}
	return s
}
