package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// KindDisagg is TensorRT-LLM's disagg_config.yaml, the file `trtllm-serve disaggregated -c`
// reads and `kvctl serve --disagg-config` runs.
const KindDisagg Kind = "disagg-yaml"

// DefaultKVTransferTimeoutMs is cache_transceiver_config.kv_transfer_timeout_ms when no file
// sets it: a generation leg that produced no first token within it is failed.
const DefaultKVTransferTimeoutMs = 60000

// DefaultDisaggRequestTimeoutS bounds a whole leg, as trtllm-serve's req_timeout_secs does.
const DefaultDisaggRequestTimeoutS = 180

// Router types of a disagg config's context_servers.router or generation_servers.router.
const (
	RouterRoundRobin    = "round_robin"    // TensorRT-LLM's default
	RouterLoadBalancing = "load_balancing" // fewest requests (or tokens, with use_tokens) in flight
	RouterWorkAware     = "work_aware"     // least estimated prefill work: prompt growth per conversation
	RouterPoolAware     = "pool_aware"     // least estimated work: tokens the shared pool does not hold
)

// DisaggRouterTypes lists the router types kvctl's disaggregated front runs.
var DisaggRouterTypes = []string{RouterRoundRobin, RouterLoadBalancing, RouterWorkAware, RouterPoolAware}

// DisaggConfig is disagg_config.yaml. Keys TensorRT-LLM reads that do not change the
// proxy's behaviour (the servers' own LLM API options) are accepted and ignored.
type DisaggConfig struct {
	Hostname string `json:"hostname"`
	Port     int64  `json:"port"`
	// MaxRetries is how many times a context leg is re-sent after a failure (default 1).
	MaxRetries int64 `json:"max_retries"`
	// NodeID tags the disagg_request_ids this proxy mints (0..255).
	NodeID     *int64        `json:"node_id,omitempty"`
	Context    DisaggServers `json:"context_servers"`
	Generation DisaggServers `json:"generation_servers"`
	// KVTransferTimeoutMs is the effective kv_transfer_timeout_ms and KVTransferTimeoutFrom the
	// key path it was read from ("" for the default).
	KVTransferTimeoutMs   int64  `json:"kv_transfer_timeout_ms"`
	KVTransferTimeoutFrom string `json:"kv_transfer_timeout_from,omitempty"`
	// RequestTimeoutS bounds a whole leg (kvctl's request_timeout_s, default 180).
	RequestTimeoutS int64 `json:"request_timeout_s"`
	// MaxRequestBytes bounds a client's request body (kvctl's max_request_bytes, default 32 MiB).
	MaxRequestBytes int64 `json:"max_request_bytes"`
	// Limits are kvctl's bounds on what clients may make the front hold.
	Limits DisaggLimits `json:"limits"`
}

// DisaggLimits bound what clients may make the disaggregated front hold (kvctl's own keys).
type DisaggLimits struct {
	// MaxPromptTokens bounds a token-id prompt (max_prompt_tokens, default 1,048,576).
	MaxPromptTokens int64 `json:"max_prompt_tokens"`
	// MaxInflightRequests bounds the requests served at once; past it a request gets 429
	// (max_inflight_requests, default 1024).
	MaxInflightRequests int64 `json:"max_inflight_requests"`
	// MaxInflightBytes bounds the request bodies held at once; past it a request gets 429
	// (max_inflight_bytes, default 512 MiB).
	MaxInflightBytes int64 `json:"max_inflight_bytes"`
	// BodyReadTimeoutS bounds reading one request body (body_read_timeout_s, default 30).
	BodyReadTimeoutS int64 `json:"body_read_timeout_s"`
	// MaxConnections caps the client connections open at once (max_connections, default
	// 4096, lowered to fit the process's descriptor limit).
	MaxConnections int64 `json:"max_connections"`
	// MaxConnectionsPerPeer is one client address's share of them (max_connections_per_peer,
	// default 256).
	MaxConnectionsPerPeer int64 `json:"max_connections_per_peer"`
}

// DefaultDisaggLimits are the front's bounds when the config leaves them out.
func DefaultDisaggLimits() DisaggLimits {
	return DisaggLimits{MaxPromptTokens: 1 << 20, MaxInflightRequests: 1024, MaxInflightBytes: 512 << 20,
		BodyReadTimeoutS: 30, MaxConnections: 4096, MaxConnectionsPerPeer: 256}
}

// DisaggServers is context_servers or generation_servers.
type DisaggServers struct {
	NumInstances int64        `json:"num_instances"`
	URLs         []string     `json:"urls"` // host:port
	Router       DisaggRouter `json:"router"`
}

// DisaggRouter is a servers section's router mapping.
type DisaggRouter struct {
	Type string `json:"type"`
	// UseTokens makes load_balancing count tokens in flight instead of requests.
	UseTokens bool `json:"use_tokens,omitempty"`
	// MaxActiveRequests caps a server's requests in flight for work_aware and pool_aware
	// (max_num_active_requests, else the section's max_batch_size); 0 is no cap.
	MaxActiveRequests int64 `json:"max_num_active_requests,omitempty"`
	// Pool is the pool's admin address for pool_aware: a Mooncake master's HTTP admin port
	// or a kvctl serve admin address.
	Pool string `json:"pool,omitempty"`
	// LookupTimeoutMs bounds pool_aware's lookup of one request's keys (default 50).
	LookupTimeoutMs int64 `json:"lookup_timeout_ms,omitempty"`
	// The key layout pool_aware derives a request's keys with, as kvctl hash takes it.
	TokensPerBlock int64    `json:"tokens_per_block,omitempty"`
	KeyFormat      string   `json:"key_format,omitempty"`
	Namespace      string   `json:"namespace,omitempty"`
	ModelKey       string   `json:"model_key,omitempty"`
	WorldSize      int64    `json:"world_size,omitempty"`
	LayerGroups    []string `json:"layer_groups,omitempty"` // "group:bytes_per_page"
}

// DefaultPoolLookupTimeoutMs bounds a pool_aware lookup when the router does not.
const DefaultPoolLookupTimeoutMs = 50

const pDisaggKV = "kv_transfer_timeout_ms"

// disaggMarkers tell a disagg config from an LLM API YAML, which never has these keys.
var disaggMarkers = []string{"context_servers", "generation_servers", "disagg_cluster"}

// disaggTopKeys are the top-level keys TensorRT-LLM's extract_disagg_cfg reads itself; any
// other top-level key is an LLM API option both server sections inherit.
var disaggTopKeys = []string{"hostname", "port", "max_retries", "perf_metrics_max_requests", "return_perf_metrics",
	"perf_metrics_output_dir", "context_servers", "generation_servers", "conditional_disagg_config", "otlp_config",
	"disagg_cluster", "node_id", "schedule_style", "allow_request_chat_template", "gen_strip_message_history",
	"gen_tokids_ctxbytes", "num_workers", "disagg_coordinator_url",
	// kvctl's own proxy keys
	pDisaggKV, "request_timeout_s", "max_request_bytes", "max_prompt_tokens", "max_inflight_requests",
	"max_inflight_bytes", "body_read_timeout_s", "max_connections", "max_connections_per_peer"}

func decodeDisagg(d *dec, root *node) *DisaggConfig {
	c := &DisaggConfig{Hostname: "localhost", Port: 8000, MaxRetries: 1, RequestTimeoutS: DefaultDisaggRequestTimeoutS,
		MaxRequestBytes: 32 << 20, KVTransferTimeoutMs: DefaultKVTransferTimeoutMs, Limits: DefaultDisaggLimits()}
	o := d.object(root, "")
	o.str("hostname", &c.Hostname, false)
	if v, n, ok := o.intv("port", intExact); ok {
		if v < 1 || v > 65535 {
			o.errAt(n, "port", fmt.Sprintf("port %d is outside 1..65535", v), "")
		} else {
			c.Port = v
		}
	}
	if v, n, ok := o.intv("max_retries", intExact); ok {
		if v < 0 || v > 10 {
			o.errAt(n, "max_retries", fmt.Sprintf("must be within 0..10, found %d", v), "")
		} else {
			c.MaxRetries = v
		}
	}
	if v, n, ok := o.intv("node_id", intExact); ok {
		if v < 0 || v > 255 {
			o.errAt(n, "node_id", fmt.Sprintf("node_id must be in range [0, 256), found %d", v), "")
		} else {
			c.NodeID = &v
		}
	}
	if v, n, ok := o.intv("request_timeout_s", intExact); ok {
		if v < 1 {
			o.errAt(n, "request_timeout_s", fmt.Sprintf("must be at least 1, found %d", v), "")
		} else {
			c.RequestTimeoutS = v
		}
	}
	if v, n, ok := o.intv("max_request_bytes", intExact); ok {
		if v < 1024 || v > 1<<30 {
			o.errAt(n, "max_request_bytes", fmt.Sprintf("must be within 1024..%d, found %d", 1<<30, v), "")
		} else {
			c.MaxRequestBytes = v
		}
	}
	for _, l := range []struct {
		key      string
		dst      *int64
		min, max int64
	}{
		{"max_prompt_tokens", &c.Limits.MaxPromptTokens, 1, 1 << 27},
		{"max_inflight_requests", &c.Limits.MaxInflightRequests, 1, 1 << 20},
		{"max_inflight_bytes", &c.Limits.MaxInflightBytes, 1 << 20, 1 << 40},
		{"body_read_timeout_s", &c.Limits.BodyReadTimeoutS, 1, 3600},
		{"max_connections", &c.Limits.MaxConnections, 1, 1 << 20},
		{"max_connections_per_peer", &c.Limits.MaxConnectionsPerPeer, 1, 1 << 20},
	} {
		if v, n, ok := o.intv(l.key, intExact); ok {
			if v < l.min || v > l.max {
				o.errAt(n, l.key, fmt.Sprintf("must be within %d..%d, found %d", l.min, l.max, v), "")
			} else {
				*l.dst = v
			}
		}
	}
	var style string
	if o.str("schedule_style", &style, true) && style != "context_first" {
		d.at(SeverityError, "schedule_style", fmt.Sprintf("schedule_style %q is not supported", style),
			"kvctl sends the context leg first; use context_first or leave it out")
	}
	if n := o.field("disagg_cluster"); n != nil && !isNull(n) {
		d.at(SeverityError, "disagg_cluster", "dynamic cluster membership (disagg_cluster) is not supported",
			"list the servers in context_servers.urls and generation_servers.urls")
	}
	if n := o.field("conditional_disagg_config"); n != nil && !isNull(n) {
		d.at(SeverityWarning, "conditional_disagg_config", "conditional disaggregation needs the kv_cache_aware router and is ignored",
			"every request runs a context leg")
	}
	if n := o.field("disagg_coordinator_url"); n != nil && !isNull(n) {
		d.at(SeverityWarning, "disagg_coordinator_url", "a coordinator fleet is not used; this proxy routes by itself", "")
	}
	for _, k := range disaggTopKeys {
		o.field(k)
	}
	// A top-level cache_transceiver_config is inherited by both server sections.
	topCT := o.child("cache_transceiver_config")
	topKV, topKVOK := readKVTimeout(topCT)
	c.Context = decodeDisaggServers(d, o, "context_servers")
	c.Generation = decodeDisaggServers(d, o, "generation_servers")
	gen := o.child("generation_servers").child("cache_transceiver_config")
	if topKVOK {
		c.KVTransferTimeoutMs, c.KVTransferTimeoutFrom = topKV, "cache_transceiver_config."+pDisaggKV
	}
	if v, ok := readKVTimeout(gen); ok {
		if topKVOK && v != topKV {
			d.at(SeverityError, "generation_servers.cache_transceiver_config."+pDisaggKV,
				fmt.Sprintf("%d differs from the top-level cache_transceiver_config.%s %d", v, pDisaggKV, topKV),
				"TensorRT-LLM refuses a top-level value that a server section sets differently")
		}
		c.KVTransferTimeoutMs, c.KVTransferTimeoutFrom = v, "generation_servers.cache_transceiver_config."+pDisaggKV
	}
	if v, n, ok := o.intv(pDisaggKV, intExact); ok {
		if v < 1 {
			o.errAt(n, pDisaggKV, fmt.Sprintf("must be a positive number of milliseconds, found %d", v), "the default is 60000")
		} else {
			c.KVTransferTimeoutMs, c.KVTransferTimeoutFrom = v, pDisaggKV
		}
	}
	if len(c.Context.URLs) == 0 && !d.bad["context_servers.urls"] {
		d.at(SeverityError, "context_servers.urls", "no context server: the proxy needs at least one url",
			"list host:port entries under context_servers.urls")
	}
	if len(c.Generation.URLs) == 0 && !d.bad["generation_servers.urls"] {
		d.at(SeverityError, "generation_servers.urls", "no generation server: the proxy needs at least one url",
			"list host:port entries under generation_servers.urls")
	}
	if c.Generation.Router.Type == RouterWorkAware || c.Generation.Router.Type == RouterPoolAware {
		d.at(SeverityError, "generation_servers.router.type", fmt.Sprintf("%s estimates prefill work and routes context servers only", c.Generation.Router.Type),
			"use round_robin or load_balancing for generation servers")
	}
	return c
}

// readKVTimeout reads kv_transfer_timeout_ms of a cache_transceiver_config mapping.
func readKVTimeout(ct *obj) (int64, bool) {
	v, n, ok := ct.intv(pDisaggKV, intExact)
	if !ok {
		return 0, false
	}
	if v < 1 {
		ct.errAt(n, pDisaggKV, fmt.Sprintf("must be a positive number of milliseconds, found %d", v), "the default is 60000")
		return 0, false
	}
	return v, true
}

func decodeDisaggServers(d *dec, top *obj, key string) DisaggServers {
	s := DisaggServers{NumInstances: 1, Router: DisaggRouter{Type: RouterRoundRobin}}
	n := top.field(key)
	if n == nil || isNull(n) {
		return s
	}
	o := top.child(key)
	numSet := false
	if v, vn, ok := o.intv("num_instances", intExact); ok {
		if v < 1 {
			o.errAt(vn, "num_instances", fmt.Sprintf("must be at least 1, found %d", v), "")
		} else {
			s.NumInstances, numSet = v, true
		}
	}
	if un := o.field("urls"); un != nil && !isNull(un) {
		if un.kind != nodeSeq {
			o.errAt(un, "urls", "want a list of host:port strings, found "+un.describe(), "")
		} else {
			seen := map[string]bool{}
			for i, it := range un.items {
				p := fmt.Sprintf("%s.urls[%d]", key, i)
				if it.kind != nodeScalar || it.typ != scalarString {
					d.bad[key+".urls"] = true
					d.add(SeverityError, it.line, it.col, p, "want a host:port string, found "+it.describe(), "")
					continue
				}
				u, err := ParseServerURL(it.text)
				if err != nil {
					d.bad[key+".urls"] = true
					d.add(SeverityError, it.line, it.col, p, err.Error(), "write host:port, for example localhost:8001")
					continue
				}
				if seen[u] {
					d.add(SeverityError, it.line, it.col, p, fmt.Sprintf("duplicated %s server %s", strings.TrimSuffix(key, "_servers"), u), "")
					continue
				}
				seen[u] = true
				s.URLs = append(s.URLs, u)
			}
			if numSet && int64(len(un.items)) != s.NumInstances {
				d.at(SeverityError, key+".num_instances", fmt.Sprintf("num_instances is %d but urls lists %d servers", s.NumInstances, len(un.items)),
					"TensorRT-LLM requires one url per instance")
			}
		}
	}
	var maxBatch *int64
	o.intPtr("max_batch_size", &maxBatch, 1)
	kv := o.child("kv_cache_config")
	var tpb *int64
	kv.intPtr("tokens_per_block", &tpb, 1)
	if rn := o.field("router"); rn != nil && !isNull(rn) {
		s.Router = decodeDisaggRouter(d, o.child("router"))
	}
	r := &s.Router
	if r.MaxActiveRequests == 0 && maxBatch != nil {
		r.MaxActiveRequests = *maxBatch
	}
	if r.TokensPerBlock == 0 {
		r.TokensPerBlock = 32
		if tpb != nil {
			r.TokensPerBlock = *tpb
		}
	}
	// Every other key is an LLM API option of the servers in this section.
	return s
}

func decodeDisaggRouter(d *dec, o *obj) DisaggRouter {
	r := DisaggRouter{Type: RouterRoundRobin, LookupTimeoutMs: DefaultPoolLookupTimeoutMs, WorldSize: 1}
	if o.str("type", &r.Type, false) {
		known := false
		for _, t := range DisaggRouterTypes {
			known = known || t == r.Type
		}
		if !known {
			hint := "use " + strings.Join(DisaggRouterTypes, ", ")
			if r.Type == "kv_cache_aware" {
				hint = "kv_cache_aware needs KV events from the servers; pool_aware asks the shared pool instead (" + hint + ")"
			}
			d.at(SeverityError, o.sub("type"), fmt.Sprintf("router type %q is not supported", r.Type), hint)
		}
	}
	if b, ok := o.boolv("use_tokens", boolStrict); ok {
		r.UseTokens = b
	}
	var p *int64
	o.intPtr("max_num_active_requests", &p, 1)
	if p != nil {
		r.MaxActiveRequests = *p
	}
	o.str("pool", &r.Pool, true)
	p = nil
	o.intPtr("lookup_timeout_ms", &p, 1)
	if p != nil {
		r.LookupTimeoutMs = *p
	}
	p = nil
	o.intPtr("tokens_per_block", &p, 1)
	if p != nil {
		r.TokensPerBlock = *p
	}
	o.str("key_format", &r.KeyFormat, true)
	o.str("namespace", &r.Namespace, true)
	o.str("model_key", &r.ModelKey, true)
	p = nil
	o.intPtr("world_size", &p, 1)
	if p != nil {
		r.WorldSize = *p
	}
	if ln := o.field("layer_groups"); ln != nil && !isNull(ln) {
		if ln.kind != nodeSeq {
			o.errAt(ln, "layer_groups", "want a list of \"group:bytes_per_page\" strings, found "+ln.describe(), "")
		} else {
			for i, it := range ln.items {
				p := fmt.Sprintf("%s.layer_groups[%d]", o.path, i)
				if it.kind != nodeScalar || it.typ != scalarString || !validGroupPair(it.text) {
					d.add(SeverityError, it.line, it.col, p, "want \"group:bytes_per_page\", found "+it.describe(), "for example \"0:65536\"")
					continue
				}
				r.LayerGroups = append(r.LayerGroups, it.text)
			}
		}
	}
	o.rest(SeverityWarning, " in the router (TensorRT-LLM passes it to its router; kvctl ignores it)")
	if r.Type == RouterPoolAware {
		if r.Pool == "" {
			d.at(SeverityError, o.sub("pool"), "pool_aware needs the pool's admin address",
				"a Mooncake master's HTTP admin host:port or a kvctl serve --admin-addr")
		}
		if r.ModelKey == "" {
			d.at(SeverityError, o.sub("model_key"), "pool_aware needs the model_key the servers store blocks under", "")
		}
		if len(r.LayerGroups) == 0 {
			d.at(SeverityError, o.sub("layer_groups"), "pool_aware needs the layer groups' page sizes to derive keys",
				"for example layer_groups: [\"0:65536\"], as kvctl hash --layer-group takes them")
		}
	}
	return r
}

func validGroupPair(s string) bool {
	g, b, ok := strings.Cut(s, ":")
	if !ok {
		return false
	}
	gi, err1 := strconv.ParseUint(g, 10, 16)
	bi, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && bi > 0 && gi < 1024
}

// ParseServerURL reads a server address of a disagg config: host:port, optionally with an
// http:// scheme, and returns it as host:port.
func ParseServerURL(s string) (string, error) {
	t := strings.TrimPrefix(strings.TrimSpace(s), "http://")
	t = strings.TrimSuffix(t, "/")
	if strings.Contains(t, "/") || strings.HasPrefix(s, "https://") {
		return "", fmt.Errorf("%q is not host:port", s)
	}
	host, port, err := net.SplitHostPort(t)
	if err != nil || host == "" {
		return "", fmt.Errorf("%q is not host:port", s)
	}
	pn, err := strconv.Atoi(port)
	if err != nil || pn < 1 || pn > 65535 {
		return "", fmt.Errorf("%q: port %q is outside 1..65535", s, port)
	}
	return net.JoinHostPort(host, port), nil
}

// ListenAddr is the address the proxy listens on: hostname:port.
func (c *DisaggConfig) ListenAddr() string {
	return net.JoinHostPort(c.Hostname, strconv.FormatInt(c.Port, 10))
}
