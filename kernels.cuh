// kernels.cuh: the GPU arithmetic of mlm.c. Every kernel the trainer runs is defined here,
// and the same source runs on an H100 (nvcc) and on the CPU runtime in cpu/ (g++).
#pragma once
#include <cuda_runtime.h>  // the CUDA runtime (on the CPU build: cpu/include/cuda_runtime.h, the emulator)
#include <cuda_bf16.h>     // __nv_bfloat16 and its conversions

// launch(kernel, grid, block, smem_bytes, stream, args...): the one way a kernel is started.
// Under nvcc it is kernel<<<grid, block, smem_bytes, stream>>>(args...). g++ cannot parse <<<>>>,
// so the CPU runtime defines launch() itself (cpu/include/cuda_runtime.h); this is the only place
// above cpu/ that looks at which compiler is running, and it selects syntax, not behaviour.
#ifdef __CUDACC__
template <typename... KArgs, typename... Args>
static inline void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                          Args... args) {
    kernel<<<grid, block, smem_bytes, stream>>>(args...);
}
#else
#undef __maxnreg__
#define __maxnreg__(n)  // (a kernel's register cap for ptxas: g++ has nothing to cap)
#endif

#include <cudaTypedefs.h>  // CUtensorMap, PFN_cuTensorMapEncodeTiled (types only: tma_map gets the driver's
                           // function from the runtime)
#include <cublasLt.h>      // matmuls (on the CPU build: cpu/cublas.cpp implements the same API)
#include <mma.h>           // WMMA tensor-core fragments (on the CPU build: cpu/include/mma.h)
#include <ptx.h>           // cp.async, mma.sync, ldmatrix, wgmma (GPU: gpu/ptx.h, inline PTX; CPU: cpu/include/ptx.h)
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>  // strcasecmp (device_spec)

// ---------------------------------------------------------------------------------------------
// Storage type. Weights the kernels read and all activations are floatX: bf16 by default, fp32 when
// MLM_FP32 is defined before this header is included (the fp32 model of the gradient checks).
// Accumulation, LayerNorm and softmax statistics, master weights, gradients and AdamW state are fp32.
#ifdef MLM_FP32
typedef float floatX;
#define FLOATX_CUDA CUDA_R_32F
#define FLOATX_NAME "fp32"
#else
typedef __nv_bfloat16 floatX;
#define FLOATX_CUDA CUDA_R_16BF
#define FLOATX_NAME "bf16"
#endif
#define X128 (16 / (int)sizeof(floatX))  // floatX elements in one 128-bit load

#define CUDA_CHECK(call)                                                                              \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                    cudaGetErrorString(e_));                                                          \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)
#define CUBLAS_CHECK(call)                                                              \
    do {                                                                                \
        cublasStatus_t s_ = (call);                                                     \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                              \
            fprintf(stderr, "cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

static inline int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }

// 128 bits of floatX: the unit of every load and store in the memory-bound kernels
struct __align__(16) Pack128 {
    floatX v[16 / sizeof(floatX)];
};
__device__ inline Pack128 load128(const floatX* p) { return *reinterpret_cast<const Pack128*>(p); }
__device__ inline void store128(floatX* p, Pack128 x) { *reinterpret_cast<Pack128*>(p) = x; }
__device__ inline float tof(float x) { return x; }
__device__ inline float tof(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float cvt_from_float(float x, float*) { return x; }
__device__ inline __nv_bfloat16 cvt_from_float(float x, __nv_bfloat16*) {
    return __float2bfloat16(x);
}  // round to nearest
__device__ inline floatX fromf(float x) { return cvt_from_float(x, (floatX*)nullptr); }

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// GELU, the tanh form (Hendrycks and Gimpel; "gelu_new" / "gelu_pytorch_tanh" in Hugging Face), as cuBLASLt's GELU
// epilogues compute it, which run the MLP's and the MLM head's GELU (matmul_forward_gelu, matmul_backward_input_gelu):
//   GELU(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   GELU'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// gelu_tanh_grad is the second, for the head's LayerNorm backward, which applies it in the same pass.
__device__ inline float gelu_tanh_grad(float x) {
    float t = tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x));
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * 0.7978845608028654f * (1.f + 0.134145f * x * x);
}

// ---------------------------------------------------------------------------------------------
// Embeddings fused with LayerNorm.
//
// embedding_layernorm_forward: for each token n = (b, t) of (B, T):
//   x = wte[tokens[n]] + wpe[t - seg_lo[n]] + wtt[types[n]]   (positions restart at each packed sample;
//                                                              padding tokens, seg_lo == seg_hi, use position 0)
//   out[n] = (x - mean(x)) * rstd * gamma + beta,  rstd = 1 / sqrt(var(x) + eps); stats[n] = (mean, rstd)
// Layout: one warp per token, 4 warps per block; lane l owns the 128-bit chunks l, l + 32, .. of the row.
// Data movement: the three table rows are read once (128-bit; word rows gathered from L2 or DRAM, the position
// and type rows hot in L2), and x, their sum in fp32, is kept in shared memory for the variance and output
// passes: the warp's emb_ln_warp_floats(C) floats, element k of the lane's j-th chunk at [(j X128 + k) 32 + lane],
// so that every access of a warp is to 32 consecutive words (no bank conflicts). gamma and beta are read by
// every row (L1); out is written once. x is not stored to memory: the backward recomputes it from the tables.
// (The version before read the three rows in each of the three passes: at 16 blocks per SM the rows did not stay
// in L1, and on an H100 it ran at 1.92 TB/s, the only elementwise kernel under 80% of HBM bandwidth.)
__host__ __device__ inline int emb_ln_warp_floats(int C) { return (C + 32 * X128 - 1) / (32 * X128) * (32 * X128); }
__global__ void embedding_layernorm_forward(floatX* out, float* stats, const int* tokens, const int* types,
                                            const int* seg_lo, const int* seg_hi, const floatX* wte, const floatX* wpe,
                                            const floatX* wtt, const floatX* gamma, const floatX* beta, int N, int T,
                                            int C, float eps) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    int n = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    float* xs = (float*)dyn_smem + (threadIdx.x / 32) * emb_ln_warp_floats(C) + lane;  // this lane's x, stride 32
    int t = n % T, lo = seg_lo[n], pos = seg_hi[n] > lo ? t - lo : 0;
    const floatX* a = wte + (size_t)tokens[n] * C;
    const floatX* b = wpe + (size_t)pos * C;
    const floatX* c = wtt + (size_t)(types ? types[n] : 0) * C;
    float sum = 0.f;
    for (int i = lane * X128, j = 0; i < C; i += 32 * X128, j += X128) {
        Pack128 pa = load128(a + i), pb = load128(b + i), pc = load128(c + i);
        for (int k = 0; k < X128; k++) {
            float x = tof(pa.v[k]) + tof(pb.v[k]) + tof(pc.v[k]);
            xs[(j + k) * 32] = x;
            sum += x;
        }
    }
    float mean = warp_sum(sum) / C, var = 0.f;
    for (int i = lane * X128, j = 0; i < C; i += 32 * X128, j += X128)
        for (int k = 0; k < X128; k++) {
            float d = xs[(j + k) * 32] - mean;
            var += d * d;
        }
    float rstd = rsqrtf(warp_sum(var) / C + eps);
    for (int i = lane * X128, j = 0; i < C; i += 32 * X128, j += X128) {
        Pack128 g = load128(gamma + i), be = load128(beta + i), o;
        for (int k = 0; k < X128; k++) o.v[k] = fromf((xs[(j + k) * 32] - mean) * rstd * tof(g.v[k]) + tof(be.v[k]));
        store128(out + (size_t)n * C + i, o);
    }
    if (lane == 0) {
        stats[2 * n] = mean;
        stats[2 * n + 1] = rstd;
    }
}

// layernorm_row: the second half of a LayerNorm of one row, done by one warp: given the row x (C) and the
// sum of its elements (this lane's part; each lane reads back only the chunks it summed), writes
// out = (x - mean) * rstd * gamma + beta and stats[0..1] = (mean, rstd). Variance in a second pass, in fp32.
__device__ inline void layernorm_row(floatX* out, float* stats, const floatX* x, float sum, const floatX* gamma,
                                     const floatX* beta, int C, float eps, int lane) {
    float mean = warp_sum(sum) / C, var = 0.f;
    for (int i = lane * X128; i < C; i += 32 * X128) {
        Pack128 s = load128(x + i);
        for (int k = 0; k < X128; k++) {
            float d = tof(s.v[k]) - mean;
            var += d * d;
        }
    }
    float rstd = rsqrtf(warp_sum(var) / C + eps);
    for (int i = lane * X128; i < C; i += 32 * X128) {
        Pack128 s = load128(x + i), g = load128(gamma + i), b = load128(beta + i), o;
        for (int k = 0; k < X128; k++) o.v[k] = fromf((tof(s.v[k]) - mean) * rstd * tof(g.v[k]) + tof(b.v[k]));
        store128(out + i, o);
    }
    if (lane == 0) {
        stats[0] = mean;
        stats[1] = rstd;
    }
}

// residual_layernorm_forward: res = x + (r + bias) (in fp32, stored rounded to floatX), out = LayerNorm(res) *
// gamma + beta, stats = (mean, rstd) of res. r is a projection's matmul output without its bias (the bias is added
// here, where r already sits in registers, rather than in cuBLASLt's BIAS epilogue). Layout: one warp per row of
// (N, C), 4 warps per block, 128-bit chunks. Data movement: x and r read once, res and out written once (128-bit);
// bias (C) read by every row (L1/L2); the variance and output passes re-read the lanes' own chunks of res just
// written (L1). At memory bandwidth: on an H100 at (32768, 768) bf16 3.0 TB/s (201 MB in 0.067 ms, 2026-11-23); on
// an H200 at bert-base, B = 256, T = 512 (131072 rows: 806 MB a call) 4.7 ms for a step's 24 calls (ncu, 2026-11-28),
// 0.196 ms a call, 4.1 TB/s: 96% of the 4.3 TB/s of a device-to-device copy (40 warps per SM at 43 registers, 2
// loads of 16 bytes in flight a lane: enough; tests/bench_kernels.cu measures it).
__global__ void residual_layernorm_forward(floatX* res, floatX* out, float* stats, const floatX* x, const floatX* r,
                                           const floatX* bias, const floatX* gamma, const floatX* beta, int N, int C,
                                           float eps) {
    int n = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    size_t row = (size_t)n * C;
    float sum = 0.f;
    for (int i = lane * X128; i < C; i += 32 * X128) {
        Pack128 a = load128(x + row + i), b = load128(r + row + i), c = load128(bias + i), s;
        for (int k = 0; k < X128; k++) {
            s.v[k] = fromf(tof(a.v[k]) + (tof(b.v[k]) + tof(c.v[k])));
            sum += tof(s.v[k]);
        }
        store128(res + row + i, s);
    }
    layernorm_row(out + row, stats + 2 * n, res + row, sum, gamma, beta, C, eps, lane);
}

// layernorm_forward: out = LayerNorm(inp) * gamma + beta, stats = (mean, rstd). One warp per row of (N, C).
// Data movement: inp read once from memory (its re-reads hit L1), out written once, 128-bit.
__global__ void layernorm_forward(floatX* out, float* stats, const floatX* inp, const floatX* gamma, const floatX* beta,
                                  int N, int C, float eps) {
    int n = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    size_t row = (size_t)n * C;
    float sum = 0.f;
    for (int i = lane * X128; i < C; i += 32 * X128) {
        Pack128 s = load128(inp + row + i);
        for (int k = 0; k < X128; k++) sum += tof(s.v[k]);
    }
    layernorm_row(out + row, stats + 2 * n, inp + row, sum, gamma, beta, C, eps, lane);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm backward, deterministic. With xhat = (x - mean) * rstd and g = dout * gamma:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),   dgamma = sum_n dout * xhat,   dbeta = sum_n dout.
// No floating-point atomics anywhere: every sum below has an order fixed by the launch shape, so two
// runs give the same bits (also on the CPU build, whose blocks finish in any order on several OS threads).
//
// Layout of the two LayerNorm backward kernels: block (cw, ny), cw = C / X128 rounded up to whole warps,
// ny = ln_rows(C) <= LN_ROWS; thread (x, y) owns the 128-bit column chunk [x X128, x X128 + X128) of row y of
// each group of ny rows, and the G = ln_backward_grid(N, C) blocks stride over the groups (block b: groups b,
// b + G, b + 2G, .. in that order). A row's two sums (of g and g * xhat) are reduced over its cw threads (warp
// shuffles, then the warps' sums in shared memory); each thread keeps its columns' dgamma and dbeta (and, when
// asked, the column sums of dx) in registers over all its rows. At the end the ny row slices are summed in shared
// memory (dynamic, ny x nv C floats) in order y = 0.., and the block writes its partial sums part[blockIdx.x] =
// (dgamma (C), dbeta (C)[, dz (C)]); partials_sum then sums the G blocks' partials in a fixed order.
// Data movement per row: dout and x read once, dx written once (128-bit accesses), gamma kept in registers;
// per block 2C floats of partials, 3C with the column sums of dx.
// Grid: one wave of LN_BWD_BLOCKS_PER_SM blocks per SM (132 SMs, an H100's or H200's): 264 blocks at bert-base,
// each striding over about 124 groups of 4 rows. Their partials are 264 x 3C floats, 2.4 MB at C = 768: 0.4% of the
// 608 MB that a (131072, 768) bf16 LayerNorm backward moves (the 528 blocks of launch_grid_cap() before ran in two
// waves of 264 and wrote twice that).
// Block size: at most LN_THREADS threads, or one row's cw when that is more (C > 384 X128). Registers: both kernels
// are capped (__maxnreg__) at LN_BWD_REGS, 80 in bf16, so that 2 blocks of 384 fit an SM's 65,536 registers (80 x 384
// x 2 = 61,440; ptxas uses all 80, and more would spill: a build error), except layernorm_backward<1> (the MLM head's
// one call a step, GELU' too) at 96 (1 block of 384 per SM; 80 would spill); the largest block, one row of C = 4096
// (512 threads), fits once. In fp32 the cap is 64, so that a row of C = 4096 (1024 threads) fits once.
#define LN_ROWS 4
#define LN_THREADS 384
#define LN_BWD_BLOCKS_PER_SM 2  // (registers: see below; shared memory: 2 x 50 KB of an SM's 228 KB)
#define LN_BWD_REGS (X128 == 8 ? 80 : 64)
#define LN_BWD_REGS_PRE (X128 == 8 ? 96 : 64)
#define LN_STAGES 4  // row groups in layernorm_backward's ring of asynchronous copies (see there)
static inline int ln_block_x(int C) { return ceil_div(C / X128, 32) * 32; }
static inline int ln_rows(int C) {
    int ny = LN_THREADS / ln_block_x(C);
    return ny < 1 ? 1 : ny < LN_ROWS ? ny : LN_ROWS;
}

// unpack128: the X128 elements of a 128-bit chunk as fp32 (exact). In bf16 each 32-bit word holds two, the first in
// its low half: a shift and a mask, one instruction each (tof of a high half takes two: a byte permute, then a shift).
__device__ inline void unpack128(float* f, Pack128 p) {
    uint32_t w[4];
    memcpy(w, &p, 16);
    for (int k = 0; k < 4; k++)
        if (X128 == 8) {
            f[2 * k] = __uint_as_float(w[k] << 16);
            f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        } else {
            f[k] = __uint_as_float(w[k]);
        }
}
// ln_row_sum2: (a, b) summed over the cw threads of this thread's row slice (threadIdx.y), the same result
// in every one of them. red: this call's half of a __shared__ __align__(16) float[2][LN_ROWS][32][2] (the halves
// alternate between calls, so one barrier per call is enough).
__device__ inline void ln_row_sum2(float* a, float* b, float* red) {
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
    float sa = warp_sum(*a), sb = warp_sum(*b);
    float2* r = (float2*)(red + threadIdx.y * 64);
    if (lane == 0) r[w] = make_float2(sa, sb);
    __syncthreads();
    sa = 0.f;
    sb = 0.f;
    for (int i = 0; i < nw; i++) {
        float2 p = r[i];
        sa += p.x;
        sb += p.y;
    }
    *a = sa;
    *b = sb;
}
// ln_backward_begin: this thread's X128 columns of gamma (g, read once and kept in registers over all its rows; 0
// past C) and its dgamma/dbeta sums (dg, db) set to zero; on = the columns exist (col < C).
__device__ inline Pack128 ln_backward_begin(float* dg, float* db, const floatX* gamma, int col, int on) {
    for (int k = 0; k < X128; k++) dg[k] = db[k] = 0.f;
    return on ? load128(gamma + col) : Pack128{};
}
// ln_write_partials: the block's partial column sums, summed over its row slices in order y = 0.. and written
// to part: dgamma, dbeta (C each; dg, db: this thread's X128 columns), then, with nv = 3, dz (C: the column
// sums of dinp, the bias gradient of the matmul whose output dinp is the gradient of). sm: ny x nv C floats.
__device__ inline void ln_write_partials(float* part, float* sm, const float* dg, const float* db, const float* dz,
                                         int nv, int col, int C) {
    if (col < C)
        for (int k = 0; k < X128; k++) {
            sm[(threadIdx.y * nv) * C + col + k] = dg[k];
            sm[(threadIdx.y * nv + 1) * C + col + k] = db[k];
            if (nv == 3) sm[(threadIdx.y * nv + 2) * C + col + k] = dz[k];
        }
    __syncthreads();
    for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < nv * C; i += blockDim.x * blockDim.y) {
        float s = 0.f;
        for (int y = 0; y < (int)blockDim.y; y++) s += sm[y * nv * C + i];
        part[i] = s;
    }
}

// ln_backward_row: the LayerNorm backward arithmetic of one row, as both LayerNorm backward kernels compute it.
// This thread holds X128 columns of the row: x (the LayerNorm input, fp32), d (dout) and g (gamma); mean and rstd
// are the row's stats. Columns past C have d = g = 0 and rows past N rstd = 0 (and x = d = 0), so they add nothing.
// With xhat = (x - mean) * rstd:
//   dg += dout * xhat, db += dout                     (this thread's columns of dgamma, dbeta, over its rows)
//   s1 = mean(dout * g), s2 = mean(dout * g * xhat)   (over the row's C columns: ln_row_sum2, a block barrier,
//                                                       so every thread of the block calls this once per group)
//   dx = rstd * (dout * g - s1 - xhat * s2)          (this thread's X128 columns of dx, fp32)
// red: this row group's half of the kernel's reduction scratch (see ln_row_sum2); inv_c = 1 / C (the means are
// sums times inv_c). In two halves around the barrier, ln_backward_sums (dg, db, and this thread's parts of s1 and s2)
// and ln_backward_dx, with xhat and dout * g kept in registers (xh, gg) between them; layernorm_backward calls the
// halves itself.
__device__ inline void ln_backward_sums(float* s1, float* s2, float* xh, float* gg, float* dg, float* db,
                                        const float* x, Pack128 d, Pack128 g, float mean, float rstd) {
    float dy[16 / sizeof(floatX)], gf[16 / sizeof(floatX)];
    unpack128(dy, d);
    unpack128(gf, g);
    *s1 = *s2 = 0.f;
    for (int k = 0; k < X128; k++) {
        xh[k] = (x[k] - mean) * rstd;
        gg[k] = dy[k] * gf[k];
        *s1 += gg[k];
        *s2 += gg[k] * xh[k];
        dg[k] += dy[k] * xh[k];
        db[k] += dy[k];
    }
}
__device__ inline void ln_backward_dx(float* dx, const float* xh, const float* gg, float rstd, float s1, float s2) {
    float b = -rstd * s1, c = -rstd * s2;  // dx = rstd gg - rstd s1 - rstd s2 xh: two FMAs an element
    for (int k = 0; k < X128; k++) dx[k] = fmaf(xh[k], c, fmaf(gg[k], rstd, b));
}
__device__ inline void ln_backward_row(float* dx, float* dg, float* db, const float* x, Pack128 d, Pack128 g,
                                       float mean, float rstd, float* red, float inv_c) {
    float xh[16 / sizeof(floatX)], gg[16 / sizeof(floatX)], s1, s2;
    ln_backward_sums(&s1, &s2, xh, gg, dg, db, x, d, g, mean, rstd);
    ln_row_sum2(&s1, &s2, red);
    ln_backward_dx(dx, xh, gg, rstd, s1 * inv_c, s2 * inv_c);
}

// ln_backward_fetch: starts the copies of row n (of a group of layernorm_backward's) into a stage of its ring: this
// thread's 128-bit chunk of dout, inp and (PRE) gelu_pre, at d, x and p, to r, r + plane and r + 2 plane, and, by the
// row's thread x = 0, the 16-byte-aligned 16 bytes of stats that hold the row's (mean, rstd) to st (8 at the end of
// stats). ok = 0 (a row past N or a column past C) copies 0 bytes and zero-fills, and a row past N zero-fills its
// stats: then d = x = 0 (and mean = rstd = 0), so the kernel reads every chunk and stats without a test, and they add
// nothing (and their addresses, which may lie past the tensors, are not read). Then commits them as one group.
template <int PRE>
__device__ inline void ln_backward_fetch(Pack128* r, float* st, int plane, const floatX* d, const floatX* x,
                                         const floatX* p, int ok, const float* stats, int n, int N) {
    int bytes = ok ? 16 : 0;
    cp_async_16(r, d, bytes);
    cp_async_16(r + plane, x, bytes);
    if (PRE) cp_async_16(r + 2 * plane, p, bytes);
    if (threadIdx.x == 0) {
        int w = 2 * n & ~3;  // the window [w, w + 4) holds 2n and 2n + 1 (N < 2^30: the launcher checks)
        cp_async_16(st, stats + w, n >= N ? 0 : 2 * N - w < 4 ? 8 : 16);
    }
    cp_async_commit();
}

// layernorm_backward: dinp = LayerNorm backward of dout at inp (the saved LayerNorm input, with its stats),
// times GELU'(gelu_pre) when gelu_pre is given (the MLM head: LayerNorm(GELU(pre)), so dinp is dLoss/dpre);
// part[b] = block b's partial (dgamma, dbeta), and with nv = 3 also dz = the column sums of dinp (as stored,
// rounded): the bias gradient of the matmul that produced the LayerNorm's input (or pre), which so needs no pass
// over dinp of its own. dinp is overwritten (for a residual LayerNorm it is the gradient of both branches of the
// residual sum). Layout: see above (dz adds C floats of partials per block); each row's arithmetic is
// ln_backward_row's. PRE: gelu_pre is given (1: the MLM head's one call a step) or not (0: the encoder's 24), two
// instances, so that the encoder's carries no registers for GELU'. stats must be 16-byte aligned (the launcher checks).
// Data movement: 6 bytes an element in bf16 (dout and inp read, dinp written) and little arithmetic, so the speed is
// the bytes kept in flight. The reads go global -> shared memory by cp.async (16 bytes a copy, through L2 only) into
// a ring of LN_STAGES row groups in dynamic shared memory, group k in stage k % LN_STAGES: [stage][array: dout, inp
// (, gelu_pre)][y][x] 128-bit chunks, then [stage][y] 4 floats of stats. Group k + LN_STAGES - 1 is fetched when group
// k starts. Each thread reads back from shared memory the chunks it copied itself (its own cp_async_wait makes them
// visible); a row's stats are copied by its thread x = 0 for all cw threads: at group k the wait leaves groups
// <= k + 1 complete, so the barrier in group k's ln_row_sum2 publishes group k + 1's stats to every thread before
// group k + 1 reads them. That barrier is also the last point where another thread reads stage k % LN_STAGES (the
// stats), and the fetch of group k + LN_STAGES into that stage comes after it, in group k + 1 (after this thread's
// own last read of it, gelu_pre's chunk).
// In flight while group k is computed: groups k + 2 and k + 3, 64 bytes a thread, 49 KB per SM at bert-base (2 x 384
// threads), and each copy has two groups' time (about 2 us at 4.3 TB/s) to land. dinp: plain 128-bit stores.
// Instructions (sm_90a SASS, bf16): about 250 a thread per group, 310 before; per SM and group 24 warps x 250, so 80%
// of 4.3 TB/s (1.41 us a group) asks 2.1 instructions a cycle of an SM's 4 at 1.98 GHz, 100% 2.7.
// Shared memory: the ring, LN_STAGES x ny x (na cw + 1) x 16 bytes (48 KB at C = 768, 72 KB with gelu_pre), and
// ln_write_partials' ny x nv C floats in its place at the end (ln_backward_smem).
// (The version before loaded its row into registers at the top of each group and waited for it there: at most
// 768 x 32 bytes = 24.6 KB in flight per SM, and none during the row's reduction and store. It ran at 2.77 TB/s on an
// H100 and 2.64 TB/s on an H200 alike, 61% of the H200's device copy: bound by latency, not bandwidth.)
template <int PRE>
__global__ void __maxnreg__(PRE ? LN_BWD_REGS_PRE : LN_BWD_REGS)
    layernorm_backward(floatX* dinp, float* part, const floatX* dout, const floatX* inp, const float* stats,
                       const floatX* gamma, const floatX* gelu_pre, int N, int C, int nv) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ __align__(16) float red[2][LN_ROWS][32][2];
    static_assert((LN_STAGES & (LN_STAGES - 1)) == 0, "LN_STAGES: a power of 2");
    int col = threadIdx.x * X128, on = col < C, ny = blockDim.y, plane = ny * blockDim.x;
    int n0 = blockIdx.x * ny + threadIdx.y, dn = gridDim.x * ny;  // this thread's row in group 0; then + dn a group
    int groups = ((N + ny - 1) / ny - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;  // this block's (>= 1)
    int stage = (PRE ? 3 : 2) * plane;                                                         // 128-bit chunks
    size_t di = (size_t)dn * C;       // from this thread's chunk of a group to its chunk of the next (elements)
    size_t i = (size_t)n0 * C + col;  // this thread's chunk in group 0 (an element offset), then in the group fetched
    Pack128* mine = (Pack128*)dyn_smem + threadIdx.y * blockDim.x + threadIdx.x;          // stage 0's dout chunk
    float* st_mine = (float*)((Pack128*)dyn_smem + LN_STAGES * stage) + 4 * threadIdx.y;  // stage 0's stats of row y
    float inv_c = 1.f / C, dg[16 / sizeof(floatX)], db[16 / sizeof(floatX)], dz[16 / sizeof(floatX)] = {};
    Pack128 g = ln_backward_begin(dg, db, gamma, col, on);
    const floatX *fd = dout + i, *fx = inp + i, *fp = PRE ? gelu_pre + i : NULL;  // the chunks of the next fetch
    floatX* out = dinp + i;                                                       // this thread's chunk of dinp
    for (int k = 0; k < LN_STAGES - 1; k++, fd += di, fx += di, fp += PRE ? di : 0)
        ln_backward_fetch<PRE>(mine + k * stage, st_mine + k * 4 * ny, plane, fd, fx, fp, on && n0 + k * dn < N, stats,
                               n0 + k * dn, N);
    cp_async_wait<LN_STAGES - 2>();  // group 0 here (and its stats seen by all after the barrier)
    __syncthreads();
    // every thread runs the same number of iterations (rows past N count zero), so the barriers are uniform
    for (int k = 0; k < groups; k++, fd += di, fx += di, fp += PRE ? di : 0, out += di) {
        int f = (k + LN_STAGES - 1) & (LN_STAGES - 1), s = k & (LN_STAGES - 1), n = n0 + k * dn, ok = on && n < N,
            nf = n + (LN_STAGES - 1) * dn;
        ln_backward_fetch<PRE>(mine + f * stage, st_mine + f * 4 * ny, plane, fd, fx, fp, on && nf < N, stats, nf, N);
        cp_async_wait<LN_STAGES - 2>();  // this thread's copies of groups <= k + 1 have landed
        const Pack128* r = mine + s * stage;
        const float* st = st_mine + s * 4 * ny + (2 * n & 3);
        float mean = st[0], rstd = st[1], s1, s2, x[16 / sizeof(floatX)], xh[16 / sizeof(floatX)],
              gg[16 / sizeof(floatX)];
        Pack128 d = r[0];
        unpack128(x, r[plane]);
        ln_backward_sums(&s1, &s2, xh, gg, dg, db, x, d, g, mean, rstd);
        ln_row_sum2(&s1, &s2, &red[k & 1][0][0][0]);  // (the barrier)
        if (ok) {
            float v[16 / sizeof(floatX)], pf[16 / sizeof(floatX)];
            Pack128 o;
            if (PRE) unpack128(pf, r[2 * plane]);
            ln_backward_dx(v, xh, gg, rstd, s1 * inv_c, s2 * inv_c);
            for (int j = 0; j < X128; j++) o.v[j] = fromf(PRE ? v[j] * gelu_tanh_grad(pf[j]) : v[j]);
            unpack128(v, o);  // (dz: the column sums of dinp as stored)
            for (int j = 0; j < X128; j++) dz[j] += v[j];
            store128(out, o);
        }
    }
    cp_async_wait<0>();  // (the fetches past the end: zero-fills) then the ring's space holds the partial sums
    __syncthreads();
    ln_write_partials(part + (size_t)blockIdx.x * nv * C, (float*)dyn_smem, dg, db, dz, nv, col, C);
}

// partials_sum: out_j[i] += sum_b part[b][j C + i] for the nv <= 3 vectors out_0, out_1, out_2 (C floats each), over
// the G blocks' partials (nv C floats each), in a fixed order (group y sums b = y, y + 8, ... in order; then groups
// 0..7 in order). Layout: block (32, 8): threadIdx.x a column of the nv C, threadIdx.y a group; grid
// ceil(nv C / 32). Reads G x nv C floats once (coalesced rows), writes nv C.
__global__ void partials_sum(float* out0, float* out1, float* out2, const float* part, int G, int C, int nv) {
    __shared__ float sm[8][33];
    int i = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (i < nv * C)
        for (int b = threadIdx.y; b < G; b += 8) s += part[(size_t)b * nv * C + i];
    sm[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && i < nv * C) {
        float t = 0.f;
        for (int y = 0; y < 8; y++) t += sm[y][threadIdx.x];
        float* out = i < C ? out0 : i < 2 * C ? out1 : out2;
        out[i % C] += t;
    }
}

// ---------------------------------------------------------------------------------------------
// Embedding backward, deterministic and without atomics, in three steps:
//   1. embedding_layernorm_backward: the LayerNorm backward of each token (x recomputed from the tables),
//      dx (N, C) in fp32 to a scratch buffer, and 3 sort keys per token, one per table row it read:
//      (row << 32 | n) with rows numbered word [0, V), position [V, V + P), type [V + P, ...);
//   2. the 3N keys sorted (bitonic, sort_keys_tile / sort_keys_step): each table row's tokens become one
//      run of consecutive entries, in increasing n. The keys are unique, so the order is unique;
//   3. each table row's gradient is the sum of dx over its run, in that order: embedding_table_chunks sums
//      fixed chunks of the sorted entries (a run wholly inside a chunk is added to its row right away, by
//      its only writer), embedding_table_carries adds the pieces of the runs that cross chunk boundaries.
// The byte vocabulary (260 rows that every block touched with fp32 atomics) and the type table (2 rows)
// are no longer contention points: every chunk has the same number of entries whatever the row.

// embedding_layernorm_backward: step 1. dx[n] = LayerNorm backward of dout[n] at x = wte[tok] + wpe[pos] +
// wtt[type] (recomputed in fp32 exactly as the forward summed it), fp32; keys[3n + {0, 1, 2}] = the word,
// position and type rows of token n; part[b] = block b's partial (dgamma, dbeta). Layout as layernorm_backward,
// and each row's arithmetic is the same (ln_backward_row), x read from the tables instead of a saved input.
// Data movement per token: dout read once (128-bit), the three table rows read (the word rows of a small
// vocabulary and the position rows stay in L2), dx written once in fp32 (2 x 128-bit per chunk), 24 bytes of keys.
__global__ void __maxnreg__(LN_BWD_REGS)
    embedding_layernorm_backward(float* dx, uint64_t* keys, float* part, const floatX* dout, const float* stats,
                                 const int* tokens, const int* types, const int* seg_lo, const int* seg_hi,
                                 const floatX* wte, const floatX* wpe, const floatX* wtt, const floatX* gamma, int N,
                                 int T, int C, int V, int P) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ __align__(16) float red[2][LN_ROWS][32][2];
    int col = threadIdx.x * X128, on = col < C, it = 0;
    float inv_c = 1.f / C, dg[16 / sizeof(floatX)], db[16 / sizeof(floatX)];
    Pack128 g = ln_backward_begin(dg, db, gamma, col, on);
    for (int r0 = blockIdx.x * blockDim.y; r0 < N; r0 += gridDim.x * blockDim.y, it++) {
        int n = r0 + threadIdx.y, ok = on && n < N;
        float mean = 0.f, rstd = 0.f, x[16 / sizeof(floatX)], o[16 / sizeof(floatX)];
        Pack128 d = {}, pa = {}, pb = {}, pc = {};
        if (n < N) {
            int t = n % T, lo = seg_lo[n], pos = seg_hi[n] > lo ? t - lo : 0, tok = tokens[n],
                ty = types ? types[n] : 0;
            mean = stats[2 * n];
            rstd = stats[2 * n + 1];
            if (ok) {
                d = load128(dout + (size_t)n * C + col);
                pa = load128(wte + (size_t)tok * C + col);
                pb = load128(wpe + (size_t)pos * C + col);
                pc = load128(wtt + (size_t)ty * C + col);
            }
            if (threadIdx.x == 0) {
                keys[3 * (size_t)n] = (uint64_t)tok << 32 | (uint32_t)n;
                keys[3 * (size_t)n + 1] = (uint64_t)(V + pos) << 32 | (uint32_t)n;
                keys[3 * (size_t)n + 2] = (uint64_t)(V + P + ty) << 32 | (uint32_t)n;
            }
        }
        for (int k = 0; k < X128; k++) x[k] = tof(pa.v[k]) + tof(pb.v[k]) + tof(pc.v[k]);
        ln_backward_row(o, dg, db, x, d, g, mean, rstd, &red[it & 1][0][0][0], inv_c);
        if (ok)
            for (int k = 0; k < X128; k += 4)
                *(float4*)(dx + (size_t)n * C + col + k) = make_float4(o[k], o[k + 1], o[k + 2], o[k + 3]);
    }
    ln_write_partials(part + (size_t)blockIdx.x * 2 * C, (float*)dyn_smem, dg, db, db, 2, col, C);
}

// Step 2: bitonic sort of n = 2^p 64-bit keys, ascending. For each k = 2, 4, .., n and each j = k/2, .., 1,
// element i is compared with i + j (bit j of i clear) and the pair is put in ascending order when bit k of i
// is clear, descending otherwise. Steps with j < SORT_TILE run inside tiles of SORT_TILE keys in shared
// memory (sort_keys_tile); the others are one launch each over global memory (sort_keys_step), L2-resident.
// 3N keys at N = 32768 tokens: 2^17 keys (1 MB), 28 launches.
#define SORT_TILE 2048
static inline long long sort_pow2(long long n) {  // the padded key count
    long long p = 2;
    while (p < n) p *= 2;
    return p;
}
// sort_keys_tile: the steps k = k_lo .. k_hi (doubling), j = min(k, tile)/2 .. 1, inside tiles of tile =
// min(n, SORT_TILE) keys. Keys at index >= n_valid are read as UINT64_MAX (the padding sorts to the end).
// Layout: one block per tile, tile / 2 threads, one compare-exchange each per step; the tile in shared memory.
__global__ void sort_keys_tile(uint64_t* keys, long long n_valid, long long n, long long k_lo, long long k_hi) {
    __shared__ uint64_t s[SORT_TILE];
    int tile = 2 * blockDim.x;
    size_t base = (size_t)blockIdx.x * tile;
    for (int i = threadIdx.x; i < tile; i += blockDim.x)
        s[i] = (long long)(base + i) < n_valid ? keys[base + i] : ~0ull;
    __syncthreads();
    for (long long k = k_lo; k <= k_hi; k *= 2)
        for (int j = (int)(k < tile ? k : tile) / 2; j > 0; j /= 2) {
            int p = threadIdx.x, i = 2 * p - (p & (j - 1)), l = i + j;
            int up = ((base + i) & (size_t)k) == 0;
            uint64_t a = s[i], b = s[l];
            if ((a > b) == up) {
                s[i] = b;
                s[l] = a;
            }
            __syncthreads();
        }
    for (int i = threadIdx.x; i < tile; i += blockDim.x) keys[base + i] = s[i];
}
// sort_keys_step: one step (k, j) with j >= SORT_TILE over all n keys. One thread per compare-exchange pair.
__global__ void sort_keys_step(uint64_t* keys, long long n, long long k, long long j) {
    long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n / 2) return;
    long long i = 2 * p - (p & (j - 1)), l = i + j;
    int up = (i & k) == 0;
    uint64_t a = keys[i], b = keys[l];
    if ((a > b) == up) {
        keys[i] = b;
        keys[l] = a;
    }
}

// Step 3. The E sorted entries are cut into chunks of K (at most EMB_CHUNKS chunks); a table row's run is
// either inside one chunk or crosses chunk boundaries. The row numbering maps to the three fp32 tables.
#define EMB_CHUNKS 1024
__device__ inline float* emb_table_row(float* dwte, float* dwpe, float* dwtt, int r, int V, int P, int C) {
    return r < V ? dwte + (size_t)r * C : r < V + P ? dwpe + (size_t)(r - V) * C : dwtt + (size_t)(r - V - P) * C;
}
__device__ inline int key_row(uint64_t k) { return (int)(k >> 32); }
__device__ inline void add4(float4* a, float4 b) {
    a->x += b.x;
    a->y += b.y;
    a->z += b.z;
    a->w += b.w;
}

// embedding_table_chunks: chunk c = blockIdx.x holds the sorted entries [cK, min(cK + K, E)). Walking them in
// order, each thread sums the fp32 dx rows of the current run over its 4 columns; when the run ends:
//   - a run that starts and ends inside the chunk is the whole of its row's tokens: table[row] += sum
//     (this block is the row's only writer: no atomics, and the order is the sorted order);
//   - a run cut at the chunk's start goes to carry[2c], one cut only at its end to carry[2c + 1]
//     (C floats each), for embedding_table_carries.
// Layout: blockDim.x = C/4 rounded up to a warp, thread x owns columns [4x, 4x + 4). Data movement: each
// dx row read once per table (3 times in all, 128-bit), the touched table rows read and written once.
__global__ void embedding_table_chunks(float* dwte, float* dwpe, float* dwtt, float* carry, const uint64_t* keys,
                                       const float* dx, int E, int K, int C, int V, int P) {
    int c = blockIdx.x, e0 = c * K, e1 = e0 + K < E ? e0 + K : E, col = threadIdx.x * 4;
    if (col >= C || e0 >= E) return;
    int prev = e0 > 0 ? key_row(keys[e0 - 1]) : -1, next = e1 < E ? key_row(keys[e1]) : -1;
    int row = key_row(keys[e0]), start = e0;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int e = e0; e <= e1; e++) {
        int r = e < e1 ? key_row(keys[e]) : -1;
        if (r != row) {  // the run [start, e) of row ends
            int cut_start = start == e0 && prev == row, cut_end = e == e1 && next == row;
            float* dst = cut_start ? carry + (size_t)2 * c * C : cut_end ? carry + (size_t)(2 * c + 1) * C : NULL;
            if (dst)
                *(float4*)(dst + col) = acc;
            else {
                float* t = emb_table_row(dwte, dwpe, dwtt, row, V, P, C) + col;
                float4 v = *(float4*)t;
                add4(&v, acc);
                *(float4*)t = v;
            }
            acc = make_float4(0.f, 0.f, 0.f, 0.f);
            row = r;
            start = e;
        }
        if (e < e1) add4(&acc, *(const float4*)(dx + (size_t)(uint32_t)keys[e] * C + col));
    }
}

// embedding_table_carries: the runs that cross chunk boundaries. Chunk c = blockIdx.x owns the run its last
// entry belongs to when that run continues into chunk c + 1 and did not come from chunk c - 1; the run ends
// in some chunk `last` (found by the block in parallel: the first chunk after c whose next entry is another
// row). table[row] += carry[2c + 1] + (carry[2c'] for c' = c + 1 .. last), the y-th row slice of the block
// summing c' = c + 1 + y, c + 1 + y + ny, ... and the slices then added in order y = 0..: a fixed order.
// Layout: block (C/4 rounded up to a warp, ny), thread (x, y) owns columns [4x, 4x + 4). Data movement: each
// carry read once (a hot row such as type 0, which every token has, spans all EMB_CHUNKS chunks: 1024 x C floats).
__global__ void embedding_table_carries(float* dwte, float* dwpe, float* dwtt, const float* carry, const uint64_t* keys,
                                        int E, int K, int C, int V, int P) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    float4* sm = (float4*)dyn_smem;  // (ny, C/4) partial sums
    int c = blockIdx.x, e0 = c * K, e1 = e0 + K < E ? e0 + K : E, nchunks = (E + K - 1) / K;
    if (e1 >= E) return;  // the last chunk: no run continues past it
    int row = key_row(keys[e1 - 1]);
    if (key_row(keys[e1]) != row) return;  // the chunk's last run ends with it
    if (key_row(keys[e0]) == row && e0 > 0 && key_row(keys[e0 - 1]) == row) return;  // the run began earlier
    // last: the first chunk c' > c where the run ends (its next entry is another row, or there is none)
    int nt = blockDim.x * blockDim.y, tid = threadIdx.y * blockDim.x + threadIdx.x, last = nchunks - 1;
    for (int base = c + 1; base < nchunks; base += nt) {
        int cc = base + tid, ends = 1;
        if (cc < nchunks) {
            int ce = (cc + 1) * K;
            ends = ce >= E || key_row(keys[ce]) != row;
        }
        int cont = __syncthreads_count(!ends);  // the chunks continue, then end (the keys are sorted)
        if (cont < nt) {
            last = base + cont;
            break;
        }
    }
    int col = threadIdx.x * 4, on = col < C;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (on)
        for (int cc = c + 1 + threadIdx.y; cc <= last; cc += blockDim.y)
            add4(&acc, *(const float4*)(carry + (size_t)2 * cc * C + col));
    if (on) sm[threadIdx.y * (C / 4) + threadIdx.x] = acc;
    __syncthreads();
    if (on && threadIdx.y == 0) {
        float4 s = *(const float4*)(carry + (size_t)(2 * c + 1) * C + col);
        for (int y = 0; y < (int)blockDim.y; y++) add4(&s, sm[y * (C / 4) + threadIdx.x]);
        float* t = emb_table_row(dwte, dwpe, dwtt, row, V, P, C) + col;
        float4 v = *(float4*)t;
        add4(&v, s);
        *(float4*)t = v;
    }
}

// ---------------------------------------------------------------------------------------------
// Column sums: a bias gradient, db = sum over rows of d, where no matmul epilogue gives it (the MLP's first bias,
// from dLoss/dpre, and the MLM decoder's, from a chunk of dLoss/dlogits).

// column_partials: the end of a block of (32, 8) threads in which thread (x, y) holds sum[X128], its sums of the
// 128-bit column chunk col (of I columns) over its rows: the 8 row slices are added in shared memory in the order
// y = 0, 1, ... (a fixed order) and the block's column sums written to part[blockIdx.y] (I floats), for
// partials_sum. (The tail of column_sums.)
__device__ inline void column_partials(float* part, const float* sum, int col, int I) {
    __shared__ float sm[8][32 * 8];
    for (int k = 0; k < X128; k++) sm[threadIdx.y][threadIdx.x * X128 + k] = sum[k];
    __syncthreads();
    if (threadIdx.y == 0 && col < I)
        for (int k = 0; k < X128; k++) {
            float t = 0.f;
            for (int y = 0; y < 8; y++) t += sm[y][threadIdx.x * X128 + k];
            part[(size_t)blockIdx.y * I + col + k] = t;
        }
}
// column_sums: part[blockIdx.y] (C floats) = the column sums of x (N, C) over the block's rows, which partials_sum
// adds to a bias gradient (the MLM decoder's, from a chunk of dLoss/dlogits, instead of cuBLASLt's BGRADB epilogue).
// Layout: block (32, 8), grid (ceil(C / (32 X128)), gy); thread (x, y) sums the 128-bit column
// chunk (blockIdx.x * 32 + x) X128 of rows blockIdx.y * 8 + y, then + gy * 8, ... in registers (4 loads in flight),
// and column_partials adds the 8 row slices in a fixed order. Data movement: x read once (128-bit); C floats of
// partials per row of blocks.
__global__ void column_sums(float* part, const floatX* x, int N, int C) {
    int col = (blockIdx.x * 32 + threadIdx.x) * X128;
    float sum[16 / sizeof(floatX)] = {};
#pragma unroll 4
    for (int n = blockIdx.y * 8 + threadIdx.y; col < C && n < N; n += gridDim.y * 8) {
        Pack128 v = load128(x + (size_t)n * C + col);
        for (int k = 0; k < X128; k++) sum[k] += tof(v.v[k]);
    }
    column_partials(part, sum, col, C);
}

// add_and_clear: dst += src, then src = 0 (n % 4 == 0, 16-byte aligned). The decoder bias's gradient, summed in
// the forward (bert_head_decoder), goes to a scratch copy of the gradient slab's vector region; at the end of the
// backward this adds it to the gradients, which accumulate over micro-steps, and leaves the scratch zero for the
// next micro-step. Grid-stride, 128-bit accesses.
__global__ void add_and_clear(float* dst, float* src, size_t n) {
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n;
         i += (size_t)gridDim.x * blockDim.x * 4) {
        float4 a = *(float4*)(dst + i), b = *(float4*)(src + i);
        *(float4*)(dst + i) = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        *(float4*)(src + i) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// ---------------------------------------------------------------------------------------------
// Batch helpers

// segment_ranges: the key range each token of a packed batch attends to, from the loader's segments
// (data.h). Token n = b*T + t lies in segment s = segment_ids[n], the flat span [cu_seqlens[s],
// cu_seqlens[s+1]) inside row b; it attends to keys [seg_lo, seg_hi) = that span less the row start
// b*T. A padding segment (its first token is pad_id, which no sample contains) gets the empty range
// [0, 0), which the model reads as padding. One thread per token.
__global__ void segment_ranges(int* seg_lo, int* seg_hi, const int* segment_ids, const int* cu_seqlens,
                               const int* input_ids, int pad_id, int N, int T) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int s = segment_ids[n], start = cu_seqlens[s], row_start = (n / T) * T;
    int pad = input_ids[start] == pad_id;
    seg_lo[n] = pad ? 0 : start - row_start;
    seg_hi[n] = pad ? 0 : cu_seqlens[s + 1] - row_start;
}

// pad_masked_rows: the MLM head's M rows from a batch's n <= M masked positions. M is fixed (the memory
// plan's cap), so the head's matmul shapes, and their cuBLASLt descriptors, never change. Rows m < n
// copy (mask_pos[m], mask_target[m]); rows m >= n are padding: position 0, label -1, which the head
// computes and the loss and the backward ignore. One thread per row.
__global__ void pad_masked_rows(int* pos, int* labels, const int* mask_pos, const int* mask_target, int n, int M) {
    int m = blockIdx.x * blockDim.x + threadIdx.x;
    if (m >= M) return;
    pos[m] = m < n ? mask_pos[m] : 0;
    labels[m] = m < n ? mask_target[m] : -1;
}

// accumulate_loss: sum[0] += mean_loss[0] * count, sum[1] += count: adds a micro-batch's loss, weighted
// by its masked-token count, to the step's without a host sync. One thread.
__global__ void accumulate_loss(float* sum, const float* mean_loss, float count) {
    sum[0] += mean_loss[0] * count;
    sum[1] += count;
}

// stall_spin: the test hook MLM_TEST_STALL (trainer.cu): holds its stream, so the collective queued after
// it never starts, until *release becomes non-zero (pinned host memory, mapped: the watchdog's comm_die
// sets it before the process exits) or max_cycles clock cycles have passed. One thread.
__global__ void stall_spin(const volatile int* release, long long max_cycles) {
    long long start = clock64();
    while (!*release && clock64() - start < max_cycles) {
    }
}

// ---------------------------------------------------------------------------------------------
// MLM head helpers

// gather_rows: out[m] = inp[pos[m]] for the M masked positions; rows of C. One thread per 128-bit chunk.
__global__ void gather_rows(floatX* out, const floatX* inp, const int* pos, int M, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, per = C / X128;
    if (i >= M * per) return;
    int m = i / per, c = (i % per) * X128;
    store128(out + (size_t)m * C + c, load128(inp + (size_t)pos[m] * C + c));
}
// scatter_rows: out[pos[m]] = inp[m] for the rows with labels[m] >= 0 (their positions are distinct; rows
// with label < 0 are padding and are skipped; the rest of out is zeroed by the caller).
__global__ void scatter_rows(floatX* out, const floatX* inp, const int* pos, const int* labels, int M, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, per = C / X128;
    if (i >= M * per) return;
    int m = i / per, c = (i % per) * X128;
    if (labels[m] < 0) return;  // a padding row (its gradient is zero; its position may repeat another's)
    store128(out + (size_t)pos[m] * C + c, load128(inp + (size_t)m * C + c));
}

// cross_entropy_forward_backward: for each masked row m of logits (M, V) with row stride ld:
//   lse = log sum_j exp(z_j);  losses[m] = lse - z[label]
//   and when dscale != 0, in place:  logits[m, j] = (exp(z_j - lse) - [j == label]) * dscale for j < V,
//   and 0 for V <= j < ld (the decoder's pad columns, whose gradient must be exactly 0)
// so the backward needs no stored probabilities. A label < 0 gives loss 0 and a zero gradient row.
// Layout: one block of 256 threads per row; online (max, sum) per thread over 128-bit chunks (the tail
// j >= V rounded down to X128 is done scalar), reduced across warps in shared memory.
__global__ void cross_entropy_forward_backward(floatX* logits, float* losses, const int* labels, int M, int V, int ld,
                                               float dscale) {
    __shared__ float red_m[8], red_s[8];
    __shared__ float zlab;
    int m = blockIdx.x, lane = threadIdx.x % 32, w = threadIdx.x / 32;
    floatX* z = logits + (size_t)m * ld;
    int label = labels[m], Vv = V / X128 * X128;
    float mx = -INFINITY, s = 0.f;
    for (int j = threadIdx.x * X128; j < Vv; j += blockDim.x * X128) {
        Pack128 p = load128(z + j);
        for (int k = 0; k < X128; k++) {
            float v = tof(p.v[k]);
            if (v > mx) {
                s *= expf(mx - v);
                mx = v;
            }
            s += expf(v - mx);
        }
    }
    for (int j = Vv + threadIdx.x; j < V; j += blockDim.x) {
        float v = tof(z[j]);
        if (v > mx) {
            s *= expf(mx - v);
            mx = v;
        }
        s += expf(v - mx);
    }
    if (threadIdx.x == 0) zlab = label >= 0 ? tof(z[label]) : 0.f;
    float wm = warp_max(mx);
    s = warp_sum(mx == -INFINITY ? 0.f : s * expf(mx - wm));
    if (lane == 0) {
        red_m[w] = wm;
        red_s[w] = s;
    }
    __syncthreads();
    float gm = -INFINITY, gs = 0.f;
    for (int i = 0; i < 8; i++) gm = fmaxf(gm, red_m[i]);
    for (int i = 0; i < 8; i++) gs += red_s[i] * expf(red_m[i] - gm);
    float lse = gm + logf(gs);
    if (threadIdx.x == 0) losses[m] = label >= 0 ? lse - zlab : 0.f;
    if (dscale == 0.f) return;
    float sc = label >= 0 ? dscale : 0.f;
    for (int j = threadIdx.x * X128; j < Vv; j += blockDim.x * X128) {
        Pack128 p = load128(z + j);
        for (int k = 0; k < X128; k++) p.v[k] = fromf((expf(tof(p.v[k]) - lse) - (j + k == label ? 1.f : 0.f)) * sc);
        store128(z + j, p);
    }
    for (int j = Vv + threadIdx.x; j < V; j += blockDim.x)
        z[j] = fromf((expf(tof(z[j]) - lse) - (j == label ? 1.f : 0.f)) * sc);
    for (int j = V + threadIdx.x; j < ld; j += blockDim.x) z[j] = fromf(0.f);  // the pad columns: no gradient
}

// loss_mean: out[0] = the mean of losses[m] over the rows with labels[m] >= 0 (rows with label < 0 are
// padding or ignored, and have loss 0). One block of 256 threads (a fixed-order, deterministic sum).
__global__ void loss_mean(float* out, const float* losses, const int* labels, int M) {
    __shared__ float red[8], cnt[8];
    float s = 0.f, c = 0.f;
    for (int i = threadIdx.x; i < M; i += blockDim.x) {
        s += losses[i];
        c += labels[i] >= 0;
    }
    s = warp_sum(s);
    c = warp_sum(c);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s, cnt[threadIdx.x / 32] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f, n = 0.f;
        for (int i = 0; i < 8; i++) t += red[i], n += cnt[i];
        out[0] = n > 0.f ? t / n : 0.f;
    }
}

// argmax_hits: the masked-token accuracy's numerator, per row. hits[m] = 1 when the largest logit of row m
// (M rows of V, row stride ld) is at labels[m], the model's top prediction is right; 0 when it is not or
// when labels[m] < 0 (a padding row). The argmax is defined to be deterministic: ties go to the lowest
// index and NaN never wins, so no thread order can change a result. One block of 256 threads per row:
// each thread keeps its best (value, index) over a strided slice, then the pairs are reduced over the
// warp (shuffles) and the 8 warps (shared memory) with the same rule.
__device__ inline int argmax_better(float v, int j, float best, int bj) {  // (v, j) beats (best, bj)
    return v > best || (v == best && j < bj);
}
__global__ void argmax_hits(float* hits, const floatX* logits, const int* labels, int M, int V, int ld) {
    __shared__ float red_v[8];
    __shared__ int red_j[8];
    int m = blockIdx.x, lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const floatX* z = logits + (size_t)m * ld;
    float best = -INFINITY;
    int bj = 0x7fffffff;  // no index yet: any value but NaN beats it
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = tof(z[j]);
        if (argmax_better(v, j, best, bj)) best = v, bj = j;
    }
    for (int o = 16; o > 0; o /= 2) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oj = __shfl_xor_sync(0xffffffffu, bj, o);
        if (argmax_better(ov, oj, best, bj)) best = ov, bj = oj;
    }
    if (lane == 0) red_v[w] = best, red_j[w] = bj;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < 8; i++)
            if (argmax_better(red_v[i], red_j[i], best, bj)) best = red_v[i], bj = red_j[i];
        hits[m] = labels[m] >= 0 && bj == labels[m] ? 1.f : 0.f;
    }
}

// accumulate_sum: out[0] += x[0] + ... + x[n-1], summed in a fixed order (per thread, then warps, then
// the 8 warp sums in order), so the result never depends on timing. One block of 256 threads.
__global__ void accumulate_sum(float* out, const float* x, int n) {
    __shared__ float red[8];
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int i = 0; i < 8; i++) t += red[i];
        out[0] += t;
    }
}

// ---------------------------------------------------------------------------------------------
// Optimizer

__device__ inline uint32_t hash_u32(uint32_t x) {  // lowbias32 (Chris Wellons): a fast integer hash
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}
// store_rounded: bf16 with stochastic rounding (add 16 random low bits, truncate), so small updates are
// kept in expectation; in fp32 mode the floatX weights are the master weights and nothing is stored.
__device__ inline void store_rounded(__nv_bfloat16* p, float w, uint32_t rnd) {
    uint32_t u;
    memcpy(&u, &w, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u += rnd & 0xffffu;  // not for inf/NaN
    __nv_bfloat16_raw raw;
    raw.x = (unsigned short)(u >> 16);
    *p = __nv_bfloat16(raw);
}
__device__ inline void store_rounded(float* p, float w, uint32_t rnd) {}

// grad_norm_partial: partial[blockIdx.x] = sum of g[i]^2 over a grid-stride slice of n (n % 4 == 0),
// 128-bit loads. Block 256.
__global__ void grad_norm_partial(float* partial, const float* g, size_t n) {
    __shared__ float red[8];
    float s = 0.f;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n;
         i += (size_t)gridDim.x * blockDim.x * 4) {
        float4 x = *(const float4*)(g + i);
        s += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
    }
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int i = 0; i < 8; i++) t += red[i];
        partial[blockIdx.x] = t;
    }
}
// grad_norm_finish: norm[0] = sqrt(sum of partial[0, nparts)), in a fixed order (deterministic). One block of 256.
__global__ void grad_norm_finish(float* norm, const float* partial, int nparts) {
    __shared__ float red[8];
    float s = 0.f;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partial[i];
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int i = 0; i < 8; i++) t += red[i];
        norm[0] = sqrtf(t);
    }
}

// adamw_update: AdamW with decoupled weight decay on the first n_decay elements (matrices, embeddings):
//   g = grad * clip, clip = min(1, max_norm / norm[0]) (no clipping when norm is null or max_norm <= 0)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   w -= lr * (m / bc1 / (sqrt(v / bc2) + eps) + wd * w)      (bc1 = 1 - b1^t, bc2 = 1 - b2^t)
// then the floatX copy of w is refreshed with stochastic rounding (hash of index and seed).
// Layout: grid-stride over groups of 4 elements, 128-bit loads and stores of the fp32 state
// (n and n_decay are multiples of 4: the slab pads every tensor to 8 elements).
__device__ inline float adamw_one(float w, float g, float* m, float* v, int decay, float lr, float b1, float b2,
                                  float eps, float wd, float bc1, float bc2) {
    *m = b1 * *m + (1.f - b1) * g;
    *v = b2 * *v + (1.f - b2) * g * g;
    return w - lr * (*m / bc1 / (sqrtf(*v / bc2) + eps) + (decay ? wd * w : 0.f));
}
// base: the slab index of element 0 (the rounding hashes the slab index, so a ZeRO-1 rank updating a
// shard rounds exactly as one process updating the whole slab would).
__global__ void adamw_update(float* master, floatX* params, const float* grad, float* m, float* v, size_t n,
                             size_t n_decay, float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                             const float* norm, float max_norm, uint32_t seed, size_t base) {
    float clip = 1.f;
    if (norm && max_norm > 0.f && norm[0] > max_norm) clip = max_norm / norm[0];
    uint32_t hs = hash_u32(seed);
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n;
         i += (size_t)gridDim.x * blockDim.x * 4) {
        float4 w = *(float4*)(master + i), g = *(const float4*)(grad + i), mi = *(float4*)(m + i),
               vi = *(float4*)(v + i);
        int decay = i < n_decay;
        w.x = adamw_one(w.x, g.x * clip, &mi.x, &vi.x, decay, lr, b1, b2, eps, wd, bc1, bc2);
        w.y = adamw_one(w.y, g.y * clip, &mi.y, &vi.y, decay, lr, b1, b2, eps, wd, bc1, bc2);
        w.z = adamw_one(w.z, g.z * clip, &mi.z, &vi.z, decay, lr, b1, b2, eps, wd, bc1, bc2);
        w.w = adamw_one(w.w, g.w * clip, &mi.w, &vi.w, decay, lr, b1, b2, eps, wd, bc1, bc2);
        *(float4*)(master + i) = w;
        *(float4*)(m + i) = mi;
        *(float4*)(v + i) = vi;
        store_rounded(params + i, w.x, hash_u32((uint32_t)(base + i) * 0x9E3779B9u ^ hs));
        store_rounded(params + i + 1, w.y, hash_u32((uint32_t)(base + i + 1) * 0x9E3779B9u ^ hs));
        store_rounded(params + i + 2, w.z, hash_u32((uint32_t)(base + i + 2) * 0x9E3779B9u ^ hs));
        store_rounded(params + i + 3, w.w, hash_u32((uint32_t)(base + i + 3) * 0x9E3779B9u ^ hs));
    }
}

// grad_to_bf16: dst[i] = bf16(g[i]) rounded to nearest even for i < n, 0 for n <= i < n_padded (a
// bucket's bf16 copy for a bf16 reduction; the zeros pad it to a multiple of the world size). Grid-stride.
__global__ void grad_to_bf16(__nv_bfloat16* dst, const float* g, size_t n, size_t n_padded) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_padded; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(i < n ? g[i] : 0.f);
}
// grad_from_bf16: g[i] = float(src[i]) * scale for i < n: a bf16 sum over ranks back to fp32, averaged
// (scale = 1 / world). Grid-stride.
__global__ void grad_from_bf16(float* g, const __nv_bfloat16* src, size_t n, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = __bfloat162float(src[i]) * scale;
}

// copy_to_floatX: dst = src rounded to nearest (the floatX weights from the fp32 master). Grid-stride.
__global__ void copy_to_floatX(floatX* dst, const float* src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = fromf(src[i]);
}

// ---------------------------------------------------------------------------------------------
// Phase timing (./trainer --bench). With bench_timer set, the launchers of the matmuls, the attention and the
// embedding (and the trainer's step, for the data, the all-reduce and the optimizer) record a CUDA event on the
// stream where their phase begins, and hand back to "other kernels" where they end; a phase lasts until the next
// mark, so the phases tile the step exactly. NULL (training): nothing is recorded.
enum {
    PHASE_DATA,  // waiting for the loader and the batch's copy
    PHASE_EMBED,
    PHASE_ATTN_FWD,
    PHASE_ATTN_BWD,
    PHASE_MATMUL,
    PHASE_OTHER,  // every other kernel: LayerNorm, GELU, bias gradients, the head's gathers, the loss
    PHASE_OPTIM,  // gradient norm, AdamW, zeroing the gradients
    PHASE_ALLREDUCE,
    PHASE_END,  // the step's last mark: nothing after it is counted
    PHASE_COUNT
};
static inline const char* phase_name(int p) {
    static const char* names[PHASE_COUNT] = {"data wait", "embedding",     "attention forward", "attention backward",
                                             "matmuls",   "other kernels", "optimizer",         "gradient all-reduce",
                                             "end"};
    return names[p];
}
typedef struct PhaseTimer {
    cudaEvent_t* ev;  // (cap) events, recorded in this order
    int* phase;       // (cap) the phase each recorded event begins
    int n, cap;
    double ms[PHASE_COUNT];  // accumulated by phase_timer_collect
} PhaseTimer;
// phase_timer_grow: room for cap more marks (events are created on the host and cost no device time: a step with
// more marks than the last simply makes more, so no count of a step's launches has to be kept right)
static inline void phase_timer_grow(PhaseTimer* t, int more) {
    t->ev = (cudaEvent_t*)realloc(t->ev, (t->cap + more) * sizeof(cudaEvent_t));
    t->phase = (int*)realloc(t->phase, (t->cap + more) * sizeof(int));
    if (!t->ev || !t->phase) {
        fprintf(stderr, "trainer: out of host memory for %d timing events\n", t->cap + more);
        exit(1);
    }
    for (int i = t->cap; i < t->cap + more; i++) CUDA_CHECK(cudaEventCreate(&t->ev[i]));
    t->cap += more;
}
static inline void phase_timer_init(PhaseTimer* t, int cap) {
    memset(t, 0, sizeof(*t));
    phase_timer_grow(t, cap);
}
static inline void phase_timer_free(PhaseTimer* t) {
    for (int i = 0; i < t->cap; i++) cudaEventDestroy(t->ev[i]);
    free(t->ev);
    free(t->phase);
    memset(t, 0, sizeof(*t));
}
static inline void phase_mark(PhaseTimer* t, int phase, cudaStream_t s) {
    if (!t) return;
    if (t->n == t->cap) phase_timer_grow(t, t->cap);
    CUDA_CHECK(cudaEventRecord(t->ev[t->n], s));
    t->phase[t->n++] = phase;
}
// phase_timer_collect: waits for the last mark, adds the time between consecutive marks to the phase
// each one began, and starts over.
static inline void phase_timer_collect(PhaseTimer* t) {
    if (t->n) CUDA_CHECK(cudaEventSynchronize(t->ev[t->n - 1]));
    for (int i = 0; i + 1 < t->n; i++) {
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, t->ev[i], t->ev[i + 1]));
        t->ms[t->phase[i]] += ms;
    }
    t->n = 0;
}
static PhaseTimer* bench_timer = NULL;  // set by --bench (bench.h) around its timed steps
static inline void bench_phase(int phase, cudaStream_t s) { phase_mark(bench_timer, phase, s); }

// ---------------------------------------------------------------------------------------------
// Matmuls through cuBLASLt. Row-major thinking: a Linear layer out (N, OC) = inp (N, IC) . W^T + bias, W (OC, IC)
// as torch.nn.Linear. cuBLASLt is column-major, where a row-major (R, K) matrix is a (K x R) one; so the
// forward is D = out^T (OC x N) = op(A) B with A = W seen as (IC x OC), transposed, and B = inp as (IC x N). A plan
// (operation descriptor, three layouts and the heuristic's algorithm) is built once per distinct shape and kept; a call
// only sets the bias and aux pointers. cuBLASLt's epilogues do the elementwise work where the data passes anyway:
//   BIAS           D = AB + bias (bias: OC, floatX)
//   GELU_AUX_BIAS  the MLP's first layer: aux = pre = AB + bias, D = GELU(pre), GELU's tanh form (gelu_tanh); pre is
//                  rounded to floatX in aux, GELU is taken of the fp32 pre (the H200 measured 2.84 ms at bert-base's
//                  fc1 against 3.76 for the plain matmul and a GELU kernel)
//   DGELU          its backward: D = (AB) * GELU'(aux), aux the forward's pre (2.59 ms against 4.65)
//   BGRADB         the weight gradient's bias gradient, bias[j] = sum over k of op(B)[k][j] (fp32; on this layout, NT
//                  with an fp32 D, the real cuBLASLt 13.0 sums exactly)
enum { BLAS_EPI_NONE, BLAS_EPI_BIAS, BLAS_EPI_BGRADB, BLAS_EPI_GELU_AUX_BIAS, BLAS_EPI_DGELU };

typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldd, epi;
    cudaDataType ab, cd;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    int has_algo;
} MatmulPlan;

#define BLAS_MAX_PLANS 64
typedef struct {
    cublasLtHandle_t lt;
    void* workspace;
    size_t workspace_size;
    int n;
    MatmulPlan plan[BLAS_MAX_PLANS];
} Blas;

static inline void blas_init(Blas* bl, size_t workspace_size) {
    memset(bl, 0, sizeof(*bl));
    CUBLAS_CHECK(cublasLtCreate(&bl->lt));
    bl->workspace_size = workspace_size;
    CUDA_CHECK(cudaMalloc(&bl->workspace, workspace_size));
}
static inline void blas_free(Blas* bl) {
    for (int i = 0; i < bl->n; i++) {
        cublasLtMatmulDescDestroy(bl->plan[i].desc);
        cublasLtMatrixLayoutDestroy(bl->plan[i].la);
        cublasLtMatrixLayoutDestroy(bl->plan[i].lb);
        cublasLtMatrixLayoutDestroy(bl->plan[i].ld);
    }
    cudaFree(bl->workspace);
    cublasLtDestroy(bl->lt);
    memset(bl, 0, sizeof(*bl));
}
// blas_heuristic: the first algorithm cuBLASLt's heuristic proposes for plan p's descriptors, within our workspace
// and for 16-byte aligned pointers, into p (has_algo 0 when it proposes none: cublasLtMatmul then picks).
static inline void blas_heuristic(const Blas* bl, MatmulPlan* p) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &bl->workspace_size, sizeof(bl->workspace_size)));
    // The heuristic never sees our pointers and assumes 256-byte alignment unless told; the slab only
    // guarantees 16 bytes per tensor (numel rounded to 8), so ask for kernels that need no more.
    uint32_t align = 16;
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof(align)));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(bl->lt, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1, &res, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0)
        p->algo = res.algo, p->has_algo = 1;
    cublasLtMatmulPreferenceDestroy(pref);
}
static inline void blas_set_pointer(MatmulPlan* p, cublasLtMatmulDescAttributes_t attr, const void* ptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, attr, &ptr, sizeof(ptr)));
}
static inline MatmulPlan* blas_plan(Blas* bl, int ta, int tb, int m, int n, int k, int lda, int ldb, int ldd,
                                    cudaDataType ab, cudaDataType cd, int epi) {
    for (int i = 0; i < bl->n; i++) {
        MatmulPlan* p = &bl->plan[i];
        if (p->ta == ta && p->tb == tb && p->m == m && p->n == n && p->k == k && p->lda == lda && p->ldb == ldb &&
            p->ldd == ldd && p->ab == ab && p->cd == cd && p->epi == epi)
            return p;
    }
    if (bl->n == BLAS_MAX_PLANS) {
        fprintf(stderr, "blas: more than %d matmul shapes\n", BLAS_MAX_PLANS);
        exit(1);
    }
    MatmulPlan* p = &bl->plan[bl->n++];
    memset(p, 0, sizeof(*p));
    p->ta = ta, p->tb = tb, p->m = m, p->n = n, p->k = k, p->lda = lda, p->ldb = ldb, p->ldd = ldd;
    p->ab = ab, p->cd = cd, p->epi = epi;
    // fp32 mode computes in true fp32 (CUBLAS_COMPUTE_32F, no TF32), bf16 mode accumulates in fp32
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    static const cublasLtEpilogue_t epilogues[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                                                   CUBLASLT_EPILOGUE_BGRADB, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                                                   CUBLASLT_EPILOGUE_DGELU};
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogues[epi],
                                                sizeof(epilogues[epi])));
    // An epilogue's bias and aux pointers must be set before the heuristic will answer (cpu/cublas.cpp refuses
    // without them); blas_matmul sets the real ones at each call. The placeholder is 16-byte aligned and no more, as
    // every bias and activation in the slabs is, so the kernel chosen for it accepts them all; it is never read.
    const void* placeholder = (const char*)bl->workspace + 16;
    if (epi == BLAS_EPI_BIAS || epi == BLAS_EPI_BGRADB || epi == BLAS_EPI_GELU_AUX_BIAS) {
        // the bias is a floatX parameter; a bias gradient has D's type (fp32: the real library refuses mixed types)
        cudaDataType bt = epi == BLAS_EPI_BGRADB ? cd : ab;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
        blas_set_pointer(p, CUBLASLT_MATMUL_DESC_BIAS_POINTER, placeholder);
    }
    if (epi == BLAS_EPI_GELU_AUX_BIAS || epi == BLAS_EPI_DGELU) {  // aux: D's type and layout
        int64_t aux_ld = ldd;
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        blas_set_pointer(p, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, placeholder);
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, ab, ta ? k : m, ta ? m : k, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, ab, tb ? n : k, tb ? k : n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ld, cd, m, n, ldd));
    blas_heuristic(bl, p);
    return p;
}
// blas_matmul: D (m x n, column-major, ld ldd, type cd) = op(A) op(B) [+ beta C], A and B floatX, then epilogue epi
// (see BLAS_EPI_*) with its bias (BIAS, GELU_AUX_BIAS: m floatX; BGRADB: n of type cd, written, not accumulated) and
// aux (GELU_AUX_BIAS, DGELU: D's type and layout). C, when given, has D's layout (it may be another buffer than D).
static inline void blas_matmul(Blas* bl, cudaStream_t s, int ta, int tb, int m, int n, int k, const void* A, int lda,
                               const void* B, int ldb, void* D, int ldd, cudaDataType cd, const void* C, float beta,
                               int epi, const void* bias, const void* aux) {
    MatmulPlan* p = blas_plan(bl, ta, tb, m, n, k, lda, ldb, ldd, FLOATX_CUDA, cd, epi);
    if (bias) blas_set_pointer(p, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (aux) blas_set_pointer(p, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    float alpha = 1.f;
    bench_phase(PHASE_MATMUL, s);
    CUBLAS_CHECK(cublasLtMatmul(bl->lt, p->desc, &alpha, A, p->la, B, p->lb, &beta, C ? C : D, p->ld, D, p->ld,
                                p->has_algo ? &p->algo : NULL, bl->workspace, bl->workspace_size, s));
    bench_phase(PHASE_OTHER, s);
}

// matmul_forward: out (N, OC; row stride ldo) = inp (N, IC) . W^T + bias, W (OC, IC); bias may be null.
static inline void matmul_forward(Blas* bl, cudaStream_t s, floatX* out, int ldo, const floatX* inp, const floatX* W,
                                  const floatX* bias, int N, int IC, int OC) {
    blas_matmul(bl, s, 1, 0, OC, N, IC, W, IC, inp, IC, out, ldo, FLOATX_CUDA, NULL, 0.f,
                bias ? BLAS_EPI_BIAS : BLAS_EPI_NONE, bias, NULL);
}
// matmul_forward_gelu: pre (N, OC) = inp (N, IC) . W^T + bias and out (N, OC) = GELU(pre) (gelu_tanh, of the fp32
// pre; pre is stored rounded), from one matmul (the GELU_AUX_BIAS epilogue).
static inline void matmul_forward_gelu(Blas* bl, cudaStream_t s, floatX* out, floatX* pre, const floatX* inp,
                                       const floatX* W, const floatX* bias, int N, int IC, int OC) {
    blas_matmul(bl, s, 1, 0, OC, N, IC, W, IC, inp, IC, out, OC, FLOATX_CUDA, NULL, 0.f, BLAS_EPI_GELU_AUX_BIAS, bias,
                pre);
}
// matmul_backward_input: dinp (N, IC) = dout (N, OC; row stride ldd) . W [+ acc (N, IC)]
static inline void matmul_backward_input(Blas* bl, cudaStream_t s, floatX* dinp, const floatX* dout, int ldd,
                                         const floatX* W, const floatX* acc, int N, int IC, int OC) {
    blas_matmul(bl, s, 0, 0, IC, N, OC, W, IC, dout, ldd, dinp, IC, FLOATX_CUDA, acc, acc ? 1.f : 0.f, BLAS_EPI_NONE,
                NULL, NULL);
}
// matmul_backward_input_gelu: the input gradient through a GELU, dpre (N, IC) = (dout (N, OC) . W) * GELU'(pre),
// pre (N, IC) what matmul_forward_gelu stored (the DGELU epilogue).
static inline void matmul_backward_input_gelu(Blas* bl, cudaStream_t s, floatX* dpre, const floatX* dout,
                                              const floatX* W, const floatX* pre, int N, int IC, int OC) {
    blas_matmul(bl, s, 0, 0, IC, N, OC, W, IC, dout, OC, dpre, IC, FLOATX_CUDA, NULL, 0.f, BLAS_EPI_DGELU, NULL, pre);
}
// matmul_backward_weight: dW (OC, IC, fp32) += dout (N, OC; row stride ldd)^T . inp (N, IC), and when dbias is
// given, dbias (OC, fp32) = sum_n dout[n] (the BGRADB epilogue: written, not accumulated; the caller adds it to
// the gradients, see add_and_clear). The bias gradient costs no pass over dout of its own.
static inline void matmul_backward_weight(Blas* bl, cudaStream_t s, float* dW, float* dbias, const floatX* dout,
                                          int ldd, const floatX* inp, int N, int IC, int OC) {
    blas_matmul(bl, s, 0, 1, IC, OC, N, inp, IC, dout, ldd, dW, IC, CUDA_R_32F, dW, 1.f,
                dbias ? BLAS_EPI_BGRADB : BLAS_EPI_NONE, dbias, NULL);
}

// ---------------------------------------------------------------------------------------------
// Launchers: grid shapes and shared-memory opt-in in one place (used by the model and the tests).

// The devices the planner and MFU know: a short name (--device's, as the user types it), the start of the full name
// cudaGetDeviceProperties gives (a longer prefix first), the memory (GB, the datasheet's: a real run plans with what
// its device reports) and the dense bf16 tensor-core peak in TFLOP/s (NVIDIA's datasheets; dense is half the "with
// sparsity" figure), the denominator of MFU.
typedef struct {
    const char *name, *prefix;
    double mem_gb, tflops;
} DeviceSpec;
static const DeviceSpec device_specs[] = {
    {"H100 NVL", "NVIDIA H100 NVL", 94, 835},  {"H100 PCIe", "NVIDIA H100 PCIe", 80, 756},
    {"H100", "NVIDIA H100", 80, 989},  // the SXM: "NVIDIA H100 80GB HBM3"
    {"H200 NVL", "NVIDIA H200 NVL", 141, 835}, {"H200", "NVIDIA H200", 141, 989},
    {"GH200", "NVIDIA GH200", 96, 989},        {"A100", "NVIDIA A100", 80, 312},
};
#define DEVICE_SPECS ((int)(sizeof device_specs / sizeof device_specs[0]))
// device_spec: the known device a name means, its short name (any case) or its full name; NULL: unknown.
static inline const DeviceSpec* device_spec(const char* name) {
    for (int i = 0; i < DEVICE_SPECS; i++)
        if (!strcasecmp(name, device_specs[i].name)) return &device_specs[i];
    for (int i = 0; i < DEVICE_SPECS; i++)
        if (!strncmp(name, device_specs[i].prefix, strlen(device_specs[i].prefix))) return &device_specs[i];
    return NULL;
}
// device_peak_tflops: the dense bf16 peak of the device a name means; 0: unknown.
static inline double device_peak_tflops(const char* name) {
    const DeviceSpec* d = device_spec(name);
    return d ? d->tflops : 0;
}

static inline int launch_grid_cap(void) { return 132 * 4; }  // blocks for grid-stride kernels (H100: 132 SMs)

static inline void attention_opt_in(const void* kernel, size_t bytes, size_t* done) {
    if (bytes > 48 * 1024 && bytes > *done) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
        *done = bytes;
    }
}
// kernel_opt_in: lets kernel use more than 48 KB of dynamic shared memory when bytes (with up to 8 KB of its
// static shared memory) need it; done remembers what was already asked for.
static inline void kernel_opt_in(const void* kernel, size_t bytes, size_t* done) {
    if (bytes + 8 * 1024 > 48 * 1024 && bytes > *done) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
        *done = bytes;
    }
}

// launch_embedding_layernorm_forward: out (N, C) and stats (N, 2) of embedding_layernorm_forward, whose blocks of
// 4 warps take 4 x emb_ln_warp_floats(C) floats of dynamic shared memory (12 KB at C = 768 in bf16).
static inline void launch_embedding_layernorm_forward(cudaStream_t s, floatX* out, float* stats, const int* tokens,
                                                      const int* types, const int* seg_lo, const int* seg_hi,
                                                      const floatX* wte, const floatX* wpe, const floatX* wtt,
                                                      const floatX* gamma, const floatX* beta, int N, int T, int C,
                                                      float eps) {
    if (N <= 0) return;
    size_t bytes = 4 * (size_t)emb_ln_warp_floats(C) * sizeof(float);
    static size_t done = 0;
    kernel_opt_in((const void*)embedding_layernorm_forward, bytes, &done);
    bench_phase(PHASE_EMBED, s);
    launch(embedding_layernorm_forward, dim3(ceil_div(N, 4)), dim3(128), bytes, s, out, stats, tokens, types, seg_lo,
           seg_hi, wte, wpe, wtt, gamma, beta, N, T, C, eps);
    bench_phase(PHASE_OTHER, s);
}

// tma_map: a tensor map for the tensor memory accelerator (the map argument of tma_load_2d/3d, gpu/ptx.h): the
// tensor at base, of rank dims[0..rank) elements of type (innermost first, dims[0] contiguous), strides[d - 1]
// bytes apart along dimension d >= 1, copied in boxes of box[0..rank) elements, swizzled in shared memory as
// swizzle says. cuTensorMapEncodeTiled is the driver's: the runtime hands it out (cudaGetDriverEntryPointByVersion),
// so the trainer links no driver library. A refusal stops the program, naming the shape.
static inline void tma_map(CUtensorMap* map, CUtensorMapDataType type, const void* base, int rank, const uint64_t* dims,
                           const uint64_t* strides, const uint32_t* box, CUtensorMapSwizzle swizzle) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (!encode) {
        cudaDriverEntryPointQueryResult q;
        void* fn = NULL;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !fn) {
            fprintf(stderr, "tma_map: the driver has no cuTensorMapEncodeTiled (CUDA 12.0 or later is needed)\n");
            exit(1);
        }
        encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    cuuint32_t ones[5] = {1, 1, 1, 1, 1};
    CUresult r = encode(map, type, (cuuint32_t)rank, (void*)base, (const cuuint64_t*)dims, (const cuuint64_t*)strides,
                        (const cuuint32_t*)box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "tma_map: cuTensorMapEncodeTiled refused (error %d) a rank-%d map at %p: dims", (int)r, rank,
                base);
        for (int d = 0; d < rank; d++) fprintf(stderr, " %llu", (unsigned long long)dims[d]);
        fprintf(stderr, ", box");
        for (int d = 0; d < rank; d++) fprintf(stderr, " %u", box[d]);
        fprintf(stderr, ", swizzle %d\n", (int)swizzle);
        exit(1);
    }
}

// The scratch of the LayerNorm and embedding backward (the model's memory plan counts it with these sizes):
static inline size_t ln_part_floats(int C) { return (size_t)launch_grid_cap() * 3 * C; }  // blocks' partials
// ln_backward_grid: the blocks of both LayerNorm backward kernels (the same, so that on the same rows they sum
// dgamma and dbeta in the same order): one per group of ln_rows(C) rows, at most one wave of LN_BWD_BLOCKS_PER_SM
// per SM (launch_grid_cap() counts 4 per SM).
static inline int ln_backward_grid(int N, int C) {
    int groups = ceil_div(N, ln_rows(C)), cap = launch_grid_cap() / 4 * LN_BWD_BLOCKS_PER_SM;
    return groups < cap ? groups : cap;
}
// ln_backward_smem: layernorm_backward's dynamic shared memory: its ring of LN_STAGES row groups (nv = 2 or 3
// partial vectors, gelu_pre given or not), or, when more, the ny x nv C floats of its partial sums.
static inline size_t ln_backward_smem(int C, int nv, int pre) {
    size_t ny = ln_rows(C), ring = LN_STAGES * ny * ((pre ? 3 : 2) * (size_t)ln_block_x(C) + 1) * 16,
           sums = ny * nv * C * sizeof(float);
    return ring > sums ? ring : sums;
}
static inline size_t emb_keys_count(long long N) { return (size_t)sort_pow2(3 * N); }  // sort keys (uint64)
static inline size_t emb_carry_floats(int C) { return (size_t)EMB_CHUNKS * 2 * C; }    // runs across chunks

// launch_layernorm_backward: dinp (N, C) = LayerNorm backward [times GELU'(gelu_pre)], dgamma/dbeta (C) += their
// sums over the N rows, and when dbias is given, dbias (C) += the column sums of dinp (the bias gradient of the
// matmul whose output dinp is the gradient of); part (ln_part_floats(C)) is scratch.
static inline void launch_layernorm_backward(cudaStream_t s, floatX* dinp, float* dgamma, float* dbeta, float* dbias,
                                             float* part, const floatX* dout, const floatX* inp, const float* stats,
                                             const floatX* gamma, const floatX* gelu_pre, int N, int C) {
    if (N <= 0) return;
    int ny = ln_rows(C), grid = ln_backward_grid(N, C), nv = dbias ? 3 : 2;
    if ((uintptr_t)stats % 16 || N >= 1 << 30) {  // (its rows' stats are copied 16 aligned bytes at a time)
        fprintf(stderr, "layernorm_backward: stats at %p with N = %d rows, expected 16-byte alignment and N < 2^30\n",
                (const void*)stats, N);
        exit(1);
    }
    size_t bytes = ln_backward_smem(C, nv, gelu_pre != NULL);
    static size_t done[2] = {0, 0};
    void (*kernel)(floatX*, float*, const floatX*, const floatX*, const float*, const floatX*, const floatX*, int, int,
                   int) = gelu_pre ? layernorm_backward<1> : layernorm_backward<0>;
    kernel_opt_in((const void*)kernel, bytes, &done[gelu_pre != NULL]);
    launch(kernel, dim3(grid), dim3(ln_block_x(C), ny), bytes, s, dinp, part, dout, inp, stats, gamma, gelu_pre, N, C,
           nv);
    launch(partials_sum, dim3(ceil_div(nv * C, 32)), dim3(32, 8), 0, s, dgamma, dbeta, dbias, (const float*)part, grid,
           C, nv);
}

// launch_sort_keys: sorts keys[0, n_valid) ascending; keys has room for sort_pow2(n_valid) (the padding sorts last).
static inline void launch_sort_keys(cudaStream_t s, uint64_t* keys, long long n_valid) {
    long long n = sort_pow2(n_valid);
    int tile = n < SORT_TILE ? (int)n : SORT_TILE, blocks = (int)(n / tile);
    launch(sort_keys_tile, dim3(blocks), dim3(tile / 2), 0, s, keys, n_valid, n, 2LL, (long long)tile);
    for (long long k = 2 * (long long)tile; k <= n; k *= 2) {
        for (long long j = k / 2; j >= tile; j /= 2)
            launch(sort_keys_step, dim3(ceil_div(n / 2, 256)), dim3(256), 0, s, keys, n, k, j);
        launch(sort_keys_tile, dim3(blocks), dim3(tile / 2), 0, s, keys, n, n, k, k);
    }
}

// launch_embedding_backward: the backward of embedding_layernorm_forward. dwte (V, C), dwpe (P, C), dwtt (types, C),
// dgamma, dbeta (C) += their gradients (fp32), in an order fixed by the batch. Scratch: dx (N, C) fp32, keys
// (emb_keys_count(N)), carry (emb_carry_floats(C)), part (ln_part_floats(C)).
static inline void launch_embedding_backward(cudaStream_t s, float* dwte, float* dwpe, float* dwtt, float* dgamma,
                                             float* dbeta, float* dx, uint64_t* keys, float* carry, float* part,
                                             const floatX* dout, const float* stats, const int* tokens,
                                             const int* types, const int* seg_lo, const int* seg_hi, const floatX* wte,
                                             const floatX* wpe, const floatX* wtt, const floatX* gamma, int N, int T,
                                             int C, int V, int P) {
    if (N <= 0) return;
    int ny = ln_rows(C), grid = ln_backward_grid(N, C);
    size_t bytes = (size_t)ny * 2 * C * sizeof(float);
    static size_t done = 0, done_c = 0;
    bench_phase(PHASE_EMBED, s);
    kernel_opt_in((const void*)embedding_layernorm_backward, bytes, &done);
    launch(embedding_layernorm_backward, dim3(grid), dim3(ln_block_x(C), ny), bytes, s, dx, keys, part, dout, stats,
           tokens, types, seg_lo, seg_hi, wte, wpe, wtt, gamma, N, T, C, V, P);
    launch(partials_sum, dim3(ceil_div(2 * C, 32)), dim3(32, 8), 0, s, dgamma, dbeta, (float*)NULL, (const float*)part,
           grid, C, 2);
    long long E = 3LL * N;
    launch_sort_keys(s, keys, E);
    int K = ceil_div(E, EMB_CHUNKS), chunks = ceil_div(E, K), cx = ceil_div(C / 4, 32) * 32, cy = 1024 / cx;
    if (cy > 4) cy = 4;
    launch(embedding_table_chunks, dim3(chunks), dim3(cx), 0, s, dwte, dwpe, dwtt, carry, (const uint64_t*)keys,
           (const float*)dx, (int)E, K, C, V, P);
    size_t cbytes = (size_t)cy * C * sizeof(float);
    kernel_opt_in((const void*)embedding_table_carries, cbytes, &done_c);
    launch(embedding_table_carries, dim3(chunks), dim3(cx, cy), cbytes, s, dwte, dwpe, dwtt, (const float*)carry,
           (const uint64_t*)keys, (int)E, K, C, V, P);
    bench_phase(PHASE_OTHER, s);
}

// colsum_grid_y: the rows of blocks of column_sums over I columns: about launch_grid_cap() blocks in all, one wave
// (4 blocks of 256 threads per SM); colsum_part_floats: their
// partials' scratch.
static inline int colsum_grid_y(int I) {
    int gx = ceil_div(I / X128, 32), gy = launch_grid_cap() / gx;
    return gy > 0 ? gy : 1;
}
static inline size_t colsum_part_floats(int I) { return (size_t)colsum_grid_y(I) * I; }
// launch_column_sums: dbias (C) += the column sums of x (N, C); part (colsum_part_floats(C)) is scratch.
static inline void launch_column_sums(cudaStream_t s, float* dbias, float* part, const floatX* x, int N, int C) {
    if (N <= 0) return;
    int gx = ceil_div(C / X128, 32), gy = colsum_grid_y(C);
    if (gy > ceil_div(N, 8)) gy = ceil_div(N, 8);
    launch(column_sums, dim3(gx, gy), dim3(32, 8), 0, s, part, x, N, C);
    launch(partials_sum, dim3(ceil_div(C, 32)), dim3(32, 8), 0, s, dbias, (float*)NULL, (float*)NULL,
           (const float*)part, gy, C, 1);
}
static inline void launch_add_and_clear(cudaStream_t s, float* dst, float* src, size_t n) {
    int grid = ceil_div((long long)(n / 4), 256);
    if (grid > launch_grid_cap()) grid = launch_grid_cap();
    if (grid > 0) launch(add_and_clear, dim3(grid), dim3(256), 0, s, dst, src, n);
}

#include "attention.cuh"  // the attention kernels and their launchers
