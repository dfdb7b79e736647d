package main

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// FuzzReadTrace fuzzes the JSONL trace reader. An accepted trace has at least one request,
// each with 1 to maxRequestBlocks hash ids, an input length its blocks cover with the last one
// non-empty, and timestamps that never go back; written back as JSONL it reads the same.
func FuzzReadTrace(f *testing.F) {
	for _, s := range []string{
		`{"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}` + "\n" +
			`{"timestamp": 3052, "input_length": 512, "output_length": 1, "hash_ids": [46]}`,
		`{"timestamp": 5, "input_length": 1, "hash_ids": [18446744073709551615]}` + "\n\n",
		`{"timestamp": 5, "input_length": 513, "hash_ids": [1]}`,
		`{"timestamp": 5, "input_length": 512, "hash_ids": [1, 2]}`,
		`{"timestamp": 5, "input_length": 1, "hash_ids": []}`,
		`{"timestamp": 5, "input_length": 1, "hash_ids": [1]}` + "\n" + `{"timestamp": 4, "input_length": 1, "hash_ids": [1]}`,
		`{"timestamp": 1e3, "input_length": 1, "hash_ids": [1]}`,
		"", "\n", "not json",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		reqs, err := ReadTrace(strings.NewReader(in))
		if err != nil {
			if reqs != nil {
				t.Fatal("requests and an error")
			}
			return
		}
		if len(reqs) == 0 {
			t.Fatal("accepted a trace without requests")
		}
		var buf bytes.Buffer
		for i, q := range reqs {
			n := len(q.Hashes)
			if n == 0 || n > maxRequestBlocks || q.InputLength <= (n-1)*TraceBlockTokens || q.InputLength > n*TraceBlockTokens {
				t.Fatalf("request %d: %d hash ids for input_length %d", i, n, q.InputLength)
			}
			if i > 0 && q.Timestamp < reqs[i-1].Timestamp {
				t.Fatalf("request %d goes back in time", i)
			}
			line, err := json.Marshal(q)
			if err != nil {
				t.Fatal(err)
			}
			buf.Write(line)
			buf.WriteByte('\n')
		}
		back, err := ReadTrace(&buf)
		if err != nil || !reflect.DeepEqual(back, reqs) {
			t.Fatalf("trace written back reads as %+v, %v; want %+v", back, err, reqs)
		}
	})
}
