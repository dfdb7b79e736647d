package keys

import (
	"errors"
	"fmt"
	"strings"
)

// Format selects how the seed and the block hashes of a chain are derived. See the package
// documentation for the exact derivation of each format.
type Format string

const (
	// FormatTRTLLM is the default: the TensorRT-LLM main line (framed reuse-scope seed) with the
	// prompt-lookahead re-seed and overlapping block windows when the lookahead is positive.
	FormatTRTLLM Format = "trtllm"
	// FormatTRTLLMLookaheadV2 is the "mooncake-kv-v2" branch: salt-only seed, prompt lookahead.
	FormatTRTLLMLookaheadV2 Format = "trtllm-lookahead-v2"
	// FormatTRTLLMV1 is the oldest branch: salt-only seed, no lookahead.
	FormatTRTLLMV1 Format = "trtllm-v1"
	// FormatBLAKE3 is specific to kvctl and incompatible with TensorRT-LLM: the framing of
	// FormatTRTLLM digested with BLAKE3 in its key-derivation mode.
	FormatBLAKE3 Format = "blake3"
)

// ErrUnknownFormat is returned (wrapped) for a format name that is not one of Formats.
var ErrUnknownFormat = errors.New("unknown format")

// Formats returns every known format, the default first.
func Formats() []Format {
	return []Format{FormatTRTLLM, FormatTRTLLMLookaheadV2, FormatTRTLLMV1, FormatBLAKE3}
}

// ParseFormat returns the format named s. Names are matched exactly (they are lowercase);
// an empty name is an error, so that an explicitly empty flag is not silently the default.
func ParseFormat(s string) (Format, error) {
	for _, f := range Formats() {
		if string(f) == s {
			return f, nil
		}
	}
	return "", fmt.Errorf("%w %q: want one of %s", ErrUnknownFormat, s, formatList())
}

func formatList() string {
	names := make([]string, 0, 4)
	for _, f := range Formats() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}

// hasLookahead reports whether the format can hash blocks with a prompt lookahead.
func (f Format) hasLookahead() bool { return f != FormatTRTLLMV1 }

// hasFullScope reports whether the format's seed can express a LoRA task id and multimodal
// digests, not only a cache salt.
func (f Format) hasFullScope() bool { return f == FormatTRTLLM || f == FormatBLAKE3 }
