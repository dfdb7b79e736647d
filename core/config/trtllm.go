package config

import (
	"errors"
	"fmt"
	"strings"
)

// TRTLLMConfig is the part of TensorRT-LLM's LLM API options YAML (extra_llm_api_options,
// trtllm-serve --config) that the connector and its rules read. Other keys are ignored.
type TRTLLMConfig struct {
	TensorParallelSize   int64 `json:"tensor_parallel_size"`   // default 1
	PipelineParallelSize int64 `json:"pipeline_parallel_size"` // default 1
	ContextParallelSize  int64 `json:"context_parallel_size"`  // default 1
	// EnableAttentionDP is the top-level enable_attention_dp, or attention_dp_config's.
	EnableAttentionDP       bool   `json:"enable_attention_dp"`
	DisableOverlapScheduler bool   `json:"disable_overlap_scheduler"`
	UseKVCacheManagerV2     *bool  `json:"use_kv_cache_manager_v2,omitempty"` // nil: "auto" or left out
	MaxBeamWidth            int64  `json:"max_beam_width"`                    // default 1
	MaxSeqLen               *int64 `json:"max_seq_len,omitempty"`

	KVCache     KVCacheConfig      `json:"kv_cache_config"`
	Connector   *KVConnectorConfig `json:"kv_connector_config,omitempty"`
	Speculative *SpeculativeConfig `json:"speculative_config,omitempty"`
	AttentionDP AttentionDPConfig  `json:"attention_dp_config"`
	// CacheTransceiverBackend is cache_transceiver_config.backend: set on a disaggregated server.
	CacheTransceiverBackend string `json:"cache_transceiver_backend,omitempty"`
	// KVTransferTimeoutMs is cache_transceiver_config.kv_transfer_timeout_ms; nil: 60000.
	KVTransferTimeoutMs *int64 `json:"kv_transfer_timeout_ms,omitempty"`
	// PrefixAwareScheduling is scheduler_config.enable_prefix_aware_scheduling (prefix reservations).
	PrefixAwareScheduling bool `json:"enable_prefix_aware_scheduling"`
	// SparseDisableIndexValue is sparse_attention_config.sparse_disable_index_value.
	SparseDisableIndexValue *bool `json:"sparse_disable_index_value,omitempty"`
}

// KVCacheConfig is kv_cache_config, plus the KV cache manager's reuse_match_alignment and
// reuse_match_backoff, which kvctl reads from the same mapping.
type KVCacheConfig struct {
	TokensPerBlock                    int64 `json:"tokens_per_block"`               // default 32
	EnablePartialReuse                *bool `json:"enable_partial_reuse,omitempty"` // nil: true
	HostCacheSize                     *Size `json:"host_cache_size,omitempty"`      // nil: automatic
	DiskCacheSize                     *Size `json:"disk_cache_size,omitempty"`
	EnableDisaggCompletionReservation bool  `json:"enable_disagg_completion_reservation"`
	ReuseMatchAlignment               int64 `json:"reuse_match_alignment"` // default 1
	ReuseMatchBackoff                 int64 `json:"reuse_match_backoff"`   // default 0
	// MaxAttentionWindow set with a window shorter than the sequence means sliding-window layers.
	MaxAttentionWindow []int64 `json:"max_attention_window,omitempty"`
}

// KVConnectorConfig is kv_connector_config.
type KVConnectorConfig struct {
	Connector       string                `json:"connector,omitempty"` // a preset name
	ConnectorModule string                `json:"connector_module,omitempty"`
	SchedulerClass  string                `json:"connector_scheduler_class,omitempty"`
	WorkerClass     string                `json:"connector_worker_class,omitempty"`
	ServerURL       string                `json:"server_url,omitempty"` // kvctl's connector: its socket (llmapi.go)
	MooncakeStore   *MooncakeStoreBlock   `json:"mooncake_store,omitempty"`
	AdmissionQuery  *AdmissionQueryConfig `json:"admission_query,omitempty"`
}

// IsMooncakeStore reports whether the connector is mooncake-store, by preset or module path.
func (c *KVConnectorConfig) IsMooncakeStore() bool {
	if c == nil {
		return false
	}
	return c.Connector == "mooncake-store" || strings.Contains(c.ConnectorModule, "mooncake_store")
}

// AdmissionQueryConfig is kv_connector_config.admission_query (seed commits 7 and 17).
type AdmissionQueryConfig struct {
	MaxUnchargedParks int64 `json:"max_uncharged_parks"`
	MaxOfferDeferrals int64 `json:"max_offer_deferrals"`
}

// MooncakeStoreBlock is kv_connector_config.mooncake_store. A nil field was left out of the
// file; the Effective methods give the value the server uses.
type MooncakeStoreBlock struct {
	Pool               string   `json:"pool"` // file://<manifest> or host:port
	Role               *Role    `json:"role,omitempty"`
	SegmentSize        *Size    `json:"segment_size,omitempty"`
	ModelKey           *string  `json:"model_key,omitempty"`
	Namespace          *string  `json:"namespace,omitempty"`
	TransferBatchSize  *int64   `json:"transfer_batch_size,omitempty"`
	StageThroughHost   *bool    `json:"stage_through_host,omitempty"`
	LocalHostname      *string  `json:"local_hostname,omitempty"`
	RunDir             *string  `json:"run_dir,omitempty"`
	MasterTimeout      *float64 `json:"master_timeout,omitempty"`      // seconds
	LocalReuseBackoff  *string  `json:"local_reuse_backoff,omitempty"` // off | align
	SoftPinTTLMs       *int64   `json:"soft_pin_ttl_ms,omitempty"`
	GroupBlocks        *bool    `json:"group_blocks,omitempty"`
	StatsInterval      *float64 `json:"stats_interval,omitempty"`
	StagingBufferBytes *Size    `json:"staging_buffer_bytes,omitempty"`
	AsyncLoad          *bool    `json:"async_load,omitempty"`
	AsyncLoadWorkers   *int64   `json:"async_load_workers,omitempty"`
}

// EffectiveRole is the block's role, both when left out.
func (b *MooncakeStoreBlock) EffectiveRole() Role {
	if b.Role != nil {
		return *b.Role
	}
	return RoleBoth
}

// EffectiveSegmentSize is the per-rank segment in bytes.
func (b *MooncakeStoreBlock) EffectiveSegmentSize() int64 {
	if b.SegmentSize != nil {
		return b.SegmentSize.Bytes
	}
	return DefaultGlobalSegmentSize
}

// EffectiveLocalReuseBackoff is off unless the block says align.
func (b *MooncakeStoreBlock) EffectiveLocalReuseBackoff() string {
	if b.LocalReuseBackoff != nil {
		return *b.LocalReuseBackoff
	}
	return "off"
}

// SpeculativeConfig is the part of speculative_config the connector rules read.
type SpeculativeConfig struct {
	DecodingType          string `json:"decoding_type"`
	MaxDraftLen           *int64 `json:"max_draft_len,omitempty"`
	NumNextNPredictLayers *int64 `json:"num_nextn_predict_layers,omitempty"`
	UseMTPVanilla         bool   `json:"use_mtp_vanilla"`
	MTPEagleOneModel      bool   `json:"mtp_eagle_one_model"` // default true
	Eagle3OneModel        bool   `json:"eagle3_one_model"`    // default true
	// SeparateDraftKVCache is use_separate_draft_kv_cache: draft layers in their own pool.
	SeparateDraftKVCache bool `json:"use_separate_draft_kv_cache"`
}

// IsMTP reports an MTP drafter.
func (s *SpeculativeConfig) IsMTP() bool { return strings.EqualFold(s.DecodingType, "MTP") }

// IsEagle3 reports an EAGLE3 drafter.
func (s *SpeculativeConfig) IsEagle3() bool { return strings.EqualFold(s.DecodingType, "Eagle3") }

// OneModel reports a drafter whose layers run inside the target model and share its KV pool:
// vanilla MTP, MTP-Eagle with mtp_eagle_one_model, or EAGLE3 with eagle3_one_model.
func (s *SpeculativeConfig) OneModel() bool {
	switch {
	case s.IsMTP():
		return s.UseMTPVanilla || s.MTPEagleOneModel
	case s.IsEagle3():
		return s.Eagle3OneModel
	}
	return false
}

// The drafter kinds TensorRT-LLM lets run next to a connector in speculative-prefill mode
// (seed commits 5 and 14): one-model MTP (MTP-Eagle one model or vanilla MTP) and one-model
// EAGLE3, whose draft layers share the target KV pool. An engine states its kind in the engine
// API's RegisterRequest.drafter.
const (
	DrafterMTP    = "mtp"
	DrafterEagle3 = "eagle3"
)

// maxDrafterNameBytes bounds the drafter name a refusal repeats.
const maxDrafterNameBytes = 64

// ErrDrafterRefused is a drafter outside the speculative-prefill allow-list.
var ErrDrafterRefused = errors.New("speculative prefill runs only with one-model MTP or EAGLE3")

// CheckSpeculativePrefillDrafter is the drafter allow-list that validate-config and kvctl serve
// share: nil for DrafterMTP and DrafterEagle3, ErrDrafterRefused naming kind otherwise. Any
// other drafter would leave missing or stale draft KV behind a restored prefix.
func CheckSpeculativePrefillDrafter(kind string) error {
	switch kind {
	case DrafterMTP, DrafterEagle3:
		return nil
	}
	// The kind may come from a peer: a name longer than any drafter's is described, not echoed.
	if len(kind) > maxDrafterNameBytes {
		return fmt.Errorf("%w, found a drafter name of %d bytes", ErrDrafterRefused, len(kind))
	}
	return fmt.Errorf("%w, found drafter %q", ErrDrafterRefused, kind)
}

// DrafterKind is the drafter in the engine API's vocabulary: DrafterMTP or DrafterEagle3 for
// their one-model forms, "mtp-two-model" or "eagle3-two-model" for the others, and the lowered
// decoding_type for any other drafter.
func (s *SpeculativeConfig) DrafterKind() string {
	switch {
	case s.IsMTP() && s.OneModel():
		return DrafterMTP
	case s.IsMTP():
		return DrafterMTP + "-two-model"
	case s.IsEagle3() && s.OneModel():
		return DrafterEagle3
	case s.IsEagle3():
		return DrafterEagle3 + "-two-model"
	}
	return strings.ToLower(s.DecodingType)
}

// DraftLen is max_draft_len, or for MTP num_nextn_predict_layers when max_draft_len is left
// out; ok is false when neither is given.
func (s *SpeculativeConfig) DraftLen() (int64, bool) {
	if s.MaxDraftLen != nil {
		return *s.MaxDraftLen, true
	}
	if s.IsMTP() && s.NumNextNPredictLayers != nil {
		return *s.NumNextNPredictLayers, true
	}
	return 0, false
}

// PromptLookahead is the number of prompt tokens past a position that a one-model draft reads
// (seed commit 14): 1 for MTP-Eagle and EAGLE3, max_draft_len for vanilla MTP, 0 otherwise.
func (s *SpeculativeConfig) PromptLookahead() int64 {
	if s == nil || !s.OneModel() {
		return 0
	}
	if s.IsMTP() && s.UseMTPVanilla {
		n, _ := s.DraftLen()
		return n
	}
	return 1
}

// AttentionDPConfig is attention_dp_config.
type AttentionDPConfig struct {
	EnableWorkAwareRouting             bool `json:"enable_work_aware_routing"`
	EnableKVCacheAwareRouting          bool `json:"enable_kv_cache_aware_routing"`
	KVCacheRoutingConversationAffinity bool `json:"kv_cache_routing_conversation_affinity"`
}

// Paths of the keys rules point at.
const (
	pConn   = "kv_connector_config"
	pStore  = "kv_connector_config.mooncake_store"
	pAdmit  = "kv_connector_config.admission_query"
	pKV     = "kv_cache_config"
	pSpec   = "speculative_config"
	pADP    = "attention_dp_config"
	pStoreF = pStore + "."
)

var connectorPresets = map[string]bool{"lmcache": true, "lmcache-mp": true, "kvbm": true, "mooncake-store": true}

func decodeTRTLLM(d *dec, root *node) *TRTLLMConfig {
	t := &TRTLLMConfig{TensorParallelSize: 1, PipelineParallelSize: 1, ContextParallelSize: 1, MaxBeamWidth: 1}
	o := d.object(root, "")
	posInt := func(o *obj, key string, dst *int64, floor int64) {
		var p *int64
		o.intPtr(key, &p, floor)
		if p != nil {
			*dst = *p
		}
	}
	posInt(o, "tensor_parallel_size", &t.TensorParallelSize, 1)
	posInt(o, "pipeline_parallel_size", &t.PipelineParallelSize, 1)
	posInt(o, "context_parallel_size", &t.ContextParallelSize, 1)
	posInt(o, "max_beam_width", &t.MaxBeamWidth, 1)
	o.intPtr("max_seq_len", &t.MaxSeqLen, 1)
	if b, ok := o.boolv("enable_attention_dp", boolPydantic); ok {
		t.EnableAttentionDP = b
	}
	if b, ok := o.boolv("disable_overlap_scheduler", boolPydantic); ok {
		t.DisableOverlapScheduler = b
	}
	// "auto" (and a left-out key) stays nil: the manager is chosen at startup.
	if n := o.field("use_kv_cache_manager_v2"); n != nil && (n.kind != nodeScalar || n.typ != scalarString || !strings.EqualFold(n.text, "auto")) {
		o.boolPtr("use_kv_cache_manager_v2", &t.UseKVCacheManagerV2, boolPydantic)
	}

	kv := o.child("kv_cache_config")
	t.KVCache = KVCacheConfig{TokensPerBlock: 32, ReuseMatchAlignment: 1}
	posInt(kv, "tokens_per_block", &t.KVCache.TokensPerBlock, 1)
	kv.boolPtr("enable_partial_reuse", &t.KVCache.EnablePartialReuse, boolPydantic)
	kv.sizePtr("host_cache_size", &t.KVCache.HostCacheSize, false, 0)
	kv.sizePtr("disk_cache_size", &t.KVCache.DiskCacheSize, false, 0)
	if b, ok := kv.boolv("enable_disagg_completion_reservation", boolPydantic); ok {
		t.KVCache.EnableDisaggCompletionReservation = b
	}
	// The alignment's divisor rule is a cross-field rule; here only its type is read.
	if v, _, ok := kv.intv("reuse_match_alignment", intExact); ok {
		t.KVCache.ReuseMatchAlignment = v
	}
	posInt(kv, "reuse_match_backoff", &t.KVCache.ReuseMatchBackoff, 0)
	if n := kv.field("max_attention_window"); n != nil && !isNull(n) {
		t.KVCache.MaxAttentionWindow = intList(kv, "max_attention_window", n)
	}

	if n := o.field("kv_connector_config"); n != nil && !isNull(n) {
		t.Connector = decodeConnector(d, o.child("kv_connector_config"))
	}
	if n := o.field("speculative_config"); n != nil && !isNull(n) {
		t.Speculative = decodeSpeculative(o.child("speculative_config"))
	}
	adp := o.child("attention_dp_config")
	if b, ok := adp.boolv("enable_attention_dp", boolPydantic); ok && b {
		t.EnableAttentionDP = true
	}
	if b, ok := adp.boolv("enable_work_aware_routing", boolPydantic); ok {
		t.AttentionDP.EnableWorkAwareRouting = b
	}
	if b, ok := adp.boolv("enable_kv_cache_aware_routing", boolPydantic); ok {
		t.AttentionDP.EnableKVCacheAwareRouting = b
	}
	if b, ok := adp.boolv("kv_cache_routing_conversation_affinity", boolPydantic); ok {
		t.AttentionDP.KVCacheRoutingConversationAffinity = b
	}
	ct := o.child("cache_transceiver_config")
	ct.str("backend", &t.CacheTransceiverBackend, true)
	if v, ok := readKVTimeout(ct); ok {
		t.KVTransferTimeoutMs = &v
	}
	sc := o.child("scheduler_config")
	if b, ok := sc.boolv("enable_prefix_aware_scheduling", boolPydantic); ok {
		t.PrefixAwareScheduling = b
	}
	sp := o.child("sparse_attention_config")
	sp.boolPtr("sparse_disable_index_value", &t.SparseDisableIndexValue, boolPydantic)
	return t
}

func intList(o *obj, key string, n *node) []int64 {
	if n.kind == nodeScalar && n.typ == scalarInt && !n.overflow {
		return []int64{n.i}
	}
	if n.kind != nodeSeq {
		o.errAt(n, key, "want a list of integers, found "+n.describe(), "")
		return nil
	}
	var out []int64
	for _, it := range n.items {
		if it.kind != nodeScalar || it.typ != scalarInt || it.overflow || it.i < 1 {
			o.d.add(SeverityError, it.line, it.col, o.sub(key), "want a positive integer, found "+it.describe(), "")
			continue
		}
		out = append(out, it.i)
	}
	return out
}

func decodeConnector(d *dec, o *obj) *KVConnectorConfig {
	c := &KVConnectorConfig{}
	if o.str("connector", &c.Connector, true) && !connectorPresets[c.Connector] {
		d.at(SeverityError, pConn+".connector", "unknown connector preset "+quote(c.Connector),
			"use lmcache, lmcache-mp, kvbm or mooncake-store")
	}
	o.str("connector_module", &c.ConnectorModule, true)
	o.str("connector_scheduler_class", &c.SchedulerClass, true)
	o.str("connector_worker_class", &c.WorkerClass, true)
	if n := o.field("mooncake_store"); n != nil && !isNull(n) {
		c.MooncakeStore = decodeStore(o.child("mooncake_store"))
	}
	if n := o.field("admission_query"); n != nil && !isNull(n) {
		a := o.child("admission_query")
		c.AdmissionQuery = &AdmissionQueryConfig{}
		var p *int64
		a.intPtr("max_uncharged_parks", &p, 0)
		if p != nil {
			c.AdmissionQuery.MaxUnchargedParks = *p
		}
		p = nil
		a.intPtr("max_offer_deferrals", &p, 0)
		if p != nil {
			c.AdmissionQuery.MaxOfferDeferrals = *p
		}
		a.rest(SeverityError, " in admission_query")
	}
	decodeKvctlConnector(o, c)
	return c
}

func decodeStore(o *obj) *MooncakeStoreBlock {
	b := &MooncakeStoreBlock{}
	if !o.str("pool", &b.Pool, false) && !o.present("pool") && o.n != nil {
		o.d.at(SeverityError, o.sub("pool"), "pool is required",
			"name the pool manifest as file:///path/pool.json, or the master as host:port")
	}
	o.role("role", &b.Role)
	o.sizePtr("segment_size", &b.SegmentSize, true, 0)
	o.strPtr("model_key", &b.ModelKey)
	o.strPtr("namespace", &b.Namespace)
	o.intPtr("transfer_batch_size", &b.TransferBatchSize, 1)
	o.boolPtr("stage_through_host", &b.StageThroughHost, boolPydantic)
	o.strPtr("local_hostname", &b.LocalHostname)
	o.strPtr("run_dir", &b.RunDir)
	o.floatPtr("master_timeout", &b.MasterTimeout, true)
	var lrb string
	if n := o.field("local_reuse_backoff"); n != nil && n.kind == nodeScalar && n.typ == scalarBool {
		o.errAt(n, "local_reuse_backoff", "want off or align; unquoted "+n.text+" is a YAML boolean",
			"write \"off\" or \"align\" in quotes")
	} else if o.str("local_reuse_backoff", &lrb, true) {
		if lrb != "off" && lrb != "align" {
			o.errAt(o.field("local_reuse_backoff"), "local_reuse_backoff",
				"want off or align, found "+quote(lrb), "")
		} else {
			b.LocalReuseBackoff = &lrb
		}
	}
	o.intPtr("soft_pin_ttl_ms", &b.SoftPinTTLMs, -1<<63)
	o.boolPtr("group_blocks", &b.GroupBlocks, boolPydantic)
	o.floatPtr("stats_interval", &b.StatsInterval, false)
	o.sizePtr("staging_buffer_bytes", &b.StagingBufferBytes, true, 1)
	o.boolPtr("async_load", &b.AsyncLoad, boolPydantic)
	o.intPtr("async_load_workers", &b.AsyncLoadWorkers, 1)
	o.rest(SeverityError, " in mooncake_store")
	checkSoftPin(o.d, o.sub("soft_pin_ttl_ms"), b.SoftPinTTLMs)
	checkStatsInterval(o.d, o.sub("stats_interval"), b.StatsInterval)
	if b.Pool != "" {
		if _, _, err := ParsePoolRef(b.Pool); err != nil {
			o.d.at(SeverityError, o.sub("pool"), err.Error(), "write file:///path/pool.json or host:port")
		}
	}
	return b
}

func decodeSpeculative(o *obj) *SpeculativeConfig {
	s := &SpeculativeConfig{MTPEagleOneModel: true, Eagle3OneModel: true}
	o.str("decoding_type", &s.DecodingType, true)
	if s.DecodingType == "" {
		o.d.at(SeverityError, o.sub("decoding_type"), "decoding_type is required", "for example MTP or Eagle3")
	}
	o.intPtr("max_draft_len", &s.MaxDraftLen, 0)
	o.intPtr("num_nextn_predict_layers", &s.NumNextNPredictLayers, 0)
	if b, ok := o.boolv("use_mtp_vanilla", boolPydantic); ok {
		s.UseMTPVanilla = b
	}
	if b, ok := o.boolv("mtp_eagle_one_model", boolPydantic); ok {
		s.MTPEagleOneModel = b
	}
	if b, ok := o.boolv("eagle3_one_model", boolPydantic); ok {
		s.Eagle3OneModel = b
	}
	if b, ok := o.boolv("use_separate_draft_kv_cache", boolPydantic); ok {
		s.SeparateDraftKVCache = b
	}
	return s
}

func quote(s string) string { return "\"" + s + "\"" }
