package router

import "testing"

// A request left Unplaced at the active-request cap and routed again keeps the estimate made
// in routing order; re-estimating it against the conversation length it recorded itself would
// turn an 800-token growth into 1.
func TestUnplacedRequestKeepsItsEstimate(t *testing.T) {
	r, err := New(Config{Policy: PolicyWorkAware, Ranks: 1, MaxActiveRequests: 1})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := r.Route([]Request{req("a1", "a", 100), req("b1", "b", 800)})
	if err != nil {
		t.Fatal(err)
	}
	// Largest first: b1 takes the only slot, a1 waits.
	if pl[0].Rank != Unplaced || pl[1].Rank != 0 || pl[0].Estimate != 100 || pl[1].Estimate != 800 {
		t.Fatalf("first route: %+v", pl)
	}
	if err := r.Finished("b1"); err != nil {
		t.Fatal(err)
	}
	pl, err = r.Route([]Request{req("a1", "a", 100)})
	if err != nil {
		t.Fatal(err)
	}
	if pl[0].Rank != 0 || pl[0].Estimate != 100 {
		t.Fatalf("routed again: %+v, want rank 0 charged its first estimate 100", pl[0])
	}
	if got := r.Ranks()[0].Load; got != 100 {
		t.Fatalf("rank load %d, want 100", got)
	}
	// The next turn of conversation a is estimated against a1's prompt, once.
	if err := r.Finished("a1"); err != nil {
		t.Fatal(err)
	}
	pl, err = r.Route([]Request{req("a2", "a", 900)})
	if err != nil {
		t.Fatal(err)
	}
	if pl[0].Estimate != 800 {
		t.Fatalf("second turn estimate %d, want 800", pl[0].Estimate)
	}
	if _, reqs := r.TableSizes(); reqs != 3 {
		t.Fatalf("request table holds %d entries, want 3", reqs)
	}
	if r.unplaced.len() != 0 {
		t.Fatalf("%d unplaced estimates left after every request was placed", r.unplaced.len())
	}
}
