package mooncaketest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Recording is one recorded exchange with the master.
type Recording struct {
	// Request is the recorded request: method and URL, as in "GET http://127.0.0.1:9003/health".
	Request string
	// Status, Header and Body are the master's response. Header is as the master sent it,
	// Content-Length and Date included.
	Status int
	Header http.Header
	Body   []byte
}

// ReadRecording reads one recording file.
func ReadRecording(path string) (Recording, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Recording{}, err
	}
	first, rest, _ := bytes.Cut(raw, []byte("\n"))
	request, ok := strings.CutPrefix(string(first), "### ")
	if method, target, _ := strings.Cut(request, " "); !ok || method == "" || target == "" || strings.Contains(target, " ") {
		return Recording{}, fmt.Errorf("%s: bad request line %q", path, first)
	}
	stamp, rest, _ := bytes.Cut(rest, []byte("\n"))
	if !bytes.HasPrefix(stamp, []byte("### recorded ")) {
		return Recording{}, fmt.Errorf("%s: bad recording line %q", path, stamp)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(rest)), nil)
	if err != nil {
		return Recording{}, fmt.Errorf("%s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return Recording{}, fmt.Errorf("%s: %w", path, err)
	}
	return Recording{Request: request, Status: resp.StatusCode, Header: resp.Header, Body: body}, nil
}

// RecordingsDir is the folder of the recordings taken in state ("empty" or "populated"). The
// path is found from the working directory, which under go test is the package's folder
// anywhere in the module.
func RecordingsDir(state string) string {
	return filepath.Join(moduleRoot(), "mooncake", "testdata", "http", state)
}

// moduleRoot is the nearest folder at or above the working directory that holds go.mod; "."
// when there is none, so that paths stay relative and a missing file is named in the error.
func moduleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return "."
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		} else if !errors.Is(err, os.ErrNotExist) {
			return "."
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "."
		}
		dir = parent
	}
}

// Load reads the recording name (a file name such as "health.txt") taken in state, and fails
// the test when it cannot.
func Load(tb testing.TB, state, name string) Recording {
	tb.Helper()
	r, err := ReadRecording(filepath.Join(RecordingsDir(state), name))
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// ServeHTTP answers with the recorded status, header and body. Content-Length and Date are
// left to net/http, so a test may change Body; a response recorded without a Content-Type is
// sent without one, as the master sent it.
func (r Recording) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	for k, v := range r.Header {
		if k != "Content-Length" && k != "Date" {
			h[k] = v
		}
	}
	if _, ok := r.Header["Content-Type"]; !ok {
		h["Content-Type"] = nil // a nil entry keeps net/http from sniffing one
	}
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body)
}

// ReplayServer serves recordings until the test ends. A request is answered by the route whose
// key is its path and query ("/query_key?key=x"), else by the route whose key is its path
// ("/metrics"), else by fallback, such as the master's recorded 404 (not_found_path.txt).
func ReplayServer(tb testing.TB, routes map[string]Recording, fallback Recording) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec, ok := routes[r.URL.RequestURI()]
		if !ok {
			rec, ok = routes[r.URL.Path]
		}
		if !ok {
			rec = fallback
		}
		rec.ServeHTTP(w, r)
	}))
	tb.Cleanup(srv.Close)
	return srv
}
