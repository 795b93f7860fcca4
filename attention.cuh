// attention.cuh: the attention kernels of mlm.c, flash-attention-2 style on tensor cores (included at the
// end of kernels.cuh, whose helpers they use).
//
// Attention is bidirectional. qkv (B, T, 3C): token (b, t) holds Q | K | V, each C = NH * HD wide, head h at
// columns [h HD, (h+1) HD). Masking: query (b, i) attends to the keys j with seg_lo[b, i] <= j < seg_hi[b, i],
// its own sample in a packed row. The ranges are segments: every token of a sample has the same range, so
// key j is in query i's range exactly when i is in j's (the backward uses this). Padding tokens have
// seg_lo == seg_hi: they attend to nothing, nothing attends to them, and their output, lse and gradients
// are 0. Scale 1 / sqrt(HD); head sizes 16, 32, 64 and 128.
//
// The (T x T) scores never reach global memory. The forward keeps, per query row, a running max m and sum l
// of exp (the online softmax) and saves lse = log sum_j exp(s_ij) for the backward, which recomputes
// P = exp(S - lse) tile by tile. Every product is a warp-level tensor-core instruction, mma.sync m16n8k16
// (bf16 in, fp32 accumulate), whose operand and accumulator registers have the per-lane layout the PTX ISA
// documents (cpu/include/ptx.h spells it out). That layout is what makes the flash-2 design possible:
//   - the accumulator of S = Q K^T is, register for register, the A operand of the next product P V, so P
//     goes from the softmax to the tensor cores without touching shared memory;
//   - the softmax runs on the accumulator registers: each lane holds 2 rows x 16 columns of a 16 x 64 tile
//     and the 4 lanes of a quad (lane / 4) share rows, so a row max or sum is 2 shuffles;
//   - tiles of K and V (forward, dQ) or Q and dO (dK dV) are double-buffered in shared memory and copied with
//     cp.async, so the next tile's loads overlap this tile's math; ldmatrix moves them to registers;
//   - tiles outside the block's key range are never visited, and tiles outside a warp's range are skipped by
//     that warp: with packed short samples most of the (T x T) square is empty;
//   - exp2 with the scale and log2(e) folded into one fused multiply-add (fmaf: one rounding, the same in
//     both builds; nvcc would contract it anyway, g++ for x86-64 does not).
// Deterministic: no atomics; every sum has a fixed order (dQ has its own pass instead of atomics).

// ---------------------------------------------------------------------------------------------
// Tensor-core fragments. One m16n8k16 product D (16 x 8) += A (16 x 16) . B (16 x 8) per warp.
// FragA holds a lane's 8 elements of A, FragB its 4 of B; the accumulator is float[4]. With g = lane / 4 and
// t = lane % 4: A elements (g | g+8, 2t | 2t+1 | 2t+8 | 2t+9), B elements (k = 2t | 2t+1 | 2t+8 | 2t+9, n = g),
// accumulator (g | g+8, 2t | 2t+1). In bf16 mode these are the mma.sync registers (bf16 pairs) and the loads
// are ldmatrix; in fp32 mode (the gradient-check build, MLM_FP32) they are fp32 values read from shared
// memory in the same layout, and the product is exact fp32 arithmetic over warp shuffles (slow; tests only).
#include <ptx.h>  // mma.sync, ldmatrix, cp.async (GPU: gpu/ptx.h, inline PTX; CPU: cpu/include/ptx.h)

#ifndef MLM_FP32
struct FragA {
    uint32_t x[4];
};
struct FragB {
    uint32_t x[2];
};
__device__ inline uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
// load_a: A = the 16 x 16 tile at s (row-major, row stride ld). Lane l addresses row l % 16, columns
// 8 (l / 16) .. +7: matrices 0..3 of ldmatrix.x4 are then the four 8 x 8 quarters in FragA order.
__device__ inline void load_a(FragA& a, const floatX* s, int ld) {
    int l = threadIdx.x % 32;
    ldmatrix_x4(a.x, s + (l % 16) * ld + (l / 16) * 8);
}
// load_b_nk: two B operands (n 0..7 and 8..15, k 0..15) from a tile stored n-major: B[k][n] = s[n ld + k]
// (K for Q K^T). The rows of s are B's columns, which is ldmatrix's plain layout.
__device__ inline void load_b_nk(FragB b[2], const floatX* s, int ld) {
    int l = threadIdx.x % 32;
    uint32_t r[4];
    ldmatrix_x4(r, s + (l % 8 + (l / 16) * 8) * ld + ((l / 8) % 2) * 8);
    b[0].x[0] = r[0], b[0].x[1] = r[1], b[1].x[0] = r[2], b[1].x[1] = r[3];
}
// load_b_kn: two B operands from a tile stored k-major: B[k][n] = s[k ld + n] (V for P V): ldmatrix .trans.
__device__ inline void load_b_kn(FragB b[2], const floatX* s, int ld) {
    int l = threadIdx.x % 32;
    uint32_t r[4];
    ldmatrix_x4_trans(r, s + (l % 8 + ((l / 8) % 2) * 8) * ld + (l / 16) * 8);
    b[0].x[0] = r[0], b[0].x[1] = r[1], b[1].x[0] = r[2], b[1].x[1] = r[3];
}
// pack_a: the A operand (16 x 16) from two accumulators side by side (columns 0..7 and 8..15), rounded to bf16.
__device__ inline void pack_a(FragA& a, const float c0[4], const float c1[4]) {
    a.x[0] = pack_bf16(c0[0], c0[1]);
    a.x[1] = pack_bf16(c0[2], c0[3]);
    a.x[2] = pack_bf16(c1[0], c1[1]);
    a.x[3] = pack_bf16(c1[2], c1[3]);
}
__device__ inline void mma(float d[4], const FragA& a, const FragB& b) { mma_m16n8k16_bf16(d, a.x, b.x, d); }
#else
struct FragA {
    float x[8];
};
struct FragB {
    float x[4];
};
__device__ inline void load_a(FragA& a, const floatX* s, int ld) {
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    for (int i = 0; i < 8; i++) a.x[i] = s[(g + 8 * ((i >> 1) & 1)) * ld + 2 * t + (i & 1) + 8 * (i >> 2)];
}
__device__ inline void load_b_nk(FragB b[2], const floatX* s, int ld) {
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 4; i++) b[j].x[i] = s[(8 * j + g) * ld + 2 * t + (i & 1) + 8 * (i >> 1)];
}
__device__ inline void load_b_kn(FragB b[2], const floatX* s, int ld) {
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 4; i++) b[j].x[i] = s[(2 * t + (i & 1) + 8 * (i >> 1)) * ld + 8 * j + g];
}
__device__ inline void pack_a(FragA& a, const float c0[4], const float c1[4]) {
    for (int i = 0; i < 4; i++) a.x[i] = c0[i], a.x[4 + i] = c1[i];
}
// d += A B in fp32: lane (g, t) needs rows g, g+8 of A (held by lanes 4g .. 4g+3) and columns 2t, 2t+1 of B
// (held by lanes 8t .. 8t+3 and 8t+4 .. 8t+7); round tt brings k = 2tt, 2tt+1, 2tt+8, 2tt+9 (x[0], x[1],
// x[4], x[5] of A's row g, x[2], x[3], x[6], x[7] of row g + 8; x[0..3] of B), one k at a time.
__device__ inline void mma(float d[4], const FragA& a, const FragB& b) {
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    for (int tt = 0; tt < 4; tt++)
        for (int q = 0; q < 4; q++) {
            int ia = (q & 1) + 4 * (q >> 1);
            float ag = __shfl_sync(0xffffffffu, a.x[ia], 4 * g + tt),
                  ag8 = __shfl_sync(0xffffffffu, a.x[ia + 2], 4 * g + tt);
            float b0 = __shfl_sync(0xffffffffu, b.x[q], 8 * t + tt),
                  b1 = __shfl_sync(0xffffffffu, b.x[q], 8 * t + 4 + tt);
            d[0] += ag * b0, d[1] += ag * b1, d[2] += ag8 * b0, d[3] += ag8 * b1;
        }
}
#endif

// ---------------------------------------------------------------------------------------------
// Tiles and shared memory. A block is 4 warps; each warp owns MT x 16 rows of the block's own tile (queries
// in the forward and dQ, keys in dK dV), and streams tiles of the other side (keys, or queries) through
// shared memory. Why MT = 2 where registers allow: every warp reads each streamed tile whole (its B operands),
// so the shared-memory bytes per tensor-core instruction halve when a warp's B fragments serve two 16-row
// tiles. At MT = 1 a 64-key tile costs a warp 16 KB of ldmatrix (128 B/clock/SM: 128 clocks) for 64
// mma.sync; at MT = 2 the same 16 KB feeds 128.
// Shared tiles have HD + 8 elements per row: the 16 extra bytes put the 8 rows an ldmatrix reads in 8
// different bank groups, and keep every row 16-byte aligned for cp.async.
// The fp32 build (gradient checks only) uses MT = 1 and smaller streamed tiles: its fragments take twice the
// registers.
#define ATT_FP32 (sizeof(floatX) == 4)
enum { ATT_FWD, ATT_DQ, ATT_DKDV };  // the three kernels
// which of them run on wgmma (the trainer's choose_attention: all three on a compute capability 9.0 device at head
// size 64; 0: the mma.sync kernels, which run on any GPU)
enum { ATT_WG_FWD = 1, ATT_WG_DQ = 2, ATT_WG_DKDV = 4, ATT_WG_ALL = 7 };
__host__ __device__ constexpr int att_ld(int HD) { return HD + 8; }
__host__ __device__ constexpr size_t att_tile_bytes(int HD, int rows) {
    return (size_t)rows * att_ld(HD) * sizeof(floatX);
}
// 16-row tiles per warp, and the block's own rows (4 warps)
__host__ __device__ constexpr int att_mt(int HD, int kind) { return ATT_FP32 || HD > 64 ? 1 : 2; }
__host__ __device__ constexpr int att_rows(int HD, int kind) { return 64 * att_mt(HD, kind); }
// rows of each streamed tile: the forward's S and O, dQ's S, dP and dQ, dK dV's S^T, dP^T, dK and dV are
// fp32 registers (MT x cols / 2 per lane for each of S, dP; MT x HD / 2 for each accumulator)
__host__ __device__ constexpr int att_cols(int HD, int kind) {
    return ATT_FP32 ? (HD > 64 ? 16 : 32) : kind == ATT_FWD ? 64 : kind == ATT_DQ && HD > 64 ? 64 : 32;
}
// __launch_bounds__(128, n) caps registers at 64K / (128 n); 128 threads always fit 2 blocks per SM (at
// most 255 registers each). The fp32 build asks for 1.
__host__ __device__ constexpr int att_min_blocks(int HD, int kind) { return ATT_FP32 ? 1 : 2; }
// The dynamic shared memory of each kernel, used by the kernels and their launchers alike:
//   forward: Q, then K and V double-buffered;  dQ: Q, dO, then K and V double-buffered;
//   dK dV: K, V, then Q and dO double-buffered, and each query tile's lse and delta (fp32) double-buffered.
__host__ __device__ constexpr size_t att_forward_smem(int HD) {
    return att_tile_bytes(HD, att_rows(HD, ATT_FWD)) + 4 * att_tile_bytes(HD, att_cols(HD, ATT_FWD));
}
__host__ __device__ constexpr size_t att_dq_smem(int HD) {
    return 2 * att_tile_bytes(HD, att_rows(HD, ATT_DQ)) + 4 * att_tile_bytes(HD, att_cols(HD, ATT_DQ));
}
__host__ __device__ constexpr size_t att_dkdv_smem(int HD) {
    return 2 * att_tile_bytes(HD, att_rows(HD, ATT_DKDV)) + 4 * att_tile_bytes(HD, att_cols(HD, ATT_DKDV)) +
           4 * att_cols(HD, ATT_DKDV) * sizeof(float);
}

// att_copy_tile: the block starts asynchronous copies of rows [row0, row0 + R) x [0, HD) of src (row stride
// `stride` elements) into a shared tile; rows >= T are zero-filled (nothing is read for them).
template <int HD, int R>
__device__ inline void att_copy_tile(floatX* dst, const floatX* src, size_t stride, int row0, int T) {
    constexpr int per = HD / X128;
    for (int i = threadIdx.x; i < R * per; i += blockDim.x) {
        int r = i / per, c = (i % per) * X128, ok = row0 + r < T;
        cp_async_16(dst + r * att_ld(HD) + c, src + (size_t)(ok ? row0 + r : 0) * stride + c, ok ? 16 : 0);
    }
}
// att_store_rows: a warp writes its 16 rows (staged in shared memory, row stride ld) to global rows
// [row0, row0 + 16) below T, 128 bits per lane per store.
template <int HD>
__device__ inline void att_store_rows(floatX* dst, size_t stride, const floatX* s, int row0, int T) {
    constexpr int per = HD / X128;
    for (int i = threadIdx.x % 32; i < 16 * per; i += 32) {
        int r = i / per, c = (i % per) * X128;
        if (row0 + r < T) store128(dst + (size_t)(row0 + r) * stride + c, load128(s + r * att_ld(HD) + c));
    }
}
// att_stage: a warp writes one 16-row accumulator (16 x HD; rows g, g + 8 times scale_a, scale_b) as floatX
// into 16 shared rows.
template <int HD>
__device__ inline void att_stage(floatX* s, const float acc[HD / 8][4], float scale_a, float scale_b) {
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < HD / 8; j++) {
        s[g * att_ld(HD) + 8 * j + 2 * t] = fromf(acc[j][0] * scale_a);
        s[g * att_ld(HD) + 8 * j + 2 * t + 1] = fromf(acc[j][1] * scale_a);
        s[(g + 8) * att_ld(HD) + 8 * j + 2 * t] = fromf(acc[j][2] * scale_b);
        s[(g + 8) * att_ld(HD) + 8 * j + 2 * t + 1] = fromf(acc[j][3] * scale_b);
    }
}

// att_column_sums: the block's share of the qkv bias gradient: dst[c] = the sum over its staged rows r < nrows
// (shared memory, NW = 4 or 8 warps x 16 MT rows, stride att_ld(HD)) of row r's column c, for the HD columns. Each
// warp sums its own 16 MT rows (a lane 2 adjacent columns, in row order) into scratch[w HD ..] (NW HD floats of
// shared memory the block no longer uses); after a block barrier, threads 0 .. HD - 1 add the warps' sums in warp
// order. A fixed order: bitwise deterministic. partials_sum then adds the blocks' dst rows (att_part_floats).
template <int HD, int MT, int NW = 4>
__device__ inline void att_column_sums(float* dst, const floatX* rows_s, float* scratch, int nrows) {
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int c = 2 * lane; c < HD; c += 64) {
        float s0 = 0.f, s1 = 0.f;
        for (int r = 16 * MT * w; r < 16 * MT * (w + 1) && r < nrows; r++) {
            s0 += tof(rows_s[r * att_ld(HD) + c]);
            s1 += tof(rows_s[r * att_ld(HD) + c + 1]);
        }
        scratch[w * HD + c] = s0;
        scratch[w * HD + c + 1] = s1;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < HD; c += blockDim.x) {
        float sum = scratch[c] + scratch[HD + c] + scratch[2 * HD + c] + scratch[3 * HD + c];
#pragma unroll
        for (int v = 4; v < NW; v++) sum += scratch[v * HD + c];
        dst[c] = sum;
    }
}

// att_range: [lo, hi), the union of the key ranges of rows [row0, row0 + R) (empty: lo > hi), R <= 128.
// Block-wide (a thread per row; NW = 4 or 8 warps), through the 2 NW ints of red.
template <int NW>
__device__ inline void att_range(const int* seg_lo, const int* seg_hi, int row0, int R, int T, int* red, int* lo,
                                 int* hi) {
    int i = row0 + threadIdx.x % R, l = 0x7fffffff, h = -1;
    if (i < T && seg_hi[i] > seg_lo[i]) {
        l = seg_lo[i];
        h = seg_hi[i];
    }
    for (int o = 16; o > 0; o >>= 1) {
        l = min(l, __shfl_xor_sync(0xffffffffu, l, o));
        h = max(h, __shfl_xor_sync(0xffffffffu, h, o));
    }
    if (threadIdx.x % 32 == 0) {
        red[threadIdx.x / 32] = l;
        red[NW + threadIdx.x / 32] = h;
    }
    __syncthreads();
    *lo = red[0], *hi = red[NW];
#pragma unroll
    for (int w = 1; w < NW; w++) *lo = min(*lo, red[w]), *hi = max(*hi, red[NW + w]);
}
// WarpRange: what a warp's rows attend to. lo[m][r], hi[m][r]: the range of this lane's row g (r = 0) or
// g + 8 (r = 1) of 16-row tile m (empty for padding and rows >= T). [any_lo, any_hi): the union over the
// warp's rows (a streamed tile outside it is skipped); [all_lo, all_hi): the intersection (a tile inside it
// needs no mask; empty if a row is padding).
#define ATT_MAX_MT 2
struct WarpRange {
    int lo[ATT_MAX_MT][2], hi[ATT_MAX_MT][2], any_lo, any_hi, all_lo, all_hi;
};
template <int MT>
__device__ inline WarpRange warp_range(const int* seg_lo, const int* seg_hi, int row0, int T) {
    WarpRange w;
    const int BIG = 0x7fffffff;
    w.any_lo = BIG, w.any_hi = -BIG, w.all_lo = -BIG, w.all_hi = BIG;
    for (int m = 0; m < MT; m++)
        for (int r = 0; r < 2; r++) {
            int row = row0 + 16 * m + 8 * r + threadIdx.x % 32 / 4;
            int l = row < T ? seg_lo[row] : 0, h = row < T ? seg_hi[row] : 0, e = h <= l;
            w.lo[m][r] = l, w.hi[m][r] = h;
            w.any_lo = min(w.any_lo, e ? BIG : l), w.any_hi = max(w.any_hi, e ? -BIG : h);
            w.all_lo = max(w.all_lo, e ? BIG : l), w.all_hi = min(w.all_hi, e ? -BIG : h);
        }
    for (int o = 4; o < 32; o <<= 1) {  // the 8 quads hold the warp's rows
        w.any_lo = min(w.any_lo, __shfl_xor_sync(0xffffffffu, w.any_lo, o));
        w.any_hi = max(w.any_hi, __shfl_xor_sync(0xffffffffu, w.any_hi, o));
        w.all_lo = max(w.all_lo, __shfl_xor_sync(0xffffffffu, w.all_lo, o));
        w.all_hi = min(w.all_hi, __shfl_xor_sync(0xffffffffu, w.all_hi, o));
    }
    return w;
}
// mask_tile: sets to -inf the entries of 16-row tile m of an accumulator (16 x N, columns col0 ..) outside
// its rows' ranges.
template <int N>
__device__ inline void mask_tile(float s[N / 8][4], int col0, const WarpRange& w, int m) {
    int t = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < N / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int c = col0 + 8 * j + 2 * t + (e & 1);
            if (c < w.lo[m][e >> 1] || c >= w.hi[m][e >> 1]) s[j][e] = -INFINITY;
        }
}

// att_softmax_tile: the forward's online softmax over one key tile, for a warp's 16-row accumulator tile. s (16 x N
// scores Q K^T (unscaled), masked to -inf where a row does not see a key) becomes P = exp2(s sl2 - m) in
// place; the running max m (mrun, log2 units) and sum l (lrun, this lane's columns: the quad's sum comes at the end)
// of the lane's rows g (s[.][0..1]) and g + 8 (s[.][2..3]) are updated (l rescaled), and alpha = exp2(m_old - m_new)
// is what O must be rescaled by (att_rescale) before P V joins it. A quad (lane / 4) shares its rows, so a row max
// is 2 shuffles.
template <int N>
__device__ inline void att_softmax_tile(float s[N / 8][4], float mrun[2], float lrun[2], float alpha[2], float sl2) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < N / 8; j++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]) * sl2);
        mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]) * sl2);
    }
    float sub[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        float mn = fmaxf(mrun[r], mx[r]);
        // a row with no key seen yet keeps m = -inf: subtract 0 instead (every exp2 is then 0)
        sub[r] = mn == -INFINITY ? 0.f : mn;
        alpha[r] = exp2f(mrun[r] - sub[r]);  // rescales the old O and l
        mrun[r] = mn;
    }
    float ps[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < N / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[j][e] = exp2f(fmaf(s[j][e], sl2, -sub[e >> 1]));
            ps[e >> 1] += s[j][e];
        }
    lrun[0] = lrun[0] * alpha[0] + ps[0];
    lrun[1] = lrun[1] * alpha[1] + ps[1];
}
// att_rescale: O (a warp's 16 x HD accumulator tile) *= alpha of its rows (g: o[.][0..1], g + 8: o[.][2..3]).
template <int HD>
__device__ inline void att_rescale(float o[HD / 8][4], const float alpha[2]) {
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] *= alpha[0], o[d][1] *= alpha[0], o[d][2] *= alpha[1], o[d][3] *= alpha[1];
}

// warp_mm_abt: acc[m] (16 x N, fp32) += A_m B^T for the warp's MT 16-row tiles, A_m = rows [16 m, 16 m + 16)
// of a (row-major, K = HD columns) and B = the N rows of b (row-major, HD columns), both in shared memory
// (row stride LD). Each B fragment read by ldmatrix serves the MT tiles.
template <int MT, int N, int HD>
__device__ inline void warp_mm_abt(float acc[MT][N / 8][4], const floatX* a, const floatX* b, int LD) {
#pragma unroll
    for (int k = 0; k < HD / 16; k++) {
        FragA af[MT];
#pragma unroll
        for (int m = 0; m < MT; m++) load_a(af[m], a + 16 * m * LD + 16 * k, LD);
#pragma unroll
        for (int n = 0; n < N / 16; n++) {
            FragB bf[2];
            load_b_nk(bf, b + 16 * n * LD + 16 * k, LD);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                mma(acc[m][2 * n], af[m], bf[0]);
                mma(acc[m][2 * n + 1], af[m], bf[1]);
            }
        }
    }
}
// warp_mm_pb: acc[m] (16 x HD, fp32) += P_m B for the warp's MT 16-row tiles, P_m = p[m] (16 x N fp32
// accumulators, reused in registers as A operands, rounded to bf16) and B = the N rows of b (row-major, HD
// columns, shared memory, row stride LD).
template <int MT, int N, int HD>
__device__ inline void warp_mm_pb(float acc[MT][HD / 8][4], float p[MT][N / 8][4], const floatX* b, int LD) {
#pragma unroll
    for (int k = 0; k < N / 16; k++) {
        FragA pa[MT];
#pragma unroll
        for (int m = 0; m < MT; m++) pack_a(pa[m], p[m][2 * k], p[m][2 * k + 1]);
#pragma unroll
        for (int d = 0; d < HD / 16; d++) {
            FragB bf[2];
            load_b_kn(bf, b + 16 * k * LD + 16 * d, LD);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                mma(acc[m][2 * d], pa[m], bf[0]);
                mma(acc[m][2 * d + 1], pa[m], bf[1]);
            }
        }
    }
}

// AttBlock: what a block of the three kernels works on. Grid (ceil(T / R), NH, B): block (x, h, b) owns R rows
// of head h of sequence b from row0 (queries in the forward and dQ, keys in dK dV), its warp w the 16 MT of them
// from wrow; it streams the tiles of CT rows of the other side (keys, or queries) that its rows' ranges reach:
// ntiles tiles from row start (none when every row is padding).
struct AttBlock {
    int row0, h, b, w, wrow;
    int C;               // NH HD: the row width of out and dout
    size_t C3;           // 3C: the row stride of qkv
    const floatX* base;  // qkv at row 0 of sequence b, head h: its Q; K at base + C, V at base + 2C
    const int *lo, *hi;  // sequence b's key ranges (T)
    int start, ntiles;   // the streamed tiles
};
// att_block: the opening of the three kernels: the block's rows, head and sequence, the union of its rows' ranges
// (att_range, a block barrier: every thread calls it), and the CT-row tiles that cover that union. (Each kernel
// then takes its warp's ranges, warp_range: kept out of AttBlock, as a member of it cost the forward 7 registers.)
template <int HD, int MT, int R, int CT, int NW = 4>
__device__ inline AttBlock att_block(const floatX* qkv, const int* seg_lo, const int* seg_hi, int T, int NH, int* red) {
    AttBlock blk;
    blk.row0 = blockIdx.x * R, blk.h = blockIdx.y, blk.b = blockIdx.z, blk.w = threadIdx.x / 32;
    blk.wrow = blk.row0 + 16 * MT * blk.w, blk.C = NH * HD, blk.C3 = (size_t)3 * blk.C;
    blk.base = qkv + (size_t)blk.b * T * blk.C3 + (size_t)blk.h * HD;
    blk.lo = seg_lo + (size_t)blk.b * T, blk.hi = seg_hi + (size_t)blk.b * T;
    int lo, hi;
    att_range<NW>(blk.lo, blk.hi, blk.row0, R, T, red, &lo, &hi);
    blk.start = lo / CT * CT, blk.ntiles = hi > lo ? (hi - blk.start + CT - 1) / CT : 0;
    return blk;
}
// att_copy_queries: the first copies of the forward and dQ (not yet committed), when there are key tiles: the
// block's Q tile (R rows) into Qs, and the first key tile (KC rows) of K and V into buffer 0 of Ks and Vs.
template <int HD, int R, int KC>
__device__ inline void att_copy_queries(floatX* Qs, floatX* Ks, floatX* Vs, const AttBlock& blk, int T) {
    if (!blk.ntiles) return;
    att_copy_tile<HD, R>(Qs, blk.base, blk.C3, blk.row0, T);
    att_copy_tile<HD, KC>(Ks, blk.base + blk.C, blk.C3, blk.start, T);
    att_copy_tile<HD, KC>(Vs, blk.base + 2 * blk.C, blk.C3, blk.start, T);
}
// att_next_keys: the top of the forward's and dQ's loop over key tiles, at tile it. Waits for it (this thread's
// copies, then everyone's: a block barrier, after which every warp is also done with tile it - 1), then starts
// copying tile it + 1 of K and V into the other buffer (buffer (it + 1) & 1 of Ks, Vs: [2][KC][LD] each).
template <int HD, int KC>
__device__ inline void att_next_keys(floatX* Ks, floatX* Vs, const AttBlock& blk, int it, int T) {
    constexpr int LD = att_ld(HD);
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < blk.ntiles) {
        int kt = blk.start + (it + 1) * KC, buf = (it + 1) & 1;
        att_copy_tile<HD, KC>(Ks + buf * KC * LD, blk.base + blk.C, blk.C3, kt, T);
        att_copy_tile<HD, KC>(Vs + buf * KC * LD, blk.base + 2 * blk.C, blk.C3, kt, T);
    }
    cp_async_commit();
}
// att_query_stats: dK dV's per-query terms of the QC-row query tile from row q0, into one buffer of each:
// lse_s = lse log2(e) and dl_s = delta (0 for rows >= T); threads 0 .. QC - 1, one row each.
template <int QC>
__device__ inline void att_query_stats(float* lse_s, float* dl_s, const float* lse_r, const float* delta_r, int q0,
                                       int T) {
    if (threadIdx.x >= QC) return;
    int q = q0 + threadIdx.x;
    lse_s[threadIdx.x] = q < T ? lse_r[q] * 1.44269504088896341f : 0.f;
    dl_s[threadIdx.x] = q < T ? delta_r[q] : 0.f;
}

// att_delta_rows: the opening of dQ: delta = rowsum(dO * O) (= rowsum(P * dP), the softmax backward's term) of the
// block's R query rows, into dl_s (R floats) for dQ and to delta_r (sequence b, head h; T floats) for the dK dV
// kernel, which runs next. L = HD / X128 lanes share a row, each one 128-bit chunk of dO and of O (global loads;
// the dO rows are also being copied to shared memory, so theirs may come from L2), and a butterfly over the L
// lanes sums the row. NTH / L rows a pass, P = R L / NTH passes, whose loads are all in flight at once. (It was a
// kernel of its own, which read dO and O once more.)
template <int HD, int R, int NTH = 128>  // NTH: the block's threads
__device__ inline void att_delta_rows(float* dl_s, float* delta_r, const floatX* dbase, const floatX* obase, int C,
                                      int row0, int T) {
    constexpr int L = HD / X128, RPP = NTH / L, P = R / RPP;
    static_assert(L >= 2 && L <= 32 && R % RPP == 0, "att_delta_rows: lanes per row");
    int sub = threadIdx.x % L, r = threadIdx.x / L;
    float s[P];  // this lane's part of each pass's row: all P passes' loads are issued before the first shuffle
#pragma unroll
    for (int p = 0; p < P; p++) {  // (rows past T read row T - 1, unconditionally, so the loads can all go first)
        int t = row0 + p * RPP + r;
        size_t off = (size_t)(t < T ? t : T - 1) * C + (size_t)sub * X128;
        Pack128 g = load128(dbase + off), o = load128(obase + off);
        s[p] = 0.f;
        for (int k = 0; k < X128; k++) s[p] += tof(g.v[k]) * tof(o.v[k]);
        if (t >= T) s[p] = 0.f;
    }
#pragma unroll
    for (int p = 0; p < P; p++) {
        for (int k = L / 2; k > 0; k /= 2) s[p] += __shfl_xor_sync(0xffffffffu, s[p], k);  // every lane takes part
        int t = row0 + p * RPP + r;
        if (sub == 0) {
            dl_s[p * RPP + r] = s[p];
            if (t < T) delta_r[t] = s[p];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// attention_forward: out (B, T, C) = softmax(Q K^T / sqrt(HD) + mask) V per head; lse (B, NH, T) = the
// log-sum-exp of each query row's scaled, masked scores (0 for padding queries).
// Grid (ceil(T / R), NH, B) with R = 64 MT query rows per block, block 128 = 4 warps x 16 MT query rows.
// Data movement: the block's Q tile is copied (cp.async) to shared memory once and each warp keeps its
// rows' A operands in registers (MT x HD / 4 per lane). K and V stream through two shared buffers: tile
// j + 1 is copied while tile j is computed. Per 64-key tile a warp computes S (16 MT x 64, 32 MT fp32
// registers per lane) = Q K^T on tensor cores, masks it (only if the tile is not inside every row's
// range), updates the running max m and sum l of its rows in registers, rescales O (16 MT x HD, fp32,
// MT x HD / 2 registers per lane), turns P = exp2(S log2(e) / sqrt(HD) - m) into bf16 A operands in
// registers and adds P V; each K or V fragment read from shared memory serves the MT row tiles. At the end
// O / l goes to shared memory (the warp's Q rows) and to out with 128-bit stores.
template <int HD>
__global__ void __launch_bounds__(128, att_min_blocks(HD, ATT_FWD))
    attention_forward(floatX* out, float* lse, const floatX* qkv, const int* seg_lo, const int* seg_hi, int B, int T,
                      int NH) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ int red[8];
    constexpr int LD = att_ld(HD), MT = att_mt(HD, ATT_FWD), R = att_rows(HD, ATT_FWD), KC = att_cols(HD, ATT_FWD);
    constexpr int NT = KC / 8, DT = HD / 8;
    floatX* Qs = (floatX*)dyn_smem;  // [R][LD]
    floatX* Ks = Qs + R * LD;        // [2][KC][LD]
    floatX* Vs = Ks + 2 * KC * LD;   // [2][KC][LD]
    AttBlock blk = att_block<HD, MT, R, KC>(qkv, seg_lo, seg_hi, T, NH, red);
    WarpRange wr = warp_range<MT>(blk.lo, blk.hi, blk.wrow, T);
    int lane = threadIdx.x % 32, g = lane / 4;
    att_copy_queries<HD, R, KC>(Qs, Ks, Vs, blk, T);
    cp_async_commit();
    const float sl2 = 1.44269504088896341f / sqrtf((float)HD);  // log2(e) / sqrt(HD): exp(x / sqrt(HD)) = exp2(x sl2)
    float o[MT][DT][4] = {}, mrun[MT][2], lrun[MT][2] = {};
    for (int m = 0; m < MT; m++) mrun[m][0] = mrun[m][1] = -INFINITY;
    FragA qf[MT][HD / 16];
    floatX* Qw = Qs + 16 * MT * blk.w * LD;  // the warp's query rows
    for (int it = 0; it < blk.ntiles; it++) {
        int kt = blk.start + it * KC, buf = it & 1;
        att_next_keys<HD, KC>(Ks, Vs, blk, it, T);  // key tile it is here; tile it + 1 is on its way
        if (it == 0)
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int k = 0; k < HD / 16; k++) load_a(qf[m][k], Qw + 16 * m * LD + 16 * k, LD);
        if (kt >= wr.any_hi || kt + KC <= wr.any_lo) continue;  // no row of this warp sees these keys
        const floatX *Kt = Ks + buf * KC * LD, *Vt = Vs + buf * KC * LD;
        float s[MT][NT][4] = {};
#pragma unroll
        for (int k = 0; k < HD / 16; k++)
#pragma unroll
            for (int n = 0; n < NT / 2; n++) {
                FragB kb[2];
                load_b_nk(kb, Kt + 16 * n * LD + 16 * k, LD);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    mma(s[m][2 * n], qf[m][k], kb[0]);
                    mma(s[m][2 * n + 1], qf[m][k], kb[1]);
                }
            }
        bool full = kt >= wr.all_lo && kt + KC <= wr.all_hi;
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (!full) mask_tile<KC>(s[m], kt, wr, m);
            float alpha[2];
            att_softmax_tile<KC>(s[m], mrun[m], lrun[m], alpha, sl2);
            att_rescale<HD>(o[m], alpha);
        }
        warp_mm_pb<MT, KC, HD>(o, s, Vt, LD);  // O += P V
    }
    float* L = lse + ((size_t)blk.b * NH + blk.h) * T;
    __syncwarp();  // every lane's last ldmatrix of the warp's Q rows is done before any lane overwrites them
#pragma unroll
    for (int m = 0; m < MT; m++) {
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = lrun[m][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv[r] = l > 0.f ? 1.f / l : 0.f;
            int q = blk.wrow + 16 * m + 8 * r + g;  // lse = ln(2^m l) = m ln 2 + ln l
            if (lane % 4 == 0 && q < T) L[q] = l > 0.f ? mrun[m][r] * 0.69314718055994531f + logf(l) : 0.f;
        }
        att_stage<HD>(Qw + 16 * m * LD, o[m], inv[0], inv[1]);  // the warp's own Q rows are free now
    }
    __syncwarp();
#pragma unroll
    for (int m = 0; m < MT; m++)
        att_store_rows<HD>(out + (size_t)blk.b * T * blk.C + (size_t)blk.h * HD, blk.C, Qw + 16 * m * LD,
                           blk.wrow + 16 * m, T);
}

#ifndef MLM_FP32
// ---------------------------------------------------------------------------------------------
// attention_forward_wgmma: attention_forward's results with Hopper's warpgroup MMA (wgmma, sm_90a; bf16 storage,
// HD 64 or 128). tests/test_attention checks it against the same double reference, and tests/bench_attention times
// it against attention_forward (an H200: 0.158 ms against cuDNN's 0.13 at bert-base's shape). The trainer runs it
// wherever it can (choose_attention).
// Grid (ceil(T / 64), NH, B): block 128 = one warpgroup owns 64 query rows, warp w the 16 from row0 + 16 w (the
// rows of wgmma's m64 accumulator each warp holds).
// Data movement: the Q tile (64 x HD) and the K and V tiles (KW keys x HD, double-buffered; KW = 128 at HD 64,
// 64 at HD 128) are copied into shared memory in the layout wgmma reads (sw128_off: 128-byte swizzled rows,
// 1024-byte aligned) by the tensor memory accelerator: thread 0 issues each 64 x 64 box of qkv (the tensor map
// tm_qkv, att_wg_map; rows past T come as zeros), and the block waits on an mbarrier, not on its own copies
// (stage j, K_j with V_{j - 1}, completes on full[j % 2] in its phase j / 2; stage 0 also brings Q); Q stays there
// (wgmma reads it as the A operand of every key tile). Per key tile: S (64 x KW, fp32; KW / 2 registers per lane) = Q
// K^T by HD / 16 wgmma m64nKWk16 from shared memory (K is K-major: its rows are S's columns); masking and the online
// softmax (att_softmax_tile) run on S in registers as in attention_forward; P (bf16) goes back to the tensor cores as
// wgmma's register A operand (the accumulator layout is the A layout, as with mma.sync), and O (64 x HD, HD / 2
// registers per lane) += P V by KW / 16 wgmma m64nHDk16 with V read MN-major (trans-b: V's rows are the k of P V). The
// products are issued one tile ahead, as FlashAttention-3 does inside a warpgroup: S_{j + 1} and then P_j V_j go to the
// tensor cores together, and the softmax of S_{j + 1} runs while P_j V_j is computed (O is rescaled after its wait), so
// the exponentials and the second product overlap; K_{j + 2} and V_{j + 1} are copied meanwhile into the buffers that
// S_j and P_{j - 1} V_{j - 1} have finished with. O / l is staged in plain rows in the free K buffer and stored 128
// bits per lane. Unlike attention_forward no warp skips a tile its rows do not see (wgmma is the whole warpgroup's):
// the masking zeroes those rows' P.
__host__ __device__ constexpr int att_wg_keys(int HD) { return HD == 64 ? 128 : 64; }
// blocks per SM: shared memory (att_wg_smem: 73 KB at HD 64, 81 KB at HD 128) allows 3 and 2 of the 227 KB;
// registers are capped to match (at most 168 and 255 a thread)
__host__ __device__ constexpr int att_wg_min_blocks(int HD) { return HD == 64 ? 3 : 2; }
// sw128_off: the byte of element (r, c) of a shared tile of bf16 rows in wgmma's 128-byte swizzle, as TMA writes it
// (the wgmma attention kernels' tiles): boxes of 64 columns (rows of 128 bytes, one after another),
// the column blocks box_bytes apart (the attention tiles' boxes are 64 rows: 8 KB), each box 8-row groups of 8 x 128
// bytes (1 KB) in which row r % 8 has its 16-byte chunks permuted: chunk (c % 64) / 8 sits at position
// ((c % 64) / 8) ^ (r % 8). The same bytes serve as a K-major operand (rows are M or N: Q, K) and as an MN-major one
// (rows are K: V). Tiles start 1024-byte aligned (the swizzle repeats every 1 KB).
__host__ __device__ constexpr int sw128_off(int box_bytes, int r, int c) {
    return (c / 64) * box_bytes + r * 128 + (((c % 64) / 8) ^ (r % 8)) * 16 + (c % 8) * 2;
}
// 1024 bytes to align the tiles, Q (64 rows), then K and V (2 buffers of KW rows each)
__host__ __device__ constexpr size_t att_wg_smem(int HD) {
    return 1024 + (size_t)(64 + 4 * att_wg_keys(HD)) * HD * sizeof(floatX);
}
// att_wg_map: the TMA tensor map of x (B, T, cols) in bf16 (qkv, or dout), as a 3D tensor (cols, T, B) read in boxes
// of 64 columns x 64 rows (8 KB: a head's 64 rows at HD 64) with the 128-byte swizzle; boxes past row T get zeros.
static inline void att_wg_map(CUtensorMap* map, const floatX* x, int B, int T, int cols) {
    uint64_t dims[3] = {(uint64_t)cols, (uint64_t)T, (uint64_t)B},
             strides[2] = {2 * (uint64_t)cols, 2 * (uint64_t)cols * T};
    uint32_t box[3] = {64, 64, 1};
    tma_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, 3, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}
// att_tma_tile: thread 0's TMA copies of rows [row0, row0 + R) x columns [col0, col0 + HD) of batch row b of map's
// tensor into the shared tile dst (sw128_off's layout), completing on bar: (R / 64) (HD / 64) boxes, R HD 2 bytes.
template <int HD, int R>
__device__ inline void att_tma_tile(unsigned char* dst, const CUtensorMap* map, int col0, int row0, int b,
                                    uint64_t* bar) {
    static_assert(R % 64 == 0 && HD % 64 == 0 && (HD == 64 || R == 64), "att_tma_tile: 64 x 64 boxes");
    for (int c = 0; c < HD / 64; c++)
        for (int r = 0; r < R / 64; r++)
            tma_load_3d(dst + sw128_off(8192, 64 * r, 64 * c), map, col0 + 64 * c, row0 + 64 * r, b, bar);
}
// sw128_desc_kmajor: wgmma's descriptor of k-step ks (16 columns) of a sw128_off tile read K-major (A = Q, or
// B = K): start at the step's column block (ks / 4) and its 32 bytes in the row (ks % 4, before the swizzle, which
// the hardware applies to the address); 8-row groups 1 KB apart.
__device__ inline uint64_t sw128_desc_kmajor(uint32_t tile, int box_bytes, int ks) {
    return wgmma_desc(tile + (ks / 4) * box_bytes + (ks % 4) * 32, WGMMA_SWIZZLE_128B, 16, 1024);
}
// sw128_desc_mnmajor: ... of k-step ks (16 rows of K: row groups 2 ks, 2 ks + 1) of a sw128_off tile read MN-major
// (V): the next 64 columns (LBO) box_bytes on, the next 8 rows (SBO) 1 KB on.
__device__ inline uint64_t sw128_desc_mnmajor(uint32_t tile, int box_bytes, int ks) {
    return wgmma_desc(tile + 2 * ks * 1024, WGMMA_SWIZZLE_128B, box_bytes, 1024);
}
// att_wg_abt: issues acc (64 x N, fp32) = A B^T for the warpgroup, A (64 rows) and B (N rows) swizzled HD-wide
// tiles at shared addresses a0 and b0, read K-major: HD / 16 wgmma m64nNk16 (the first overwrites acc). No commit.
template <int N, int HD>
__device__ inline void att_wg_abt(float* acc, uint32_t a0, uint32_t b0) {
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++)
        wgmma_m64k16_bf16<N, 0>(acc, sw128_desc_kmajor(a0, 8192, ks), sw128_desc_kmajor(b0, 8192, ks), ks > 0);
}
// att_wg_pb: issues acc (64 x HD, fp32) += P B for the warpgroup, P (64 x K) from registers as wgmma's A operands
// (pa: K / 16 fragments, which must stay untouched until the wait) and B (K rows of a swizzled HD-wide tile at b0)
// read MN-major: K / 16 wgmma m64nHDk16. No commit.
template <int K, int HD>
__device__ inline void att_wg_pb(float* acc, const FragA* pa, uint32_t b0) {
#pragma unroll
    for (int ks = 0; ks < K / 16; ks++) wgmma_m64k16_bf16_rs<HD, 1>(acc, pa[ks].x, sw128_desc_mnmajor(b0, 8192, ks), 1);
}
// att_wg_load_a: a warp's wgmma A operands for its 16 rows from row0 of a swizzled HD-wide tile (sw128_off, boxes of
// 64 rows), all HD columns (HD / 16 fragments): load_a's ldmatrix, each lane's 16 bytes found through the swizzle (it
// moves whole 16-byte chunks).
template <int HD>
__device__ inline void att_wg_load_a(FragA* a, const unsigned char* tile, int row0) {
    int l = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++)
        ldmatrix_x4(a[ks].x, (const floatX*)(tile + sw128_off(8192, row0 + l % 16, 16 * ks + 8 * (l / 16))));
}
// att_wg_rbt: issues acc (64 x N, fp32) = A B^T for the warpgroup, A (64 x HD) from registers (a: HD / 16 fragments,
// att_wg_load_a's) and B (N rows of a swizzled HD-wide tile at b0) read K-major: HD / 16 wgmma m64nNk16 (the first
// overwrites acc). No commit.
template <int N, int HD>
__device__ inline void att_wg_rbt(float* acc, const FragA* a, uint32_t b0) {
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++)
        wgmma_m64k16_bf16_rs<N, 0>(acc, a[ks].x, sw128_desc_kmajor(b0, 8192, ks), ks > 0);
}
template <int HD>
__global__ void __launch_bounds__(128, att_wg_min_blocks(HD))
    attention_forward_wgmma(floatX* out, float* lse, const __grid_constant__ CUtensorMap tm_qkv, const floatX* qkv,
                            const int* seg_lo, const int* seg_hi, int B, int T, int NH) {
    static_assert(HD == 64 || HD == 128, "attention_forward_wgmma: HD 64 or 128");
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ int red[8];
    __shared__ __align__(8) uint64_t full[2];  // TMA's mbarriers: stage j (K_j, V_{j - 1}; Q with K_0) in full[j & 1]
    constexpr int KW = att_wg_keys(HD), NT = KW / 8, DT = HD / 8, LD = att_ld(HD);
    constexpr int TILE_K = KW * HD * (int)sizeof(floatX);                       // bytes of one K or V buffer
    unsigned char* Qs = dyn_smem + (1024 - smem_addr(dyn_smem) % 1024) % 1024;  // the swizzle repeats every 1 KB
    unsigned char* Ks = Qs + 64 * HD * sizeof(floatX);                          // [2][TILE_K]: K_j in Ks[j & 1]
    unsigned char* Vs = Ks + 2 * TILE_K;                                        // [2][TILE_K]: V_j in Vs[j & 1]
    AttBlock blk = att_block<HD, 1, 64, KW>(qkv, seg_lo, seg_hi, T, NH, red);
    WarpRange wr = warp_range<1>(blk.lo, blk.hi, blk.wrow, T);
    // At least one tile, so that no wgmma sits in a branch (ptxas serializes them there): a block whose rows see
    // no key computes tile 0 fully masked, which gives what no tile gives (O = 0, l = 0).
    int lane = threadIdx.x % 32, g = lane / 4, n = max(blk.ntiles, 1), start = blk.ntiles ? blk.start : 0;
    int qcol = blk.h * HD, kcol = blk.C + qcol, vcol = 2 * blk.C + qcol;  // the head's columns of Q, K, V in qkv
    if (threadIdx.x == 0) {
        mbar_init(&full[0], 1);
        mbar_init(&full[1], 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // stage 0: Q and K_0; stage 1: K_1 and V_0
        mbar_arrive_expect_tx(&full[0], 64 * HD * sizeof(floatX) + TILE_K);
        att_tma_tile<HD, 64>(Qs, &tm_qkv, qcol, blk.row0, blk.b, &full[0]);
        att_tma_tile<HD, KW>(Ks, &tm_qkv, kcol, start, blk.b, &full[0]);
        mbar_arrive_expect_tx(&full[1], (n > 1 ? 2 : 1) * TILE_K);
        if (n > 1) att_tma_tile<HD, KW>(Ks + TILE_K, &tm_qkv, kcol, start + KW, blk.b, &full[1]);
        att_tma_tile<HD, KW>(Vs, &tm_qkv, vcol, start, blk.b, &full[1]);
    }
    mbar_wait(&full[0], 0);
    const float sl2 = 1.44269504088896341f / sqrtf((float)HD);  // log2(e) / sqrt(HD)
    float o[DT][4] = {}, mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {}, alpha[2];
    float s[NT][4];     // S, then P
    FragA pa[KW / 16];  // P as wgmma's A operands: alive from the packing to the wait after its P V
    uint32_t q0 = smem_addr(Qs);
    wgmma_fence();  // S_0 and its softmax (O is still 0: nothing to rescale)
    att_wg_abt<KW, HD>(&s[0][0], q0, smem_addr(Ks));
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operand(&s[0][0], KW / 2);
    if (!(start >= wr.all_lo && start + KW <= wr.all_hi)) mask_tile<KW>(s, start, wr, 0);
    att_softmax_tile<KW>(s, mrun, lrun, alpha, sl2);
#pragma unroll
    for (int k = 0; k < KW / 16; k++) pack_a(pa[k], s[2 * k], s[2 * k + 1]);
    // Iteration it: S_{it + 1} = Q K_{it + 1}^T and O += P_it V_it go to the tensor cores, in that order; the
    // softmax of S_{it + 1} runs while P_it V_it is still being computed (FlashAttention-3's overlap inside a
    // warpgroup); then O is rescaled and P_{it + 1} packed.
    for (int it = 0; it + 1 < n; it++) {
        int kt = start + (it + 1) * KW;
        __syncthreads();                                   // every warp has finished S_it and P_{it - 1} V_{it - 1}
        mbar_wait(&full[(it + 1) & 1], (it + 1) / 2 % 2);  // stage it + 1: K_{it + 1} and V_it are here
        wgmma_fence();                                     // S's registers were last read by the packing, P's written
        att_wg_abt<KW, HD>(&s[0][0], q0, smem_addr(Ks + ((it + 1) & 1) * TILE_K));
        wgmma_commit_group();
        att_wg_pb<KW, HD>(&o[0][0], pa, smem_addr(Vs + (it & 1) * TILE_K));
        wgmma_commit_group();
        wgmma_wait_group<1>();  // S_{it + 1} is done; P_it V_it may still run
        wgmma_fence_operand(&s[0][0], KW / 2);
        if (!(kt >= wr.all_lo && kt + KW <= wr.all_hi)) mask_tile<KW>(s, kt, wr, 0);
        att_softmax_tile<KW>(s, mrun, lrun, alpha, sl2);
        // Stage it + 2: K_it's and V_{it - 1}'s buffers (free since the barrier) take K_{it + 2} and V_{it + 1}.
        // Issued here, the copies also keep the softmax above the wait: with nothing between them, ptxas (nvcc 13.0)
        // put the wait above the register-only softmax; it keeps it below these memory operations (the SASS then
        // has the MUFU.EX2 between the two WARPGROUP.DEPBAR: tools/kernel_report.py, EX2 async).
        if (threadIdx.x == 0) {
            uint64_t* bar = &full[it & 1];
            mbar_arrive_expect_tx(bar, (it + 2 < n ? 2 : 1) * TILE_K);
            if (it + 2 < n) att_tma_tile<HD, KW>(Ks + (it & 1) * TILE_K, &tm_qkv, kcol, kt + KW, blk.b, bar);
            att_tma_tile<HD, KW>(Vs + ((it + 1) & 1) * TILE_K, &tm_qkv, vcol, kt, blk.b, bar);
        }
        wgmma_wait_group<0>();  // P_it V_it is done: O may be rescaled, pa rewritten
        wgmma_fence_operand(&o[0][0], HD / 2);
        wgmma_fence_fragment(&pa[0].x[0], 4 * (KW / 16));
        att_rescale<HD>(o, alpha);
#pragma unroll
        for (int k = 0; k < KW / 16; k++) pack_a(pa[k], s[2 * k], s[2 * k + 1]);
    }
    __syncthreads();
    mbar_wait(&full[n & 1], n / 2 % 2);  // the last tile's P V: stage n, V_{n - 1}, is here
    wgmma_fence();
    att_wg_pb<KW, HD>(&o[0][0], pa, smem_addr(Vs + ((n - 1) & 1) * TILE_K));
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operand(&o[0][0], HD / 2);
    // (every warp's reads of the K buffers ended before the barrier above: they take the staged output)
    float* L = lse + ((size_t)blk.b * NH + blk.h) * T;
    floatX* Ow = (floatX*)Ks + 16 * blk.w * LD;  // the warp's 16 rows, plain (row stride LD)
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrun[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv[r] = l > 0.f ? 1.f / l : 0.f;
        int q = blk.wrow + 8 * r + g;  // lse = ln(2^m l) = m ln 2 + ln l
        if (lane % 4 == 0 && q < T) L[q] = l > 0.f ? mrun[r] * 0.69314718055994531f + logf(l) : 0.f;
    }
    att_stage<HD>(Ow, o, inv[0], inv[1]);
    __syncwarp();
    att_store_rows<HD>(out + (size_t)blk.b * T * blk.C + (size_t)blk.h * HD, blk.C, Ow, blk.wrow, T);
}
#endif

// attention_backward_dq: dQ = dS K / sqrt(HD) with dS = P * (dP - delta), P = exp(Q K^T / sqrt(HD) - lse)
// (masked), dP = dO V^T; written into the Q columns of dqkv (B, T, 3C). It first computes delta = rowsum(dO * O)
// of its rows from dout and out (att_delta_rows) and writes it to delta (B, NH, T) for the dK dV kernel.
// Grid (ceil(T / R), NH, B) with R = 64 MT query rows per block, block 128 = 4 warps x 16 MT query rows;
// key tiles in the block's range.
// Data movement: Q and dO tiles in shared memory (read by ldmatrix as A operands per key tile), K and V
// double-buffered by cp.async; per key tile a warp computes S and dP (16 MT x KC each, fp32 registers),
// forms dS in registers and adds dS K (dS's accumulators reused as A operands) to dQ (16 MT x HD, fp32
// registers); each K or V fragment serves the MT row tiles. With part != NULL the block then writes the column
// sums of its dQ rows (from their staged copy in shared memory) to its row of part: the Q bias gradient's partial.
template <int HD>
__global__ void __launch_bounds__(128, att_min_blocks(HD, ATT_DQ))
    attention_backward_dq(floatX* dqkv, float* part, float* delta, const floatX* qkv, const floatX* dout,
                          const floatX* out, const float* lse, const int* seg_lo, const int* seg_hi, int B, int T,
                          int NH) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ int red[8];
    constexpr int LD = att_ld(HD), MT = att_mt(HD, ATT_DQ), R = att_rows(HD, ATT_DQ), KC = att_cols(HD, ATT_DQ);
    __shared__ float dl_s[R];  // delta of the block's rows
    constexpr int NT = KC / 8, DT = HD / 8;
    floatX* Qs = (floatX*)dyn_smem;  // [R][LD]
    floatX* dOs = Qs + R * LD;       // [R][LD]
    floatX* Ks = dOs + R * LD;       // [2][KC][LD]
    floatX* Vs = Ks + 2 * KC * LD;   // [2][KC][LD]
    AttBlock blk = att_block<HD, MT, R, KC>(qkv, seg_lo, seg_hi, T, NH, red);
    WarpRange wr = warp_range<MT>(blk.lo, blk.hi, blk.wrow, T);
    int g = threadIdx.x % 32 / 4;
    size_t row_off = (size_t)blk.b * T * blk.C + (size_t)blk.h * HD;  // dout and out at row 0 of (b, h)
    att_copy_queries<HD, R, KC>(Qs, Ks, Vs, blk, T);
    if (blk.ntiles) att_copy_tile<HD, R>(dOs, dout + row_off, blk.C, blk.row0, T);
    cp_async_commit();
    att_delta_rows<HD, R>(dl_s, delta + ((size_t)blk.b * NH + blk.h) * T, dout + row_off, out + row_off, blk.C,
                          blk.row0, T);
    __syncthreads();
    const float sl2 = 1.44269504088896341f / sqrtf((float)HD), L2E = 1.44269504088896341f;
    const float* lse_r = lse + ((size_t)blk.b * NH + blk.h) * T;
    float lse2[MT][2], dl[MT][2];  // lse log2(e) and delta of this lane's rows
    for (int m = 0; m < MT; m++)
        for (int r = 0; r < 2; r++) {
            int q = blk.wrow + 16 * m + 8 * r + g;
            lse2[m][r] = q < T ? lse_r[q] * L2E : 0.f;
            dl[m][r] = q < T ? dl_s[q - blk.row0] : 0.f;
        }
    float dq[MT][DT][4] = {};
    floatX *Qw = Qs + 16 * MT * blk.w * LD, *dOw = dOs + 16 * MT * blk.w * LD;
    for (int it = 0; it < blk.ntiles; it++) {
        int kt = blk.start + it * KC, buf = it & 1;
        att_next_keys<HD, KC>(Ks, Vs, blk, it, T);
        if (kt >= wr.any_hi || kt + KC <= wr.any_lo) continue;
        const floatX *Kt = Ks + buf * KC * LD, *Vt = Vs + buf * KC * LD;
        float s[MT][NT][4] = {}, dp[MT][NT][4] = {};
        warp_mm_abt<MT, KC, HD>(s, Qw, Kt, LD);    // S = Q K^T
        warp_mm_abt<MT, KC, HD>(dp, dOw, Vt, LD);  // dP = dO V^T
        bool full = kt >= wr.all_lo && kt + KC <= wr.all_hi;
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (!full) mask_tile<KC>(s[m], kt, wr, m);
#pragma unroll
            for (int j = 0; j < NT; j++)  // dS = P (dP - delta), in place of dP
#pragma unroll
                for (int e = 0; e < 4; e++)
                    dp[m][j][e] = exp2f(fmaf(s[m][j][e], sl2, -lse2[m][e >> 1])) * (dp[m][j][e] - dl[m][e >> 1]);
        }
        warp_mm_pb<MT, KC, HD>(dq, dp, Kt, LD);  // dQ += dS K
    }
    __syncwarp();  // the warp's own Q rows (only it reads them) take dQ
    float scale = 1.f / sqrtf((float)HD);
#pragma unroll
    for (int m = 0; m < MT; m++) att_stage<HD>(Qw + 16 * m * LD, dq[m], scale, scale);
    __syncwarp();
#pragma unroll
    for (int m = 0; m < MT; m++)
        att_store_rows<HD>(dqkv + (size_t)blk.b * T * blk.C3 + (size_t)blk.h * HD, blk.C3, Qw + 16 * m * LD,
                           blk.wrow + 16 * m, T);
    if (part) {  // the Q bias gradient's partial: the dQ rows' column sums (scratch: K and V's buffers, free now)
        static_assert(2 * KC * LD * sizeof(floatX) >= 4 * HD * sizeof(float), "att_column_sums scratch");
        __syncthreads();
        float* dst = part + ((size_t)blk.b * gridDim.x + blockIdx.x) * blk.C3 + (size_t)blk.h * HD;
        att_column_sums<HD, MT>(dst, Qs, (float*)Ks, T - blk.row0 < R ? T - blk.row0 : R);
    }
}

// attention_backward_dkdv: dV = P^T dO and dK = dS^T Q / sqrt(HD) for the block's keys, written into the
// K and V columns of dqkv (B, T, 3C) (zeros for keys no query attends to).
// Grid (ceil(T / R), NH, B) with R = 64 MT keys per block, block 128 = 4 warps x 16 MT keys. The queries
// that see the block's keys are those of the keys' samples (ranges are segments), so the block visits the
// query tiles of the union of its keys' ranges, and key j's own range decides which queries see it.
// Data movement: K and V of the block in shared memory (A operands by ldmatrix); query tiles of Q, dO (and
// their lse, delta) double-buffered by cp.async. Per query tile a warp computes S^T = K Q^T and
// dP^T = V dO^T (16 MT x QC each, fp32 registers), forms P^T and dS^T = P^T (dP^T - delta) in registers,
// and adds P^T dO to dV and dS^T Q to dK (16 MT x HD each, fp32 registers), P^T and dS^T reused as A
// operands; each Q or dO fragment serves the MT key tiles. With part != NULL the block then writes the column
// sums of its dK and dV rows to its row of part: the K and V bias gradients' partials.
template <int HD>
__global__ void __launch_bounds__(128, att_min_blocks(HD, ATT_DKDV))
    attention_backward_dkdv(floatX* dqkv, float* part, const floatX* qkv, const floatX* dout, const float* lse,
                            const float* delta, const int* seg_lo, const int* seg_hi, int B, int T, int NH) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ int red[8];
    constexpr int LD = att_ld(HD), MT = att_mt(HD, ATT_DKDV), R = att_rows(HD, ATT_DKDV);
    constexpr int QC = att_cols(HD, ATT_DKDV), NT = QC / 8, DT = HD / 8;
    floatX* Ks = (floatX*)dyn_smem;              // [R][LD]
    floatX* Vs = Ks + R * LD;                    // [R][LD]
    floatX* Qs = Vs + R * LD;                    // [2][QC][LD]
    floatX* dOs = Qs + 2 * QC * LD;              // [2][QC][LD]
    float* lse_s = (float*)(dOs + 2 * QC * LD);  // [2][QC], lse log2(e)
    float* dl_s = lse_s + 2 * QC;                // [2][QC]
    AttBlock blk = att_block<HD, MT, R, QC>(qkv, seg_lo, seg_hi, T, NH, red);
    WarpRange wr = warp_range<MT>(blk.lo, blk.hi, blk.wrow, T);  // the keys' ranges: the queries that see them
    int t = threadIdx.x % 4;
    const floatX* dbase = dout + (size_t)blk.b * T * blk.C + (size_t)blk.h * HD;
    const float *lse_r = lse + ((size_t)blk.b * NH + blk.h) * T, *delta_r = delta + ((size_t)blk.b * NH + blk.h) * T;
    if (blk.ntiles) {
        att_copy_tile<HD, R>(Ks, blk.base + blk.C, blk.C3, blk.row0, T);
        att_copy_tile<HD, R>(Vs, blk.base + 2 * blk.C, blk.C3, blk.row0, T);
        att_copy_tile<HD, QC>(Qs, blk.base, blk.C3, blk.start, T);
        att_copy_tile<HD, QC>(dOs, dbase, blk.C, blk.start, T);
    }
    cp_async_commit();
    if (blk.ntiles) att_query_stats<QC>(lse_s, dl_s, lse_r, delta_r, blk.start, T);
    const float sl2 = 1.44269504088896341f / sqrtf((float)HD);
    float dk[MT][DT][4] = {}, dv[MT][DT][4] = {};
    floatX *Kw = Ks + 16 * MT * blk.w * LD, *Vw = Vs + 16 * MT * blk.w * LD;
    for (int it = 0; it < blk.ntiles; it++) {
        int qt = blk.start + it * QC, buf = it & 1;
        cp_async_wait<0>();
        __syncthreads();
        if (it + 1 < blk.ntiles) {
            att_copy_tile<HD, QC>(Qs + (buf ^ 1) * QC * LD, blk.base, blk.C3, qt + QC, T);
            att_copy_tile<HD, QC>(dOs + (buf ^ 1) * QC * LD, dbase, blk.C, qt + QC, T);
            att_query_stats<QC>(lse_s + (buf ^ 1) * QC, dl_s + (buf ^ 1) * QC, lse_r, delta_r, qt + QC, T);
        }
        cp_async_commit();
        if (qt >= wr.any_hi || qt + QC <= wr.any_lo) continue;
        const floatX *Qt = Qs + buf * QC * LD, *dOt = dOs + buf * QC * LD;
        const float *lq = lse_s + buf * QC, *dq = dl_s + buf * QC;
        float s[MT][NT][4] = {}, dp[MT][NT][4] = {};
        warp_mm_abt<MT, QC, HD>(s, Kw, Qt, LD);    // S^T = K Q^T
        warp_mm_abt<MT, QC, HD>(dp, Vw, dOt, LD);  // dP^T = V dO^T
        bool full = qt >= wr.all_lo && qt + QC <= wr.all_hi;
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (!full) mask_tile<QC>(s[m], qt, wr, m);
#pragma unroll
            for (int j = 0; j < NT; j++)  // P^T in s, dS^T = P^T (dP^T - delta) in dp; column c is query qt + c
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = 8 * j + 2 * t + (e & 1);
                    s[m][j][e] = exp2f(fmaf(s[m][j][e], sl2, -lq[c]));
                    dp[m][j][e] = s[m][j][e] * (dp[m][j][e] - dq[c]);
                }
        }
        warp_mm_pb<MT, QC, HD>(dv, s, dOt, LD);  // dV += P^T dO
        warp_mm_pb<MT, QC, HD>(dk, dp, Qt, LD);  // dK += dS^T Q
    }
    __syncwarp();  // the warp's own K and V rows (only it reads them) take dK and dV
    float scale = 1.f / sqrtf((float)HD);
#pragma unroll
    for (int m = 0; m < MT; m++) {
        att_stage<HD>(Kw + 16 * m * LD, dk[m], scale, scale);
        att_stage<HD>(Vw + 16 * m * LD, dv[m], 1.f, 1.f);
    }
    __syncwarp();
    floatX* dst = dqkv + (size_t)blk.b * T * blk.C3 + (size_t)blk.h * HD;
#pragma unroll
    for (int m = 0; m < MT; m++) {
        att_store_rows<HD>(dst + blk.C, blk.C3, Kw + 16 * m * LD, blk.wrow + 16 * m, T);
        att_store_rows<HD>(dst + 2 * blk.C, blk.C3, Vw + 16 * m * LD, blk.wrow + 16 * m, T);
    }
    if (part) {  // the K and V bias gradients' partials: column sums of dK and dV (scratch: the Q buffers, free now)
        static_assert(2 * QC * LD * sizeof(floatX) >= 8 * HD * sizeof(float), "att_column_sums scratch");
        __syncthreads();
        float* pk = part + ((size_t)blk.b * gridDim.x + blockIdx.x) * blk.C3 + blk.C + (size_t)blk.h * HD;
        int nrows = T - blk.row0 < R ? T - blk.row0 : R;
        att_column_sums<HD, MT>(pk, Ks, (float*)Qs, nrows);
        att_column_sums<HD, MT>(pk + blk.C, Vs, (float*)Qs + 4 * HD, nrows);
    }
}

#ifndef MLM_FP32
// ---------------------------------------------------------------------------------------------
// attention_backward_dq_wgmma: attention_backward_dq's results (dQ, delta, the Q bias partials) with wgmma, at
// HD 64 (bf16), like attention_backward_dkdv_wgmma, whose grid it shares (and the dQ kernel's).
// Grid (ceil(T / 128), NH, B); block 256 = two warpgroups, 64 query rows each (warp w the 16 from row0 + 16 w).
// It opens with delta = rowsum(dO * O) of its rows (att_delta_rows, 8 warps).
// Data movement: the block's Q and dO (128 rows) and the key tiles' K and V (64 rows, double-buffered) in shared
// memory, swizzled for wgmma (sw128_off). The tiles are copied by the tensor memory accelerator (TMA): thread 0
// issues each 64-row box of qkv or dout (tensor maps tm_qkv and tm_dout, att_wg_map: rows past T come as zeros)
// with one instruction, and the block waits on the buffer's mbarrier (full[b], phase parity (j / 2) % 2 for key
// tile j; qd for Q and dO) instead of on its threads' own copies.
// Per key tile a warpgroup computes S = Q K^T and
// dP = dO V^T (64 x 64 each, 32 fp32 registers per lane) by 2 x HD / 16 wgmma m64n64k16 from shared memory, forms
// dS = P (dP - delta) in registers and adds dS K to dQ (64 x HD, HD / 2 registers per lane) by 4 wgmma m64nHDk16
// with dS as the register A operand and K read MN-major. dQ is staged in plain rows in the free key buffers.
__host__ __device__ constexpr size_t att_wg_dq_smem(int HD) {  // align, Q, dO, 2 x (K, V)
    return 1024 + (size_t)(2 * 128 + 4 * 64) * HD * sizeof(floatX);
}
template <int HD>
__global__ void __launch_bounds__(256, 2)  // (2 blocks of 8 warps: at most 128 registers)
    attention_backward_dq_wgmma(floatX* dqkv, float* part, float* delta, const __grid_constant__ CUtensorMap tm_qkv,
                                const __grid_constant__ CUtensorMap tm_dout, const floatX* qkv, const floatX* dout,
                                const floatX* out, const float* lse, const int* seg_lo, const int* seg_hi, int B, int T,
                                int NH) {
    static_assert(HD == 64, "attention_backward_dq_wgmma: HD 64 (one 128-byte swizzled box a row)");
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ int red[16];
    __shared__ __align__(8) uint64_t full[2], qd;  // TMA's mbarriers: key buffer b's tile, and Q with dO
    constexpr int R = 128, KW = 64, NT = KW / 8, DT = HD / 8, LD = att_ld(HD);
    constexpr int QB = R * HD * (int)sizeof(floatX), KB = KW * HD * (int)sizeof(floatX);
    __shared__ float dl_s[R];  // delta of the block's rows
    unsigned char* Qs = dyn_smem + (1024 - smem_addr(dyn_smem) % 1024) % 1024;
    unsigned char* dOs = Qs + QB;
    unsigned char* Ks = dOs + QB;     // [2][KB]
    unsigned char* Vs = Ks + 2 * KB;  // [2][KB]
    AttBlock blk = att_block<HD, 1, R, KW, 8>(qkv, seg_lo, seg_hi, T, NH, red);
    WarpRange wr = warp_range<1>(blk.lo, blk.hi, blk.wrow, T);
    int g = threadIdx.x % 32 / 4, wg = threadIdx.x / 128;
    size_t row_off = (size_t)blk.b * T * blk.C + (size_t)blk.h * HD;  // dout and out at row 0 of (b, h)
    int qcol = blk.h * HD;                                            // the head's first column (Q, dout)
    if (threadIdx.x == 0) {
        for (int i = 0; i < 2; i++) mbar_init(&full[i], 1);
        mbar_init(&qd, 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0 && blk.ntiles) {  // Q and dO (two boxes of 64 rows each), then key tile 0
        mbar_arrive_expect_tx(&qd, 2 * QB);
        att_tma_tile<HD, R>(Qs, &tm_qkv, qcol, blk.row0, blk.b, &qd);
        att_tma_tile<HD, R>(dOs, &tm_dout, qcol, blk.row0, blk.b, &qd);
        mbar_arrive_expect_tx(&full[0], 2 * KB);
        att_tma_tile<HD, KW>(Ks, &tm_qkv, blk.C + qcol, blk.start, blk.b, &full[0]);
        att_tma_tile<HD, KW>(Vs, &tm_qkv, 2 * blk.C + qcol, blk.start, blk.b, &full[0]);
    }
    att_delta_rows<HD, R, 256>(dl_s, delta + ((size_t)blk.b * NH + blk.h) * T, dout + row_off, out + row_off, blk.C,
                               blk.row0, T);
    __syncthreads();
    const float sl2 = 1.44269504088896341f / sqrtf((float)HD), L2E = 1.44269504088896341f;
    const float* lse_r = lse + ((size_t)blk.b * NH + blk.h) * T;
    float lse2[2], dl[2];  // lse log2(e) and delta of this lane's rows
    for (int r = 0; r < 2; r++) {
        int q = blk.wrow + 8 * r + g;
        lse2[r] = q < T ? lse_r[q] * L2E : 0.f;
        dl[r] = q < T ? dl_s[q - blk.row0] : 0.f;
    }
    float dq[DT][4] = {}, s[NT][4], dp[NT][4];
    uint32_t q0 = smem_addr(Qs) + wg * 8 * (HD / 64) * 1024, d0 = smem_addr(dOs) + wg * 8 * (HD / 64) * 1024;
    if (blk.ntiles) mbar_wait(&qd, 0);
    for (int it = 0; it < blk.ntiles; it++) {
        int kt = blk.start + it * KW, buf = it & 1;
        __syncthreads();  // every warpgroup is done with key tile it - 1: its buffers take tile it + 1
        if (it + 1 < blk.ntiles && threadIdx.x == 0) {
            mbar_arrive_expect_tx(&full[buf ^ 1], 2 * KB);
            att_tma_tile<HD, KW>(Ks + (buf ^ 1) * KB, &tm_qkv, blk.C + qcol, kt + KW, blk.b, &full[buf ^ 1]);
            att_tma_tile<HD, KW>(Vs + (buf ^ 1) * KB, &tm_qkv, 2 * blk.C + qcol, kt + KW, blk.b, &full[buf ^ 1]);
        }
        mbar_wait(&full[buf], it / 2 % 2);  // key tile it is here
        uint32_t k0 = smem_addr(Ks + buf * KB), v0 = smem_addr(Vs + buf * KB);
        wgmma_fence();
        att_wg_abt<KW, HD>(&s[0][0], q0, k0);   // S = Q K^T
        att_wg_abt<KW, HD>(&dp[0][0], d0, v0);  // dP = dO V^T
        wgmma_commit_group();
        wgmma_wait_group<0>();
        wgmma_fence_operand(&s[0][0], KW / 2);
        wgmma_fence_operand(&dp[0][0], KW / 2);
        if (!(kt >= wr.all_lo && kt + KW <= wr.all_hi)) mask_tile<KW>(s, kt, wr, 0);
#pragma unroll
        for (int j = 0; j < NT; j++)  // dS = P (dP - delta), in place of dP
#pragma unroll
            for (int e = 0; e < 4; e++) dp[j][e] = exp2f(fmaf(s[j][e], sl2, -lse2[e >> 1])) * (dp[j][e] - dl[e >> 1]);
        FragA da[KW / 16];  // dS as A operands; alive until the wait
#pragma unroll
        for (int k = 0; k < KW / 16; k++) pack_a(da[k], dp[2 * k], dp[2 * k + 1]);
        wgmma_fence();
        att_wg_pb<KW, HD>(&dq[0][0], da, k0);  // dQ += dS K
        wgmma_commit_group();
        wgmma_wait_group<0>();
        wgmma_fence_operand(&dq[0][0], HD / 2);
    }
    __syncthreads();              // every warpgroup is done with the key buffers: they take the staged dQ
    floatX* stage = (floatX*)Ks;  // [R][LD]
    floatX* Qw = stage + 16 * blk.w * LD;
    float scale = 1.f / sqrtf((float)HD);
    att_stage<HD>(Qw, dq, scale, scale);
    __syncwarp();
    att_store_rows<HD>(dqkv + (size_t)blk.b * T * blk.C3 + (size_t)blk.h * HD, blk.C3, Qw, blk.wrow, T);
    if (part) {  // the Q bias gradient's partial (scratch: after the staged rows)
        static_assert(R * LD * sizeof(floatX) + 8 * HD * sizeof(float) <= 4 * KB, "att_column_sums scratch");
        __syncthreads();
        float* dst = part + ((size_t)blk.b * gridDim.x + blockIdx.x) * blk.C3 + (size_t)blk.h * HD;
        att_column_sums<HD, 1, 8>(dst, stage, (float*)(stage + R * LD), T - blk.row0 < R ? T - blk.row0 : R);
    }
}

// ---------------------------------------------------------------------------------------------
// attention_backward_dkdv_wgmma: attention_backward_dkdv's results (dK, dV and their bias partials) with wgmma, at
// HD 64 (bf16), like attention_forward_wgmma (tests/test_attention checks it, tests/bench_attention times it, the
// trainer runs it wherever it can).
// Grid (ceil(T / 128), NH, B), the dQ kernel's, so the bias partials keep their rows (att_part_floats). Block 256 =
// two warpgroups, 64 keys each (warp w the 16 from row0 + 16 w): both read the same query tiles.
// Data movement: the block's K and V (128 rows) and the query tiles' Q and dO (64 rows, in three buffers filled two
// tiles ahead, with their lse and delta) in shared memory, swizzled for wgmma (sw128_off), copied by TMA as in
// attention_backward_dq_wgmma (full[b]: phase parity (j / 3) % 2 for query tile j; kv for K and V). Each warp then
// loads its 16 rows of K and V once into registers (ldmatrix: wgmma's A layout, HD / 4 registers a lane each), so
// that the products read only the query tile from shared memory: 32 KB a tile and warpgroup, where K and V read
// through descriptors made it 48 KB. At the tensor cores' peak (4,096 FLOP a clock an SM) the tile's 16 products
// take 512 clocks, so they now ask 64 of shared memory's 128 B a clock, not 96. Per query tile a warpgroup computes S^T
// = K Q^T and dP^T = V dO^T (64 x 64 each, 32 fp32 registers per lane) by 2 x HD / 16 wgmma m64n64k16 with K, V as
// register A operands, forms P^T and dS^T = P^T (dP^T - delta) in registers, and adds P^T dO to dV and dS^T Q to dK (64
// x HD each, HD / 2 registers per lane) by 2 x 4 wgmma m64nHDk16 with P^T and dS^T as register A operands and dO, Q
// read MN-major; the next tile's S^T and dP^T are issued before those two products, so P^T and dS^T of one tile are
// formed while the tensor cores finish the tile before (three buffers: tile j + 2 is copied while tiles j and j + 1 are
// still to be read). dK and dV are staged in plain rows of their own and stored.
__host__ __device__ constexpr size_t att_wg_dkdv_smem(int HD) {  // align, K, V, 3 x (Q, dO), 3 x (lse, delta), stage
    return 1024 + (size_t)(2 * 128 + 6 * 64) * HD * sizeof(floatX) + 6 * 64 * sizeof(float) +
           2 * att_tile_bytes(HD, 128);
}
template <int HD>
__global__ void __launch_bounds__(256, 1)
    attention_backward_dkdv_wgmma(floatX* dqkv, float* part, const __grid_constant__ CUtensorMap tm_qkv,
                                  const __grid_constant__ CUtensorMap tm_dout, const floatX* qkv, const float* lse,
                                  const float* delta, const int* seg_lo, const int* seg_hi, int B, int T, int NH) {
    static_assert(HD == 64, "attention_backward_dkdv_wgmma: HD 64 (one 128-byte swizzled box a row)");
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ int red[16];
    __shared__ __align__(8) uint64_t full[3], kv;  // TMA's mbarriers: query buffer b's tile, and K with V
    constexpr int R = 128, QW = 64, NT = QW / 8, DT = HD / 8, LD = att_ld(HD);
    constexpr int KB = R * HD * (int)sizeof(floatX), QB = QW * HD * (int)sizeof(floatX);
    unsigned char* Ks = dyn_smem + (1024 - smem_addr(dyn_smem) % 1024) % 1024;
    unsigned char* Vs = Ks + KB;
    unsigned char* Qs = Vs + KB;               // [3][QB]: query tile j in Qs[j % 3]
    unsigned char* dOs = Qs + 3 * QB;          // [3][QB]
    float* lse_s = (float*)(dOs + 3 * QB);     // [3][QW], lse log2(e)
    float* dl_s = lse_s + 3 * QW;              // [3][QW]
    floatX* stage = (floatX*)(dl_s + 3 * QW);  // [2][R][LD]: dK rows, then dV rows
    AttBlock blk = att_block<HD, 1, R, QW, 8>(qkv, seg_lo, seg_hi, T, NH, red);
    WarpRange wr = warp_range<1>(blk.lo, blk.hi, blk.wrow, T);  // the keys' ranges: the queries that see them
    // at least one tile, so that no wgmma sits in a branch (see attention_forward_wgmma): keys that no query sees
    // take tile 0 fully masked (P = 0: dK = dV = 0)
    int t = threadIdx.x % 4, n = max(blk.ntiles, 1), start = blk.ntiles ? blk.start : 0;
    int qcol = blk.h * HD;  // the head's first column in qkv's Q third and in dout
    const float *lse_r = lse + ((size_t)blk.b * NH + blk.h) * T, *delta_r = delta + ((size_t)blk.b * NH + blk.h) * T;
    if (threadIdx.x == 0) {
        for (int i = 0; i < 3; i++) mbar_init(&full[i], 1);
        mbar_init(&kv, 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // K and V (two boxes of 64 rows each), tile 0, and tile 1
        mbar_arrive_expect_tx(&kv, 2 * KB);
        att_tma_tile<HD, R>(Ks, &tm_qkv, blk.C + qcol, blk.row0, blk.b, &kv);
        att_tma_tile<HD, R>(Vs, &tm_qkv, 2 * blk.C + qcol, blk.row0, blk.b, &kv);
        for (int j = 0; j < 2 && j < n; j++) {
            mbar_arrive_expect_tx(&full[j], 2 * QB);
            att_tma_tile<HD, QW>(Qs + j * QB, &tm_qkv, qcol, start + j * QW, blk.b, &full[j]);
            att_tma_tile<HD, QW>(dOs + j * QB, &tm_dout, qcol, start + j * QW, blk.b, &full[j]);
        }
    }
    att_query_stats<QW>(lse_s, dl_s, lse_r, delta_r, start, T);
    if (n > 1) att_query_stats<QW>(lse_s + QW, dl_s + QW, lse_r, delta_r, start + QW, T);
    __syncthreads();  // the stats
    mbar_wait(&kv, 0);
    mbar_wait(&full[0], 0);
    const float sl2 = 1.44269504088896341f / sqrtf((float)HD);
    float dk[DT][4] = {}, dv[DT][4] = {}, s[NT][4], dp[NT][4];
    FragA pa[QW / 16], da[QW / 16];  // P^T and dS^T as A operands: alive from the packing to the wait after their use
    FragA ka[HD / 16], va[HD / 16];  // the warp's 16 rows of K and V as A operands, for every tile
    att_wg_load_a<HD>(ka, Ks, 16 * blk.w);
    att_wg_load_a<HD>(va, Vs, 16 * blk.w);
    wgmma_fence();  // tile 0's S^T = K Q^T and dP^T = V dO^T
    att_wg_rbt<QW, HD>(&s[0][0], ka, smem_addr(Qs));
    att_wg_rbt<QW, HD>(&dp[0][0], va, smem_addr(dOs));
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operand(&s[0][0], QW / 2);
    wgmma_fence_operand(&dp[0][0], QW / 2);
    // Iteration it: S^T and dP^T of tile it are in s and dp. P^T and dS^T are formed while the tensor cores still
    // add tile it - 1's P^T dO and dS^T Q to dV and dK (FlashAttention-3's overlap inside a warpgroup); then tile
    // it + 1's S^T and dP^T and tile it's two products are issued, in that order, and the first pair waited for.
    // The last tile leaves the loop with its P^T and dS^T packed.
    for (int it = 0;; it++) {
        int qt = start + it * QW, b = it % 3;
        const float *lq = lse_s + b * QW, *dq = dl_s + b * QW;
        if (!(qt >= wr.all_lo && qt + QW <= wr.all_hi)) mask_tile<QW>(s, qt, wr, 0);
#pragma unroll
        for (int j = 0; j < NT; j++)  // P^T in s, dS^T = P^T (dP^T - delta) in dp; column c is query qt + c
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = 8 * j + 2 * t + (e & 1);
                s[j][e] = exp2f(fmaf(s[j][e], sl2, -lq[c]));
                dp[j][e] = s[j][e] * (dp[j][e] - dq[c]);
            }
        // tile it + 2's lse and delta, into the slot tile it - 1's left (every warp was done with it at the last
        // barrier); written here, they also keep the exponentials above the wait (see attention_forward_wgmma)
        if (it + 2 < n)
            att_query_stats<QW>(lse_s + (it + 2) % 3 * QW, dl_s + (it + 2) % 3 * QW, lse_r, delta_r, qt + 2 * QW, T);
        wgmma_wait_group<0>();  // tile it - 1's products are done: pa and da may be rewritten
        wgmma_fence_fragment(&pa[0].x[0], 4 * (QW / 16));
        wgmma_fence_fragment(&da[0].x[0], 4 * (QW / 16));
#pragma unroll
        for (int k = 0; k < QW / 16; k++) {
            pack_a(pa[k], s[2 * k], s[2 * k + 1]);
            pack_a(da[k], dp[2 * k], dp[2 * k + 1]);
        }
        if (it + 1 == n) break;
        __syncthreads();  // every warp has finished tile it - 1's products: its buffers take tile it + 2
        if (it + 2 < n && threadIdx.x == 0) {
            int q2 = qt + 2 * QW, b2 = (it + 2) % 3;
            mbar_arrive_expect_tx(&full[b2], 2 * QB);
            att_tma_tile<HD, QW>(Qs + b2 * QB, &tm_qkv, qcol, q2, blk.b, &full[b2]);
            att_tma_tile<HD, QW>(dOs + b2 * QB, &tm_dout, qcol, q2, blk.b, &full[b2]);
        }
        int b1 = (it + 1) % 3;
        mbar_wait(&full[b1], (it + 1) / 3 % 2);  // tile it + 1 is here
        wgmma_fence();                           // s, dp were read, pa, da written
        att_wg_rbt<QW, HD>(&s[0][0], ka, smem_addr(Qs + b1 * QB));
        att_wg_rbt<QW, HD>(&dp[0][0], va, smem_addr(dOs + b1 * QB));
        wgmma_commit_group();
        att_wg_pb<QW, HD>(&dv[0][0], pa, smem_addr(dOs + b * QB));  // dV += P^T dO
        att_wg_pb<QW, HD>(&dk[0][0], da, smem_addr(Qs + b * QB));   // dK += dS^T Q
        wgmma_commit_group();
        wgmma_wait_group<1>();  // tile it + 1's S^T and dP^T are done; dV and dK may still be computed
        wgmma_fence_operand(&s[0][0], QW / 2);
        wgmma_fence_operand(&dp[0][0], QW / 2);
        wgmma_fence_fragment(&ka[0].x[0], 4 * (HD / 16));  // (read until that wait: kept in their registers)
        wgmma_fence_fragment(&va[0].x[0], 4 * (HD / 16));
    }
    int bl = (n - 1) % 3;  // the last tile's products
    wgmma_fence();
    att_wg_pb<QW, HD>(&dv[0][0], pa, smem_addr(dOs + bl * QB));
    att_wg_pb<QW, HD>(&dk[0][0], da, smem_addr(Qs + bl * QB));
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operand(&dv[0][0], HD / 2);
    wgmma_fence_operand(&dk[0][0], HD / 2);
    floatX *Kw = stage + 16 * blk.w * LD, *Vw = stage + (R + 16 * blk.w) * LD;  // the warp's 16 rows of each
    float scale = 1.f / sqrtf((float)HD);
    att_stage<HD>(Kw, dk, scale, scale);
    att_stage<HD>(Vw, dv, 1.f, 1.f);
    __syncwarp();
    floatX* dst = dqkv + (size_t)blk.b * T * blk.C3 + (size_t)blk.h * HD;
    att_store_rows<HD>(dst + blk.C, blk.C3, Kw, blk.wrow, T);
    att_store_rows<HD>(dst + 2 * blk.C, blk.C3, Vw, blk.wrow, T);
    if (part) {  // the K and V bias gradients' partials (scratch: the query buffers, free now)
        static_assert(2 * QB >= 16 * HD * (int)sizeof(float), "att_column_sums scratch");
        __syncthreads();
        float* pk = part + ((size_t)blk.b * gridDim.x + blockIdx.x) * blk.C3 + blk.C + (size_t)blk.h * HD;
        int nrows = T - blk.row0 < R ? T - blk.row0 : R;
        att_column_sums<HD, 1, 8>(pk, stage, (float*)Qs, nrows);
        att_column_sums<HD, 1, 8>(pk + blk.C, stage + R * LD, (float*)Qs + 8 * HD, nrows);
    }
}
#endif

// ---------------------------------------------------------------------------------------------
// Launchers: one instance of each kernel per head size.
#define ATT_HEAD_SIZES "16, 32, 64 or 128"
static inline int att_head_size_ok(int HD) { return HD == 16 || HD == 32 || HD == 64 || HD == 128; }
// the kernel's dynamic shared memory, allowed once (above 48 KB, static plus dynamic, a kernel must opt in)
static inline void att_opt_in(const void* kernel, size_t bytes) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}
template <int HD>
static inline void launch_attention_forward_hd(cudaStream_t s, floatX* out, float* lse, const floatX* qkv,
                                               const int* seg_lo, const int* seg_hi, int B, int T, int NH) {
    static int done = 0;
    size_t bytes = att_forward_smem(HD);
    if (!done) att_opt_in((const void*)attention_forward<HD>, bytes), done = 1;
    launch(attention_forward<HD>, dim3(ceil_div(T, att_rows(HD, ATT_FWD)), NH, B), dim3(128), bytes, s, out, lse, qkv,
           seg_lo, seg_hi, B, T, NH);
}
// the wgmma kernels' launchers (below; HD 64, bf16)
static inline void launch_attention_backward_dq_wgmma(cudaStream_t s, floatX* dqkv, float* part, float* delta,
                                                      const floatX* dout, const floatX* qkv, const floatX* out,
                                                      const float* lse, const int* seg_lo, const int* seg_hi, int B,
                                                      int T, int NH);
static inline void launch_attention_backward_dkdv_wgmma(cudaStream_t s, floatX* dqkv, float* part, const float* delta,
                                                        const floatX* dout, const floatX* qkv, const float* lse,
                                                        const int* seg_lo, const int* seg_hi, int B, int T, int NH);
// launch_attention_backward_hd: the dQ kernel, then the dK dV kernel, each the mma.sync one or (wg's ATT_WG_DQ,
// ATT_WG_DKDV bits, HD 64 only) the wgmma one: both kinds write the same layouts (delta (B, NH, T), the
// bias partials' rows of 128 queries or keys), so either dQ kernel can run with either dK dV kernel.
template <int HD>
static inline void launch_attention_backward_hd(cudaStream_t s, floatX* dqkv, float* part, float* delta,
                                                const floatX* dout, const floatX* qkv, const floatX* out,
                                                const float* lse, const int* seg_lo, const int* seg_hi, int B, int T,
                                                int NH, int wg) {
    static int done = 0;
    size_t b1 = att_dq_smem(HD), b2 = att_dkdv_smem(HD);
    if (!done) {
        att_opt_in((const void*)attention_backward_dq<HD>, b1);
        att_opt_in((const void*)attention_backward_dkdv<HD>, b2);
        done = 1;
    }
    if (wg & ATT_WG_DQ)
        launch_attention_backward_dq_wgmma(s, dqkv, part, delta, dout, qkv, out, lse, seg_lo, seg_hi, B, T, NH);
    else
        launch(attention_backward_dq<HD>, dim3(ceil_div(T, att_rows(HD, ATT_DQ)), NH, B), dim3(128), b1, s, dqkv, part,
               delta, qkv, dout, out, lse, seg_lo, seg_hi, B, T, NH);
    if (wg & ATT_WG_DKDV)
        launch_attention_backward_dkdv_wgmma(s, dqkv, part, delta, dout, qkv, lse, seg_lo, seg_hi, B, T, NH);
    else
        launch(attention_backward_dkdv<HD>, dim3(ceil_div(T, att_rows(HD, ATT_DKDV)), NH, B), dim3(128), b2, s, dqkv,
               part, qkv, dout, lse, delta, seg_lo, seg_hi, B, T, NH);
}
static inline void att_bad_head_size(int HD) {
    fprintf(stderr, "attention: head size %d is not supported (%s)\n", HD, ATT_HEAD_SIZES);
    exit(1);
}
#ifndef MLM_FP32
// launch_attention_forward_wgmma: launch_attention_forward's results by attention_forward_wgmma (HD 64 or 128).
static inline void launch_attention_forward_wgmma(cudaStream_t s, floatX* out, float* lse, const floatX* qkv,
                                                  const int* seg_lo, const int* seg_hi, int B, int T, int NH, int HD) {
    static int done64 = 0, done128 = 0;
    CUtensorMap tm_qkv;
    if (HD == 64 || HD == 128) att_wg_map(&tm_qkv, qkv, B, T, 3 * NH * HD);
    if (HD == 64) {
        if (!done64) att_opt_in((const void*)attention_forward_wgmma<64>, att_wg_smem(64)), done64 = 1;
        launch(attention_forward_wgmma<64>, dim3(ceil_div(T, 64), NH, B), dim3(128), att_wg_smem(64), s, out, lse,
               tm_qkv, qkv, seg_lo, seg_hi, B, T, NH);
    } else if (HD == 128) {
        if (!done128) att_opt_in((const void*)attention_forward_wgmma<128>, att_wg_smem(128)), done128 = 1;
        launch(attention_forward_wgmma<128>, dim3(ceil_div(T, 64), NH, B), dim3(128), att_wg_smem(128), s, out, lse,
               tm_qkv, qkv, seg_lo, seg_hi, B, T, NH);
    } else {
        fprintf(stderr, "attention_forward_wgmma: head size %d is not supported (64 or 128)\n", HD);
        exit(1);
    }
}
// launch_attention_backward_dq_wgmma, launch_attention_backward_dkdv_wgmma: the backward's two kernels as the wgmma
// kernels (HD 64), on the grid of the mma.sync ones (128 rows a block), so the bias partials keep their rows
static_assert(att_rows(64, ATT_DQ) == 128 && att_rows(64, ATT_DKDV) == 128, "the wgmma grids: 128 rows a block");
static inline void launch_attention_backward_dq_wgmma(cudaStream_t s, floatX* dqkv, float* part, float* delta,
                                                      const floatX* dout, const floatX* qkv, const floatX* out,
                                                      const float* lse, const int* seg_lo, const int* seg_hi, int B,
                                                      int T, int NH) {
    static int done = 0;
    if (!done) att_opt_in((const void*)attention_backward_dq_wgmma<64>, att_wg_dq_smem(64)), done = 1;
    CUtensorMap tm_qkv, tm_dout;
    att_wg_map(&tm_qkv, qkv, B, T, 3 * NH * 64);
    att_wg_map(&tm_dout, dout, B, T, NH * 64);
    launch(attention_backward_dq_wgmma<64>, dim3(ceil_div(T, 128), NH, B), dim3(256), att_wg_dq_smem(64), s, dqkv, part,
           delta, tm_qkv, tm_dout, qkv, dout, out, lse, seg_lo, seg_hi, B, T, NH);
}
static inline void launch_attention_backward_dkdv_wgmma(cudaStream_t s, floatX* dqkv, float* part, const float* delta,
                                                        const floatX* dout, const floatX* qkv, const float* lse,
                                                        const int* seg_lo, const int* seg_hi, int B, int T, int NH) {
    static int done = 0;
    if (!done) att_opt_in((const void*)attention_backward_dkdv_wgmma<64>, att_wg_dkdv_smem(64)), done = 1;
    CUtensorMap tm_qkv, tm_dout;
    att_wg_map(&tm_qkv, qkv, B, T, 3 * NH * 64);
    att_wg_map(&tm_dout, dout, B, T, NH * 64);
    launch(attention_backward_dkdv_wgmma<64>, dim3(ceil_div(T, 128), NH, B), dim3(256), att_wg_dkdv_smem(64), s, dqkv,
           part, tm_qkv, tm_dout, qkv, lse, delta, seg_lo, seg_hi, B, T, NH);
}
#else  // fp32 storage: the wgmma kernels take bf16 (the trainer never asks for them: choose_attention)
static inline void att_wgmma_needs_bf16(void) {
    fprintf(stderr, "attention: the wgmma kernels need bf16 storage (this is the fp32 build)\n");
    exit(1);
}
static inline void launch_attention_forward_wgmma(cudaStream_t, floatX*, float*, const floatX*, const int*, const int*,
                                                  int, int, int, int) {
    att_wgmma_needs_bf16();
}
static inline void launch_attention_backward_dq_wgmma(cudaStream_t, floatX*, float*, float*, const floatX*,
                                                      const floatX*, const floatX*, const float*, const int*,
                                                      const int*, int, int, int) {
    att_wgmma_needs_bf16();
}
static inline void launch_attention_backward_dkdv_wgmma(cudaStream_t, floatX*, float*, const float*, const floatX*,
                                                        const floatX*, const float*, const int*, const int*, int, int,
                                                        int) {
    att_wgmma_needs_bf16();
}
#endif
// launch_attention_forward: out (B, T, C), lse (B, NH, T) from qkv (B, T, 3C) and the key ranges (B, T); with wg's
// ATT_WG_FWD bit by the wgmma kernel (HD 64 or 128, bf16).
static inline void launch_attention_forward(cudaStream_t s, floatX* out, float* lse, const floatX* qkv,
                                            const int* seg_lo, const int* seg_hi, int B, int T, int NH, int HD,
                                            int wg) {
    bench_phase(PHASE_ATTN_FWD, s);  // (until the next launcher's mark: the output projection's matmul)
    if (wg & ATT_WG_FWD) return launch_attention_forward_wgmma(s, out, lse, qkv, seg_lo, seg_hi, B, T, NH, HD);
    switch (HD) {
        case 16:
            return launch_attention_forward_hd<16>(s, out, lse, qkv, seg_lo, seg_hi, B, T, NH);
        case 32:
            return launch_attention_forward_hd<32>(s, out, lse, qkv, seg_lo, seg_hi, B, T, NH);
        case 64:
            return launch_attention_forward_hd<64>(s, out, lse, qkv, seg_lo, seg_hi, B, T, NH);
        case 128:
            return launch_attention_forward_hd<128>(s, out, lse, qkv, seg_lo, seg_hi, B, T, NH);
        default:
            att_bad_head_size(HD);
    }
}
// att_part_floats: the scratch of the backward's bias-gradient partials: a row of 3C floats for each block of the
// dQ and dK dV grids (the two grids have the same shape: B ceil(T / R) blocks per head)
static inline size_t att_part_floats(int B, int T, int C, int HD) {
    return (size_t)B * ceil_div(T, att_rows(HD, ATT_DQ)) * 3 * C;
}
// launch_attention_backward: dqkv (B, T, 3C) from dout (B, T, C); with dbias != NULL also dbias (3C) += the column
// sums of dqkv, the qkv bias gradient (each dQ and dK dV block sums its rows' columns into part, att_part_floats;
// partials_sum adds the blocks' rows in a fixed order). delta (B, NH, T) fp32 scratch: the dQ kernel writes it, the
// dK dV kernel reads it. wg's ATT_WG_DQ and ATT_WG_DKDV bits run those kernels on wgmma (HD 64, bf16).
static inline void launch_attention_backward(cudaStream_t s, floatX* dqkv, float* dbias, float* delta, float* part,
                                             const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                                             const int* seg_lo, const int* seg_hi, int B, int T, int NH, int HD,
                                             int wg) {
    bench_phase(PHASE_ATTN_BWD, s);  // (until the next launcher's mark: the qkv weight gradient's matmul)
    float* pt = dbias ? part : NULL;
    if ((wg & (ATT_WG_DQ | ATT_WG_DKDV)) && HD != 64) {
        fprintf(stderr, "attention_backward: the wgmma kernels take head size 64, not %d\n", HD);
        exit(1);
    }
    switch (HD) {
        case 16:
            launch_attention_backward_hd<16>(s, dqkv, pt, delta, dout, qkv, out, lse, seg_lo, seg_hi, B, T, NH, 0);
            break;
        case 32:
            launch_attention_backward_hd<32>(s, dqkv, pt, delta, dout, qkv, out, lse, seg_lo, seg_hi, B, T, NH, 0);
            break;
        case 64:
            launch_attention_backward_hd<64>(s, dqkv, pt, delta, dout, qkv, out, lse, seg_lo, seg_hi, B, T, NH, wg);
            break;
        case 128:
            launch_attention_backward_hd<128>(s, dqkv, pt, delta, dout, qkv, out, lse, seg_lo, seg_hi, B, T, NH, 0);
            break;
        default:
            att_bad_head_size(HD);
    }
    if (dbias) {
        int C3 = 3 * NH * HD, G = B * ceil_div(T, att_rows(HD, ATT_DQ));
        launch(partials_sum, dim3(ceil_div(C3, 32)), dim3(32, 8), 0, s, dbias, (float*)NULL, (float*)NULL,
               (const float*)part, G, C3, 1);
    }
}
