package keys

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
)

// MultimodalDigestSize is the size of one multimodal item's digest in the reuse scope.
const MultimodalDigestSize = 32

// Scope is the reuse scope of a request: everything besides its tokens that decides whether
// two requests may share KV. Only the formats whose ChainRules.FullScope is set (FormatTRTLLM,
// FormatBLAKE3) can express all of it; the older formats carry the cache salt only.
type Scope struct {
	// CacheSalt isolates tenants. nil and "" give the same seed in every format.
	CacheSalt *string
	// LoRATaskID is the request's LoRA adapter. nil (no adapter) differs from 0.
	LoRATaskID *int64
	// Multimodal holds one digest per multimodal item, in prompt order (see MultimodalDigest).
	Multimodal [][MultimodalDigestSize]byte
}

func (s Scope) salt() string {
	if s.CacheSalt == nil {
		return ""
	}
	return *s.CacheSalt
}

// MultimodalDigest packs a multimodal item's hash, as the runtime carries it (eight int32
// chunks), into its 32-byte scope digest: each chunk as 4 bytes, big-endian, two's complement.
// This is the byte order of TensorRT-LLM's KV cache manager, not the little-endian order used
// for tokens.
func MultimodalDigest(chunks [8]int32) [MultimodalDigestSize]byte {
	var d [MultimodalDigestSize]byte
	for i, c := range chunks {
		binary.BigEndian.PutUint32(d[4*i:], uint32(c))
	}
	return d
}

// ParseMultimodal reads one multimodal item's digest, either as eight comma-separated int32
// chunks ("1,2,3,4,5,6,7,-8", spaces allowed) or as 64 hex characters (the digest bytes).
func ParseMultimodal(s string) ([MultimodalDigestSize]byte, error) {
	var d [MultimodalDigestSize]byte
	t := strings.TrimSpace(s)
	if !strings.Contains(t, ",") {
		// 64 characters of [0-9a-f] are always hex, even when every one is a decimal digit.
		if len(t) == 2*MultimodalDigestSize && isHex(t) {
			_, err := hex.Decode(d[:], []byte(t))
			return d, err
		}
		if _, err := strconv.ParseInt(t, 10, 64); err == nil {
			return d, fmt.Errorf("multimodal digest %q: want 8 comma-separated int32 chunks or %d hex characters, got 1 chunk", s, 2*MultimodalDigestSize)
		}
		if len(t) != 2*MultimodalDigestSize {
			return d, fmt.Errorf("multimodal digest %q: want %d hex characters or 8 comma-separated int32 chunks, got %d characters", s, 2*MultimodalDigestSize, len(t))
		}
		if _, err := hex.Decode(d[:], []byte(t)); err != nil {
			return d, fmt.Errorf("multimodal digest %q: bad hex: %w", s, err)
		}
		return d, nil
	}
	fields := strings.Split(t, ",")
	if len(fields) != 8 {
		return d, fmt.Errorf("multimodal digest %q: want 8 comma-separated int32 chunks, got %d", s, len(fields))
	}
	var chunks [8]int32
	for i, f := range fields {
		f = strings.TrimSpace(f)
		v, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return d, fmt.Errorf("multimodal digest %q: chunk %d: %s is outside int32", s, i, f)
			}
			return d, fmt.Errorf("multimodal digest %q: chunk %d: %q is not an integer", s, i, f)
		}
		chunks[i] = int32(v)
	}
	return MultimodalDigest(chunks), nil
}

// Bypassed reports whether a request must get no keys at all: it has multimodal content
// (positions or lengths) but the scope carries no multimodal digest, so its KV depends on
// inputs the seed cannot see. TensorRT-LLM neither looks such a request up nor saves it.
func Bypassed(hasMultimodalPositions bool, s Scope) bool {
	return hasMultimodalPositions && len(s.Multimodal) == 0
}

// Domain strings of the seeds. They are part of the key derivation: changing any of them
// changes every key.
const (
	lookaheadDomain = "prompt-lookahead"
	v1SaltDomain    = "salt"
	v2Domain        = "mooncake-kv-v2"
)

// appendFramed appends p with its u32 little-endian length, the framing of the main-line seed.
func appendFramed(b, p []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p)))
	return append(b, p...)
}

// SeedPreimage returns the bytes digested into the scope seed of format f before any
// prompt-lookahead re-seed (ChainRules.SeedPreimage); an unknown format gets the default's. It
// does not check that f can express s; ChainConfig.Validate does.
func SeedPreimage(f Format, s Scope) []byte {
	r, ok := chainRules(f)
	if !ok {
		r = DefaultScheme().Chain
	}
	return r.SeedPreimage(s)
}

// seedPreimageV1 is the oldest branch's seed preimage: "salt" ‖ salt.
func seedPreimageV1(s Scope) []byte { return append([]byte(v1SaltDomain), s.salt()...) }

// seedPreimageV2 is the lookahead branch's: "mooncake-kv-v2" ‖ "salt" ‖ salt.
func seedPreimageV2(s Scope) []byte {
	b := append([]byte(v2Domain), v1SaltDomain...)
	return append(b, s.salt()...)
}

// seedPreimageFramed is the main line's: framed(salt, lora, mm_1, …, mm_n).
func seedPreimageFramed(s Scope) []byte {
	salt := s.salt()
	b := make([]byte, 0, 4+len(salt)+12+len(s.Multimodal)*(4+MultimodalDigestSize))
	b = appendFramed(b, []byte(salt))
	var lora []byte
	if s.LoRATaskID != nil {
		lora = binary.LittleEndian.AppendUint64(nil, uint64(*s.LoRATaskID))
	}
	b = appendFramed(b, lora)
	for i := range s.Multimodal {
		b = appendFramed(b, s.Multimodal[i][:])
	}
	return b
}

// seedOf derives the chain seed: the digest of the seed preimage, re-digested with the prompt
// lookahead when it is positive.
func seedOf(h hash.Hash, sum []byte, r *ChainRules, s Scope, lookahead int) Hash {
	var seed Hash
	h.Reset()
	h.Write(r.SeedPreimage(s))
	copy(seed[:], h.Sum(sum[:0]))
	if lookahead > 0 {
		h.Reset()
		h.Write(seed[:])
		h.Write([]byte(lookaheadDomain))
		var l [8]byte
		binary.LittleEndian.PutUint64(l[:], uint64(lookahead))
		h.Write(l[:])
		copy(seed[:], h.Sum(sum[:0]))
	}
	return seed
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') && (c < 'A' || c > 'F') {
			return false
		}
	}
	return true
}
