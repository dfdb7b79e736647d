package config

import (
	"fmt"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// kvctl's TensorRT-LLM connector (clients/python/kvctl_engine/trtllm, docs/trtllm.md) is named
// in an LLM API YAML by its module and two classes. TensorRT-LLM imports the module and builds
// the worker on every rank and the scheduler on rank 0 (every owner under attention DP); the
// connector reaches `kvctl serve` on the socket that kv_connector_config.server_url or
// KVCTL_SOCKET names.
const (
	KvctlConnectorModule = "kvctl_engine.trtllm"
	// The classes for a server that reads the pool (role both or consumer).
	KvctlSchedulerClass = "KvctlConnectorScheduler"
	KvctlWorkerClass    = "KvctlConnectorWorker"
	// The classes for role producer, whose worker declares neither block-aligned reuse nor a
	// dropped reuse backoff (it never offers a prefix).
	KvctlProducerSchedulerClass = "KvctlProducerConnectorScheduler"
	KvctlProducerWorkerClass    = "KvctlProducerConnectorWorker"
)

// Environment variables the connector reads where server_url leaves a setting out.
const (
	EnvKvctlSocket    = "KVCTL_SOCKET"
	EnvKvctlModelKey  = "KVCTL_MODEL_KEY"
	EnvKvctlNamespace = "KVCTL_NAMESPACE"
	EnvKvctlRole      = "KVCTL_ROLE"
)

// kvConnectorKeys are the keys TensorRT-LLM's KvCacheConnectorConfig (a StrictBaseModel, which
// refuses any other) knows: llmapi/llm_args.py, plus the seed's mooncake_store and
// admission_query.
var kvConnectorKeys = []string{"connector", "connector_module", "connector_scheduler_class",
	"connector_worker_class", "server_url", "mooncake_store", "admission_query"}

// kvctlURLKeys are the query parameters server_url may carry.
var kvctlURLKeys = []string{"model_key", "namespace", "role", "async_load", "async_load_workers"}

// IsKvctl reports whether the connector is kvctl's (connector_module kvctl_engine.trtllm).
func (c *KVConnectorConfig) IsKvctl() bool {
	return c != nil && c.ConnectorModule == KvctlConnectorModule
}

// KvctlSettings are what kvctl's connector sends `kvctl serve` at registration, resolved from
// server_url (which wins) and the KVCTL_* environment, as the connector resolves them at start-up.
type KvctlSettings struct {
	// Socket is the engine socket's absolute path; "" when neither server_url nor KVCTL_SOCKET
	// names one (the connector then uses kvctl serve's default path).
	Socket           string `json:"socket,omitempty"`
	SocketFrom       string `json:"socket_from,omitempty"` // "server_url" or "KVCTL_SOCKET"
	ModelKey         string `json:"model_key,omitempty"`
	Namespace        string `json:"namespace,omitempty"`
	Role             Role   `json:"role"`
	AsyncLoad        bool   `json:"async_load"`
	AsyncLoadWorkers int64  `json:"async_load_workers,omitempty"`
}

// ParseKvctlServerURL reads server_url: unix:///abs/path.sock or /abs/path.sock, with optional
// query parameters model_key, namespace, role, async_load and async_load_workers. The Python
// connector parses it by the same rules (kvctl_engine.trtllm.settings).
func ParseKvctlServerURL(raw string) (KvctlSettings, error) {
	s := KvctlSettings{}
	if strings.TrimSpace(raw) == "" {
		return s, fmt.Errorf("server_url is empty")
	}
	var path, query string
	switch {
	case strings.HasPrefix(raw, "/"):
		path, query, _ = strings.Cut(raw, "?")
	case strings.HasPrefix(raw, "unix://"):
		u, err := url.Parse(raw)
		if err != nil {
			return s, fmt.Errorf("server_url %q: %w", raw, err)
		}
		if u.Host != "" {
			return s, fmt.Errorf("server_url %q names host %q; a unix socket URL is unix:///absolute/path", raw, u.Host)
		}
		path, query = u.Path, u.RawQuery
	default:
		scheme, _, ok := strings.Cut(raw, "://")
		if ok {
			return s, fmt.Errorf("server_url %q: kvctl serve's engine API is a unix socket (it passes memory handles as descriptors), not %s", raw, scheme)
		}
		return s, fmt.Errorf("server_url %q is a relative path; the engine's working directory is not kvctl serve's", raw)
	}
	if path == "" || !filepath.IsAbs(path) {
		return s, fmt.Errorf("server_url %q names no absolute socket path", raw)
	}
	if filepath.Clean(path) != path {
		return s, fmt.Errorf("server_url %q: the socket path is not clean (want %s)", raw, filepath.Clean(path))
	}
	s.Socket, s.SocketFrom = path, "server_url"
	q, err := url.ParseQuery(query)
	if err != nil {
		return s, fmt.Errorf("server_url %q: query: %w", raw, err)
	}
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		vs := q[k]
		if len(vs) != 1 {
			return s, fmt.Errorf("server_url %q gives %s %d times", raw, k, len(vs))
		}
		v := vs[0]
		switch k {
		case "model_key":
			s.ModelKey = v
		case "namespace":
			s.Namespace = v
		case "role":
			r, err := ParseRole(v)
			if err != nil {
				return s, fmt.Errorf("server_url %q: %w", raw, err)
			}
			s.Role = r
		case "async_load":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return s, fmt.Errorf("server_url %q: async_load %q is not a boolean", raw, v)
			}
			s.AsyncLoad = b
		case "async_load_workers":
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n < 1 {
				return s, fmt.Errorf("server_url %q: async_load_workers %q is not a positive integer", raw, v)
			}
			s.AsyncLoadWorkers = n
		default:
			hint := ""
			if sg := suggest(k, kvctlURLKeys); sg != "" {
				hint = " (did you mean " + sg + "?)"
			}
			return s, fmt.Errorf("server_url %q: unknown parameter %q%s; known: %s", raw, k, hint, strings.Join(kvctlURLKeys, ", "))
		}
	}
	return s, nil
}

// decodeKvctlConnector reads what kvctl's connector adds to kv_connector_config: the keys
// TensorRT-LLM refuses (it forbids extra keys) are errors here.
func decodeKvctlConnector(o *obj, c *KVConnectorConfig) {
	o.str("server_url", &c.ServerURL, true)
	if !c.IsKvctl() {
		return
	}
	for _, k := range kvConnectorKeys {
		o.used[k] = true
	}
	o.rest(SeverityError, " in kv_connector_config: TensorRT-LLM's KvCacheConnectorConfig forbids extra keys")
}

// kvctlSettings resolves the connector's settings as it does at start-up, recording a
// diagnostic for each one that would stop it. It returns nil unless the connector is kvctl's.
func (t *TRTLLMConfig) kvctlSettings(d *dec, getenv func(string) string) *KvctlSettings {
	c := t.Connector
	if !c.IsKvctl() {
		return nil
	}
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	const pURL = pConn + ".server_url"
	s := &KvctlSettings{}
	if c.ServerURL != "" {
		p, err := ParseKvctlServerURL(c.ServerURL)
		if err != nil {
			d.at(SeverityError, pURL, err.Error(), "write unix:///run/kvctl/kvctl.sock?model_key=NAME, or leave server_url out and set "+EnvKvctlSocket)
		} else {
			*s = p
		}
	}
	if env := getenv(EnvKvctlSocket); env != "" {
		switch {
		case !filepath.IsAbs(env):
			d.at(SeverityError, pURL, fmt.Sprintf("%s=%q is not an absolute path", EnvKvctlSocket, env), "set it to kvctl serve's --socket")
		case s.Socket == "" && c.ServerURL == "":
			s.Socket, s.SocketFrom = env, EnvKvctlSocket
		case s.Socket != "" && filepath.Clean(env) != s.Socket:
			d.at(SeverityWarning, pURL, fmt.Sprintf("%s=%s differs from server_url's socket %s; the connector uses server_url", EnvKvctlSocket, env, s.Socket), "")
		}
	}
	if s.Socket == "" && c.ServerURL == "" {
		d.at(SeverityWarning, pConn, "neither server_url nor "+EnvKvctlSocket+" names kvctl serve's socket; the connector uses kvctl serve's default path ($XDG_RUNTIME_DIR/kvctl/kvctl.sock, else /tmp/kvctl-<uid>/kvctl.sock), which depends on the environment each process runs in",
			"set server_url: unix:///path/to/kvctl.sock (kvctl serve --socket)")
	}
	if s.ModelKey == "" {
		s.ModelKey = getenv(EnvKvctlModelKey)
	}
	if s.ModelKey == "" && c.ServerURL != "" && !d.hasAt(pURL) {
		d.at(SeverityError, pURL, "model_key is required: every rank registers it with kvctl serve and it has no default",
			"add ?model_key=NAME to server_url, or set "+EnvKvctlModelKey)
	} else if s.ModelKey == "" && c.ServerURL == "" {
		d.at(SeverityError, pConn, "model_key is required: every rank registers it with kvctl serve and it has no default",
			"set server_url: unix:///path/to/kvctl.sock?model_key=NAME, or set "+EnvKvctlModelKey)
	}
	if s.Namespace == "" {
		s.Namespace = getenv(EnvKvctlNamespace)
	}
	if s.Role == "" {
		if env := getenv(EnvKvctlRole); env != "" {
			r, err := ParseRole(env)
			if err != nil {
				d.at(SeverityError, pConn, EnvKvctlRole+": "+err.Error(), "")
			}
			s.Role = r
		}
	}
	if s.Role == "" {
		s.Role = RoleBoth
	}
	return s
}

// hasAt reports whether an error was already recorded at path.
func (d *dec) hasAt(path string) bool {
	for _, x := range d.diags {
		if x.Path == path && x.Severity == SeverityError {
			return true
		}
	}
	return false
}

// ruleKvctl holds the rules for kvctl's connector: the classes, the role, and the seed's rules
// that apply to a connector declaring what kvctl serve declares (core/connector/declarations.go):
// supports_attention_dp, reports_failed_loads, supports_speculative_prefill,
// requires_completion_reservation and supports_admission_query always, requires_block_aligned_reuse
// and drops_reuse_match_backoff for a role that loads.
func (t *TRTLLMConfig) ruleKvctl(d *dec, s *KvctlSettings) {
	c := t.Connector
	const pSched, pWork = pConn + ".connector_scheduler_class", pConn + ".connector_worker_class"
	if c.Connector != "" {
		d.at(SeverityError, pConn+".connector", "connector preset "+quote(c.Connector)+" names another connector than connector_module "+KvctlConnectorModule,
			"remove connector")
	}
	wantSched, wantWork := KvctlSchedulerClass, KvctlWorkerClass
	if s.Role == RoleProducer {
		wantSched, wantWork = KvctlProducerSchedulerClass, KvctlProducerWorkerClass
	}
	checkClass := func(path, got, want string, known ...string) {
		switch got {
		case "":
			d.at(SeverityError, path, path[len(pConn)+1:]+" is required (TensorRT-LLM refuses the config without it)", "set it to "+want)
		case want:
		case known[0], known[1]:
			d.at(SeverityError, path, fmt.Sprintf("%s declares for another role than %s: its declarations would differ from what kvctl serve returns at registration, and the connector refuses to start", got, s.Role),
				"use "+want+" for role "+string(s.Role))
		default:
			d.at(SeverityError, path, fmt.Sprintf("%s has no class %s", KvctlConnectorModule, quote(got)), "use "+want)
		}
	}
	checkClass(pSched, c.SchedulerClass, wantSched, KvctlSchedulerClass, KvctlProducerSchedulerClass)
	checkClass(pWork, c.WorkerClass, wantWork, KvctlWorkerClass, KvctlProducerWorkerClass)

	if s.Role == RoleCapacity {
		d.at(SeverityError, pConn+".server_url", "role capacity moves no KV, so an engine has nothing to register; a capacity server is kvctl serve itself",
			"use role both, consumer or producer")
		return
	}
	const who = KvctlConnectorModule + " refuses "
	if t.PipelineParallelSize > 1 {
		d.at(SeverityError, "pipeline_parallel_size", fmt.Sprintf(who+"pipeline parallelism, found %d: keys name the attention shard, which pipeline stages would share", t.PipelineParallelSize), "set it to 1")
	}
	if t.ContextParallelSize > 1 {
		d.at(SeverityError, "context_parallel_size", fmt.Sprintf(who+"context parallelism, found %d", t.ContextParallelSize), "set it to 1")
	}
	if t.SlidingWindow() {
		d.at(SeverityError, pKV+".max_attention_window", who+"sliding-window layers: a page the window has passed holds no KV to save", "remove max_attention_window")
	}
	if t.SparseDisableIndexValue != nil && !*t.SparseDisableIndexValue {
		d.at(SeverityError, "sparse_attention_config.sparse_disable_index_value", who+"sparse_disable_index_value: false", "")
	}
	// Seed commit 4: the executor refuses a worker declaring reports_failed_loads on
	// KVCacheManagerV1, which cannot restart a request. Releases without the seed accept it.
	switch {
	case t.UseKVCacheManagerV2 != nil && !*t.UseKVCacheManagerV2:
		d.at(SeverityWarning, "use_kv_cache_manager_v2",
			"the worker declares reports_failed_loads, which a TensorRT-LLM with failed-load restarts refuses on KVCacheManagerV1; releases without it run V1 (the pool is shared by CUDA IPC), and a page lost between lookup and load then fails the server",
			"set use_kv_cache_manager_v2: true")
	case t.UseKVCacheManagerV2 == nil:
		d.atFirst(SeverityWarning, "use_kv_cache_manager_v2",
			"use_kv_cache_manager_v2 is left to TensorRT-LLM; if it picks V1, a release with failed-load restarts refuses the worker's reports_failed_loads",
			"set use_kv_cache_manager_v2: true", pConn)
	}
	if t.KVCache.EnablePartialReuse == nil || *t.KVCache.EnablePartialReuse {
		if s.Role.Loads() {
			d.atFirst(SeverityWarning, pKV+".enable_partial_reuse",
				"with partial reuse a local match can end inside a block, and kvctl offers a prefix only from a block boundary, so such a request is never served from the pool",
				"set enable_partial_reuse: false", pKV, pConn)
		}
	}
	// Seed commits 4 and 10: a failed-load report is owner-local, so under tensor parallelism a
	// parked load that finds a page missing fails the rank. A synchronous load fails the same
	// way (docs/trtllm.md says so); the warning is kept for the asynchronous form, which the
	// earlier connector refused outright under tensor parallelism.
	if s.AsyncLoad && s.Role.Loads() && t.TensorParallelSize > 1 && !t.EnableAttentionDP {
		d.at(SeverityWarning, pConn+".server_url",
			fmt.Sprintf("async_load under tensor parallelism (%d ranks): a page lost before a parked load fails the server, since TensorRT-LLM restarts a request only on a single rank or an attention-DP owner", t.TensorParallelSize),
			"run attention DP, or leave async_load off")
	}
	if s.AsyncLoadWorkers > 0 && !s.AsyncLoad {
		d.at(SeverityWarning, pConn+".server_url", "async_load_workers has no effect unless async_load is true", "")
	}
	if s.AsyncLoad && !s.Role.Loads() {
		d.at(SeverityWarning, pConn+".server_url", "async_load has no effect for role "+string(s.Role)+", which never loads", "")
	}
}
