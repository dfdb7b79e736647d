package mooncaketest

// Pieces cuts b into consecutive pieces of the given sizes, taken in turn until b is used up (a
// size 0 makes an empty piece; the last piece may be shorter): a value laid out as an engine
// lays out K and V apart, or one piece a layer, for tests of reads and writes into pieces.
func Pieces(b []byte, sizes ...int) [][]byte {
	var out [][]byte
	for i := 0; len(b) > 0; i++ {
		n := min(sizes[i%len(sizes)], len(b))
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}
