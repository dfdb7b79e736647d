package probepool

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// Pages are put into a real mooncake_master by Mooncake's own Python client under the exact
// keys vLLM's MooncakeStoreConnector and SGLang's HiCache write (taken from engine-keys.json, not
// from kvctl), and kvctl probe-pool, given the engine's settings as flags, must find them.

type engineCase struct {
	Name     string        `json:"name"`
	Tokens   []json.Number `json:"tokens"`
	Keys     []json.RawMessage
	RawChunk []struct {
		Chunks []struct {
			Key string `json:"key"`
		} `json:"chunks"`
		ObjectKeys []string `json:"object_keys"`
	} `json:"keys"`
}

// vectorKeys returns a case's tokens and the keys of its first key configuration, grouped by
// block (vLLM: one key a chunk; SGLang: the K and V objects of a page).
func vectorKeys(t *testing.T, engine, name string, perBlock int) (tokens []string, blocks [][]string) {
	t.Helper()
	data, err := os.ReadFile("../../testdata/engine-keys.json")
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]struct {
		Cases []engineCase `json:"cases"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	for _, c := range f[engine].Cases {
		if c.Name != name {
			continue
		}
		for _, n := range c.Tokens {
			tokens = append(tokens, n.String())
		}
		var flat []string
		for _, ch := range c.RawChunk[0].Chunks {
			flat = append(flat, ch.Key)
		}
		flat = append(flat, c.RawChunk[0].ObjectKeys...)
		for i := 0; i < len(flat); i += perBlock {
			blocks = append(blocks, flat[i:i+perBlock])
		}
		return tokens, blocks
	}
	t.Fatalf("no %s case %q", engine, name)
	return nil, nil
}

// probeJSON runs `kvctl probe-pool ARGS… -o json` through the command's flag parsing.
func probeJSON(t *testing.T, args []string) *probe.Report {
	t.Helper()
	ios, _, out, errOut := cmdutil.Test()
	f := &cmdutil.Factory{IOStreams: ios, Seams: cmdutil.Seams{Now: time.Now, Sleep: func(context.Context, time.Duration) error { return nil }}, Getenv: func(string) string { return "" }}
	cmd := NewCmdProbePool(f, func(o *Options) error {
		o.OutputFormat = cmdutil.FormatJSON // -o belongs to the root command
		return runProbePool(context.Background(), o)
	})
	cmd.SetArgs(args)
	cmd.SetOut(errOut)
	cmd.SetErr(errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err != nil {
		t.Fatalf("probe-pool %v: exit %d: %v", args, cmdutil.ExitCode(err), err)
	}
	var r probe.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return &r
}

func states(r *probe.Report) string {
	var s []string
	for _, b := range r.Blocks {
		s = append(s, b.State)
	}
	return strings.Join(s, ",")
}

func TestProbeVLLMPagesOnRealMaster(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	c := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 64 << 20})
	tokens, chunks := vectorKeys(t, "vllm", "three_blocks_plus_tail_sha256", 1)
	if len(chunks) != 3 {
		t.Fatalf("%d chunks", len(chunks))
	}
	// Chunks 0 and 2 saved, chunk 1 evicted: a hole behind a one-chunk hit.
	for _, i := range []int{0, 2} {
		if rc := c.Put(chunks[i][0], bytes.Repeat([]byte{byte(i)}, 4096), mooncaketest.PutOptions{}); rc != 0 {
			t.Fatalf("put %s: rc %d", chunks[i][0], rc)
		}
	}
	flags := []string{"--format", "vllm", "--python-hash-seed", "0", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--tokens-per-block", "16"}
	for _, pool := range []string{m.AdminURL, "rpc://" + m.RPCAddr} {
		r := probeJSON(t, append(append([]string{"--pool", pool}, flags...), tokens...))
		if states(r) != "hit,hole,stored" || r.Summary.HitTokens != 16 || r.Summary.RecomputedStoredTokens != 16 || r.Engine != "vLLM" {
			t.Errorf("%s: states %s, summary %+v", pool, states(r), r.Summary)
		}
		if r.UncoveredTokens != 2 || r.Blocks[1].Keys[0].Key != chunks[1][0] || r.Diagnosis == nil || r.Diagnosis.Code != probe.DiagHoleAfterHit {
			t.Errorf("%s: uncovered %d, block 1 %+v, diagnosis %+v", pool, r.UncoveredTokens, r.Blocks[1], r.Diagnosis)
		}
	}

	// Misses explained from the master's listing: another PYTHONHASHSEED, another hash
	// algorithm, another model, another TP layout.
	diag := func(extra ...string) *probe.Diagnosis {
		args := append([]string{"--pool", m.AdminURL}, flags...)
		args = append(append(args, extra...), tokens[16:]...) // a prompt whose first chunk is not stored
		return probeJSON(t, args).Diagnosis
	}
	if d := diag(); d == nil || d.Code != probe.DiagOtherHashes || !strings.Contains(d.Text, "PYTHONHASHSEED") {
		t.Errorf("other tokens: %+v", d)
	}
	if d := diag("--format", "vllm-xxhash"); d == nil || d.Code != probe.DiagOtherHashAlgorithm {
		t.Errorf("xxhash against sha256 pages: %+v", d)
	}
	if d := diag("--model", "/models/Qwen3-8B"); d == nil || d.Code != probe.DiagModelNotInPool || !strings.Contains(d.Text, "Llama-3.1-8B-Instruct") {
		t.Errorf("another model: %+v", d)
	}
	// The same prompt under another KV group: pages exist only under group 0.
	args := append(append([]string{"--pool", m.AdminURL}, flags...), "--kv-group", "1")
	if d := probeJSON(t, append(args, tokens...)).Diagnosis; d == nil || d.Code != probe.DiagOtherWorldSize || !strings.Contains(d.Text, "group:0") {
		t.Errorf("another KV group: %+v", d)
	}
	// A TP world of 2 with 2 KV heads needs key ranks 0 and 1; the engine wrote rank 0 only.
	args = append(append([]string{"--pool", m.AdminURL}, flags...), "--world-size", "2", "--num-kv-heads", "2")
	if r := probeJSON(t, append(args, tokens...)); r.Summary.HitBlocks != 0 || r.Summary.KeysPresent != 2 || r.Diagnosis == nil || r.Diagnosis.Code != probe.DiagIncompleteBlocks {
		t.Errorf("TP 2: summary %+v diagnosis %+v", r.Summary, r.Diagnosis)
	}
}

func TestProbeSGLangPagesOnRealMaster(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	c := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 64 << 20})
	tokens, pages := vectorKeys(t, "sglang", "page_32_x4", 2)
	if len(pages) != 4 {
		t.Fatalf("%d pages", len(pages))
	}
	// Every object but page 2's V: a hole at page 2 with page 3 stored behind it.
	for i, objs := range pages {
		for j, k := range objs {
			if i == 2 && j == 1 {
				continue
			}
			if rc := c.Put(k, bytes.Repeat([]byte{byte(i)}, 2048), mooncaketest.PutOptions{}); rc != 0 {
				t.Fatalf("put %s: rc %d", k, rc)
			}
		}
	}
	args := append([]string{"--pool", "rpc://" + m.RPCAddr, "--format", "sglang", "--tokens-per-block", "32",
		"--model", "meta-llama/Llama-3.1-8B-Instruct", "--world-size", "1"}, tokens...)
	r := probeJSON(t, args)
	if states(r) != "hit,hit,hole,stored" || r.Summary.HitTokens != 64 || r.Summary.KeysPresent != 7 || r.Summary.KeysChecked != 8 {
		t.Errorf("states %s, summary %+v", states(r), r.Summary)
	}
	if r.Blocks[2].Keys[1].Present || r.Blocks[2].Keys[1].Key != pages[2][1] {
		t.Errorf("page 2: %+v", r.Blocks[2])
	}
	// A TP world of 2 needs rank 1's objects too, which no engine wrote.
	r = probeJSON(t, append([]string{"--pool", m.AdminURL, "--format", "sglang", "--tokens-per-block", "32",
		"--model", "meta-llama/Llama-3.1-8B-Instruct", "--world-size", "2"}, tokens...))
	if r.Summary.HitBlocks != 0 || r.Summary.KeysChecked != 16 || r.Diagnosis == nil || r.Diagnosis.Code != probe.DiagIncompleteBlocks {
		t.Errorf("world 2: summary %+v diagnosis %+v", r.Summary, r.Diagnosis)
	}
	// The engine's extra config JSON gives the tag: pages of another tag are not this probe's.
	r = probeJSON(t, append([]string{"--pool", m.AdminURL, "--format", "sglang", "--tokens-per-block", "32",
		"--model", "meta-llama/Llama-3.1-8B-Instruct", "--from-config", `{"extra_backend_tag":"tenantB"}`}, tokens...))
	if r.Summary.HitBlocks != 0 || r.Diagnosis == nil || r.Diagnosis.Code != probe.DiagModelNotInPool || !strings.Contains(r.Diagnosis.Text, strconv.Quote("meta-llama-Llama-3.1-8B-Instruct_")) {
		t.Errorf("another tag: %+v %+v", r.Summary, r.Diagnosis)
	}
}
