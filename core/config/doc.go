// Package config reads, checks and writes the configuration files of a Mooncake-store
// deployment: TensorRT-LLM's LLM API YAML with its kv_connector_config.mooncake_store block,
// the Mooncake client config mooncake.json, the pool manifest pool.json, kvctl's own serve
// config, and TensorRT-LLM's disagg_config.yaml for the disaggregated front.
//
// # Vocabulary
//
//   - Kind: which of the five files a text is (KindTRTLLM, KindClient, KindManifest,
//     KindServe, KindDisagg). DetectKind tells by the keys at the top level first, then by the file name.
//   - Block: the YAML's mooncake_store mapping (MooncakeStoreBlock). A nil field was left out;
//     Effective… methods give the value the server uses.
//   - Client config: mooncake.json (ClientConfig), the file every rank opens. The server renders
//     it from the block and the manifest (RenderClientConfig), or inherits it through
//     MOONCAKE_CONFIG_PATH, in which case its values are restated onto the block (Restate).
//   - Manifest: pool.json (PoolManifest), published by the pool's master. Keys it does not know
//     are kept in Extra and written back by Marshal.
//   - Role: both, producer, consumer or capacity. A role "transfers" unless it is capacity.
//   - Diagnostic: one problem, with file:line:column, the dotted key path
//     (kv_connector_config.mooncake_store.group_blocks), a severity and a hint.
//
// # Entry points
//
// Load(name, data, opts) parses one file, decodes it against its schema and runs every
// cross-field rule, returning a *File and every Diagnostic at once; it never panics. The
// validate-config command calls it once per file and maps Diagnostics.HasErrors to its exit
// code. LoadOptions selects the kind, the node budget check (NodeBudget, MemAvailable,
// RanksOnNode) and the environment used to find an inherited client config (Env, ReadFile).
//
// Value rules of structs built in code (for example a ServeConfig assembled from flags) are
// checked by their Validate methods, which return the same diagnostics without positions.
//
// Writers reproduce TensorRT-LLM's bytes: MarshalClientConfig and RenderClientConfig
// (json.dump, indent 2, insertion order, no final newline), PoolManifest.Marshal (indent 2,
// sorted keys, final newline); WriteFileAtomic writes through {path}.partial.{pid} and a rename.
//
// ParseSize is TensorRT-LLM's parse_size. CheckNodeBudget is the node memory check as a pure
// function. KeyInputsFrom gathers the inputs of the key derivation for `kvctl hash
// --from-config`.
//
// # YAML and JSON readings
//
// YAML plain scalars are typed as PyYAML (YAML 1.1) types them, because that is what
// TensorRT-LLM reads: yes/no/on/off are booleans and 1e5 is a string. JSON is read as Python's
// json module reads it, NaN and Infinity included, so that rules requiring a finite number
// can point at them. A repeated key keeps its last value, with a warning.
//
// Where the sources are silent, this package chooses, and says so at the field: the seed's
// six client config keys are written after stage_through_host in commit order and only when
// the block sets them; reuse_match_alignment and reuse_match_backoff are read from
// kv_cache_config; speculative_config.use_separate_draft_kv_cache declares a separate draft KV
// cache; admission_query's two limits default to 0.
package config
