// Package disaggtest runs scripted trtllm-serve context and generation servers on loopback
// for the tests, benchmarks and soak of package disagg.
//
// The servers speak the part of trtllm-serve's protocol the disaggregated front relies on and
// check it: a context server wants disaggregated_params {request_type: context_only,
// disagg_request_id} with stream off, and answers with finish_reason "length", the prompt's
// token ids and disaggregated_params {ctx_request_id, first_gen_tokens, encoded_opaque_state,
// disagg_request_id}; a generation server wants request_type generation_only, the
// disagg_request_id the context leg used as ctx_request_id, the opaque state and the token ids,
// and answers with a completion, a chat completion or (when enabled) an Anthropic message,
// streamed as server-sent events or not.
//
// # Faults
//
// A request names a fault in its "user" field as "fault:<name>" (Fault constants); the context
// server carries it to the generation server inside encoded_opaque_state, as a real context
// server carries its transfer state. Each fault fails exactly one way, so a test can check one
// rule of the proxy's contract. Servers count what they saw (Stats) so that tests can assert
// that an id was retried unchanged, or that a cancelled request was seen cancelled upstream.
package disaggtest
