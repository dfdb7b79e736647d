package mooncake

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/kvctl/kvctl/pool"
)

// Content types the master's admin server (cinatra) sends.
const (
	contentTypeJSON = "application/json; charset=utf-8"
	contentTypeProm = "text/plain; version=0.0.4"
	contentTypeText = "text/plain; charset=utf-8"
)

// AdminHandlerOptions bounds what one admin request may ask for.
type AdminHandlerOptions struct {
	// MaxBatchKeys caps the number of keys of one /batch_query_keys request.
	MaxBatchKeys int
	// MaxQueryBytes caps the length of a request's raw query string.
	MaxQueryBytes int
	// Role and HAState are what /health, /role and /ha_status report.
	Role, HAState string
}

// DefaultAdminHandlerOptions returns the limits kvctl serves with.
func DefaultAdminHandlerOptions() AdminHandlerOptions {
	return AdminHandlerOptions{MaxBatchKeys: 10000, MaxQueryBytes: 1 << 20, Role: "leader", HAState: "serving"}
}

// NewAdminHandler returns an http.Handler serving the Mooncake master's admin read endpoints
// (reference §1.3) over insp, with the master's status codes, content types and body formats:
// /health, /metrics, /metrics/summary, /query_key, /batch_query_keys, /get_all_keys,
// /get_all_segments, /query_segment, /get_segments_detail, /role, /ha_status, /leader and
// /kv_events/status. Like the master, /query_key grants a read lease and /batch_query_keys does
// not. Unknown paths and wrong methods get the master's plain 404.
func NewAdminHandler(insp Inspector, opts AdminHandlerOptions) http.Handler {
	d := DefaultAdminHandlerOptions()
	if opts.MaxBatchKeys <= 0 {
		opts.MaxBatchKeys = d.MaxBatchKeys
	}
	if opts.MaxQueryBytes <= 0 {
		opts.MaxQueryBytes = d.MaxQueryBytes
	}
	if opts.Role == "" {
		opts.Role = d.Role
	}
	if opts.HAState == "" {
		opts.HAState = d.HAState
	}
	h := &adminHandler{insp: insp, opts: opts}
	h.routes = map[string]http.HandlerFunc{
		"/health":                  h.health,
		"/metrics":                 h.metrics,
		"/metrics/summary":         h.summary,
		"/query_key":               h.queryKey,
		"/batch_query_keys":        h.batchQuery,
		"/get_all_keys":            h.allKeys,
		"/get_all_segments":        h.allSegments,
		"/query_segment":           h.querySegment,
		"/get_segments_detail":     h.segmentsDetail,
		"/role":                    h.role,
		"/ha_status":               h.haStatus,
		"/leader":                  h.leader,
		"/kv_events/status":        h.kvEvents,
		"/api/v1/segments/status":  h.segmentStatus,
		"/api/v1/tenant_quotas":    h.tenantQuotas,
		"/api/v1/drain_jobs/query": h.drainQuery,
	}
	return h
}

type adminHandler struct {
	insp   Inspector
	opts   AdminHandlerOptions
	routes map[string]http.HandlerFunc
}

func (h *adminHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			writeBody(w, http.StatusInternalServerError, contentTypeJSON,
				[]byte(`{"success":false,"error_code":-1,"error_message":"INTERNAL_ERROR"}`))
		}
	}()
	fn, ok := h.routes[r.URL.Path]
	if !ok || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		notFound(w)
		return
	}
	if len(r.URL.RawQuery) > h.opts.MaxQueryBytes {
		writeBody(w, http.StatusRequestURITooLong, contentTypeJSON, mustJSON(map[string]any{
			"success": false, "error_code": int(ErrInvalidParams),
			"error_message": fmt.Sprintf("query string of %d bytes is above the limit of %d", len(r.URL.RawQuery), h.opts.MaxQueryBytes),
		}))
		return
	}
	fn(w, r)
}

// notFound is the master's answer to an unknown path or method: text with no Content-Type.
func notFound(w http.ResponseWriter) {
	w.Header()["Content-Type"] = nil
	w.Header().Set("Content-Length", "13")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write([]byte("404 Not Found"))
}

func writeBody(w http.ResponseWriter, status int, ctype string, body []byte) {
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func errorCodeBody(c Code) []byte {
	return mustJSON(struct {
		Success bool   `json:"success"`
		Code    int    `json:"error_code"`
		Message string `json:"error_message"`
	}{false, int(c), codeName(c)})
}

func (h *adminHandler) health(w http.ResponseWriter, _ *http.Request) {
	writeBody(w, http.StatusOK, contentTypeJSON, mustJSON(struct {
		Status        string  `json:"status"`
		Role          string  `json:"role"`
		HAState       string  `json:"ha_state"`
		ServiceReady  bool    `json:"service_ready"`
		LeaderAddress *string `json:"leader_address"`
		ViewVersion   *uint64 `json:"view_version"`
	}{"ok", h.opts.Role, h.opts.HAState, true, nil, nil}))
}

func (h *adminHandler) role(w http.ResponseWriter, _ *http.Request) {
	writeBody(w, http.StatusOK, contentTypeText, []byte(h.opts.Role))
}

func (h *adminHandler) haStatus(w http.ResponseWriter, _ *http.Request) {
	writeBody(w, http.StatusOK, contentTypeText, []byte(h.opts.HAState))
}

func (h *adminHandler) leader(w http.ResponseWriter, _ *http.Request) {
	writeBody(w, http.StatusOK, contentTypeJSON, []byte(`{"present":false,"leader_address":null,"view_version":null}`))
}

func (h *adminHandler) kvEvents(w http.ResponseWriter, _ *http.Request) {
	writeBody(w, http.StatusOK, contentTypeJSON,
		[]byte(`{"enabled":false,"published_batches":0,"published_events":0,"dropped_events":0,"skipped_unparsed_keys":0}`))
}

func (h *adminHandler) tenantQuotas(w http.ResponseWriter, _ *http.Request) {
	writeBody(w, http.StatusConflict, contentTypeJSON, errorCodeBody(ErrUnavailableInThisMode))
}

func (h *adminHandler) drainQuery(w http.ResponseWriter, _ *http.Request) {
	writeBody(w, http.StatusBadRequest, contentTypeJSON,
		[]byte(`{"success":false,"error_code":-600,"error_message":"Missing or invalid job_id"}`))
}

func (h *adminHandler) queryKey(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if key == "" {
		writeBody(w, http.StatusNotFound, contentTypeJSON, errorCodeBody(ErrObjectNotFound))
		return
	}
	reps, code := h.insp.QueryKey(r.Context(), key)
	if code != OK {
		status := http.StatusNotFound
		if code != ErrObjectNotFound {
			status = http.StatusInternalServerError
		}
		writeBody(w, status, contentTypeJSON, errorCodeBody(code))
		return
	}
	if reps == nil {
		reps = []ReplicaDesc{}
	}
	writeBody(w, http.StatusOK, contentTypeJSON, mustJSON(struct {
		Success bool          `json:"success"`
		Data    []ReplicaDesc `json:"data"`
	}{true, reps}))
}

// batchItem is one key of /batch_query_keys; every field is always present, null when unset.
type batchItem struct {
	OK              bool              `json:"ok"`
	Error           *string           `json:"error"`
	Values          []ReplicaDesc     `json:"values"`
	DiskValues      []json.RawMessage `json:"disk_values"`
	LocalDiskValues []json.RawMessage `json:"local_disk_values"`
	NoFValues       []json.RawMessage `json:"nof_values"`
}

func (h *adminHandler) batchQuery(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.Query().Get("keys")
	if raw == "" {
		writeBody(w, http.StatusBadRequest, contentTypeJSON,
			[]byte(`{"success":false,"error":"No keys provided. Use ?keys=key1,key2,..."}`))
		return
	}
	if n := strings.Count(raw, ",") + 1; n > h.opts.MaxBatchKeys {
		writeBody(w, http.StatusBadRequest, contentTypeJSON, mustJSON(map[string]any{
			"success": false,
			"error":   fmt.Sprintf("Too many keys: %d, at most %d per request", n, h.opts.MaxBatchKeys),
		}))
		return
	}
	ks := strings.Split(raw, ",")
	res := h.insp.BatchQuery(r.Context(), ks)
	names := make([]string, 0, len(res))
	for k := range res {
		names = append(names, k)
	}
	sort.Strings(names)
	// The master answers from a std::map: keys sorted bytewise, duplicates merged.
	var buf bytes.Buffer
	buf.WriteString(`{"success":true,"data":{`)
	for i, k := range names {
		if i > 0 {
			buf.WriteByte(',')
		}
		q := res[k]
		item := batchItem{OK: q.OK}
		if q.OK {
			item.Values = q.Replicas
			if item.Values == nil {
				item.Values = []ReplicaDesc{}
			}
		} else {
			e := q.Error
			item.Error = &e
		}
		buf.Write(mustJSON(k))
		buf.WriteByte(':')
		buf.Write(mustJSON(item))
	}
	buf.WriteString(`}}`)
	writeBody(w, http.StatusOK, contentTypeJSON, buf.Bytes())
}

func lines(items []string) []byte {
	var buf bytes.Buffer
	for _, s := range items {
		buf.WriteString(s)
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

func (h *adminHandler) allKeys(w http.ResponseWriter, r *http.Request) {
	ks, err := h.insp.Keys(r.Context())
	if err != nil {
		writeBody(w, http.StatusInternalServerError, contentTypeProm, []byte("Failed to get all keys"))
		return
	}
	writeBody(w, http.StatusOK, contentTypeProm, lines(ks))
}

func (h *adminHandler) allSegments(w http.ResponseWriter, r *http.Request) {
	segs, err := h.insp.Segments(r.Context())
	if err != nil {
		writeBody(w, http.StatusInternalServerError, contentTypeProm, []byte("Failed to get all segments"))
		return
	}
	names := make([]string, len(segs))
	for i, s := range segs {
		names[i] = s.Name
	}
	writeBody(w, http.StatusOK, contentTypeProm, lines(names))
}

func (h *adminHandler) findSegment(r *http.Request, name string) (pool.Segment, bool) {
	if name == "" {
		return pool.Segment{}, false
	}
	segs, err := h.insp.Segments(r.Context())
	if err != nil {
		return pool.Segment{}, false
	}
	for _, s := range segs {
		if s.Name == name {
			return s, true
		}
	}
	return pool.Segment{}, false
}

func (h *adminHandler) querySegment(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("segment")
	s, ok := h.findSegment(r, name)
	if !ok {
		writeBody(w, http.StatusInternalServerError, contentTypeProm, []byte("Failed to query segment"))
		return
	}
	writeBody(w, http.StatusOK, contentTypeProm,
		[]byte(fmt.Sprintf("%s\nUsed(bytes): %d\nCapacity(bytes) : %d\n", s.Name, s.Used, s.Capacity)))
}

func (h *adminHandler) segmentStatus(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("segment")
	if name == "" {
		writeBody(w, http.StatusBadRequest, contentTypeJSON,
			[]byte(`{"success":false,"error_code":-600,"error_message":"Missing segment query parameter"}`))
		return
	}
	if _, ok := h.findSegment(r, name); !ok {
		writeBody(w, http.StatusNotFound, contentTypeJSON, mustJSON(map[string]any{
			"success": false, "segment": name, "error_code": -1, "error_message": "segment not found",
		}))
		return
	}
	writeBody(w, http.StatusOK, contentTypeJSON, mustJSON(struct {
		Success    bool   `json:"success"`
		Segment    string `json:"segment"`
		Status     int    `json:"status"`
		StatusName string `json:"status_name"`
		Code       int    `json:"error_code"`
		Message    string `json:"error_message"`
	}{true, name, 1, "OK", 0, ""}))
}

// cppExp prints v the way the master prints allocator_usage_percent: shortest mantissa,
// then E and an unpadded exponent (1.77154541015625E0).
func cppExp(v float64) string {
	s := strconv.FormatFloat(v, 'E', -1, 64)
	i := strings.IndexByte(s, 'E')
	exp, err := strconv.Atoi(s[i+1:])
	if err != nil {
		return s
	}
	mant := s[:i]
	if !strings.Contains(mant, ".") {
		mant += ".0"
	}
	return mant + "E" + strconv.Itoa(exp)
}

func (h *adminHandler) segmentsDetail(w http.ResponseWriter, r *http.Request) {
	segs, err := h.insp.Segments(r.Context())
	if err != nil {
		writeBody(w, http.StatusInternalServerError, contentTypeJSON, errorCodeBody(ErrInternal))
		return
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, `{"total_segments":%d,"segments":[`, len(segs))
	for i, s := range segs {
		if i > 0 {
			buf.WriteByte(',')
		}
		pct := 0.0
		if s.Capacity > 0 {
			pct = float64(s.Used) * 100 / float64(s.Capacity)
		}
		fmt.Fprintf(&buf, `{"segment_name":%s,"segment_id":"%d-0","client_id":"0-0","base_address":"0x%x","size_bytes":%d,"size_human":"%s GiB","te_endpoint":%s,"protocol":"local","status":"OK","allocator_used_bytes":%d,"allocator_capacity_bytes":%d,"allocator_usage_percent":%s}`,
			mustJSON(s.Name), i+1, 0x7f0000000000+uint64(i)<<36, s.Capacity,
			strconv.FormatFloat(float64(s.Capacity)/(1<<30), 'g', 6, 64), mustJSON(s.Name),
			s.Used, s.Capacity, cppExp(pct))
	}
	buf.WriteString("]}")
	writeBody(w, http.StatusOK, contentTypeJSON, buf.Bytes())
}

func (h *adminHandler) metrics(w http.ResponseWriter, r *http.Request) {
	m, err := h.insp.Metrics(r.Context())
	if err != nil {
		writeBody(w, http.StatusInternalServerError, contentTypeProm, []byte("Failed to collect metrics"))
		return
	}
	body, err := RenderMasterMetrics(m)
	if err != nil {
		writeBody(w, http.StatusInternalServerError, contentTypeProm, []byte("Failed to collect metrics: "+err.Error()))
		return
	}
	writeBody(w, http.StatusOK, contentTypeProm, body)
}

func (h *adminHandler) summary(w http.ResponseWriter, r *http.Request) {
	m, err := h.insp.Metrics(r.Context())
	if err != nil {
		writeBody(w, http.StatusInternalServerError, contentTypeProm, []byte("Failed to collect metrics"))
		return
	}
	writeBody(w, http.StatusOK, contentTypeProm, []byte(RenderMasterSummary(m, h.opts.Role, h.opts.HAState)))
}

type metricFamily struct {
	name, kind, help string
}

// masterMetricValues maps the master's metric names to the snapshot's values; families not
// listed print 0.
func masterMetricValues(m MetricsSnapshot) map[string]float64 {
	st := m.Stats
	return map[string]float64{
		"master_allocated_bytes":                           float64(st.UsedBytes),
		"master_total_capacity_bytes":                      float64(st.CapacityBytes),
		"master_key_count":                                 float64(st.Objects),
		"master_soft_pin_key_count":                        float64(m.SoftPinned),
		"master_active_clients":                            float64(m.ActiveClients),
		"master_get_replica_list_requests_total":           float64(m.QueryKeyRequests),
		"master_get_replica_list_failures_total":           float64(m.QueryKeyFailures),
		"master_remove_requests_total":                     float64(m.RemoveRequests),
		"master_remove_failures_total":                     float64(m.RemoveFailures),
		"master_put_start_alloc_failures_total":            float64(m.AllocFailures),
		"master_batch_exist_key_requests_total":            float64(m.ExistRequests),
		"master_batch_exist_key_items_total":               float64(m.ExistProbes),
		"master_batch_exist_key_failed_items_total":        float64(m.ExistFailedItems),
		"master_batch_get_replica_list_requests_total":     float64(m.GetRequests),
		"master_batch_get_replica_list_items_total":        float64(m.GetItems),
		"master_batch_get_replica_list_failed_items_total": float64(m.GetFailedItems),
		"master_batch_put_start_requests_total":            float64(m.PutRequests),
		"master_batch_put_start_items_total":               float64(st.Puts + st.SkippedExisting + st.PutFailures),
		"master_batch_put_start_failed_items_total":        float64(m.PutFailedItems),
		"master_batch_put_end_requests_total":              float64(m.PutRequests),
		"master_batch_put_end_items_total":                 float64(st.Puts),
		"mem_cache_hit_nums_":                              float64(st.Hits),
		"mem_cache_hit_bytes_total":                        float64(st.BytesOut),
		"mem_cache_nums_":                                  float64(st.Objects),
		"valid_get_nums_":                                  float64(st.Hits),
		"total_get_nums_":                                  float64(m.GetItems + m.QueryKeyRequests),
		"master_successful_evictions_total":                float64(m.SuccessfulEvictions),
		"master_attempted_evictions_total":                 float64(m.AttemptedEvictions),
		"master_evicted_key_count":                         float64(m.EvictedKeys),
		"master_evicted_size_bytes":                        float64(m.EvictedBytes),
	}
}

// RenderMasterMetrics prints m as Prometheus text format 0.0.4 with every metric family the
// master prints and its help texts: the families of the master collector (NewMasterCollector)
// over m, encoded by expfmt, so the admin endpoint and a daemon's /metrics export one thing.
// Per-segment gauges appear once a segment is mounted and the value-size histogram once a value
// was stored, as on the master.
func RenderMasterMetrics(m MetricsSnapshot) ([]byte, error) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newMasterCollector(func(context.Context) (MetricsSnapshot, error) { return m, nil }))
	fams, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// humanBytes prints a byte count the way the master's summary does (1.13 MB, 64.00 MB, 0 B).
func humanBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	units := []string{"KB", "MB", "GB", "TB", "PB"}
	v := float64(n) / 1024
	u := 0
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	return fmt.Sprintf("%.2f %s", v, units[u])
}

// RenderMasterSummary prints the master's one-line /metrics/summary for m. Request rates are
// averages over the pool's uptime.
func RenderMasterSummary(m MetricsSnapshot, role, haState string) string {
	st := m.Stats
	secs := m.Uptime.Seconds()
	rate := func(n int64) string {
		if secs <= 0 {
			return "0.00"
		}
		return fmt.Sprintf("%.2f", float64(n)/secs)
	}
	pair := func(ok, total int64) string { return rate(ok) + "/" + rate(total) }
	mem := humanBytes(st.UsedBytes) + " / " + humanBytes(st.CapacityBytes)
	if st.CapacityBytes > 0 {
		mem += fmt.Sprintf(" (%.1f%%)", float64(st.UsedBytes)*100/float64(st.CapacityBytes))
	}
	putItems := st.Puts + st.SkippedExisting + st.PutFailures
	getItems := m.GetItems
	var b strings.Builder
	fmt.Fprintf(&b, "role=%s, state=%s, service_ready=true, master={Mem Storage: %s | NVMe-oF SSD: 0 B / 0 B | SSD Storage: 0 B / 0 B | Keys: %d (soft-pinned: %d) | Clients: %d",
		role, haState, mem, st.Objects, m.SoftPinned, m.ActiveClients)
	fmt.Fprintf(&b, " | Requests (Success/Total per sec): PutStart=%s, PutEnd=%s, PutRevoke=0.00/0.00, Get=%s, Exist=0.00/0.00, Del=%s, DelAll=0.00/0.00, Ping=0.00/0.00, CopyStart=0.00/0.00, CopyEnd=0.00/0.00, CopyRevoke=0.00/0.00, MoveStart=0.00/0.00, MoveEnd=0.00/0.00, MoveRevoke=0.00/0.00, EvictDiskReplica=0.00/0.00",
		pair(putItems-m.PutFailedItems, putItems), pair(st.Puts, st.Puts),
		pair(m.QueryKeyRequests-m.QueryKeyFailures, m.QueryKeyRequests),
		pair(m.RemoveRequests-m.RemoveFailures, m.RemoveRequests))
	fmt.Fprintf(&b, " | Batch Requests (per sec, Req=Success/PartialSuccess/Total, Item=Success/Total): PutStart:(Req=%s/0.00/%s, Item=%s), PutEnd:(Req=%s/0.00/%s, Item=%s), PutRevoke:(Req=0.00/0.00/0.00, Item=0.00/0.00), Get:(Req=%s/0.00/%s, Item=%s), ExistKey:(Req=%s/0.00/%s, Item=%s), QueryIp:(Req=0.00/0.00/0.00, Item=0.00/0.00), Clear:(Req=0.00/0.00/0.00, Item=0.00/0.00), CreateMoveTask:(Req=0.00/0.00), CreateCopyTask:(Req=0.00/0.00), QueryTask:(Req=0.00/0.00), FetchTasks:(Req=0.00/0.00), MarkTaskToComplete:(Req=0.00/0.00)",
		rate(m.PutRequests), rate(m.PutRequests), pair(putItems-m.PutFailedItems, putItems),
		rate(m.PutRequests), rate(m.PutRequests), pair(st.Puts, st.Puts),
		rate(m.GetRequests), rate(m.GetRequests), pair(getItems-m.GetFailedItems, getItems),
		rate(m.ExistRequests), rate(m.ExistRequests), pair(m.ExistProbes-m.ExistFailedItems, m.ExistProbes))
	fmt.Fprintf(&b, " | Eviction: Success/Attempts=%d/%d, AllocFail=%d, PartialAlloc=0, keys=%d, size=%s | Mem Eviction: Success/Attempts=%d/%d, keys=%d, size=%s | NoF Eviction: Success/Attempts=0/0, keys=0, size=0 B",
		m.SuccessfulEvictions, m.AttemptedEvictions, m.AllocFailures, m.EvictedKeys, humanBytes(m.EvictedBytes),
		m.SuccessfulEvictions, m.AttemptedEvictions, m.EvictedKeys, humanBytes(m.EvictedBytes))
	b.WriteString(" | Discard: Released/Total=0/0, StagingSize=0 B | Promotion: in_flight=0, admitted=0, completed=0, failed=0, cancelled=0, expired=0, bytes=0 B, rejected(freq/wm/cap)=0/0/0 | Snapshots: Success=0, Fail=0}, ha={HA Metrics Summary: last_seq=0, applied_seq=0, lag=0, pending=0, mutation_queue=0, batch_commits=0, sync_commits=0, skipped=0, checksum_fail=0, etcd_fail=0, watch_disconn=0, state=0}")
	return b.String()
}
