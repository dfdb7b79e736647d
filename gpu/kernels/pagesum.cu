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
	u64 base;  // unused (the host writes 0)
};

struct kvPiece {
	u64 addr; // device address of the piece
	u64 off;  // offset of the piece in the page
	u64 len;  // bytes
};

// The copy kernels run blocks of THREADS threads; kvUnitCheck blocks of UNIT_THREADS, in groups
// of 8 (one thread a lane), each computing one 1024-byte block's delta at a time.
#define THREADS 256
// A unit's pieces are read from shared memory when it has at most this many: every stripe
// looks its piece up, and global memory would make each lookup a long dependent load.
#define SHARED_PIECES 128
// The most full blocks a unit has: it is shorter than 128 KiB.
#define UNIT_BLOCKS 128
// kvUnitCheck's threads a block: a group for each of a 64 KiB unit's blocks and its rest, so
// such a unit is hashed in one round. (Run 79: 18.2 us for the units of 12 MiB of 1 MiB pages,
// where 256 threads in two rounds, each loading both words a lane adds, took 22.7.) The kernel
// asks for two blocks a multiprocessor (at most 64 registers a thread), so two units run on each
// at once: 13.8 us for those units, 123 for 180 MiB (run 83; without, 18.2 and 184).
#define UNIT_THREADS 512

__device__ __forceinline__ u64 kvInit(u32 lane) {
	switch (lane) {
	case 0: return 0xC2B2AE3DULL;
	case 1: return 0x9E3779B185EBCA87ULL;
	case 2: return 0xC2B2AE3D27D4EB4FULL;
	case 3: return 0x165667B19E3779F9ULL;
	case 4: return 0x85EBCA77C2B2AE63ULL;
	case 5: return 0x85EBCA77ULL;
	case 6: return 0x27D4EB2F165667C5ULL;
	default: return 0x9E3779B1ULL;
	}
}

// kvFind returns the index of the piece holding page offset o.
__device__ __forceinline__ u32 kvFind(const kvPiece *ps, u32 n, u64 o) {
	u32 lo = 0, hi = n;
	while (hi - lo > 1) {
		u32 mid = (lo + hi) / 2;
		if (ps[mid].off <= o) lo = mid; else hi = mid;
	}
	return lo;
}

// kvAddr returns the device address of page offset o (a stripe's start), moving the cursor k
// forward over the pieces; o never decreases between calls with the same cursor.
__device__ __forceinline__ u64 kvAddr(const kvPiece *ps, u32 &k, u64 o) {
	while (o >= ps[k].off + ps[k].len) k++;
	return ps[k].addr + (o - ps[k].off);
}

// kvBlock returns what the 16 stripes of the block at unit offset start add to lane. Each thread
// loads its lane's word of every stripe, the 16 loads in flight together (a unit of one piece
// needs no lookup), and takes the word of lane ^ 1 that the stripe also adds from that lane's
// thread with a shuffle; mask is the 8 threads of the lanes, in one warp.
__device__ u64 kvBlock(const kvPiece *ps, u32 np, u64 start, const kvSecret &sec, u32 lane, unsigned mask) {
	u64 v[16];
	if (np == 1) {
		// One piece (the unit's): the stripes are 64 bytes apart from its start.
		const u64 *w = (const u64 *)(ps[0].addr + start) + lane;
#pragma unroll
		for (u32 s = 0; s < 16; s++) v[s] = w[8 * s];
	} else {
		u32 k = kvFind(ps, np, start);
#pragma unroll
		for (u32 s = 0; s < 16; s++) v[s] = ((const u64 *)kvAddr(ps, k, start + (u64)s * 64))[lane];
	}
	u64 d = 0;
#pragma unroll
	for (u32 s = 0; s < 16; s++) {
		const u64 pair = __shfl_xor_sync(mask, v[s], 1);
		const u64 x = v[s] ^ sec.acc[s + lane];
		d += pair + (x & 0xFFFFFFFFULL) * (x >> 32);
	}
	return d;
}

// kvRest returns what the rest of a unit of len bytes adds to lane after its full blocks: the
// stripes of its last, partial block but the last one (read with the secret words of a full
// block's), and its last 64 bytes (read with the secret at byte 121), loaded and shuffled as
// kvBlock does.
__device__ u64 kvRest(const kvPiece *ps, u32 np, u64 len, const kvSecret &sec, u32 lane, unsigned mask) {
	const u64 start = (len - 1) / 1024 * 1024;
	const u32 n = (u32)(((len - 1) - start) / 64); // at most 15
	u64 v[16];
	u32 k = kvFind(ps, np, start);
#pragma unroll
	for (u32 s = 0; s < 16; s++) v[s] = s < n ? ((const u64 *)kvAddr(ps, k, start + (u64)s * 64))[lane] : 0;
	const u64 o = len - 64;
	u32 kl = kvFind(ps, np, o);
	const u64 lv = ((const u64 *)kvAddr(ps, kl, o))[lane];
	u64 d = 0;
#pragma unroll
	for (u32 s = 0; s < 16; s++) {
		const u64 pair = __shfl_xor_sync(mask, v[s], 1);
		if (s < n) {
			const u64 x = v[s] ^ sec.acc[s + lane];
			d += pair + (x & 0xFFFFFFFFULL) * (x >> 32);
		}
	}
	const u64 lp = __shfl_xor_sync(mask, lv, 1);
	const u64 x = lv ^ sec.last[lane];
	return d + lp + (x & 0xFFFFFFFFULL) * (x >> 32);
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
// and the sum is mixed with the length and avalanched.
__device__ __forceinline__ u64 kvMerge(u64 acc, u64 len, const kvSecret &sec, u32 lane, unsigned mask) {
	const u64 odd = __shfl_xor_sync(mask, acc, 1);
	u64 term = 0;
	if ((lane & 1) == 0) {
		u64 a = acc ^ sec.merge[lane];
		u64 c = odd ^ sec.merge[lane + 1];
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

// kvUnitCheck computes the digest of unit blockIdx.x into out[blockIdx.x], one thread block a
// unit: group g computes the deltas of blocks g, g + UNIT_THREADS / 8, ... into shared memory,
// and one group the unit's rest (kvRest), as if it were block `blocks`; then threads 0-7 apply
// the deltas and scrambles in block order, one thread a lane, add the rest and merge the lanes.
// A unit of UNIT_BLOCKS full blocks or more (the host never sends one) gets the digest 0.
extern "C" __global__ void __launch_bounds__(UNIT_THREADS, 2) kvUnitCheck(const kvPage *pages, const kvPiece *pieces, kvSecret sec, u64 *out) {
	__shared__ kvPiece local[SHARED_PIECES];
	__shared__ u64 deltas[UNIT_BLOCKS * 8]; // block b's delta of lane i at 8b + i; the rest at 8 * blocks + i
	const kvPage pg = pages[blockIdx.x];
	const u64 blocks = (pg.len - 1) / 1024;
	if (blocks >= UNIT_BLOCKS) {
		if (threadIdx.x == 0) out[blockIdx.x] = 0;
		return;
	}
	const kvPiece *ps = pieces + pg.first;
	if (pg.count <= SHARED_PIECES) {
		for (u32 i = threadIdx.x; i < pg.count; i += UNIT_THREADS) local[i] = ps[i];
		__syncthreads();
		ps = local;
	}
	const u32 lane = threadIdx.x & 7;
	const unsigned mask = 0xFFu << (threadIdx.x & 24); // the group's threads in its warp
	for (u64 b = threadIdx.x >> 3; b <= blocks; b += UNIT_THREADS / 8) {
		deltas[8 * b + lane] = b < blocks ? kvBlock(ps, pg.count, b * 1024, sec, lane, mask) : kvRest(ps, pg.count, pg.len, sec, lane, mask);
	}
	__syncthreads();
	if (threadIdx.x >= 8) return;
	const u64 key = sec.acc[16 + lane];
	u64 acc = kvInit(lane);
#pragma unroll 8
	for (u64 b = 0; b < blocks; b++) acc = kvScramble(acc, deltas[8 * b + lane], key);
	acc += deltas[8 * blocks + lane];
	const u64 h = kvMerge(acc, pg.len, sec, lane, 0xFFu);
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

__device__ __forceinline__ u64 kvTerm(u64 v, u64 pair, u64 key) {
	const u64 x = v ^ key;
	return pair + (x & 0xFFFFFFFFULL) * (x >> 32);
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
	return kvMerge(acc, len, sec, lane, 0xFFu);
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
