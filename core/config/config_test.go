package config

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      any
		strict  bool
		want    int64
		wantErr string
	}{
		{in: 1024, want: 1024},
		{in: int64(-5), want: -5},
		{in: 3.9, want: 3},
		{in: -3.9, want: -3},
		{in: "4096", want: 4096},
		{in: "  12 B ", want: 12},
		{in: "1KiB", want: 1024},
		{in: "1kib", want: 1024},
		{in: "2MiB", want: 2 << 20},
		{in: "64GiB", want: 64 << 30},
		{in: "1.5GiB", want: 1610612736},
		{in: "1TIB", want: 1 << 40},
		{in: "0.1KiB", want: 102},
		{in: "4GB", strict: false, want: 4_000_000_000},
		{in: "4g", strict: false, want: 4_000_000_000},
		{in: "1.5k", strict: false, want: 1500},
		{in: "4GB", strict: true, wantErr: `write "4GiB"`},
		{in: "512m", strict: true, wantErr: `write "512MiB"`},
		{in: "3 tb", strict: true, wantErr: `write "3TiB"`},
		{in: true, wantErr: "boolean"},
		{in: nil, wantErr: "want a byte count"},
		{in: "", wantErr: "want digits"},
		{in: "GiB", wantErr: "want digits"},
		{in: "-1GiB", wantErr: "want digits"},
		{in: "1.GiB", wantErr: "fraction"},
		{in: "1e9", wantErr: "want digits"},
		{in: "1 EB", wantErr: "unknown unit"},
		{in: "4 PiB", wantErr: "unknown unit"},
		{in: "4 G iB", wantErr: "want digits"},
		{in: math.NaN(), wantErr: "finite"},
		{in: math.Inf(1), wantErr: "finite"},
		{in: 1e30, wantErr: "too large"},
		{in: "99999999999TiB", wantErr: "too large"},
		{in: []int{1}, wantErr: "not a size"},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in, tt.strict)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrSize) {
				t.Errorf("ParseSize(%#v, %v) = %d, %v; want error containing %q", tt.in, tt.strict, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseSize(%#v, %v) = %d, %v; want %d", tt.in, tt.strict, got, err, tt.want)
		}
	}
}

func TestFormatSizeRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1, 1023, 1024, 3355443200, 1 << 30, 64 << 30, 3 << 40} {
		got, err := ParseSize(FormatSize(n), true)
		if err != nil || got != n {
			t.Errorf("ParseSize(FormatSize(%d)=%q) = %d, %v", n, FormatSize(n), got, err)
		}
	}
}

func TestFormatPyFloat(t *testing.T) {
	for f, want := range map[float64]string{30: "30.0", 0.5: "0.5", 1e16: "1e+16", 1e15: "1000000000000000.0",
		1e-5: "1e-05", 0.0001: "0.0001", 1.5e300: "1.5e+300", -2.25: "-2.25", 123456.789: "123456.789"} {
		if got := formatPyFloat(f); got != want {
			t.Errorf("formatPyFloat(%v) = %q, want %q", f, got, want)
		}
	}
}

func mustLoad(t *testing.T, path string, opts LoadOptions) *File {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, ds := Load(path, data, opts)
	if ds.HasErrors() || f == nil {
		t.Fatalf("%s: %v", path, ds.Err())
	}
	return f
}

// The bytes TensorRT-LLM's json.dump(indent=2) writes for the typical YAML and pool.json.
const typicalRendered = `{
  "master_server_address": "10.0.0.5:50051",
  "metadata_server": "P2PHANDSHAKE",
  "protocol": "rdma",
  "namespace": "prod",
  "device_name": "mlx5_0,mlx5_1",
  "model_key": "llama-3.1-70b-instruct@r1",
  "global_segment_size": 68719476736,
  "local_buffer_size": 1073741824,
  "role": "both",
  "transfer_batch_size": 64,
  "stage_through_host": true,
  "soft_pin_ttl_ms": 3600000,
  "group_blocks": true,
  "stats_interval": 30.0,
  "staging_buffer_bytes": 1073741824
}`

func TestRenderClientConfig(t *testing.T) {
	y := mustLoad(t, "testdata/valid/typical.yaml", LoadOptions{})
	m := mustLoad(t, "testdata/valid/pool.json", LoadOptions{})
	calls := 0
	detect := func() string { calls++; return "mlx5_0,mlx5_1" }
	c, data, err := RenderClientConfig(y.Store(), m.Manifest, detect)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != typicalRendered {
		t.Errorf("rendered:\n%s\nwant:\n%s", data, typicalRendered)
	}
	if calls != 1 {
		t.Errorf("device detection ran %d times, want 1 for rdma", calls)
	}
	// Read back: the same struct, and the same bytes when written again.
	back, ds := Load("mooncake.json", data, LoadOptions{})
	if ds.HasErrors() || back.Kind != KindClient {
		t.Fatalf("read back: kind %v, %v", back.Kind, ds.Err())
	}
	if !reflect.DeepEqual(*back.Client, c) {
		t.Errorf("read back differs:\n got %+v\nwant %+v", *back.Client, c)
	}
	if again := MarshalClientConfig(*back.Client); string(again) != string(data) {
		t.Errorf("rewrite differs:\n%s", again)
	}
}

func TestRenderRoundTripVariants(t *testing.T) {
	name, ns, host := "m\u00e9-\U0001F600\"x", "ns/\t1", "node-7"
	ttl, tbs, workers := int64(1), int64(7), int64(3)
	stats, f, tr := 0.25, false, true
	blocks := []*MooncakeStoreBlock{
		{Pool: "10.1.2.3:50051", ModelKey: &name},
		{Pool: "h:1", ModelKey: &name, Namespace: &ns, LocalHostname: &host, TransferBatchSize: &tbs,
			StageThroughHost: &f, SoftPinTTLMs: &ttl, GroupBlocks: &f, StatsInterval: &stats,
			StagingBufferBytes: &Size{Bytes: 1 << 20, Text: "1MiB"}, AsyncLoad: &tr, AsyncLoadWorkers: &workers,
			SegmentSize: &Size{Bytes: 0}},
	}
	for _, role := range []Role{RoleBoth, RoleProducer, RoleConsumer, RoleCapacity} {
		for _, b := range blocks {
			r := role
			b.Role = &r
			c, data, err := RenderClientConfig(b, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			back, ds := Load("mooncake.json", data, LoadOptions{Kind: KindClient})
			if back == nil || ds.HasErrors() {
				t.Fatalf("read back %s: %v", data, ds.Err())
			}
			if !reflect.DeepEqual(*back.Client, c) {
				t.Errorf("round trip of %s:\n got %+v\nwant %+v", data, *back.Client, c)
			}
			if strings.HasSuffix(string(data), "\n") {
				t.Error("rendered config ends with a newline")
			}
		}
	}
}

func TestRenderRefusals(t *testing.T) {
	bad := "64GB"
	tests := []struct {
		b *MooncakeStoreBlock
		m *PoolManifest
	}{
		{nil, nil},
		{&MooncakeStoreBlock{Pool: "file:///x/pool.json"}, nil},
		{&MooncakeStoreBlock{Pool: "nonsense"}, nil},
		{&MooncakeStoreBlock{Pool: "h:1", SegmentSize: &Size{Bytes: 64e9, Text: bad}}, nil},
		{&MooncakeStoreBlock{Pool: "h:1"}, &PoolManifest{}},
	}
	for i, tt := range tests {
		if _, _, err := RenderClientConfig(tt.b, tt.m, nil); !errors.Is(err, ErrRender) {
			t.Errorf("case %d: err = %v, want ErrRender", i, err)
		}
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mooncake.json")
	for _, content := range []string{"first", "second"} {
		if err := WriteFileAtomic(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(path)
		if string(got) != content {
			t.Errorf("got %q, want %q", got, content)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("temporary files left behind: %v", ents)
	}
	if err := WriteFileAtomic(filepath.Join(dir, "missing", "x.json"), nil); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
}

func TestManifestKeepsUnknownKeys(t *testing.T) {
	path := "testdata/valid/pool.json"
	orig, _ := os.ReadFile(path)
	f := mustLoad(t, path, LoadOptions{})
	m := f.Manifest
	if _, ok := m.Extra["operator"]; !ok {
		t.Fatalf("unknown key not kept: %+v", m.Extra)
	}
	// Written back byte for byte as the master writes it (sorted keys, indent 2, newline).
	if got := m.Marshal(); string(got) != string(orig) {
		t.Errorf("rewrite differs:\n%s\nwant:\n%s", got, orig)
	}
	m.Namespace = "changed"
	back, ds := Load("pool.json", m.Marshal(), LoadOptions{})
	if ds.HasErrors() || !reflect.DeepEqual(back.Manifest, m) {
		t.Errorf("changed manifest does not read back: %+v %v", back.Manifest, ds.Err())
	}
}

func TestRestate(t *testing.T) {
	ttl, stats, tbs := int64(5000), 10.0, int64(32)
	role, ns, model := RoleProducer, "mine", "m1"
	block := &MooncakeStoreBlock{Pool: "h:1", Role: &role, Namespace: &ns, ModelKey: &model,
		SoftPinTTLMs: &ttl, StatsInterval: &stats, TransferBatchSize: &tbs, RunDir: &ns}
	client := DefaultClientConfig()
	client.MasterServerAddress, client.ModelKey, client.GlobalSegmentSize = "h:2", &model, 1<<30
	got := Restate(block, client)
	want := map[string]Override{
		pStoreF + "role":                {pStoreF + "role", "producer", "both", true},
		pStoreF + "namespace":           {pStoreF + "namespace", "mine", "trtllm", true},
		pStoreF + "soft_pin_ttl_ms":     {pStoreF + "soft_pin_ttl_ms", "5000", "off", true},
		pStoreF + "stats_interval":      {pStoreF + "stats_interval", "10.0", "off", true},
		pStoreF + "transfer_batch_size": {pStoreF + "transfer_batch_size", "32", "64", true},
		pStoreF + "segment_size":        {pStoreF + "segment_size", "3355443200", "1073741824", false},
	}
	if len(got) != len(want) {
		t.Errorf("overrides = %+v, want %d", got, len(want))
	}
	for _, o := range got {
		if want[o.Path] != o {
			t.Errorf("override %+v, want %+v", o, want[o.Path])
		}
	}
	if block.SoftPinTTLMs != nil || block.StatsInterval != nil {
		t.Error("a client config without TTL or stats interval must restate them to off")
	}
	if block.EffectiveRole() != RoleBoth || block.EffectiveSegmentSize() != 1<<30 || block.Pool != "h:1" || *block.RunDir != "mine" {
		t.Errorf("restated block: %+v", block)
	}
	if again := Restate(block, client); len(again) != 0 {
		t.Errorf("restating twice changed %+v", again)
	}
}

func TestNodeBudget(t *testing.T) {
	in := BudgetInput{RanksOnNode: 8, SegmentSize: 16 << 30, StageThroughHost: true, Role: RoleBoth,
		StagingBufferBytes: 1 << 30, MemAvailable: 200 << 30, MemKnown: true}
	r, err := CheckNodeBudget(in)
	if err != nil || r.Claimed != 8*16<<30+16<<30 || r.Budget != 168<<30 {
		t.Errorf("fits: %+v %v", r, err)
	}
	in.SegmentSize = 20 << 30
	r, err = CheckNodeBudget(in)
	if !errors.Is(err, ErrNodeBudget) || r.MaxSegmentSize != (168<<30-16<<30)/8 {
		t.Errorf("over: %+v %v", r, err)
	}
	in.Role = RoleCapacity // capacity stages nothing
	if r, _ := CheckNodeBudget(in); r.Claimed != 8*20<<30 {
		t.Errorf("capacity claimed %d", r.Claimed)
	}
	in.MemKnown = false
	if r, err := CheckNodeBudget(in); err != nil || r.Known {
		t.Errorf("unknown memory: %+v %v", r, err)
	}
}

func TestDetectKind(t *testing.T) {
	tests := []struct {
		name, data string
		want       Kind
	}{
		{"x.yaml", "kv_cache_config: {}", KindTRTLLM},
		{"x", `{"global_segment_size": 1}`, KindClient},
		{"x", `{"master_server_address": "h:1", "metrics_port": 9004}`, KindManifest},
		{"x", "log-level: info", KindServe},
		{"pool.json", "{}", KindManifest},
		{"dir/mooncake.json", "{}", KindClient},
		{"server.yml", "foo: 1", KindTRTLLM},
		// Serve keys no marker names, and near misses of serve keys, make a serve config;
		// short keys of other kinds two edits from a serve key do not.
		{"x.yaml", "drain-timeout: 10s", KindServe},
		{"x.yaml", "pool-sise: 1GiB", KindServe},
		{"x", "pool_size: 1GiB", KindServe},
		{"x.yaml", "sockte: /run/kvctl.sock", KindServe},
		{"x.yaml", "port: 8000", KindTRTLLM},
		{"x.yaml", "model: m", KindTRTLLM},
		{"x", `{"stats_interval": 10}`, KindClient},
		{"mooncake.json", `{"protocol": "tcp"}`, KindClient},
	}
	for _, tt := range tests {
		if got, err := DetectKind(tt.name, []byte(tt.data)); err != nil || got != tt.want {
			t.Errorf("DetectKind(%q, %q) = %v, %v; want %v", tt.name, tt.data, got, err, tt.want)
		}
	}
	for _, bad := range []string{"{}", "[1", "foo: 1"} {
		if _, err := DetectKind("x.json", []byte(bad)); !errors.Is(err, ErrUnknownKind) {
			t.Errorf("DetectKind(%q) = %v, want ErrUnknownKind", bad, err)
		}
	}
	if _, ds := Load("x.json", []byte("{}"), LoadOptions{}); !ds.HasErrors() || ds[0].Line != 1 {
		t.Errorf("undetectable file: %v", ds)
	}
}

// TestMisspeltServeKey: a file that holds only a misspelt serve key is a serve config with an
// unknown key, named with the key it likely means, not an LLM API YAML that takes it silently.
func TestMisspeltServeKey(t *testing.T) {
	f, ds := Load("serve.yaml", []byte("pool-sise: 1GiB\n"), LoadOptions{})
	if f == nil || f.Kind != KindServe {
		t.Fatalf("kind %v, want %s (diagnostics %v)", f, KindServe, ds)
	}
	if len(ds) != 1 {
		t.Fatalf("diagnostics %v, want one", ds)
	}
	d := ds[0]
	if d.Severity != SeverityError || d.Path != "pool-sise" || d.Message != `unknown key "pool-sise"` ||
		d.Hint != "did you mean pool-size?" || d.Line != 1 || d.Column != 1 {
		t.Errorf("diagnostic %#v", d)
	}
}

func TestKeyInputs(t *testing.T) {
	y := mustLoad(t, "testdata/valid/spec-prefill.yaml", LoadOptions{})
	k, err := y.KeyInputs()
	want := KeyInputs{Namespace: "trtllm", ModelKey: "m1", TokensPerBlock: 32, WorldSize: 1, PromptLookahead: 3}
	if err != nil || k != want {
		t.Errorf("vanilla MTP: %+v %v, want %+v", k, err, want)
	}
	typ := mustLoad(t, "testdata/valid/typical.yaml", LoadOptions{})
	if k, _ := typ.KeyInputs(); k.Namespace != "prod" || k.WorldSize != 4 || k.PromptLookahead != 0 {
		t.Errorf("typical: %+v", k)
	}
	adp := mustLoad(t, "testdata/valid/admission-ignored-adp.yaml", LoadOptions{})
	pool := mustLoad(t, "testdata/valid/pool.json", LoadOptions{})
	if k, err := KeyInputsFrom(adp, pool); err != nil || !k.AttentionDP || k.Namespace != "prod" {
		t.Errorf("ADP + manifest: %+v %v", k, err)
	}
	client := mustLoad(t, "testdata/valid/mooncake.json", LoadOptions{})
	if _, err := client.KeyInputs(); !errors.Is(err, ErrMissingKeyInput) {
		t.Errorf("client alone: %v, want ErrMissingKeyInput", err)
	}
	for _, tt := range []struct {
		s    SpeculativeConfig
		want int64
	}{
		{SpeculativeConfig{DecodingType: "MTP", MTPEagleOneModel: true, NumNextNPredictLayers: ptr(int64(3))}, 1},
		{SpeculativeConfig{DecodingType: "MTP", UseMTPVanilla: true, MaxDraftLen: ptr(int64(2))}, 2},
		{SpeculativeConfig{DecodingType: "Eagle3", Eagle3OneModel: true, MaxDraftLen: ptr(int64(4))}, 1},
		{SpeculativeConfig{DecodingType: "Eagle3", MaxDraftLen: ptr(int64(4))}, 0},
		{SpeculativeConfig{DecodingType: "NGram", MaxDraftLen: ptr(int64(4))}, 0},
	} {
		if got := tt.s.PromptLookahead(); got != tt.want {
			t.Errorf("PromptLookahead(%+v) = %d, want %d", tt.s, got, tt.want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestServeDefaultsValid(t *testing.T) {
	s := DefaultServeConfig()
	if ds := s.Validate(); len(ds) != 0 {
		t.Errorf("defaults invalid: %v", ds)
	}
	s.PoolBackend, s.LogFormat = PoolBackendMooncake, "xml"
	ds := s.Validate()
	if len(ds.Errors()) != 2 || ds.Errors()[0].Path != ServeKeyMaster || ds.Errors()[1].Path != ServeKeyLogFormat {
		t.Errorf("mooncake without a master, and bad format: %v", ds)
	}
	f := mustLoad(t, "testdata/valid/serve.yaml", LoadOptions{})
	if n, ok, err := f.Serve.PoolSizeBytes(); !ok || err != nil || n != 64<<30 || f.Serve.StatsInterval.Seconds() != 30 {
		t.Errorf("serve.yaml: %+v", f.Serve)
	}
}

func TestValidateWithoutFile(t *testing.T) {
	c := DefaultClientConfig()
	ds := c.Validate()
	if len(ds.Errors()) != 2 || ds[0].Line != 0 {
		t.Errorf("empty client config: %v", ds)
	}
	if err := ds.Err(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "master_server_address") {
		t.Errorf("Err() = %v", err)
	}
	if ds := DefaultPoolManifest("h:1").Validate(); len(ds) != 0 {
		t.Errorf("default manifest: %v", ds)
	}
}

func TestDiagnosticString(t *testing.T) {
	d := Diagnostic{File: "a.yaml", Line: 3, Column: 7, Path: "x.y", Severity: SeverityError, Message: "bad", Hint: "fix"}
	if got := d.String(); got != "a.yaml:3:7: error: x.y: bad (hint: fix)" {
		t.Errorf("String() = %q", got)
	}
	d = Diagnostic{Severity: SeverityWarning, Message: "m"}
	if got := d.String(); got != "warning: m" {
		t.Errorf("String() = %q", got)
	}
}

func TestInheritedConfigUnreadable(t *testing.T) {
	data, _ := os.ReadFile("testdata/valid/typical.yaml")
	_, ds := Load("t.yaml", data, LoadOptions{Env: func(string) string { return "/nonexistent/mooncake.json" }})
	if !ds.HasErrors() || !strings.Contains(ds.Errors()[0].Message, EnvConfigPath) || ds.Errors()[0].Line == 0 {
		t.Errorf("unreadable inherited config: %v", ds)
	}
}
