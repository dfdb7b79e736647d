// Package router places new requests on attention-DP ranks, as TensorRT-LLM's ADP router does
// once per scheduling iteration with the same inputs on every rank.
//
// # Vocabulary
//
// Rank: one attention-DP owner. It holds requests until they finish; Active counts them and
// MaxActiveRequests (max_num_active_requests) caps it.
//
// Estimate: the prefill work a request is expected to bring, in tokens. The work-aware router
// (attention_dp_config.enable_work_aware_routing) estimates a request's prefill as its prompt
// growth since the previous request of the same conversation: the whole prompt for a first
// turn, a request without a conversation id, or a prompt that shrank; at least one token. The
// prompt-length router estimates the whole prompt.
//
// Load: the summed estimates of a rank's requests still in the context phase. ContextDone
// takes a request's estimate off its rank; Finished also frees its active slot.
//
// Routing: every request of a batch is estimated once, in routing order, and charged to its
// rank. Explicitly placed requests keep their rank; the others go, largest estimate first
// (routing order among equals), to the least-loaded rank below the cap (the lowest index among
// equals). A child of an n>1 request inherits its parent's estimate. The conversation and
// per-request tables are LRU-bounded and change only in Route.
//
// A Router is not safe for concurrent use.
package router
