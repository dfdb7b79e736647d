package router

import (
	"errors"
	"reflect"
	"testing"
)

type step struct {
	route    []Request
	want     []Placement
	context  []string // ContextDone after the route
	finished []string // Finished after the route
	load     []int    // rank loads after the step
}

func req(id, conv string, prompt int) Request {
	return Request{ID: id, ConversationID: conv, PromptTokens: prompt, Rank: Unplaced}
}

func TestRoute(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "work-aware charges prompt growth per conversation",
			cfg:  Config{Policy: PolicyWorkAware, Ranks: 2},
			steps: []step{
				{
					// First turns: whole prompts. Largest first: b (800) to rank 0, a (500) to rank 1.
					route: []Request{req("a1", "a", 500), req("b1", "b", 800)},
					want:  []Placement{{"a1", 1, 500}, {"b1", 0, 800}},
					load:  []int{800, 500},
				},
				{
					context: []string{"a1", "b1"},
					load:    []int{0, 0},
				},
				{
					// Second turns: a grew by 600, b by 100. a goes first, to rank 0 (tie, lowest).
					route: []Request{req("b2", "b", 900), req("a2", "a", 1100)},
					want:  []Placement{{"b2", 1, 100}, {"a2", 0, 600}},
					load:  []int{600, 100},
				},
				{
					// A shrinking prompt and a request without a conversation estimate the whole
					// prompt; b3 did not grow and is charged one token.
					route: []Request{req("a3", "a", 300), req("x", "", 50), req("b3", "b", 900)},
					want:  []Placement{{"a3", 1, 300}, {"x", 1, 50}, {"b3", 1, 1}},
					load:  []int{600, 451},
				},
			},
		},
		{
			name: "prompt-length balances whole prompts",
			cfg:  Config{Policy: PolicyPromptLength, Ranks: 2},
			steps: []step{
				{
					route: []Request{req("a1", "a", 500), req("b1", "b", 800)},
					want:  []Placement{{"a1", 1, 500}, {"b1", 0, 800}},
					load:  []int{800, 500},
				},
				{
					context: []string{"a1", "b1"},
				},
				{
					route: []Request{req("b2", "b", 900), req("a2", "a", 1100)},
					want:  []Placement{{"b2", 1, 900}, {"a2", 0, 1100}},
					load:  []int{1100, 900},
				},
			},
		},
		{
			name: "the cap skips full ranks and leaves the rest unplaced",
			cfg:  Config{Policy: PolicyWorkAware, Ranks: 2, MaxActiveRequests: 1},
			steps: []step{
				{
					route: []Request{req("a", "", 10), req("b", "", 30), req("c", "", 20)},
					want:  []Placement{{"a", Unplaced, 10}, {"b", 0, 30}, {"c", 1, 20}},
					load:  []int{30, 20},
				},
				{
					// Leaving the context phase frees no slot; finishing does.
					context:  []string{"b"},
					finished: []string{"c"},
					load:     []int{0, 0},
				},
				{
					route: []Request{req("a", "", 10)},
					want:  []Placement{{"a", 1, 10}},
					load:  []int{0, 10},
				},
			},
		},
		{
			name: "explicit placements are charged before the rest are balanced",
			cfg:  Config{Policy: PolicyWorkAware, Ranks: 3},
			steps: []step{
				{
					route: []Request{
						req("a", "", 100),
						{ID: "p", PromptTokens: 1000, Rank: 0},
						req("b", "", 200),
					},
					want: []Placement{{"a", 2, 100}, {"p", 0, 1000}, {"b", 1, 200}},
					load: []int{1000, 200, 100},
				},
			},
		},
		{
			name: "children inherit their parent's estimate",
			cfg:  Config{Policy: PolicyWorkAware, Ranks: 2},
			steps: []step{
				{
					route: []Request{req("p", "c", 400)},
					want:  []Placement{{"p", 0, 400}},
				},
				{
					route: []Request{{ID: "p.1", ConversationID: "c", PromptTokens: 400, ParentID: "p", Rank: Unplaced}},
					want:  []Placement{{"p.1", 1, 400}},
					load:  []int{400, 400},
				},
			},
		},
		{
			name: "equal estimates keep routing order",
			cfg:  Config{Policy: PolicyPromptLength, Ranks: 3},
			steps: []step{
				{
					route: []Request{req("a", "", 5), req("b", "", 5), req("c", "", 5), req("d", "", 5)},
					want:  []Placement{{"a", 0, 5}, {"b", 1, 5}, {"c", 2, 5}, {"d", 0, 5}},
					load:  []int{10, 5, 5},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				if s.route != nil {
					got, err := r.Route(s.route)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if !reflect.DeepEqual(got, s.want) {
						t.Fatalf("step %d: placements\n got %v\nwant %v", i, got, s.want)
					}
				}
				for _, id := range s.context {
					if err := r.ContextDone(id); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
				}
				for _, id := range s.finished {
					if err := r.Finished(id); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
				}
				if s.load != nil {
					var got []int
					for _, rs := range r.Ranks() {
						got = append(got, rs.Load)
					}
					if !reflect.DeepEqual(got, s.load) {
						t.Fatalf("step %d: loads %v, want %v", i, got, s.load)
					}
				}
			}
		})
	}
}

func TestConversationTableIsLRUBounded(t *testing.T) {
	r, err := New(Config{Ranks: 1, ConversationCapacity: 2})
	if err != nil {
		t.Fatal(err)
	}
	route := func(id, conv string, n int) int {
		t.Helper()
		p, err := r.Route([]Request{req(id, conv, n)})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Finished(id); err != nil {
			t.Fatal(err)
		}
		return p[0].Estimate
	}
	route("a1", "a", 100)
	route("b1", "b", 100)
	if got := route("a2", "a", 150); got != 50 { // refreshes a
		t.Fatalf("a2 estimate %d, want 50", got)
	}
	route("c1", "c", 100) // evicts b, the least recently written
	if got := route("b2", "b", 180); got != 180 {
		t.Fatalf("b2 estimate %d, want the whole prompt once b was evicted", got)
	}
	if got := route("c2", "c", 130); got != 30 {
		t.Fatalf("c2 estimate %d, want 30", got)
	}
	if convs, _ := r.TableSizes(); convs != 2 {
		t.Fatalf("conversation table holds %d, want 2", convs)
	}
}

func TestRequestTableIsLRUBounded(t *testing.T) {
	r, err := New(Config{Ranks: 1, RequestCapacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Route([]Request{req("p", "", 400), req("q", "", 10)}); err != nil {
		t.Fatal(err)
	}
	// p's estimate was dropped for q's: its child estimates its own prompt.
	p, err := r.Route([]Request{{ID: "p.1", PromptTokens: 70, ParentID: "p", Rank: Unplaced}})
	if err != nil {
		t.Fatal(err)
	}
	if p[0].Estimate != 70 {
		t.Fatalf("child estimate %d, want 70", p[0].Estimate)
	}
}

func TestRouteErrors(t *testing.T) {
	if _, err := New(Config{Policy: "random", Ranks: 0}); !errors.Is(err, ErrConfig) {
		t.Fatalf("New: %v, want ErrConfig", err)
	}
	r, err := New(Config{Ranks: 2})
	if err != nil {
		t.Fatal(err)
	}
	for name, batch := range map[string][]Request{
		"duplicate id": {req("a", "", 1), req("a", "", 1)},
		"no id":        {req("", "", 1)},
		"bad rank":     {{ID: "x", PromptTokens: 1, Rank: 2}},
	} {
		if _, err := r.Route(batch); err == nil {
			t.Errorf("%s: Route succeeded", name)
		}
	}
	if err := r.Finished("nobody"); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("Finished: %v, want ErrUnknownRequest", err)
	}
}

// The pool-aware policy charges what the pool does not hold, and the work-aware estimate when
// the pool did not answer.
func TestPoolAwareEstimate(t *testing.T) {
	r, err := New(Config{Policy: PolicyPoolAware, Ranks: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req  Request
		want int
	}{
		{Request{ID: "a", PromptTokens: 1000, PoolUncached: 40, PoolKnown: true}, 40},
		{Request{ID: "b", PromptTokens: 1000, PoolUncached: 0, PoolKnown: true}, 1},
		{Request{ID: "c", PromptTokens: 1000, PoolUncached: 40}, 1000},
		{Request{ID: "d", ConversationID: "x", PromptTokens: 300}, 300},
	} {
		if got := r.Estimate(tc.req); got != tc.want {
			t.Errorf("%s: estimate %d, want %d", tc.req.ID, got, tc.want)
		}
	}
	pl, err := r.Route([]Request{{ID: "big", PromptTokens: 5000, PoolUncached: 4000, PoolKnown: true, Rank: Unplaced},
		{ID: "cached", PromptTokens: 5000, PoolUncached: 10, PoolKnown: true, Rank: Unplaced}})
	if err != nil {
		t.Fatal(err)
	}
	if pl[0].Estimate != 4000 || pl[1].Estimate != 10 || pl[0].Rank == pl[1].Rank {
		t.Fatalf("placements %+v", pl)
	}
}
