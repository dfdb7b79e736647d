package probe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
)

// replay serves the real master's recorded responses verbatim, chosen by request target.
func replay(t *testing.T, files map[string]string) *httptest.Server {
	t.Helper()
	type rec struct {
		status int
		header http.Header
		body   []byte
	}
	recs := map[string]rec{}
	for target, name := range files {
		raw, err := os.ReadFile(filepath.Join("..", "..", "mooncake", "testdata", "http", "populated", name))
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := bytes.Cut(raw, []byte("\n"))
		_, rest, _ = bytes.Cut(rest, []byte("\n"))
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(rest)), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		recs[target] = rec{resp.StatusCode, resp.Header, body}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x, ok := recs[r.URL.RequestURI()]
		if !ok {
			x = recs["*"]
		}
		for k, v := range x.header {
			if k != "Content-Length" && k != "Date" {
				w.Header()[k] = v
			}
		}
		w.WriteHeader(x.status)
		w.Write(x.body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestTargetAgainstRecordedMaster(t *testing.T) {
	srv := replay(t, map[string]string{
		"/batch_query_keys?keys=a,b,x,h,missing_key": "batch_query_keys.txt",
		"/query_key?key=x":                           "query_key.txt",
		"/query_key?key=missing_key":                 "query_key_missing.txt",
		"*":                                          "not_found_path.txt",
	})
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
