package mooncake_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// exchange is one recorded request and the master's response (testdata/http/*/*.txt).
type exchange struct {
	mooncaketest.Recording
	file    string
	state   string // "empty" or "populated"
	method  string
	target  string // path and query
	hasType bool
}

func loadExchanges(t *testing.T) []exchange {
	t.Helper()
	files, err := filepath.Glob("testdata/http/*/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no recordings: %v", err)
	}
	var out []exchange
	for _, f := range files {
		rec, err := mooncaketest.ReadRecording(f)
		if err != nil {
			t.Fatal(err)
		}
		method, rawURL, _ := strings.Cut(rec.Request, " ")
		u, err := url.Parse(rawURL)
		if err != nil {
			t.Fatal(err)
		}
		if u.Port() != "9003" {
			continue // the metadata server (port 8080) is not part of the admin API
		}
		_, hasType := rec.Header["Content-Type"]
		out = append(out, exchange{
			Recording: rec, file: filepath.Base(f), state: filepath.Base(filepath.Dir(f)),
			method: method, target: u.RequestURI(), hasType: hasType,
		})
	}
	return out
}

// newRecordedStatePool builds the pool state the recordings were taken in: empty, or the
// populated keys of testdata/http/populated (a 4 KiB, b 1 MiB soft pin, x and y 64 KiB in group
// grp1, h 4 KiB hard pin, c 1 KiB soft pin of 60 s) in one 64 MiB segment.
func newRecordedStatePool(t *testing.T, state, segName string) *embedded.Embedded {
	t.Helper()
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: segName, Capacity: 64 * mib}}
	o.EvictionPeriod = 0
	o.Clock = embedded.NewManualClock(epoch)
	p, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if state != "populated" {
		return p
	}
	puts := []struct {
		key  string
		size int
		cfg  pool.ReplicateConfig
	}{
		{"a", 4096, pool.ReplicateConfig{}},
		{"b", mib, pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable}},
		{"x", 65536, pool.ReplicateConfig{GroupIDs: []string{"grp1"}}},
		{"y", 65536, pool.ReplicateConfig{GroupIDs: []string{"grp1"}}},
		{"h", 4096, pool.ReplicateConfig{HardPin: true}},
		{"c", 1024, pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable, SoftPinTTL: time.Minute}},
	}
	for _, x := range puts {
		mustPut(t, p, x.key, x.size, x.cfg)
	}
	return p
}

// jsonShape reduces a JSON value to its structure: object keys, value kinds, element shapes.
func jsonShape(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := map[string]any{}
		for k, e := range x {
			m[k] = jsonShape(e)
		}
		return m
	case []any:
		if len(x) == 0 {
			return "[]"
		}
		return []any{jsonShape(x[0]), len(x)}
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

const mib = 1 << 20

var (
	summaryNumbers = regexp.MustCompile(`\d+(\.\d+)?( (B|KB|MB|GB|TB))?`)
	summaryPercent = regexp.MustCompile(` \(N%\)`)
)

func normalizeSummary(s string) string {
	return summaryPercent.ReplaceAllString(summaryNumbers.ReplaceAllString(s, "N"), "")
}

// exactBodies are recordings whose bodies hold no address, time or count: the handler must
// answer them byte for byte.
var exactBodies = map[string]bool{
	"health.txt": true, "leader.txt": true, "kv_events_status.txt": true, "role.txt": true,
	"ha_status.txt": true, "batch_query_keys_noparam.txt": true, "query_key_missing.txt": true,
	"query_key_noparam.txt": true, "query_key_wrong_method.txt": true, "not_found_path.txt": true,
	"query_segment_noparam.txt": true, "query_segment_unknown.txt": true, "api_v1_tenant_quotas.txt": true,
	"api_v1_drain_jobs_query.txt": true, "api_v1_segments_status.txt": true,
}

func TestHandlerMatchesRecordedMaster(t *testing.T) {
	for _, ex := range loadExchanges(t) {
		t.Run(ex.state+"/"+ex.file, func(t *testing.T) {
			segName := "127.0.0.1:12806"
			u, _ := url.Parse(ex.target)
			if s := u.Query().Get("segment"); s != "" && ex.Status == http.StatusOK {
				segName = s
			}
			p := newRecordedStatePool(t, ex.state, segName)
			h := mooncake.NewAdminHandler(p, mooncake.DefaultAdminHandlerOptions())
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(ex.method, ex.target, nil))
			got := rec.Result()
			body := rec.Body.Bytes()

			if got.StatusCode != ex.Status {
				t.Fatalf("status %d, master %d (body %q)", got.StatusCode, ex.Status, body)
			}
			// A nil Content-Type entry tells net/http to send none, as the master's 404 does.
			hasType := len(got.Header.Values("Content-Type")) > 0
			if hasType != ex.hasType || got.Header.Get("Content-Type") != ex.Header.Get("Content-Type") {
				t.Fatalf("content type %q (present %v), master %q (present %v)",
					got.Header.Get("Content-Type"), hasType, ex.Header.Get("Content-Type"), ex.hasType)
			}
			if cl := got.Header.Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(body)) {
				t.Fatalf("Content-Length %s for a %d-byte body", cl, len(body))
			}

			name := ex.file
			switch {
			case exactBodies[name]:
				if !bytes.Equal(body, ex.Body) {
					t.Fatalf("body\n%s\nmaster\n%s", body, ex.Body)
				}
			case strings.HasPrefix(ex.Header.Get("Content-Type"), "application/json"):
				var g, w any
				if err := json.Unmarshal(body, &g); err != nil {
					t.Fatalf("body is not JSON: %v\n%s", err, body)
				}
				want := ex.Body
				if ex.state == "empty" && name == "get_segments_detail.txt" {
					// The master had no segment mounted; the embedded pool always has one,
					// so its entry is compared with the populated master's.
					for _, other := range loadExchanges(t) {
						if other.state == "populated" && other.file == name {
							want = other.Body
						}
					}
				}
				if err := json.Unmarshal(want, &w); err != nil {
					t.Fatal(err)
				}
				if gs, ws := jsonShape(g), jsonShape(w); !reflect.DeepEqual(gs, ws) {
					t.Fatalf("JSON shape differs\n got %v\nwant %v\nbody %s", gs, ws, body)
				}
				if name == "query_key.txt" || strings.HasPrefix(name, "batch_query_keys") {
					// Sizes and ok flags are state, not addresses: they must match too.
					sizes := regexp.MustCompile(`"(ok|size_)":[a-z0-9]+`)
					if gm, wm := sizes.FindAllString(string(body), -1), sizes.FindAllString(string(ex.Body), -1); !reflect.DeepEqual(gm, wm) {
						t.Fatalf("sizes/ok differ: %v, master %v", gm, wm)
					}
				}
			case name == "metrics.txt":
				gm, err := mooncake.ParsePromText(body)
				if err != nil {
					t.Fatalf("our metrics do not parse: %v", err)
				}
				wm, err := mooncake.ParsePromText(ex.Body)
				if err != nil {
					t.Fatal(err)
				}
				for fam, typ := range wm.Types {
					if gm.Types[fam] != typ {
						t.Errorf("family %s: type %q, master %q", fam, gm.Types[fam], typ)
					}
				}
				for fam := range gm.Types {
					if _, ok := wm.Types[fam]; !ok && (ex.state != "empty" || !strings.HasPrefix(fam, "segment_")) {
						t.Errorf("family %s is not one the master prints", fam)
					}
				}
				if ex.state == "populated" {
					for _, n := range []string{"master_key_count", "master_soft_pin_key_count", "master_allocated_bytes", "master_total_capacity_bytes", "segment_allocated_bytes"} {
						g, _ := gm.Value(n)
						w, _ := wm.Value(n)
						if g != w {
							t.Errorf("%s = %v, master %v", n, g, w)
						}
					}
				}
			case name == "metrics_summary.txt":
				if g, w := normalizeSummary(string(body)), normalizeSummary(string(ex.Body)); g != w {
					t.Fatalf("summary shape differs\n got %s\nwant %s", g, w)
				}
			case name == "get_all_keys.txt":
				g, w := strings.Fields(string(body)), strings.Fields(string(ex.Body))
				sort.Strings(g)
				sort.Strings(w)
				if !reflect.DeepEqual(g, w) || (len(body) > 0 && body[len(body)-1] != '\n') {
					t.Fatalf("keys %q, master %q", body, ex.Body)
				}
			case name == "get_all_segments.txt":
				if !regexp.MustCompile(`^([^\n]+\n)*$`).Match(body) {
					t.Fatalf("segments body %q is not one name per line", body)
				}
			case name == "query_segment.txt":
				re := regexp.MustCompile(`^(\S+)\nUsed\(bytes\): (\d+)\nCapacity\(bytes\) : (\d+)\n$`)
				g, w := re.FindSubmatch(body), re.FindSubmatch(ex.Body)
				if g == nil || w == nil || string(g[1]) != string(w[1]) || string(g[3]) != string(w[3]) {
					t.Fatalf("query_segment %q, master %q", body, ex.Body)
				}
			default:
				t.Fatalf("no comparison for %s", name)
			}
		})
	}
}

func TestClientParsesRecordedResponses(t *testing.T) {
	ctx := context.Background()
	for _, ex := range loadExchanges(t) {
		t.Run(ex.state+"/"+ex.file, func(t *testing.T) {
			c, err := mooncake.NewAdminClient(mooncaketest.ReplayServer(t, nil, ex.Recording).URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			populated := ex.state == "populated"
			var callErr error
			switch strings.TrimSuffix(ex.file, ".txt") {
			case "health":
				h, err := c.Health(ctx)
				callErr = err
				if err == nil && (h.Status != "ok" || h.Role != "leader" || !h.ServiceReady) {
					t.Fatalf("health %+v", h)
				}
			case "metrics":
				m, err := c.Metrics(ctx)
				callErr = err
				if err == nil {
					want := 0.0
					if populated {
						want = 6
					}
					if v, ok := m.Value("master_key_count"); !ok || v != want || len(m.Types) < 130 {
						t.Fatalf("master_key_count %v %v, %d families", v, ok, len(m.Types))
					}
				}
			case "metrics_summary":
				s, err := c.MetricsSummary(ctx)
				callErr = err
				if err == nil && populated && (s.Keys != 6 || s.SoftPinnedKeys != 2 || s.Role != "leader") {
					t.Fatalf("summary %+v", s)
				}
			case "query_key":
				reps, err := c.QueryKey(ctx, "x")
				if populated && (err != nil || len(reps) != 1 || reps[0].Size != 65536 || reps[0].Protocol != "tcp") {
					t.Fatalf("query_key %+v %v", reps, err)
				}
				if !populated && !errors.Is(err, mooncake.ErrKeyNotFound) {
					t.Fatalf("query_key on empty master: %v, want ErrKeyNotFound", err)
				}
			case "query_key_missing", "query_key_noparam":
				_, err := c.QueryKey(ctx, "__no_such_key__")
				if !errors.Is(err, mooncake.ErrKeyNotFound) {
					t.Fatalf("err %v, want ErrKeyNotFound", err)
				}
			case "batch_query_keys", "batch_query_keys_with_spaces_and_dupes":
				res, err := c.BatchQueryKeys(ctx, []string{"a", "b"})
				callErr = err
				if err == nil && populated {
					a, ok := res["a"]
					if !ok || !a.OK || len(a.Values) != 1 || a.Values[0].Size != 4096 {
						t.Fatalf("a = %+v", a)
					}
				}
			case "batch_query_keys_noparam":
				_, err := c.BatchQueryKeys(ctx, []string{"a"})
				var se *mooncake.StatusError
				if !errors.As(err, &se) || se.StatusCode != 400 || !strings.Contains(se.Message, "No keys provided") {
					t.Fatalf("err %v, want a 400 StatusError", err)
				}
			case "get_all_keys":
				ks, err := c.AllKeys(ctx)
				callErr = err
				if populated && len(ks) != 6 {
					t.Fatalf("keys %v", ks)
				}
			case "get_all_segments":
				segs, err := c.AllSegments(ctx)
				callErr = err
				if populated && (len(segs) != 1 || segs[0] != "127.0.0.1:12806") {
					t.Fatalf("segments %v", segs)
				}
			case "query_segment":
				s, err := c.QuerySegment(ctx, "127.0.0.1:12481")
				callErr = err
				if s.Used != 1118208 || s.Capacity != 64*mib || s.Name != "127.0.0.1:12481" {
					t.Fatalf("segment %+v", s)
				}
			case "query_segment_noparam", "query_segment_unknown":
				_, err := c.QuerySegment(ctx, "10.9.9.9:1")
				if !errors.Is(err, mooncake.ErrSegmentNotFound) {
					t.Fatalf("err %v, want ErrSegmentNotFound", err)
				}
			case "role":
				r, err := c.Role(ctx)
				callErr = err
				if r != "leader" {
					t.Fatalf("role %q", r)
				}
			case "ha_status":
				r, err := c.HAStatus(ctx)
				callErr = err
				if r != "serving" {
					t.Fatalf("ha_status %q", r)
				}
			case "leader":
				l, err := c.Leader(ctx)
				callErr = err
				if l.Present {
					t.Fatalf("leader %+v", l)
				}
			case "kv_events_status":
				_, callErr = c.KVEventsStatus(ctx)
			case "get_segments_detail":
				d, err := c.SegmentsDetail(ctx)
				callErr = err
				if populated && (len(d) != 1 || d[0].SizeBytes != 64*mib || d[0].AllocatorUsagePercent < 1.77 || d[0].AllocatorUsagePercent > 1.78) {
					t.Fatalf("detail %+v", d)
				}
			case "api_v1_segments_status":
				st, err := c.SegmentStatus(ctx, "127.0.0.1:12481")
				if populated && (err != nil || st != "OK") {
					t.Fatalf("status %q %v", st, err)
				}
				var se *mooncake.StatusError
				if !populated && (!errors.As(err, &se) || se.Code != pool.ErrInvalidParams) {
					t.Fatalf("err %v, want a StatusError with -600", err)
				}
			case "api_v1_tenant_quotas", "api_v1_drain_jobs_query":
				// Endpoints the client does not wrap: their error bodies still map onto
				// StatusError with the master's code.
				_, err := c.AllKeys(ctx)
				var se *mooncake.StatusError
				if !errors.As(err, &se) || se.StatusCode != ex.Status || se.Code == 0 || se.Message == "" {
					t.Fatalf("err %v, want a StatusError carrying the master's code", err)
				}
			case "not_found_path", "query_key_wrong_method":
				// A master without an endpoint (older versions) answers a plain 404.
				_, err := c.AllKeys(ctx)
				var se *mooncake.StatusError
				if !errors.As(err, &se) || se.StatusCode != 404 || se.Message != "404 Not Found" || errors.Is(err, mooncake.ErrKeyNotFound) {
					t.Fatalf("err %v, want a plain 404 StatusError", err)
				}
			default:
				t.Fatalf("no client check for %s", ex.file)
			}
			if callErr != nil {
				t.Fatalf("client failed on a recorded %d answer: %v", ex.Status, callErr)
			}
		})
	}
}

func startAdmin(t *testing.T, p mooncake.Inspector) (*httptest.Server, *mooncake.AdminClient) {
	t.Helper()
	srv := httptest.NewServer(mooncake.NewAdminHandler(p, mooncake.DefaultAdminHandlerOptions()))
	t.Cleanup(srv.Close)
	c, err := mooncake.NewAdminClient(srv.URL, srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func TestClientHandlerRoundTrip(t *testing.T) {
	ctx := context.Background()
	p := newRecordedStatePool(t, "populated", "seg-a")
	_, c := startAdmin(t, p)

	h, err := c.Health(ctx)
	if err != nil || h.Status != "ok" || !h.ServiceReady {
		t.Fatalf("health %+v %v", h, err)
	}

	// /batch_query_keys is read-only: no lease.
	before, _ := p.LeaseDeadline("a")
	res, err := c.BatchQueryKeys(ctx, []string{"a", "nope", "a", " b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 || !res["a"].OK || res["nope"].OK || *res["nope"].Error != "OBJECT_NOT_FOUND" || res[" b"].OK {
		t.Fatalf("batch query %+v", res)
	}
	if res["a"].Values[0].Size != 4096 || res["a"].Values[0].TransportEndpoint != "seg-a" {
		t.Fatalf("replica %+v", res["a"].Values[0])
	}
	if after, _ := p.LeaseDeadline("a"); !after.Equal(before) {
		t.Fatal("/batch_query_keys changed a lease")
	}

	// /query_key grants a lease, as on the master.
	reps, err := c.QueryKey(ctx, "a")
	if err != nil || len(reps) != 1 || reps[0].Size != 4096 {
		t.Fatalf("query_key %+v %v", reps, err)
	}
	if after, _ := p.LeaseDeadline("a"); !after.After(before) {
		t.Fatal("/query_key did not grant a lease")
	}
	if _, err := c.QueryKey(ctx, "nope"); !errors.Is(err, mooncake.ErrKeyNotFound) {
		t.Fatalf("query_key of a missing key: %v", err)
	}
	// Keys with characters that need escaping survive the trip.
	mustPut(t, p, "ns/m w1r0/ä&=?", 10, pool.ReplicateConfig{})
	if reps, err := c.QueryKey(ctx, "ns/m w1r0/ä&=?"); err != nil || len(reps) != 1 {
		t.Fatalf("escaped key: %v %v", reps, err)
	}

	ks, err := c.AllKeys(ctx)
	if err != nil || len(ks) != 7 {
		t.Fatalf("keys %v %v", ks, err)
	}
	segs, err := c.AllSegments(ctx)
	if err != nil || !reflect.DeepEqual(segs, []string{"seg-a"}) {
		t.Fatalf("segments %v %v", segs, err)
	}
	seg, err := c.QuerySegment(ctx, "seg-a")
	st, _ := p.Stats(ctx)
	if err != nil || seg.Used != st.UsedBytes || seg.Capacity != 64*mib {
		t.Fatalf("segment %+v %v (used %d)", seg, err, st.UsedBytes)
	}
	if _, err := c.QuerySegment(ctx, "other"); !errors.Is(err, mooncake.ErrSegmentNotFound) {
		t.Fatalf("unknown segment: %v", err)
	}
	m, err := c.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{
		"master_key_count": 7, "master_soft_pin_key_count": 2, "master_allocated_bytes": float64(st.UsedBytes),
		"master_total_capacity_bytes": 64 * mib, "master_get_replica_list_requests_total": 3,
	} {
		if v, ok := m.Value(name); !ok || v != want {
			t.Errorf("%s = %v (%v), want %v", name, v, ok, want)
		}
	}
	if m.Types["master_value_size_bytes"] != "histogram" {
		t.Error("no value-size histogram")
	}
	s, err := c.MetricsSummary(ctx)
	if err != nil || s.Keys != 7 || s.SoftPinnedKeys != 2 || s.Role != "leader" || !s.ServiceReady {
		t.Fatalf("summary %+v %v", s, err)
	}
}

func TestClientErrors(t *testing.T) {
	ctx := context.Background()
	// Unreachable: a listener that is closed at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, err := mooncake.NewAdminClient(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Health(ctx)
	if !errors.Is(err, mooncake.ErrUnreachable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("err %v, want ErrUnreachable naming %s", err, addr)
	}

	// Malformed bodies.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("{not json"))
	}))
	defer srv.Close()
	c, _ = mooncake.NewAdminClient(srv.URL, nil)
	if _, err := c.Health(ctx); !errors.Is(err, mooncake.ErrMalformedResponse) {
		t.Fatalf("health on a bad body: %v", err)
	}
	if _, err := c.BatchQueryKeys(ctx, []string{"a"}); !errors.Is(err, mooncake.ErrMalformedResponse) {
		t.Fatalf("batch on a bad body: %v", err)
	}
	if _, err := c.QuerySegment(ctx, "s"); !errors.Is(err, mooncake.ErrMalformedResponse) {
		t.Fatalf("query_segment on a bad body: %v", err)
	}
	if _, err := c.MetricsSummary(ctx); !errors.Is(err, mooncake.ErrMalformedResponse) {
		t.Fatalf("summary on a bad body: %v", err)
	}
	if _, err := c.BatchQueryKeys(ctx, []string{"a,b"}); err == nil {
		t.Fatal("a key with a comma was sent")
	}
	if _, err := mooncake.NewAdminClient("ftp://x", nil); err == nil {
		t.Fatal("ftp address accepted")
	}

	// An HTTP status that is not the master's error shape still names the status.
	srv503 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(503)
		w.Write([]byte(`{"success":false,"error_code":-1011,"error_message":"service plane is not active"}`))
	}))
	defer srv503.Close()
	c, _ = mooncake.NewAdminClient(srv503.URL, nil)
	_, err = c.AllKeys(ctx)
	var se *mooncake.StatusError
	if !errors.As(err, &se) || se.StatusCode != 503 || se.Code != pool.ErrUnavailableInThisMode {
		t.Fatalf("err %v, want a 503 StatusError with -1011", err)
	}
}

func TestHandlerMalformedInput(t *testing.T) {
	p := newRecordedStatePool(t, "populated", "seg")
	srv, c := startAdmin(t, p)
	hc := srv.Client()
	do := func(method, target string) (int, string) {
		req, err := http.NewRequest(method, srv.URL+target, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, target, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	many := strings.TrimSuffix(strings.Repeat("k,", 10001), ",")
	cases := []struct {
		method, target string
		status         int
		contains       string
	}{
		{"POST", "/query_key?key=a", 404, "404 Not Found"},
		{"PUT", "/batch_query_keys?keys=a", 404, "404 Not Found"},
		{"DELETE", "/get_all_keys", 404, "404 Not Found"},
		{"GET", "/batch_query_keys?keys=", 400, "No keys provided"},
		{"GET", "/batch_query_keys?keys=" + many, 400, "Too many keys"},
		{"GET", "/batch_query_keys?keys=%zz", 400, "No keys provided"},
		{"GET", "/query_key?key=%ff%fe", 404, "OBJECT_NOT_FOUND"},
		{"GET", "/query_key?key=" + strings.Repeat("x", 100000), 404, "OBJECT_NOT_FOUND"},
		{"GET", "/query_segment?segment=%00", 500, "Failed to query segment"},
		{"GET", "/query_key?" + strings.Repeat("a", 1<<20+1), 414, "above the limit"},
		{"GET", "/../etc/passwd", 404, ""},
	}
	for _, tc := range cases {
		status, body := do(tc.method, tc.target)
		if status != tc.status || !strings.Contains(body, tc.contains) {
			t.Errorf("%s %.60s: %d %.80q, want %d containing %q", tc.method, tc.target, status, body, tc.status, tc.contains)
		}
		if status < 400 || status >= 500 && tc.status < 500 {
			t.Errorf("%s %.60s answered %d, want 4xx", tc.method, tc.target, status)
		}
	}
	// A request line far beyond the server's header limit is refused by net/http itself.
	status, _ := do("GET", "/batch_query_keys?keys="+strings.Repeat("y", 2<<20))
	if status < 400 || status >= 500 {
		t.Errorf("oversized request line: %d, want 4xx", status)
	}
	// The server keeps serving.
	if h, err := c.Health(context.Background()); err != nil || h.Status != "ok" {
		t.Fatalf("after bad input: %+v %v", h, err)
	}
}

var bg = context.Background()

var epoch = time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)

func mustPut(t testing.TB, p *embedded.Embedded, key string, size int, cfg pool.ReplicateConfig) {
	t.Helper()
	if c := p.BatchPut(context.Background(), []string{key}, [][]byte{make([]byte, size)}, cfg); c[0] != pool.OK {
		t.Fatalf("put %s = %v", key, c[0])
	}
}
