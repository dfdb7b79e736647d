package probe

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

func TestTargetAgainstRecordedMaster(t *testing.T) {
	load := func(name string) mooncaketest.Recording { return mooncaketest.Load(t, "populated", name) }
	srv := mooncaketest.ReplayServer(t, map[string]mooncaketest.Recording{
		"/batch_query_keys?keys=a,b,x,h,missing_key": load("batch_query_keys.txt"),
		"/query_key?key=x":                           load("query_key.txt"),
		"/query_key?key=missing_key":                 load("query_key_missing.txt"),
	}, load("not_found_path.txt"))
	tg, err := NewTarget(srv.URL, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if k, err := tg.Kind(ctx); err != nil || k != KindMaster {
		t.Fatalf("kind %q %v: the master answers /v1/stats with 404", k, err)
	}
	got, err := tg.Exists(ctx, []string{"a", "b", "x", "h", "missing_key"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, true, true, true, false}; !equal(got, want) {
		t.Errorf("batch_query_keys: %v, want %v", got, want)
	}
	got, err = tg.Exists(ctx, []string{"x", "missing_key"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if !equal(got, []bool{true, false}) {
		t.Errorf("query_key: %v", got)
	}
	// A key the recording has no answer for gets the master's 404 page, which is not JSON.
	if _, err := tg.Exists(ctx, []string{"zzz"}, false); err == nil {
		t.Error("an unexpected answer must be an error")
	}
}

func TestTargetUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close()
	tg, err := NewTarget(addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tg.Kind(context.Background()); !errors.Is(err, mooncake.ErrUnreachable) {
		t.Errorf("%v", err)
	}
	if _, err := NewTarget("ftp://x:1", 0); err == nil {
		t.Error("an ftp address must be refused")
	}
}

func equal(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
