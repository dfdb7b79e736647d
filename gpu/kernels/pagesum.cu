// Page checksums on the GPU: the XXH3-64 digest (seed 0, default secret) of every page of a
// batch, read where the pages lie in engine memory, so a load can be checked after its copy
// without the host reading the pages a second time.
//
// XXH3-64 of an input longer than 240 bytes keeps eight 64-bit accumulators ("lanes"). Each
// 64-byte stripe adds to every lane; after each 1024-byte block (16 stripes) every lane is
// scrambled. Within a block the additions commute, so the sum a block adds to each lane (its
// "delta") can be computed independently of the blocks before it; only applying deltas and
// scrambles is sequential, and it is per lane. One thread block hashes one page (see THREADS).
// Algorithm: https://github.com/Cyan4973/xxHash/blob/v0.8.2/doc/xxhash_spec.md
//
// A page is a list of pieces (device address, offset in the page, length), in page order. The
// host only launches this for pages longer than 240 bytes whose pieces are multiples of 64 bytes
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
	u64 len;   // bytes in the page
	u32 first; // its first piece
	u32 count; // its number of pieces
};

struct kvPiece {
	u64 addr; // device address of the piece
	u64 off;  // offset of the piece in the page
	u64 len;  // bytes
};

// A thread block is 8 warps. Warp 0 applies deltas and scrambles (its first 8 threads, one per
// lane); the other 7 warps, 28 groups of 8 threads, compute the deltas of 28 blocks at a time
// into one of two buffers while warp 0 applies the previous 28 from the other.
#define THREADS 256
#define GROUPS 28
// A page's pieces are read from shared memory when it has at most this many: every stripe
// looks its piece up, and global memory would make each lookup a long dependent load.
#define SHARED_PIECES 128

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

// kvStripe returns what one stripe at address a adds to lane, with the secret word key.
__device__ __forceinline__ u64 kvStripe(u64 a, u32 lane, u64 key) {
	const u64 *w = (const u64 *)a;
	u64 v = w[lane];
	u64 pair = w[lane ^ 1];
	u64 x = v ^ key;
	return pair + (x & 0xFFFFFFFFULL) * (x >> 32);
}

// kvBlock returns what the 16 stripes of the block at page offset start add to lane. All the
// addresses are found first, so the 32 loads are in flight together.
__device__ u64 kvBlock(const kvPiece *ps, u32 np, u64 start, const kvSecret &sec, u32 lane) {
	u64 a[16];
	u32 k = kvFind(ps, np, start);
#pragma unroll
	for (u32 s = 0; s < 16; s++) a[s] = kvAddr(ps, k, start + (u64)s * 64);
	const u64 *w[16];
	u64 v[16], pair[16];
#pragma unroll
	for (u32 s = 0; s < 16; s++) {
		w[s] = (const u64 *)a[s];
		v[s] = w[s][lane];
		pair[s] = w[s][lane ^ 1];
	}
	u64 d = 0;
#pragma unroll
	for (u32 s = 0; s < 16; s++) {
		u64 x = v[s] ^ sec.acc[s + lane];
		d += pair[s] + (x & 0xFFFFFFFFULL) * (x >> 32);
	}
	return d;
}

// kvStripes returns what stripes [0, n) starting at page offset start add to lane (the last,
// partial block); stripe s reads the secret's word s + lane.
__device__ u64 kvStripes(const kvPiece *ps, u32 np, u64 start, u32 n, const kvSecret &sec, u32 lane) {
	u64 d = 0;
	if (n == 0) return 0;
	u32 k = kvFind(ps, np, start);
	for (u32 s = 0; s < n; s++) d += kvStripe(kvAddr(ps, k, start + (u64)s * 64), lane, sec.acc[s + lane]);
	return d;
}

extern "C" __global__ void __launch_bounds__(THREADS) kvPageSums(const kvPage *pages, const kvPiece *pieces, kvSecret sec, u64 *out) {
	__shared__ u64 delta[2][GROUPS][8];
	__shared__ u64 lanes[8];
	__shared__ kvPiece local[SHARED_PIECES];
	const kvPage pg = pages[blockIdx.x];
	const kvPiece *ps = pieces + pg.first;
	if (pg.count <= SHARED_PIECES) {
		for (u32 i = threadIdx.x; i < pg.count; i += THREADS) local[i] = ps[i];
		__syncthreads();
		ps = local;
	}
	const bool scrambler = threadIdx.x < 32;
	const u32 lane = threadIdx.x & 7, group = (threadIdx.x - 32) >> 3;
	const u64 blocks = (pg.len - 1) / 1024;
	const u64 chunks = (blocks + GROUPS - 1) / GROUPS;
	u64 acc = kvInit(lane);
	for (u64 c = 0; c <= chunks; c++) {
		if (!scrambler && c < chunks) {
			u64 b = c * GROUPS + group;
			delta[c & 1][group][lane] = b < blocks ? kvBlock(ps, pg.count, b * 1024, sec, lane) : 0;
		}
		if (scrambler && threadIdx.x < 8 && c > 0) {
			u64 first = (c - 1) * GROUPS;
			u64 n = blocks - first < GROUPS ? blocks - first : GROUPS;
			for (u32 j = 0; j < n; j++) {
				acc += delta[(c - 1) & 1][j][lane];
				acc ^= acc >> 47;
				acc ^= sec.acc[16 + lane];
				acc *= 0x9E3779B1ULL;
			}
		}
		__syncthreads();
	}
	if (threadIdx.x < 8) {
		u64 start = blocks * 1024;
		u32 stripes = (u32)(((pg.len - 1) - start) / 64);
		acc += kvStripes(ps, pg.count, start, stripes, sec, lane);
		// The last stripe: the page's final 64 bytes, with the secret at byte 121.
		u64 o = pg.len - 64;
		u32 k = kvFind(ps, pg.count, o);
		acc += kvStripe(kvAddr(ps, k, o), lane, sec.last[lane]);
		lanes[lane] = acc;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		u64 h = pg.len * 0x9E3779B185EBCA87ULL;
		for (u32 i = 0; i < 4; i++) {
			u64 a = lanes[2 * i] ^ sec.merge[2 * i];
			u64 c = lanes[2 * i + 1] ^ sec.merge[2 * i + 1];
			h += (a * c) ^ __umul64hi(a, c);
		}
		h ^= h >> 37;
		h *= 0x165667919E3779F9ULL;
		h ^= h >> 32;
		out[blockIdx.x] = h;
	}
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
