package mooncake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// recordedAnswers returns the status and body of every recorded admin answer under
// testdata/http: the lines after "### " comments are an HTTP/1.1 response.
func recordedAnswers(f *testing.F) (statuses []int, bodies [][]byte) {
	names, _ := filepath.Glob("testdata/http/*/*.txt")
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		for bytes.HasPrefix(b, []byte("### ")) {
			_, b, _ = bytes.Cut(b, []byte("\n"))
		}
		head, body, ok := bytes.Cut(b, []byte("\r\n\r\n"))
		if !ok {
			continue
		}
		fields := strings.Fields(string(head))
		if len(fields) < 2 {
			continue
		}
		st, err := strconv.Atoi(fields[1])
		if err != nil {
			continue
		}
		statuses, bodies = append(statuses, st), append(bodies, body)
	}
	return statuses, bodies
}

// FuzzParseQuerySegment fuzzes the /query_segment answer parser. A body it accepts names the
// segment on one line and gives Used(bytes) and Capacity(bytes) once each, as non-negative
// counts, and it reads back the same after the handler's rendering; every refusal is
// ErrMalformedResponse.
func FuzzParseQuerySegment(f *testing.F) {
	f.Add([]byte("127.0.0.1:12481\nUsed(bytes): 1118208\nCapacity(bytes) : 67108864\n"))
	f.Add([]byte("seg\r\nUsed(bytes): 0\r\nCapacity(bytes) : 0\r\n"))
	f.Add([]byte("seg\nCapacity(bytes): 5\nUsed(bytes): 1"))
	f.Add([]byte("seg\nUsed(bytes) 1\nCapacity(bytes) : 5\n"))
	f.Add([]byte("Failed to query segment"))
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrMalformedResponse, fmt.Sprintf(format, a...))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := parseQuerySegment(body, bad)
		if err != nil {
			if !errors.Is(err, ErrMalformedResponse) {
				t.Fatalf("refusal %v is not ErrMalformedResponse", err)
			}
			return
		}
		if s.Name == "" || strings.Contains(s.Name, "\n") || s.Used < 0 || s.Capacity < 0 {
			t.Fatalf("accepted %+v from %q", s, body)
		}
		if n := bytes.Count(body, []byte("Used(bytes)")); n != 1 && !strings.Contains(s.Name, "Used(bytes)") {
			t.Fatalf("accepted %q, which gives Used(bytes) %d times", body, n)
		}
		if n := bytes.Count(body, []byte("Capacity(bytes)")); n != 1 && !strings.Contains(s.Name, "Capacity(bytes)") {
			t.Fatalf("accepted %q, which gives Capacity(bytes) %d times", body, n)
		}
		// The rendering of adminHandler.querySegment.
		again := fmt.Sprintf("%s\nUsed(bytes): %d\nCapacity(bytes) : %d\n", s.Name, s.Used, s.Capacity)
		back, err := parseQuerySegment([]byte(again), bad)
		if err != nil || back != s {
			t.Fatalf("%+v rendered as %q reads back as %+v, %v", s, again, back, err)
		}
	})
}

type answerTransport struct {
	status int
	body   []byte
}

func (a answerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: a.status, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(a.body)), Request: r}, nil
}

// FuzzAdminClientAnswers gives every JSON and line-list call of the admin client an arbitrary
// status and body. None panics; an answer that is not 200 is a *StatusError with that status;
// a 200 answer the client cannot use wraps ErrMalformedResponse; what is accepted meets the
// calls' promises (a health status, key and segment lines that are neither empty nor split).
func FuzzAdminClientAnswers(f *testing.F) {
	statuses, bodies := recordedAnswers(f)
	for i := range bodies {
		f.Add(uint16(statuses[i]), bodies[i])
	}
	f.Add(uint16(200), []byte(`{"success":true,"data":{}}`))
	f.Add(uint16(404), []byte(`{"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}`))
	f.Add(uint16(500), []byte("Failed to query segment"))
	f.Add(uint16(200), []byte(`{"status":""}`))
	f.Fuzz(func(t *testing.T, status uint16, body []byte) {
		st := 100 + int(status)%500
		c, err := NewAdminClient("http://master:9003", &http.Client{Transport: answerTransport{st, body}})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		check := func(call string, err error) bool {
			if err == nil {
				if st != http.StatusOK {
					t.Fatalf("%s accepted a %d answer", call, st)
				}
				return true
			}
			var se *StatusError
			switch {
			case st != http.StatusOK:
				if !errors.As(err, &se) || se.StatusCode != st {
					t.Fatalf("%s: %d answer gave %v, want a *StatusError with that status", call, st, err)
				}
			case !errors.Is(err, ErrMalformedResponse):
				t.Fatalf("%s: 200 answer %q refused with %v, want ErrMalformedResponse", call, body, err)
			}
			return false
		}
		if h, err := c.Health(ctx); check("Health", err) && h.Status == "" {
			t.Fatalf("health without a status from %q", body)
		}
		_, err = c.QueryKey(ctx, "k")
		check("QueryKey", err)
		if m, err := c.BatchQueryKeys(ctx, []string{"a", "b"}); check("BatchQueryKeys", err) && m == nil {
			t.Fatal("BatchQueryKeys accepted an answer without data")
		}
		_, err = c.QuerySegment(ctx, "s")
		check("QuerySegment", err)
		_, err = c.Leader(ctx)
		check("Leader", err)
		_, err = c.KVEventsStatus(ctx)
		check("KVEventsStatus", err)
		for _, call := range []func(context.Context) ([]string, error){c.AllKeys, c.AllSegments} {
			ls, err := call(ctx)
			if !check("AllKeys/AllSegments", err) {
				continue
			}
			for _, l := range ls {
				if l == "" || strings.Contains(l, "\n") {
					t.Fatalf("line %q from %q", l, body)
				}
			}
		}
	})
}
