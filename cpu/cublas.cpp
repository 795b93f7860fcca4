// cpu/cublas.cpp: the part of cuBLAS and cuBLASLt that mlm.c uses, computed on the CPU.
//
// The CPU build compiles the project's CUDA sources with g++ and links this file instead of
// libcublas / libcublasLt. The prototypes, enums and opaque descriptor types come from the
// toolkit's own <cublasLt.h> and <cublas_v2.h>, so the enum values and signatures are NVIDIA's.
// Device pointers are plain host pointers here. The arguments are checked and the products described
// at call time; they run later, in the order of the handle's (or the call's) stream, on its worker
// (cpu/emu_stream.h), as the GPU runs them.
//
// Implemented:
//   cuBLAS    cublasCreate/Destroy, Set/GetStream, Set/GetMathMode, SetWorkspace,
//             Set/GetPointerMode (host mode only), cublasGemmEx, cublasGemmStridedBatchedEx,
//             cublasSgemm, cublasSgemmStridedBatched, cublasGetStatusString/Name.
//   cuBLASLt  cublasLtCreate/Destroy, matmul descriptors, matrix layouts, preferences
//             (Create/Init/Destroy/Set/GetAttribute), cublasLtMatmulAlgoGetHeuristic,
//             cublasLtMatmulAlgoConfigGetAttribute,
//             cublasLtMatmul with the epilogues DEFAULT, RELU, BIAS, RELU_BIAS, GELU, GELU_AUX,
//             GELU_BIAS, GELU_AUX_BIAS, DGELU, DGELU_BGRAD, BGRADA, BGRADB,
//             cublasLtGetStatusString/Name, cublasLtGetVersion.
//   Types     A and B: CUDA_R_32F or CUDA_R_16BF (same type for both); C and D: CUDA_R_32F, or
//             CUDA_R_16BF when A and B are bf16. Compute type CUBLAS_COMPUTE_32F (and _PEDANTIC);
//             the _FAST_TF32/_FAST_16BF/_FAST_16F types are accepted where NVIDIA accepts them
//             (fp32 A/B/C) and computed in full fp32. Scale type (alpha, beta): float on the host.
//
// Numerics (what a test may rely on):
//   - inputs are widened to fp32 exactly (a bf16 is the top half of an fp32);
//   - every dot product is accumulated in fp32, in order p = 0, 1, ..., k-1, so results do not
//     depend on the thread count; the GPU accumulates in fp32 too but in another order (and a
//     TF32 compute type rounds inputs to 10 mantissa bits there), so compare with tolerances;
//   - except with a split-K algorithm (the heuristic's 2nd and 3rd offers, see
//     cublasLtMatmulAlgoGetHeuristic): k is cut into S equal parts, each accumulated in fp32 in
//     order, and the parts added in order (the COMPUTE_TYPE reduction). As on the GPU, where
//     algorithms differ in tiles and in split-K, another algorithm can give other bits;
//   - the epilogue runs in fp32: t = alpha*acc + beta*C (+ bias), then the activation;
//   - a bf16 output is rounded to nearest, ties to even, as the GPU's cvt.rn.bf16.f32 does
//     (NaN becomes the canonical bf16 NaN 0x7FFF);
//   - bias gradients (BGRADA, BGRADB, DGELU_BGRAD) are summed in double, then rounded once;
//   - the real library's bf16 epilogues other than DEFAULT and RELU round an intermediate value
//     (cuBLASLt 13.0 on an H100 is up to about one bf16 ulp off the exact result, with or without
//     beta); this file rounds once, which is within what the tests accept from both, except where
//     the GPU's choice is pinned (alpha 1, beta 0, tests/test_matmul.cu test_gelu_epilogues_bf16):
//     GELU_AUX_BIAS stores aux = bf16(t) and D = bf16(gelu(t)) from the fp32 t, DGELU multiplies the
//     fp32 t by gelu'(aux), and DGELU_BGRAD rounds t to bf16 first, as this file does.
//
// Where the real library refuses a call, this one refuses it with the same status, so that a
// mistake in our calls fails here as it would on the GPU: CUBLAS_STATUS_INVALID_VALUE for
// parameters that are wrong or in conflict (ld < rows, mismatched dimensions or batch counts,
// missing bias/aux pointers, aux ld not a multiple of 8 where documented, a bias type other than
// D's, wrong attribute sizes), and CUBLAS_STATUS_NOT_SUPPORTED for well-formed requests no kernel
// serves (type combinations, memory orders, misaligned pointers, BGRADA with A transposed and
// BGRADB with B not transposed, as cuBLASLt 13.0 answers on an H100). What this CPU build leaves out (non-COL orders,
// device pointer mode, the ReLU bit-mask epilogues, fp8 scaling) is refused with NOT_SUPPORTED and a line on stderr.
// Set CUBLASLT_LOG_LEVEL=1 (as with the real library) to get a line on stderr for every other refusal too.
//
// Threads: a large product splits its rows over EMU_THREADS threads (the CPU runtime's knob;
// default: the number of cores, at most 16).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <new>
#include <vector>
#include "emu_stream.h"

// ============================================================================
// Messages

// blas_log: a refused call, reported only when CUBLASLT_LOG_LEVEL or CUBLAS_LOGINFO_DBG is set.
static void blas_log(const char* func, const char* fmt, ...) {
    static int enabled = -1;
    if (enabled < 0) {
        const char* lt = getenv("CUBLASLT_LOG_LEVEL");
        const char* dbg = getenv("CUBLAS_LOGINFO_DBG");
        enabled = (lt && atoi(lt) > 0) || (dbg && atoi(dbg) > 0);
    }
    if (!enabled) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[cpu cublas][Error][%s] ", func);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

// blas_unimplemented: a request the GPU library may serve but this CPU build does not; always printed.
static void blas_unimplemented(const char* func, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[cpu cublas][%s] not implemented in the CPU build: ", func);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (returning CUBLAS_STATUS_NOT_SUPPORTED)\n");
    va_end(ap);
}

// ============================================================================
// Element types: fp32 and bf16 storage, both computed in fp32.

static bool is_storage_type(int t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }
static size_t type_size(int t) { return t == CUDA_R_16BF ? 2 : 4; }

// A bf16 holds the upper 16 bits of an fp32, so widening is exact.
static inline float bf16_bits_to_float(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

// fp32 -> bf16, round to nearest, ties to even (the GPU's cvt.rn.bf16.f32).
static inline uint16_t float_to_bf16_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN -> canonical NaN
    x += 0x7fffu + ((x >> 16) & 1u);                     // add just under half an ulp, plus the odd bit
    return (uint16_t)(x >> 16);
}

static inline float load_elem(const void* base, int64_t i, int type) {
    if (type == CUDA_R_32F) return ((const float*)base)[i];
    uint16_t h;
    memcpy(&h, (const char*)base + 2 * i, 2);
    return bf16_bits_to_float(h);
}

static inline void store_elem(void* base, int64_t i, int type, float v) {
    if (type == CUDA_R_32F) {
        ((float*)base)[i] = v;
    } else {
        uint16_t h = float_to_bf16_bits(v);
        memcpy((char*)base + 2 * i, &h, 2);
    }
}

// The GELU of cuBLASLt is the tanh approximation (NVIDIA's nvmath-python tests model the
// CUBLASLT_EPILOGUE_GELU* results with it, and DGELU with its derivative):
//   gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
static const float GELU_S = 0.7978845608028654f;  // sqrt(2/pi)
static const float GELU_C = 0.044715f;
static inline float gelu_tanh(float x) {
    float u = GELU_S * (x + GELU_C * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
static inline float gelu_tanh_grad(float x) {
    float u = GELU_S * (x + GELU_C * x * x * x);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_S * (1.0f + 3.0f * GELU_C * x * x);
}

// ============================================================================
// The engine: one column-major GEMM with an epilogue.
//   D = epilogue(alpha * op(A) op(B) + beta * C),   op(A) is m x k, op(B) is k x n, D is m x n.
// op() is folded into two steps per matrix: op(A)[i][p] = a[i * a_row_step + p * a_col_step]
// (transa = N: steps 1 and lda; T: lda and 1), likewise for op(B)[p][j].

typedef struct {
    bool bias_add;  // t += bias[i]                    (BIAS, RELU_BIAS, GELU_BIAS, GELU_AUX_BIAS)
    bool aux_out;   // aux[i, j] = t, before activation (GELU_AUX, GELU_AUX_BIAS)
    bool relu;      // t = max(t, 0)
    bool gelu;      // t = gelu(t)
    bool dgelu;     // t = t * gelu'(aux[i, j])         (DGELU, DGELU_BGRAD)
    bool bgrad_d;   // bias[i] = sum_j D[i, j]          (DGELU_BGRAD)
    bool bgrad_a;   // bias[i] = sum_p op(A)[i, p]      (BGRADA)
    bool bgrad_b;   // bias[j] = sum_p op(B)[p, j]      (BGRADB)
} EpilogueOps;

typedef struct {
    int m, n, k;
    const void* a;
    int a_type;
    int64_t a_row_step, a_col_step;
    const void* b;
    int b_type;
    int64_t b_row_step, b_col_step;
    const void* c;  // read only when beta != 0 (so it may then be NULL, and NaNs in it do not leak)
    int64_t ldc;
    void* d;  // may be the same memory as c (in place): each element is read before it is written
    int64_t ldd;
    int cd_type;
    float alpha, beta;
    EpilogueOps ops;
    void* bias;  // input for bias_add, output for the bias gradients
    int bias_type;
    void* aux;  // output for aux_out, input for dgelu
    int64_t aux_ld;
    int aux_type;
    int splitk;  // k in this many equal parts, each summed alone, then the parts added in order (1: none)
} Gemm;

// Register tile: a micro-kernel computes MR x NR sums at once, kept in registers over all of k.
#define MR 4
#define NR 8

// Copy rows [i0, i0 + rows) of op(A) into panels of MR rows, widened to fp32:
// panel q holds dst[q*MR*k + p*MR + r] = op(A)[i0 + q*MR + r][p] (rows past the end are 0).
static void pack_a(const Gemm* g, int i0, int rows, float* dst) {
    int k = g->k;
    for (int q = 0; q * MR < rows; q++) {
        float* panel = dst + (size_t)q * MR * k;
        for (int p = 0; p < k; p++) {
            for (int r = 0; r < MR; r++) {
                int i = q * MR + r;
                panel[p * MR + r] =
                    i < rows
                        ? load_elem(g->a, (int64_t)(i0 + i) * g->a_row_step + (int64_t)p * g->a_col_step, g->a_type)
                        : 0.0f;
            }
        }
    }
}

// Copy columns [j0, j0 + cols) of op(B) into panels of NR columns:
// panel q holds dst[q*NR*k + p*NR + u] = op(B)[p][j0 + q*NR + u] (columns past the end are 0).
static void pack_b(const Gemm* g, int j0, int cols, float* dst) {
    int k = g->k;
    for (int q = 0; q * NR < cols; q++) {
        float* panel = dst + (size_t)q * NR * k;
        for (int p = 0; p < k; p++) {
            for (int u = 0; u < NR; u++) {
                int j = q * NR + u;
                panel[p * NR + u] =
                    j < cols
                        ? load_elem(g->b, (int64_t)p * g->b_row_step + (int64_t)(j0 + j) * g->b_col_step, g->b_type)
                        : 0.0f;
            }
        }
    }
}

// tile[r][u] = sum_p a[p][r] * b[p][u] over a packed A panel (k x MR) and B panel (k x NR), with k cut into
// splitk parts [k s / splitk, k (s + 1) / splitk): each part summed from 0, the parts added in order.
// The fixed-size inner loops let the compiler keep the 32 sums in vector registers.
static void micro_kernel(int k, int splitk, const float* __restrict__ a, const float* __restrict__ b,
                         float tile[MR][NR]) {
    for (int r = 0; r < MR; r++)
        for (int u = 0; u < NR; u++) tile[r][u] = 0.0f;
    for (int s = 0; s < splitk; s++) {
        float acc[MR][NR] = {};
        for (int p = (int)((int64_t)k * s / splitk); p < (int)((int64_t)k * (s + 1) / splitk); p++) {
            const float* ap = a + p * MR;
            const float* bp = b + p * NR;
            for (int r = 0; r < MR; r++)
                for (int u = 0; u < NR; u++) acc[r][u] += ap[r] * bp[u];
        }
        for (int r = 0; r < MR; r++)
            for (int u = 0; u < NR; u++) tile[r][u] = s == 0 ? acc[r][u] : tile[r][u] + acc[r][u];
    }
}

// Apply the epilogue to a finished tile (rows i0.., columns j0..) and store it into D.
// rowsum[r] collects sum_j D[i0 + r][j] for DGELU_BGRAD (from the fp32 values, before rounding).
static void store_tile(const Gemm* g, int i0, int j0, int rows, int cols, float tile[MR][NR], double* rowsum) {
    const EpilogueOps* ops = &g->ops;
    for (int u = 0; u < cols; u++) {
        int64_t j = j0 + u;
        for (int r = 0; r < rows; r++) {
            int64_t i = i0 + r;
            float t = g->alpha * tile[r][u];
            if (g->beta != 0.0f) t += g->beta * load_elem(g->c, i + j * g->ldc, g->cd_type);
            if (ops->bias_add) t += load_elem(g->bias, i, g->bias_type);
            if (ops->aux_out) store_elem(g->aux, i + j * g->aux_ld, g->aux_type, t);
            // fmaxf(NaN, 0) = 0: the GPU's RELU epilogue also turns NaN into 0 (NVIDIA developer forum,
            // "Incorrect result of cublasLtMatmul with CUBLASLT_EPILOGUE_RELU when input is NaN").
            if (ops->relu) t = fmaxf(t, 0.0f);
            if (ops->gelu) t = gelu_tanh(t);
            // DGELU_BGRAD with a bf16 D rounds t to bf16 before the product, as cuBLASLt 13.0 does on an H100
            // (DGELU alone does not); tests/test_matmul.cu, test_gelu_epilogues_bf16, pins both
            if (ops->bgrad_d && g->cd_type == CUDA_R_16BF) t = bf16_bits_to_float(float_to_bf16_bits(t));
            if (ops->dgelu) t *= gelu_tanh_grad(load_elem(g->aux, i + j * g->aux_ld, g->aux_type));
            store_elem(g->d, i + j * g->ldd, g->cd_type, t);
            if (ops->bgrad_d) rowsum[r] += t;
        }
    }
}

// Rows [i_begin, i_end) of D, in blocks: a block of rows of op(A) (up to 4 MB, so usually all of
// this thread's rows, packed once) and a block of columns of op(B) (about 256 KB, to stay in the
// L2 cache) are packed; then each A panel (MR rows, in L1) meets every B panel of the block in the
// micro-kernel, and the finished tile goes through the epilogue.
static void gemm_rows(const Gemm* g, int i_begin, int i_end) {
    int k = g->alpha == 0.0f ? 0 : g->k;  // alpha = 0: A and B are not read (BLAS rule)
    int kk = k > 0 ? k : 1;
    int mb = ((1 << 20) / kk) & ~(MR - 1);  // floats of an A block: 4 MB
    int nb = (65536 / kk) & ~(NR - 1);      // floats of a B block: 256 KB
    mb = mb < MR ? MR : (mb > 4096 ? 4096 : mb);
    nb = nb < NR ? NR : (nb > 512 ? 512 : nb);
    if (mb > i_end - i_begin) mb = (i_end - i_begin + MR - 1) / MR * MR;
    float* abuf = (float*)malloc(sizeof(float) * (size_t)mb * kk);
    float* bbuf = (float*)malloc(sizeof(float) * (size_t)nb * kk);
    double* rowsum = (double*)malloc(sizeof(double) * (size_t)mb);  // DGELU_BGRAD: sum_j D[i][j] per row
    if (!abuf || !bbuf || !rowsum) {
        fprintf(stderr, "[cpu cublas] out of memory packing a %d x %d x %d product\n", g->m, g->n, g->k);
        abort();
    }
    Gemm gk = *g;
    gk.k = k;
    for (int ib = i_begin; ib < i_end; ib += mb) {
        int rows = i_end - ib < mb ? i_end - ib : mb;
        pack_a(&gk, ib, rows, abuf);
        for (int r = 0; r < rows; r++) rowsum[r] = 0.0;
        for (int jb = 0; jb < g->n; jb += nb) {
            int cols = g->n - jb < nb ? g->n - jb : nb;
            pack_b(&gk, jb, cols, bbuf);
            for (int ip = 0; ip < rows; ip += MR) {
                for (int jp = 0; jp < cols; jp += NR) {
                    float tile[MR][NR];
                    micro_kernel(k, g->splitk > 1 ? g->splitk : 1, abuf + (size_t)ip * kk, bbuf + (size_t)jp * kk,
                                 tile);
                    int tr = rows - ip < MR ? rows - ip : MR;
                    int tc = cols - jp < NR ? cols - jp : NR;
                    store_tile(g, ib + ip, jb + jp, tr, tc, tile, rowsum + ip);
                }
            }
        }
        if (g->ops.bgrad_d)  // the rows of this block are complete: bias[i] = sum_j D[i][j]
            for (int r = 0; r < rows; r++) store_elem(g->bias, ib + r, g->bias_type, (float)rowsum[r]);
    }
    free(abuf);
    free(bbuf);
    free(rowsum);
}

typedef struct {
    const Gemm* g;
    int i_begin, i_end;
} RowJob;

static void* row_job_main(void* arg) {
    RowJob* job = (RowJob*)arg;
    gemm_rows(job->g, job->i_begin, job->i_end);
    return NULL;
}

// Threads for one product: EMU_THREADS, else the number of cores, at most 16.
static int blas_thread_count(void) {
    static int count = 0;
    if (count == 0) {
        const char* env = getenv("EMU_THREADS");
        long n = env ? atol(env) : sysconf(_SC_NPROCESSORS_ONLN);
        count = n < 1 ? 1 : (n > 16 ? 16 : (int)n);
    }
    return count;
}

// BGRADA: bias[i] = sum_p op(A)[i][p];  BGRADB: bias[j] = sum_p op(B)[p][j].  Not scaled by alpha.
static void bias_gradient_of_input(const Gemm* g) {
    if (g->ops.bgrad_a) {
        for (int i = 0; i < g->m; i++) {
            double s = 0.0;
            for (int p = 0; p < g->k; p++)
                s += load_elem(g->a, (int64_t)i * g->a_row_step + (int64_t)p * g->a_col_step, g->a_type);
            store_elem(g->bias, i, g->bias_type, (float)s);
        }
    }
    if (g->ops.bgrad_b) {
        for (int j = 0; j < g->n; j++) {
            double s = 0.0;
            for (int p = 0; p < g->k; p++)
                s += load_elem(g->b, (int64_t)p * g->b_row_step + (int64_t)j * g->b_col_step, g->b_type);
            store_elem(g->bias, j, g->bias_type, (float)s);
        }
    }
}

// Run one GEMM: rows are split over threads when the product is big enough to pay for them.
static void gemm_run(const Gemm* g) {
    bias_gradient_of_input(g);
    if (g->m == 0) return;
    if (g->n == 0) {  // empty D: its row sums are 0
        if (g->ops.bgrad_d)
            for (int i = 0; i < g->m; i++) store_elem(g->bias, i, g->bias_type, 0.0f);
        return;
    }
    int panels = (g->m + MR - 1) / MR;
    double flops = 2.0 * g->m * g->n * (double)g->k;
    int threads = flops < (double)(1 << 22) ? 1 : blas_thread_count();
    if (threads > panels) threads = panels;
    if (threads <= 1) {
        gemm_rows(g, 0, g->m);
        return;
    }
    pthread_t tid[16];
    RowJob jobs[16];
    bool started[16];
    for (int t = 0; t < threads; t++) {  // thread t takes a contiguous range of row panels
        int p0 = (int)((int64_t)panels * t / threads), p1 = (int)((int64_t)panels * (t + 1) / threads);
        jobs[t].g = g;
        jobs[t].i_begin = p0 * MR;
        jobs[t].i_end = p1 * MR < g->m ? p1 * MR : g->m;
        started[t] = t > 0 && pthread_create(&tid[t], NULL, row_job_main, &jobs[t]) == 0;
    }
    for (int t = 0; t < threads; t++)
        if (!started[t]) gemm_rows(g, jobs[t].i_begin, jobs[t].i_end);  // thread 0, or a failed start
    for (int t = 1; t < threads; t++)
        if (started[t]) pthread_join(tid[t], NULL);
}

// The steps of op(X) for a column-major matrix with leading dimension ld.
static void op_steps(bool trans, int64_t ld, int64_t* row_step, int64_t* col_step) {
    *row_step = trans ? ld : 1;
    *col_step = trans ? 1 : ld;
}

// ============================================================================
// cuBLAS (the classic API)

struct cublasContext {
    cudaStream_t stream;
    cublasMath_t math_mode;
    void* workspace;
    size_t workspace_bytes;
};

static bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    cublasContext* h = new (std::nothrow) cublasContext();
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->stream = NULL;
    h->math_mode = CUBLAS_DEFAULT_MATH;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int* version) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!version) return CUBLAS_STATUS_INVALID_VALUE;
    *version = CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;  // the products run in this stream's order
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    int base = (int)mode & ~(int)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base < CUBLAS_DEFAULT_MATH || base > CUBLAS_TF32_TENSOR_OP_MATH) {
        blas_log("cublasSetMathMode", "unknown math mode %d", (int)mode);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    handle->math_mode = mode;  // TF32 modes round inputs on the GPU; here everything is fp32
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math_mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t workspace_bytes) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->workspace = workspace;  // unused: the CPU product needs no device workspace
    handle->workspace_bytes = workspace_bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_SUCCESS;
    if (mode == CUBLAS_POINTER_MODE_DEVICE) {
        blas_unimplemented("cublasSetPointerMode", "CUBLAS_POINTER_MODE_DEVICE (alpha and beta must be host pointers)");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = CUBLAS_POINTER_MODE_HOST;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS:
            return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED:
            return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED:
            return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE:
            return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH:
            return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR:
            return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED:
            return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR:
            return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED:
            return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR:
            return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS:
            return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED:
            return "the library was not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED:
            return "the resource allocation failed";
        case CUBLAS_STATUS_INVALID_VALUE:
            return "an invalid value was used as an argument";
        case CUBLAS_STATUS_ARCH_MISMATCH:
            return "an absent device architectural feature is required";
        case CUBLAS_STATUS_MAPPING_ERROR:
            return "an access to GPU memory space failed";
        case CUBLAS_STATUS_EXECUTION_FAILED:
            return "the GPU program failed to execute";
        case CUBLAS_STATUS_INTERNAL_ERROR:
            return "an internal operation failed";
        case CUBLAS_STATUS_NOT_SUPPORTED:
            return "the functionality requested is not supported";
        case CUBLAS_STATUS_LICENSE_ERROR:
            return "error detected trying to check the license";
    }
    return "unknown cuBLAS status";
}

// Type combinations of cublasGemmEx that this file computes (a subset of NVIDIA's table):
//   CUBLAS_COMPUTE_32F(_PEDANTIC): A/B 32F -> C 32F;  A/B 16BF -> C 16BF or 32F
//   CUBLAS_COMPUTE_32F_FAST_16F / _FAST_16BF / _FAST_TF32: A/B/C 32F only
static bool gemm_types_supported(int atype, int btype, int ctype, int compute) {
    if (atype != btype || !is_storage_type(atype) || !is_storage_type(ctype)) return false;
    if (atype == CUDA_R_32F && ctype != CUDA_R_32F) return false;
    switch (compute) {
        case CUBLAS_COMPUTE_32F:
        case CUBLAS_COMPUTE_32F_PEDANTIC:
            return true;
        case CUBLAS_COMPUTE_32F_FAST_16F:
        case CUBLAS_COMPUTE_32F_FAST_16BF:
        case CUBLAS_COMPUTE_32F_FAST_TF32:
            return atype == CUDA_R_32F;
        default:
            return false;
    }
}

static bool valid_gemm_algo(int algo) {
    return (algo >= CUBLAS_GEMM_DEFAULT && algo <= CUBLAS_GEMM_ALGO23) ||
           (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP) ||
           algo == CUBLAS_GEMM_AUTOTUNE;
}

// The classic strided-batched GEMM behind every cuBLAS entry point:
//   C_b = alpha op(A_b) op(B_b) + beta C_b,  X_b = X + b * strideX,  b = 0 .. batch-1.
// The checks are those documented for cublas<t>gemm / cublasGemmEx: INVALID_VALUE when m, n, k
// or batch < 0, a transpose is unknown, lda < max(1, rows of A as stored), ldb likewise,
// ldc < max(1, m), or alpha/beta are NULL; NOT_SUPPORTED for a type/compute/algo combination.
static cublasStatus_t classic_gemm(const char* func, cublasHandle_t handle, cublasOperation_t transa,
                                   cublasOperation_t transb, int m, int n, int k, const float* alpha, const void* A,
                                   int atype, int lda, long long stride_a, const void* B, int btype, int ldb,
                                   long long stride_b, const float* beta, void* C, int ctype, int ldc,
                                   long long stride_c, int batch, int compute, int algo) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!valid_op(transa) || !valid_op(transb)) {
        blas_log(func, "unknown transa %d or transb %d", (int)transa, (int)transb);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;  // OP_C is OP_T for real types
    if (m < 0 || n < 0 || k < 0 || batch < 0) {
        blas_log(func, "negative size m=%d n=%d k=%d batchCount=%d", m, n, k, batch);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    int a_rows = ta ? k : m, b_rows = tb ? n : k;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1)) {
        blas_log(func, "lda=%d ldb=%d ldc=%d below the stored rows (%d, %d, %d)", lda, ldb, ldc, a_rows, b_rows, m);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!gemm_types_supported(atype, btype, ctype, compute)) {
        blas_log(func, "unsupported types A=%d B=%d C=%d compute=%d", atype, btype, ctype, compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!valid_gemm_algo(algo)) {
        blas_log(func, "unknown algo %d", algo);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!alpha || !beta) {
        blas_log(func, "alpha or beta is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    bool reads_ab = k > 0 && *alpha != 0.0f;
    if ((reads_ab && (!A || !B)) || !C) {
        fprintf(stderr, "[cpu cublas][%s] NULL matrix pointer (the GPU would fault)\n", func);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    std::vector<Gemm> gemms;
    for (int bi = 0; bi < batch; bi++) {
        Gemm g;
        memset(&g, 0, sizeof g);
        g.m = m, g.n = n, g.k = k, g.splitk = 1;
        g.a = A ? (const char*)A + (int64_t)bi * stride_a * (int64_t)type_size(atype) : NULL;
        g.a_type = atype;
        op_steps(ta, lda, &g.a_row_step, &g.a_col_step);
        g.b = B ? (const char*)B + (int64_t)bi * stride_b * (int64_t)type_size(btype) : NULL;
        g.b_type = btype;
        op_steps(tb, ldb, &g.b_row_step, &g.b_col_step);
        g.c = (char*)C + (int64_t)bi * stride_c * (int64_t)type_size(ctype);
        g.d = (void*)g.c;
        g.ldc = g.ldd = ldc;
        g.cd_type = ctype;
        g.alpha = *alpha;
        g.beta = *beta;
        gemms.push_back(g);
    }
    emu_stream_enqueue(handle->stream, 1, [gemms] {  // in stream order, as the GPU runs it
        for (const Gemm& g : gemms) gemm_run(&g);
    });
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    return classic_gemm("cublasGemmEx", handle, transa, transb, m, n, k, (const float*)alpha, A, Atype, lda, 0, B,
                        Btype, ldb, 0, (const float*)beta, C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
    return classic_gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, (const float*)alpha, A, Atype,
                        lda, strideA, B, Btype, ldb, strideB, (const float*)beta, C, Ctype, ldc, strideC, batchCount,
                        computeType, algo);
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                              const float* beta, float* C, int ldc) {
    return classic_gemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F,
                        ldb, 0, beta, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb, long long int strideB,
                                         const float* beta, float* C, int ldc, long long int strideC, int batchCount) {
    return classic_gemm("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda,
                        strideA, B, CUDA_R_32F, ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC, batchCount,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// ============================================================================
// cuBLASLt: handle and descriptors
//
// The header's descriptor types are opaque blocks of uint64_t (cublasLtMatmulDescOpaque_t and
// friends), which cublas*Init() lets the caller allocate. Our structs live inside those blocks,
// tagged with a magic number so that a stray or destroyed descriptor is noticed.

struct cublasLtContext {
    int unused;
};

enum { DESC_MAGIC = 0x4c744d44, LAYOUT_MAGIC = 0x4c744c59, PREF_MAGIC = 0x4c745046, ALGO_MAGIC = 0x4c74414c };

typedef struct {
    uint32_t magic;
    int32_t compute_type, scale_type, pointer_mode;
    int32_t transa, transb, transc, fill_mode;
    uint32_t epilogue;
    int32_t bias_type, aux_type;  // -1: the type of D
    int32_t sm_count_target;
    int8_t fast_accum;
    const void* bias;  // bias input, or bias-gradient output
    void* aux;         // GELU input: written by GELU_AUX*, read by DGELU*
    int64_t bias_batch_stride, aux_ld, aux_batch_stride, alpha_vector_batch_stride;
    const void* fp8_pointers[7];  // A/B/C/D scale, amax D, aux scale, aux amax: must stay NULL here
} MatmulDesc;

typedef struct {
    uint32_t magic;
    uint32_t type;
    int32_t order;
    int32_t batch_count;
    uint64_t rows, cols;
    int64_t ld, batch_stride, plane_offset;
    uint32_t batch_mode;
} MatrixLayout;

typedef struct {
    uint32_t magic;
    uint32_t search_mode;
    uint64_t max_workspace;
    uint32_t reduction_mask;
    uint32_t min_alignment[4];  // A, B, C, D in bytes (default 256)
    float max_waves;
    uint64_t impl_mask;
} MatmulPref;

// What the heuristic hands back inside cublasLtMatmulAlgo_t: the alignment (bytes) the chosen
// "kernel" needs for the A, B, C, D pointers (see lt_required_alignment), and its split-K: k cut into
// splitk parts whose fp32 sums are added in the workspace (reduction CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
// splitk 1: CUBLASLT_REDUCTION_SCHEME_NONE), needing `workspace` bytes.
typedef struct {
    uint32_t magic;
    uint32_t alignment[4];
    uint32_t splitk, reduction;
    uint64_t workspace;
} AlgoInfo;

static_assert(sizeof(MatmulDesc) <= sizeof(cublasLtMatmulDescOpaque_t), "MatmulDesc does not fit");
static_assert(sizeof(MatrixLayout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "MatrixLayout does not fit");
static_assert(sizeof(MatmulPref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "MatmulPref does not fit");
static_assert(sizeof(AlgoInfo) <= sizeof(cublasLtMatmulAlgo_t), "AlgoInfo does not fit");

static MatmulDesc* desc_of(cublasLtMatmulDesc_t d) {
    MatmulDesc* p = (MatmulDesc*)(void*)d;
    return p && p->magic == DESC_MAGIC ? p : NULL;
}
static MatrixLayout* layout_of(cublasLtMatrixLayout_t l) {
    MatrixLayout* p = (MatrixLayout*)(void*)l;
    return p && p->magic == LAYOUT_MAGIC ? p : NULL;
}
static MatmulPref* pref_of(cublasLtMatmulPreference_t pr) {
    MatmulPref* p = (MatmulPref*)(void*)pr;
    return p && p->magic == PREF_MAGIC ? p : NULL;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtContext* h = new (std::nothrow) cublasLtContext();
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) { return cublasGetStatusName(status); }
const char* cublasLtGetStatusString(cublasStatus_t status) { return cublasGetStatusString(status); }
size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

// Attribute access shared by the three descriptor kinds: the field and its exact size, as the
// header documents them (a set or get with another size is CUBLAS_STATUS_INVALID_VALUE).
typedef struct {
    void* field;
    size_t size;
} AttrField;

static cublasStatus_t attr_set(const char* func, AttrField f, int attr, const void* buf, size_t size) {
    if (!f.field) {
        blas_unimplemented(func, "attribute %d", attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!buf || size != f.size) {
        blas_log(func, "attribute %d takes %zu bytes, got %zu%s", attr, f.size, size, buf ? "" : " (buf NULL)");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memcpy(f.field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

// Get: with sizeInBytes 0, *sizeWritten receives the size needed; otherwise the size must match.
static cublasStatus_t attr_get(const char* func, AttrField f, int attr, void* buf, size_t size, size_t* written) {
    if (!f.field) {
        blas_unimplemented(func, "attribute %d", attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (size == 0) {
        if (!written) return CUBLAS_STATUS_INVALID_VALUE;
        *written = f.size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || size != f.size) {
        blas_log(func, "attribute %d takes %zu bytes, got %zu", attr, f.size, size);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memcpy(buf, f.field, size);
    if (written) *written = size;
    return CUBLAS_STATUS_SUCCESS;
}

// ---- matrix layouts

static void layout_init(MatrixLayout* l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
    memset(l, 0, sizeof *l);
    l->magic = LAYOUT_MAGIC;
    l->type = (uint32_t)type;
    l->order = CUBLASLT_ORDER_COL;
    l->batch_count = 1;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
}

cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t layout, size_t size, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld) {
    if (!layout || size < sizeof(cublasLtMatrixLayoutOpaque_t)) return CUBLAS_STATUS_ALLOC_FAILED;
    layout_init((MatrixLayout*)(void*)layout, type, rows, cols, ld);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatrixLayoutOpaque_t* block = new (std::nothrow) cublasLtMatrixLayoutOpaque_t();
    if (!block) return CUBLAS_STATUS_ALLOC_FAILED;
    layout_init((MatrixLayout*)(void*)block, type, rows, cols, ld);
    *layout = block;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    MatrixLayout* l = layout_of(layout);
    if (!layout) return CUBLAS_STATUS_SUCCESS;
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    l->magic = 0;
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

static AttrField layout_field(MatrixLayout* l, int attr) {
    switch (attr) {
        case CUBLASLT_MATRIX_LAYOUT_TYPE:
            return {&l->type, sizeof(uint32_t)};
        case CUBLASLT_MATRIX_LAYOUT_ORDER:
            return {&l->order, sizeof(int32_t)};
        case CUBLASLT_MATRIX_LAYOUT_ROWS:
            return {&l->rows, sizeof(uint64_t)};
        case CUBLASLT_MATRIX_LAYOUT_COLS:
            return {&l->cols, sizeof(uint64_t)};
        case CUBLASLT_MATRIX_LAYOUT_LD:
            return {&l->ld, sizeof(int64_t)};
        case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
            return {&l->batch_count, sizeof(int32_t)};
        case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
            return {&l->batch_stride, sizeof(int64_t)};
        case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET:
            return {&l->plane_offset, sizeof(int64_t)};
        case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE:
            return {&l->batch_mode, sizeof(uint32_t)};
    }
    return {NULL, 0};
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
    MatrixLayout* l = layout_of(layout);
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    return attr_set("cublasLtMatrixLayoutSetAttribute", layout_field(l, attr), attr, buf, size);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t size, size_t* written) {
    MatrixLayout* l = layout_of(layout);
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    return attr_get("cublasLtMatrixLayoutGetAttribute", layout_field(l, attr), attr, buf, size, written);
}

// ---- matmul descriptors

static void desc_init(MatmulDesc* d, cublasComputeType_t compute, cudaDataType_t scale) {
    memset(d, 0, sizeof *d);
    d->magic = DESC_MAGIC;
    d->compute_type = compute;
    d->scale_type = scale;
    d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    d->transa = d->transb = d->transc = CUBLAS_OP_N;
    d->fill_mode = CUBLAS_FILL_MODE_FULL;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias_type = d->aux_type = -1;
}

cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t desc, size_t size, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
    if (!desc || size < sizeof(cublasLtMatmulDescOpaque_t)) return CUBLAS_STATUS_ALLOC_FAILED;
    desc_init((MatmulDesc*)(void*)desc, compute, scale);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
    if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulDescOpaque_t* block = new (std::nothrow) cublasLtMatmulDescOpaque_t();
    if (!block) return CUBLAS_STATUS_ALLOC_FAILED;
    desc_init((MatmulDesc*)(void*)block, compute, scale);
    *desc = block;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    MatmulDesc* d = desc_of(desc);
    if (!desc) return CUBLAS_STATUS_SUCCESS;
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    d->magic = 0;
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

static AttrField desc_field(MatmulDesc* d, int attr) {
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
            return {&d->compute_type, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
            return {&d->scale_type, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_POINTER_MODE:
            return {&d->pointer_mode, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_TRANSA:
            return {&d->transa, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_TRANSB:
            return {&d->transb, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_TRANSC:
            return {&d->transc, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_FILL_MODE:
            return {&d->fill_mode, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_EPILOGUE:
            return {&d->epilogue, sizeof(uint32_t)};
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
            return {&d->bias, sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
            return {&d->bias_batch_stride, sizeof(int64_t)};
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
            return {&d->aux, sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
            return {&d->aux_ld, sizeof(int64_t)};
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
            return {&d->aux_batch_stride, sizeof(int64_t)};
        case CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE:
            return {&d->alpha_vector_batch_stride, sizeof(int64_t)};
        case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET:
            return {&d->sm_count_target, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
            return {&d->aux_type, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
            return {&d->fast_accum, sizeof(int8_t)};
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
            return {&d->bias_type, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
            return {&d->fp8_pointers[0], sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
            return {&d->fp8_pointers[1], sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER:
            return {&d->fp8_pointers[2], sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER:
            return {&d->fp8_pointers[3], sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER:
            return {&d->fp8_pointers[4], sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER:
            return {&d->fp8_pointers[5], sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER:
            return {&d->fp8_pointers[6], sizeof(void*)};
    }
    return {NULL, 0};
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
    MatmulDesc* d = desc_of(desc);
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    return attr_set("cublasLtMatmulDescSetAttribute", desc_field(d, attr), attr, buf, size);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, void* buf,
                                              size_t size, size_t* written) {
    MatmulDesc* d = desc_of(desc);
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    return attr_get("cublasLtMatmulDescGetAttribute", desc_field(d, attr), attr, buf, size, written);
}

// ---- heuristic preferences

static void pref_init(MatmulPref* p) {
    memset(p, 0, sizeof *p);
    p->magic = PREF_MAGIC;
    p->search_mode = CUBLASLT_SEARCH_BEST_FIT;
    p->reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    for (int i = 0; i < 4; i++) p->min_alignment[i] = 256;  // the documented default
    p->impl_mask = ~(uint64_t)0;
}

cublasStatus_t cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size) {
    if (!pref || size < sizeof(cublasLtMatmulPreferenceOpaque_t)) return CUBLAS_STATUS_ALLOC_FAILED;
    pref_init((MatmulPref*)(void*)pref);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulPreferenceOpaque_t* block = new (std::nothrow) cublasLtMatmulPreferenceOpaque_t();
    if (!block) return CUBLAS_STATUS_ALLOC_FAILED;
    pref_init((MatmulPref*)(void*)block);
    *pref = block;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    MatmulPref* p = pref_of(pref);
    if (!pref) return CUBLAS_STATUS_SUCCESS;
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    p->magic = 0;
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

static AttrField pref_field(MatmulPref* p, int attr) {
    switch (attr) {
        case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
            return {&p->search_mode, sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
            return {&p->max_workspace, sizeof(uint64_t)};
        case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
            return {&p->reduction_mask, sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
            return {&p->min_alignment[0], sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
            return {&p->min_alignment[1], sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
            return {&p->min_alignment[2], sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
            return {&p->min_alignment[3], sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
            return {&p->max_waves, sizeof(float)};
        case CUBLASLT_MATMUL_PREF_IMPL_MASK:
            return {&p->impl_mask, sizeof(uint64_t)};
    }
    return {NULL, 0};
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
    MatmulPref* p = pref_of(pref);
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    return attr_set("cublasLtMatmulPreferenceSetAttribute", pref_field(p, attr), attr, buf, size);
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void* buf, size_t size,
                                                    size_t* written) {
    MatmulPref* p = pref_of(pref);
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    return attr_get("cublasLtMatmulPreferenceGetAttribute", pref_field(p, attr), attr, buf, size, written);
}

// ============================================================================
// cuBLASLt: checking a problem, the heuristic, the matmul

// The epilogues, with the rules NVIDIA documents for them (cublasLt.h, cublasLtEpilogue_t and
// cublasLtMatmulDescAttributes_t; the cuBLAS guide; the nvmath-python tests of cuBLASLt).
// Returns false for an epilogue this file does not compute.
static bool epilogue_ops(uint32_t epilogue, EpilogueOps* ops) {
    memset(ops, 0, sizeof *ops);
    switch (epilogue) {
        case CUBLASLT_EPILOGUE_DEFAULT:  // no postprocessing: D = alpha op(A) op(B) + beta C
            return true;
        case CUBLASLT_EPILOGUE_RELU:  // x := max(x, 0)
            ops->relu = true;
            return true;
        case CUBLASLT_EPILOGUE_BIAS:  // bias vector, length = rows of D, packed (stride 1), broadcast to
            ops->bias_add = true;     // every column and added before the final postprocessing
            return true;
        case CUBLASLT_EPILOGUE_RELU_BIAS:  // apply bias and then ReLU
            ops->bias_add = ops->relu = true;
            return true;
        case CUBLASLT_EPILOGUE_GELU:  // x := GELU(x), the tanh approximation
            ops->gelu = true;
            return true;
        case CUBLASLT_EPILOGUE_GELU_AUX:  // GELU, and the GELU input (alpha AB + beta C) goes to the aux matrix
            ops->gelu = ops->aux_out = true;
            return true;
        case CUBLASLT_EPILOGUE_GELU_BIAS:  // apply bias and then GELU
            ops->bias_add = ops->gelu = true;
            return true;
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:  // bias, then GELU; aux = the GELU input, i.e. after the bias
            ops->bias_add = ops->gelu = ops->aux_out = true;
            return true;
        case CUBLASLT_EPILOGUE_DGELU:  // GELU gradient: D = (alpha AB + beta C) * GELU'(aux), aux = the forward
            ops->dgelu = true;         // GELU input (as GELU_AUX* stored it)
            return true;
        case CUBLASLT_EPILOGUE_DGELU_BGRAD:    // DGELU, and the bias gradient bias[i] = sum_j D[i][j] (length
            ops->dgelu = ops->bgrad_d = true;  // = rows of D) goes to the bias pointer
            return true;
        case CUBLASLT_EPILOGUE_BGRADA:  // bias gradient of A: length = rows of D, reduced over the GEMM's k:
            ops->bgrad_a = true;        // bias[i] = sum_p op(A)[i][p]; D is the plain product
            return true;
        case CUBLASLT_EPILOGUE_BGRADB:  // bias gradient of B: length = columns of D, reduced over k:
            ops->bgrad_b = true;        // bias[j] = sum_p op(B)[p][j]; D is the plain product
            return true;
    }
    return false;
}

// Everything one cublasLtMatmul needs, resolved from the descriptors.
typedef struct {
    int m, n, k, batch;
    bool ta, tb;
    int ab_type, cd_type, bias_type, aux_type;
    EpilogueOps ops;
    uint32_t alignment[4];  // bytes the A, B, C, D pointers must be aligned to (see lt_required_alignment)
} LtProblem;

static const char* HEUR = "cublasLtMatmulAlgoGetHeuristic";

// Largest power of two dividing x (x > 0), capped at 256.
static uint32_t pow2_factor(int64_t x) {
    uint32_t a = 1;
    while (a < 256 && x % (2 * a) == 0) a *= 2;
    return a;
}

// The alignment a GPU kernel picked for this layout needs from the matrix pointer. The heuristic
// never sees the A/B/C/D pointers: it assumes CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES
// (default 256) and picks a kernel with 16-byte vector loads when the leading dimension and batch
// stride allow them. Such a kernel refuses a less aligned pointer with
// CUBLAS_STATUS_NOT_SUPPORTED in cublasLtMatmul (observed, e.g., pytorch/pytorch#92201, #97205).
static uint32_t lt_required_alignment(const MatrixLayout* l, uint32_t pref_bytes) {
    int64_t es = (int64_t)type_size(l->type);
    uint32_t a = pref_bytes < 16 ? pref_bytes : 16;
    uint32_t ld_align = pow2_factor(l->ld * es);
    if (ld_align < a) a = ld_align;
    if (l->batch_count > 1 && l->batch_stride != 0) {
        uint32_t s = pow2_factor((l->batch_stride < 0 ? -l->batch_stride : l->batch_stride) * es);
        if (s < a) a = s;
    }
    return a < (uint32_t)es ? (uint32_t)es : a;
}

// Check a layout on its own: COL order, a type we compute, ld >= rows.
static cublasStatus_t lt_check_layout(const MatrixLayout* l, char name) {
    if (!l) {
        blas_log(HEUR, "matrix %c: NULL or destroyed layout", name);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (l->order != CUBLASLT_ORDER_COL) {  // the only memory order of this CPU build
        if (l->order < CUBLASLT_ORDER_COL || l->order > CUBLASLT_ORDER_COL32_2R_4R4) {
            blas_log(HEUR, "matrix %c: unknown order %d", name, l->order);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        blas_unimplemented(HEUR, "matrix %c has memory order %d (only CUBLASLT_ORDER_COL)", name, l->order);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (l->plane_offset != 0 || l->batch_mode != CUBLASLT_BATCH_MODE_STRIDED) {
        blas_unimplemented(HEUR, "matrix %c: planar complex or pointer-array batches", name);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!is_storage_type(l->type)) {
        blas_log(HEUR, "matrix %c: type %u is not CUDA_R_32F or CUDA_R_16BF", name, l->type);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (l->rows > INT32_MAX || l->cols > INT32_MAX) {  // "usually only values that fit int32_t"
        blas_log(HEUR, "matrix %c: %llu x %llu does not fit int32", name, (unsigned long long)l->rows,
                 (unsigned long long)l->cols);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    // LD: "must be large enough so that matrix memory locations are not overlapping (e.g. greater
    // or equal to CUBLASLT_MATRIX_LAYOUT_ROWS in case of CUBLASLT_ORDER_COL)"; negative ld is refused.
    if (l->ld < (int64_t)(l->rows > 1 ? l->rows : 1)) {
        blas_log(HEUR, "matrix %c: ld %lld < rows %llu", name, (long long)l->ld, (unsigned long long)l->rows);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (l->batch_count < 1) {
        blas_log(HEUR, "matrix %c: batch count %d", name, l->batch_count);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// Check a whole problem the way the heuristic would (which also runs inside cublasLtMatmul).
static cublasStatus_t lt_check(const MatmulDesc* d, const MatrixLayout* A, const MatrixLayout* B, const MatrixLayout* C,
                               const MatrixLayout* D, const MatmulPref* pref, LtProblem* p) {
    if (!d) {
        blas_log(HEUR, "NULL or destroyed matmul descriptor");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    cublasStatus_t st;
    if ((st = lt_check_layout(A, 'A')) || (st = lt_check_layout(B, 'B')) || (st = lt_check_layout(C, 'C')) ||
        (st = lt_check_layout(D, 'D')))
        return st;
    memset(p, 0, sizeof *p);

    // Operation: op(A) is m x k, op(B) is k x n, C and D are m x n. TRANSC must be N.
    if (!valid_op((cublasOperation_t)d->transa) || !valid_op((cublasOperation_t)d->transb) ||
        !valid_op((cublasOperation_t)d->transc)) {
        blas_log(HEUR, "unknown transpose %d/%d/%d", d->transa, d->transb, d->transc);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (d->transc != CUBLAS_OP_N || d->fill_mode != CUBLAS_FILL_MODE_FULL) {  // "currently only CUBLAS_OP_N"
        blas_log(HEUR, "TRANSC must be CUBLAS_OP_N and FILL_MODE full");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    p->ta = d->transa != CUBLAS_OP_N;
    p->tb = d->transb != CUBLAS_OP_N;
    p->m = (int)D->rows;
    p->n = (int)D->cols;
    p->k = (int)(p->ta ? A->rows : A->cols);
    int a_m = (int)(p->ta ? A->cols : A->rows);
    int b_k = (int)(p->tb ? B->cols : B->rows), b_n = (int)(p->tb ? B->rows : B->cols);
    if (a_m != p->m || b_k != p->k || b_n != p->n) {
        blas_log(HEUR, "op(A) is %d x %d, op(B) is %d x %d, D is %d x %d", a_m, p->k, b_k, b_n, p->m, p->n);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    // C and D: "same data type, number of rows, number of columns, batch size, and memory order";
    // every matrix has the same batch count.
    if (C->rows != D->rows || C->cols != D->cols || C->type != D->type) {
        blas_log(HEUR, "C (%llu x %llu, type %u) differs from D (%llu x %llu, type %u)", (unsigned long long)C->rows,
                 (unsigned long long)C->cols, C->type, (unsigned long long)D->rows, (unsigned long long)D->cols,
                 D->type);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (A->batch_count != D->batch_count || B->batch_count != D->batch_count || C->batch_count != D->batch_count) {
        blas_log(HEUR, "batch counts differ: A %d, B %d, C %d, D %d", A->batch_count, B->batch_count, C->batch_count,
                 D->batch_count);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    p->batch = D->batch_count;

    // Types: compute 32F with scale 32F; A/B 32F -> C/D 32F, A/B 16BF -> C/D 16BF or 32F. The
    // FAST_* compute types are for fp32 inputs only (computed here in full fp32).
    p->ab_type = (int)A->type;
    p->cd_type = (int)D->type;
    bool compute_ok = d->compute_type == CUBLAS_COMPUTE_32F || d->compute_type == CUBLAS_COMPUTE_32F_PEDANTIC ||
                      (A->type == CUDA_R_32F && (d->compute_type == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                                                 d->compute_type == CUBLAS_COMPUTE_32F_FAST_16BF ||
                                                 d->compute_type == CUBLAS_COMPUTE_32F_FAST_16F));
    if (A->type != B->type || !compute_ok || d->scale_type != CUDA_R_32F ||
        (A->type == CUDA_R_32F && D->type != CUDA_R_32F)) {
        blas_log(HEUR, "unsupported types: A %u, B %u, C/D %u, compute %d, scale %d", A->type, B->type, D->type,
                 d->compute_type, d->scale_type);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
        blas_unimplemented(HEUR, "pointer mode %d (alpha and beta must be host pointers)", d->pointer_mode);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    // The fp8 scale / amax pointers: "if set for an unsupported matrix data, scale, and compute type
    // combination, calling cublasLtMatmul() will return CUBLAS_INVALID_VALUE".
    for (int i = 0; i < 7; i++) {
        if (d->fp8_pointers[i]) {
            blas_log(HEUR, "an fp8 scale or amax pointer is set for a non-fp8 matmul");
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }

    // Epilogue.
    if (!epilogue_ops(d->epilogue, &p->ops)) {
        if (d->epilogue == CUBLASLT_EPILOGUE_RELU_AUX || d->epilogue == CUBLASLT_EPILOGUE_RELU_AUX_BIAS ||
            d->epilogue == CUBLASLT_EPILOGUE_DRELU || d->epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD) {
            blas_unimplemented(HEUR, "epilogue %u (the ReLU bit-mask epilogues)", d->epilogue);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        blas_log(HEUR, "unknown epilogue %u", d->epilogue);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const EpilogueOps* ops = &p->ops;
    bool bgrad = ops->bgrad_a || ops->bgrad_b || ops->bgrad_d;
    if (ops->bias_add || bgrad) {
        if (!d->bias) {
            blas_log(HEUR, "epilogue %u needs CUBLASLT_MATMUL_DESC_BIAS_POINTER", d->epilogue);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // Bias type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE): "the same type as the elements of
        // output matrix (Dtype)", the exceptions being IMMA and fp8 kernels; bias gradients are
        // "the same type as the output elements". cuBLASLt 13.0 on an H100 refuses a mixed pair
        // with INVALID_VALUE (bf16 D with an fp32 bias for GELU_BIAS; both mixed pairs for
        // BGRADA/BGRADB on the NT layout).
        p->bias_type = d->bias_type == -1 ? p->cd_type : d->bias_type;
        if (p->bias_type != p->cd_type) {
            blas_log(HEUR, "bias type %d with D type %d", p->bias_type, p->cd_type);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if ((uintptr_t)d->bias % type_size(p->bias_type) != 0) {
            blas_log(HEUR, "bias pointer %p is not aligned to its element size", d->bias);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
    }
    if (ops->aux_out || ops->dgelu) {
        if (!d->aux) {
            blas_log(HEUR, "epilogue %u needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER", d->epilogue);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // AUX_LD: "no less than the number of rows in the output matrix", and for GELU_AUX_BIAS and
        // DGELU_BGRAD (the two the documentation names) "must be divisible by 8". cuBLASLt 13.0
        // on an H100 accepts GELU_AUX with ld 20 and DGELU with ld 17, so only those two are held
        // to it. AUX_BATCH_STRIDE: "must be divisible by 8".
        bool ld_by_8 = d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || d->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
        if (d->aux_ld < p->m || d->aux_ld <= 0 || (ld_by_8 && d->aux_ld % 8 != 0)) {
            blas_log(HEUR, "aux ld %lld must be >= rows of D (%d)%s", (long long)d->aux_ld, p->m,
                     ld_by_8 ? " and a multiple of 8" : "");
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if (p->batch > 1 && d->aux_batch_stride % 8 != 0) {
            blas_log(HEUR, "aux batch stride %lld must be a multiple of 8", (long long)d->aux_batch_stride);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // The GELU input matrix has "the same type as the elements of the output matrix".
        p->aux_type = d->aux_type == -1 ? p->cd_type : d->aux_type;
        if (p->aux_type != p->cd_type) {
            blas_log(HEUR, "aux type %d with D type %d", p->aux_type, p->cd_type);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        if ((uintptr_t)d->aux % type_size(p->aux_type) != 0) {
            blas_log(HEUR, "aux pointer %p is not aligned to its element size", d->aux);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
    }
    // Bias gradients of an input: cuBLASLt 13.0 on an H100 serves BGRADA only when A is not
    // transposed and BGRADB only when B is (the reduced vector then runs along memory, and the
    // sum over k along the product's k loop); the other layouts get NOT_SUPPORTED from the heuristic
    // (TN, TT for BGRADA; NN, TN for BGRADB). The documentation names no layout either way.
    if ((ops->bgrad_a && p->ta) || (ops->bgrad_b && !p->tb)) {
        blas_log(HEUR, "%s with transa %s, transb %s: no kernel", ops->bgrad_a ? "BGRADA" : "BGRADB", p->ta ? "T" : "N",
                 p->tb ? "T" : "N");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (ops->dgelu && p->k == 1) {  // "K=1 is not supported by cuBLAS" for DGELU (nvmath-python)
        blas_log(HEUR, "DGELU epilogues need k > 1");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }

    // Pointer alignment the chosen kernel will need (checked in cublasLtMatmul).
    const MatrixLayout* mats[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++) p->alignment[i] = lt_required_alignment(mats[i], pref ? pref->min_alignment[i] : 256);
    if (pref && pref->search_mode != CUBLASLT_SEARCH_BEST_FIT) {
        blas_unimplemented(HEUR, "search mode %u (only CUBLASLT_SEARCH_BEST_FIT)", pref->search_mode);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// The algorithms offered, best first, as the real heuristic's list: the plain product (splitk 1, no workspace),
// then, where k is deep (at least 256 per part), the preference's reduction mask allows COMPUTE_TYPE and its
// workspace holds the parts' fp32 sums (splitk x m x n x batch x 4 bytes), split-K into 2 and into 4 parts (the
// GPU offers such algorithms for deep k and small m n: the weight gradients). None, with NOT_SUPPORTED or the
// refusal's status, when the problem cannot run.
#define CPU_LT_ALGO_ID 1  // CUBLASLT_ALGO_CONFIG_ID of this file's one kernel (the real library has many)
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (returnAlgoCount) *returnAlgoCount = 0;
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount) {
        blas_log(HEUR, "requestedAlgoCount %d, results %p, returnAlgoCount %p", requestedAlgoCount,
                 (void*)heuristicResultsArray, (void*)returnAlgoCount);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    MatmulPref* pref = pref_of(preference);
    if (!pref) {
        blas_log(HEUR, "NULL or destroyed preference");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    LtProblem p;
    cublasStatus_t st = lt_check(desc_of(operationDesc), layout_of(Adesc), layout_of(Bdesc), layout_of(Cdesc),
                                 layout_of(Ddesc), pref, &p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const uint32_t splits[3] = {1, 2, 4};
    int count = 0;
    for (int i = 0; i < 3 && count < requestedAlgoCount; i++) {
        uint64_t ws = splits[i] == 1 ? 0 : (uint64_t)splits[i] * p.m * p.n * p.batch * sizeof(float);
        if (splits[i] > 1 && ((int64_t)p.k < 256 * (int64_t)splits[i] || ws > pref->max_workspace ||
                              !(pref->reduction_mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)))
            continue;
        cublasLtMatmulHeuristicResult_t* r = &heuristicResultsArray[count++];
        memset(r, 0, sizeof *r);
        AlgoInfo info;
        memset(&info, 0, sizeof info);
        info.magic = ALGO_MAGIC;
        memcpy(info.alignment, p.alignment, sizeof info.alignment);
        info.splitk = splits[i];
        info.reduction = splits[i] == 1 ? CUBLASLT_REDUCTION_SCHEME_NONE : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        info.workspace = ws;
        memcpy(&r->algo, &info, sizeof info);
        r->workspaceSize = ws;
        r->state = CUBLAS_STATUS_SUCCESS;
        r->wavesCount = 1.0f;
    }
    *returnAlgoCount = count;
    return CUBLAS_STATUS_SUCCESS;
}

// The configuration of an algorithm the heuristic gave (sizes as cublasLt.h documents them): its id (this file's
// one kernel), split-K and reduction scheme; the tile, stages, swizzle, custom option, inner and cluster shapes are
// 0 (undefined: the CPU has none of them). INVALID_VALUE for another size, a NULL buffer, an unknown attribute or
// an algo the heuristic did not make.
cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
                                                    size_t sizeInBytes, size_t* sizeWritten) {
    const char* fn = "cublasLtMatmulAlgoConfigGetAttribute";
    AlgoInfo info;
    if (!algo) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&info, algo, sizeof info);
    if (info.magic != ALGO_MAGIC) {
        blas_log(fn, "algo was not produced by cublasLtMatmulAlgoGetHeuristic");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    uint32_t v32 = 0;
    uint16_t v16 = 0;
    const void* src = &v32;
    size_t size = 4;
    switch (attr) {
        case CUBLASLT_ALGO_CONFIG_ID:
            v32 = CPU_LT_ALGO_ID;
            break;
        case CUBLASLT_ALGO_CONFIG_SPLITK_NUM:
            v32 = info.splitk;
            break;
        case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME:
            v32 = info.reduction;
            break;
        case CUBLASLT_ALGO_CONFIG_TILE_ID:
        case CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING:
        case CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION:
        case CUBLASLT_ALGO_CONFIG_STAGES_ID:
            break;
        case CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID:
        case CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID:
            src = &v16, size = 2;
            break;
        default:
            blas_log(fn, "unknown attribute %d", (int)attr);
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (sizeInBytes == 0) {
        if (!sizeWritten) return CUBLAS_STATUS_INVALID_VALUE;
        *sizeWritten = size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || sizeInBytes != size) {
        blas_log(fn, "attribute %d: buffer %p of %zu bytes (it takes %zu)", (int)attr, buf, sizeInBytes, size);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memcpy(buf, src, size);
    if (sizeWritten) *sizeWritten = size;
    return CUBLAS_STATUS_SUCCESS;
}

// D = epilogue(alpha op(A) op(B) + beta C) for every batch; algo NULL runs the heuristic with
// default preferences, as the real library does.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
    const char* fn = "cublasLtMatmul";
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    MatmulDesc* d = desc_of(computeDesc);
    MatrixLayout *la = layout_of(Adesc), *lb = layout_of(Bdesc), *lc = layout_of(Cdesc), *ld = layout_of(Ddesc);
    LtProblem p;
    cublasStatus_t st = lt_check(d, la, lb, lc, ld, NULL, &p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    int splitk = 1;  // algo NULL: the heuristic's first (no split)
    if (algo) {      // the kernel the heuristic chose, with its alignment needs
        AlgoInfo info;
        memcpy(&info, algo, sizeof info);
        if (info.magic != ALGO_MAGIC) {
            blas_log(fn, "algo was not produced by cublasLtMatmulAlgoGetHeuristic");
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        memcpy(p.alignment, info.alignment, sizeof p.alignment);
        if (info.workspace > 0 && (!workspace || workspaceSizeInBytes < info.workspace)) {
            blas_log(fn, "its algorithm needs %llu bytes of workspace; given %zu at %p",
                     (unsigned long long)info.workspace, workspaceSizeInBytes, workspace);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        splitk = (int)info.splitk;
    }
    if (!alpha || !beta) {
        blas_log(fn, "alpha or beta is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    // A bias pointer set for an epilogue that takes no bias: cuBLASLt 13.0 on an H100 (2026-11-24) refuses the
    // matmul with INVALID_VALUE, though its heuristic returns an algorithm (DEFAULT, GELU_AUX, DGELU; a bias data
    // type alone is accepted)
    if (d->bias && !(p.ops.bias_add || p.ops.bgrad_a || p.ops.bgrad_b || p.ops.bgrad_d)) {
        blas_log(fn, "a bias pointer is set, but epilogue %u takes no bias", d->epilogue);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    float fa = *(const float*)alpha, fb = *(const float*)beta;
    bool reads_ab = p.k > 0 && fa != 0.0f;
    if ((reads_ab && (!A || !B)) || !D || (fb != 0.0f && !C)) {
        fprintf(stderr, "[cpu cublasLt][%s] NULL matrix pointer (the GPU would fault)\n", fn);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    // In place means "C == D and Cdesc == Ddesc"; out of place, ldc may differ from ldd.
    if (C == D && (lc->ld != ld->ld || (p.batch > 1 && lc->batch_stride != ld->batch_stride))) {
        blas_log(fn, "C == D but their layouts differ (ld %lld vs %lld)", (long long)lc->ld, (long long)ld->ld);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const void* ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++) {
        if (ptrs[i] && (uintptr_t)ptrs[i] % p.alignment[i] != 0) {
            blas_log(fn, "matrix %c at %p is not aligned to the %u bytes its kernel needs", "ABCD"[i], ptrs[i],
                     p.alignment[i]);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
    }
    // (the parts' sums of a split-K algorithm are not kept in the workspace: the CPU adds them in registers)
    emu_count_matmul();  // accepted: it will run (EMU_LAUNCH_STATS)

    // The products are described now (the descriptors may change after the call) and run in stream order.
    std::vector<Gemm> gemms;
    int64_t es_ab = (int64_t)type_size(p.ab_type), es_cd = (int64_t)type_size(p.cd_type);
    for (int bi = 0; bi < p.batch; bi++) {
        Gemm g;
        memset(&g, 0, sizeof g);
        g.m = p.m, g.n = p.n, g.k = p.k, g.splitk = splitk;
        g.a = A ? (const char*)A + bi * la->batch_stride * es_ab : NULL;
        g.a_type = p.ab_type;
        op_steps(p.ta, la->ld, &g.a_row_step, &g.a_col_step);
        g.b = B ? (const char*)B + bi * lb->batch_stride * es_ab : NULL;
        g.b_type = p.ab_type;
        op_steps(p.tb, lb->ld, &g.b_row_step, &g.b_col_step);
        g.c = C ? (const char*)C + bi * lc->batch_stride * es_cd : NULL;
        g.ldc = lc->ld;
        g.d = (char*)D + bi * ld->batch_stride * es_cd;
        g.ldd = ld->ld;
        g.cd_type = p.cd_type;
        g.alpha = fa;
        g.beta = fb;
        g.ops = p.ops;
        if (d->bias) g.bias = (char*)d->bias + bi * d->bias_batch_stride * (int64_t)type_size(p.bias_type);
        g.bias_type = p.bias_type;
        if (d->aux) g.aux = (char*)d->aux + bi * d->aux_batch_stride * (int64_t)type_size(p.aux_type);
        g.aux_ld = d->aux_ld;
        g.aux_type = p.aux_type;
        gemms.push_back(g);
    }
    emu_stream_enqueue(stream, 1, [gemms] {
        for (const Gemm& g : gemms) gemm_run(&g);
    });
    return CUBLAS_STATUS_SUCCESS;
}
