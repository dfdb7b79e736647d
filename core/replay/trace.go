package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kvctl/kvctl/core/boundedio"
	"github.com/kvctl/kvctl/core/keys"
)

// Trace formats.
const (
	FormatAuto     = "auto"
	FormatMooncake = "mooncake"
	FormatTokens   = "tokens"
)

// TraceBlockTokens is the block size of the Mooncake FAST'25 traces' hash_ids.
const TraceBlockTokens = 512

// maxLineBytes bounds one trace line.
const maxLineBytes = 64 << 20

// ErrMalformed is wrapped by the error ReadTrace returns for malformed lines.
var ErrMalformed = errors.New("malformed trace")

// Request is one trace record.
type Request struct {
	// Line is the 1-based line of the record in the trace file.
	Line int
	// ID names the request; Mooncake records get "r<line>".
	ID string
	// ConversationID groups the turns of one conversation; "" when unknown. Mooncake records
	// carry none: it is inferred as the first two hash ids (the shared system block and the
	// conversation's own first block), which later turns repeat.
	ConversationID string
	// Arrival is the time since the start of the trace.
	Arrival time.Duration
	// InputLength and OutputLength are in trace tokens.
	InputLength  int
	OutputLength int
	// HashIDs are the Mooncake trace block ids (nil for token traces).
	HashIDs []int64
	// Tokens is the prompt of a token trace (nil for Mooncake records).
	Tokens []int64
	// Scope is the cache salt and LoRA id of a token trace record.
	Scope keys.Scope
}

// LineError is one malformed line.
type LineError struct {
	Line int    `json:"line"`
	Err  string `json:"error"`
}

func (e LineError) String() string { return fmt.Sprintf("line %d: %s", e.Line, e.Err) }

// TraceError lists the malformed lines of a trace read without SkipBad.
type TraceError struct {
	Name  string
	Lines []LineError
}

func (e *TraceError) Error() string {
	const show = 5
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d malformed line(s)", e.Name, len(e.Lines))
	for i, l := range e.Lines {
		if i == show {
			fmt.Fprintf(&b, "; and %d more", len(e.Lines)-show)
			break
		}
		b.WriteString("; ")
		b.WriteString(l.String())
	}
	b.WriteString(" (--skip-bad continues past them)")
	return b.String()
}

func (e *TraceError) Unwrap() error { return ErrMalformed }

// Trace is a parsed trace.
type Trace struct {
	Name   string
	Format string
	// Requests are in arrival order (stable for equal arrivals).
	Requests []Request
	// Skipped are the malformed lines left out under SkipBad.
	Skipped []LineError
}

// ReadOptions configures ReadTrace.
type ReadOptions struct {
	// Format is FormatAuto (the default when empty), FormatMooncake or FormatTokens. Auto picks
	// Mooncake when the first record has hash_ids.
	Format string
	// SkipBad leaves malformed lines out (listed in Trace.Skipped) instead of failing.
	SkipBad bool
	// Dir resolves relative tokens_file paths of a token trace; "" is the working directory.
	Dir string
	// Open opens a tokens_file; nil opens it through boundedio's MaxTraceBytes limit.
	Open func(name string) (io.ReadCloser, error)
	// Context interrupts reading the trace and its token files; nil is context.Background().
	Context context.Context
}

// ReadTraceFile reads the trace at path; token files are resolved next to it.
func ReadTraceFile(path string, opts ReadOptions) (*Trace, error) {
	ctx := opts.Context
	if ctx == nil {
		ctx = context.Background()
	}
	// Through a hard limit whatever stat says, interrupted by ctx: a trace named /dev/zero or a
	// FIFO must neither exhaust memory nor hang.
	f, err := boundedio.Open(ctx, path, boundedio.MaxTraceBytes)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if opts.Dir == "" {
		opts.Dir = filepath.Dir(path)
	}
	return ReadTrace(path, f, opts)
}

// ReadTrace reads a trace from r; name is used in errors. Without SkipBad a trace with any
// malformed line fails with a *TraceError listing every one.
func ReadTrace(name string, r io.Reader, opts ReadOptions) (*Trace, error) {
	format := opts.Format
	if format == "" {
		format = FormatAuto
	}
	if format != FormatAuto && format != FormatMooncake && format != FormatTokens {
		return nil, fmt.Errorf("trace format %q: want %s, %s or %s", format, FormatAuto, FormatMooncake, FormatTokens)
	}
	t := &Trace{Name: name, Format: format}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 256<<10), maxLineBytes)
	var bad []LineError
	line := 0
	for sc.Scan() {
		line++
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 || raw[0] == '#' {
			continue
		}
		if t.Format == FormatAuto {
			t.Format = detect(raw)
		}
		var req Request
		var err error
		if t.Format == FormatMooncake {
			req, err = parseMooncake(raw)
		} else {
			req, err = parseTokenRecord(raw, opts)
		}
		if err != nil {
			bad = append(bad, LineError{Line: line, Err: err.Error()})
			continue
		}
		req.Line = line
		if req.ID == "" {
			req.ID = "r" + strconv.Itoa(line)
		}
		t.Requests = append(t.Requests, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%s: line %d is longer than %d bytes", name, line+1, maxLineBytes)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if t.Format == FormatAuto {
		t.Format = FormatMooncake
	}
	if len(bad) > 0 && !opts.SkipBad {
		return nil, &TraceError{Name: name, Lines: bad}
	}
	t.Skipped = bad
	if t.Format == FormatTokens {
		seen := make(map[string]int, len(t.Requests))
		kept := t.Requests[:0]
		for _, r := range t.Requests {
			if first, dup := seen[r.ID]; dup {
				le := LineError{Line: r.Line, Err: fmt.Sprintf("request id %q already used on line %d", r.ID, first)}
				if !opts.SkipBad {
					return nil, &TraceError{Name: name, Lines: []LineError{le}}
				}
				t.Skipped = append(t.Skipped, le)
				continue
			}
			seen[r.ID] = r.Line
			kept = append(kept, r)
		}
		t.Requests = kept
	}
	sort.SliceStable(t.Requests, func(i, j int) bool { return t.Requests[i].Arrival < t.Requests[j].Arrival })
	if len(t.Requests) == 0 {
		return nil, fmt.Errorf("%s: %w: no requests", name, ErrMalformed)
	}
	return t, nil
}

func detect(raw []byte) string {
	var probe map[string]json.RawMessage
	if json.Unmarshal(raw, &probe) == nil {
		if _, ok := probe["hash_ids"]; ok {
			return FormatMooncake
		}
		return FormatTokens
	}
	return FormatMooncake
}

type mooncakeRecord struct {
	Timestamp    *json.Number `json:"timestamp"`
	InputLength  *int64       `json:"input_length"`
	OutputLength *int64       `json:"output_length"`
	HashIDs      []int64      `json:"hash_ids"`
}

func decodeStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return cleanJSONError(err)
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

func cleanJSONError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("%s: want %s, got JSON %s", te.Field, te.Type, te.Value)
	}
	return fmt.Errorf("not a JSON object: %w", err)
}

func parseArrival(n *json.Number, field string) (time.Duration, error) {
	if n == nil {
		return 0, fmt.Errorf("%s is missing", field)
	}
	ms, err := n.Float64()
	if err != nil || math.IsNaN(ms) || math.IsInf(ms, 0) || ms < 0 || ms > 1e12 {
		return 0, fmt.Errorf("%s %s: want milliseconds from 0 to 1e12", field, n.String())
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

func parseMooncake(raw []byte) (Request, error) {
	var rec mooncakeRecord
	if err := decodeStrict(raw, &rec); err != nil {
		return Request{}, err
	}
	arrival, err := parseArrival(rec.Timestamp, "timestamp")
	if err != nil {
		return Request{}, err
	}
	switch {
	case rec.InputLength == nil:
		return Request{}, errors.New("input_length is missing")
	case *rec.InputLength < 1 || *rec.InputLength > 1<<30:
		return Request{}, fmt.Errorf("input_length %d: want 1 to %d", *rec.InputLength, 1<<30)
	case rec.OutputLength == nil:
		return Request{}, errors.New("output_length is missing")
	case *rec.OutputLength < 0 || *rec.OutputLength > 1<<30:
		return Request{}, fmt.Errorf("output_length %d: want 0 to %d", *rec.OutputLength, 1<<30)
	case rec.HashIDs == nil:
		return Request{}, errors.New("hash_ids is missing")
	}
	in := int(*rec.InputLength)
	if want := (in + TraceBlockTokens - 1) / TraceBlockTokens; len(rec.HashIDs) != want {
		return Request{}, fmt.Errorf("%d hash_ids for input_length %d: want ceil(%d/%d) = %d", len(rec.HashIDs), in, in, TraceBlockTokens, want)
	}
	for i, h := range rec.HashIDs {
		if h < 0 {
			return Request{}, fmt.Errorf("hash_ids[%d] = %d is negative", i, h)
		}
	}
	conv := strconv.FormatInt(rec.HashIDs[0], 10)
	if len(rec.HashIDs) > 1 {
		conv += "/" + strconv.FormatInt(rec.HashIDs[1], 10)
	}
	return Request{
		ConversationID: conv, Arrival: arrival, InputLength: in,
		OutputLength: int(*rec.OutputLength), HashIDs: rec.HashIDs,
	}, nil
}

type tokenRecord struct {
	ID             *string      `json:"id"`
	ConversationID string       `json:"conversation_id"`
	ArrivalMs      *json.Number `json:"arrival_ms"`
	Tokens         []int64      `json:"tokens"`
	TokensFile     string       `json:"tokens_file"`
	OutputLength   *int64       `json:"output_length"`
	CacheSalt      *string      `json:"cache_salt"`
	LoRAID         *int64       `json:"lora_id"`
}

func parseTokenRecord(raw []byte, opts ReadOptions) (Request, error) {
	var rec tokenRecord
	if err := decodeStrict(raw, &rec); err != nil {
		return Request{}, err
	}
	if rec.ID == nil || *rec.ID == "" {
		return Request{}, errors.New("id is missing")
	}
	arrival, err := parseArrival(rec.ArrivalMs, "arrival_ms")
	if err != nil {
		return Request{}, err
	}
	out := 0
	if rec.OutputLength != nil {
		if *rec.OutputLength < 0 || *rec.OutputLength > 1<<30 {
			return Request{}, fmt.Errorf("output_length %d: want 0 to %d", *rec.OutputLength, 1<<30)
		}
		out = int(*rec.OutputLength)
	}
	toks := rec.Tokens
	switch {
	case toks != nil && rec.TokensFile != "":
		return Request{}, errors.New("give tokens or tokens_file, not both")
	case rec.TokensFile != "":
		toks, err = readTokenFile(rec.TokensFile, opts)
		if err != nil {
			return Request{}, err
		}
	case toks == nil:
		return Request{}, errors.New("tokens (or tokens_file) is missing")
	}
	if len(toks) == 0 {
		return Request{}, errors.New("the prompt has no tokens")
	}
	for i, v := range toks {
		if v < 0 || v > math.MaxInt32 {
			return Request{}, fmt.Errorf("token %d: %d is outside 0..%d", i, v, math.MaxInt32)
		}
	}
	return Request{
		ID: *rec.ID, ConversationID: rec.ConversationID, Arrival: arrival,
		InputLength: len(toks), OutputLength: out, Tokens: toks,
		Scope: keys.Scope{CacheSalt: rec.CacheSalt, LoRATaskID: rec.LoRAID},
	}, nil
}

func readTokenFile(name string, opts ReadOptions) ([]int64, error) {
	path := name
	if !filepath.IsAbs(path) && opts.Dir != "" {
		path = filepath.Join(opts.Dir, path)
	}
	var rc io.ReadCloser
	var err error
	if opts.Open != nil {
		rc, err = opts.Open(path)
	} else {
		ctx := opts.Context
		if ctx == nil {
			ctx = context.Background()
		}
		rc, err = boundedio.Open(ctx, path, boundedio.MaxTraceBytes)
	}
	if err != nil {
		return nil, fmt.Errorf("tokens_file: %w", err)
	}
	defer rc.Close()
	toks, err := keys.ParseTokens(bufio.NewReaderSize(rc, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("tokens_file %s: %w", name, err)
	}
	return toks, nil
}
