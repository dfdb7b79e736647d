package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// TestConnectorPoolInPlace pins which backends the connectors use in place: the embedded pool
// (its memory is this process's) and not a Mooncake backend, even one whose pool type happens
// to have the in-place calls.
func TestConnectorPoolInPlace(t *testing.T) {
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "s", Capacity: 1 << 20}}
	o.EvictionPeriod = 0 // no goroutine to outlive the test
	d, err := New(Config{Pool: o})
	if err != nil {
		t.Fatal(err)
	}
	p := d.connectorPool()
	if _, ok := p.(pool.Viewer); !ok {
		t.Fatal("the embedded backend's connector pool has no in-place reads")
	}
	if _, ok := p.(pool.Reserver); !ok {
		t.Fatal("the embedded backend's connector pool has no in-place writes")
	}
	if _, ok := p.(pool.ReusingViewer); !ok {
		t.Fatal("the embedded backend's connector pool has no views into a reused View")
	}
	if _, ok := p.(pool.PieceCopier); !ok {
		t.Fatal("the embedded backend's connector pool has no copies into and out of values' pieces")
	}

	e, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	d2, err := New(Config{Backend: &Backend{Pool: e, Info: statsapi.BackendInfo{Kind: statsapi.BackendMooncake, Master: "127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	p2 := d2.connectorPool()
	if _, ok := p2.(pool.Viewer); ok {
		t.Fatal("a Mooncake backend is read in place")
	}
	if _, ok := p2.(pool.Reserver); ok {
		t.Fatal("a Mooncake backend is written in place")
	}
	if _, ok := p2.(pool.PieceCopier); !ok {
		t.Fatal("a Mooncake backend that copies values' pieces is not handed them")
	}
	if _, ok := p2.(pool.Locator); !ok {
		t.Fatal("the Mooncake backend's connector pool lost its lookups' locate")
	}
	d3, err := New(Config{Backend: &Backend{Pool: plainPool{e}, Info: statsapi.BackendInfo{Kind: statsapi.BackendMooncake, Master: "127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d3.connectorPool().(pool.PieceCopier); ok {
		t.Fatal("a backend without piece copies is offered them")
	}
}

// plainPool hides every call of its pool but pool.Pool's.
type plainPool struct{ pool.Pool }

// TestInPlaceViewsCounted: the in-place reads count as the guard counts gets, without a timer of
// their own: a page not offered and a page the caller's check finds corrupt are failed load
// pages; a view past the pool timeout, or past its caller's deadline, is a timeout; a view
// within both is not.
func TestInPlaceViewsCounted(t *testing.T) {
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "s", Capacity: 1 << 20}}
	o.EvictionPeriod = 0
	for _, timeout := range []time.Duration{time.Hour, time.Nanosecond} {
		d, err := New(Config{Pool: o, PoolTimeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		// Straight into the backend: through the guard, a put would time out too.
		if c := d.Pool().BatchPut(ctx, []string{"a", "b"}, [][]byte{[]byte("aaaa"), []byte("bbbb")}, pool.ReplicateConfig{}); c[0] != pool.OK || c[1] != pool.OK {
			t.Fatalf("put: %v", c)
		}
		p := d.connectorPool()
		want := statsapi.PoolFailuresJSON{}
		check := func(what string) {
			t.Helper()
			if got := d.guard.failures(); got != want {
				t.Fatalf("timeout %v, %s: counted %+v, want %+v", timeout, what, got, want)
			}
		}
		timedOut := int64(0)
		if timeout == time.Nanosecond {
			timedOut = 1
		}
		v := p.(pool.Viewer).BatchView(ctx, []string{"a", "missing"})
		v.Release()
		want.LoadPages, want.Timeouts = 1, timedOut
		check("a view with a missing page")
		v = p.(pool.DeferredViewer).BatchViewDeferred(ctx, []string{"missing", "b"})
		want.LoadPages, want.Timeouts = 2, 2*timedOut
		check("a deferred view with a missing page")
		v.Corrupt(1)
		v.Release()
		want.LoadPages = 3
		check("a page the caller found corrupt")
		past, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		v = p.(pool.DeferredViewer).BatchViewDeferred(past, []string{"a"})
		cancel()
		v.Release()
		want.LoadPages, want.Timeouts = 4, 2*timedOut+1
		check("a view past its caller's deadline")
		var into pool.View
		p.(pool.ReusingViewer).BatchViewDeferredInto(ctx, [][]byte{[]byte("a"), []byte("missing"), []byte("b")}, &into)
		want.LoadPages, want.Timeouts = 5, 3*timedOut+1
		check("a view into the caller's View with a missing page")
		into.Corrupt(2)
		into.Release()
		want.LoadPages = 6
		check("a page of a view into the caller's View found corrupt")
		p.(pool.ReusingViewer).BatchViewDeferredInto(ctx, [][]byte{[]byte("b")}, &into)
		into.Corrupt(0)
		into.Release()
		want.LoadPages, want.Timeouts = 7, 4*timedOut+1
		check("the reused View's page found corrupt, counted once")
		_ = d.closeBackend()
	}
}

// TestPieceCopiesGuarded: the connector pool's copies into and out of values' pieces go to the
// backend and count as its gets and puts do, for the embedded backend and for a backend of
// another kind (an embedded pool standing in for a Mooncake cluster, which has the same calls):
// a value put as pieces is got back whole and into other pieces, a missing key is a failed load
// page, pieces too short are one more, a put whose every key is refused counts its dropped
// pages, and a call past the pool timeout is a timeout.
func TestPieceCopiesGuarded(t *testing.T) {
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "s", Capacity: 1 << 20}}
	o.EvictionPeriod = 0
	for _, c := range []struct {
		backend string
		timeout time.Duration
	}{{"embedded", time.Hour}, {"embedded", time.Nanosecond}, {"mooncake", time.Hour}, {"mooncake", time.Nanosecond}} {
		timeout := c.timeout
		cfg := Config{Pool: o, PoolTimeout: timeout}
		if c.backend == "mooncake" {
			e, err := embedded.NewEmbedded(o)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Backend = &Backend{Pool: e, Info: statsapi.BackendInfo{Kind: statsapi.BackendMooncake, Master: "127.0.0.1:1"}}
		}
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		pc := d.connectorPool().(pool.PieceCopier)
		want := statsapi.PoolFailuresJSON{}
		timedOut := int64(0)
		if timeout == time.Nanosecond {
			timedOut = 1
		}
		check := func(what string) {
			t.Helper()
			if got := d.guard.failures(); got != want {
				t.Fatalf("%s backend, timeout %v, %s: counted %+v, want %+v", c.backend, timeout, what, got, want)
			}
		}
		codes := pc.BatchPutPieces(ctx, []string{"a"}, [][][]byte{{[]byte("ab"), []byte("cdef")}}, pool.ReplicateConfig{})
		want.Timeouts = timedOut
		if timeout == time.Hour && codes[0] != pool.OK {
			t.Fatalf("put pieces: %v", codes)
		}
		if timeout == time.Nanosecond {
			// The backend saw a context already past its deadline: nothing is stored.
			if codes[0] >= 0 {
				t.Fatalf("a put past the pool timeout: %v", codes)
			}
			want.DroppedSavePages = 1
			check("a put past the pool timeout")
			_ = d.closeBackend()
			continue
		}
		check("a put of pieces")
		whole := make([]byte, 6)
		if n := d.Pool().BatchGet(ctx, []string{"a"}, [][]byte{whole}); n[0] != 6 || string(whole) != "abcdef" {
			t.Fatalf("the value put as pieces reads %d bytes %q", n[0], whole)
		}
		x, y := make([]byte, 3), make([]byte, 3)
		got := pc.BatchGetPieces(ctx, []string{"a", "missing"}, [][][]byte{{x, y}, {make([]byte, 1)}})
		if got[0] != 6 || string(x)+string(y) != "abcdef" || got[1] != int64(pool.ErrObjectNotFound) {
			t.Fatalf("get pieces: %v, %q %q", got, x, y)
		}
		want.LoadPages = 1
		check("a get of pieces with a missing key")
		if got := pc.BatchGetPieces(ctx, []string{"a"}, [][][]byte{{make([]byte, 5)}}); got[0] != int64(pool.ErrInvalidParams) {
			t.Fatalf("pieces one byte short: %v", got)
		}
		want.LoadPages = 2
		check("pieces too short")
		if c := pc.BatchPutPieces(ctx, []string{"", "b"}, [][][]byte{{[]byte("x")}}, pool.ReplicateConfig{}); len(c) != 2 || c[0] != pool.ErrInvalidParams || c[1] != pool.ErrInvalidParams {
			t.Fatalf("two keys, one source: %v", c)
		}
		want.DroppedSavePages = 2
		check("a refused put")
		_ = d.closeBackend()
	}
}
