package mooncake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvctl/kvctl/pool"
)

// Errors an AdminClient call can wrap; test with errors.Is.
var (
	// ErrUnreachable means no HTTP answer came back: connection refused, DNS, timeout.
	ErrUnreachable = errors.New("unreachable")
	// ErrMalformedResponse means the server answered with a body the client cannot parse.
	ErrMalformedResponse = errors.New("malformed response")
	// ErrKeyNotFound means the master reported OBJECT_NOT_FOUND (-704) for the key.
	ErrKeyNotFound = errors.New("object not found")
	// ErrSegmentNotFound means /query_segment did not know the segment.
	ErrSegmentNotFound = errors.New("segment not found")
)

// maxAdminBody bounds how much of a response the client reads.
const maxAdminBody = 64 << 20

// StatusError is an unexpected HTTP status from the admin server, with the master's error code
// and message when the body carried them.
type StatusError struct {
	URL        string
	StatusCode int
	Code       Code   // 0 when the body had no error_code
	Message    string // error_message or error, else the start of the body
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("mooncake admin %s: HTTP %d", e.URL, e.StatusCode)
	if e.Code != 0 {
		msg += fmt.Sprintf(" (error_code %d)", e.Code)
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Unwrap maps the master's error codes to this package's sentinels.
func (e *StatusError) Unwrap() error {
	switch {
	case e.Code == ErrObjectNotFound:
		return ErrKeyNotFound
	case e.StatusCode == http.StatusInternalServerError && e.Message == "Failed to query segment":
		return ErrSegmentNotFound
	}
	return nil
}

// AdminClient speaks the Mooncake master's HTTP admin API (default port 9003). It works against
// a real master and against NewAdminHandler. It is safe for concurrent use.
type AdminClient struct {
	base string
	hc   *http.Client
}

// NewAdminClient returns a client for the admin server at baseURL ("http://host:9003"; a bare
// "host:port" gets http://). A nil httpClient means http.DefaultClient.
func NewAdminClient(baseURL string, httpClient *http.Client) (*AdminClient, error) {
	if !strings.Contains(baseURL, "://") {
		baseURL = "http://" + baseURL
	}
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("mooncake admin address %q: want http://host:port", baseURL)
	}
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	return &AdminClient{base: strings.TrimRight(u.String(), "/"), hc: httpClient}, nil
}

// BaseURL returns the server address the client talks to.
func (c *AdminClient) BaseURL() string { return c.base }

// get fetches path and returns the body when the status is one of ok; any other status is a
// *StatusError.
func (c *AdminClient) get(ctx context.Context, path string, ok ...int) ([]byte, error) {
	u := c.base + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("mooncake admin %s: %w", u, err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("mooncake admin %s: %w", u, ctx.Err())
		}
		return nil, fmt.Errorf("mooncake admin %s: %w: %w", u, ErrUnreachable, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAdminBody+1))
	if err != nil {
		return nil, fmt.Errorf("mooncake admin %s: reading body: %w: %w", u, ErrUnreachable, err)
	}
	if len(body) > maxAdminBody {
		return nil, fmt.Errorf("mooncake admin %s: %w: body larger than %d bytes", u, ErrMalformedResponse, maxAdminBody)
	}
	for _, s := range ok {
		if resp.StatusCode == s {
			return body, nil
		}
	}
	se := &StatusError{URL: u, StatusCode: resp.StatusCode}
	var shaped struct {
		Code    *int   `json:"error_code"`
		Message string `json:"error_message"`
		Error   string `json:"error"`
	}
	if json.Unmarshal(body, &shaped) == nil {
		if shaped.Code != nil {
			se.Code = Code(*shaped.Code)
		}
		se.Message = shaped.Message
		if se.Message == "" {
			se.Message = shaped.Error
		}
	} else {
		se.Message = strings.TrimSpace(string(body[:min(len(body), 200)]))
	}
	return nil, se
}

func malformed(c *AdminClient, path, format string, a ...any) error {
	return fmt.Errorf("mooncake admin %s%s: %w: %s", c.base, path, ErrMalformedResponse, fmt.Sprintf(format, a...))
}

// Health is the master's /health answer.
type Health struct {
	Status        string          `json:"status"`
	Role          string          `json:"role"`
	HAState       string          `json:"ha_state"`
	ServiceReady  bool            `json:"service_ready"`
	LeaderAddress *string         `json:"leader_address"`
	ViewVersion   json.RawMessage `json:"view_version"`
}

// Health calls /health.
func (c *AdminClient) Health(ctx context.Context) (Health, error) {
	body, err := c.get(ctx, "/health", http.StatusOK)
	if err != nil {
		return Health{}, err
	}
	var h Health
	if err := json.Unmarshal(body, &h); err != nil {
		return Health{}, malformed(c, "/health", "%v", err)
	}
	if h.Status == "" {
		return Health{}, malformed(c, "/health", "no status field")
	}
	return h, nil
}

// QueryKey calls /query_key. On a real master and on NewAdminHandler this grants the key a
// read lease and counts as a get; use BatchQueryKeys to look without side effects. A missing
// key gives an error that wraps ErrKeyNotFound.
func (c *AdminClient) QueryKey(ctx context.Context, key string) ([]ReplicaDesc, error) {
	path := "/query_key?key=" + masterQueryEscape(key)
	body, err := c.get(ctx, path, http.StatusOK)
	if err != nil {
		return nil, err
	}
	var r struct {
		Success bool          `json:"success"`
		Data    []ReplicaDesc `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, malformed(c, path, "%v", err)
	}
	if !r.Success {
		return nil, malformed(c, path, "success is false with status 200")
	}
	return r.Data, nil
}

// BatchKeyResult is one key of a /batch_query_keys answer. DiskValues, LocalDiskValues and
// NoFValues are kept raw: the embedded pool never has them and their shape varies by version.
type BatchKeyResult struct {
	OK              bool            `json:"ok"`
	Error           *string         `json:"error"`
	Values          []ReplicaDesc   `json:"values"`
	DiskValues      json.RawMessage `json:"disk_values"`
	LocalDiskValues json.RawMessage `json:"local_disk_values"`
	NoFValues       json.RawMessage `json:"nof_values"`
}

// BatchQueryKeys calls /batch_query_keys, which is read-only: no lease, no counters. Keys may
// not contain a comma (the endpoint splits on it). The answer has one entry per distinct key.
func (c *AdminClient) BatchQueryKeys(ctx context.Context, keys []string) (map[string]BatchKeyResult, error) {
	if len(keys) == 0 {
		return map[string]BatchKeyResult{}, nil
	}
	for _, k := range keys {
		if strings.Contains(k, ",") {
			return nil, fmt.Errorf("mooncake admin %s/batch_query_keys: key %q contains a comma", c.base, k)
		}
	}
	esc := make([]string, len(keys))
	for i, k := range keys {
		esc[i] = masterQueryEscape(k)
	}
	path := "/batch_query_keys?keys=" + strings.Join(esc, ",")
	body, err := c.get(ctx, path, http.StatusOK)
	if err != nil {
		return nil, err
	}
	var r struct {
		Success bool                      `json:"success"`
		Data    map[string]BatchKeyResult `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, malformed(c, "/batch_query_keys", "%v", err)
	}
	if !r.Success || r.Data == nil {
		return nil, malformed(c, "/batch_query_keys", "no data in a 200 answer")
	}
	return r.Data, nil
}

func splitLines(body []byte) []string {
	out := []string{}
	for _, l := range strings.Split(string(body), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// AllKeys calls /get_all_keys (the default tenant's readable keys, in the server's order).
func (c *AdminClient) AllKeys(ctx context.Context) ([]string, error) {
	body, err := c.get(ctx, "/get_all_keys", http.StatusOK)
	if err != nil {
		return nil, err
	}
	return splitLines(body), nil
}

// AllSegments calls /get_all_segments.
func (c *AdminClient) AllSegments(ctx context.Context) ([]string, error) {
	body, err := c.get(ctx, "/get_all_segments", http.StatusOK)
	if err != nil {
		return nil, err
	}
	return splitLines(body), nil
}

// QuerySegment calls /query_segment. An unknown segment gives an error that wraps
// ErrSegmentNotFound (the master answers 500 "Failed to query segment").
func (c *AdminClient) QuerySegment(ctx context.Context, name string) (pool.Segment, error) {
	path := "/query_segment?segment=" + masterQueryEscape(name)
	body, err := c.get(ctx, path, http.StatusOK)
	if err != nil {
		return pool.Segment{}, err
	}
	return parseQuerySegment(body, func(format string, a ...any) error { return malformed(c, path, format, a...) })
}

func parseQuerySegment(body []byte, bad func(string, ...any) error) (pool.Segment, error) {
	ls := splitLines(body)
	if len(ls) != 3 {
		return pool.Segment{}, bad("want 3 lines, got %d", len(ls))
	}
	s := pool.Segment{Name: ls[0]}
	var sawUsed, sawCapacity bool
	for _, l := range ls[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			return pool.Segment{}, bad("line %q has no colon", l)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return pool.Segment{}, bad("line %q: %v", l, err)
		}
		if n < 0 {
			return pool.Segment{}, bad("line %q: a negative byte count", l)
		}
		switch strings.TrimSpace(k) {
		case "Used(bytes)":
			if sawUsed {
				return pool.Segment{}, bad("Used(bytes) given twice")
			}
			s.Used, sawUsed = n, true
		case "Capacity(bytes)":
			if sawCapacity {
				return pool.Segment{}, bad("Capacity(bytes) given twice")
			}
			s.Capacity, sawCapacity = n, true
		default:
			return pool.Segment{}, bad("unknown field in line %q", l)
		}
	}
	return s, nil
}

// MetricSample is one sample of a Prometheus text exposition.
type MetricSample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// MasterMetrics is a parsed /metrics answer.
type MasterMetrics struct {
	Types   map[string]string // family name → counter, gauge, histogram, ...
	Samples []MetricSample
}

// Value returns the value of the first sample named name, whatever its labels.
func (m MasterMetrics) Value(name string) (float64, bool) {
	for _, s := range m.Samples {
		if s.Name == name {
			return s.Value, true
		}
	}
	return 0, false
}

// Metrics calls /metrics and parses the Prometheus text.
func (c *AdminClient) Metrics(ctx context.Context) (MasterMetrics, error) {
	body, err := c.get(ctx, "/metrics", http.StatusOK)
	if err != nil {
		return MasterMetrics{}, err
	}
	m, err := ParsePromText(body)
	if err != nil {
		return MasterMetrics{}, malformed(c, "/metrics", "%v", err)
	}
	return m, nil
}

// ParsePromText parses Prometheus text format 0.0.4 with the Prometheus text parser
// (expfmt), flattened into samples as they are written: a histogram's _bucket (labelled le),
// _sum and _count, a summary's quantiles, _sum and _count. Families come in name order, their
// samples in text order. Types holds every family that declares a type (untyped ones are left
// out, as a family with no TYPE line is untyped).
func ParsePromText(body []byte) (MasterMetrics, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return MasterMetrics{}, err
	}
	m := MasterMetrics{Types: map[string]string{}}
	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		f := fams[name]
		if f.GetType() != dto.MetricType_UNTYPED {
			m.Types[name] = strings.ToLower(f.GetType().String())
		}
		for _, x := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range x.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			with := func(k, v string) map[string]string {
				out := make(map[string]string, len(labels)+1)
				for a, b := range labels {
					out[a] = b
				}
				out[k] = v
				return out
			}
			add := func(n string, l map[string]string, v float64) {
				m.Samples = append(m.Samples, MetricSample{Name: n, Labels: l, Value: v})
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(name, labels, x.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, labels, x.GetGauge().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := x.GetHistogram()
				for _, b := range h.GetBucket() {
					add(name+"_bucket", with("le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)), float64(b.GetCumulativeCount()))
				}
				add(name+"_sum", labels, h.GetSampleSum())
				add(name+"_count", labels, float64(h.GetSampleCount()))
			case dto.MetricType_SUMMARY:
				sm := x.GetSummary()
				for _, q := range sm.GetQuantile() {
					add(name, with("quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)), q.GetValue())
				}
				add(name+"_sum", labels, sm.GetSampleSum())
				add(name+"_count", labels, float64(sm.GetSampleCount()))
			default:
				add(name, labels, x.GetUntyped().GetValue())
			}
		}
	}
	return m, nil
}

// Summary is a parsed /metrics/summary line. Raw keeps the whole line; the typed fields are the
// ones kvctl reports.
type Summary struct {
	Raw              string
	Role             string
	State            string
	ServiceReady     bool
	Keys             int64
	SoftPinnedKeys   int64
	EvictionSuccess  int64
	EvictionAttempts int64
	EvictedKeys      int64
}

var (
	summaryHead  = regexp.MustCompile(`^role=([^,]*), state=([^,]*), service_ready=(true|false), master=\{`)
	summaryKeys  = regexp.MustCompile(`Keys: (\d+) \(soft-pinned: (\d+)\)`)
	summaryEvict = regexp.MustCompile(`\| Eviction: Success/Attempts=(\d+)/(\d+),.*? keys=(\d+),`)
)

// MetricsSummary calls /metrics/summary.
func (c *AdminClient) MetricsSummary(ctx context.Context) (Summary, error) {
	body, err := c.get(ctx, "/metrics/summary", http.StatusOK)
	if err != nil {
		return Summary{}, err
	}
	s, err := ParseSummary(string(body))
	if err != nil {
		return Summary{}, malformed(c, "/metrics/summary", "%v", err)
	}
	return s, nil
}

// ParseSummary parses the master's one-line summary.
func ParseSummary(line string) (Summary, error) {
	line = strings.TrimSpace(line)
	s := Summary{Raw: line}
	h := summaryHead.FindStringSubmatch(line)
	if h == nil {
		return s, errors.New("summary does not start with role=..., state=..., service_ready=..., master={")
	}
	s.Role, s.State, s.ServiceReady = h[1], h[2], h[3] == "true"
	k := summaryKeys.FindStringSubmatch(line)
	if k == nil {
		return s, errors.New("summary has no Keys: N (soft-pinned: M)")
	}
	s.Keys, _ = strconv.ParseInt(k[1], 10, 64)
	s.SoftPinnedKeys, _ = strconv.ParseInt(k[2], 10, 64)
	ev := summaryEvict.FindStringSubmatch(line)
	if ev == nil {
		return s, errors.New("summary has no Eviction: Success/Attempts=s/t ... keys=k")
	}
	s.EvictionSuccess, _ = strconv.ParseInt(ev[1], 10, 64)
	s.EvictionAttempts, _ = strconv.ParseInt(ev[2], 10, 64)
	s.EvictedKeys, _ = strconv.ParseInt(ev[3], 10, 64)
	return s, nil
}

func (c *AdminClient) text(ctx context.Context, path string) (string, error) {
	body, err := c.get(ctx, path, http.StatusOK)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(body)), nil
}

// Role calls /role ("leader", "standby", ...).
func (c *AdminClient) Role(ctx context.Context) (string, error) { return c.text(ctx, "/role") }

// HAStatus calls /ha_status ("serving", ...).
func (c *AdminClient) HAStatus(ctx context.Context) (string, error) {
	return c.text(ctx, "/ha_status")
}

// Leader is the master's /leader answer.
type Leader struct {
	Present       bool            `json:"present"`
	LeaderAddress *string         `json:"leader_address"`
	ViewVersion   json.RawMessage `json:"view_version"`
}

func (c *AdminClient) getJSON(ctx context.Context, path string, v any) error {
	body, err := c.get(ctx, path, http.StatusOK)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return malformed(c, path, "%v", err)
	}
	return nil
}

// Leader calls /leader.
func (c *AdminClient) Leader(ctx context.Context) (Leader, error) {
	var l Leader
	err := c.getJSON(ctx, "/leader", &l)
	return l, err
}

// KVEventsStatus is the master's /kv_events/status answer.
type KVEventsStatus struct {
	Enabled             bool  `json:"enabled"`
	PublishedBatches    int64 `json:"published_batches"`
	PublishedEvents     int64 `json:"published_events"`
	DroppedEvents       int64 `json:"dropped_events"`
	SkippedUnparsedKeys int64 `json:"skipped_unparsed_keys"`
}

// KVEventsStatus calls /kv_events/status.
func (c *AdminClient) KVEventsStatus(ctx context.Context) (KVEventsStatus, error) {
	var s KVEventsStatus
	err := c.getJSON(ctx, "/kv_events/status", &s)
	return s, err
}

// SegmentDetail is one entry of /get_segments_detail.
type SegmentDetail struct {
	Name                   string  `json:"segment_name"`
	ID                     string  `json:"segment_id"`
	ClientID               string  `json:"client_id"`
	BaseAddress            string  `json:"base_address"`
	SizeBytes              int64   `json:"size_bytes"`
	SizeHuman              string  `json:"size_human"`
	TEEndpoint             string  `json:"te_endpoint"`
	Protocol               string  `json:"protocol"`
	Status                 string  `json:"status"`
	AllocatorUsedBytes     int64   `json:"allocator_used_bytes"`
	AllocatorCapacityBytes int64   `json:"allocator_capacity_bytes"`
	AllocatorUsagePercent  float64 `json:"allocator_usage_percent"`
}

// SegmentsDetail calls /get_segments_detail.
func (c *AdminClient) SegmentsDetail(ctx context.Context) ([]SegmentDetail, error) {
	var r struct {
		Total    *int            `json:"total_segments"`
		Segments []SegmentDetail `json:"segments"`
	}
	if err := c.getJSON(ctx, "/get_segments_detail", &r); err != nil {
		return nil, err
	}
	if r.Total == nil || *r.Total != len(r.Segments) {
		return nil, malformed(c, "/get_segments_detail", "total_segments does not match the list")
	}
	return r.Segments, nil
}

// SegmentStatus calls /api/v1/segments/status and returns the status name ("OK", ...).
func (c *AdminClient) SegmentStatus(ctx context.Context, segment string) (string, error) {
	var r struct {
		Success    bool   `json:"success"`
		StatusName string `json:"status_name"`
	}
	path := "/api/v1/segments/status?segment=" + masterQueryEscape(segment)
	if err := c.getJSON(ctx, path, &r); err != nil {
		return "", err
	}
	if !r.Success {
		return "", malformed(c, path, "success is false with status 200")
	}
	return r.StatusName, nil
}

// masterQueryEscape escapes a query value for the real master, whose HTTP server does not
// percent-decode query values: "/query_segment?segment=127.0.0.1%3A12345" finds no segment.
// Characters RFC 3986 allows in a query as they are (":", "/", "@" and the sub-delimiters
// other than "&", "+" and "=") are sent unescaped, so segment names and most keys arrive
// intact; the rest are escaped as url.QueryEscape does.
func masterQueryEscape(s string) string {
	return queryUnescaper.Replace(url.QueryEscape(s))
}

var queryUnescaper = strings.NewReplacer("%3A", ":", "%2F", "/", "%40", "@", "%21", "!", "%24", "$",
	"%27", "'", "%28", "(", "%29", ")", "%2A", "*", "%2C", ",", "%3B", ";")
