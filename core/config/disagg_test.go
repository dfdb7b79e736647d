package config

import (
	"strings"
	"testing"
)

func TestDisaggConfig(t *testing.T) {
	const base = `hostname: 0.0.0.0
port: 8100
backend: pytorch
max_retries: 2
node_id: 7
context_servers:
  num_instances: 2
  max_batch_size: 16
  kv_cache_config:
    tokens_per_block: 64
  router:
    type: pool_aware
    pool: 10.0.0.5:8080
    model_key: llama
    layer_groups: ["0:65536"]
    lookup_timeout_ms: 20
  urls:
    - "http://ctx-0:8001/"
    - "ctx-1:8001"
generation_servers:
  num_instances: 1
  urls: ["gen-0:8002"]
  router:
    type: load_balancing
    use_tokens: true
`
	f, diags := Load("disagg_config.yaml", []byte(base), LoadOptions{})
	if diags.HasErrors() || f.Kind != KindDisagg {
		t.Fatalf("kind %v: %v", f.Kind, diags)
	}
	c := f.Disagg
	if c.ListenAddr() != "0.0.0.0:8100" || c.MaxRetries != 2 || *c.NodeID != 7 {
		t.Fatalf("%+v", c)
	}
	if got := strings.Join(c.Context.URLs, ","); got != "ctx-0:8001,ctx-1:8001" {
		t.Fatalf("context urls %s", got)
	}
	r := c.Context.Router
	if r.Type != RouterPoolAware || r.TokensPerBlock != 64 || r.MaxActiveRequests != 16 || r.LookupTimeoutMs != 20 || r.Pool != "10.0.0.5:8080" {
		t.Fatalf("router %+v", r)
	}
	if g := c.Generation.Router; g.Type != RouterLoadBalancing || !g.UseTokens {
		t.Fatalf("generation router %+v", g)
	}
	if c.KVTransferTimeoutMs != DefaultKVTransferTimeoutMs || c.KVTransferTimeoutFrom != "" || c.RequestTimeoutS != 180 {
		t.Fatalf("defaults: %d %q %d", c.KVTransferTimeoutMs, c.KVTransferTimeoutFrom, c.RequestTimeoutS)
	}
}

// kv_transfer_timeout_ms: the proxy's own key wins over the generation servers', which wins over
// the top-level cache_transceiver_config; every one must be positive.
func TestDisaggKVTransferTimeout(t *testing.T) {
	const servers = "context_servers:\n  urls: [\"a:1\"]\ngeneration_servers:\n  urls: [\"b:2\"]\n"
	for _, tc := range []struct {
		name, text, from string
		want             int64
		err              string
	}{
		{"default", servers, "", 60000, ""},
		{"top-level transceiver", servers + "cache_transceiver_config:\n  kv_transfer_timeout_ms: 1000\n", "cache_transceiver_config.kv_transfer_timeout_ms", 1000, ""},
		{"generation transceiver", strings.Replace(servers, "urls: [\"b:2\"]\n", "urls: [\"b:2\"]\n  cache_transceiver_config:\n    kv_transfer_timeout_ms: 2000\n", 1),
			"generation_servers.cache_transceiver_config.kv_transfer_timeout_ms", 2000, ""},
		{"proxy key wins", servers + "kv_transfer_timeout_ms: 3000\ncache_transceiver_config:\n  kv_transfer_timeout_ms: 1000\n", "kv_transfer_timeout_ms", 3000, ""},
		{"zero", servers + "kv_transfer_timeout_ms: 0\n", "", 0, "must be a positive number of milliseconds, found 0"},
		{"string", servers + "kv_transfer_timeout_ms: soon\n", "", 0, "want an integer"},
		{"conflict", strings.Replace(servers, "urls: [\"b:2\"]\n", "urls: [\"b:2\"]\n  cache_transceiver_config:\n    kv_transfer_timeout_ms: 2000\n", 1) +
			"cache_transceiver_config:\n  kv_transfer_timeout_ms: 1000\n", "", 0, "differs from the top-level"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, diags := Load("d.yaml", []byte(tc.text), LoadOptions{Kind: KindDisagg})
			if tc.err != "" {
				if !diags.HasErrors() || !strings.Contains(diags.Errors()[0].Message, tc.err) {
					t.Fatalf("want %q, got %v", tc.err, diags)
				}
				return
			}
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			if f.Disagg.KVTransferTimeoutMs != tc.want || f.Disagg.KVTransferTimeoutFrom != tc.from {
				t.Fatalf("%d from %q", f.Disagg.KVTransferTimeoutMs, f.Disagg.KVTransferTimeoutFrom)
			}
		})
	}
	// TensorRT-LLM's LLM API YAML carries it in cache_transceiver_config too.
	f, diags := Load("gen.yaml", []byte("cache_transceiver_config:\n  backend: UCX\n  kv_transfer_timeout_ms: 5000\n"), LoadOptions{})
	if diags.HasErrors() || f.TRTLLM.KVTransferTimeoutMs == nil || *f.TRTLLM.KVTransferTimeoutMs != 5000 {
		t.Fatalf("%v %+v", diags, f.TRTLLM)
	}
}

func TestDisaggConfigErrors(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"context_servers:\n  urls: []\ngeneration_servers:\n  urls: [\"b:2\"]\n", "no context server"},
		{"context_servers:\n  urls: [\"a:1\", \"a:1\"]\ngeneration_servers:\n  urls: [\"b:2\"]\n", "duplicated context server a:1"},
		{"context_servers:\n  urls: [\"a:99999\"]\ngeneration_servers:\n  urls: [\"b:2\"]\n", "outside 1..65535"},
		{"context_servers:\n  urls: [\"a:1\"]\ngeneration_servers:\n  urls: [\"b:2\"]\n  router:\n    type: work_aware\n", "routes context servers only"},
		{"context_servers:\n  urls: [\"a:1\"]\ngeneration_servers:\n  urls: [\"b:2\"]\nnode_id: 300\n", "node_id must be in range"},
		{"disagg_cluster:\n  cluster_uri: etcd://x\n", "not supported"},
		{"context_servers:\n  urls: [\"a:1\"]\n  router:\n    type: pool_aware\n    pool: p:1\n    model_key: m\n    layer_groups: [\"zero\"]\ngeneration_servers:\n  urls: [\"b:2\"]\n", "group:bytes_per_page"},
	} {
		_, diags := Load("d.yaml", []byte(tc.text), LoadOptions{})
		found := false
		for _, d := range diags.Errors() {
			found = found || strings.Contains(d.Message, tc.want)
		}
		if !found {
			t.Errorf("%q: want an error with %q, got %v", tc.text, tc.want, diags)
		}
	}
}

// FuzzDisaggConfig: any text loads into diagnostics, never an internal error.
func FuzzDisaggConfig(f *testing.F) {
	f.Add("context_servers:\n  urls: [\"a:1\"]\ngeneration_servers:\n  urls: [\"b:2\"]\nkv_transfer_timeout_ms: 5\n")
	f.Add("context_servers:\n  num_instances: 2\n  router: {type: pool_aware, layer_groups: [1]}\n")
	f.Add("generation_servers: [1,2]\ncontext_servers: null\n")
	f.Fuzz(func(t *testing.T, text string) {
		_, diags := Load("d.yaml", []byte(text), LoadOptions{Kind: KindDisagg})
		for _, d := range diags {
			if strings.Contains(d.Message, "internal error") {
				t.Fatalf("%q: %v", text, d)
			}
		}
	})
}
