package config

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// The cases are shared with the Python connector's tests (testdata/kvctl-server-url.json).
func TestParseKvctlServerURL(t *testing.T) {
	data, err := os.ReadFile("../../testdata/kvctl-server-url.json")
	if err != nil {
		t.Fatal(err)
	}
	var vectors struct {
		Cases []struct {
			Raw  string `json:"raw"`
			Want *struct {
				Socket           string `json:"socket"`
				ModelKey         string `json:"model_key"`
				Namespace        string `json:"namespace"`
				Role             Role   `json:"role"`
				AsyncLoad        bool   `json:"async_load"`
				AsyncLoadWorkers int64  `json:"async_load_workers"`
			} `json:"want"`
			Error string `json:"error"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &vectors); err != nil {
		t.Fatal(err)
	}
	if len(vectors.Cases) < 10 {
		t.Fatalf("only %d cases", len(vectors.Cases))
	}
	for _, c := range vectors.Cases {
		t.Run(c.Raw, func(t *testing.T) {
			got, err := ParseKvctlServerURL(c.Raw)
			if c.Error != "" {
				if err == nil || !strings.Contains(err.Error(), c.Error) {
					t.Fatalf("ParseKvctlServerURL(%q) error %v, want one containing %q", c.Raw, err, c.Error)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseKvctlServerURL(%q): %v", c.Raw, err)
			}
			w := c.Want
			want := KvctlSettings{Socket: w.Socket, SocketFrom: "server_url", ModelKey: w.ModelKey, Namespace: w.Namespace,
				Role: w.Role, AsyncLoad: w.AsyncLoad, AsyncLoadWorkers: w.AsyncLoadWorkers}
			if got != want {
				t.Fatalf("ParseKvctlServerURL(%q) = %+v, want %+v", c.Raw, got, want)
			}
		})
	}
}

// kvctlYAML is a valid LLM API YAML naming kvctl's connector; cases edit it.
const kvctlYAML = `backend: pytorch
tensor_parallel_size: 2
use_kv_cache_manager_v2: true
disable_overlap_scheduler: true
kv_cache_config:
  tokens_per_block: 32
  enable_partial_reuse: false
kv_connector_config:
  connector_module: kvctl_engine.trtllm
  connector_scheduler_class: KvctlConnectorScheduler
  connector_worker_class: KvctlConnectorWorker
  server_url: unix:///run/kvctl/kvctl.sock?model_key=m
`

type wantDiag struct {
	sev  Severity
	path string
	msg  string // a substring of the message
}

func TestKvctlConnectorRules(t *testing.T) {
	edit := func(pairs ...string) string {
		s := kvctlYAML
		for i := 0; i < len(pairs); i += 2 {
			if !strings.Contains(s, pairs[i]) {
				t.Fatalf("case edits %q, which the base YAML lacks", pairs[i])
			}
			s = strings.Replace(s, pairs[i], pairs[i+1], 1)
		}
		return s
	}
	const url = "  server_url: unix:///run/kvctl/kvctl.sock?model_key=m\n"
	cases := []struct {
		name string
		yaml string
		env  map[string]string
		want []wantDiag // exactly these, in order
	}{
		{name: "valid", yaml: kvctlYAML},
		{name: "socket and model key from the environment", yaml: edit(url, ""),
			env: map[string]string{EnvKvctlSocket: "/run/kvctl/kvctl.sock", EnvKvctlModelKey: "m"}},
		{name: "no socket anywhere", yaml: edit(url, ""), env: map[string]string{EnvKvctlModelKey: "m"},
			want: []wantDiag{{SeverityWarning, pConn, "neither server_url nor KVCTL_SOCKET"}}},
		{name: "no model key", yaml: edit("?model_key=m", ""),
			want: []wantDiag{{SeverityError, pConn + ".server_url", "model_key is required"}}},
		{name: "no model key nor url", yaml: edit(url, ""), env: map[string]string{EnvKvctlSocket: "/s.sock"},
			want: []wantDiag{{SeverityError, pConn, "model_key is required"}}},
		{name: "relative KVCTL_SOCKET", yaml: edit(url, ""), env: map[string]string{EnvKvctlSocket: "s.sock", EnvKvctlModelKey: "m"},
			want: []wantDiag{{SeverityWarning, pConn, "neither server_url"}, {SeverityError, pConn + ".server_url", "not an absolute path"}}},
		{name: "KVCTL_SOCKET differs", yaml: kvctlYAML, env: map[string]string{EnvKvctlSocket: "/other.sock"},
			want: []wantDiag{{SeverityWarning, pConn + ".server_url", "the connector uses server_url"}}},
		{name: "tcp url", yaml: edit("unix:///run/kvctl/kvctl.sock?model_key=m", "tcp://localhost:5555"),
			want: []wantDiag{{SeverityError, pConn + ".server_url", "unix socket"}}},
		{name: "extra key", yaml: edit(url, url+"  role: both\n"),
			want: []wantDiag{{SeverityError, pConn + ".role", "forbids extra keys"}}},
		{name: "missing worker class", yaml: edit("  connector_worker_class: KvctlConnectorWorker\n", ""),
			want: []wantDiag{{SeverityError, pConn + ".connector_worker_class", "is required"}}},
		{name: "unknown class", yaml: edit("class: KvctlConnectorScheduler", "class: Leader"),
			want: []wantDiag{{SeverityError, pConn + ".connector_scheduler_class", "has no class"}}},
		{name: "producer role needs producer classes", yaml: edit("model_key=m", "model_key=m&role=producer"),
			want: []wantDiag{{SeverityError, pConn + ".connector_scheduler_class", "another role"},
				{SeverityError, pConn + ".connector_worker_class", "another role"}}},
		{name: "producer classes", yaml: edit("model_key=m", "model_key=m&role=producer", ": KvctlConnectorScheduler", ": KvctlProducerConnectorScheduler",
			": KvctlConnectorWorker", ": KvctlProducerConnectorWorker")},
		{name: "role from the environment", yaml: kvctlYAML, env: map[string]string{EnvKvctlRole: "producer"},
			want: []wantDiag{{SeverityError, pConn + ".connector_scheduler_class", "another role"},
				{SeverityError, pConn + ".connector_worker_class", "another role"}}},
		{name: "capacity", yaml: edit("model_key=m", "model_key=m&role=capacity"),
			want: []wantDiag{{SeverityError, pConn + ".server_url", "role capacity moves no KV"}}},
		{name: "preset too", yaml: edit("  connector_module:", "  connector: lmcache\n  connector_module:"),
			want: []wantDiag{{SeverityError, pConn + ".connector", "names another connector"}}},
		{name: "mooncake_store block", yaml: edit(url, url+"  mooncake_store:\n    pool: host:1\n    model_key: m\n"),
			want: []wantDiag{{SeverityError, pStore, "not mooncake-store"}}},
		{name: "pipeline parallel", yaml: edit("tensor_parallel_size: 2", "pipeline_parallel_size: 2"),
			want: []wantDiag{{SeverityError, "pipeline_parallel_size", "pipeline parallelism"}}},
		{name: "context parallel", yaml: edit("tensor_parallel_size: 2", "context_parallel_size: 2"),
			want: []wantDiag{{SeverityError, "context_parallel_size", "context parallelism"}}},
		{name: "sliding window", yaml: edit("  tokens_per_block: 32\n", "  tokens_per_block: 32\n  max_attention_window: [4096]\n"),
			want: []wantDiag{{SeverityError, pKV + ".max_attention_window", "sliding-window"}}},
		{name: "V1", yaml: edit("use_kv_cache_manager_v2: true", "use_kv_cache_manager_v2: false"),
			want: []wantDiag{{SeverityWarning, "use_kv_cache_manager_v2", "reports_failed_loads"}}},
		{name: "manager left to auto", yaml: edit("use_kv_cache_manager_v2: true\n", ""),
			want: []wantDiag{{SeverityWarning, "use_kv_cache_manager_v2", "left to TensorRT-LLM"}}},
		{name: "partial reuse", yaml: edit("  enable_partial_reuse: false\n", ""),
			want: []wantDiag{{SeverityWarning, pKV + ".enable_partial_reuse", "block boundary"}}},
		{name: "partial reuse, producer", yaml: edit("  enable_partial_reuse: false\n", "", "model_key=m", "model_key=m&role=producer",
			": KvctlConnectorScheduler", ": KvctlProducerConnectorScheduler", ": KvctlConnectorWorker", ": KvctlProducerConnectorWorker")},
		{name: "async under TP", yaml: edit("model_key=m", "model_key=m&async_load=true"),
			want: []wantDiag{{SeverityWarning, pConn + ".server_url", "async_load under tensor parallelism"}}},
		{name: "async under attention DP", yaml: edit("model_key=m", "model_key=m&async_load=true", "backend: pytorch\n",
			"backend: pytorch\nenable_attention_dp: true\ncache_transceiver_config:\n  backend: UCX\n")},
		{name: "async workers without async", yaml: edit("model_key=m", "model_key=m&async_load_workers=2"),
			want: []wantDiag{{SeverityWarning, pConn + ".server_url", "no effect unless async_load"}}},
		{name: "aggregated attention DP", yaml: edit("backend: pytorch\n", "backend: pytorch\nenable_attention_dp: true\n"),
			want: []wantDiag{{SeverityWarning, "enable_attention_dp", "aggregated serving under attention DP"}}},
		{name: "prefix reservations", yaml: edit("backend: pytorch\n", "backend: pytorch\nscheduler_config:\n  enable_prefix_aware_scheduling: true\n"),
			want: []wantDiag{{SeverityError, "scheduler_config.enable_prefix_aware_scheduling", "kvctl_engine.trtllm role both declares reports_failed_loads"}}},
		{name: "speculative prefill", yaml: edit("backend: pytorch\n", "backend: pytorch\ncache_transceiver_config:\n  backend: UCX\nspeculative_config:\n  decoding_type: MTP\n  num_nextn_predict_layers: 3\n")},
		{name: "speculative without disaggregation", yaml: edit("backend: pytorch\n", "backend: pytorch\nspeculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 3\n"),
			want: []wantDiag{{SeverityError, "cache_transceiver_config.backend", "disaggregated context server"}}},
		{name: "two-model speculation", yaml: edit("backend: pytorch\n", "backend: pytorch\ncache_transceiver_config:\n  backend: UCX\nspeculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 3\n  eagle3_one_model: false\n"),
			want: []wantDiag{{SeverityError, pSpec + ".eagle3_one_model", "must run as one model"}}},
		{name: "admission query", yaml: edit(url, url+"  admission_query:\n    max_uncharged_parks: 2\n")},
		{name: "admission query under attention DP", yaml: edit(url, url+"  admission_query:\n    max_uncharged_parks: 2\n", "backend: pytorch\n", "backend: pytorch\nenable_attention_dp: true\ncache_transceiver_config:\n  backend: UCX\n"),
			want: []wantDiag{{SeverityWarning, pAdmit, "ignored under attention DP"}}},
		{name: "beam search", yaml: edit("backend: pytorch\n", "backend: pytorch\nmax_beam_width: 2\n"),
			want: []wantDiag{{SeverityError, "max_beam_width", "refuses beam search"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, ds := Load("llm_api.yaml", []byte(c.yaml), LoadOptions{Env: func(k string) string { return c.env[k] }})
			if len(ds) != len(c.want) {
				t.Fatalf("got %d diagnostics, want %d:\n%s", len(ds), len(c.want), text(ds))
			}
			for i, w := range c.want {
				g := ds[i]
				if g.Severity != w.sev || g.Path != w.path || !strings.Contains(g.Message, w.msg) {
					t.Errorf("diagnostic %d = %s\nwant %s at %s containing %q", i, g.String(), w.sev, w.path, w.msg)
				}
				if g.Line <= 0 {
					t.Errorf("diagnostic %d has no line: %s", i, g.String())
				}
			}
		})
	}
}

// The example in examples/ (docs/trtllm.md) passes without a warning.
func TestKvctlExampleIsValid(t *testing.T) {
	data, err := os.ReadFile("../../examples/llm_api_kvctl.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f, ds := Load("llm_api_kvctl.yaml", data, LoadOptions{Env: func(string) string { return "" }})
	if len(ds) != 0 {
		t.Fatalf("the example has diagnostics:\n%s", text(ds))
	}
	if f == nil || f.Kind != KindTRTLLM || !f.TRTLLM.Connector.IsKvctl() {
		t.Fatalf("the example did not load as a TensorRT-LLM YAML naming kvctl's connector: %+v", f)
	}
}

// Other connectors keep ignoring server_url and keys TensorRT-LLM's own presets carry.
func TestServerURLIgnoredForOtherConnectors(t *testing.T) {
	y := "kv_connector_config:\n  connector: lmcache\n  server_url: tcp://localhost:5555\n"
	f, ds := Load("llm_api.yaml", []byte(y), LoadOptions{})
	if ds.HasErrors() {
		t.Fatalf("lmcache with a server_url: %s", text(ds))
	}
	if f.TRTLLM.Connector.ServerURL != "tcp://localhost:5555" {
		t.Fatalf("server_url = %q", f.TRTLLM.Connector.ServerURL)
	}
}
