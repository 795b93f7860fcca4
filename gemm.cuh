// gemm.cuh: mlm.c's own matmul on Hopper (wgmma and TMA, sm_90a, bf16), so that the MLP's GELU can live in its
// epilogue; included at the end of kernels.cuh, whose helpers it uses. A candidate, like the wgmma attention: the
// trainer runs it with --mlp wgmma, tests/test_gemm.cu checks it against double sums and against the unfused path
// bit for bit, and tests/bench_gemm.cu times it against cuBLASLt and the GELU kernels. cuBLASLt stays the default
// until a GPU shows this faster.
//
// Why: cuBLASLt's GELU epilogues compute tanh-GELU and round where BERT does not (kernels.cuh, before blas_plan),
// so the MLP ran a matmul, then a GELU kernel over its (N, I) output: at bert-base (B = 609, ncu, 2026-11-24) that
// pass moves 3.5 GB a layer in the forward (fc1 read, GELU written) and 7.6 GB in the backward (d_fc1 and fc1 read,
// d_fc1 and GELU written): 1.2 + 2.8 ms a layer, about half of the step's "other kernels". With the epilogue here the
// forward writes fc1 and GELU(fc1 + b1) from the accumulator registers, and the backward never stores or rereads the
// matmul's d_fc1 before GELU' is applied.
//
// gemm_wgmma<EPI, TRANS_B>: D (M, N) = A (M, K) op(B), bf16 in, fp32 accumulation, A row-major (K contiguous):
//   TRANS_B 0: B (N, K) row-major, D = A B^T: a Linear's forward, out = inp W^T with W (OC, IC);
//   TRANS_B 1: B (K, N) row-major, D = A B:   its input gradient, dinp = dout W.
// and then, per element (m, n), with acc the fp32 sum and D2, X (M, N), bias (N):
//   GEMM_PLAIN: D = bf16(acc)                                          (matmul_forward, matmul_backward_input)
//   GEMM_GELU:  D = bf16(acc), D2 = bf16(GELU(D + bias))               (matmul_forward, then gelu_forward)
//   GEMM_DGELU: with x = X + bias: D = bf16(bf16(acc) GELU'(x)), D2 = bf16(GELU(x)), and part[m / 128][n] = the
//               sum of the new D (as stored) over the tile's 128 rows   (matmul_backward_input, then gelu_backward)
// The epilogues round where the unfused path does and share its GELU arithmetic (gelu_erf, gelu_erf_and_grad), so
// given the same product they write the same bits (tests/test_gemm.cu); only the bias gradient's partials are
// summed in another (fixed) order.
//
// Layout: a persistent grid (at most one block per SM, launch_gemm_wgmma), its block b taking the 128 x 128 tiles
// t = b, b + gridDim.x, ... (tile t: rows 128 (t / ntn), columns 128 (t % ntn), column tiles fastest so that the
// blocks of a wave share A's rows in L2). A block is 9 warps: warps 0-3 and 4-7 are two consumer warpgroups that
// take the block's tiles in turn (local tile i to warpgroup i % 2), warps 8-11 the producer's warpgroup, of which one
// thread works.
// Data movement:
//   - the producer's lane 0 streams each tile's k-steps (64 columns of K) through a ring of S shared stages by TMA:
//     A's 128 x 64 box (16 KB) and B's 128 x 64 (K-major) or two 64 x 64 (MN-major) boxes (16 KB), in wgmma's
//     128-byte swizzle; stage c % S of ring step c completes on full[c % S] and is refilled once the 4 warps that
//     read it have arrived on empty[c % S]. The ring runs on across the tiles, so while one warpgroup is in its
//     epilogue the producer is already filling the stages of the other's next tile (FlashAttention-3's and
//     CUTLASS's "ping-pong": one warpgroup's epilogue under the other's products);
//   - a consumer warpgroup's 128 x 128 fp32 accumulator lives in registers (128 a thread: two m64n128 wgmma
//     tiles); per stage it issues 4 k16 steps x 2 wgmma m64n128k16 from shared memory, keeps one stage's products
//     in flight (wgmma.wait_group 1) and releases the stage before;
//   - the epilogue goes from registers to global memory, 16 bytes a lane after the quad's 4 lanes exchange their
//     bf16 pairs (gemm_quad_transpose: each then holds 8 consecutive columns of a row); GEMM_DGELU's X tile (128 x
//     128 bf16, 32 KB a warpgroup) comes by TMA into shared memory, asked for by the warpgroup when its tile starts,
//     so it is there by the epilogue; its column sums go through warp shuffles and 2 KB of shared memory.
// Registers: 128 accumulators plus the epilogue's. __launch_bounds__(384, 1) starts every thread at 168; setmaxnreg
// then moves them: the producer's warpgroup drops to 40 and the consumers rise to 232 (as CUTLASS's Hopper kernels).
#pragma once

enum { GEMM_PLAIN, GEMM_GELU, GEMM_DGELU };
// which of the MLP's two passes run on gemm_wgmma (the trainer's --mlp; 0: cuBLASLt and the GELU kernels)
enum { MLP_WG_FWD = 1, MLP_WG_BWD = 2, MLP_WG_ALL = 3 };
#define GEMM_TILE 128                        // rows and columns of a tile
#define GEMM_KSTEP 64                        // columns of K a stage holds (128 bytes of bf16: the swizzle's span)
#define GEMM_THREADS 384                     // 2 consumer warpgroups and the producer's
#define GEMM_PRODUCER_REGS 40                // setmaxnreg: the producer warpgroup gives registers to the consumers
#define GEMM_CONSUMER_REGS 232               // (128 x 40 + 256 x 232 = 168 x 384)
#define GEMM_STAGE_BYTES (2 * 128 * 64 * 2)  // A's and B's boxes of one k-step
// setmaxnreg moves registers within the block's pool, what the launch gave it: 168 a thread at 384 threads (65,536 /
// 384, down to a multiple of 8: ptxas -v reports 168 for every gemm_wgmma, which their setmaxnreg needs). A
// consumer's .inc waits until the producer's .dec has freed enough, so asking for more than the pool holds hangs.
static_assert(GEMM_PRODUCER_REGS * 128 + GEMM_CONSUMER_REGS * 256 <= (65536 / GEMM_THREADS) / 8 * 8 * GEMM_THREADS,
              "gemm_wgmma: setmaxnreg asks for more registers than the block has");
// stages of the ring: 6 (192 KB), or 4 beside GEMM_DGELU's two X tiles (64 KB) and column sums (8 KB): 5 would pass
// the 227 KB a block may have
__host__ __device__ constexpr int gemm_stages(int epi) { return epi == GEMM_DGELU ? 4 : 6; }
// dynamic shared memory: 1024 bytes to align the swizzled tiles, the stages, GEMM_DGELU's X tiles
__host__ __device__ constexpr size_t gemm_smem(int epi) {
    return 1024 + (size_t)gemm_stages(epi) * GEMM_STAGE_BYTES + (epi == GEMM_DGELU ? 2 * 128 * 128 * 2 : 0);
}
// gemm_part_floats: GEMM_DGELU's partials of the bias gradient: a row of N floats per 128-row tile of M
static inline size_t gemm_part_floats(long long M, int N) { return (size_t)((M + 127) / 128) * N; }

#ifndef MLM_FP32
// gemm_pack2: two bf16 as the 32 bits of a pair (a in the low half: the lower column, as memory holds them)
__device__ inline uint32_t gemm_pack2(floatX a, floatX b) {
    __nv_bfloat162 v;
    v.x = a;
    v.y = b;
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
// gemm_quad_transpose: the 4 lanes of a quad (lanes 4 g + q, q = 0..3) exchange 4 words each, so that lane q's v[c]
// becomes what lane c's v[q] was: a 4 x 4 transpose in two butterfly steps (across q's bit 1, then its bit 0), in
// each of which a lane keeps the 2 words whose index agrees with its own bit and swaps the other 2 with its partner:
// 4 shuffles a lane. Every lane of the warp must call it (full-mask shuffles).
__device__ inline void gemm_quad_transpose(uint32_t v[4], int q) {
#pragma unroll
    for (int bit = 2; bit >= 1; bit >>= 1)
#pragma unroll
        for (int c0 = 0; c0 < 4; c0++) {
            if (c0 & bit) continue;
            int c1 = c0 | bit;
            uint32_t recv = __shfl_xor_sync(0xffffffffu, (q & bit) ? v[c0] : v[c1], bit);
            if (q & bit)
                v[c0] = recv;
            else
                v[c1] = recv;
        }
}
// gemm_store8: the 8 bf16 of v (4 pairs) at p, 16 bytes
__device__ inline void gemm_store8(floatX* p, const uint32_t v[4]) {
    Pack128 x;
    memcpy(&x, v, 16);
    store128(p, x);
}

template <int EPI, int TRANS_B>
__global__ void __launch_bounds__(GEMM_THREADS, 1)
    gemm_wgmma(floatX* D, floatX* D2, float* part, const __grid_constant__ CUtensorMap tm_a,
               const __grid_constant__ CUtensorMap tm_b, const __grid_constant__ CUtensorMap tm_x, const floatX* bias,
               int M, int N, int K) {
    constexpr int S = gemm_stages(EPI);
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ __align__(8) uint64_t full[S], empty[S];    // the ring: loaded (TMA bytes), read (4 warps' arrivals)
    __shared__ __align__(8) uint64_t order[2];             // warpgroup w's turn to start a tile's products
    __shared__ __align__(8) uint64_t xfull[2], colbar[2];  // GEMM_DGELU, per warpgroup: its X tile; its column sums
    __shared__ float colsum[2][2][4][GEMM_TILE];           // GEMM_DGELU: [warpgroup][tile parity][warp][column]
    unsigned char* ring = dyn_smem + (1024 - smem_addr(dyn_smem) % 1024) % 1024;  // stage s: A, then B, 16 KB each
    unsigned char* xtile = ring + S * GEMM_STAGE_BYTES;                           // GEMM_DGELU: [2][32 KB]
    int ntn = (N + GEMM_TILE - 1) / GEMM_TILE, tiles = (M + GEMM_TILE - 1) / GEMM_TILE * ntn;
    int nk = (K + GEMM_KSTEP - 1) / GEMM_KSTEP, b = blockIdx.x, nb = gridDim.x;
    int ntiles = b < tiles ? (tiles - b + nb - 1) / nb : 0;  // this block's tiles: b, b + nb, ...
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 4);
        }
        for (int w = 0; w < 2; w++) {
            mbar_init(&order[w], 1);
            mbar_init(&xfull[w], 1);
            mbar_init(&colbar[w], 128);
        }
        fence_mbarrier_init();
    }
    __syncthreads();
    if (warp >= 8) {  // the producer: ring step c is k-step c % nk of local tile c / nk
        setmaxnreg_dec<GEMM_PRODUCER_REGS>();
        if (warp == 8 && lane == 0)
            for (int c = 0; c < ntiles * nk; c++) {
                int s = c % S, t = b + (c / nk) * nb, k0 = (c % nk) * GEMM_KSTEP;
                int m0 = t / ntn * GEMM_TILE, n0 = t % ntn * GEMM_TILE;
                if (c >= S) mbar_wait(&empty[s], (c / S - 1) & 1);  // its last use has been read
                unsigned char *sa = ring + s * GEMM_STAGE_BYTES, *sb = sa + GEMM_STAGE_BYTES / 2;
                mbar_arrive_expect_tx(&full[s], GEMM_STAGE_BYTES);
                tma_load_2d(sa, &tm_a, k0, m0, &full[s]);
                if (TRANS_B) {
                    tma_load_2d(sb, &tm_b, n0, k0, &full[s]);
                    tma_load_2d(sb + 8192, &tm_b, n0 + 64, k0, &full[s]);
                } else {
                    tma_load_2d(sb, &tm_b, k0, n0, &full[s]);
                }
            }
        return;
    }
    setmaxnreg_inc<GEMM_CONSUMER_REGS>();
    int wg = warp / 4, wl = warp % 4, g = lane / 4, q = lane % 4;
    uint32_t ring0 = smem_addr(ring);
    for (int i = wg, u = 0; i < ntiles; i += 2, u++) {  // u: this warpgroup's tiles so far
        int t = b + i * nb, m0 = t / ntn * GEMM_TILE, n0 = t % ntn * GEMM_TILE;
        unsigned char* xs = xtile + wg * 128 * 128 * 2;
        if (EPI == GEMM_DGELU && threadIdx.x % 128 == 0) {     // its X tile, by the epilogue (the last one's reads
            mbar_arrive_expect_tx(&xfull[wg], 128 * 128 * 2);  // ended before colbar's phase u - 1 completed)
            tma_load_2d(xs, &tm_x, n0, m0, &xfull[wg]);
            tma_load_2d(xs + 16384, &tm_x, n0 + 64, m0, &xfull[wg]);
        }
        float acc[2][64];
#pragma unroll
        for (int e = 0; e < 64; e++) acc[0][e] = acc[1][e] = 0.f;
        // The ring's steps are waited for in order: tile i's only once the other warpgroup has waited for all of tile
        // i - 1's. A wait names a phase by its parity only, so a warpgroup that skipped ahead (to its stage's next
        // phase, while the stage is still in the phase before) would see the phase before complete and read a stage
        // still being loaded. This order also makes the two warpgroups take turns on the tensor cores: one's products
        // run under the other's epilogue.
        if (i > 0) mbar_wait(&order[wg], ((i - 1) / 2) & 1);
        for (int k = 0; k < nk; k++) {
            int c = i * nk + k, s = c % S;
            mbar_wait(&full[s], (c / S) & 1);
            uint32_t sa = ring0 + s * GEMM_STAGE_BYTES, sb = sa + GEMM_STAGE_BYTES / 2;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint64_t bd = TRANS_B ? sw128_desc_mnmajor(sb, 8192, ks) : sw128_desc_kmajor(sb, 16384, ks);
                wgmma_m64k16_bf16<128, TRANS_B>(acc[0], sw128_desc_kmajor(sa, 16384, ks), bd, 1);
                wgmma_m64k16_bf16<128, TRANS_B>(acc[1], sw128_desc_kmajor(sa + 8192, 16384, ks), bd, 1);
            }
            wgmma_commit_group();
            wgmma_wait_group<1>();  // the stage before is read: hand it back
            if (k > 0 && lane == 0) mbar_arrive(&empty[(c - 1) % S]);
        }
        if (threadIdx.x % 128 == 0) mbar_arrive(&order[1 - wg]);  // every stage of tile i has landed: the other's turn
        wgmma_wait_group<0>();
        wgmma_fence_operand(&acc[0][0], 128);
        if (lane == 0) mbar_arrive(&empty[(i * nk + nk - 1) % S]);
        // The epilogue. Lane (g, q) of warp wl holds acc[h][4 j + e] = element (64 h + 16 wl + g + 8 (e / 2),
        // 8 j + 2 q + e % 2) of the tile: per row, 2 columns of each 8-column block j. It computes there (rounding,
        // GELU, GELU'), then for each group of 4 blocks (j = 4 k + c) the quad transposes its bf16 pairs, so that lane
        // q holds the 8 columns of block 4 k + q and stores them as 16 bytes: a warp's store covers 8 rows x 64
        // bytes, whole 32-byte sectors.
        if (EPI == GEMM_DGELU) mbar_wait(&xfull[wg], u & 1);
        // ptxas cannot tell that the lanes leave mbar_wait's spin loop together: without this __syncwarp it added a
        // second copy of the epilogue below for a warp that arrives diverged (BRA.DIV to WARPSYNC.COLLECTIVE ...
        // ENDCOLLECTIVE around each shuffle): never run, but as long as the epilogue itself
        __syncwarp();
#pragma unroll  // (acc's indices must be constants: registers)
        for (int k = 0; k < 4; k++) {
            float sum[4][2];    // GEMM_DGELU: per block c of the group, the column sums of the lane's rows
            float bias2[4][2];  // the bias of the lane's two columns in each block c of the group (rows share it)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int col = n0 + 8 * (4 * k + c) + 2 * q;
                sum[c][0] = sum[c][1] = bias2[c][0] = bias2[c][1] = 0.f;
                if (EPI != GEMM_PLAIN && col < N) {
                    __nv_bfloat162 bb = *(const __nv_bfloat162*)(bias + col);
                    bias2[c][0] = tof(bb.x), bias2[c][1] = tof(bb.y);
                }
            }
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    int rt = 64 * h + 16 * wl + g + 8 * r, row = m0 + rt;  // rt: the row in the tile
                    bool in = row < M;
                    uint32_t w1[4], w2[4];  // D's and D2's pairs of blocks 4 k + c, then (transposed) of 4 k + q
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        int j = 4 * k + c;
                        float b0 = bias2[c][0], b1 = bias2[c][1];
                        floatX d0 = fromf(acc[h][4 * j + 2 * r]), d1 = fromf(acc[h][4 * j + 2 * r + 1]);
                        if (EPI == GEMM_PLAIN) {
                            w1[c] = gemm_pack2(d0, d1);
                        } else if (EPI == GEMM_GELU) {
                            w1[c] = gemm_pack2(d0, d1);
                            w2[c] = gemm_pack2(fromf(gelu_erf(tof(d0) + b0)), fromf(gelu_erf(tof(d1) + b1)));
                        } else {
                            __nv_bfloat162 x = *(const __nv_bfloat162*)(xs + sw128_off(16384, rt, 8 * j + 2 * q));
                            float y0, y1, dy0, dy1;
                            gelu_erf_and_grad(tof(x.x) + b0, &y0, &dy0);
                            gelu_erf_and_grad(tof(x.y) + b1, &y1, &dy1);
                            floatX g0 = fromf(tof(d0) * dy0), g1 = fromf(tof(d1) * dy1);
                            w1[c] = gemm_pack2(g0, g1);
                            w2[c] = gemm_pack2(fromf(y0), fromf(y1));
                            sum[c][0] += tof(g0);  // (a row past M: A and X came as zeros, so g is +-0: adds nothing)
                            sum[c][1] += tof(g1);
                        }
                    }
                    gemm_quad_transpose(w1, q);
                    if (EPI != GEMM_PLAIN) gemm_quad_transpose(w2, q);
                    int col8 = n0 + 8 * (4 * k + q);  // N is a multiple of 8: a block is all in or all out
                    if (in && col8 < N) {
                        gemm_store8(D + (size_t)row * N + col8, w1);
                        if (EPI != GEMM_PLAIN) gemm_store8(D2 + (size_t)row * N + col8, w2);
                    }
                }
            if (EPI == GEMM_DGELU)  // the warp's 32 rows: the 8 lanes of a column pair (g = 0..7), a butterfly
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    for (int o = 4; o < 32; o <<= 1) {
                        sum[c][0] += __shfl_xor_sync(0xffffffffu, sum[c][0], o);
                        sum[c][1] += __shfl_xor_sync(0xffffffffu, sum[c][1], o);
                    }
                    if (g == 0) {
                        colsum[wg][u & 1][wl][8 * (4 * k + c) + 2 * q] = sum[c][0];
                        colsum[wg][u & 1][wl][8 * (4 * k + c) + 2 * q + 1] = sum[c][1];
                    }
                }
        }
        if (EPI == GEMM_DGELU) {  // the warpgroup's 4 warps in order: thread c of the group sums column c
            mbar_arrive(&colbar[wg]);
            mbar_wait(&colbar[wg], u & 1);
            int c = threadIdx.x % 128;
            float s = 0.f;
            for (int w = 0; w < 4; w++) s += colsum[wg][u & 1][w][c];
            if (n0 + c < N) part[(size_t)(m0 / GEMM_TILE) * N + n0 + c] = s;
        }
    }
}

// gemm_map: the TMA tensor map of a row-major (rows, cols) bf16 matrix, boxes of 64 columns x box_rows rows in the
// 128-byte swizzle (elements outside the matrix come as zeros).
static inline void gemm_map(CUtensorMap* map, const floatX* x, int rows, int cols, int box_rows) {
    uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows}, strides[1] = {2 * (uint64_t)cols};
    uint32_t box[2] = {64, (uint32_t)box_rows};
    tma_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, 2, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}
#endif

// gemm_wgmma_refusal: why launch_gemm_wgmma cannot take these operands (NULL: it can). TMA reads rows whose byte
// stride is a multiple of 16 from 16-byte aligned addresses, and the epilogue writes column pairs.
static inline const char* gemm_wgmma_refusal(int epi, int trans_b, int M, int N, int K, const void* const* ptrs,
                                             int nptrs) {
    if (sizeof(floatX) != 2) return "it needs bf16 storage (this is the fp32 build)";
    if (M <= 0 || N <= 0 || K <= 0) return "M, N and K must be positive";
    if (N % 8 || K % 8) return "N and K must be multiples of 8 (TMA's 16-byte row strides)";
    if ((epi == GEMM_GELU && trans_b) || (epi == GEMM_DGELU && !trans_b))
        return "the GELU epilogue takes B (N, K) (the forward), the GELU' one B (K, N) (the input gradient)";
    for (int i = 0; i < nptrs; i++)
        if ((uintptr_t)ptrs[i] % 16) return "every matrix must start 16-byte aligned";
    return NULL;
}

// launch_gemm_wgmma: D (M, N) = A (M, K) op(B) with epilogue epi (gemm_wgmma), B (N, K) (trans_b 0) or (K, N)
// (trans_b 1); GEMM_GELU and GEMM_DGELU read bias (N), GEMM_DGELU reads X (M, N) and adds the column sums of the new
// D to dbias (N, fp32) through part (gemm_part_floats(M, N)). blocks: the grid (0: one block per SM).
static inline void launch_gemm_wgmma(cudaStream_t s, int epi, int trans_b, floatX* D, floatX* D2, float* dbias,
                                     float* part, const floatX* A, const floatX* B, const floatX* X, const floatX* bias,
                                     int M, int N, int K, int blocks) {
    const void* ptrs[] = {D, D2, A, B, X, bias, part};
    const char* why = gemm_wgmma_refusal(epi, trans_b, M, N, K, ptrs, 7);
    if (why) {
        fprintf(stderr, "gemm_wgmma: M %d, N %d, K %d: %s\n", M, N, K, why);
        exit(1);
    }
#ifndef MLM_FP32
    static int sms = 0;
    static size_t done[6] = {0, 0, 0, 0, 0, 0};  // per kernel: [2 epi + trans_b]
    if (!sms) CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    int tiles = ceil_div(M, GEMM_TILE) * ceil_div(N, GEMM_TILE), grid = blocks > 0 ? blocks : sms;
    grid = grid < tiles ? grid : tiles;
    CUtensorMap tm_a, tm_b, tm_x;
    gemm_map(&tm_a, A, M, K, 128);
    if (trans_b)
        gemm_map(&tm_b, B, K, N, 64);
    else
        gemm_map(&tm_b, B, N, K, 128);
    tm_x = tm_a;  // (unread unless GEMM_DGELU)
    if (epi == GEMM_DGELU) gemm_map(&tm_x, X, M, N, 128);
    float* pt = epi == GEMM_DGELU ? part : NULL;
#define GEMM_LAUNCH(E, TB)                                                                                            \
    do {                                                                                                              \
        kernel_opt_in((const void*)gemm_wgmma<E, TB>, gemm_smem(E), &done[2 * E + TB]);                               \
        launch(gemm_wgmma<E, TB>, dim3(grid), dim3(GEMM_THREADS), gemm_smem(E), s, D, D2, pt, tm_a, tm_b, tm_x, bias, \
               M, N, K);                                                                                              \
    } while (0)
    if (epi == GEMM_GELU)
        GEMM_LAUNCH(GEMM_GELU, 0);
    else if (epi == GEMM_DGELU)
        GEMM_LAUNCH(GEMM_DGELU, 1);
    else if (trans_b)
        GEMM_LAUNCH(GEMM_PLAIN, 1);
    else
        GEMM_LAUNCH(GEMM_PLAIN, 0);
#undef GEMM_LAUNCH
    if (epi == GEMM_DGELU)
        launch(partials_sum, dim3(ceil_div(N, 32)), dim3(32, 8), 0, s, dbias, (float*)NULL, (float*)NULL,
               (const float*)part, ceil_div(M, GEMM_TILE), N, 1);
#endif
}
