// Package disagg is kvctl's disaggregated-serving front: an OpenAI-compatible HTTP server that
// runs each request as a context leg on a context server and a generation leg on a generation
// server, speaking the protocol of TensorRT-LLM's trtllm-serve, as configured by TensorRT-LLM's
// own disagg_config.yaml (config.KindDisagg).
//
// # Vocabulary
//
// Leg: one HTTP request to one upstream server. The context leg is the client's request with
// disaggregated_params {request_type: context_only, disagg_request_id}, stream off; its answer
// carries, in choices[0].disaggregated_params, what the generation server needs to pull the
// prompt's KV cache (ctx_request_id, first_gen_tokens, encoded_opaque_state, draft_tokens, …),
// which the proxy relays untouched. The generation leg is the client's request with those
// params, request_type generation_only, the same disagg_request_id, and the prompt replaced by
// the prompt_token_ids the context server returned.
//
// disagg_request_id: the id that names the context server's one-shot KV send session. A
// generation leg keeps it on every retry, and is re-sent only when it cannot have reached the
// server: its connection was refused (any failure to connect) or reset while the request was
// being written. Any other failure, and every failure after response headers arrived, fails the
// request with an error the client sees. A context leg is re-sent up to max_retries times on a
// transport error or a 5xx answer, under a fresh id, as TensorRT-LLM's client does.
//
// First chunk: the first server-sent event of a streamed answer. The proxy reads it from the
// generation server before it sends its own response headers, so a stream that fails before its
// first chunk becomes an HTTP error with the worker's status and message (the Anthropic error
// envelope on /v1/messages), and one that fails later gets an error event in the stream.
//
// kv_transfer_timeout_ms: the longest a streamed generation leg may take to deliver its first
// chunk. When it passes, the upstream request is cancelled (its connection closed) and the
// client gets 504 with a timeout error. A non-streamed leg is bounded by request_timeout_s.
//
// Reservation: a routing decision holds a slot on the server it picked (its in-flight count, its
// estimated work) until the leg ends, whether it completed, failed, timed out or the client went
// away; a client that disconnects cancels the upstream request.
//
// Routers (context_servers.router.type): round_robin and load_balancing as in TensorRT-LLM;
// work_aware, the seed's work-aware policy (core/router: estimate = prompt growth since the
// conversation's previous request, to the least-loaded server under a cap); and pool_aware,
// which estimates a request's uncached prefill by looking its block keys up in the shared pool
// as probe-pool does, within lookup_timeout_ms, falling back to the work-aware estimate when the
// lookup fails, times out, or the prompt is text rather than token ids.
//
// A Proxy is safe for concurrent use; every counter it keeps is exported on /metrics.
package disagg
