package probepool

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

func TestDumpFlags(t *testing.T) {
	tests := []struct {
		args    string
		wantErr string
	}{
		{args: "--pool rpc://h:1 --dump-key k --out f"},
		{args: "--pool h:1 --dump-key k --out - --metadata http://h:2/metadata"},
		{args: "--pool h:1 --dump-key k", wantErr: "needs --out"},
		{args: "--dump-key k --out f", wantErr: "--pool is required"},
		{args: "--pool h:1 --dump-key k --out f 1 2", wantErr: "takes no tokens"},
		{args: "--pool h:1 --dump-key k --out f --watch 1", wantErr: "cannot be combined"},
		{args: "--pool h:1 --dump-key '' --out f", wantErr: "want the key"},
		{args: "--pool h:1 --out f --model-key m --layer-group 0:64 1", wantErr: "give --dump-key"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			var got *Options
			cmd := NewCmdProbePool(cmdtest.Factory(), func(o *Options) error { got = o; return nil })
			err := cmdtest.Execute(t, cmd, tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || cmdutil.ExitCode(err) != cmdutil.ExitUsage {
					t.Fatalf("got %v (exit %d), want a usage error containing %q", err, cmdutil.ExitCode(err), tt.wantErr)
				}
				return
			}
			if err != nil || got == nil || got.DumpKey != "k" {
				t.Fatalf("got %v, %+v", err, got)
			}
		})
	}
}

// rpcPopulate puts every key of the test prompt into a real master through Native, then
// removes block 3's keys: blocks 0-2 hit, 3 is a hole, the rest stored behind it.
func rpcPopulate(t *testing.T, n *mooncake.Native) {
	t.Helper()
	ios, _, _, _ := cmdutil.Test()
	o := promptKeys(ios)
	layout := deriveLayout(t, o)
	ctx := context.Background()
	for _, b := range layout.Blocks {
		bufs := make([][]byte, len(b.Keys))
		for i := range bufs {
			bufs[i] = bytes.Repeat([]byte{byte(b.Index)}, 16)
		}
		for i, c := range n.BatchPut(ctx, b.Keys, bufs, pool.ReplicateConfig{}) {
			if c != pool.OK {
				t.Fatalf("put %s: %v", b.Keys[i], c)
			}
		}
		if b.Index == 3 {
			for _, k := range b.Keys {
				if c := n.Remove(ctx, k, true); c != pool.OK {
					t.Fatalf("remove %s: %v", k, c)
				}
			}
		}
	}
}

func startNative(t *testing.T, m *mooncaketest.Master, seg int64) *mooncake.Native {
	t.Helper()
	n, err := mooncake.NewNative(context.Background(), mooncake.NativeOptions{MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL, SegmentSize: seg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// TestProbeOverRPC probes a real master through its RPC address, written rpc://host:port and
// as a bare host:port (which does not answer HTTP), and gets the blocks the master holds.
func TestProbeOverRPC(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	rpcPopulate(t, startNative(t, m, 16<<20))
	for _, pl := range []string{probe.RPCScheme + m.RPCAddr, m.RPCAddr} {
		ios, _, out, _ := cmdutil.Test()
		if err := runProbePool(context.Background(), options(ios, pl, cmdutil.FormatJSON)); err != nil {
			t.Fatalf("--pool %s: %v", pl, err)
		}
		var r probe.Report
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.Target != probe.KindMasterRPC || r.Query != probe.QueryBatchExistKey || r.Pool != probe.RPCScheme+m.RPCAddr {
			t.Fatalf("--pool %s: target %q query %q pool %q", pl, r.Target, r.Query, r.Pool)
		}
		if r.Summary.HitBlocks != 3 || r.Summary.Holes != 1 || r.Blocks[3].State != probe.StateHole || r.Summary.KeysPresent != r.Summary.KeysChecked-r.Blocks[3].NeededKeys {
			t.Fatalf("--pool %s: summary %+v", pl, r.Summary)
		}
	}
}

// TestDumpKey fetches a page Mooncake's own Python client stored, through the data path, into
// a file; a missing key exits 3, an HTTP address is a usage error, a dead master exits 4.
func TestDumpKey(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	py := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 16 << 20})
	page := make([]byte, 300<<10)
	for i := range page {
		page[i] = byte(i*7 + i>>11)
	}
	if rc := py.Put("dump/me", page, mooncaketest.PutOptions{}); rc != 0 {
		t.Fatalf("python put = %d", rc)
	}
	dir := t.TempDir()
	dump := func(pl, key, out string) (*DumpResult, error) {
		ios, _, stdout, _ := cmdutil.Test()
		o := &Options{IO: ios, Pool: pl, DumpKey: key, Out: out, Metadata: m.MetadataURL, Timeout: 5 * time.Second, OutputFormat: cmdutil.FormatJSON}
		err := runDump(context.Background(), o)
		if err != nil {
			return nil, err
		}
		var r DumpResult
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("output %q: %v", stdout.String(), err)
		}
		return &r, nil
	}
	out := filepath.Join(dir, "page.bin")
	r, err := dump(probe.RPCScheme+m.RPCAddr, "dump/me", out)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	if !bytes.Equal(got, page) || r.Bytes != int64(len(page)) || r.Key != "dump/me" {
		t.Fatalf("dumped %d bytes (result %+v), want the %d the Python client stored", len(got), r, len(page))
	}
	if _, err := dump(m.RPCAddr, "dump/none", filepath.Join(dir, "none")); cmdutil.ExitCode(err) != cmdutil.ExitValidation || !strings.Contains(err.Error(), "not in the pool") {
		t.Fatalf("missing key: %v (exit %d), want exit 3", err, cmdutil.ExitCode(err))
	}
	if _, err := os.Stat(filepath.Join(dir, "none")); !os.IsNotExist(err) {
		t.Fatal("a missing key left a file behind")
	}
	if _, err := dump(strings.TrimPrefix(m.AdminURL, "http://"), "dump/me", out); cmdutil.ExitCode(err) != cmdutil.ExitUsage {
		t.Fatalf("HTTP admin address: %v (exit %d), want a usage error", err, cmdutil.ExitCode(err))
	}
	m.Kill()
	if _, err := dump(probe.RPCScheme+m.RPCAddr, "dump/me", out); cmdutil.ExitCode(err) != cmdutil.ExitUnreachable {
		t.Fatalf("dead master: %v (exit %d), want exit 4", err, cmdutil.ExitCode(err))
	}
}
