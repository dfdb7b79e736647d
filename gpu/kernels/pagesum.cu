// Page checksums on the GPU: the XXH3-64 digest (seed 0, default secret) of every unit of a
// batch, read where the pages lie in engine memory, so a load can be checked after its copy
// without the host reading the pages a second time. A unit is a page, or a 64 KiB piece of a
// long one (core/keys.ChecksumChunks): always shorter than 128 KiB. The host combines a page's
// units' digests into its checksum.
//
// XXH3-64 of an input longer than 240 bytes keeps eight 64-bit accumulators ("lanes"). Each
// 64-byte stripe adds to every lane; after each 1024-byte block (16 stripes) every lane is
// scrambled. Within a block the additions commute, so the sum a block adds to each lane (its
// "delta") can be computed independently of the blocks before it; only applying deltas and
// scrambles is sequential, and it is per lane. So kvUnitCheck computes a unit's deltas with all
// the threads of a block, then runs the unit's sequential part, one thread per lane, over them,
// adds the last stripes and merges the lanes.
// Algorithm: https://github.com/Cyan4973/xxHash/blob/v0.8.2/doc/xxhash_spec.md
//
// A unit is a list of pieces (device address, offset in the unit, length), in unit order. The
// host only launches this for units longer than 240 bytes whose pieces are multiples of 64 bytes
// and 8-byte aligned, so every stripe lies inside one piece.
//
// Regenerate pagesum.ptx with `make ptx` after changing this file.

typedef unsigned long long u64;
typedef unsigned int u32;

// The secret's 64-bit words the hash reads, taken from the default secret by the host.
struct kvSecret {
	u64 acc[24];  // the word at byte 8k: stripe s, lane i reads k = s + i; scrambles read 16 + i
	u64 last[8];  // the words at byte 121 + 8i: the last stripe
	u64 merge[8]; // the words at byte 11 + 8i: merging the lanes
};

struct kvPage {
	u64 len;   // bytes in the unit
	u32 first; // its first piece
	u32 count; // its number of pieces
	u64 base;  // the address of the unit's piece when it has one (its pieces are not read), else 0
};

struct kvPiece {
	u64 addr; // device address of the piece
	u64 off;  // offset of the piece in the page
	u64 len;  // bytes
};

// The copy kernels run blocks of THREADS threads; kvUnitCheck blocks of UNIT_THREADS, a warp
// computing one 1024-byte block's deltas at a time.
#define THREADS 256
// A unit's pieces are read from shared memory when it has at most this many: every load looks
// its piece up, and global memory would make each lookup a long dependent load.
#define SHARED_PIECES 128
// The most full blocks a unit has: it is shorter than 128 KiB.
#define UNIT_BLOCKS 128
// kvUnitCheck's threads a block: 16 warps, four of a 64 KiB unit's 64 blocks each, so such a
// unit is hashed in one round. The kernel asks for two blocks a multiprocessor (at most 64
// registers a thread), so two units run on each at once. The layout before, a group of 8
// threads a block, one thread a lane, took 13.7 us for the units of 12 MiB of 1 MiB pages where
// this one takes 10.1 (run 97); under Nsight Compute its warps spent a quarter of their samples
// at the barrier before the chain, waiting for the warp that also took the unit's rest, 11 % on
// loads of the secret at a different index in each lane, and 5 % on its piece's descriptor,
// read before any page byte (run 96).
#define UNIT_THREADS 512

// XXH3's initial accumulators, one a lane; read with the lane as index, so a table rather than a
// switch (which compiles to branches the eight lanes of a group take one after another).
__constant__ u64 kvInitAcc[8] = {
	0xC2B2AE3DULL, 0x9E3779B185EBCA87ULL, 0xC2B2AE3D27D4EB4FULL, 0x165667B19E3779F9ULL,
	0x85EBCA77C2B2AE63ULL, 0x85EBCA77ULL, 0x27D4EB2F165667C5ULL, 0x9E3779B1ULL,
};

__device__ __forceinline__ u64 kvInit(u32 lane) { return kvInitAcc[lane]; }

// kvFind returns the index of the piece holding page offset o.
__device__ __forceinline__ u32 kvFind(const kvPiece *ps, u32 n, u64 o) {
	u32 lo = 0, hi = n;
	while (hi - lo > 1) {
		u32 mid = (lo + hi) / 2;
		if (ps[mid].off <= o) lo = mid; else hi = mid;
	}
	return lo;
}

// kvPair loads the two words at unit offset o, a multiple of 16 (so both lie in one piece):
// from base + o when the unit is one piece at base (in one 16-byte load when base is 16-byte
// aligned), else from the piece holding o.
__device__ __forceinline__ void kvPair(const kvPiece *ps, u32 np, u64 base, bool wide, u64 o, u64 &x0, u64 &x1) {
	u64 a;
	if (base != 0) {
		a = base + o;
	} else {
		const u32 k = kvFind(ps, np, o);
		a = ps[k].addr + (o - ps[k].off);
	}
	if (wide) {
		const ulonglong2 v = *(const ulonglong2 *)a;
		x0 = v.x;
		x1 = v.y;
	} else {
		x0 = ((const u64 *)a)[0];
		x1 = ((const u64 *)a)[1];
	}
}

// kvScramble applies one block's delta d to lane's accumulator and scrambles it.
__device__ __forceinline__ u64 kvScramble(u64 acc, u64 d, u64 key) {
	acc += d;
	acc ^= acc >> 47;
	acc ^= key;
	return acc * 0x9E3779B1ULL;
}

// kvChain applies the deltas d[0, blocks) to lane's accumulator acc in block order, scrambling
// after each. The chain is sequential; its loads are not: they are issued KV_DEPTH at a time,
// the next ones while the current ones are applied, so the chain waits on memory about once per
// KV_DEPTH blocks rather than at every block. Delta b is at d[b * stride], read from L2 (__ldcg),
// where other blocks' atomic additions to the deltas are.
#define KV_DEPTH 32
__device__ __forceinline__ u64 kvChain(const u64 *d, u64 stride, u64 blocks, u64 acc, u64 key) {
	u64 cur[KV_DEPTH];
#pragma unroll
	for (u32 k = 0; k < KV_DEPTH; k++) cur[k] = k < blocks ? __ldcg(d + k * stride) : 0;
	for (u64 b = 0; b < blocks; b += KV_DEPTH) {
		u64 nxt[KV_DEPTH];
#pragma unroll
		for (u32 k = 0; k < KV_DEPTH; k++) nxt[k] = b + KV_DEPTH + k < blocks ? __ldcg(d + (b + KV_DEPTH + k) * stride) : 0;
#pragma unroll
		for (u32 k = 0; k < KV_DEPTH; k++) {
			if (b + k < blocks) acc = kvScramble(acc, cur[k], key);
		}
#pragma unroll
		for (u32 k = 0; k < KV_DEPTH; k++) cur[k] = nxt[k];
	}
	return acc;
}
#undef KV_DEPTH

// kvMerge turns a page of len bytes' eight lane accumulators, one in each thread of a group of 8
// (the threads in mask, lane its thread's lane), into the page's digest, which every thread of the
// group returns: lanes 2i and 2i + 1 make one term, the even lanes' terms are summed in the group,
// and the sum is mixed with the length and avalanched. ma and mc are the merge words of lanes
// lane & 6 and (lane & 6) + 1 (the even lanes read them).
__device__ __forceinline__ u64 kvMerge(u64 acc, u64 len, u64 ma, u64 mc, u32 lane, unsigned mask) {
	const u64 odd = __shfl_xor_sync(mask, acc, 1);
	u64 term = 0;
	if ((lane & 1) == 0) {
		u64 a = acc ^ ma;
		u64 c = odd ^ mc;
		term = (a * c) ^ __umul64hi(a, c);
	}
	term += __shfl_xor_sync(mask, term, 2);
	term += __shfl_xor_sync(mask, term, 4);
	u64 h = len * 0x9E3779B185EBCA87ULL + term;
	h ^= h >> 37;
	h *= 0x165667919E3779F9ULL;
	h ^= h >> 32;
	return h;
}

// kvTerm is what a stripe's word v adds to its lane: the pair's word (the lane's neighbour's,
// lane ^ 1) and the product of the halves of v xored with the lane's secret word.
__device__ __forceinline__ u64 kvTerm(u64 v, u64 pair, u64 key) {
	const u64 x = v ^ key;
	return pair + (x & 0xFFFFFFFFULL) * (x >> 32);
}

// kvUnitCheck computes the digest of unit blockIdx.x into out[blockIdx.x], one thread block a
// unit, in two steps.
//
// The deltas: a warp takes one 1024-byte block at a time, as kvCopyCheck's warps take their
// 512-byte spans: thread t loads the 16 bytes at block offsets 16t and 512 + 16t, half of lanes
// 2(t%4) and 2(t%4) + 1 of stripes t/4 and t/4 + 8, so a thread needs the same six secret words
// for every block (held in registers) and a warp's loads are 512 contiguous bytes each. Warp w
// takes blocks w, w + 16, w + 32 and w + 48 (a round; a unit of more than 64 blocks takes two),
// all eight loads in flight at once; the unit's last block is its rest (the stripes of the last,
// partial block but the last one, and the last stripe with the secret at byte 121), taken like
// the others with the stripes past its end left out. The warp then sums its threads' terms per
// lane and block with a butterfly over the threads of the same t%4 that halves the values a
// thread holds at each of its three steps (7 exchanges for 4 blocks' 16 sums), and each thread
// stores one delta into shared memory.
//
// The chain: threads 0-7 apply the deltas and scrambles in block order, one thread a lane, add
// the rest and merge the lanes. A unit of UNIT_BLOCKS full blocks or more (the host never sends
// one) gets the digest 0.
//
// A unit of one piece has its address in its kvPage's base, so no thread waits on its piece's
// descriptor; a unit of several reads them into shared memory first.
extern "C" __global__ void __launch_bounds__(UNIT_THREADS, 2) kvUnitCheck(const kvPage *pages, const kvPiece *pieces, kvSecret sec, u64 *out) {
	__shared__ kvPiece local[SHARED_PIECES];
	__shared__ u64 deltas[UNIT_BLOCKS * 8]; // block b's delta of lane i at 8b + i; the rest at 8 * full + i
	// The secret's words and the initial accumulators, which each thread reads at indices of its
	// own: a parameter read at an index that differs between a warp's threads is a constant-cache
	// load the warp makes once for each index (under Nsight Compute, 18 % of the warps' samples
	// where every thread read its six words so; run 98). Thread 0 copies them here with fixed
	// indices, which read the parameter for nothing.
	__shared__ u64 words[48]; // acc at 0, last at 24, merge at 32, the initial accumulators at 40
	if (threadIdx.x == 0) {
#pragma unroll
		for (u32 k = 0; k < 24; k++) words[k] = sec.acc[k];
#pragma unroll
		for (u32 k = 0; k < 8; k++) {
			words[24 + k] = sec.last[k];
			words[32 + k] = sec.merge[k];
			words[40 + k] = kvInitAcc[k];
		}
	}
	const kvPage pg = pages[blockIdx.x];
	const u64 len = pg.len;
	const u64 full = (len - 1) / 1024; // the full blocks; block `full` is the rest
	if (full >= UNIT_BLOCKS) {
		if (threadIdx.x == 0) out[blockIdx.x] = 0;
		return;
	}
	const u64 base = pg.count == 1 ? pg.base : 0;
	const bool wide = base != 0 && (base & 15) == 0;
	const kvPiece *ps = pieces + pg.first;
	if (base == 0) {
		// The pieces' descriptors in shared memory, before any load looks its piece up; the
		// barrier also makes the words visible. (The same branch for every thread of the block.)
		if (pg.count <= SHARED_PIECES) {
			for (u32 i = threadIdx.x; i < pg.count; i += UNIT_THREADS) local[i] = ps[i];
			ps = local;
		}
		__syncthreads();
	}
	const u32 t = threadIdx.x & 31, w = threadIdx.x >> 5;
	const u32 j = 2 * (t & 3), s0 = t >> 2; // lanes j, j + 1 of stripes s0 and s0 + 8
	u64 ka0 = 0, ka1 = 0, kb0 = 0, kb1 = 0, kl0 = 0, kl1 = 0;
	const u64 n = ((len - 1) - full * 1024) / 64; // the rest's stripes before the last
	for (u64 r = 0; 64 * r <= full; r++) {
		u64 x[4][2][2]; // block q, stripe s0 + 8h, word
#pragma unroll
		for (u32 q = 0; q < 4; q++) {
			const u64 b = 64 * r + 16 * q + w;
#pragma unroll
			for (u32 h = 0; h < 2; h++) {
				x[q][h][0] = x[q][h][1] = 0;
				if (b < full || (b == full && s0 + 8 * h <= n)) {
					kvPair(ps, pg.count, base, wide, b * 1024 + 512 * h + 16 * t, x[q][h][0], x[q][h][1]);
				}
			}
		}
		if (r == 0) {
			// The words, once the first round's loads are in flight (a unit of one piece has
			// not waited for them yet).
			if (base != 0) __syncthreads();
			ka0 = words[s0 + j];
			ka1 = words[s0 + j + 1];
			kb0 = words[s0 + 8 + j];
			kb1 = words[s0 + 8 + j + 1];
			kl0 = words[24 + j];
			kl1 = words[24 + j + 1];
		}
		u64 v[8]; // lane j, then j + 1, of block q at 2q, 2q + 1
#pragma unroll
		for (u32 q = 0; q < 4; q++) {
			const u64 b = 64 * r + 16 * q + w;
			u64 e = 0, o = 0;
#pragma unroll
			for (u32 h = 0; h < 2; h++) {
				const u32 s = s0 + 8 * h;
				const bool inBlock = b < full || (b == full && s < n);
				const bool last = b == full && s == n;
				if (inBlock || last) {
					const u64 k0 = last ? kl0 : (h ? kb0 : ka0), k1 = last ? kl1 : (h ? kb1 : ka1);
					e += kvTerm(x[q][h][0], x[q][h][1], k0);
					o += kvTerm(x[q][h][1], x[q][h][0], k1);
				}
			}
			v[2 * q] = e;
			v[2 * q + 1] = o;
		}
		// The butterfly: at each step a thread keeps the half of its values that its bit of t
		// selects, and adds its partner's of that half; the sum it ends with is value
		// 4 * bit 4 + 2 * bit 3 + bit 2 of t, over the eight threads with its t%4.
		const bool b4 = t & 16, b3 = t & 8, b2 = t & 4;
		u64 y[4], z[2];
#pragma unroll
		for (u32 k = 0; k < 4; k++) {
			y[k] = (b4 ? v[4 + k] : v[k]) + __shfl_xor_sync(0xFFFFFFFFu, b4 ? v[k] : v[4 + k], 16);
		}
#pragma unroll
		for (u32 k = 0; k < 2; k++) {
			z[k] = (b3 ? y[2 + k] : y[k]) + __shfl_xor_sync(0xFFFFFFFFu, b3 ? y[k] : y[2 + k], 8);
		}
		const u64 d = (b2 ? z[1] : z[0]) + __shfl_xor_sync(0xFFFFFFFFu, b2 ? z[0] : z[1], 4);
		const u64 b = 64 * r + 16 * ((t >> 3) & 3) + w;
		if (b <= full) deltas[8 * b + j + (b2 ? 1 : 0)] = d;
	}
	__syncthreads();
	if (threadIdx.x >= 8) return;
	const u32 lane = threadIdx.x;
	const u64 key = words[16 + lane];
	u64 acc = words[40 + lane];
#pragma unroll 8
	for (u64 b = 0; b < full; b++) acc = kvScramble(acc, deltas[8 * b + lane], key);
	acc += deltas[8 * full + lane];
	const u64 h = kvMerge(acc, len, words[32 + (lane & 6)], words[33 + (lane & 6)], lane, 0xFFu);
	if (lane == 0) out[blockIdx.x] = h;
}

// Copies by the GPU's own threads: a batch of (source, destination, length) copies, one thread
// block per copy of at most 64 KiB, reading the source through the device's mapping of
// registered host memory. Many small copies (the regions of pages) cost one launch instead of
// one copy-engine command each. Sources and destinations 16-byte aligned move 16 bytes a load;
// any other copy moves byte by byte.
struct kvCopy {
	u64 src;
	u64 dst;
	u64 len;
};

extern "C" __global__ void __launch_bounds__(THREADS) kvCopyPieces(const kvCopy *copies) {
	const kvCopy c = copies[blockIdx.x];
	if (((c.src | c.dst | c.len) & 15) == 0) {
		const uint4 *s = (const uint4 *)c.src;
		uint4 *d = (uint4 *)c.dst;
		u64 n = c.len / 16;
		u64 i = threadIdx.x;
		// Four loads in flight per thread.
		for (; i + 3 * THREADS < n; i += 4 * THREADS) {
			uint4 a = s[i], b = s[i + THREADS], e = s[i + 2 * THREADS], f = s[i + 3 * THREADS];
			d[i] = a;
			d[i + THREADS] = b;
			d[i + 2 * THREADS] = e;
			d[i + 3 * THREADS] = f;
		}
		for (; i < n; i += THREADS) d[i] = s[i];
		return;
	}
	const unsigned char *s = (const unsigned char *)c.src;
	unsigned char *d = (unsigned char *)c.dst;
	for (u64 i = threadIdx.x; i < c.len; i += THREADS) d[i] = s[i];
}

// Checks taken on the way: kvCopyCheck copies like kvCopyPieces (one thread block per copy of at
// most 64 KiB, 16 bytes a load) and adds every term the bytes it moves contribute to their page's
// digest, from the registers it copied, so a checked batch copied by the GPU's threads is never
// read a second time; the block that finishes a page's last copy then scrambles and merges the
// page's sums into its digest. Every copy lies in one page at a page offset that is a multiple of
// 64, and its source, destination and length are multiples of 16; a page's length is a multiple
// of 64.
//
// A page's sums, per lane, are blocks + 2 words: one per full 1024-byte block (its delta, as
// kvUnitCheck computes it), one for the stripes of the last, partial block but its last stripe
// (read with the same secret words as a full block's), and one for the page's last stripe (read
// with the secret at byte 121). The eight lanes' sums of one of these are adjacent (sum k of lane
// i at 8k + i), so the threads that add or read them touch one 64-byte segment.
//
// Why the sums work out: a warp copies 32 consecutive 16-byte words, 512 bytes starting on a
// stripe, so thread t holds half of lanes 2(t%4) and 2(t%4)+1 of stripe t/4 of that span; the
// span lies in at most two 1024-byte blocks and may hold the page's last stripe. The warp sums its
// threads' terms per lane and per word they go to (a butterfly over the threads with the same
// t%4), and four threads add the sums with atomics (addition is mod 2^64 and commutes). Each
// block then counts its copy done for its page (after a fence, so its additions come first); the
// block that counts the page's last copy finishes the page, as the threadFenceReduction pattern
// does. The sums and counts must be zero before a batch's first copy; the finishing blocks leave
// them so.
struct kvCheckedCopy {
	u64 src;
	u64 dst;
	u64 len;
	u64 off;        // offset of the copy in its page
	u64 base;       // index of the page's first sum, in groups of 8 (one a lane)
	u64 pageLen;    // the page's length
	u32 page;       // the page's index in the batch (its count and digest)
	u32 pageCopies; // how many copies the page has
};

// kvWarpSum returns the sum of v over the threads of the warp with the same t % 4.
__device__ __forceinline__ u64 kvWarpSum(u64 v) {
	v += __shfl_xor_sync(0xFFFFFFFFu, v, 4);
	v += __shfl_xor_sync(0xFFFFFFFFu, v, 8);
	v += __shfl_xor_sync(0xFFFFFFFFu, v, 16);
	return v;
}

// kvFinishSums is run by threads 0-7 of a warp, one a lane, for a page of len bytes whose sums
// are at sums: the scrambles over the full blocks' deltas, the partial block's and the last
// stripe's sums, the merge. It clears the sums and returns the digest.
__device__ u64 kvFinishSums(u64 *sums, u64 len, const kvSecret &sec, u32 lane) {
	const u64 blocks = (len - 1) / 1024;
	u64 *d = sums + lane; // sum k at d[8k]
	const u64 rest = __ldcg(d + 8 * blocks) + __ldcg(d + 8 * (blocks + 1)); // before the chain
	const u64 acc = kvChain(d, 8, blocks, kvInit(lane), sec.acc[16 + lane]) + rest;
	for (u64 b = 0; b < blocks + 2; b++) d[8 * b] = 0;
	return kvMerge(acc, len, sec.merge[lane & 6], sec.merge[(lane & 6) + 1], lane, 0xFFu);
}

// kvCopyCheck copies and checks a batch: copies are its records, sums the pages' sums, counts one
// 32-bit count of finished copies per page, out one digest per page (host memory the device maps).
extern "C" __global__ void __launch_bounds__(THREADS) kvCopyCheck(const kvCheckedCopy *copies, kvSecret sec, u64 *sums, u32 *counts, u64 *out) {
	const kvCheckedCopy c = copies[blockIdx.x];
	const uint4 *s = (const uint4 *)c.src;
	uint4 *d = (uint4 *)c.dst;
	const u64 n = c.len / 16;
	const u32 t = threadIdx.x & 31;
	const u32 j = t & 3;
	// Every word this thread copies is at the same stripe of its block (words 4 * THREADS apart
	// are 256 stripes apart) and the same place in it, so it needs the same secret words throughout.
	const u32 stripe = (u32)((c.off / 64 + threadIdx.x / 4) & 15);
	const u64 key0 = sec.acc[stripe + 2 * j], key1 = sec.acc[stripe + 2 * j + 1];
	const u64 last0 = sec.last[2 * j], last1 = sec.last[2 * j + 1];
	const u64 blocks = (c.pageLen - 1) / 1024;
	const u64 final = c.pageLen - 64; // the page's last stripe
	u64 *const page = sums + c.base * 8;
	u64 *lane0 = page + 2 * j; // sum k at lane0[8k]
	u64 *lane1 = lane0 + 1;
	for (u64 u0 = 0; u0 < n; u0 += 4 * THREADS) {
		uint4 v[4];
		// Four loads in flight per thread.
#pragma unroll
		for (u32 q = 0; q < 4; q++) {
			const u64 u = u0 + q * THREADS + threadIdx.x;
			v[q] = u < n ? s[u] : make_uint4(0, 0, 0, 0);
		}
#pragma unroll
		for (u32 q = 0; q < 4; q++) {
			const u64 u = u0 + q * THREADS + threadIdx.x;
			if (u < n) d[u] = v[q];
		}
#pragma unroll
		for (u32 q = 0; q < 4; q++) {
			const u64 w = u0 + q * THREADS + (threadIdx.x & ~31u); // the warp's first word
			if (w >= n) break; // the whole warp: the copy ends before its span
			const u64 u = w + t;
			const u64 span = c.off + 16 * w; // page offset of the span
			const u64 o = c.off + 16 * u;    // and of this thread's word
			const u64 b0 = span / 1024;
			const bool two = span % 1024 > 512, hasFinal = span <= final && final < span + 512;
			u64 t0 = 0, t1 = 0;
			bool isFinal = false;
			if (u < n) {
				const u64 w0 = (u64)v[q].x | (u64)v[q].y << 32, w1 = (u64)v[q].z | (u64)v[q].w << 32;
				isFinal = (o & ~63ULL) == final;
				t0 = kvTerm(w0, w1, isFinal ? last0 : key0);
				t1 = kvTerm(w1, w0, isFinal ? last1 : key1);
			}
			// To the first block of the span, the second, the last stripe.
			const bool first = !isFinal && o / 1024 == b0;
			const u64 a0 = kvWarpSum(first ? t0 : 0), a1 = kvWarpSum(first ? t1 : 0);
			u64 e0 = 0, e1 = 0, f0 = 0, f1 = 0;
			if (two) {
				const bool second = !isFinal && !first;
				e0 = kvWarpSum(second ? t0 : 0);
				e1 = kvWarpSum(second ? t1 : 0);
			}
			if (hasFinal) {
				f0 = kvWarpSum(isFinal ? t0 : 0);
				f1 = kvWarpSum(isFinal ? t1 : 0);
			}
			if (t < 4) {
				// Sum b <= blocks: a full block's delta, or blocks: the partial block's stripes.
				atomicAdd((unsigned long long *)&lane0[8 * b0], (unsigned long long)a0);
				atomicAdd((unsigned long long *)&lane1[8 * b0], (unsigned long long)a1);
				if (two && b0 + 1 <= blocks) {
					atomicAdd((unsigned long long *)&lane0[8 * (b0 + 1)], (unsigned long long)e0);
					atomicAdd((unsigned long long *)&lane1[8 * (b0 + 1)], (unsigned long long)e1);
				}
				if (hasFinal) {
					atomicAdd((unsigned long long *)&lane0[8 * (blocks + 1)], (unsigned long long)f0);
					atomicAdd((unsigned long long *)&lane1[8 * (blocks + 1)], (unsigned long long)f1);
				}
			}
		}
	}
	// This copy is done: count it, and finish the page if it was the page's last.
	__shared__ bool lastCopy;
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) lastCopy = atomicAdd(&counts[c.page], 1u) == c.pageCopies - 1;
	__syncthreads();
	if (!lastCopy || threadIdx.x >= 8) return;
	__threadfence();
	const u64 h = kvFinishSums(page, c.pageLen, sec, threadIdx.x);
	if (threadIdx.x == 0) {
		out[c.page] = h;
		counts[c.page] = 0;
	}
}
