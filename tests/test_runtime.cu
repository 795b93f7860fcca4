// test_runtime.cu: kernels that use each CUDA primitive the project relies on, checked against
// plain C. Portable: the same file runs on the CPU runtime (build/test_runtime) and on a GPU
// (build/gpu/test_runtime), so a primitive the emulator got wrong shows up as a difference.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <ptx.h>
#include "../kernels.cuh"
#include "testing.h"
#include <pthread.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Block sum in static shared memory: a tree with __syncthreads between levels.
// Block of 256 threads; block b sums x[b*256 .. b*256+255] into out[b].
__global__ void block_sum_static_smem(const float* x, float* out) {
    __shared__ float s[256];
    int t = threadIdx.x;
    s[t] = x[blockIdx.x * 256 + t];
    __syncthreads();
    for (int stride = 128; stride > 0; stride /= 2) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

// Warp reductions of every kind, one warp per block, each lane holding x[lane].
// out[0..3]: xor-sum, down-sum, max by xor, broadcast of lane 7; out[4+lane]: inclusive scan by up.
__global__ void warp_shuffles(const float* x, float* out) {
    int lane = threadIdx.x;
    float v = x[lane], s = v, d = v, m = v, scan = v;
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    for (int o = 16; o > 0; o /= 2) d += __shfl_down_sync(0xffffffffu, d, o);
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float b = __shfl_sync(0xffffffffu, v, 7);
    for (int o = 1; o < 32; o *= 2) {
        float up = __shfl_up_sync(0xffffffffu, scan, o);
        if (lane >= o) scan += up;
    }
    if (lane == 0) {
        out[0] = s;
        out[1] = d;
        out[2] = m;
    }
    if (lane == 5) out[3] = b;  // every lane got lane 7's value; lane 5 reports it
    out[4 + lane] = scan;
    if (s != __shfl_sync(0xffffffffu, s, 0)) out[0] = -1.0f;  // xor reduction: every lane holds the total
}

// Shuffles of other types and widths: double, int, bf16, bf162 and 8-wide segments.
// out[lane] = sum of the 8-lane segment (width 8) as double, plus others written by lane 0.
__global__ void warp_shuffle_types(const double* xd, double* out_seg, int* out_int, __nv_bfloat16* out_bf,
                                   __nv_bfloat162* out_bf2) {
    int lane = threadIdx.x;
    double v = xd[lane];
    for (int o = 4; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o, 8);
    out_seg[lane] = v;
    int iv = lane * 3;
    out_int[lane] = __shfl_down_sync(0xffffffffu, iv, 3, 16);  // stays inside 16-lane segments
    __nv_bfloat16 bv = __float2bfloat16((float)lane);
    out_bf[lane] = __shfl_sync(0xffffffffu, bv, 31 - lane);
    __nv_bfloat162 b2 = __floats2bfloat162_rn((float)lane, (float)-lane);
    out_bf2[lane] = __shfl_xor_sync(0xffffffffu, b2, 1);
}

// Divergent groups: lanes 0-15 and 16-31 each reduce with their own mask, in different branches.
__global__ void warp_divergent_groups(const float* x, float* out) {
    int lane = threadIdx.x;
    float v = x[lane];
    if (lane < 16) {
        for (int o = 8; o > 0; o /= 2) v += __shfl_xor_sync(0x0000ffffu, v, o);
    } else {
        v *= 2.0f;
        for (int o = 8; o > 0; o /= 2) v += __shfl_down_sync(0xffff0000u, v, o, 16);
    }
    out[lane] = v;
}

// Votes: out[0] = ballot of (x[lane] > 0), out[1] = any, out[2] = all, out[3] = popc(ballot).
__global__ void warp_votes(const float* x, unsigned* out) {
    int lane = threadIdx.x;
    int p = x[lane] > 0.0f;
    unsigned b = __ballot_sync(0xffffffffu, p);
    int any = __any_sync(0xffffffffu, p), all = __all_sync(0xffffffffu, p);
    __syncwarp();
    if (lane == 0) {
        out[0] = b;
        out[1] = any;
        out[2] = all;
        out[3] = __popc(b);
    }
}

// Atomics from many blocks: a histogram of x into 16 bins, a float sum, a max, a CAS-counted ticket.
__global__ void atomics_kernel(const int* x, int n, int* hist, float* fsum, int* imax, unsigned* tickets,
                               __nv_bfloat16* bsum) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(&hist[x[i] & 15], 1);
    atomicAdd(fsum, 0.5f);
    atomicMax(imax, x[i]);
    unsigned old, cur = *tickets;
    do {
        old = cur;
        cur = atomicCAS(tickets, old, old + 1);
    } while (cur != old);
    if ((i & 63) == 0) atomicAdd(bsum, __float2bfloat16(1.0f));
}

// Dynamic shared memory above 48 KB (needs the kernel's opt-in): reverse n floats of a block.
__global__ void reverse_dyn_smem(const float* x, float* out, int n) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    float* s = (float*)dyn_smem;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = x[blockIdx.x * n + i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[blockIdx.x * n + i] = s[n - 1 - i];
}

// Early return: threads past n leave; the rest still meet at a barrier and count with __syncthreads_count.
__global__ void early_return_count(const float* x, int n, int* out_count, float* out) {
    __shared__ float s[128];
    int t = threadIdx.x;
    if (t >= n) return;
    s[t] = x[t];
    int positives = __syncthreads_count(x[t] > 0.0f);
    int all_pos = __syncthreads_and(x[t] > 0.0f);
    int any_big = __syncthreads_or(x[t] > 0.9f);
    out[t] = s[n - 1 - t];
    if (t == 0) {
        out_count[0] = positives;
        out_count[1] = all_pos;
        out_count[2] = any_big;
    }
}

// Index arithmetic in 3D: every thread writes its global linear id at its global position.
__global__ void index_3d(int* out, int nx, int ny) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    if (x >= nx || y >= ny) return;
    out[(z * ny + y) * nx + x] = x + 1000 * y + 1000000 * z;
}

// Tensor cores through WMMA: C (M, N) = A (M, K) @ B (K, N), bf16 in, fp32 out, one warp per 16x16
// tile of C. A is row-major; B is read column-major (B^T stored row-major (N, K)) when b_col is set.
// The result is stored row-major, or column-major when c_col is set.
__global__ void wmma_matmul(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C, int M, int N, int K, int b_col,
                            int c_col) {
    using namespace nvcuda;
    int tile_m = blockIdx.y, tile_n = blockIdx.x;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < K; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, A + (size_t)tile_m * 16 * K + k, K);
        if (b_col) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
            wmma::load_matrix_sync(b, B + (size_t)tile_n * 16 * K + k, K);
            wmma::mma_sync(acc, a, b, acc);
        } else {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
            wmma::load_matrix_sync(b, B + (size_t)k * N + tile_n * 16, N);
            wmma::mma_sync(acc, a, b, acc);
        }
    }
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= 2.0f;  // elementwise ops on fragments work
    if (c_col)
        wmma::store_matrix_sync(C + (size_t)tile_n * 16 * M + tile_m * 16, acc, M, wmma::mem_col_major);
    else
        wmma::store_matrix_sync(C + (size_t)tile_m * 16 * N + tile_n * 16, acc, N, wmma::mem_row_major);
}

// ----------------------------------------------------------------------------
// The PTX primitives of <ptx.h>, checked against the per-lane layouts the PTX ISA documents (with
// g = lane / 4, t = lane % 4). Every lane builds its registers from global memory with the documented
// formulas, written out here independently of the header.
static __device__ uint32_t pack2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    __nv_bfloat16_raw a = lo, b = hi;
    return (uint32_t)a.x | (uint32_t)b.x << 16;
}
// D (16 x 8) = A (16 x 16, row-major) . B (16 x 8, row-major k x n) + C (16 x 8), one warp.
__global__ void mma_16816_layout(const __nv_bfloat16* A, const __nv_bfloat16* B, const float* C, float* D) {
    int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    uint32_t a[4] = {pack2(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]),
                     pack2(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]),
                     pack2(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]),
                     pack2(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9])};
    uint32_t b[2] = {pack2(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]),
                     pack2(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g])};
    float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]}, d[4];
    mma_m16n8k16_bf16(d, a, b, c);
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}
// ldmatrix.x4 (trans = 0) or .x4.trans (1) of M (32 rows x 8, 16-bit): shared rows 32 elements apart, and
// lane l addresses row l % 8 of matrix l / 8 at shared row 31 - l (so a wrong per-lane address shows).
// out[lane * 4 + i] = register i of the lane.
__global__ void ldmatrix_layout(const unsigned short* M, uint32_t* out, int trans) {
    __shared__ __align__(16) unsigned short s[32 * 32];
    int lane = threadIdx.x;
    for (int c = 0; c < 8; c++) s[(31 - lane) * 32 + c] = M[lane * 8 + c];
    __syncwarp();
    uint32_t r[4];
    if (trans)
        ldmatrix_x4_trans(r, s + (31 - lane) * 32);
    else
        ldmatrix_x4(r, s + (31 - lane) * 32);
    for (int i = 0; i < 4; i++) out[lane * 4 + i] = r[i];
}
// cp.async: 64 threads each copy 16 bytes (src_bytes 16, 8 or 0 by thread) into shared memory, in two
// groups (threads' first and second chunks). After wait<1> the first group is complete: out1 gets it;
// after wait<0> everything: out2 gets both chunks.
__global__ void cp_async_groups(const int4* src, int4* out1, int4* out2) {
    __shared__ int4 s[128];
    int t = threadIdx.x, n1 = t % 3 == 0 ? 0 : t % 3 == 1 ? 8 : 16, n2 = t % 2 ? 16 : 8;
    cp_async_16(&s[t], &src[t], n1);
    cp_async_commit();
    cp_async_16(&s[64 + t], &src[64 + t], n2);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    out1[t] = s[(t + 1) % 64];  // another thread's copy: visible after its wait and the barrier
    cp_async_wait<0>();
    __syncthreads();
    out2[t] = s[(t + 7) % 128];
    out2[64 + t] = s[(t + 71) % 128];
}

// wgmma (one warpgroup, 128 threads): D (64 x N) = A (64 x 64) . Bm (64 x N), four k16 steps, every
// operand layout a kernel of ours may use. Each case writes A and B into shared memory with its own
// formula for the bytes (the swizzles as the 16-byte chunk permutations TMA and CUTLASS write), builds
// the descriptors, and reads D back through the documented fragment layout. Cases:
//   0: N 64,  A K-major 128B swizzle,  B K-major 128B swizzle           (S = Q K^T)
//   1: N 64,  A K-major 128B swizzle,  B MN-major 128B swizzle          (O = P V, V row-major)
//   2: N 128, A from registers,        B K-major, no swizzle (core matrices of 8 x 16 bytes)
//   3: N 128, A K-major 64B swizzle,   B MN-major 128B swizzle, two 64-column atoms (LBO)
__device__ int wg_a_off(int c, int r, int k) {  // byte of A[r][k] in its tile
    if (c == 3) {                               // [k / 32][r / 8][8 rows of 64 bytes], chunks ^= (r % 8) / 2
        int kk = k % 32;
        return (k / 32) * 4096 + (r / 8) * 512 + (r % 8) * 64 + ((kk / 8) ^ ((r % 8) / 2)) * 16 + (kk % 8) * 2;
    }
    return (r / 8) * 1024 + (r % 8) * 128 + ((k / 8) ^ (r % 8)) * 16 + (k % 8) * 2;  // rows of 128 bytes
}
__device__ int wg_b_off(int c, int k, int n) {  // byte of Bm[k][n] in its tile
    switch (c) {
        case 0:  // N rows of K: as A
            return (n / 8) * 1024 + (n % 8) * 128 + ((k / 8) ^ (n % 8)) * 16 + (k % 8) * 2;
        case 1:  // K rows of 64 n (128 bytes), chunks ^= k % 8
            return (k / 8) * 1024 + (k % 8) * 128 + ((n / 8) ^ (k % 8)) * 16 + (n % 8) * 2;
        case 2:  // core matrices (8 n x 8 k, n-rows of 16 bytes): [n / 8][k / 8]
            return (n / 8) * 1024 + (k / 8) * 128 + (n % 8) * 16 + (k % 8) * 2;
        default:  // [k / 8][n / 64][8 k-rows of 64 n]
            return (k / 8) * 2048 + (n / 64) * 1024 + (k % 8) * 128 + (((n % 64) / 8) ^ (k % 8)) * 16 + (n % 8) * 2;
    }
}
template <int C, int N, int TRANS_B>
__global__ void wgmma_layouts(const __nv_bfloat16* A, const __nv_bfloat16* Bm, float* D) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    unsigned char* sA = dyn_smem + (1024 - smem_addr(dyn_smem) % 1024) % 1024;  // swizzle patterns need 1024
    unsigned char* sB = sA + 8192;
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    for (int i = tid; i < 64 * 64; i += 128) memcpy(sA + wg_a_off(C, i / 64, i % 64), &A[i], 2);
    for (int i = tid; i < 64 * N; i += 128) memcpy(sB + wg_b_off(C, i / N, i % N), &Bm[i], 2);
    fence_proxy_async();  // st.shared -> wgmma's reads
    __syncthreads();
    uint32_t a[4][4];  // case 2: A in registers for the four steps, alive until the wait
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < 4; i++) {
            int r = 16 * warp + g + 8 * (i % 2), k = 16 * s + 2 * t + 8 * (i / 2);
            a[s][i] = pack2(A[r * 64 + k], A[r * 64 + k + 1]);
        }
    float d[N / 2];
    for (int i = 0; i < N / 2; i++) d[i] = NAN;  // scale_d = 0 on the first step: never read
    uint32_t a0 = smem_addr(sA), b0 = smem_addr(sB);
    wgmma_fence();
    for (int s = 0; s < 4; s++) {
        uint64_t ad = C == 3 ? wgmma_desc(a0 + (s / 2) * 4096 + (s % 2) * 32, WGMMA_SWIZZLE_64B, 16, 512)
                             : wgmma_desc(a0 + s * 32, WGMMA_SWIZZLE_128B, 16, 1024);
        uint64_t bd = C == 0   ? wgmma_desc(b0 + s * 32, WGMMA_SWIZZLE_128B, 16, 1024)
                      : C == 1 ? wgmma_desc(b0 + s * 2048, WGMMA_SWIZZLE_128B, 8192, 1024)
                      : C == 2 ? wgmma_desc(b0 + s * 256, WGMMA_SWIZZLE_NONE, 128, 1024)
                               : wgmma_desc(b0 + s * 4096, WGMMA_SWIZZLE_128B, 1024, 2048);
        if (C == 2)
            wgmma_m64k16_bf16_rs<N, TRANS_B>(d, a[s], bd, s > 0);
        else
            wgmma_m64k16_bf16<N, TRANS_B>(d, ad, bd, s > 0);
    }
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operand(d, N / 2);
    for (int j = 0; j < N / 8; j++)
        for (int i = 0; i < 4; i++) D[(16 * warp + g + 8 * (i / 2)) * N + 8 * j + 2 * t + i % 2] = d[4 * j + i];
}

// ----------------------------------------------------------------------------
// TMA (cp.async.bulk.tensor) with mbarriers, on both builds. The tensors are bf16, their boxes 64 elements
// (128 bytes) wide with the 128-byte swizzle; the checks compare the shared bytes with tma_sw_off, the swizzle
// as the 16-byte chunk permutation CUTLASS and the CUDA programming guide give (chunk j of row r at j ^ (r % 8)
// in each 1 KB of 8 rows), not with the emulator's code.
static int tma_sw_off(int r, int e) { return r * 128 + ((e / 8) ^ (r % 8)) * 16 + (e % 8) * 2; }
// tma_box: thread 0 copies the box at (c0, c1, c2) of a 3D map into 1024-aligned shared memory (its own expect_tx
// on the barrier); every thread waits for phase 0 and copies the shared bytes, as they lie, to out.
__global__ void tma_box(const __grid_constant__ CUtensorMap map, int c0, int c1, int c2, int bytes,
                        unsigned char* out) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ __align__(8) uint64_t bar;
    unsigned char* dst = dyn_smem + (1024 - smem_addr(dyn_smem) % 1024) % 1024;
    if (threadIdx.x == 0) {
        mbar_init(&bar, 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(&bar, bytes);
        tma_load_3d(dst, &map, c0, c1, c2, &bar);
    }
    mbar_wait(&bar, 0);
    for (int i = threadIdx.x; i < bytes; i += blockDim.x) out[i] = dst[i];
}
// tma_pipeline: n tiles (boxes at (0, 32 i) of a 2D map, 32 rows of 64) through two shared buffers, FlashAttention-3's
// producer and consumers: warp 4's lane 0 waits for a buffer's "empty" phase, expects its bytes on "full" and
// issues the copy; warps 0-3 wait for "full", copy the tile's bytes to out (tile i at out + 4096 i), and each
// warp's lane 0 arrives on "empty" (4 arrivals a phase). Tile i uses buffer i % 2 and waits for phase parity
// (i / 2) % 2 of "full"; the producer's first wait on "empty" (parity 1) returns at once.
__global__ void tma_pipeline(const __grid_constant__ CUtensorMap map, int n, unsigned char* out) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ __align__(8) uint64_t full[2], empty[2];
    unsigned char* buf = dyn_smem + (1024 - smem_addr(dyn_smem) % 1024) % 1024;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int b = 0; b < 2; b++) mbar_init(&full[b], 1), mbar_init(&empty[b], 4);
        fence_mbarrier_init();
    }
    __syncthreads();
    for (int i = 0; i < n; i++) {
        int b = i % 2, parity = (i / 2) % 2;
        if (warp == 4) {
            if (lane == 0) {
                mbar_wait(&empty[b], parity ^ 1);
                mbar_arrive_expect_tx(&full[b], 4096);
                tma_load_2d(buf + b * 4096, &map, 0, 32 * i, &full[b]);
            }
        } else {
            mbar_wait(&full[b], parity);
            for (int k = threadIdx.x; k < 4096; k += 128) out[4096 * i + k] = buf[b * 4096 + k];
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[b]);
        }
    }
}
// tma_wgmma: A (64 x 64) and B (64 x 64) copied by TMA from a (128, 64) bf16 matrix (rows 0-63, 64-127), then
// D = A B^T by one warpgroup reading both K-major through the 128-byte swizzle (as attention's S = Q K^T): the
// layout TMA writes is the one wgmma reads.
__global__ void tma_wgmma(const __grid_constant__ CUtensorMap map, float* D) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ __align__(8) uint64_t bar;
    unsigned char* sA = dyn_smem + (1024 - smem_addr(dyn_smem) % 1024) % 1024;
    unsigned char* sB = sA + 8192;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    if (threadIdx.x == 0) {
        mbar_init(&bar, 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(&bar, 16384);
        tma_load_2d(sA, &map, 0, 0, &bar);
        tma_load_2d(sB, &map, 0, 64, &bar);
    }
    mbar_wait(&bar, 0);
    float d[32];
    uint32_t a0 = smem_addr(sA), b0 = smem_addr(sB);
    wgmma_fence();
    for (int s = 0; s < 4; s++)
        wgmma_m64k16_bf16<64, 0>(d, wgmma_desc(a0 + s * 32, WGMMA_SWIZZLE_128B, 16, 1024),
                                 wgmma_desc(b0 + s * 32, WGMMA_SWIZZLE_128B, 16, 1024), s > 0);
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operand(d, 32);
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 4; i++) D[(16 * warp + g + 8 * (i / 2)) * 64 + 8 * j + 2 * t + i % 2] = d[4 * j + i];
}

static void test_tma(void) {
    // a (3, 50, 192) tensor of bf16 (B, T, W), each element its own small integer
    const int W = 192, T = 50, Bn = 3;
    static __nv_bfloat16 h[3 * 50 * 192];
    for (int i = 0; i < Bn * T * W; i++) h[i] = __float2bfloat16((float)(i % 251));
    __nv_bfloat16* dt;
    unsigned char *dout, got[32 * 128 * 6];
    CUDA_OK(cudaMalloc(&dt, sizeof h));
    CUDA_OK(cudaMalloc(&dout, sizeof got));
    CUDA_OK(cudaMemcpy(dt, h, sizeof h, cudaMemcpyHostToDevice));
    CUtensorMap map3, map2, mapw;
    uint64_t dims3[3] = {(uint64_t)W, (uint64_t)T, (uint64_t)Bn}, str3[2] = {W * 2ull, W * T * 2ull};
    uint32_t box3[3] = {64, 32, 1};
    tma_map(&map3, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, dt, 3, dims3, str3, box3, CU_TENSOR_MAP_SWIZZLE_128B);
    // boxes inside, past the rows (T), before the first row, past the columns (W)
    int cases[5][3] = {{0, 0, 0}, {64, 16, 1}, {128, 32, 2}, {0, -8, 1}, {160, 40, 0}};
    size_t smem = 1024 + 4096;
    CUDA_OK(cudaFuncSetAttribute(tma_box, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int c = 0; c < 5; c++) {
        int c0 = cases[c][0], c1 = cases[c][1], c2 = cases[c][2];
        CUDA_OK(cudaMemset(dout, 0xAB, 4096));
        launch(tma_box, dim3(1), dim3(128), smem, (cudaStream_t)0, map3, c0, c1, c2, 4096, dout);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(got, dout, 4096, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int r = 0; r < 32; r++)
            for (int e = 0; e < 64; e++) {
                int t = c1 + r, w = c0 + e, in = t >= 0 && t < T && w < W;
                uint16_t want = 0, g;
                if (in) memcpy(&want, &h[((size_t)c2 * T + t) * W + w], 2);
                memcpy(&g, got + tma_sw_off(r, e), 2);
                if (g != want && bad < 4)  // (each element is its index mod 251: where it came from, for a fix)
                    printf("  tma_load_3d box (%d, %d, %d): row %d element %d (shared byte %d) holds %g, want %g\n", c0,
                           c1, c2, r, e, tma_sw_off(r, e), __bfloat162float(*(__nv_bfloat16*)&g),
                           __bfloat162float(*(__nv_bfloat16*)&want));
                bad += g != want;
            }
        CHECK(bad == 0, "tma_load_3d: box at (%d, %d, %d), 128B swizzle, zeros outside the tensor: %d of 2048 wrong",
              c0, c1, c2, bad);
    }
    // the pipeline: 6 tiles of 32 rows of a (150, 64) matrix (the last tile's 2 rows past the end are zeros)
    uint64_t dims2[2] = {64, 150}, str2[1] = {128};
    uint32_t box2[2] = {64, 32};
    tma_map(&map2, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, dt, 2, dims2, str2, box2, CU_TENSOR_MAP_SWIZZLE_128B);
    smem = 1024 + 8192;
    CUDA_OK(cudaFuncSetAttribute(tma_pipeline, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    launch(tma_pipeline, dim3(1), dim3(160), smem, (cudaStream_t)0, map2, 5, dout);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(got, dout, 5 * 4096, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 5; i++)
        for (int r = 0; r < 32; r++)
            for (int e = 0; e < 64; e++) {
                int row = 32 * i + r;
                uint16_t want = 0, g;
                if (row < 150) memcpy(&want, &h[(size_t)row * 64 + e], 2);
                memcpy(&g, got + 4096 * i + tma_sw_off(r, e), 2);
                bad += g != want;
            }
    CHECK(bad == 0,
          "tma_load_2d through two buffers, full/empty mbarriers, 1 producer and 4 consumer warps, "
          "5 tiles: %d of 10240 elements wrong",
          bad);
    // TMA then wgmma: small integers, so every sum is exact
    static __nv_bfloat16 hm[128 * 64];
    static float want[64 * 64], dgot[64 * 64];
    for (int i = 0; i < 128 * 64; i++) hm[i] = __float2bfloat16((float)((i * 7 + 3) % 11 - 5));
    CUDA_OK(cudaMemcpy(dt, hm, sizeof hm, cudaMemcpyHostToDevice));
    uint64_t dimsw[2] = {64, 128}, strw[1] = {128};
    uint32_t boxw[2] = {64, 64};
    tma_map(&mapw, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, dt, 2, dimsw, strw, boxw, CU_TENSOR_MAP_SWIZZLE_128B);
    float* dD;
    CUDA_OK(cudaMalloc(&dD, sizeof dgot));
    smem = 1024 + 16384;
    CUDA_OK(cudaFuncSetAttribute(tma_wgmma, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    launch(tma_wgmma, dim3(1), dim3(128), smem, (cudaStream_t)0, mapw, dD);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(dgot, dD, sizeof dgot, cudaMemcpyDeviceToHost));
    for (int r = 0; r < 64; r++)
        for (int n = 0; n < 64; n++) {
            float acc = 0;
            for (int k = 0; k < 64; k++)
                acc += __bfloat162float(hm[r * 64 + k]) * __bfloat162float(hm[(64 + n) * 64 + k]);
            want[r * 64 + n] = acc;
        }
    check_close("tma_load_2d of A and B, then wgmma D = A B^T (both K-major, 128B swizzle)", dgot, want, 64 * 64, 0, 0);
    cudaFree(dt), cudaFree(dout), cudaFree(dD);
}

// ----------------------------------------------------------------------------
// Streams as the GPU runs them. These kernels and checks run on both builds (CPU: cpu/runtime.cpp's stream
// workers). stall_spin (kernels.cuh) holds a stream until the host sets a flag in pinned memory.

// set_int: *p = v. One thread.
__global__ void set_int(int* p, int v) { *p = v; }
// copy_int: *dst = *src. One thread.
__global__ void copy_int(int* dst, const int* src) { *dst = *src; }

static const long long STALL_CYCLES = 40000000000LL;  // ~20 s at 2 GHz: only the flag ends it in the tests

static double host_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
// release_after: a host thread that sets *flag = 1 after ms milliseconds (so that a host call that blocks
// until the stream is done returns, and the test can time it).
typedef struct {
    volatile int* flag;
    int ms;
} Release;
static void* release_main(void* arg) {
    Release* r = (Release*)arg;
    usleep(1000 * r->ms);
    *r->flag = 1;
    return NULL;
}

static void test_streams(void) {
    volatile int* flag;
    int* pinned;
    int *d, *d2;
    CUDA_OK(cudaHostAlloc((void**)&flag, sizeof(int), cudaHostAllocMapped));
    CUDA_OK(cudaMallocHost((void**)&pinned, sizeof(int)));
    CUDA_OK(cudaMalloc(&d, sizeof(int)));
    CUDA_OK(cudaMalloc(&d2, sizeof(int)));
    cudaStream_t s1, s2;
    CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t e1, e2;
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaEventCreate(&e2));

    // a launch returns before its kernel is done; cudaStreamQuery says NotReady, then Success
    *flag = 0;
    launch(stall_spin, dim3(1), dim3(1), 0, s1, (const volatile int*)flag, STALL_CYCLES);
    CHECK(cudaStreamQuery(s1) == cudaErrorNotReady, "cudaStreamQuery while a kernel spins: not cudaErrorNotReady");
    *flag = 1;
    CHECK(cudaStreamSynchronize(s1) == cudaSuccess, "cudaStreamSynchronize after the release");
    CHECK(cudaStreamQuery(s1) == cudaSuccess, "cudaStreamQuery after cudaStreamSynchronize: not cudaSuccess");

    // events across two streams: s2 waits for s1's event, so its copy sees s1's write
    *flag = 0;
    CUDA_OK(cudaMemset(d, 0, sizeof(int)));
    CUDA_OK(cudaMemset(d2, 0, sizeof(int)));
    launch(stall_spin, dim3(1), dim3(1), 0, s1, (const volatile int*)flag, STALL_CYCLES);
    launch(set_int, dim3(1), dim3(1), 0, s1, d, 42);
    CUDA_OK(cudaEventRecord(e1, s1));
    CUDA_OK(cudaStreamWaitEvent(s2, e1, 0));
    launch(copy_int, dim3(1), dim3(1), 0, s2, d2, (const int*)d);
    CUDA_OK(cudaEventRecord(e2, s2));
    CHECK(cudaEventQuery(e1) == cudaErrorNotReady, "cudaEventQuery of an event behind a spinning kernel");
    CHECK(cudaEventQuery(e2) == cudaErrorNotReady, "cudaEventQuery of an event on a stream waiting for it");
    CHECK(cudaStreamQuery(s2) == cudaErrorNotReady, "cudaStreamQuery of a stream waiting (cudaStreamWaitEvent)");
    *flag = 1;
    CHECK(cudaEventSynchronize(e2) == cudaSuccess, "cudaEventSynchronize");
    CHECK(cudaEventQuery(e1) == cudaSuccess, "e1 is complete once e2 (which waited for it) is");
    int got = 0;
    CUDA_OK(cudaMemcpy(&got, d2, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(got == 42, "cudaStreamWaitEvent: s2's copy read %d, want s1's 42 (it ran before s1's write)", got);
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, e1, e2) == cudaSuccess && ms >= 0, "cudaEventElapsedTime(e1, e2) = %g", ms);

    // device to pinned host memory: returns at once, the data arrives in stream order
    *flag = 0, *pinned = -1;
    launch(stall_spin, dim3(1), dim3(1), 0, s1, (const volatile int*)flag, STALL_CYCLES);
    launch(set_int, dim3(1), dim3(1), 0, s1, d, 7);
    CUDA_OK(cudaMemcpyAsync(pinned, d, sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamQuery(s1) == cudaErrorNotReady && *pinned == -1,
          "cudaMemcpyAsync into pinned memory behind a spinning kernel returned after the copy (%d)", *pinned);
    *flag = 1;
    CUDA_OK(cudaStreamSynchronize(s1));
    CHECK(*pinned == 7, "pinned copy after the sync: %d, want 7", *pinned);

    // device to pageable host memory: returns only once the copy is done (a thread releases the kernel
    // after 300 ms); from pageable host memory: the source is taken at the call
    int pageable = -1, src = 11;
    *flag = 0;
    launch(stall_spin, dim3(1), dim3(1), 0, s1, (const volatile int*)flag, STALL_CYCLES);
    CUDA_OK(cudaMemcpyAsync(d2, &src, sizeof(int), cudaMemcpyHostToDevice, s1));
    src = 12;  // too late for the copy (staged, or synchronized, at the call)
    launch(copy_int, dim3(1), dim3(1), 0, s1, d, (const int*)d2);
    Release rel = {flag, 300};
    pthread_t t;
    double t0 = host_now_s();
    CHECK(pthread_create(&t, NULL, release_main, &rel) == 0, "pthread_create");
    CUDA_OK(cudaMemcpyAsync(&pageable, d, sizeof(int), cudaMemcpyDeviceToHost, s1));
    double waited = host_now_s() - t0;
    CHECK(waited >= 0.25 && pageable == 11,
          "cudaMemcpyAsync into pageable memory returned after %.3f s with %d (want >= 0.25 s, once the copy is "
          "done, with the 11 the host copied at its call)",
          waited, pageable);
    pthread_join(t, NULL);
    CUDA_OK(cudaDeviceSynchronize());

    cudaEventDestroy(e1), cudaEventDestroy(e2);
    cudaStreamDestroy(s1), cudaStreamDestroy(s2);
    cudaFree(d), cudaFree(d2);
    cudaFreeHost(pinned), cudaFreeHost((void*)flag);
}

// The wgmma layout cases of wgmma_layouts, by number.
static const char* wgmma_case_names[4] = {"N 64, A and B K-major, 128B swizzle",
                                          "N 64, B MN-major (trans-b), 128B swizzle",
                                          "N 128, A from registers, B K-major without swizzle",
                                          "N 128, A K-major 64B swizzle, B MN-major 128B swizzle in two atoms"};
// wgmma_case: D (64 x N) = A (64 x 64) Bm (64 x N) by wgmma_layouts case c (N: 64 for cases 0 and 1, else 128), from
// and to host arrays.
static void wgmma_case(int c, const __nv_bfloat16* hA, const __nv_bfloat16* hB, float* got) {
    int n = c < 2 ? 64 : 128;
    __nv_bfloat16 *dA, *dB;
    float* dD;
    CUDA_OK(cudaMalloc(&dA, 64 * 64 * sizeof(__nv_bfloat16)));
    CUDA_OK(cudaMalloc(&dB, 64 * n * sizeof(__nv_bfloat16)));
    CUDA_OK(cudaMalloc(&dD, 64 * n * sizeof(float)));
    CUDA_OK(cudaMemcpy(dA, hA, 64 * 64 * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dB, hB, 64 * n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dD, 0, 64 * n * sizeof(float)));
    int smem = 1024 + 8192 + 16384;
#define WGMMA_CASE(C, N, TB)                                                                                         \
    do {                                                                                                             \
        CUDA_OK(cudaFuncSetAttribute(wgmma_layouts<C, N, TB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));   \
        launch(wgmma_layouts<C, N, TB>, dim3(1), dim3(128), (size_t)smem, (cudaStream_t)0, (const __nv_bfloat16*)dA, \
               (const __nv_bfloat16*)dB, dD);                                                                        \
    } while (0)
    if (c == 0)
        WGMMA_CASE(0, 64, 0);
    else if (c == 1)
        WGMMA_CASE(1, 64, 1);
    else if (c == 2)
        WGMMA_CASE(2, 128, 0);
    else
        WGMMA_CASE(3, 128, 1);
#undef WGMMA_CASE
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(got, dD, 64 * n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaFree(dA), cudaFree(dB), cudaFree(dD);
}
// wgmma_probe: where case c read its operands from, printed for whoever fixes the layout (in cpu/'s emulator or in
// the kernels) without the GPU that found it wrong. With A the identity, D = Bm as read: its row from Bm[k][j] = k + 1,
// its column from Bm[k][j] = j + 1; with Bm the identity (in its first 64 columns), D = A as read, likewise (which
// says something once B is read right). Every value is an integer up to 128, exact in bf16 and in the sums. Returns
// how many elements of A and B were read from elsewhere (0: each read where the layout says); prints the first
// mismatches and the counts when there are any or when `verbose`.
static int wgmma_probe(int c, int verbose) {
    int n = c < 2 ? 64 : 128;
    static __nv_bfloat16 A[64 * 64], B[64 * 128];
    static float d1[64 * 128], d2[64 * 128];
    int total = 0;
    for (int side = 0; side < 2; side++) {  // 0: B as read, 1: A as read
        for (int pass = 0; pass < 2; pass++) {
            for (int r = 0; r < 64; r++)
                for (int k = 0; k < 64; k++) {
                    float one = (float)(r == k);
                    A[r * 64 + k] = __float2bfloat16(side == 0 ? one : (float)(pass == 0 ? r + 1 : k + 1));
                }
            for (int k = 0; k < 64; k++)
                for (int j = 0; j < n; j++)
                    B[k * n + j] = __float2bfloat16(side == 1 ? (float)(k == j) : (float)(pass == 0 ? k + 1 : j + 1));
            wgmma_case(c, A, B, pass == 0 ? d1 : d2);
        }
        int cols = side == 0 ? n : 64, wrong = 0;
        for (int r = 0; r < 64; r++)
            for (int j = 0; j < cols; j++) {
                float x = d1[r * n + j], y = d2[r * n + j];
                if (x == r + 1 && y == j + 1) continue;
                if (wrong++ < 6 && verbose)
                    printf("  wgmma_probe case %d: D[%d][%d] = %s[%g][%g] as read, want %s[%d][%d]\n", c, r, j,
                           side == 0 ? "B" : "A", x - 1, y - 1, side == 0 ? "B" : "A", r, j);
            }
        if (verbose)
            printf("  wgmma_probe case %d (%s): %d of %d elements of %s read from elsewhere\n", c, wgmma_case_names[c],
                   wrong, 64 * cols, side == 0 ? "B" : "A");
        total += wrong;
    }
    return total;
}

int main(void) {
    // WMMA matmul, every operand layout
    {
        const int M = 32, N = 48, K = 64;
        __nv_bfloat16 *A = (__nv_bfloat16*)malloc(M * K * 2), *B = (__nv_bfloat16*)malloc(K * N * 2),
                      *Bt = (__nv_bfloat16*)malloc(K * N * 2), *dA, *dB;
        float *want = (float*)malloc(M * N * 4), *got = (float*)malloc(M * N * 4), *dC;
        for (int i = 0; i < M * K; i++) A[i] = __float2bfloat16(test_uniform(-1, 1));
        for (int i = 0; i < K * N; i++) B[i] = __float2bfloat16(test_uniform(-1, 1));
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) Bt[n * K + k] = B[k * N + n];
        CUDA_OK(cudaMalloc(&dA, M * K * 2));
        CUDA_OK(cudaMalloc(&dB, K * N * 2));
        CUDA_OK(cudaMalloc(&dC, M * N * 4));
        CUDA_OK(cudaMemcpy(dA, A, M * K * 2, cudaMemcpyHostToDevice));
        for (int b_col = 0; b_col < 2; b_col++)
            for (int c_col = 0; c_col < 2; c_col++) {
                for (int m = 0; m < M; m++)
                    for (int n = 0; n < N; n++) {
                        double s = 0;
                        for (int k = 0; k < K; k++)
                            s += (double)__bfloat162float(A[m * K + k]) * __bfloat162float(B[k * N + n]);
                        want[c_col ? n * M + m : m * N + n] = (float)(2 * s);
                    }
                CUDA_OK(cudaMemcpy(dB, b_col ? Bt : B, K * N * 2, cudaMemcpyHostToDevice));
                launch(wmma_matmul, dim3(N / 16, M / 16), dim3(32), 0, (cudaStream_t)0, (const __nv_bfloat16*)dA,
                       (const __nv_bfloat16*)dB, dC, M, N, K, b_col, c_col);
                CUDA_OK(cudaGetLastError());
                CUDA_OK(cudaMemcpy(got, dC, M * N * 4, cudaMemcpyDeviceToHost));
                char what[96];
                snprintf(what, sizeof what, "WMMA bf16 matmul, B %s-major, C %s-major", b_col ? "col" : "row",
                         c_col ? "col" : "row");
                // products of bf16 are exact in fp32; only the fp32 accumulation order differs: 64 terms of |x| < 1
                check_close(what, got, want, M * N, 1e-4f, 1e-5f);
            }
        cudaFree(dA), cudaFree(dB), cudaFree(dC), free(A), free(B), free(Bt), free(want), free(got);
    }

    // block sums
    {
        const int nb = 37, n = nb * 256;
        float *x = (float*)malloc(n * 4), want[nb], got[nb], *dx, *dout;
        test_fill(x, n, -1, 1);
        for (int b = 0; b < nb; b++) {
            double s = 0;
            for (int t = 0; t < 256; t++) s += x[b * 256 + t];
            want[b] = (float)s;
        }
        CUDA_OK(cudaMalloc(&dx, n * 4));
        CUDA_OK(cudaMalloc(&dout, nb * 4));
        CUDA_OK(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
        launch(block_sum_static_smem, dim3(nb), dim3(256), 0, (cudaStream_t)0, (const float*)dx, dout);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(got, dout, nb * 4, cudaMemcpyDeviceToHost));
        check_close("block sum (static smem tree)", got, want, nb, 1e-5f, 1e-5f);
        cudaFree(dx), cudaFree(dout), free(x);
    }
    // warp shuffles
    {
        float x[32], got[36], want[36], *dx, *dout;
        for (int i = 0; i < 32; i++) x[i] = (float)((i * 7) % 13) - 3.0f;  // integers: sums are exact
        double s = 0, m = -1e30, scan = 0;
        for (int i = 0; i < 32; i++) s += x[i], m = x[i] > m ? x[i] : m;
        want[0] = want[1] = (float)s, want[2] = (float)m, want[3] = x[7];
        for (int i = 0; i < 32; i++) scan += x[i], want[4 + i] = (float)scan;
        CUDA_OK(cudaMalloc(&dx, 32 * 4));
        CUDA_OK(cudaMalloc(&dout, 36 * 4));
        CUDA_OK(cudaMemcpy(dx, x, 32 * 4, cudaMemcpyHostToDevice));
        launch(warp_shuffles, dim3(1), dim3(32), 0, (cudaStream_t)0, (const float*)dx, dout);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(got, dout, 36 * 4, cudaMemcpyDeviceToHost));
        check_close("warp shuffles: xor sum, down sum, xor max, idx broadcast, up scan", got, want, 36, 0, 0);

        float gd[32], wd[32];
        for (int l = 0; l < 32; l++) {
            wd[l] = x[l];
            if (l < 16) {
                float t = 0;
                for (int k = 0; k < 16; k++) t += x[k];
                wd[l] = t;
            } else {  // down-shuffles inside the upper 16 lanes: lane l sums lanes l.. of its segment, doubled
                float v[32];
                for (int k = 16; k < 32; k++) v[k] = 2.0f * x[k];
                for (int o = 8; o > 0; o /= 2) {
                    float nv[32];
                    for (int k = 16; k < 32; k++) nv[k] = v[k] + ((k - 16) + o < 16 ? v[k + o] : v[k]);
                    for (int k = 16; k < 32; k++) v[k] = nv[k];
                }
                wd[l] = v[l];
            }
        }
        launch(warp_divergent_groups, dim3(1), dim3(32), 0, (cudaStream_t)0, (const float*)dx, dout);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(gd, dout, 32 * 4, cudaMemcpyDeviceToHost));
        check_close("warp shuffles in two divergent groups with their own masks", gd, wd, 32, 0, 0);

        unsigned *dv, gv[4];
        unsigned b = 0;
        for (int i = 0; i < 32; i++) b |= (x[i] > 0) << i;
        CUDA_OK(cudaMalloc(&dv, 16));
        launch(warp_votes, dim3(1), dim3(32), 0, (cudaStream_t)0, (const float*)dx, dv);
        CUDA_OK(cudaMemcpy(gv, dv, 16, cudaMemcpyDeviceToHost));
        CHECK(
            gv[0] == b && gv[1] == (b != 0) && gv[2] == (b == 0xffffffffu) && gv[3] == (unsigned)__builtin_popcount(b),
            "votes: ballot %08x any %u all %u popc %u, want %08x", gv[0], gv[1], gv[2], gv[3], b);
        cudaFree(dv), cudaFree(dx), cudaFree(dout);
    }
    // shuffles of other types and widths
    {
        double xd[32], *dxd, *dseg;
        int* dint;
        __nv_bfloat16* dbf;
        __nv_bfloat162* dbf2;
        for (int i = 0; i < 32; i++) xd[i] = 1.0 / (i + 1);
        CUDA_OK(cudaMalloc(&dxd, 256));
        CUDA_OK(cudaMalloc(&dseg, 256));
        CUDA_OK(cudaMalloc(&dint, 128));
        CUDA_OK(cudaMalloc(&dbf, 64));
        CUDA_OK(cudaMalloc(&dbf2, 128));
        CUDA_OK(cudaMemcpy(dxd, xd, 256, cudaMemcpyHostToDevice));
        launch(warp_shuffle_types, dim3(1), dim3(32), 0, (cudaStream_t)0, (const double*)dxd, dseg, dint, dbf, dbf2);
        CUDA_OK(cudaGetLastError());
        double seg[32];
        int iv[32];
        __nv_bfloat16 bf[32];
        __nv_bfloat162 bf2[32];
        CUDA_OK(cudaMemcpy(seg, dseg, 256, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(iv, dint, 128, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(bf, dbf, 64, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(bf2, dbf2, 128, cudaMemcpyDeviceToHost));
        int bad_seg = 0, bad_int = 0, bad_bf = 0, bad_bf2 = 0;
        for (int l = 0; l < 32; l++) {
            double w = 0;
            for (int k = l & ~7; k < (l & ~7) + 8; k++) w += xd[k];
            bad_seg += fabs(seg[l] - w) > 1e-15;
            int src = (l % 16) + 3 < 16 ? l + 3 : l;
            bad_int += iv[l] != src * 3;
            bad_bf += __bfloat162float(bf[l]) != (float)(31 - l);
            int s2 = l ^ 1;
            bad_bf2 += __bfloat162float(bf2[l].x) != (float)s2 || __bfloat162float(bf2[l].y) != (float)-s2;
        }
        CHECK(bad_seg == 0, "double xor-sum in width-8 segments: %d lanes wrong", bad_seg);
        CHECK(bad_int == 0, "int shfl_down with width 16 stays in its segment: %d lanes wrong", bad_int);
        CHECK(bad_bf == 0, "bf16 shfl by index: %d lanes wrong", bad_bf);
        CHECK(bad_bf2 == 0, "bf162 shfl_xor: %d lanes wrong", bad_bf2);
        cudaFree(dxd), cudaFree(dseg), cudaFree(dint), cudaFree(dbf), cudaFree(dbf2);
    }
    // atomics
    {
        const int n = 5000;
        int *x = (int*)malloc(n * 4), *dx, *dhist, *dmax, hist[16], want_hist[16] = {0}, gmax, want_max = 0;
        float *dsum, gsum;
        unsigned *dt, gt;
        __nv_bfloat16 *dbsum, gbsum;
        for (int i = 0; i < n; i++) {
            x[i] = (int)(test_uniform(0, 1) * 100000);
            want_hist[x[i] & 15]++;
            want_max = x[i] > want_max ? x[i] : want_max;
        }
        CUDA_OK(cudaMalloc(&dx, n * 4));
        CUDA_OK(cudaMalloc(&dhist, 64));
        CUDA_OK(cudaMalloc(&dmax, 4));
        CUDA_OK(cudaMalloc(&dsum, 4));
        CUDA_OK(cudaMalloc(&dt, 4));
        CUDA_OK(cudaMalloc(&dbsum, 2));
        CUDA_OK(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(dhist, 0, 64));
        CUDA_OK(cudaMemset(dmax, 0, 4));
        CUDA_OK(cudaMemset(dsum, 0, 4));
        CUDA_OK(cudaMemset(dt, 0, 4));
        CUDA_OK(cudaMemset(dbsum, 0, 2));
        launch(atomics_kernel, dim3((n + 127) / 128), dim3(128), 0, (cudaStream_t)0, (const int*)dx, n, dhist, dsum,
               dmax, dt, dbsum);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(hist, dhist, 64, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(&gmax, dmax, 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(&gsum, dsum, 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(&gt, dt, 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(&gbsum, dbsum, 2, cudaMemcpyDeviceToHost));
        CHECK(memcmp(hist, want_hist, 64) == 0, "atomicAdd(int) histogram differs");
        CHECK(gmax == want_max, "atomicMax: got %d want %d", gmax, want_max);
        CHECK(gsum == 0.5f * n, "atomicAdd(float): got %f want %f", gsum, 0.5f * n);
        CHECK(gt == (unsigned)n, "atomicCAS ticket counter: got %u want %d", gt, n);
        CHECK(__bfloat162float(gbsum) == (float)((n + 63) / 64), "atomicAdd(bf16): got %f want %d",
              __bfloat162float(gbsum), (n + 63) / 64);
        cudaFree(dx), cudaFree(dhist), cudaFree(dmax), cudaFree(dsum), cudaFree(dt), cudaFree(dbsum), free(x);
    }
    // dynamic shared memory above 48 KB, with the opt-in
    {
        const int n = 20000, nb = 3;  // 80,000 bytes
        float *x = (float*)malloc(nb * n * 4), *got = (float*)malloc(nb * n * 4), *want = (float*)malloc(nb * n * 4);
        float *dx, *dout;
        test_fill(x, nb * n, -1, 1);
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < n; i++) want[b * n + i] = x[b * n + n - 1 - i];
        CUDA_OK(cudaMalloc(&dx, nb * n * 4));
        CUDA_OK(cudaMalloc(&dout, nb * n * 4));
        CUDA_OK(cudaMemcpy(dx, x, nb * n * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaFuncSetAttribute(reverse_dyn_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4));
        launch(reverse_dyn_smem, dim3(nb), dim3(256), n * 4, (cudaStream_t)0, (const float*)dx, dout, n);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(got, dout, nb * n * 4, cudaMemcpyDeviceToHost));
        check_close("dynamic shared memory (80 KB, opted in): reverse", got, want, nb * n, 0, 0);
        cudaFree(dx), cudaFree(dout), free(x), free(got), free(want);
    }
    // early return + counting barriers, with a block that is not a multiple of 32
    {
        const int n = 77;
        float x[n], got[n], want[n], *dx, *dout;
        int *dc, gc[3], pos = 0, allpos = 1, anybig = 0;
        test_fill(x, n, -0.5f, 1.0f);
        for (int i = 0; i < n; i++) want[i] = x[n - 1 - i], pos += x[i] > 0, allpos &= x[i] > 0, anybig |= x[i] > 0.9f;
        CUDA_OK(cudaMalloc(&dx, n * 4));
        CUDA_OK(cudaMalloc(&dout, n * 4));
        CUDA_OK(cudaMalloc(&dc, 12));
        CUDA_OK(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
        launch(early_return_count, dim3(1), dim3(100), 0, (cudaStream_t)0, (const float*)dx, n, dc, dout);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(got, dout, n * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(gc, dc, 12, cudaMemcpyDeviceToHost));
        check_close("early-returning threads, then a barrier among the rest", got, want, n, 0, 0);
        CHECK(gc[0] == pos && gc[1] == allpos && gc[2] == anybig, "__syncthreads_count/and/or: %d %d %d, want %d %d %d",
              gc[0], gc[1], gc[2], pos, allpos, anybig);
        cudaFree(dx), cudaFree(dout), cudaFree(dc);
    }
    // 3D grids and blocks
    {
        const int nx = 37, ny = 19, nz = 4, n = nx * ny * nz;
        int *d, *got = (int*)malloc(n * 4), bad = 0;
        CUDA_OK(cudaMalloc(&d, n * 4));
        CUDA_OK(cudaMemset(d, 0xff, n * 4));
        launch(index_3d, dim3((nx + 7) / 8, (ny + 3) / 4, nz / 2), dim3(8, 4, 2), 0, (cudaStream_t)0, d, nx, ny);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(got, d, n * 4, cudaMemcpyDeviceToHost));
        for (int z = 0; z < nz; z++)
            for (int y = 0; y < ny; y++)
                for (int x = 0; x < nx; x++) bad += got[(z * ny + y) * nx + x] != x + 1000 * y + 1000000 * z;
        CHECK(bad == 0, "3D grid/block index arithmetic: %d of %d wrong", bad, n);
        cudaFree(d), free(got);
    }
    // mma.sync m16n8k16 bf16: small integers, so every product and sum is exact in fp32
    {
        __nv_bfloat16 hA[256], hB[128];
        float hC[128], want[128], got[128];
        for (int i = 0; i < 256; i++) hA[i] = __float2bfloat16((float)((i * 7 + 3) % 11 - 5));
        for (int i = 0; i < 128; i++) hB[i] = __float2bfloat16((float)((i * 5 + 1) % 9 - 4));
        for (int i = 0; i < 128; i++) hC[i] = (float)(i % 13) - 6.f;
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 8; n++) {
                float acc = hC[r * 8 + n];
                for (int k = 0; k < 16; k++) acc += __bfloat162float(hA[r * 16 + k]) * __bfloat162float(hB[k * 8 + n]);
                want[r * 8 + n] = acc;
            }
        __nv_bfloat16 *dA, *dB;
        float *dC, *dD;
        CUDA_OK(cudaMalloc(&dA, sizeof hA));
        CUDA_OK(cudaMalloc(&dB, sizeof hB));
        CUDA_OK(cudaMalloc(&dC, sizeof hC));
        CUDA_OK(cudaMalloc(&dD, sizeof got));
        CUDA_OK(cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dC, hC, sizeof hC, cudaMemcpyHostToDevice));
        launch(mma_16816_layout, dim3(1), dim3(32), 0, (cudaStream_t)0, (const __nv_bfloat16*)dA,
               (const __nv_bfloat16*)dB, (const float*)dC, dD);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(got, dD, sizeof got, cudaMemcpyDeviceToHost));
        check_close("mma.sync.m16n8k16 bf16 -> fp32, PTX ISA fragment layouts of A, B, C, D", got, want, 128, 0, 0);
        cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
    }
    // ldmatrix.x4 and .x4.trans: distinct 16-bit values, so each register's two halves are identified
    {
        unsigned short hM[256];
        uint32_t got[128];
        for (int i = 0; i < 256; i++) hM[i] = (unsigned short)(1000 + i);
        unsigned short* dM;
        uint32_t* dout;
        CUDA_OK(cudaMalloc(&dM, sizeof hM));
        CUDA_OK(cudaMalloc(&dout, sizeof got));
        CUDA_OK(cudaMemcpy(dM, hM, sizeof hM, cudaMemcpyHostToDevice));
        for (int trans = 0; trans < 2; trans++) {
            launch(ldmatrix_layout, dim3(1), dim3(32), 0, (cudaStream_t)0, (const unsigned short*)dM, dout, trans);
            CUDA_OK(cudaGetLastError());
            CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
            int bad = 0;
            for (int l = 0; l < 32; l++)
                for (int i = 0; i < 4; i++) {
                    int g = l / 4, t = l % 4;  // matrix i is rows 8i .. 8i+7 of M
                    unsigned lo = trans ? hM[(8 * i + 2 * t) * 8 + g] : hM[(8 * i + g) * 8 + 2 * t];
                    unsigned hi = trans ? hM[(8 * i + 2 * t + 1) * 8 + g] : hM[(8 * i + g) * 8 + 2 * t + 1];
                    bad += got[l * 4 + i] != (lo | hi << 16);
                }
            CHECK(bad == 0, "ldmatrix.x4%s: %d of 128 registers differ from the PTX ISA layout", trans ? ".trans" : "",
                  bad);
        }
        cudaFree(dM), cudaFree(dout);
    }
    // cp.async: zero-fill past src-size, groups completed by wait_group, visible to others after a barrier
    {
        int hs[512], o1[256], o2[512], bad1 = 0, bad2 = 0;
        for (int i = 0; i < 512; i++) hs[i] = i * 3 + 1;
        int *ds, *d1, *d2;
        CUDA_OK(cudaMalloc(&ds, sizeof hs));
        CUDA_OK(cudaMalloc(&d1, sizeof o1));
        CUDA_OK(cudaMalloc(&d2, sizeof o2));
        CUDA_OK(cudaMemcpy(ds, hs, sizeof hs, cudaMemcpyHostToDevice));
        launch(cp_async_groups, dim3(1), dim3(64), 0, (cudaStream_t)0, (const int4*)ds, (int4*)d1, (int4*)d2);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(o1, d1, sizeof o1, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(o2, d2, sizeof o2, cudaMemcpyDeviceToHost));
        auto want = [&](int chunk, int k) {  // word k of shared chunk `chunk` after its copy
            int t = chunk % 64, n = chunk < 64 ? (t % 3 == 0 ? 0 : t % 3 == 1 ? 8 : 16) : (t % 2 ? 16 : 8);
            return 4 * k < n ? hs[chunk * 4 + k] : 0;
        };
        for (int t = 0; t < 64; t++)
            for (int k = 0; k < 4; k++) {
                bad1 += o1[t * 4 + k] != want((t + 1) % 64, k);
                bad2 += o2[t * 4 + k] != want((t + 7) % 128, k) || o2[(64 + t) * 4 + k] != want((t + 71) % 128, k);
            }
        CHECK(bad1 == 0, "cp.async: after wait_group 1 and a barrier, %d of 256 words of the first group are wrong",
              bad1);
        CHECK(bad2 == 0, "cp.async: after wait_group 0 and a barrier, %d of 512 words are wrong", bad2);
        cudaFree(ds), cudaFree(d1), cudaFree(d2);
    }
    // wgmma: the four operand layouts, small integers so that every sum is exact in fp32 (and where a case fails,
    // wgmma_probe prints where the operands were read from)
    {
        static __nv_bfloat16 hA[64 * 64], hB[64 * 128];
        static float want[64 * 128], got[64 * 128];
        for (int i = 0; i < 64 * 64; i++) hA[i] = __float2bfloat16((float)((i * 7 + 3) % 11 - 5));
        for (int i = 0; i < 64 * 128; i++) hB[i] = __float2bfloat16((float)((i * 5 + 1) % 9 - 4));
        for (int c = 0; c < 4; c++) {
            int n = c < 2 ? 64 : 128;
            wgmma_case(c, hA, hB, got);
            for (int r = 0; r < 64; r++)
                for (int j = 0; j < n; j++) {
                    float acc = 0;
                    for (int k = 0; k < 64; k++)
                        acc += __bfloat162float(hA[r * 64 + k]) * __bfloat162float(hB[k * n + j]);
                    want[r * n + j] = acc;
                }
            char what[160];
            snprintf(what, sizeof what, "wgmma.mma_async m64n%dk16 bf16 -> fp32, 4 steps: %s", n, wgmma_case_names[c]);
            int ok = check_close(what, got, want, 64 * n, 0, 0);
            // and each operand element read where the layout says (A and B with the identity as the other)
            int wrong = wgmma_probe(c, !ok || getenv("WGMMA_PROBE"));
            CHECK(wrong == 0, "wgmma_probe case %d (%s): %d elements of A or B read from elsewhere", c,
                  wgmma_case_names[c], wrong);
        }
    }
    test_streams();
    test_tma();
    return test_summary();
}
