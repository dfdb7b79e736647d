package mooncake

import "encoding/binary"

// Mooncake's object checksum (object_checksum in PutEnd's ObjectMeta and GetReplicaList's
// response) is CRC-64/ECMA-182 as Mooncake's mooncake-common defines it: polynomial
// 0x42F0E1EBA9EA3693, bits taken most significant first (not reflected), register starting
// at 0, no final XOR. Check value: "123456789" gives 0x6C40DF5F0B497347. (Go's hash/crc64 ECMA
// table is the reflected variant with inverted start and end, CRC-64/XZ: a different value.)
const crc64Poly = 0x42F0E1EBA9EA3693

// crc64Tables[k][b] is the CRC of byte b followed by k zero bytes, for eight bytes a step.
var crc64Tables = func() (t [8][256]uint64) {
	for i := range 256 {
		crc := uint64(i) << 56
		for range 8 {
			if crc&(1<<63) != 0 {
				crc = crc<<1 ^ crc64Poly
			} else {
				crc <<= 1
			}
		}
		t[0][i] = crc
	}
	for k := 1; k < 8; k++ {
		for i := range 256 {
			prev := t[k-1][i]
			t[k][i] = prev<<8 ^ t[0][prev>>56]
		}
	}
	return t
}()

// ObjectChecksum is Mooncake's checksum of an object's bytes.
func ObjectChecksum(p []byte) uint64 { return crc64Update(0, p) }

// crc64Update continues crc over p.
func crc64Update(crc uint64, p []byte) uint64 {
	t := &crc64Tables
	for len(p) >= 8 {
		crc ^= binary.BigEndian.Uint64(p)
		crc = t[7][crc>>56] ^ t[6][crc>>48&0xff] ^ t[5][crc>>40&0xff] ^ t[4][crc>>32&0xff] ^
			t[3][crc>>24&0xff] ^ t[2][crc>>16&0xff] ^ t[1][crc>>8&0xff] ^ t[0][crc&0xff]
		p = p[8:]
	}
	for _, b := range p {
		crc = t[0][byte(crc>>56)^b] ^ crc<<8
	}
	return crc
}
