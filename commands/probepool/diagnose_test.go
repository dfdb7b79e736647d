package probepool

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// putPrompt stores every lookup key of the prompt o describes (its first blocks only, when
// blocks > 0), as an engine with those settings would have saved it.
func putPrompt(t *testing.T, p *embedded.Embedded, o *cmdutil.KeyFlags, blocks int) {
	t.Helper()
	layout := deriveLayout(t, o)
	for i, b := range layout.Blocks {
		if blocks > 0 && i >= blocks {
			break
		}
		bufs := make([][]byte, len(b.Keys))
		for j := range bufs {
			bufs[j] = bytes.Repeat([]byte{1}, 16)
		}
		for j, c := range p.BatchPut(context.Background(), b.Keys, bufs, pool.ReplicateConfig{}) {
			if c != pool.OK {
				t.Fatalf("put %s: %v", b.Keys[j], c)
			}
		}
	}
}

// TestProbeExplainsMiss stores a prompt the way an engine with one setting changed would have,
// probes it with the test's settings against a real kvctl serve, and checks the diagnosis:
// its stable code, the flag that would match, and that the table says it too.
func TestProbeExplainsMiss(t *testing.T) {
	tests := []struct {
		name   string
		stored func(o *cmdutil.KeyFlags) // nil stores nothing
		blocks int
		probe  func(o *cmdutil.KeyFlags)
		code   string
		flag   string
	}{
		{name: "empty pool", code: probe.DiagPoolEmpty},
		{name: "another model", stored: func(o *cmdutil.KeyFlags) { o.ModelKey = "mistral-test" }, code: probe.DiagModelNotInPool, flag: "--model-key mistral-test"},
		{name: "another namespace", stored: func(o *cmdutil.KeyFlags) { o.Namespace = "staging" }, code: probe.DiagOtherNamespace, flag: "--namespace staging"},
		{name: "another world size", stored: func(o *cmdutil.KeyFlags) { o.WorldSize, o.Rank = 4, 0 }, code: probe.DiagOtherWorldSize, flag: "--world-size 4"},
		{name: "another tokens per block", stored: func(o *cmdutil.KeyFlags) { o.TokensPerBlock = 8 }, code: probe.DiagOtherTokensPerBlock, flag: "--tokens-per-block 8"},
		{name: "another page size", stored: func(o *cmdutil.KeyFlags) { o.LayerGroups = []string{"0:128", "1:32"} }, code: probe.DiagOtherPageSize, flag: "--layer-group 0:128"},
		{name: "another salt", stored: func(o *cmdutil.KeyFlags) { o.CacheSalt, o.HasCacheSalt = "tenant-b", true }, code: probe.DiagOtherHashes},
		{name: "only the start stored", stored: func(*cmdutil.KeyFlags) {}, blocks: 3, code: probe.DiagPrefixThenMissing},
		{name: "all stored", stored: func(*cmdutil.KeyFlags) {}, code: probe.DiagFullHit},
		{name: "shorter than a block", probe: func(o *cmdutil.KeyFlags) { o.Args = []string{"1 2 3"} }, code: probe.DiagShortPrompt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, addr := startServe(t)
			ios, _, _, _ := cmdutil.Test()
			if tt.stored != nil {
				o := promptKeys(ios)
				tt.stored(o)
				putPrompt(t, d.Pool(), o, tt.blocks)
			}
			var out bytes.Buffer
			ios, _, stdout, _ := cmdutil.Test()
			opts := options(ios, addr, cmdutil.FormatJSON)
			if tt.probe != nil {
				tt.probe(opts.Keys)
			}
			if err := runProbePool(context.Background(), opts); err != nil {
				t.Fatal(err)
			}
			out.Write(stdout.Bytes())
			var res probe.Report
			if err := json.Unmarshal(out.Bytes(), &res); err != nil {
				t.Fatal(err)
			}
			if res.Diagnosis == nil || res.Diagnosis.Code != tt.code || res.Diagnosis.Flag != tt.flag || res.Diagnosis.Text == "" {
				t.Fatalf("diagnosis %+v, want code %s flag %q", res.Diagnosis, tt.code, tt.flag)
			}

			ios, _, stdout, _ = cmdutil.Test()
			opts = options(ios, addr, cmdutil.FormatTable)
			if tt.probe != nil {
				tt.probe(opts.Keys)
			}
			if err := runProbePool(context.Background(), opts); err != nil {
				t.Fatal(err)
			}
			table := stdout.String()
			if tt.code == probe.DiagFullHit {
				if strings.Contains(table, "why:") {
					t.Errorf("a full hit explained:\n%s", table)
				}
				return
			}
			if !strings.Contains(table, "why: "+res.Diagnosis.Text) || !strings.Contains(table, "["+tt.code+"]") || (tt.flag != "" && !strings.Contains(table, "try "+tt.flag)) {
				t.Errorf("table does not explain the miss:\n%s", table)
			}
		})
	}
}
