package replay

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestReadTraceMalformedLines(t *testing.T) {
	in := strings.Join([]string{
		`{"timestamp": 5, "input_length": 1000, "output_length": 3, "hash_ids": [7, 8]}`,
		`{"timestamp": 1, "input_length": 512, "output_length": 0, "hash_ids": [7]}`,
		``,
		`{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}`,
		`{"timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}`,
		`{"timestamp": 2, "input_length": 10.5, "output_length": 1, "hash_ids": [1]}`,
		`{"timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": [-3]}`,
		`{"timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": [3]} {}`,
		`[1, 2]`,
	}, "\n")
	_, err := ReadTrace("t", strings.NewReader(in), ReadOptions{})
	var te *TraceError
	if !errors.As(err, &te) || !errors.Is(err, ErrMalformed) {
		t.Fatalf("got %v, want a *TraceError", err)
	}
	var lines []int
	for _, l := range te.Lines {
		lines = append(lines, l.Line)
	}
	if want := []int{4, 5, 6, 7, 8, 9}; !equalInts(lines, want) {
		t.Fatalf("malformed lines %v, want %v (%v)", lines, want, te.Lines)
	}
	tr, err := ReadTrace("t", strings.NewReader(in), ReadOptions{SkipBad: true})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Format != FormatMooncake || len(tr.Requests) != 2 || len(tr.Skipped) != 6 {
		t.Fatalf("format %s, %d requests, %d skipped", tr.Format, len(tr.Requests), len(tr.Skipped))
	}
	// Sorted by arrival; conversations from the first two hash ids.
	if r := tr.Requests[0]; r.Line != 2 || r.Arrival != time.Millisecond || r.ConversationID != "7" {
		t.Fatalf("first request %+v", r)
	}
	if r := tr.Requests[1]; r.ID != "r1" || r.ConversationID != "7/8" || r.InputLength != 1000 {
		t.Fatalf("second request %+v", r)
	}
}

func TestReadTokenTrace(t *testing.T) {
	in := `{"id": "a", "conversation_id": "c", "arrival_ms": 3, "tokens": [1, 2, 3], "output_length": 4, "cache_salt": "s", "lora_id": 0}
{"id": "b", "arrival_ms": 1, "tokens_file": "b.txt"}
{"id": "a", "arrival_ms": 4, "tokens": [1]}
{"id": "c", "arrival_ms": 4, "tokens": [1], "tokens_file": "b.txt"}
{"id": "d", "arrival_ms": 4, "tokens": []}
{"arrival_ms": 4, "tokens": [1]}
`
	open := func(name string) (io.ReadCloser, error) {
		if name != "dir/b.txt" {
			return nil, errors.New("no such file")
		}
		return io.NopCloser(strings.NewReader("5 6,7")), nil
	}
	_, err := ReadTrace("t", strings.NewReader(in), ReadOptions{Dir: "dir", Open: open})
	var te *TraceError
	if !errors.As(err, &te) || len(te.Lines) != 3 || te.Lines[0].Line != 4 {
		t.Fatalf("got %v", err)
	}
	tr, err := ReadTrace("t", strings.NewReader(in), ReadOptions{Dir: "dir", Open: open, SkipBad: true})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Format != FormatTokens || len(tr.Requests) != 2 || len(tr.Skipped) != 4 {
		t.Fatalf("format %s, %d requests, skipped %v", tr.Format, len(tr.Requests), tr.Skipped)
	}
	b, a := tr.Requests[0], tr.Requests[1]
	if b.ID != "b" || !equal64(b.Tokens, []int64{5, 6, 7}) || a.ID != "a" || *a.Scope.CacheSalt != "s" || *a.Scope.LoRATaskID != 0 || a.OutputLength != 4 {
		t.Fatalf("requests %+v %+v", b, a)
	}
}

func TestPrepareKeepsPartialTails(t *testing.T) {
	for _, tt := range []struct {
		input, T, tokens int
	}{
		{512, 16, 16}, {513, 16, 17}, {1000, 16, 31}, {1023, 16, 31}, {1024, 16, 32}, {1, 16, 1}, {1000, 512, 1000},
	} {
		ids := make([]int64, (tt.input+511)/512)
		r := Request{InputLength: tt.input, HashIDs: ids}
		pr := prepare(FormatMooncake, r, tt.T)
		if pr.tokens != tt.tokens {
			t.Errorf("input %d T %d: %d replay tokens, want %d", tt.input, tt.T, pr.tokens, tt.tokens)
		}
		if got := pr.realTokens(FormatMooncake, pr.tokens, tt.T); got != int64(tt.input) {
			t.Errorf("input %d T %d: whole prompt maps back to %d trace tokens", tt.input, tt.T, got)
		}
	}
}

func FuzzReadTrace(f *testing.F) {
	f.Add(`{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`, false)
	f.Add(`{"id": "a", "arrival_ms": 1, "tokens": [1, 2]}`, true)
	f.Add("{\"timestamp\": 1e300}\nnot json", true)
	f.Fuzz(func(t *testing.T, in string, skip bool) {
		tr, err := ReadTrace("fuzz", strings.NewReader(in), ReadOptions{SkipBad: skip, Open: func(string) (io.ReadCloser, error) {
			return nil, errors.New("no files")
		}})
		if err != nil {
			return
		}
		for i, r := range tr.Requests {
			if r.InputLength < 1 || r.Line < 1 || (i > 0 && r.Arrival < tr.Requests[i-1].Arrival) {
				t.Fatalf("bad request %+v", r)
			}
		}
	})
}

func equalInts(a, b []int) bool {
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

func equal64(a, b []int64) bool {
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
