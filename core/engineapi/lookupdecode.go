package engineapi

import (
	"unicode/utf8"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// decodeLookup decodes a LookupRequest the way proto.Unmarshal does, with one difference: the
// message is copied once, out of its HTTP/2 frames, into a new buffer it then owns, placed so that
// tokens_packed starts 8-byte aligned, and tokens_packed is that buffer's slice rather than a
// second copy. RequestTokens then uses it in place as the []int64 prompt. Anything outside the
// fields it knows (an unknown field, a field with another wire type, the request given twice,
// invalid UTF-8 or a bad varint) goes to proto.Unmarshal, which decides and reports.
func decodeLookup(data mem.BufferSlice, m *enginepb.LookupRequest) error {
	n := data.Len()
	shift := 0
	// The fields before tokens_packed (engine name, request id, salt) fit in the first bytes
	// of any sensible request; their length decides the alignment.
	var head [headBytes]byte
	h := head[:0]
	for _, buf := range data {
		if len(h) == len(head) {
			break
		}
		d := buf.ReadOnlyData()
		h = append(h, d[:min(len(d), len(head)-len(h))]...)
	}
	if off, ok := packedOffset(h); ok {
		shift = (TokenBytes - off%TokenBytes) % TokenBytes
	}
	raw := make([]byte, n+shift)
	buf := raw[shift:]
	data.CopyTo(buf)
	if decodeLookupFast(buf, m) {
		return nil
	}
	return proto.Unmarshal(buf, m)
}

// headBytes is how much of a LookupRequest decodeLookup reads to find where tokens_packed starts.
const headBytes = 512

// packedOffset finds where tokens_packed's bytes start in an encoded LookupRequest whose first
// bytes are head, when the fields before them all lie in head.
func packedOffset(head []byte) (int, bool) {
	b, pos := head, 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b, pos = b[n:], pos+n
		if num == 2 && typ == protowire.BytesType {
			// The request: its length, then its fields.
			_, n = protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, false
			}
			at, ok := packedInRequest(b[n:])
			if !ok {
				return 0, false
			}
			return pos + n + at, true
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, false
		}
		b, pos = b[n:], pos+n
	}
	return 0, false
}

// packedInRequest finds where tokens_packed's bytes start in b, the fields of an encoded
// Request.
func packedInRequest(b []byte) (int, bool) {
	pos := 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b, pos = b[n:], pos+n
		if num == 9 && typ == protowire.BytesType {
			_, n = protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, false
			}
			return pos + n, true
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, false
		}
		b, pos = b[n:], pos+n
	}
	return 0, false
}

// decodeLookupFast decodes b into m, which it resets first, and reports whether it could; b
// becomes m's (tokens_packed and multimodal_digests share it).
func decodeLookupFast(b []byte, m *enginepb.LookupRequest) bool {
	m.Reset()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !utf8.Valid(v) {
				return false
			}
			m.Engine, b = string(v), b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || m.Request != nil {
				return false
			}
			r := &enginepb.Request{}
			if !decodeRequestFast(v, r) {
				return false
			}
			m.Request, b = r, b[n:]
		case num == 3 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			m.NumComputedTokens, b = int32(v), b[n:]
		default:
			return false
		}
	}
	return true
}

func decodeRequestFast(b []byte, r *enginepb.Request) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if typ == protowire.VarintType {
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			switch num {
			case 2:
				r.Tokens = append(r.Tokens, int64(v))
			case 4:
				id := int64(v)
				r.LoraTaskId = &id
			case 6:
				r.HasMultimodal = v != 0
			case 7:
				r.Dummy = v != 0
			case 8:
				r.ContextOnly = v != 0
			default:
				return false
			}
			continue
		}
		if typ != protowire.BytesType {
			return false
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch num {
		case 1:
			if !utf8.Valid(v) {
				return false
			}
			r.Id = string(v)
		case 2:
			for len(v) > 0 {
				t, n := protowire.ConsumeVarint(v)
				if n < 0 {
					return false
				}
				r.Tokens, v = append(r.Tokens, int64(t)), v[n:]
			}
		case 3:
			if !utf8.Valid(v) {
				return false
			}
			s := string(v)
			r.CacheSalt = &s
		case 5:
			r.MultimodalDigests = append(r.MultimodalDigests, v[:len(v):len(v)])
		case 9:
			r.TokensPacked = v[:len(v):len(v)]
		case 10:
			if r.TokensArena != nil || !decodeArenaRangeFast(v, r) {
				// A repeated message field merges; leave that rare case to proto.Unmarshal.
				return false
			}
		default:
			return false
		}
	}
	return true
}

// decodeArenaRangeFast decodes an ArenaRange into r.TokensArena.
func decodeArenaRangeFast(b []byte, r *enginepb.Request) bool {
	a := &enginepb.ArenaRange{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.VarintType || (num != 1 && num != 2) {
			return false
		}
		b = b[n:]
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num == 1 {
			a.Offset = v
		} else {
			a.Count = v
		}
	}
	r.TokensArena = a
	return true
}
