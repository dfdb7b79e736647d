package config

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/kvctl/kvctl/core/boundedio"
)

// EnvConfigPath names the inherited client config that wins over a YAML block.
const EnvConfigPath = "MOONCAKE_CONFIG_PATH"

// LoadOptions tunes Load. The zero value detects the kind and touches nothing outside data.
type LoadOptions struct {
	Kind Kind // "" detects it with DetectKind
	// NodeBudget runs the node memory check (CheckNodeBudget) on a client config or YAML block.
	NodeBudget bool
	// MemAvailable reports the node's available memory; nil reads /proc/meminfo.
	MemAvailable func() (uint64, bool)
	// RanksOnNode is the number of ranks sharing the node; 0 counts as 1.
	RanksOnNode int
	// Env looks up environment variables; when it names MOONCAKE_CONFIG_PATH, a YAML's block
	// is restated from that client config. nil reads no environment.
	Env func(string) string
	// ReadFile reads the inherited client config; nil uses os.ReadFile.
	ReadFile func(string) ([]byte, error)
	// OtherKeys are keys a serve config file may hold for other commands (their flag names,
	// when the file is shared): they are passed over, while any other unknown key is refused.
	OtherKeys []string
}

// File is one loaded config file. Exactly one of the kind pointers is set when the file
// parsed.
type File struct {
	Name     string
	Kind     Kind
	TRTLLM   *TRTLLMConfig
	Client   *ClientConfig
	Manifest *PoolManifest
	Serve    *ServeConfig
	Disagg   *DisaggConfig
	// Inherited is the client config named by MOONCAKE_CONFIG_PATH when it was restated onto
	// the YAML block, and Overrides the block fields it changed.
	Inherited     *ClientConfig
	InheritedPath string
	Overrides     []Override
}

// Store returns the YAML's mooncake_store block, or nil.
func (f *File) Store() *MooncakeStoreBlock {
	if f == nil || f.TRTLLM == nil || f.TRTLLM.Connector == nil {
		return nil
	}
	return f.TRTLLM.Connector.MooncakeStore
}

// Load parses one config file, decodes it against its schema and runs every rule, returning
// every problem at once, sorted by place. It never panics; the File is nil only when the
// text could not be parsed or its kind could not be told.
func Load(name string, data []byte, opts LoadOptions) (f *File, diags Diagnostics) {
	d := newDec(name)
	defer func() {
		if r := recover(); r != nil {
			d.add(SeverityError, 0, 0, "", fmt.Sprintf("internal error while checking the file: %v", r), "")
			f, diags = nil, d.diags
		}
		diags.Sort()
	}()
	kind := opts.Kind
	var root *node
	if kind == KindClient || kind == KindManifest || (kind == "" && looksJSON(data)) {
		root = parseJSON(d, data)
	} else {
		root = parseYAML(d, data)
	}
	if root == nil {
		return nil, d.diags
	}
	d.locs[""] = pos{root.line, root.col}
	if kind == "" {
		k, err := detectKind(name, root)
		if err != nil {
			d.add(SeverityError, root.line, root.col, "", err.Error(), "pass the kind explicitly: "+kindList())
			return nil, d.diags
		}
		kind = k
	}
	f = &File{Name: name, Kind: kind}
	switch kind {
	case KindTRTLLM:
		f.TRTLLM = decodeTRTLLM(d, root)
		loadTRTLLM(d, f, opts)
	case KindClient:
		f.Client = decodeClient(d, root)
		if opts.NodeBudget {
			c := f.Client
			nodeBudget(d, opts, "global_segment_size", BudgetInput{SegmentSize: c.GlobalSegmentSize,
				StageThroughHost: c.EffectiveStageThroughHost(), Role: c.Role, StagingBufferBytes: c.EffectiveStagingBufferBytes()})
		}
	case KindManifest:
		f.Manifest = decodeManifest(d, root)
	case KindServe:
		f.Serve = decodeServe(d, root, opts.OtherKeys)
	case KindDisagg:
		f.Disagg = decodeDisagg(d, root)
	default:
		d.add(SeverityError, 0, 0, "", fmt.Sprintf("unknown config kind %q", kind), "use one of "+kindList())
		return nil, d.diags
	}
	return f, d.diags
}

func loadTRTLLM(d *dec, f *File, opts LoadOptions) {
	t := f.TRTLLM
	env := ruleEnv{role: RoleBoth}
	if b := f.Store(); b != nil {
		env.role = b.EffectiveRole()
	}
	if opts.Env != nil && t.Connector.IsMooncakeStore() {
		if path := opts.Env(EnvConfigPath); path != "" {
			restateInherited(d, f, opts, path)
			if f.Inherited != nil {
				env.role, env.inherited = f.Inherited.Role, true
			}
		}
	}
	kvctl := t.kvctlSettings(d, opts.Env)
	if kvctl != nil {
		env.role = kvctl.Role
	}
	t.rules(d, env)
	if kvctl != nil {
		t.ruleKvctl(d, kvctl)
	}
	if b := f.Store(); opts.NodeBudget && b != nil {
		path := pStoreF + "segment_size"
		staging := int64(DefaultStagingBufferBytes)
		if b.StagingBufferBytes != nil {
			staging = b.StagingBufferBytes.Bytes
		}
		nodeBudget(d, opts, path, BudgetInput{SegmentSize: b.EffectiveSegmentSize(),
			StageThroughHost: boolOr(b.StageThroughHost, true) || env.role.Transfers(),
			Role:             env.role, StagingBufferBytes: staging})
	}
}

func restateInherited(d *dec, f *File, opts LoadOptions, path string) {
	read := opts.ReadFile
	if read == nil {
		read = func(p string) ([]byte, error) {
			return boundedio.ReadFile(context.Background(), p, boundedio.MaxConfigBytes)
		}
	}
	data, err := read(path)
	if err != nil {
		d.at(SeverityError, pStore, fmt.Sprintf("%s names %s, which cannot be read: %v", EnvConfigPath, path, err), "")
		return
	}
	cf, cd := Load(path, data, LoadOptions{Kind: KindClient})
	d.diags = append(d.diags, cd...)
	if cf == nil || cf.Client == nil {
		return
	}
	f.Inherited, f.InheritedPath = cf.Client, path
	if f.TRTLLM.Connector.MooncakeStore == nil {
		f.TRTLLM.Connector.MooncakeStore = &MooncakeStoreBlock{}
	}
	f.Overrides = Restate(f.TRTLLM.Connector.MooncakeStore, *cf.Client)
	for _, o := range f.Overrides {
		if o.Explicit {
			d.at(SeverityWarning, o.Path, fmt.Sprintf("overridden by the inherited client config %s: %s -> %s", path, o.From, o.To),
				"the client config named by "+EnvConfigPath+" wins over the YAML block")
		}
	}
}

func looksJSON(data []byte) bool {
	s := strings.TrimLeft(strings.TrimPrefix(string(data[:min(len(data), 4096)]), "\ufeff"), " \t\r\n")
	return strings.HasPrefix(s, "{")
}

var (
	trtllmMarkers = []string{"kv_connector_config", "kv_cache_config", "tensor_parallel_size",
		"pipeline_parallel_size", "context_parallel_size", "speculative_config", "attention_dp_config",
		"enable_attention_dp", "cache_transceiver_config", "disable_overlap_scheduler",
		"use_kv_cache_manager_v2", "max_beam_width", "max_batch_size", "max_num_tokens", "max_seq_len",
		"backend", "cuda_graph_config", "moe_expert_parallel_size", "scheduler_config", "print_iter_log"}
	clientMarkers = []string{"global_segment_size", "local_buffer_size", "device_name", "model_key",
		"transfer_batch_size", "stage_through_host", "role", "tenant_id", "local_hostname",
		"soft_pin_ttl_ms", "group_blocks", "stats_interval", "staging_buffer_bytes", "async_load",
		"async_load_workers", "enable_ssd_offload", "cache_prefix"}
	manifestMarkers = []string{"metrics_port", "eviction_ratio"}
	serveMarkers    = []string{"socket", "admin-addr", "pool-backend", "pool-size", "staging-buffer-bytes",
		"log-level", "log-format", "stats-interval", "master", "host-address", "local-buffer-size", "mooncake-config", "pool-timeout"}
)

// servesNearly reports whether a top-level key of root is a serve key no marker names
// (drain-timeout) or a near miss of one (pool-sise, pool_size): at most two edits from it, and
// no more than a third of its length, so that a short key of another kind (port, against pool)
// is not taken for one. It runs after every kind's markers and the names pool.json and
// mooncake.json, so a key of another kind that is close to a serve key (stats_interval, a
// client key) has decided already.
func servesNearly(root *node) bool {
	serve := ServeKeys()
	for _, k := range root.keys {
		for _, c := range serve {
			if d := editDistance(k.text, c); d <= 2 && 3*d <= len(c) {
				return true
			}
		}
	}
	return false
}

// DetectKind tells what a config file is: by the keys at its top level first, by its name
// second (pool.json, mooncake.json), then by a serve key or a near miss of one among its
// top-level keys (servesNearly), and last by its name again (*.yaml, *.yml). It returns an
// error wrapping ErrUnknownKind when none decides, or when the text does not parse.
func DetectKind(name string, data []byte) (Kind, error) {
	d := newDec(name)
	var root *node
	if looksJSON(data) {
		root = parseJSON(d, data)
	} else {
		root = parseYAML(d, data)
	}
	if root == nil {
		msg := "cannot parse"
		if len(d.diags) > 0 {
			msg = d.diags[0].Message
		}
		return "", fmt.Errorf("%s: %s: %w", name, msg, ErrUnknownKind)
	}
	return detectKind(name, root)
}

func detectKind(name string, root *node) (Kind, error) {
	anyOf := func(keys []string) bool {
		for _, k := range keys {
			if root.has(k) {
				return true
			}
		}
		return false
	}
	if root.kind == nodeMap {
		switch {
		case anyOf(disaggMarkers):
			return KindDisagg, nil
		case anyOf(trtllmMarkers):
			return KindTRTLLM, nil
		case anyOf(serveMarkers):
			return KindServe, nil
		case anyOf(clientMarkers):
			return KindClient, nil
		case root.has("master_server_address") || anyOf(manifestMarkers):
			return KindManifest, nil
		}
	}
	base := strings.ToLower(filepath.Base(name))
	switch {
	case base == "pool.json" || strings.HasSuffix(base, ".pool.json"):
		return KindManifest, nil
	case base == "mooncake.json":
		return KindClient, nil
	case root.kind == nodeMap && servesNearly(root):
		// Decoding it as a serve config names the unknown key and the key it likely means,
		// where an LLM API YAML would take it silently.
		return KindServe, nil
	case strings.HasSuffix(base, ".yaml") || strings.HasSuffix(base, ".yml"):
		return KindTRTLLM, nil
	}
	return "", fmt.Errorf("cannot tell what kind of config %s is from its keys or its name: %w", name, ErrUnknownKind)
}
