package engineapi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// TokenBytes is the size of one token in Request.tokens_packed: a little-endian int64.
const TokenBytes = 8

// MaxRequestTokens bounds the prompt an engine may send in Request.tokens_packed: 4,194,304
// tokens (32 MiB packed), half of what MaxMessageBytes lets through, and far above any context
// window an engine runs today.
const MaxRequestTokens = 4 << 20

// ErrPackedTokens is returned (wrapped, with the length found) for a tokens_packed field whose
// length is not a multiple of TokenBytes or exceeds MaxRequestTokens tokens, and for a request
// that sets both token fields.
var ErrPackedTokens = errors.New("bad packed tokens")

// littleEndian is whether this machine stores an int64 in the wire's byte order, so packing
// and unpacking are one memory copy.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// PackTokens appends tokens to dst in the tokens_packed encoding and returns the extended
// slice. Passing a reused dst[:0] avoids an allocation per request.
func PackTokens(dst []byte, tokens []int64) []byte {
	n := len(tokens) * TokenBytes
	start := len(dst)
	dst = growBytes(dst, n)
	out := dst[start:]
	if littleEndian && n > 0 {
		copy(out, unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), n))
		return dst
	}
	for i, t := range tokens {
		binary.LittleEndian.PutUint64(out[i*TokenBytes:], uint64(t))
	}
	return dst
}

func growBytes(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n)
	copy(nb, b)
	return nb
}

// TokensView returns tokens in the tokens_packed encoding for sending. On a little-endian
// machine it is a view of tokens' own memory, so nothing is copied: tokens must not change
// while the request holding the view is in use. Elsewhere it is PackTokens(nil, tokens).
func TokensView(tokens []int64) []byte {
	if len(tokens) == 0 {
		return nil
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), len(tokens)*TokenBytes)
	}
	return PackTokens(nil, tokens)
}

// UnpackTokens decodes packed (the tokens_packed encoding) into dst, reusing dst's backing
// array when it is large enough, and returns the tokens. It fails with ErrPackedTokens when
// len(packed) is not a multiple of TokenBytes or holds more than MaxRequestTokens tokens; it
// never reads past packed and keeps no reference to it.
func UnpackTokens(dst []int64, packed []byte) ([]int64, error) {
	if err := checkPacked(len(packed)); err != nil {
		return dst[:0], err
	}
	n := len(packed) / TokenBytes
	if cap(dst) < n {
		dst = make([]int64, n)
	}
	dst = dst[:n]
	if n == 0 {
		return dst, nil
	}
	if littleEndian {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), len(packed)), packed)
		return dst, nil
	}
	for i := range dst {
		dst[i] = int64(binary.LittleEndian.Uint64(packed[i*TokenBytes:]))
	}
	return dst, nil
}

// checkPacked reports whether n bytes are a valid length for tokens_packed.
func checkPacked(n int) error {
	if n%TokenBytes != 0 {
		return fmt.Errorf("%w: tokens_packed has %d bytes, not a multiple of %d", ErrPackedTokens, n, TokenBytes)
	}
	if n/TokenBytes > MaxRequestTokens {
		return fmt.Errorf("%w: tokens_packed holds %d tokens, more than the %d allowed", ErrPackedTokens, n/TokenBytes, MaxRequestTokens)
	}
	return nil
}

// RequestTokens returns r's prompt from whichever token field it set: tokens_packed or the
// repeated tokens field. The result may share memory with r (on a little-endian machine an
// aligned tokens_packed is used in place), so the caller must not modify it while r is in use
// and must not modify r's fields while the result is. A request that sets both
// is refused with ErrPackedTokens, since the two could disagree, and so is one that names its
// prompt in tokens_arena: the daemon resolves that against the engine's arena first.
func RequestTokens(r *enginepb.Request) ([]int64, error) {
	if r.GetTokensArena() != nil {
		// Only the daemon, which holds the engine's arena, can read the range (ArenaRequestTokens).
		return nil, fmt.Errorf("%w: tokens_arena is set but was not read from a prompt arena", ErrPackedTokens)
	}
	packed := r.GetTokensPacked()
	if len(packed) == 0 {
		return r.GetTokens(), nil
	}
	if len(r.GetTokens()) != 0 {
		return nil, fmt.Errorf("%w: both tokens (%d) and tokens_packed (%d bytes) are set; send one", ErrPackedTokens, len(r.GetTokens()), len(packed))
	}
	if littleEndian && uintptr(unsafe.Pointer(&packed[0]))%unsafe.Alignof(int64(0)) == 0 {
		// Decoded messages own their bytes fields, so an aligned field on a little-endian
		// machine is already the token array: share it rather than copy 8 bytes a token.
		if err := checkPacked(len(packed)); err != nil {
			return nil, err
		}
		return unsafe.Slice((*int64)(unsafe.Pointer(&packed[0])), len(packed)/TokenBytes), nil
	}
	return UnpackTokens(nil, packed)
}

// SetRequestTokens stores tokens in r as tokens_packed (a TokensView: tokens must not change
// while r is in use) and clears the repeated field.
func SetRequestTokens(r *enginepb.Request, tokens []int64) {
	r.Tokens = nil
	r.TokensPacked = TokensView(tokens)
}
