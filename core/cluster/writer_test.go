package cluster_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// TestTRTLLMShapedWriter: Mooncake's own Python store client, as a TensorRT-LLM rank would,
// writes a prompt's KV pages under the keys `kvctl hash` gives; `kvctl probe-pool` against the
// master reports every block as a hit; an engine on `kvctl serve` loads them byte for byte.
func TestTRTLLMShapedWriter(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	py := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 32 << 20})
	const blocks = 8
	tokens := make([]int64, blocks*T+1)
	for i := range tokens {
		tokens[i] = int64(7000 + 13*i)
	}
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "prompt.json")
	b, _ := json.Marshal(tokens)
	if err := os.WriteFile(tokFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	keyArgs := []string{"--tokens-file", tokFile, "--model-key", "cluster-model", "--tokens-per-block", "16", "--layer-group", "0:4096"}
	out, err := exec.Command(kvctl(t), append([]string{"hash", "--keys-only"}, keyArgs...)...).Output()
	if err != nil {
		t.Fatalf("kvctl hash: %v", err)
	}
	keys := strings.Fields(string(out))
	if len(keys) != blocks {
		t.Fatalf("kvctl hash gave %d keys, want %d: %q", len(keys), blocks, out)
	}
	for i, k := range keys {
		if rc := py.Put(k, enginesim.KVBytes(tokens, i, T, 0, 0, false, pageBytes), mooncaketest.PutOptions{}); rc != 0 {
			t.Fatalf("python put %s: rc %d", k, rc)
		}
	}

	probe := exec.Command(kvctl(t), append([]string{"probe-pool", "--pool", m.AdminURL, "--expect-hit", "8", "-o", "json"}, keyArgs...)...)
	pout, err := probe.CombinedOutput()
	if err != nil {
		t.Fatalf("kvctl probe-pool: %v\n%s", err, pout)
	}
	var pr struct {
		Summary struct {
			HitBlocks int `json:"hit_blocks"`
		} `json:"summary"`
	}
	if err := json.Unmarshal(pout, &pr); err != nil || pr.Summary.HitBlocks != blocks {
		t.Fatalf("probe-pool: %+v %v\n%s", pr, err, pout)
	}

	h := startServe(t, m, "B")
	h.waitReady(t)
	res := runEngine(t, simConfig(h, "reader"), []enginesim.Request{{ID: "p", Tokens: tokens}}, 1)
	if res.LoadedBlocks != blocks || res.ComputedBlocks != 0 {
		t.Fatalf("engine on kvctl serve: %+v; want all %d blocks loaded (each checked byte for byte)", res, blocks)
	}
	if st := h.stats(t); st.Backend.SegmentServed == nil || st.Backend.SegmentServed.BytesRead != 0 {
		t.Fatalf("B's own segment served reads: %+v", st.Backend.SegmentServed)
	}
}
