#include "textflag.h"

// func accumBlocksAVX2(a *xxh3Acc, p *byte, blocks int)
//
// For each 1024-byte block at p: sixteen 64-byte stripes, stripe s keyed with the secret from
// byte 8s, each adding to lane i the 32x32-bit product of the keyed word's halves and to lane
// i^1 the word itself; then the scramble with the secret's last 64 bytes. Lanes 0-3 live in
// Y0, lanes 4-7 in Y1. The words are summed unswapped in Y8 and Y9 and swapped once a block:
// the lanes only add between scrambles, so the order of the additions does not change them.
TEXT ·accumBlocksAVX2(SB), NOSPLIT, $0-24
	MOVQ a+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ blocks+16(FP), CX
	LEAQ ·xxh3Secret(SB), DX
	VMOVDQU (AX), Y0
	VMOVDQU 32(AX), Y1
	MOVQ $0x9E3779B1, R8
	MOVQ R8, X14
	VPBROADCASTQ X14, Y14
	TESTQ CX, CX
	JZ done

block:
	XORQ R9, R9
	VPXOR Y8, Y8, Y8
	VPXOR Y9, Y9, Y9

stripe:
	VMOVDQU (SI), Y2
	VMOVDQU 32(SI), Y3
	VPXOR (DX)(R9*1), Y2, Y4
	VPXOR 32(DX)(R9*1), Y3, Y5
	VPADDQ Y2, Y8, Y8
	VPADDQ Y3, Y9, Y9
	VPSRLQ $32, Y4, Y6
	VPSRLQ $32, Y5, Y7
	VPMULUDQ Y6, Y4, Y4
	VPMULUDQ Y7, Y5, Y5
	VPADDQ Y4, Y0, Y0
	VPADDQ Y5, Y1, Y1
	ADDQ $64, SI
	ADDQ $8, R9
	CMPQ R9, $128
	JB stripe

	// the block's words, each to the lane beside its own
	VPSHUFD $0x4e, Y8, Y8
	VPSHUFD $0x4e, Y9, Y9
	VPADDQ Y8, Y0, Y0
	VPADDQ Y9, Y1, Y1

	// scramble: x ^= x >> 47; x ^= secret[128+8i]; x *= PRIME32_1 (mod 2^64)
	VPSRLQ $47, Y0, Y2
	VPSRLQ $47, Y1, Y3
	VPXOR Y2, Y0, Y0
	VPXOR Y3, Y1, Y1
	VPXOR 128(DX), Y0, Y0
	VPXOR 160(DX), Y1, Y1
	VPSRLQ $32, Y0, Y2
	VPSRLQ $32, Y1, Y3
	VPMULUDQ Y14, Y0, Y0
	VPMULUDQ Y14, Y1, Y1
	VPMULUDQ Y14, Y2, Y2
	VPMULUDQ Y14, Y3, Y3
	VPSLLQ $32, Y2, Y2
	VPSLLQ $32, Y3, Y3
	VPADDQ Y2, Y0, Y0
	VPADDQ Y3, Y1, Y1

	DECQ CX
	JNZ block

done:
	VMOVDQU Y0, (AX)
	VMOVDQU Y1, 32(AX)
	VZEROUPPER
	RET

// func accumBlocksAVX512(a *xxh3Acc, p *byte, blocks int)
//
// accumBlocksAVX2 with the eight lanes in Z0 and the block's words summed in Z8.
TEXT ·accumBlocksAVX512(SB), NOSPLIT, $0-24
	MOVQ a+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ blocks+16(FP), CX
	LEAQ ·xxh3Secret(SB), DX
	VMOVDQU64 (AX), Z0
	MOVQ $0x9E3779B1, R8
	VPBROADCASTQ R8, Z14
	TESTQ CX, CX
	JZ done512

block512:
	XORQ R9, R9
	VPXORQ Z8, Z8, Z8

stripe512:
	VMOVDQU64 (SI), Z2
	VPXORQ (DX)(R9*1), Z2, Z4
	VPADDQ Z2, Z8, Z8
	VPSRLQ $32, Z4, Z6
	VPMULUDQ Z6, Z4, Z4
	VPADDQ Z4, Z0, Z0
	VMOVDQU64 64(SI), Z3
	VPXORQ 8(DX)(R9*1), Z3, Z5
	VPADDQ Z3, Z8, Z8
	VPSRLQ $32, Z5, Z7
	VPMULUDQ Z7, Z5, Z5
	VPADDQ Z5, Z0, Z0
	ADDQ $128, SI
	ADDQ $16, R9
	CMPQ R9, $128
	JB stripe512

	VPSHUFD $0x4e, Z8, Z8
	VPADDQ Z8, Z0, Z0

	VPSRLQ $47, Z0, Z2
	VPXORQ Z2, Z0, Z0
	VPXORQ 128(DX), Z0, Z0
	VPSRLQ $32, Z0, Z2
	VPMULUDQ Z14, Z0, Z0
	VPMULUDQ Z14, Z2, Z2
	VPSLLQ $32, Z2, Z2
	VPADDQ Z2, Z0, Z0

	DECQ CX
	JNZ block512

done512:
	VMOVDQU64 Z0, (AX)
	VZEROUPPER
	RET
