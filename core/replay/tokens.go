package replay

// prepared is a request's replay shape.
type prepared struct {
	blocks    int // trace blocks
	tokens    int // replay tokens
	tailReal  int // trace tokens of the last block
	tailSynth int // replay tokens of the last block
}

func prepare(format string, r Request, T int) prepared {
	if format != FormatMooncake {
		n := (len(r.Tokens) + T - 1) / T
		return prepared{blocks: n, tokens: len(r.Tokens), tailReal: len(r.Tokens) - (n-1)*T, tailSynth: len(r.Tokens) - (n-1)*T}
	}
	n := len(r.HashIDs)
	tail := r.InputLength - (n-1)*TraceBlockTokens
	synth := T
	if tail < TraceBlockTokens {
		synth = (tail*T + TraceBlockTokens - 1) / TraceBlockTokens
		synth = max(1, min(synth, T-1))
		if T == 1 {
			synth = 1
		}
	}
	return prepared{blocks: n, tokens: (n-1)*T + synth, tailReal: tail, tailSynth: synth}
}

// realTokens converts a replay token count of a request's prefix into trace tokens.
func (pr prepared) realTokens(format string, synth, T int) int64 {
	if format != FormatMooncake {
		return int64(synth)
	}
	if synth >= pr.tokens {
		return int64((pr.blocks-1)*TraceBlockTokens + pr.tailReal)
	}
	full, rem := synth/T, synth%T
	n := full * TraceBlockTokens
	if rem > 0 {
		if full == pr.blocks-1 {
			n += rem * pr.tailReal / pr.tailSynth
		} else {
			n += rem * TraceBlockTokens / T
		}
	}
	return int64(n)
}

// synthToken is token i of the block with Mooncake hash id h.
func synthToken(seed uint64, h int64, i int) int64 {
	x := seed*0x9E3779B97F4A7C15 ^ uint64(h)*0xD1B54A32D192ED03 ^ uint64(i)*0xBF58476D1CE4E5B9
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return int64(x & 0x7fffffff)
}

// appendTokens appends the replay tokens of request q, of shape pr, to dst: a token trace's
// own tokens, or the tokens synthesised for a Mooncake trace's hash ids. A request's reuse
// scope is not in its tokens: the KV cache manager and the connector both key blocks by the
// tokens and the scope (kvcache.Prompt, connector.Request).
func appendTokens(dst []int64, format string, seed uint64, T int, q Request, pr prepared) []int64 {
	if format != FormatMooncake {
		return append(dst, q.Tokens...)
	}
	for b, h := range q.HashIDs {
		n := T
		if b == len(q.HashIDs)-1 {
			n = pr.tailSynth
		}
		for i := range n {
			dst = append(dst, synthToken(seed, h, i))
		}
	}
	return dst
}

// tokens returns q's replay tokens in the replay's reused buffer.
func (o *offline) tokens(q Request, pr prepared) []int64 {
	o.buf64 = appendTokens(o.buf64[:0], o.t.Format, o.p.Seed, o.p.TokensPerBlock, q, pr)
	return o.buf64
}
