//go:build !amd64

package keys

// haveBlockAsm is false where there is no assembly for the lanes: CopyChecksum keeps to the
// xxh3 package's streaming hasher, which has vector code for this CPU.
const haveBlockAsm = false

// accumBlocks adds len(p)/xxh3Block whole blocks of p to the lanes, each followed by its scramble.
func accumBlocks(a *xxh3Acc, p []byte) { a.blocksGeneric(p) }
