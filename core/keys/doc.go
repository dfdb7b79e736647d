// Package keys derives the block hashes and pool keys of a prompt, byte-identical to
// TensorRT-LLM's mooncake-store connector.
package keys
