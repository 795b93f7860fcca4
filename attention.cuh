// attention.cuh: the attention kernels of mlm.c (included at the end of kernels.cuh, whose helpers they use).
#pragma once

// ---------------------------------------------------------------------------------------------
// Attention: bidirectional, flash-style on tensor cores. The (T x T) scores never reach global memory:
// the forward keeps a running (max, sum) per query row and the backward recomputes the scores.
//
// qkv (B, T, 3C): token (b, t) holds Q | K | V, each C = NH * HD wide with head h at columns [h HD, (h+1) HD).
// Masking: query (b, i) attends to the keys j with seg_lo[b, i] <= j < seg_hi[b, i], its own sample in a
// packed row (the ranges are segments: every token of a sample has the same range). Padding tokens have
// seg_lo == seg_hi: they attend to nothing, and their output, lse and gradients are 0.
// Scale 1 / sqrt(HD). Tiles: 64 query rows and 64 keys; a block is 4 warps, each owning 16 rows of the
// block's tile; the warp's (16 x 64) products run as WMMA m16n16k16 bf16 -> fp32 (a scalar loop in fp32
// mode), staged through shared memory (row stride padded by 8 elements against bank conflicts).

#define ATT_TILE 64
struct AttLayout {  // byte offsets into dynamic shared memory
    int ldx, lds, ldp,
        ldo;  // row strides (elements): floatX tiles, fp32 scores, floatX probabilities, fp32 accumulators
    size_t t0, t1, t2, t3, s0, s1, p0, p1, o0, o1, bytes;
};
__host__ __device__ inline size_t att_round(size_t x) { return (x + 127) & ~(size_t)127; }
// kind 0: forward (Q K V tiles, S, P, O); 1: dQ (Q dO K V, S dP, dS, dQ); 2: dK dV (K V Q dO, S dP, P dS, dK dV)
__host__ __device__ inline AttLayout att_layout(int HD, int kind) {
    AttLayout L;
    L.ldx = HD + 8;
    L.lds = ATT_TILE + 4;
    L.ldp = ATT_TILE + 8;
    L.ldo = HD + 4;
    size_t tile = att_round((size_t)ATT_TILE * L.ldx * sizeof(floatX)), sf = att_round((size_t)ATT_TILE * L.lds * 4),
           pf = att_round((size_t)ATT_TILE * L.ldp * sizeof(floatX)), of = att_round((size_t)ATT_TILE * L.ldo * 4);
    size_t o = 0;
    L.t0 = o;
    o += tile;
    L.t1 = o;
    o += tile;
    L.t2 = o;
    o += tile;
    L.t3 = o;
    if (kind) o += tile;
    L.s0 = o;
    o += sf;
    L.s1 = o;
    if (kind) o += sf;
    L.p0 = o;
    o += pf;
    L.p1 = o;
    if (kind == 2) o += pf;
    L.o0 = o;
    o += of;
    L.o1 = o;
    if (kind == 2) o += of;
    L.bytes = o + 128;  // slack: the kernels align their base to 128 bytes (WMMA needs 32-byte aligned tiles)
    return L;
}
// the 128-byte aligned start of the dynamic shared memory (it follows the static shared memory, which
// only guarantees 16-byte alignment)
__device__ inline unsigned char* att_smem_base(unsigned char* p) {
    return (unsigned char*)(((uintptr_t)p + 127) & ~(uintptr_t)127);
}

// warp_mm: C (16 x N, fp32, row stride ldc) = [C +] A (16 x K, row-major) . B (K x N), where
// B[k][n] = Bm[n * ldb + k] when BT (B stored transposed, e.g. K rows for Q K^T) else Bm[k * ldb + n].
// Called by all 32 lanes of a warp. K, N multiples of 16.
template <bool BT>
__device__ inline void warp_mm(float* C, int ldc, const __nv_bfloat16* A, int lda, const __nv_bfloat16* Bm, int ldb,
                               int K, int N, bool acc) {
    using namespace nvcuda;
    for (int n0 = 0; n0 < N; n0 += 16) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
        if (acc)
            wmma::load_matrix_sync(c, C + n0, ldc, wmma::mem_row_major);
        else
            wmma::fill_fragment(c, 0.f);
        for (int k0 = 0; k0 < K; k0 += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
            wmma::load_matrix_sync(a, A + k0, lda);
            if constexpr (BT) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
                wmma::load_matrix_sync(b, Bm + (size_t)n0 * ldb + k0, ldb);
                wmma::mma_sync(c, a, b, c);
            } else {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
                wmma::load_matrix_sync(b, Bm + (size_t)k0 * ldb + n0, ldb);
                wmma::mma_sync(c, a, b, c);
            }
        }
        wmma::store_matrix_sync(C + n0, c, ldc, wmma::mem_row_major);
    }
}
template <bool BT>
__device__ inline void warp_mm(float* C, int ldc, const float* A, int lda, const float* Bm, int ldb, int K, int N,
                               bool acc) {  // fp32 mode: exact fp32 FMAs, lanes over the 16 x N outputs
    for (int idx = threadIdx.x % 32; idx < 16 * N; idx += 32) {
        int r = idx / N, n = idx % N;
        float s = acc ? C[r * ldc + n] : 0.f;
        for (int k = 0; k < K; k++) s += A[r * lda + k] * (BT ? Bm[(size_t)n * ldb + k] : Bm[(size_t)k * ldb + n]);
        C[r * ldc + n] = s;
    }
}

// att_load_tile: a block copies rows [row0, row0 + 64) x [0, HD) of src (row stride `stride`) into a
// shared tile (row stride ldx), zeros for rows >= T. 128-bit loads.
__device__ inline void att_load_tile(floatX* dst, int ldx, const floatX* src, size_t stride, int row0, int T, int HD) {
    int per = HD / X128;
    for (int i = threadIdx.x; i < ATT_TILE * per; i += blockDim.x) {
        int r = i / per, c = (i % per) * X128;
        Pack128 v;
        if (row0 + r < T)
            v = load128(src + (size_t)(row0 + r) * stride + c);
        else
            for (int k = 0; k < X128; k++) v.v[k] = fromf(0.f);
        store128(dst + r * ldx + c, v);
    }
}
// att_range: [lo, hi), the union of the key ranges of rows [row0, row0 + 64) (empty: lo > hi). Block-wide.
__device__ inline void att_range(const int* seg_lo, const int* seg_hi, int row0, int T, int* red, int* lo, int* hi) {
    int i = row0 + (threadIdx.x & 63), l = 0x7fffffff, h = -1;
    if (i < T && seg_hi[i] > seg_lo[i]) {
        l = seg_lo[i];
        h = seg_hi[i];
    }
    for (int o = 16; o > 0; o >>= 1) {
        int lo2 = __shfl_xor_sync(0xffffffffu, l, o), hi2 = __shfl_xor_sync(0xffffffffu, h, o);
        l = lo2 < l ? lo2 : l;
        h = hi2 > h ? hi2 : h;
    }
    __syncthreads();  // red may still be read from a previous call
    if (threadIdx.x % 32 == 0) {
        red[threadIdx.x / 32] = l;
        red[4 + threadIdx.x / 32] = h;
    }
    __syncthreads();
    *lo = red[0];
    *hi = red[4];
    for (int k = 1; k < 4; k++) {
        *lo = red[k] < *lo ? red[k] : *lo;
        *hi = red[4 + k] > *hi ? red[4 + k] : *hi;
    }
}

// attention_forward: out (B, T, C) = softmax(Q K^T / sqrt(HD) + mask) V per head; lse (B, NH, T) =
// the log-sum-exp of each query row's scaled, masked scores (0 for padding queries).
// Grid (ceil(T / 64), NH, B), block 128 = 4 warps x 16 query rows. For each 64-key tile inside the
// block's key range: S = Q K^T (WMMA) into shared memory; two lanes per query row update the running
// max m and sum l, write P = exp(S - m) as floatX and rescale the row of O by exp(m_old - m);
// then O += P V (WMMA, the accumulator reloaded from shared memory). Finally out = O / l.
__global__ void __launch_bounds__(128) attention_forward(floatX* out, float* lse, const floatX* qkv, const int* seg_lo,
                                                         const int* seg_hi, int B, int T, int NH, int HD) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ int red[8];
    AttLayout L = att_layout(HD, 0);
    unsigned char* sm = att_smem_base(dyn_smem);
    floatX *Qs = (floatX*)(sm + L.t0), *Ks = (floatX*)(sm + L.t1), *Vs = (floatX*)(sm + L.t2);
    float *S = (float*)(sm + L.s0), *O = (float*)(sm + L.o0);
    floatX* P = (floatX*)(sm + L.p0);
    int q0 = blockIdx.x * ATT_TILE, h = blockIdx.y, b = blockIdx.z, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int C = NH * HD;
    size_t C3 = (size_t)3 * C;
    const floatX* base = qkv + (size_t)b * T * C3 + (size_t)h * HD;
    const int *lo = seg_lo + (size_t)b * T, *hi = seg_hi + (size_t)b * T;
    att_load_tile(Qs, L.ldx, base, C3, q0, T, HD);
    for (int i = threadIdx.x; i < ATT_TILE * L.ldo; i += blockDim.x) O[i] = 0.f;
    int klo, khi;
    att_range(lo, hi, q0, T, red, &klo, &khi);
    int r = lane >> 1, half = lane & 1, qi = q0 + 16 * w + r;  // this lane's query row and half of the columns
    int my_lo = qi < T ? lo[qi] : 0, my_hi = qi < T ? hi[qi] : 0;
    float m_run = -INFINITY, l_run = 0.f, scale = rsqrtf((float)HD);
    float* Sw = S + 16 * w * L.lds;
    floatX* Pw = P + 16 * w * L.ldp;
    float* Ow = O + 16 * w * L.ldo;
    const floatX* Qw = Qs + 16 * w * L.ldx;
    for (int kt = klo / ATT_TILE * ATT_TILE; kt < khi; kt += ATT_TILE) {
        __syncthreads();  // the previous tile's K, V are no longer read
        att_load_tile(Ks, L.ldx, base + C, C3, kt, T, HD);
        att_load_tile(Vs, L.ldx, base + 2 * C, C3, kt, T, HD);
        __syncthreads();
        warp_mm<true>(Sw, L.lds, Qw, L.ldx, Ks, L.ldx, HD, ATT_TILE, false);
        __syncwarp();
        float* srow = Sw + r * L.lds;
        float mx = -INFINITY;
        for (int c = half * 32; c < half * 32 + 32; c++) {
            int j = kt + c;
            float v = (j >= my_lo && j < my_hi) ? srow[c] * scale : -INFINITY;
            srow[c] = v;
            mx = fmaxf(mx, v);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float m_new = fmaxf(m_run, mx), sum = 0.f;
        for (int c = half * 32; c < half * 32 + 32; c++) {
            float p = m_new == -INFINITY ? 0.f : expf(srow[c] - m_new);
            Pw[r * L.ldp + c] = fromf(p);
            sum += p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        float alpha = m_run == -INFINITY ? 0.f : expf(m_run - m_new);
        l_run = l_run * alpha + sum;
        m_run = m_new;
        for (int d = half * (HD / 2); d < (half + 1) * (HD / 2); d++) Ow[r * L.ldo + d] *= alpha;
        __syncwarp();
        warp_mm<false>(Ow, L.ldo, Pw, L.ldp, Vs, L.ldx, ATT_TILE, HD, true);
        __syncwarp();
    }
    if (qi < T) {
        float inv = l_run > 0.f ? 1.f / l_run : 0.f;
        floatX* o = out + ((size_t)b * T + qi) * C + (size_t)h * HD;
        for (int d = half * (HD / 2); d < (half + 1) * (HD / 2); d += X128) {
            Pack128 v;
            for (int k = 0; k < X128; k++) v.v[k] = fromf(Ow[r * L.ldo + d + k] * inv);
            store128(o + d, v);
        }
        if (!half) lse[((size_t)b * NH + h) * T + qi] = l_run > 0.f ? m_run + logf(l_run) : 0.f;
    }
}

// attention_backward_delta: delta[b, h, t] = sum_d dout[b, t, h, d] * out[b, t, h, d] (= rowsum(P * dP)),
// the softmax-backward term of each query row. One thread per (token, head), 128-bit loads.
__global__ void attention_backward_delta(float* delta, const floatX* dout, const floatX* out, int B, int T, int NH,
                                         int HD) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * T * NH) return;
    int h = idx % NH, n = idx / NH, b = n / T, t = n % T;
    size_t off = (size_t)n * NH * HD + (size_t)h * HD;
    float s = 0.f;
    for (int d = 0; d < HD; d += X128) {
        Pack128 g = load128(dout + off + d), o = load128(out + off + d);
        for (int k = 0; k < X128; k++) s += tof(g.v[k]) * tof(o.v[k]);
    }
    delta[((size_t)b * NH + h) * T + t] = s;
}

// attention_backward_dq: dQ = scale * dS K with dS = P * (dP - delta), P = exp(scale Q K^T - lse) (masked),
// dP = dO V^T, written into the Q columns of dqkv (B, T, 3C).
// Grid (ceil(T / 64), NH, B), block 128 = 4 warps x 16 query rows; per 64-key tile in range:
// S = Q K^T and dP = dO V^T (WMMA), two lanes per row form dS (floatX), then dQ += dS K (WMMA).
__global__ void __launch_bounds__(128)
    attention_backward_dq(floatX* dqkv, const floatX* qkv, const floatX* dout, const float* lse, const float* delta,
                          const int* seg_lo, const int* seg_hi, int B, int T, int NH, int HD) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ int red[8];
    AttLayout L = att_layout(HD, 1);
    unsigned char* sm = att_smem_base(dyn_smem);
    floatX *Qs = (floatX*)(sm + L.t0), *dOs = (floatX*)(sm + L.t1), *Ks = (floatX*)(sm + L.t2),
           *Vs = (floatX*)(sm + L.t3), *dS = (floatX*)(sm + L.p0);
    float *S = (float*)(sm + L.s0), *dP = (float*)(sm + L.s1), *dQ = (float*)(sm + L.o0);
    int q0 = blockIdx.x * ATT_TILE, h = blockIdx.y, b = blockIdx.z, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int C = NH * HD;
    size_t C3 = (size_t)3 * C;
    const floatX* base = qkv + (size_t)b * T * C3 + (size_t)h * HD;
    const int *lo = seg_lo + (size_t)b * T, *hi = seg_hi + (size_t)b * T;
    att_load_tile(Qs, L.ldx, base, C3, q0, T, HD);
    att_load_tile(dOs, L.ldx, dout + (size_t)b * T * C + (size_t)h * HD, C, q0, T, HD);
    for (int i = threadIdx.x; i < ATT_TILE * L.ldo; i += blockDim.x) dQ[i] = 0.f;
    int klo, khi;
    att_range(lo, hi, q0, T, red, &klo, &khi);
    int r = lane >> 1, half = lane & 1, qi = q0 + 16 * w + r;
    int my_lo = qi < T ? lo[qi] : 0, my_hi = qi < T ? hi[qi] : 0;
    size_t srow_idx = ((size_t)b * NH + h) * T + qi;
    float my_lse = qi < T ? lse[srow_idx] : 0.f, my_delta = qi < T ? delta[srow_idx] : 0.f;
    float scale = rsqrtf((float)HD);
    float *Sw = S + 16 * w * L.lds, *dPw = dP + 16 * w * L.lds, *dQw = dQ + 16 * w * L.ldo;
    floatX* dSw = dS + 16 * w * L.ldp;
    for (int kt = klo / ATT_TILE * ATT_TILE; kt < khi; kt += ATT_TILE) {
        __syncthreads();
        att_load_tile(Ks, L.ldx, base + C, C3, kt, T, HD);
        att_load_tile(Vs, L.ldx, base + 2 * C, C3, kt, T, HD);
        __syncthreads();
        warp_mm<true>(Sw, L.lds, Qs + 16 * w * L.ldx, L.ldx, Ks, L.ldx, HD, ATT_TILE, false);
        warp_mm<true>(dPw, L.lds, dOs + 16 * w * L.ldx, L.ldx, Vs, L.ldx, HD, ATT_TILE, false);
        __syncwarp();
        for (int c = half * 32; c < half * 32 + 32; c++) {
            int j = kt + c;
            float p = (j >= my_lo && j < my_hi) ? expf(Sw[r * L.lds + c] * scale - my_lse) : 0.f;
            dSw[r * L.ldp + c] = fromf(p * (dPw[r * L.lds + c] - my_delta));
        }
        __syncwarp();
        warp_mm<false>(dQw, L.ldo, dSw, L.ldp, Ks, L.ldx, ATT_TILE, HD, true);
        __syncwarp();
    }
    if (qi < T) {
        floatX* o = dqkv + ((size_t)b * T + qi) * C3 + (size_t)h * HD;
        for (int d = half * (HD / 2); d < (half + 1) * (HD / 2); d += X128) {
            Pack128 v;
            for (int k = 0; k < X128; k++) v.v[k] = fromf(dQw[r * L.ldo + d + k] * scale);
            store128(o + d, v);
        }
    }
}

// attention_backward_dkdv: dV = P^T dO and dK = scale * dS^T Q for the block's 64 keys, written into the
// K and V columns of dqkv (B, T, 3C) (zeros for keys no query attends to).
// Grid (ceil(T / 64), NH, B), block 128 = 4 warps x 16 keys. The queries that attend to the block's keys
// are those of the keys' samples (ranges are segments), so the block visits the query tiles of the union of
// its keys' ranges. Per query tile: S^T = K Q^T and dP^T = V dO^T (WMMA), two lanes per key row form P^T
// and dS^T = P^T * (dP^T - delta) (floatX), then dV += P^T dO and dK += dS^T Q (WMMA).
__global__ void __launch_bounds__(128)
    attention_backward_dkdv(floatX* dqkv, const floatX* qkv, const floatX* dout, const float* lse, const float* delta,
                            const int* seg_lo, const int* seg_hi, int B, int T, int NH, int HD) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ int red[8], q_lo[ATT_TILE], q_hi[ATT_TILE];
    __shared__ float q_lse[ATT_TILE], q_delta[ATT_TILE];
    AttLayout L = att_layout(HD, 2);
    unsigned char* sm = att_smem_base(dyn_smem);
    floatX *Ks = (floatX*)(sm + L.t0), *Vs = (floatX*)(sm + L.t1), *Qs = (floatX*)(sm + L.t2),
           *dOs = (floatX*)(sm + L.t3), *PT = (floatX*)(sm + L.p0), *dST = (floatX*)(sm + L.p1);
    float *ST = (float*)(sm + L.s0), *dPT = (float*)(sm + L.s1), *dK = (float*)(sm + L.o0), *dV = (float*)(sm + L.o1);
    int k0 = blockIdx.x * ATT_TILE, h = blockIdx.y, b = blockIdx.z, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int C = NH * HD;
    size_t C3 = (size_t)3 * C;
    const floatX* base = qkv + (size_t)b * T * C3 + (size_t)h * HD;
    const floatX* dbase = dout + (size_t)b * T * C + (size_t)h * HD;
    const int *lo = seg_lo + (size_t)b * T, *hi = seg_hi + (size_t)b * T;
    const float *lse_b = lse + ((size_t)b * NH + h) * T, *delta_b = delta + ((size_t)b * NH + h) * T;
    att_load_tile(Ks, L.ldx, base + C, C3, k0, T, HD);
    att_load_tile(Vs, L.ldx, base + 2 * C, C3, k0, T, HD);
    for (int i = threadIdx.x; i < ATT_TILE * L.ldo; i += blockDim.x) {
        dK[i] = 0.f;
        dV[i] = 0.f;
    }
    int qlo, qhi;
    att_range(lo, hi, k0, T, red, &qlo, &qhi);
    int r = lane >> 1, half = lane & 1, j = k0 + 16 * w + r;  // this lane's key row
    float scale = rsqrtf((float)HD);
    float *STw = ST + 16 * w * L.lds, *dPTw = dPT + 16 * w * L.lds, *dKw = dK + 16 * w * L.ldo,
          *dVw = dV + 16 * w * L.ldo;
    floatX *PTw = PT + 16 * w * L.ldp, *dSTw = dST + 16 * w * L.ldp;
    for (int qt = qlo / ATT_TILE * ATT_TILE; qt < qhi; qt += ATT_TILE) {
        __syncthreads();
        att_load_tile(Qs, L.ldx, base, C3, qt, T, HD);
        att_load_tile(dOs, L.ldx, dbase, C, qt, T, HD);
        if (threadIdx.x < ATT_TILE) {
            int i = qt + threadIdx.x, ok = i < T;
            q_lo[threadIdx.x] = ok ? lo[i] : 0;
            q_hi[threadIdx.x] = ok ? hi[i] : 0;
            q_lse[threadIdx.x] = ok ? lse_b[i] : 0.f;
            q_delta[threadIdx.x] = ok ? delta_b[i] : 0.f;
        }
        __syncthreads();
        warp_mm<true>(STw, L.lds, Ks + 16 * w * L.ldx, L.ldx, Qs, L.ldx, HD, ATT_TILE, false);
        warp_mm<true>(dPTw, L.lds, Vs + 16 * w * L.ldx, L.ldx, dOs, L.ldx, HD, ATT_TILE, false);
        __syncwarp();
        for (int c = half * 32; c < half * 32 + 32; c++) {
            float p = (j >= q_lo[c] && j < q_hi[c]) ? expf(STw[r * L.lds + c] * scale - q_lse[c]) : 0.f;
            PTw[r * L.ldp + c] = fromf(p);
            dSTw[r * L.ldp + c] = fromf(p * (dPTw[r * L.lds + c] - q_delta[c]));
        }
        __syncwarp();
        warp_mm<false>(dVw, L.ldo, PTw, L.ldp, dOs, L.ldx, ATT_TILE, HD, true);
        warp_mm<false>(dKw, L.ldo, dSTw, L.ldp, Qs, L.ldx, ATT_TILE, HD, true);
        __syncwarp();
    }
    if (j < T) {
        floatX* o = dqkv + ((size_t)b * T + j) * C3 + (size_t)h * HD;
        for (int d = half * (HD / 2); d < (half + 1) * (HD / 2); d += X128) {
            Pack128 vk, vv;
            for (int k = 0; k < X128; k++) {
                vk.v[k] = fromf(dKw[r * L.ldo + d + k] * scale);
                vv.v[k] = fromf(dVw[r * L.ldo + d + k]);
            }
            store128(o + C + d, vk);
            store128(o + 2 * C + d, vv);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Launchers
static inline void launch_attention_forward(cudaStream_t s, floatX* out, float* lse, const floatX* qkv,
                                            const int* seg_lo, const int* seg_hi, int B, int T, int NH, int HD) {
    static size_t done = 0;
    size_t bytes = att_layout(HD, 0).bytes;
    attention_opt_in((const void*)attention_forward, bytes, &done);
    launch(attention_forward, dim3(ceil_div(T, ATT_TILE), NH, B), dim3(128), bytes, s, out, lse, qkv, seg_lo, seg_hi, B,
           T, NH, HD);
}
// launch_attention_backward: dqkv (B, T, 3C) from dout (B, T, C); delta (B, NH, T) fp32 scratch.
static inline void launch_attention_backward(cudaStream_t s, floatX* dqkv, float* delta, const floatX* dout,
                                             const floatX* qkv, const floatX* out, const float* lse, const int* seg_lo,
                                             const int* seg_hi, int B, int T, int NH, int HD) {
    static size_t done_dq = 0, done_dkdv = 0;
    launch(attention_backward_delta, dim3(ceil_div((long long)B * T * NH, 256)), dim3(256), 0, s, delta, dout, out, B,
           T, NH, HD);
    size_t b1 = att_layout(HD, 1).bytes, b2 = att_layout(HD, 2).bytes;
    attention_opt_in((const void*)attention_backward_dq, b1, &done_dq);
    attention_opt_in((const void*)attention_backward_dkdv, b2, &done_dkdv);
    dim3 grid(ceil_div(T, ATT_TILE), NH, B);
    launch(attention_backward_dq, grid, dim3(128), b1, s, dqkv, qkv, dout, lse, delta, seg_lo, seg_hi, B, T, NH, HD);
    launch(attention_backward_dkdv, grid, dim3(128), b2, s, dqkv, qkv, dout, lse, delta, seg_lo, seg_hi, B, T, NH, HD);
}
