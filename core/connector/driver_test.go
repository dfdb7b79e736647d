package connector

import (
	"context"
	"errors"
	"testing"
)

// The Admit hook decides per waiting request: Wait leaves it for a later pass, Drop ends it
// without a lookup; MaxRunning caps the requests admitted and not done.
func TestDriverAdmission(t *testing.T) {
	e := newEngine(t, newMemPool(), baseOptions(), 1, 64)
	e.drv.opts.MaxRunning = 1
	admitB := false
	e.drv.opts.Hooks.Admit = func(_ context.Context, r *DrivenRequest) (int, Admission, error) {
		switch r.ID {
		case "b":
			if !admitB {
				return 0, Wait, nil
			}
		case "c":
			return 0, Drop, nil
		}
		return 0, Admit, nil
	}
	c, a, b := e.add("c", prompt(3, 0, 9)), e.add("a", prompt(1, 0, 9)), e.add("b", prompt(2, 0, 9))
	if err := e.step(); err != nil {
		t.Fatal(err)
	}
	// c was dropped without being looked up; a runs; b waits for the one running place.
	if c.Phase != PhaseDropped || e.sched.Tracks("c") || a.Phase == PhaseWaiting || b.Phase != PhaseWaiting {
		t.Fatalf("after pass 0: c %d (tracked %t), a %d, b %d", c.Phase, e.sched.Tracks("c"), a.Phase, b.Phase)
	}
	for a.Phase != PhaseDone {
		if b.Phase != PhaseWaiting {
			t.Fatalf("b admitted (phase %d) while a (phase %d) holds the one running place", b.Phase, a.Phase)
		}
		if err := e.step(); err != nil {
			t.Fatal(err)
		}
	}
	// The place is free, but b's hook still says Wait.
	if err := e.step(); err != nil {
		t.Fatal(err)
	}
	if b.Phase != PhaseWaiting || e.sched.Tracks("b") {
		t.Fatalf("b phase %d (tracked %t) while its hook said Wait", b.Phase, e.sched.Tracks("b"))
	}
	admitB = true
	e.mustRun()
	if b.Phase != PhaseDone || e.drv.Pending() != 0 {
		t.Fatalf("b phase %d, %d pending", b.Phase, e.drv.Pending())
	}
	if st := e.drv.Stats(); st.Restarts != 0 || st.Parked != 0 || st.Passes != e.pass {
		t.Fatalf("stats %+v after %d passes", st, e.pass)
	}
}

// MaxAdmitPerPass lets only so many waiting requests in per pass, in the order they were added.
func TestDriverAdmitPerPass(t *testing.T) {
	e := newEngine(t, newMemPool(), baseOptions(), 1, 64)
	e.drv.opts.MaxAdmitPerPass = 2
	rs := []*simReq{e.add("a", prompt(1, 0, 9)), e.add("b", prompt(2, 0, 9)), e.add("c", prompt(3, 0, 9))}
	if err := e.step(); err != nil {
		t.Fatal(err)
	}
	if rs[0].Phase == PhaseWaiting || rs[1].Phase == PhaseWaiting || rs[2].Phase != PhaseWaiting {
		t.Fatalf("after one pass with 2 admissions a pass: phases %d %d %d", rs[0].Phase, rs[1].Phase, rs[2].Phase)
	}
	e.mustRun()
	for _, r := range rs {
		if r.Phase != PhaseDone {
			t.Fatalf("%s phase %d after the run", r.ID, r.Phase)
		}
	}
}

// An error from a hook ends the pass with that error.
func TestDriverHookError(t *testing.T) {
	e := newEngine(t, newMemPool(), baseOptions(), 1, 64)
	boom := errors.New("boom")
	e.drv.opts.Hooks.Computed = func(context.Context, *DrivenRequest, int, int) error { return boom }
	e.add("a", prompt(1, 0, 9))
	if err := e.step(); !errors.Is(err, boom) {
		t.Fatalf("step = %v, want the hook's error", err)
	}
}

func TestNewDriverRefusesBadOptions(t *testing.T) {
	r := NewLocalRank("r", nil, nil)
	alloc := func(context.Context, *DrivenRequest, int, bool) (int, error) { return 0, nil }
	for name, tc := range map[string]struct {
		ranks []Rank
		opts  DriverOptions
	}{
		"no ranks":         {nil, DriverOptions{TokensPerBlock: 4, Hooks: DriverHooks{Allocate: alloc}}},
		"no block size":    {[]Rank{r}, DriverOptions{Hooks: DriverHooks{Allocate: alloc}}},
		"no allocate hook": {[]Rank{r}, DriverOptions{TokensPerBlock: 4}},
	} {
		if _, err := NewDriver(tc.ranks, tc.opts); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
