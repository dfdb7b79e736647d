package keys

import (
	"errors"
	"fmt"
	"strings"
)

// Format names a scheme with a 16-byte chain (Scheme.Chain): the schemes kvctl serve's
// connector, the radix tree and the replay run on. See the package documentation for the exact
// derivation of each; the formats are the registered schemes whose Chain is set.
type Format string

// The formats of the TensorRT-LLM and kvctl schemes (scheme_trtllm.go).
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

// ErrUnknownFormat is returned (wrapped) for a format name that is not one of Formats (or, from
// LookupScheme, of the registered schemes).
var ErrUnknownFormat = errors.New("unknown format")

// ChainRules are what a 16-byte-chain scheme decides about its chain.
type ChainRules struct {
	// Lookahead reports whether blocks may be hashed with a prompt lookahead.
	Lookahead bool
	// FullScope reports whether the seed can express a LoRA task id and multimodal digests,
	// not only a cache salt.
	FullScope bool
	// BLAKE3 digests with BLAKE3 in key-derivation mode instead of 16-byte BLAKE2b.
	BLAKE3 bool
	// SeedPreimage returns the bytes digested into the seed before any lookahead re-seed.
	SeedPreimage func(Scope) []byte
}

// Formats returns every format, the default first: the registered schemes with a 16-byte chain.
func Formats() []Format {
	var out []Format
	for _, s := range Schemes() {
		if s.Chain != nil {
			out = append(out, Format(s.Name))
		}
	}
	return out
}

// ParseFormat returns the format named s. Names are matched exactly (they are lowercase);
// an empty name is an error, so that an explicitly empty flag is not silently the default. A
// registered scheme without a 16-byte chain (vLLM's, SGLang's) is not a format.
func ParseFormat(s string) (Format, error) {
	if _, ok := chainRules(Format(s)); ok {
		return Format(s), nil
	}
	if sc, err := LookupScheme(s); err == nil {
		return "", fmt.Errorf("%w %q: a %s scheme, which kvctl derives keys for (hash, probe-pool) but does not run a block chain of; want one of %s", ErrUnknownFormat, s, sc.Engine, formatList())
	}
	return "", fmt.Errorf("%w %q: want one of %s", ErrUnknownFormat, s, formatList())
}

func formatList() string {
	var names []string
	for _, f := range Formats() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}

// chainRules returns the rules of format f, if it is one.
func chainRules(f Format) (*ChainRules, bool) {
	if s := lookup(string(f)); s != nil && s.Chain != nil {
		return s.Chain, true
	}
	return nil, false
}

// hasLookahead reports whether the format can hash blocks with a prompt lookahead.
func (f Format) hasLookahead() bool {
	r, ok := chainRules(f)
	return ok && r.Lookahead
}

// hasFullScope reports whether the format's seed can express a LoRA task id and multimodal
// digests, not only a cache salt.
func (f Format) hasFullScope() bool {
	r, ok := chainRules(f)
	return ok && r.FullScope
}
