package mooncake

// A value's bytes, as Native's get and put move them, are a list of pieces taken in order:
// BatchGet and BatchPut hand each buffer as a list of one (onePiece), BatchGetPieces and
// BatchPutPieces (pool.PieceCopier) the caller's lists, so that a value whose bytes lie apart in
// engine memory is read or written in one Transfer Engine request straight from where it lies.

// onePiece returns bufs as values of one piece each, the lists sharing bufs' memory.
func onePiece(bufs [][]byte) [][][]byte {
	out := make([][][]byte, len(bufs))
	for i := range bufs {
		out[i] = bufs[i : i+1 : i+1]
	}
	return out
}

// piecesLen is the number of bytes the pieces p hold.
func piecesLen(p [][]byte) uint64 {
	var n uint64
	for _, b := range p {
		n += uint64(len(b))
	}
	return n
}

// piecesUpTo returns the first size bytes of the pieces p (which hold at least that many): p
// itself when it holds exactly size, else a list of its own ending inside a piece.
func piecesUpTo(p [][]byte, size uint64) [][]byte {
	if piecesLen(p) == size {
		return p
	}
	out := make([][]byte, 0, len(p))
	for _, b := range p {
		if size == 0 {
			break
		}
		k := min(uint64(len(b)), size)
		out = append(out, b[:k])
		size -= k
	}
	return out
}

// clearPieces zeroes every piece of p.
func clearPieces(p [][]byte) {
	for _, b := range p {
		clear(b)
	}
}

// piecesChecksum is ObjectChecksum of the pieces p taken end to end.
func piecesChecksum(p [][]byte) uint64 {
	var crc uint64
	for _, b := range p {
		crc = crc64Update(crc, b)
	}
	return crc
}
