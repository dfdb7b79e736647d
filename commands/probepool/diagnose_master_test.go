package probepool

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// TestProbeExplainsMissOnRealMaster stores a prompt's pages through Mooncake's own Python
// client into a real mooncake_master, as an engine with another tokens per block (then another
// world size) would have, and probes the master's HTTP admin address with the test's settings:
// the diagnosis comes from the master's real key listing.
func TestProbeExplainsMissOnRealMaster(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	c := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 64 << 20})
	put := func(o *cmdutil.KeyFlags) {
		t.Helper()
		layout := deriveLayout(t, o)
		for _, b := range layout.Blocks {
			for _, k := range b.Keys {
				if rc := c.Put(k, bytes.Repeat([]byte{7}, 64), mooncaketest.PutOptions{}); rc != 0 {
					t.Fatalf("put %s: rc %d", k, rc)
				}
			}
		}
	}
	probeJSON := func() *probe.Diagnosis {
		t.Helper()
		ios, _, stdout, _ := cmdutil.Test()
		if err := runProbePool(context.Background(), options(ios, m.AdminURL, cmdutil.FormatJSON)); err != nil {
			t.Fatal(err)
		}
		var res probe.Report
		if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
			t.Fatal(err)
		}
		return res.Diagnosis
	}

	ios, _, _, _ := cmdutil.Test()
	o := promptKeys(ios)
	o.TokensPerBlock = 8
	put(o)
	if d := probeJSON(); d == nil || d.Code != probe.DiagOtherTokensPerBlock || d.Flag != "--tokens-per-block 8" || d.ScannedKeys == 0 {
		t.Errorf("pages at 8 tokens a block: diagnosis %+v", d)
	}

	// Remove them, then store the pages a world of 4 writes.
	keys, err := mooncake.NewAdminClient(m.AdminURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	all, err := keys.AllKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range all {
		if rc := c.Remove(k, true); rc != 0 {
			t.Fatalf("remove %s: rc %d", k, rc)
		}
	}
	o = promptKeys(ios)
	o.WorldSize, o.Rank = 4, 0
	put(o)
	if d := probeJSON(); d == nil || d.Code != probe.DiagOtherWorldSize || d.Flag != "--world-size 4" {
		t.Errorf("pages of a world of 4: diagnosis %+v", d)
	}
}
