package config

import "fmt"

// Cross-field rules of a TensorRT-LLM YAML, from the seed and the reference's startup checks.
// Each rule records its diagnostics at the key it names.

// ruleEnv is what the rules need besides the YAML itself.
type ruleEnv struct {
	role      Role // effective role: the inherited client config's, else the block's
	inherited bool // a client config from MOONCAKE_CONFIG_PATH was restated onto the block
}

// hasConnector reports whether kv_connector_config names any connector.
func (t *TRTLLMConfig) hasConnector() bool {
	c := t.Connector
	return c != nil && (c.Connector != "" || c.ConnectorModule != "" || c.MooncakeStore != nil)
}

// SlidingWindow reports whether kv_cache_config.max_attention_window gives any layer a window
// shorter than the sequence (every window, when max_seq_len is not set).
func (t *TRTLLMConfig) SlidingWindow() bool {
	for _, w := range t.KVCache.MaxAttentionWindow {
		if t.MaxSeqLen == nil || w < *t.MaxSeqLen {
			return true
		}
	}
	return false
}

func (t *TRTLLMConfig) rules(d *dec, env ruleEnv) {
	t.ruleAlignment(d)
	t.ruleWorkAwareRouting(d, env)
	t.ruleCompletionReservation(d, env)
	if t.Connector == nil {
		return
	}
	store := t.Connector.MooncakeStore
	mooncake := t.Connector.IsMooncakeStore()
	if store != nil && !mooncake {
		d.at(SeverityError, pStore, "mooncake_store is set but the connector is not mooncake-store",
			"set kv_connector_config.connector: mooncake-store")
	}
	if t.hasConnector() && t.MaxBeamWidth > 1 {
		d.at(SeverityError, "max_beam_width", fmt.Sprintf("a KV connector refuses beam search, found max_beam_width %d", t.MaxBeamWidth), "set it to 1")
	}
	// kvctl's connector declares what mooncake_store declares (llmapi.go).
	kvctl := t.Connector.IsKvctl()
	t.ruleSpeculative(d, env, mooncake || kvctl)
	t.ruleAdmissionQuery(d, env, mooncake || kvctl)
	if kvctl {
		t.ruleFailedLoads(d, env)
		t.ruleAttentionDPAggregated(d, env)
		return
	}
	if !mooncake {
		return
	}
	t.ruleFailedLoads(d, env)
	t.ruleAttentionDPAggregated(d, env)
	t.ruleMooncakeStartup(d, env)
	t.ruleTierOverrides(d, env)
	if store != nil {
		t.ruleStoreBlock(d, env, store)
	}
}

// Seed commit 1: the alignment is a positive divisor of tokens_per_block.
func (t *TRTLLMConfig) ruleAlignment(d *dec) {
	a, tpb := t.KVCache.ReuseMatchAlignment, t.KVCache.TokensPerBlock
	if a < 1 || (tpb > 0 && tpb%a != 0) {
		d.at(SeverityError, pKV+".reuse_match_alignment",
			fmt.Sprintf("reuse_match_alignment %d is not a positive divisor of tokens_per_block %d", a, tpb),
			"use 1 (token-granular) or a divisor of tokens_per_block")
	}
}

// Seed commit 20: work-aware routing excludes the KV-cache-aware router and conversation affinity.
func (t *TRTLLMConfig) ruleWorkAwareRouting(d *dec, env ruleEnv) {
	a := t.AttentionDP
	if !a.EnableWorkAwareRouting {
		return
	}
	if a.EnableKVCacheAwareRouting {
		d.at(SeverityError, pADP+".enable_kv_cache_aware_routing",
			"enable_work_aware_routing cannot be combined with enable_kv_cache_aware_routing", "turn one of them off")
	}
	if a.KVCacheRoutingConversationAffinity {
		d.at(SeverityError, pADP+".kv_cache_routing_conversation_affinity",
			"enable_work_aware_routing cannot be combined with kv_cache_routing_conversation_affinity", "turn one of them off")
	}
	if !t.EnableAttentionDP {
		d.at(SeverityWarning, pADP+".enable_work_aware_routing", "work-aware routing places requests only under attention DP", "set enable_attention_dp: true")
	}
	switch {
	case !t.hasConnector():
		d.at(SeverityWarning, pADP+".enable_work_aware_routing",
			"work-aware routing needs a KV connector that moves KV; the default router is used", "")
	case t.Connector.IsMooncakeStore() && !env.role.Transfers():
		d.at(SeverityWarning, pADP+".enable_work_aware_routing",
			"work-aware routing needs a KV connector that moves KV, and mooncake_store role "+string(env.role)+" moves none; the default router is used", "")
	}
}

// Seed commits 5 and 14: speculative decoding next to a connector only in speculative-prefill
// mode. A capacity role moves no KV and is never refused.
func (t *TRTLLMConfig) ruleSpeculative(d *dec, env ruleEnv, mooncake bool) {
	s := t.Speculative
	if s == nil || !t.hasConnector() {
		return
	}
	if mooncake && !env.role.Transfers() {
		t.ruleSpeculativeCapacity(d)
		return
	}
	if !mooncake {
		d.at(SeverityError, pSpec, "speculative decoding is refused next to a KV connector that does not declare supports_speculative_prefill",
			"remove speculative_config or use the mooncake-store connector")
		return
	}
	const mode = "speculative decoding next to a KV connector runs only in speculative-prefill mode: "
	if CheckSpeculativePrefillDrafter(s.DrafterKind()) != nil {
		t.drafterRefused(d, mode)
	}
	if n, ok := s.DraftLen(); !ok {
		d.at(SeverityError, pSpec+".max_draft_len", mode+"the draft length is unresolved, and the key lookahead depends on it", "set max_draft_len")
	} else if n <= 0 {
		d.at(SeverityError, pSpec+".max_draft_len", mode+fmt.Sprintf("the draft length must be positive, found %d", n), "")
	}
	if t.CacheTransceiverBackend == "" {
		d.atFirst(SeverityError, "cache_transceiver_config.backend", mode+"it needs a disaggregated context server (a cache transceiver backend)",
			"set cache_transceiver_config.backend", "cache_transceiver_config", pSpec)
	}
	switch {
	case t.UseKVCacheManagerV2 != nil && !*t.UseKVCacheManagerV2:
		d.at(SeverityError, "use_kv_cache_manager_v2", mode+"it needs KVCacheManagerV2", "set use_kv_cache_manager_v2: true")
	case t.UseKVCacheManagerV2 == nil:
		// The engine refuses an automatic choice that resolves to V1, and which manager "auto"
		// picks is decided only at startup, so a file can be proven valid only with an explicit true.
		d.atFirst(SeverityError, "use_kv_cache_manager_v2", mode+"it needs KVCacheManagerV2, and use_kv_cache_manager_v2 left at auto may resolve to V1, which is refused",
			"set use_kv_cache_manager_v2: true", pSpec)
	}
	if s.SeparateDraftKVCache {
		d.at(SeverityError, pSpec+".use_separate_draft_kv_cache", mode+"a separate draft KV cache is never seen by the connector", "share the target KV cache")
	}
}

// Seed commits 7 and 17: admission queries.
func (t *TRTLLMConfig) ruleAdmissionQuery(d *dec, env ruleEnv, mooncake bool) {
	if t.Connector.AdmissionQuery == nil {
		return
	}
	if !t.hasConnector() {
		d.at(SeverityError, pAdmit, "admission_query needs a KV connector", "")
		return
	}
	if !t.DisableOverlapScheduler {
		d.at(SeverityError, pAdmit, "admission_query needs the overlap scheduler disabled", "set disable_overlap_scheduler: true")
	}
	// Seed commit 7: the query is asked by the KVCacheV2Scheduler, which runs only with
	// KVCacheManagerV2.
	if t.UseKVCacheManagerV2 != nil && !*t.UseKVCacheManagerV2 {
		d.at(SeverityError, pAdmit, "admission_query needs the KVCacheV2Scheduler, which runs only with KVCacheManagerV2; use_kv_cache_manager_v2 is false",
			"set use_kv_cache_manager_v2: true")
	}
	ignored := func(why string) {
		d.at(SeverityWarning, pAdmit, "admission_query is ignored "+why, "")
	}
	switch {
	case t.EnableAttentionDP:
		ignored("under attention DP")
	case mooncake && !env.role.Transfers():
		ignored("for the capacity-only role")
	case t.PrefixAwareScheduling:
		ignored("with prefix reservations (scheduler_config.enable_prefix_aware_scheduling)")
	case !mooncake:
		ignored("unless the connector scheduler declares supports_admission_query, which only mooncake-store is known to")
	}
}

// Reference f.1: the startup validation of mooncake_store.
func (t *TRTLLMConfig) ruleMooncakeStartup(d *dec, env ruleEnv) {
	if t.PipelineParallelSize > 1 {
		d.at(SeverityError, "pipeline_parallel_size", fmt.Sprintf("mooncake_store refuses pipeline parallelism, found %d", t.PipelineParallelSize), "set it to 1")
	}
	if t.ContextParallelSize > 1 {
		d.at(SeverityError, "context_parallel_size", fmt.Sprintf("mooncake_store refuses context parallelism, found %d", t.ContextParallelSize), "set it to 1")
	}
	if t.SlidingWindow() {
		d.at(SeverityError, pKV+".max_attention_window", "mooncake_store refuses sliding-window layers", "remove max_attention_window")
	}
	if t.SparseDisableIndexValue != nil && !*t.SparseDisableIndexValue {
		d.at(SeverityError, "sparse_attention_config.sparse_disable_index_value", "mooncake_store refuses sparse_disable_index_value: false", "")
	}
	if env.role.Transfers() && t.UseKVCacheManagerV2 != nil && !*t.UseKVCacheManagerV2 {
		d.at(SeverityError, "use_kv_cache_manager_v2", "mooncake_store registers its layout with KVCacheManagerV2; V1 is refused unless the role is capacity",
			"set use_kv_cache_manager_v2: true")
	}
}

// Reference b.2: a role that transfers forces the native tiers off and partial reuse off.
func (t *TRTLLMConfig) ruleTierOverrides(d *dec, env ruleEnv) {
	if !env.role.Transfers() {
		return
	}
	why := " because mooncake_store role " + string(env.role) + " transfers KV"
	kv := t.KVCache
	if kv.HostCacheSize != nil && kv.HostCacheSize.Bytes > 0 {
		d.at(SeverityWarning, pKV+".host_cache_size", "host_cache_size is overridden to 0"+why, "set host_cache_size: 0")
	}
	if kv.DiskCacheSize != nil && kv.DiskCacheSize.Bytes > 0 {
		d.at(SeverityWarning, pKV+".disk_cache_size", "disk_cache_size is overridden to 0"+why, "set disk_cache_size: 0")
	}
	if kv.EnablePartialReuse == nil || *kv.EnablePartialReuse {
		d.atFirst(SeverityWarning, pKV+".enable_partial_reuse", "enable_partial_reuse is overridden to false"+why+" (offers start only at a block boundary)",
			"set enable_partial_reuse: false", pKV, pStoreF+"role", pStore)
	}
}

// Seed commit 6: the completion reservation applies only to a disaggregated target manager
// with no tier below GPU, beam width 1, one pipeline stage and full attention.
func (t *TRTLLMConfig) ruleCompletionReservation(d *dec, env ruleEnv) {
	if !t.KVCache.EnableDisaggCompletionReservation {
		return
	}
	const p = pKV + ".enable_disagg_completion_reservation"
	const cannot = "enable_disagg_completion_reservation cannot apply: "
	if t.CacheTransceiverBackend == "" {
		d.at(SeverityWarning, p, cannot+"the server is not disaggregated (no cache_transceiver_config.backend)", "")
	}
	dropsTiers := t.Connector.IsMooncakeStore() && env.role.Transfers()
	if !dropsTiers {
		if h := t.KVCache.HostCacheSize; h == nil {
			d.at(SeverityWarning, p, cannot+"without a connector that drops it, the automatic host tier stays unless host_cache_size is 0", "set host_cache_size: 0")
		} else if h.Bytes > 0 {
			d.at(SeverityWarning, pKV+".host_cache_size", cannot+"a host tier lies below GPU", "set host_cache_size: 0")
		}
		if dk := t.KVCache.DiskCacheSize; dk != nil && dk.Bytes > 0 {
			d.at(SeverityWarning, pKV+".disk_cache_size", cannot+"a disk tier lies below GPU", "set disk_cache_size: 0")
		}
	}
	if t.MaxBeamWidth != 1 {
		d.at(SeverityWarning, "max_beam_width", cannot+fmt.Sprintf("beam width is %d, not 1", t.MaxBeamWidth), "")
	}
	if t.PipelineParallelSize > 1 {
		d.at(SeverityWarning, "pipeline_parallel_size", cannot+"it needs a single pipeline stage", "")
	}
	if t.SlidingWindow() {
		d.at(SeverityWarning, pKV+".max_attention_window", cannot+"it needs full attention on every layer", "")
	}
}

// The kv_connector_config.mooncake_store block's own cross-field rules: the seed's commits 13, 15,
// 16 and 17 (docs/SEED.md) and MooncakeStoreConfig's in TensorRT-LLM's mooncake_store/config.py
// (https://github.com/NVIDIA/TensorRT-LLM/pull/21195).
func (t *TRTLLMConfig) ruleStoreBlock(d *dec, env ruleEnv, b *MooncakeStoreBlock) {
	if b.ModelKey == nil && !env.inherited && !d.bad[pStoreF+"model_key"] {
		d.at(SeverityError, pStoreF+"model_key", "model_key is required: every rank resolves it at startup and it has no default",
			"name the model, for example its served name and revision")
	}
	if b.AsyncLoadWorkers != nil && !boolOr(b.AsyncLoad, false) {
		d.at(SeverityWarning, pStoreF+"async_load_workers", "async_load_workers has no effect unless async_load is true", "")
	}
	if boolOr(b.AsyncLoad, false) && !env.role.Loads() {
		d.at(SeverityWarning, pStoreF+"async_load", "async_load has no effect for role "+string(env.role)+", which never loads", "")
	}
	if b.SoftPinTTLMs != nil && !env.role.Saves() {
		d.at(SeverityWarning, pStoreF+"soft_pin_ttl_ms", "soft_pin_ttl_ms applies only to a role that writes, not "+string(env.role), "")
	}
	if boolOr(b.GroupBlocks, false) && !env.role.Saves() {
		d.at(SeverityWarning, pStoreF+"group_blocks", "group_blocks applies only to a role that writes, not "+string(env.role), "")
	}
	if b.StatsInterval != nil && !env.role.Loads() {
		d.at(SeverityWarning, pStoreF+"stats_interval", "stats_interval counts only for a role that reads the pool, not "+string(env.role), "")
	}
	if b.LocalReuseBackoff != nil && (t.Speculative == nil || !t.Speculative.OneModel()) {
		d.at(SeverityWarning, pStoreF+"local_reuse_backoff", "local_reuse_backoff matters only with a one-model draft (MTP or EAGLE3)", "")
	}
	if b.StageThroughHost != nil && !*b.StageThroughHost && env.role.Transfers() {
		d.at(SeverityWarning, pStoreF+"stage_through_host",
			"stage_through_host is forced back to true for role "+string(env.role)+": zero-copy registration is not available", "")
	}
}

// Seed commit 5 with 14: a capacity role addresses no page and skips the drafter allow-list of
// the store, but the executor still lets speculative decoding run next to the connector only in
// its one-model form, so a capacity server runs one-model MTP or EAGLE3 and nothing else.
func (t *TRTLLMConfig) ruleSpeculativeCapacity(d *dec) {
	s := t.Speculative
	const why = "a capacity-role server runs speculative decoding next to its connector only as one-model MTP or EAGLE3: "
	if CheckSpeculativePrefillDrafter(s.DrafterKind()) != nil {
		t.drafterRefusedCapacity(d, why)
	}
	if s.SeparateDraftKVCache {
		d.at(SeverityError, pSpec+".use_separate_draft_kv_cache", why+"a separate draft KV cache is not one-model speculation", "share the target KV cache")
	}
}

// connectorName names the connector in messages of rules shared by mooncake_store and kvctl's.
func (t *TRTLLMConfig) connectorName() string {
	if t.Connector.IsKvctl() {
		return KvctlConnectorModule
	}
	return "mooncake_store"
}

// Seed commits 4 and 11: mooncake_store's worker declares reports_failed_loads whatever its
// role ("the worker now declares reports_failed_loads"), the manager masks only a capacity
// role's declaration, and it refuses the declaration together with prefix reservations, whose
// completion protocol has no failure outcome. A producer therefore is refused too.
func (t *TRTLLMConfig) ruleFailedLoads(d *dec, env ruleEnv) {
	if !env.role.Transfers() || !t.PrefixAwareScheduling {
		return
	}
	d.atFirst(SeverityError, "scheduler_config.enable_prefix_aware_scheduling",
		t.connectorName()+" role "+string(env.role)+" declares reports_failed_loads, which is refused together with prefix reservations: their completion protocol has no failure outcome",
		"turn enable_prefix_aware_scheduling off, or use role capacity", "scheduler_config")
}

// Seed commit 12: aggregated serving under attention DP is not supported yet. When the
// attention-DP gate skips a prepared pass, a generation page already reported to the connector
// can be reassigned without the connector hearing of it. Disaggregated context servers and
// roles that save nothing are unaffected.
func (t *TRTLLMConfig) ruleAttentionDPAggregated(d *dec, env ruleEnv) {
	if !t.EnableAttentionDP || !env.role.Saves() || t.CacheTransceiverBackend != "" {
		return
	}
	d.atFirst(SeverityWarning, "enable_attention_dp",
		"aggregated serving under attention DP is not supported yet: a generation page already reported to "+t.connectorName()+" can be reassigned when the attention-DP gate skips a prepared pass",
		"run disaggregated (set cache_transceiver_config.backend) or use a role that saves nothing", pADP+".enable_attention_dp", pADP)
}

// drafterRefused names why a drafter is outside the allow-list CheckSpeculativePrefillDrafter
// keeps, with the key to change.
func (t *TRTLLMConfig) drafterRefused(d *dec, mode string) {
	s := t.Speculative
	switch {
	case !s.IsMTP() && !s.IsEagle3():
		d.at(SeverityError, pSpec+".decoding_type", mode+"the drafter must be one-model MTP or EAGLE3, found "+quote(s.DecodingType), "use MTP or Eagle3")
	case s.IsMTP():
		d.at(SeverityError, pSpec+".mtp_eagle_one_model", mode+"MTP must run as one model", "set mtp_eagle_one_model: true")
	default:
		d.at(SeverityError, pSpec+".eagle3_one_model", mode+"EAGLE3 must run as one model", "set eagle3_one_model: true")
	}
}

// drafterRefusedCapacity is drafterRefused in a capacity role's words.
func (t *TRTLLMConfig) drafterRefusedCapacity(d *dec, why string) {
	s := t.Speculative
	switch {
	case !s.IsMTP() && !s.IsEagle3():
		d.at(SeverityError, pSpec+".decoding_type", why+"found "+quote(s.DecodingType), "use MTP or Eagle3")
	case s.IsMTP():
		d.at(SeverityError, pSpec+".mtp_eagle_one_model", why+"MTP must run as one model", "set mtp_eagle_one_model: true")
	default:
		d.at(SeverityError, pSpec+".eagle3_one_model", why+"EAGLE3 must run as one model", "set eagle3_one_model: true")
	}
}
