// tests/test_matmul.cu: the matrix products of cuBLAS and cuBLASLt against plain loops.
//
// Every transpose combination (NN, NT, TN, TT), odd sizes (17 x 5 x 33, 1 x 1 x 1, ...), leading
// dimensions above the row count, strided batches, fp32 and bf16 storage, alpha/beta other than
// 1/0, C == D in place, and every cuBLASLt epilogue mlm.c may use, compared with references
// computed here in double from the exact (already bf16-rounded) inputs; then the calls the
// libraries must refuse. Only public CUDA / cuBLAS APIs are used, so the same file builds with
// nvcc against the real libraries and with g++ against the CPU runtime in cpu/.
//
// Tolerances (u = 2^-24, the fp32 unit roundoff). A dot product of k terms accumulated in fp32,
// in any order (the GPU splits and reorders freely), is off by at most k*u*sum|terms| (Higham,
// "Accuracy and Stability of Numerical Algorithms", 3.1). So each check takes
//     atol = (k + 8) * u * gain * max over the outputs of (sum_p |alpha a b| + |beta c| + |bias|)
// where the 8 covers the epilogue's own few fp32 operations and gain = 1.2 >= max |GELU'| (1.13)
// for the GELU epilogues (an error in the GELU input passes through GELU or GELU' scaled by at
// most that). On top, rtol is the output's own rounding: 2^-8 for bf16 (one bf16 ulp, as the
// fp32 result may sit across a rounding boundary from the exact value), 1e-6 for fp32 (a few fp32
// ulps), 1e-5 for fp32 results of GELU epilogues (tanhf / the GPU's tanh are a few ulps off).
//
// What is the library's choice, not its contract, and how it is tested (cuBLASLt 13.0 on an H100,
// 2026-11-23):
//   - bf16 epilogues other than DEFAULT and RELU: the GPU rounds an intermediate value to bf16
//     (results up to about one bf16 ulp off the exact value, with beta = 0 and beta != 0). The
//     project relies only on "as if each of t0 = alpha AB + beta C and t1 = t0 + bias were rounded
//     to bf16 on the way", so each such element may also be off by gain * 2^-8 * (|t0| + |t1|).
//   - which transposes BGRADA and BGRADB serve: the documentation names none; the GPU refuses
//     BGRADA with A transposed and BGRADB with B not transposed. The project relies on the NT
//     layout (matmul_backward_weight: A not transposed, B transposed), which must work; on another
//     layout a refusal passes, but an accepted call must compute the right values.
//   - an aux ld that is not a multiple of 8 for GELU_AUX and DGELU (documented only for
//     GELU_AUX_BIAS and DGELU_BGRAD): the GPU accepts 20 and 17; the project always uses
//     multiples of 8, so a refusal passes and an accepted call must compute the right values.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "testing.h"

// blas_algo_config: the configuration that names algorithm a: the BLAS_ALGO_FIELDS attributes blas_algo_attrs
#define BLAS_ALGO_FIELDS 9
static const char* const blas_algo_fields[BLAS_ALGO_FIELDS] = {"id",      "tile",   "stages", "splitk", "reduction",
                                                               "swizzle", "custom", "inner",  "cluster"};
static const cublasLtMatmulAlgoConfigAttributes_t blas_algo_attrs[BLAS_ALGO_FIELDS] = {
    CUBLASLT_ALGO_CONFIG_ID,
    CUBLASLT_ALGO_CONFIG_TILE_ID,
    CUBLASLT_ALGO_CONFIG_STAGES_ID,
    CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
    CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
    CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
    CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
    CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID,
    CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID};
static void blas_algo_config(const cublasLtMatmulAlgo_t* a, int cfg[BLAS_ALGO_FIELDS]) {
    for (int i = 0; i < BLAS_ALGO_FIELDS; i++) {
        size_t size = 0;  // (4 bytes, the inner and cluster shapes 2: cublasLt.h)
        uint32_t v32 = 0;
        uint16_t v16 = 0;
        cublasLtMatmulAlgoConfigGetAttribute(a, blas_algo_attrs[i], NULL, 0, &size);
        cublasLtMatmulAlgoConfigGetAttribute(a, blas_algo_attrs[i], size == 2 ? (void*)&v16 : (void*)&v32, size, &size);
        cfg[i] = size == 2 ? (int)v16 : (int)v32;
    }
}

static const double U32 = 1.0 / 16777216.0;  // 2^-24
static const float SENTINEL = 7.0f;          // fills output padding; it must survive every product

// A status check that counts as one pass or one failure.
#define STATUS_IS(call, want)                                                                                      \
    do {                                                                                                           \
        cublasStatus_t s_ = (call);                                                                                \
        CHECK(s_ == (want), "%s returned %s, want %s", #call, cublasGetStatusName(s_), cublasGetStatusName(want)); \
    } while (0)

// ----------------------------------------------------------------------------
// Host helpers: matrices live on the host as floats holding values exact in their storage type.

static float round_to(float x, cudaDataType t) { return t == CUDA_R_16BF ? __bfloat162float(__float2bfloat16(x)) : x; }
static size_t type_bytes(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

static float* host_alloc(size_t n) {
    float* p = (float*)calloc(n ? n : 1, sizeof(float));
    if (!p) exit(1);
    return p;
}

// n values uniform in [lo, hi), rounded to the storage type t.
static float* host_random(size_t n, cudaDataType t, float lo, float hi) {
    float* x = host_alloc(n);
    test_fill(x, n, lo, hi);
    for (size_t i = 0; i < n; i++) x[i] = round_to(x[i], t);
    return x;
}

static float* host_const(size_t n, float v) {
    float* x = host_alloc(n);
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}

// Device copy of x[0..n) in storage type t.
static void* upload(const float* x, size_t n, cudaDataType t) {
    void* d = NULL;
    CUDA_OK(cudaMalloc(&d, n * type_bytes(t) + 16));
    if (t == CUDA_R_16BF) {
        __nv_bfloat16* tmp = (__nv_bfloat16*)malloc(n * 2 + 2);
        for (size_t i = 0; i < n; i++) tmp[i] = __float2bfloat16(x[i]);
        CUDA_OK(cudaMemcpy(d, tmp, n * 2, cudaMemcpyHostToDevice));
        free(tmp);
    } else {
        CUDA_OK(cudaMemcpy(d, x, n * 4, cudaMemcpyHostToDevice));
    }
    return d;
}

static void download(const void* d, size_t n, cudaDataType t, float* out) {
    if (t == CUDA_R_16BF) {
        __nv_bfloat16* tmp = (__nv_bfloat16*)malloc(n * 2 + 2);
        CUDA_OK(cudaMemcpy(tmp, d, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(tmp[i]);
        free(tmp);
    } else {
        CUDA_OK(cudaMemcpy(out, d, n * 4, cudaMemcpyDeviceToHost));
    }
}

// Elements of a strided batch of column-major rows x cols matrices that lie outside every matrix
// (padding rows between ld and rows, gaps between batches) and no longer hold the sentinel.
static int changed_padding(const float* buf, size_t total, int rows, int cols, int64_t ld, int64_t stride, int batch) {
    int changed = 0;
    for (size_t e = 0; e < total; e++) {
        int64_t b = stride > 0 ? (int64_t)e / stride : 0, off = (int64_t)e - b * stride;
        bool inside = b < batch && off % ld < rows && off / ld < cols;
        if (!inside && buf[e] != SENTINEL) changed++;
    }
    return changed;
}

// Compact copy (ld = rows) of a strided batch, for check_close.
static void compact(const float* buf, int rows, int cols, int64_t ld, int64_t stride, int batch, float* out) {
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < cols; j++)
            for (int i = 0; i < rows; i++) out[((size_t)b * cols + j) * rows + i] = buf[b * stride + j * ld + i];
}

// op(X)[r][c] of a column-major matrix with leading dimension ld.
static double op_at(const float* x, bool trans, int64_t ld, int r, int c) {
    return trans ? x[c + r * ld] : x[r + c * ld];
}

// The GELU the cuBLASLt epilogues use: the tanh approximation, and its derivative.
static double gelu_ref(double x) {
    double s = sqrt(2.0 / M_PI), u = s * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + tanh(u));
}
static double gelu_grad_ref(double x) {
    double s = sqrt(2.0 / M_PI), u = s * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}
static double gelu_erf_ref(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

static const char* op_name(cublasOperation_t op) { return op == CUBLAS_OP_N ? "N" : "T"; }
static const char* type_name(cudaDataType t) { return t == CUDA_R_16BF ? "bf16" : "fp32"; }

static const char* epilogue_name(cublasLtEpilogue_t e) {
    switch (e) {
        case CUBLASLT_EPILOGUE_DEFAULT:
            return "DEFAULT";
        case CUBLASLT_EPILOGUE_RELU:
            return "RELU";
        case CUBLASLT_EPILOGUE_BIAS:
            return "BIAS";
        case CUBLASLT_EPILOGUE_RELU_BIAS:
            return "RELU_BIAS";
        case CUBLASLT_EPILOGUE_GELU:
            return "GELU";
        case CUBLASLT_EPILOGUE_GELU_AUX:
            return "GELU_AUX";
        case CUBLASLT_EPILOGUE_GELU_BIAS:
            return "GELU_BIAS";
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
            return "GELU_AUX_BIAS";
        case CUBLASLT_EPILOGUE_DGELU:
            return "DGELU";
        case CUBLASLT_EPILOGUE_DGELU_BGRAD:
            return "DGELU_BGRAD";
        case CUBLASLT_EPILOGUE_BGRADA:
            return "BGRADA";
        case CUBLASLT_EPILOGUE_BGRADB:
            return "BGRADB";
        default:
            return "?";
    }
}

// ----------------------------------------------------------------------------
// One cuBLASLt case: D_b = epilogue(alpha op(A_b) op(B_b) + beta C_b) for b < batch.

typedef struct {
    cublasOperation_t ta, tb;
    int m, n, k, batch;
    cudaDataType ab, cd;
    float alpha, beta;
    bool in_place;  // C == D (same memory, same layout)
    cublasLtEpilogue_t epi;
    int bias_type;  // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE to set; -1 leaves it unset (D's type)
} LtCase;

static cublasLtHandle_t g_lt;
static cublasHandle_t g_blas;
static void* g_workspace;
static const size_t WORKSPACE_BYTES = 32u << 20;

static bool epi_has(cublasLtEpilogue_t e, int what) {
    switch (what) {
        case 'b':
            return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS ||
                   e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;  // bias input
        case 'r':
            return e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS;  // relu
        case 'g':
            return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                   e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;  // gelu
        case 'o':
            return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;  // aux out
        case 'd':
            return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;  // dgelu (aux in)
        case 'D':
            return e == CUBLASLT_EPILOGUE_DGELU_BGRAD;  // bgrad of D
        case 'A':
            return e == CUBLASLT_EPILOGUE_BGRADA;
        case 'B':
            return e == CUBLASLT_EPILOGUE_BGRADB;
    }
    return false;
}

// A refusal: NVIDIA documents INVALID_VALUE ("parameters are in conflict or in an impossible
// configuration") and NOT_SUPPORTED ("current implementation ... doesn't support configured
// operation") without saying which one each mistake gets, so either counts.
static bool is_refusal(cublasStatus_t st) {
    return st == CUBLAS_STATUS_INVALID_VALUE || st == CUBLAS_STATUS_NOT_SUPPORTED;
}

// Per element: |got - want| <= atol + rtol |want| + extra[i] (extra: the library's own roundings).
static int check_close_each(const char* what, const float* got, const float* want, const double* extra, size_t n,
                            float atol, float rtol) {
    size_t worst = 0, bad = 0;
    double worst_excess = -1e300;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        double tol = atol + rtol * fabs((double)want[i]) + extra[i];
        if (!(err <= tol)) bad++;  // NaN counts as bad
        double excess = isnan(err) ? 1e300 : err - tol;
        if (excess > worst_excess) worst_excess = excess, worst = i;
    }
    CHECK(bad == 0, "%s: %zu of %zu values off; worst [%zu] got %.9g want %.9g (atol %g rtol %g extra %g)", what, bad,
          n, worst, n ? got[worst] : 0.f, n ? want[worst] : 0.f, atol, rtol, n ? extra[worst] : 0.0);
    return bad == 0;
}

// The layouts on which the real library may refuse an epilogue (see the top of the file).
static bool layout_may_be_refused(const LtCase* c) {
    return (c->epi == CUBLASLT_EPILOGUE_BGRADA && c->ta != CUBLAS_OP_N) ||
           (c->epi == CUBLASLT_EPILOGUE_BGRADB && c->tb == CUBLAS_OP_N);
}

// One case. aux_ld_set: the aux leading dimension (0: a multiple of 8 above m). MAY_REFUSE: a
// refusal by both the heuristic and cublasLtMatmul (algo NULL) passes, and nothing is computed;
// MUST_REFUSE: only that passes.
typedef enum { MUST_RUN, MAY_REFUSE, MUST_REFUSE } Refusal;

static void run_lt_case_with(const LtCase* c, int64_t aux_ld_set, Refusal refusal) {
    char name[160];
    snprintf(name, sizeof name, "cublasLtMatmul %s%s %dx%dx%d batch %d %s->%s alpha %g beta %g%s %s", op_name(c->ta),
             op_name(c->tb), c->m, c->n, c->k, c->batch, type_name(c->ab), type_name(c->cd), c->alpha, c->beta,
             c->in_place ? " C==D" : "", epilogue_name(c->epi));
    if (aux_ld_set) snprintf(name + strlen(name), sizeof name - strlen(name), " aux ld %lld", (long long)aux_ld_set);
    bool ta = c->ta != CUBLAS_OP_N, tb = c->tb != CUBLAS_OP_N;
    int m = c->m, n = c->n, k = c->k, nb = c->batch;
    bool bias_in = epi_has(c->epi, 'b'), aux_out = epi_has(c->epi, 'o'), aux_in = epi_has(c->epi, 'd');
    bool bgrad = epi_has(c->epi, 'D') || epi_has(c->epi, 'A') || epi_has(c->epi, 'B');
    bool gelu_family = epi_has(c->epi, 'g') || aux_in;

    // Stored shapes, leading dimensions above the rows, and batch strides with gaps.
    int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    int64_t lda = a_rows + 3, ldb = b_rows + 2, ldc = m + 2, ldd = c->in_place ? ldc : m + 1;
    int64_t sa = lda * a_cols + 5, sb = ldb * b_cols + 3, sc = ldc * n + 4, sd = c->in_place ? sc : ldd * n + 2;
    int64_t aux_ld = aux_ld_set ? aux_ld_set : (m + 7) / 8 * 8 + 8, s_aux = aux_ld * n + 8;  // multiples of 8
    int bias_len = epi_has(c->epi, 'B') ? n : m;
    int64_t s_bias = (bias_len + 7) / 8 * 8 + 8;  // a gap, and 16-byte aligned vectors for every batch
    cudaDataType bias_t = c->bias_type >= 0 ? (cudaDataType)c->bias_type : c->cd;

    float* hA = host_random((size_t)sa * nb, c->ab, -1, 1);
    float* hB = host_random((size_t)sb * nb, c->ab, -1, 1);
    float* hC = host_random((size_t)sc * nb, c->cd, -1, 1);
    float* hBias =
        bias_in ? host_random((size_t)s_bias * nb, bias_t, -1, 1) : host_const((size_t)s_bias * nb, SENTINEL);
    float* hAux = aux_in ? host_random((size_t)s_aux * nb, c->cd, -3, 3) : host_const((size_t)s_aux * nb, SENTINEL);
    float* hD = host_const((size_t)sd * nb, SENTINEL);

    void* dA = upload(hA, (size_t)sa * nb, c->ab);
    void* dB = upload(hB, (size_t)sb * nb, c->ab);
    void* dC = upload(hC, (size_t)sc * nb, c->cd);
    void* dD = c->in_place ? dC : upload(hD, (size_t)sd * nb, c->cd);
    void* dBias = upload(hBias, (size_t)s_bias * nb, bias_t);
    void* dAux = upload(hAux, (size_t)s_aux * nb, c->cd);

    // Descriptors.
    cublasLtMatmulDesc_t desc;
    STATUS_IS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    int32_t opa = c->ta, opb = c->tb;
    uint32_t epi = c->epi;
    STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
              CUBLAS_STATUS_SUCCESS);
    STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
              CUBLAS_STATUS_SUCCESS);
    STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
              CUBLAS_STATUS_SUCCESS);
    if (bias_in || bgrad) {
        STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dBias, sizeof dBias),
                  CUBLAS_STATUS_SUCCESS);
        if (nb > 1)
            STATUS_IS(
                cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &s_bias, sizeof s_bias),
                CUBLAS_STATUS_SUCCESS);
        if (c->bias_type >= 0) {
            int32_t bt = c->bias_type;
            STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
                      CUBLAS_STATUS_SUCCESS);
        }
    }
    if (aux_out || aux_in) {
        STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &dAux, sizeof dAux),
                  CUBLAS_STATUS_SUCCESS);
        STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld),
                  CUBLAS_STATUS_SUCCESS);
        if (nb > 1)
            STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &s_aux,
                                                     sizeof s_aux),
                      CUBLAS_STATUS_SUCCESS);
    }
    cublasLtMatrixLayout_t la, lb, lc, ld;
    STATUS_IS(cublasLtMatrixLayoutCreate(&la, c->ab, a_rows, a_cols, lda), CUBLAS_STATUS_SUCCESS);
    STATUS_IS(cublasLtMatrixLayoutCreate(&lb, c->ab, b_rows, b_cols, ldb), CUBLAS_STATUS_SUCCESS);
    STATUS_IS(cublasLtMatrixLayoutCreate(&lc, c->cd, m, n, ldc), CUBLAS_STATUS_SUCCESS);
    STATUS_IS(cublasLtMatrixLayoutCreate(&ld, c->cd, m, n, ldd), CUBLAS_STATUS_SUCCESS);
    if (nb > 1) {
        cublasLtMatrixLayout_t ls[4] = {la, lb, lc, ld};
        int64_t strides[4] = {sa, sb, sc, sd};
        int32_t count = nb;
        for (int i = 0; i < 4; i++) {
            STATUS_IS(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
                      CUBLAS_STATUS_SUCCESS);
            STATUS_IS(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                                       sizeof strides[i]),
                      CUBLAS_STATUS_SUCCESS);
        }
    }
    cublasLtMatmulPreference_t pref;
    STATUS_IS(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    uint64_t ws = WORKSPACE_BYTES;
    STATUS_IS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
              CUBLAS_STATUS_SUCCESS);

    // Heuristic, then the product.
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, c->in_place ? ld : lc, ld, pref, 1, &heur, &found);
    bool refused = st != CUBLAS_STATUS_SUCCESS || found == 0;
    if (refusal == MUST_REFUSE) CHECK(refused, "%s: the heuristic should refuse, got %d algorithms", name, found);
    if (refusal != MUST_RUN && refused) {  // both entry points must refuse; nothing is computed
        cublasStatus_t st2 = cublasLtMatmul(g_lt, desc, &c->alpha, dA, la, dB, lb, &c->beta, dC, c->in_place ? ld : lc,
                                            dD, ld, NULL, g_workspace, WORKSPACE_BYTES, 0);
        CHECK((st == CUBLAS_STATUS_SUCCESS || is_refusal(st)) && is_refusal(st2),
              "%s: the heuristic answered %s, cublasLtMatmul %s (both should refuse)", name, cublasGetStatusName(st),
              cublasGetStatusName(st2));
        CUDA_OK(cudaDeviceSynchronize());
        if (getenv("TEST_VERBOSE")) printf("ok   %s: refused (%s)\n", name, cublasGetStatusName(st));
        free(hA), free(hB), free(hC), free(hBias), free(hAux), free(hD);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc), cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
        cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dBias), cudaFree(dAux);
        if (!c->in_place) cudaFree(dD);
        return;
    }
    CHECK(st == CUBLAS_STATUS_SUCCESS && found == 1, "%s: heuristic %s, %d algorithms", name, cublasGetStatusName(st),
          found);
    if (st == CUBLAS_STATUS_SUCCESS && found == 1) {
        CHECK(heur.workspaceSize <= WORKSPACE_BYTES, "%s: workspace %zu", name, heur.workspaceSize);
        st = cublasLtMatmul(g_lt, desc, &c->alpha, dA, la, dB, lb, &c->beta, dC, c->in_place ? ld : lc, dD, ld,
                            &heur.algo, g_workspace, WORKSPACE_BYTES, 0);
        CHECK(st == CUBLAS_STATUS_SUCCESS, "%s: cublasLtMatmul returned %s", name, cublasGetStatusName(st));
    }
    CUDA_OK(cudaDeviceSynchronize());

    // Reference, in double: t = alpha op(A) op(B) + beta C (+ bias), then the epilogue.
    size_t nd = (size_t)m * n * nb;
    float* wantD = host_alloc(nd);
    float* wantAux = host_alloc(nd);
    float* wantBgrad = host_alloc((size_t)bias_len * nb);
    double* extraD = (double*)calloc(nd ? nd : 1, sizeof(double));    // the library's intermediate roundings
    double* extraAux = (double*)calloc(nd ? nd : 1, sizeof(double));  // (bf16, epilogues past DEFAULT/RELU)
    bool rounds_between =
        c->cd == CUDA_R_16BF && c->epi != CUBLASLT_EPILOGUE_DEFAULT && c->epi != CUBLASLT_EPILOGUE_RELU;
    double gain = gelu_family ? 1.2 : 1.0, max_extra = 0.0;
    double mag = 0.0, maxD = 0.0;  // largest sum of |terms| (for atol) and largest |D|
    for (int b = 0; b < nb; b++) {
        const float *A = hA + b * sa, *B = hB + b * sb, *C = hC + b * sc, *bias = hBias + b * s_bias,
                    *aux = hAux + b * s_aux;
        for (int i = 0; i < m; i++) {
            double rowsum = 0.0;
            for (int j = 0; j < n; j++) {
                double dot = 0.0, abs_sum = 0.0;
                for (int p = 0; p < k; p++) {
                    double term = op_at(A, ta, lda, i, p) * op_at(B, tb, ldb, p, j);
                    dot += term;
                    abs_sum += fabs(term);
                }
                double t = c->alpha * dot + c->beta * C[i + j * ldc], t0 = t;
                abs_sum = fabs(c->alpha) * abs_sum + fabs(c->beta * C[i + j * ldc]);
                if (bias_in) t += bias[i], abs_sum += fabs(bias[i]);
                size_t o = ((size_t)b * n + j) * m + i;
                if (rounds_between) {  // as if t0 and t1 = t0 + bias were each rounded to bf16
                    extraAux[o] = (fabs(t0) + fabs(t)) / 256;
                    extraD[o] = gain * extraAux[o];
                    if (extraD[o] > max_extra) max_extra = extraD[o];
                }
                wantAux[o] = (float)t;  // aux = the activation's input, after the bias
                if (epi_has(c->epi, 'r')) t = t > 0 ? t : 0;
                if (epi_has(c->epi, 'g')) t = gelu_ref(t);
                if (aux_in) t *= gelu_grad_ref(aux[i + j * aux_ld]);
                wantD[o] = (float)t;
                rowsum += t;
                if (abs_sum > mag) mag = abs_sum;
                if (fabs(t) > maxD) maxD = fabs(t);
            }
            if (epi_has(c->epi, 'D')) wantBgrad[(size_t)b * bias_len + i] = (float)rowsum;  // sum_j D[i][j]
        }
        if (epi_has(c->epi, 'A'))  // sum_p op(A)[i][p]
            for (int i = 0; i < m; i++) {
                double s = 0.0;
                for (int p = 0; p < k; p++) s += op_at(A, ta, lda, i, p);
                wantBgrad[(size_t)b * bias_len + i] = (float)s;
            }
        if (epi_has(c->epi, 'B'))  // sum_p op(B)[p][j]
            for (int j = 0; j < n; j++) {
                double s = 0.0;
                for (int p = 0; p < k; p++) s += op_at(B, tb, ldb, p, j);
                wantBgrad[(size_t)b * bias_len + j] = (float)s;
            }
    }

    // Compare.
    float atol = (float)((k + 8) * U32 * gain * mag);
    float rtol = c->cd == CUDA_R_16BF ? 1.0f / 256 : (gelu_family ? 1e-5f : 1e-6f);
    char what[220];
    float* got = host_alloc((size_t)sd * nb);
    float* gotc = host_alloc(nd);
    download(dD, (size_t)sd * nb, c->cd, got);
    compact(got, m, n, ldd, sd, nb, gotc);
    snprintf(what, sizeof what, "%s: D", name);
    check_close_each(what, gotc, wantD, extraD, nd, atol, rtol);
    if (!c->in_place) {
        int changed = changed_padding(got, (size_t)sd * nb, m, n, ldd, sd, nb);
        CHECK(changed == 0, "%s: %d elements of D outside the matrices were written", name, changed);
    }
    if (aux_out) {  // the GELU input, stored in D's type with ld aux_ld
        float* gaux = host_alloc((size_t)s_aux * nb);
        download(dAux, (size_t)s_aux * nb, c->cd, gaux);
        compact(gaux, m, n, aux_ld, s_aux, nb, gotc);
        snprintf(what, sizeof what, "%s: aux", name);
        check_close_each(what, gotc, wantAux, extraAux, nd, (float)((k + 8) * U32 * mag),
                         c->cd == CUDA_R_16BF ? 1.0f / 256 : 1e-6f);
        int changed = changed_padding(gaux, (size_t)s_aux * nb, m, n, aux_ld, s_aux, nb);
        CHECK(changed == 0, "%s: %d elements of aux outside the matrices were written", name, changed);
        free(gaux);
    }
    if (bgrad) {  // the bias gradient, in D's type
        float* gb = host_alloc((size_t)s_bias * nb);
        download(dBias, (size_t)s_bias * nb, c->cd, gb);
        compact(gb, bias_len, 1, bias_len, s_bias, nb, gotc);
        float btol_a, btol_r = c->cd == CUDA_R_16BF ? 1.0f / 256 : 1e-6f;
        if (epi_has(c->epi, 'D'))  // n terms, each within D's tolerance (the GPU may sum rounded D values)
            btol_a = (float)(n * (atol + 2 * rtol * maxD + max_extra) + (n + 2) * U32 * n * maxD);
        else  // k terms of |x| <= 1, summed in fp32 in any order
            btol_a = (float)((k + 2) * U32 * k);
        snprintf(what, sizeof what, "%s: bias gradient", name);
        check_close(what, gotc, wantBgrad, (size_t)bias_len * nb, btol_a, btol_r);
        int changed = changed_padding(gb, (size_t)s_bias * nb, bias_len, 1, bias_len, s_bias, nb);
        CHECK(changed == 0, "%s: %d bias-gradient elements outside the vectors were written", name, changed);
        free(gb);
    }

    free(got), free(gotc), free(wantD), free(wantAux), free(wantBgrad), free(extraD), free(extraAux);
    free(hA), free(hB), free(hC), free(hBias), free(hAux), free(hD);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dBias), cudaFree(dAux);
    if (!c->in_place) cudaFree(dD);
}

static void run_lt_case(const LtCase* c) { run_lt_case_with(c, 0, layout_may_be_refused(c) ? MAY_REFUSE : MUST_RUN); }

// ----------------------------------------------------------------------------
// The classic API: cublasGemmEx, cublasGemmStridedBatchedEx, cublasSgemm, cublasSgemmStridedBatched.

typedef enum { GEMM_EX, GEMM_STRIDED_EX, SGEMM, SGEMM_STRIDED } ClassicApi;

static void run_classic_case(ClassicApi api, cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k,
                             int batch, cudaDataType ab, cudaDataType ct, float alpha, float beta) {
    static const char* api_names[] = {"cublasGemmEx", "cublasGemmStridedBatchedEx", "cublasSgemm",
                                      "cublasSgemmStridedBatched"};
    char name[160];
    snprintf(name, sizeof name, "%s %s%s %dx%dx%d batch %d %s->%s alpha %g beta %g", api_names[api], op_name(opa),
             op_name(opb), m, n, k, batch, type_name(ab), type_name(ct), alpha, beta);
    bool ta = opa != CUBLAS_OP_N, tb = opb != CUBLAS_OP_N;
    int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    int lda = a_rows + 1, ldb = b_rows + 4, ldc = m + 3;
    long long sa = (long long)lda * a_cols + 2, sb = (long long)ldb * b_cols + 1, sc = (long long)ldc * n + 3;
    float* hA = host_random((size_t)sa * batch, ab, -1, 1);
    float* hB = host_random((size_t)sb * batch, ab, -1, 1);
    float* hC = host_random((size_t)sc * batch, ct, -1, 1);
    // beta = 0: "C does not have to be a valid input", so it holds NaN, which must not leak through.
    if (beta == 0.0f)
        for (size_t i = 0; i < (size_t)sc * batch; i++) hC[i] = NAN;
    for (int b = 0; b < batch; b++)  // padding rows and gaps hold the sentinel
        for (long long e = 0; e < sc; e++)
            if (e % ldc >= m || e / ldc >= n) hC[b * sc + e] = SENTINEL;
    void* dA = upload(hA, (size_t)sa * batch, ab);
    void* dB = upload(hB, (size_t)sb * batch, ab);
    void* dC = upload(hC, (size_t)sc * batch, ct);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    switch (api) {
        case GEMM_EX:
            st = cublasGemmEx(g_blas, opa, opb, m, n, k, &alpha, dA, ab, lda, dB, ab, ldb, &beta, dC, ct, ldc,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            break;
        case GEMM_STRIDED_EX:
            st = cublasGemmStridedBatchedEx(g_blas, opa, opb, m, n, k, &alpha, dA, ab, lda, sa, dB, ab, ldb, sb, &beta,
                                            dC, ct, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            break;
        case SGEMM:
            st = cublasSgemm(g_blas, opa, opb, m, n, k, &alpha, (const float*)dA, lda, (const float*)dB, ldb, &beta,
                             (float*)dC, ldc);
            break;
        case SGEMM_STRIDED:
            st = cublasSgemmStridedBatched(g_blas, opa, opb, m, n, k, &alpha, (const float*)dA, lda, sa,
                                           (const float*)dB, ldb, sb, &beta, (float*)dC, ldc, sc, batch);
            break;
    }
    CHECK(st == CUBLAS_STATUS_SUCCESS, "%s returned %s", name, cublasGetStatusName(st));
    CUDA_OK(cudaDeviceSynchronize());

    size_t nc = (size_t)m * n * batch;
    float* want = host_alloc(nc);
    double mag = 0.0;
    for (int b = 0; b < batch; b++) {
        const float *A = hA + b * sa, *B = hB + b * sb, *C = hC + b * sc;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double dot = 0.0, abs_sum = 0.0;
                for (int p = 0; p < k; p++) {
                    double term = op_at(A, ta, lda, i, p) * op_at(B, tb, ldb, p, j);
                    dot += term;
                    abs_sum += fabs(term);
                }
                double cterm = beta == 0.0f ? 0.0 : (double)beta * C[i + j * ldc];
                want[((size_t)b * n + j) * m + i] = (float)(alpha * dot + cterm);
                abs_sum = fabs(alpha) * abs_sum + fabs(cterm);
                if (abs_sum > mag) mag = abs_sum;
            }
    }
    float* got = host_alloc((size_t)sc * batch);
    float* gotc = host_alloc(nc);
    download(dC, (size_t)sc * batch, ct, got);
    compact(got, m, n, ldc, sc, batch, gotc);
    check_close(name, gotc, want, nc, (float)((k + 8) * U32 * mag), ct == CUDA_R_16BF ? 1.0f / 256 : 1e-6f);
    int changed = changed_padding(got, (size_t)sc * batch, m, n, ldc, sc, batch);
    CHECK(changed == 0, "%s: %d elements of C outside the matrices were written", name, changed);
    free(want), free(got), free(gotc), free(hA), free(hB), free(hC);
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
}

// ----------------------------------------------------------------------------
// The GELU formula itself: D = GELU(x) for x from -4 to 4 (fp32, m = 161, n = k = 1), and
// D = GELU'(aux) * 1 (DGELU, k = 2). The tolerance, 1e-4, is below the gap between the tanh
// approximation and the erf GELU (up to 4.7e-4 for GELU near |x| = 2.7, 8.7e-4 for GELU' near
// |x| = 2), so this tells the two apart; an accurate fp32 tanh is off by ~1e-7.

static void test_gelu_formula(void) {
    const int m = 161;
    const int64_t aux_ld = 168;
    float* x = host_alloc(m);
    for (int i = 0; i < m; i++) x[i] = -4.0f + 0.05f * i;
    double gap = 0.0;  // how far the erf GELU is from the tanh one on these points
    for (int i = 0; i < m; i++) gap = fmax(gap, fabs(gelu_erf_ref(x[i]) - gelu_ref(x[i])));
    CHECK(gap > 3e-4, "the GELU formula check cannot tell erf from tanh (gap %g)", gap);

    for (int pass = 0; pass < 2; pass++) {  // pass 0: GELU, pass 1: DGELU
        bool dgelu = pass == 1;
        int k = dgelu ? 2 : 1;
        float* hA = host_alloc((size_t)m * k);  // GELU: A = x; DGELU: A = [0.5 0.5] per row
        for (int i = 0; i < m; i++)
            for (int p = 0; p < k; p++) hA[i + p * m] = dgelu ? 0.5f : x[i];
        float* hB = host_const(k, 1.0f);
        float* hAux = host_const(aux_ld, SENTINEL);
        for (int i = 0; i < m; i++) hAux[i] = x[i];
        void* dA = upload(hA, (size_t)m * k, CUDA_R_32F);
        void* dB = upload(hB, k, CUDA_R_32F);
        void* dAux = upload(hAux, aux_ld, CUDA_R_32F);
        void* dD = upload(hAux, m, CUDA_R_32F);
        cublasLtMatmulDesc_t desc;
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        uint32_t epi = dgelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_GELU;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (dgelu) {
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &dAux, sizeof dAux);
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
        }
        cublasLtMatrixLayout_t la, lb, ld;
        cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m);
        cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, 1, k);
        cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, 1, m);
        float alpha = 1.0f, beta = 0.0f;
        // algo NULL: cublasLtMatmul runs the heuristic itself with default preferences.
        STATUS_IS(cublasLtMatmul(g_lt, desc, &alpha, dA, la, dB, lb, &beta, dD, ld, dD, ld, NULL, g_workspace,
                                 WORKSPACE_BYTES, 0),
                  CUBLAS_STATUS_SUCCESS);
        CUDA_OK(cudaDeviceSynchronize());
        float* got = host_alloc(m);
        float* want = host_alloc(m);
        download(dD, m, CUDA_R_32F, got);
        for (int i = 0; i < m; i++) want[i] = (float)(dgelu ? gelu_grad_ref(x[i]) : gelu_ref(x[i]));
        check_close(dgelu ? "DGELU formula (tanh approximation, derivative)" : "GELU formula (tanh approximation)", got,
                    want, m, 1e-4f, 0.0f);
        free(got), free(want), free(hA), free(hB), free(hAux);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
        cudaFree(dA), cudaFree(dB), cudaFree(dAux), cudaFree(dD);
    }
    free(x);
}

// ----------------------------------------------------------------------------
// The GELU epilogues' arithmetic in bf16, pinned on the trainer's layout (matmul_forward: A transposed,
// bf16 in and out, alpha 1, beta 0). A and B hold multiples of 1/16 in [-7/16, 7/16] and the bias multiples
// of 1/128 in [-1, 1], so alpha AB + bias is exact in fp32 in any summation order: t is known exactly, and
// only the epilogue's own arithmetic is seen. What cuBLASLt 13.0 does on an H100 (2026-11-24; 6.3M
// elements of a 3072 x 2048 x 768 product and this test's shape), which this test and cpu/cublas.cpp follow:
//   GELU_AUX_BIAS  aux = bf16(t) exactly; D = bf16(gelu(t)) from the fp32 t (not from the rounded aux), with
//                  the tanh GELU: within half a bf16 ulp + 3.4e-6 of the exact tanh GELU (its fp32 GELU is up
//                  to 5.2e-6 off with an fp32 D, so 95.5% of the elements equal the correctly rounded value);
//                  nearer tanh than erf at every point where the two differ by more than 2 ulps.
//   DGELU          the kernel's choice: at 3072 x 128 x 768 and 3072 x 2048 x 768, D = bf16(t gelu'(aux)) from
//                  the fp32 t (99% of the elements whose t is not a bf16 value and |D| >= 1e-2 equal it, 62%
//                  equal bf16(bf16(t) gelu'(aux))); at this test's 512 x 128 x 256 the other form (t rounded
//                  first), as DGELU_BGRAD. Within 2 ulps, 1e-4 in the tail, either way.
//   DGELU_BGRAD    D = bf16(bf16(t) gelu'(aux)): t is rounded to bf16 first (99.5% of those elements equal
//                  it; 61% equal the DGELU form); the bias gradient is D's row sums, rounded to bf16.
// (An earlier reading, GELU_AUX_BIAS 0.7890625 where the tanh GELU of the aux value 0.96875 is 0.8075, came
// from a check with alpha 0.75 and beta -0.5; with alpha 1 and beta 0 the product has no such error.)

static double bf16_ulp(double v) { return ldexp(1.0, ilogb(fabs(v) > 1e-30 ? v : 1e-30) - 7); }
static float bf16_of(double v) { return round_to((float)v, CUDA_R_16BF); }

// epi_desc: the descriptor of the two tests below: D (m x n) = A^T B in bf16 with fp32 compute (A transposed),
// epilogue epi, a bf16 bias type, the bias pointer when bias != NULL and the aux pointer (ld m) when aux != NULL
static cublasLtMatmulDesc_t epi_desc(uint32_t epi, void* bias, void* aux, int64_t m) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t opt = CUBLAS_OP_T;
    cudaDataType bt = CUDA_R_16BF;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof opt);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
    if (bias) cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (aux) {
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &m, sizeof m);
    }
    return desc;
}

static void test_gelu_epilogues_bf16(void) {
    const int m = 512, n = 128, k = 256;  // D (m x n) = A^T B, A stored (k x m)
    const size_t nd = (size_t)m * n;
    float* hA = host_alloc((size_t)k * m);
    float* hB = host_alloc((size_t)k * n);
    float* hbias = host_alloc(m);
    float* haux = host_alloc(nd);
    for (size_t i = 0; i < (size_t)k * m; i++) hA[i] = floorf(test_uniform(-7.f, 8.f)) / 16;
    for (size_t i = 0; i < (size_t)k * n; i++) hB[i] = floorf(test_uniform(-7.f, 8.f)) / 16;
    for (int i = 0; i < m; i++) hbias[i] = floorf(test_uniform(-128.f, 129.f)) / 128;
    for (size_t i = 0; i < nd; i++) haux[i] = floorf(test_uniform(-640.f, 641.f)) / 128;  // DGELU's GELU input
    double* t = (double*)malloc(nd * sizeof(double));  // the exact product (bias added for the GELU epilogue)
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double a = 0;
            for (int p = 0; p < k; p++) a += (double)hA[(size_t)i * k + p] * hB[(size_t)j * k + p];
            t[(size_t)j * m + i] = a;
        }
    void* dA = upload(hA, (size_t)k * m, CUDA_R_16BF);
    void* dB = upload(hB, (size_t)k * n, CUDA_R_16BF);
    void* dD = upload(haux, nd, CUDA_R_16BF);
    float* got = host_alloc(nd);
    float* gaux = host_alloc(nd);
    const uint32_t epis[3] = {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD};
    for (int e = 0; e < 3; e++) {
        uint32_t epi = epis[e];
        bool fwd = epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bgrad = epi == CUBLASLT_EPILOGUE_DGELU_BGRAD;
        const char* name = epilogue_name((cublasLtEpilogue_t)epi);
        float* fill = host_const(nd, fwd ? SENTINEL : 0.f);        // the aux output's, the bias gradient's
        void* dbias = upload(fwd ? hbias : fill, m, CUDA_R_16BF);  // bf16: D's type
        void* daux = upload(fwd ? fill : haux, nd, CUDA_R_16BF);
        // (the GPU refuses DGELU, which takes no bias, with a bias pointer set)
        cublasLtMatmulDesc_t desc = epi_desc(epi, epi != CUBLASLT_EPILOGUE_DGELU ? dbias : NULL, daux, m);
        cublasLtMatrixLayout_t la, lb, ld;
        cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, m, k);
        cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k);
        cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m);
        float alpha = 1.0f, beta = 0.0f;
        STATUS_IS(cublasLtMatmul(g_lt, desc, &alpha, dA, la, dB, lb, &beta, dD, ld, dD, ld, NULL, g_workspace,
                                 WORKSPACE_BYTES, 0),
                  CUBLAS_STATUS_SUCCESS);
        CUDA_OK(cudaDeviceSynchronize());
        download(dD, nd, CUDA_R_16BF, got);
        download(daux, nd, CUDA_R_16BF, gaux);
        // far: GELU over half a bf16 ulp + 6e-6 off, DGELU over 2 ulps and 1e-4 off
        // form / other: elements of the telling kind (t not a bf16 value, |ref| >= 1e-2) that equal the
        // documented form, or the other one (GELU: from the rounded t; DGELU: the other DGELU's form)
        long far = 0, aux_off = 0, telling = 0, form = 0, other = 0, apart = 0, nearer_tanh = 0;
        double worst = 0;
        for (size_t i = 0; i < nd; i++) {
            double ti = t[i] + (fwd ? hbias[i % m] : 0.0), tr = bf16_of(ti);
            double ref = fwd ? gelu_ref(ti) : ti * gelu_grad_ref(gaux[i]);
            double doc = fwd ? ref : (bgrad ? tr : ti) * gelu_grad_ref(gaux[i]);
            double alt = fwd ? gelu_ref(tr) : (bgrad ? ti : tr) * gelu_grad_ref(gaux[i]);
            double dev = fabs(got[i] - doc), ulp = fmax(bf16_ulp(doc), bf16_ulp(got[i]));
            double lim = fwd ? 0.5 * ulp + 6e-6 : fmax(2.0 * ulp, 1e-4);
            if (!(dev <= lim)) far++;
            if (dev / lim > worst) worst = dev / lim;
            if (fwd && gaux[i] != (float)tr) aux_off++;
            if (fabs(ref) >= 1e-2 && tr != ti) {
                telling++;
                form += got[i] == bf16_of(doc);
                other += got[i] == bf16_of(alt);
            }
            if (fwd && fabs(gelu_erf_ref(ti) - ref) > 2 * bf16_ulp(ref)) {
                apart++;
                nearer_tanh += fabs(got[i] - ref) < fabs(got[i] - gelu_erf_ref(ti));
            }
        }
        CHECK(far == 0, "%s bf16: %ld of %zu elements off the documented form (worst %.2f x the tolerance)", name, far,
              nd, worst);
        if (epi == CUBLASLT_EPILOGUE_DGELU) {  // the kernel's choice: either form, consistently
            CHECK(telling > (long)nd / 8 && fmax(form, other) >= 0.95 * telling && fmin(form, other) < 0.8 * telling,
                  "DGELU bf16: %ld of %ld telling elements equal bf16(t gelu'), %ld bf16(bf16(t) gelu'): want one "
                  "form for >= 95%%",
                  form, telling, other);
        } else {
            CHECK(telling > (long)nd / 8 && form >= 0.95 * telling && other < 0.8 * telling,
                  "%s bf16: %ld of %ld telling elements equal the documented form (want >= 95%%), %ld the other "
                  "(want < 80%%)",
                  name, form, telling, other);
        }
        if (fwd) {
            CHECK(aux_off == 0, "GELU_AUX_BIAS bf16: aux = bf16(t) exactly (%ld off)", aux_off);
            CHECK(apart > 200 && nearer_tanh == apart,
                  "GELU_AUX_BIAS bf16: nearer the tanh GELU than the erf one at %ld of %ld points where they differ",
                  nearer_tanh, apart);
        }
        if (bgrad) {  // the bias gradient: D's row sums, rounded to bf16
            float* gb = host_alloc(m);
            download(dbias, m, CUDA_R_16BF, gb);
            long off = 0;
            for (int i = 0; i < m; i++) {
                double s = 0, mag = 0;
                for (int j = 0; j < n; j++) s += got[(size_t)j * m + i], mag += fabs(got[(size_t)j * m + i]);
                off +=
                    !(fabs(gb[i] - s) <= bf16_ulp(s) + mag / 512);  // the sum's rounding, and D's if summed unrounded
            }
            CHECK(off == 0, "DGELU_BGRAD bf16: bias gradient = the row sums of D (%d rows, %ld off)", m, off);
            free(gb);
        }
        printf("%s bf16: worst %.2f x the tolerance; %ld of %ld telling elements the documented form, %ld the other\n",
               name, worst, form, telling, other);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
        cudaFree(dbias), cudaFree(daux), free(fill);
    }
    free(hA), free(hB), free(hbias), free(haux), free(t), free(got), free(gaux);
    cudaFree(dA), cudaFree(dB), cudaFree(dD);
}

// ----------------------------------------------------------------------------
// bf16 output rounding: round to nearest, ties to even. Row i of D (4 x 1) is x_i + y_i (A = [x y],
// B = [1 1], k = 2): sums that fp32 holds exactly and that fall on or near a bf16 rounding point,
// so the bf16 result is known exactly (checked with zero tolerance), through cuBLASLt and cublasGemmEx.
//   1 + 2^-8          tie between 1 and 1 + 2^-7         -> 1          (even; half-away gives 1 + 2^-7)
//   1 + 2^-7 + 2^-8   tie between 1 + 2^-7 and 1 + 2^-6  -> 1 + 2^-6   (even; truncation gives 1 + 2^-7)
//   -(1 + 2^-8)       the negative tie                   -> -1
//   1 + 1.5 * 2^-8    above the midpoint                 -> 1 + 2^-7   (truncation gives 1)

static void test_bf16_rounding(void) {
    const int m = 4, k = 2;
    const float h8 = 1.0f / 256;
    float hA[m * k] = {1.0f,  1.0f + 2 * h8,
                       -1.0f, 1.0f,  // column 0: x
                       h8,    h8,
                       -h8,   1.5f * h8};  // column 1: y
    float want[m] = {1.0f, 1.0f + 4 * h8, -1.0f, 1.0f + 2 * h8};
    float ones[k] = {1.0f, 1.0f};
    for (int i = 0; i < m * k; i++) CHECK(round_to(hA[i], CUDA_R_16BF) == hA[i], "input %d is not a bf16 value", i);
    void* dA = upload(hA, m * k, CUDA_R_16BF);
    void* dB = upload(ones, k, CUDA_R_16BF);
    void* dD = upload(want, m, CUDA_R_16BF);
    float alpha = 1.0f, beta = 0.0f, got[m];

    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, 1, k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, 1, m);
    STATUS_IS(cublasLtMatmul(g_lt, desc, &alpha, dA, la, dB, lb, &beta, dD, ld, dD, ld, NULL, g_workspace,
                             WORKSPACE_BYTES, 0),
              CUBLAS_STATUS_SUCCESS);
    CUDA_OK(cudaDeviceSynchronize());
    download(dD, m, CUDA_R_16BF, got);
    check_close("cublasLtMatmul bf16 output rounds to nearest even", got, want, m, 0.0f, 0.0f);

    STATUS_IS(cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, m, 1, k, &alpha, dA, CUDA_R_16BF, m, dB, CUDA_R_16BF, k,
                           &beta, dD, CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    CUDA_OK(cudaDeviceSynchronize());
    download(dD, m, CUDA_R_16BF, got);
    check_close("cublasGemmEx bf16 output rounds to nearest even", got, want, m, 0.0f, 0.0f);

    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(dA), cudaFree(dB), cudaFree(dD);
}

// ----------------------------------------------------------------------------
// Refusals. The heuristic says "no kernel" either with an error status or with success and no
// algorithm; NVIDIA documents INVALID_VALUE ("parameters are in conflict or in an impossible
// configuration") and NOT_SUPPORTED ("current implementation ... doesn't support configured
// operation") as the errors, without saying which one each mistake gets, so either passes here.
// cublasLtMatmul with algo = NULL runs the same checks and must fail too.

typedef struct {
    int m, n, k;
    int64_t lda;      // leading dimension of A (N: m x k)
    int32_t order;    // memory order of A
    int32_t batch_b;  // batch count of B (others 1)
    uint32_t epi;
    int64_t aux_ld;  // set the aux pointer and this aux ld (0: neither)
} BadCase;

static void expect_refused(const char* what, const BadCase* bc) {
    int m = bc->m, n = bc->n, k = bc->k;
    size_t big = 64 * 1024;  // floats: more than any of these matrices, whatever the refused layout says
    float* zeros = host_alloc(big);
    void* dA = upload(zeros, big, CUDA_R_32F);
    void* dB = upload(zeros, big, CUDA_R_32F);
    void* dD = upload(zeros, big, CUDA_R_32F);
    void* dX = upload(zeros, big, CUDA_R_32F);
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &bc->epi, sizeof bc->epi);
    if (bc->aux_ld) {
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &dX, sizeof dX);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &bc->aux_ld, sizeof bc->aux_ld);
    }
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, bc->lda);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
    cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_ORDER, &bc->order, sizeof bc->order);
    if (bc->batch_b != 1) {
        int64_t stride = (int64_t)k * n;
        cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc->batch_b, sizeof bc->batch_b);
        cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    }
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t heur;
    int found = -1;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, ld, ld, pref, 1, &heur, &found);
    CHECK(st == CUBLAS_STATUS_SUCCESS ? found == 0 : is_refusal(st),
          "%s: the heuristic should refuse, got %s with %d algorithms", what, cublasGetStatusName(st), found);
    float alpha = 1.0f, beta = 0.0f;
    st = cublasLtMatmul(g_lt, desc, &alpha, dA, la, dB, lb, &beta, dD, ld, dD, ld, NULL, g_workspace, WORKSPACE_BYTES,
                        0);
    CHECK(is_refusal(st), "%s: cublasLtMatmul should refuse, got %s", what, cublasGetStatusName(st));
    CUDA_OK(cudaDeviceSynchronize());
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(dA), cudaFree(dB), cudaFree(dD), cudaFree(dX);
    free(zeros);
}

// A bias pointer set for an epilogue that takes no bias (DEFAULT, GELU_AUX, DGELU): cuBLASLt 13.0 on an H100
// (2026-11-24, bf16 64 x 48 x 32) returns an algorithm from the heuristic but refuses the matmul with
// INVALID_VALUE (a bias data type set alone is accepted). blas_matmul sets the pointer only with a bias epilogue.
static void test_bias_pointer_refused(void) {
    const int m = 64, n = 48, k = 32;
    float* zeros = host_alloc((size_t)m * n);
    void* dA = upload(zeros, (size_t)k * m, CUDA_R_16BF);
    void* dB = upload(zeros, (size_t)k * n, CUDA_R_16BF);
    void* dD = upload(zeros, (size_t)m * n, CUDA_R_16BF);
    void* dX = upload(zeros, (size_t)m * n, CUDA_R_16BF);
    void* dbias = upload(zeros, m, CUDA_R_16BF);
    const uint32_t epis[3] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_DGELU};
    for (int e = 0; e < 3; e++)
        for (int with_ptr = 0; with_ptr < 2; with_ptr++) {
            cublasLtMatmulDesc_t desc =
                epi_desc(epis[e], with_ptr ? dbias : NULL, epis[e] != CUBLASLT_EPILOGUE_DEFAULT ? dX : NULL, m);
            cublasLtMatrixLayout_t la, lb, ld;
            cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, m, k);
            cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k);
            cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m);
            cublasLtMatmulPreference_t pref;
            cublasLtMatmulPreferenceCreate(&pref);
            cublasLtMatmulHeuristicResult_t heur;
            int found = 0;
            const char* name = epilogue_name((cublasLtEpilogue_t)epis[e]);
            cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, ld, ld, pref, 1, &heur, &found);
            CHECK(st == CUBLAS_STATUS_SUCCESS && found == 1,
                  "%s, bias type set%s: the heuristic returned %s, %d algorithms", name,
                  with_ptr ? " and a bias pointer" : "", cublasGetStatusName(st), found);
            float alpha = 1.0f, beta = 0.0f;
            st = cublasLtMatmul(g_lt, desc, &alpha, dA, la, dB, lb, &beta, dD, ld, dD, ld, NULL, g_workspace,
                                WORKSPACE_BYTES, 0);
            cublasStatus_t want = with_ptr ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
            CHECK(st == want, "%s, bias type set%s: cublasLtMatmul returned %s, want %s", name,
                  with_ptr ? " and a bias pointer" : "", cublasGetStatusName(st), cublasGetStatusName(want));
            CUDA_OK(cudaDeviceSynchronize());
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
            cublasLtMatmulDescDestroy(desc);
        }
    free(zeros);
    cudaFree(dA), cudaFree(dB), cudaFree(dD), cudaFree(dX), cudaFree(dbias);
}

// The heuristic's offers for a weight gradient's shape (deep k, small m n: where the GPU offers split-K), as the
// trainer asks (kernels.cuh, blas_heuristic: our workspace): each offer's configuration reads back with the sizes
// cublasLt.h documents (blas_algo_config), gives the product within the tolerance of fp32 accumulation, and gives
// the same bits when run again.
static void test_algorithm_offers(void) {
    const int m = 64, n = 48, k = 4096;  // D (m x n, fp32) = A (m x k) . B^T, B (n x k): the NT of a weight gradient
    float* a = host_random((size_t)m * k, CUDA_R_16BF, -1.f, 1.f);
    float* b = host_random((size_t)n * k, CUDA_R_16BF, -1.f, 1.f);
    void* dA = upload(a, (size_t)m * k, CUDA_R_16BF);
    void* dB = upload(b, (size_t)n * k, CUDA_R_16BF);
    float* zeros = host_alloc((size_t)m * n);
    void* dD = upload(zeros, (size_t)m * n, CUDA_R_32F);
    float *want = host_alloc((size_t)m * n), *got = host_alloc((size_t)m * n), *again = host_alloc((size_t)m * n);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double acc = 0;
            for (int p = 0; p < k; p++) acc += (double)a[i + (size_t)p * m] * b[j + (size_t)p * n];
            want[i + (size_t)j * m] = (float)acc;
        }
    cublasLtMatmulDesc_t desc;
    STATUS_IS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    cublasOperation_t opn = CUBLAS_OP_N, opt = CUBLAS_OP_T;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opn, sizeof opn);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opt, sizeof opt);
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, k, n);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t ws = WORKSPACE_BYTES;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t heur[16];
    int found = 0;
    STATUS_IS(cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, ld, ld, pref, 16, heur, &found),
              CUBLAS_STATUS_SUCCESS);
    CHECK(found >= 1 && found <= 16, "the heuristic offered %d algorithms for %d x %d x %d", found, m, n, k);
    int split_offers = 0;
    for (int o = 0; o < found; o++) {
        for (int f = 0; f < BLAS_ALGO_FIELDS; f++) {  // 4 bytes each, the inner and cluster shapes 2 (cublasLt.h)
            size_t size = 0, want_size = f >= 7 ? 2 : 4;
            STATUS_IS(cublasLtMatmulAlgoConfigGetAttribute(&heur[o].algo, blas_algo_attrs[f], NULL, 0, &size),
                      CUBLAS_STATUS_SUCCESS);
            CHECK(size == want_size, "offer %d: attribute %s takes %zu bytes, cublasLt.h says %zu", o,
                  blas_algo_fields[f], size, want_size);
        }
        int cfg[BLAS_ALGO_FIELDS];
        blas_algo_config(&heur[o].algo, cfg);
        CHECK(cfg[3] >= 1, "offer %d: split-K %d", o, cfg[3]);
        split_offers += cfg[3] > 1;
        CHECK(heur[o].workspaceSize <= WORKSPACE_BYTES, "offer %d needs %zu bytes of workspace", o,
              heur[o].workspaceSize);
        float alpha = 1.f, beta = 0.f;
        for (int run = 0; run < 2; run++) {
            STATUS_IS(cublasLtMatmul(g_lt, desc, &alpha, dA, la, dB, lb, &beta, dD, ld, dD, ld, &heur[o].algo,
                                     g_workspace, WORKSPACE_BYTES, 0),
                      CUBLAS_STATUS_SUCCESS);
            CUDA_OK(cudaDeviceSynchronize());
            download(dD, (size_t)m * n, CUDA_R_32F, run ? again : got);
        }
        char what[96];
        snprintf(what, sizeof what, "offer %d (split-K %d, reduction %d)", o, cfg[3], cfg[4]);
        check_close(what, got, want, (size_t)m * n, 2e-3f, 1e-4f);
        CHECK(!memcmp(got, again, (size_t)m * n * sizeof(float)), "%s: another result when run again", what);
    }
    printf("algorithm offers for %d x %d x %d (NT, bf16 to fp32): %d, %d of them split-K\n", m, n, k, found,
           split_offers);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(dA), cudaFree(dB), cudaFree(dD);
    free(a), free(b), free(zeros), free(want), free(got), free(again);
}

static void test_refusals(void) {
    // A valid base problem: 17 x 5 x 33, fp32, COL order, DEFAULT epilogue.
    BadCase base = {17, 5, 33, 17, CUBLASLT_ORDER_COL, 1, CUBLASLT_EPILOGUE_DEFAULT, 0};
    BadCase bc;
    bc = base, bc.lda = 16;  // ld < rows: "must be ... greater or equal to CUBLASLT_MATRIX_LAYOUT_ROWS"
    expect_refused("lda (16) < rows (17)", &bc);
    bc = base, bc.epi = CUBLASLT_EPILOGUE_GELU_AUX, bc.aux_ld = 16;  // "no less than the number of rows"
    expect_refused("GELU_AUX with aux ld 16 < rows 17", &bc);
    bc = base, bc.order = CUBLASLT_ORDER_COL32, bc.lda = 32 * 17;  // COL32 is for int8 IMMA kernels
    expect_refused("A in CUBLASLT_ORDER_COL32 with fp32 data", &bc);
    bc = base, bc.batch_b = 2;  // "batch counts mismatch: ... must be equal to all other matrices"
    expect_refused("batch count of B (2) differs from the others (1)", &bc);

    // Attribute sizes: "CUBLAS_STATUS_INVALID_VALUE if buf is NULL or sizeInBytes doesn't match
    // size of internal storage for selected attribute" (AUX_LD is an int64_t).
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int32_t ld32 = 24;
    STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld32, sizeof ld32),
              CUBLAS_STATUS_INVALID_VALUE);
    int64_t epi64 = CUBLASLT_EPILOGUE_GELU;  // EPILOGUE is a uint32_t
    STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi64, sizeof epi64),
              CUBLAS_STATUS_INVALID_VALUE);
    STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, NULL, 4),
              CUBLAS_STATUS_INVALID_VALUE);
    // GetAttribute with sizeInBytes 0 reports the size needed.
    size_t need = 0;
    STATUS_IS(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, NULL, 0, &need),
              CUBLAS_STATUS_SUCCESS);
    CHECK(need == sizeof(int64_t), "size of EPILOGUE_AUX_LD reported as %zu", need);
    uint32_t epi = CUBLASLT_EPILOGUE_GELU_BIAS, epi_back = 0;
    size_t written = 0;
    STATUS_IS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
              CUBLAS_STATUS_SUCCESS);
    STATUS_IS(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi_back, sizeof epi_back, &written),
              CUBLAS_STATUS_SUCCESS);
    CHECK(epi_back == epi && written == sizeof epi, "epilogue read back as %u (%zu bytes)", epi_back, written);

    // The heuristic with requestedAlgoCount <= 0: "CUBLAS_STATUS_INVALID_VALUE".
    cublasLtMatrixLayout_t l;
    cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 8, 8, 8);
    uint64_t rows = 0;
    STATUS_IS(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows, &written),
              CUBLAS_STATUS_SUCCESS);
    CHECK(rows == 8, "layout rows read back as %llu", (unsigned long long)rows);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    STATUS_IS(cublasLtMatmulAlgoGetHeuristic(g_lt, desc, l, l, l, l, pref, 0, &heur, &found),
              CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(desc);

    // A pointer less aligned than the kernel the heuristic chose: with the default preference
    // (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES = 256) and leading dimensions of 32 bytes, the
    // kernel uses 16-byte loads, and an A that starts one bf16 element in is refused (the real
    // library answers CUBLAS_STATUS_NOT_SUPPORTED, pytorch/pytorch#92201).
    {
        const int m = 16, n = 16, k = 16;
        float* z = host_alloc(4096);
        void* dA = upload(z, 4096, CUDA_R_16BF);
        void* dB = upload(z, 4096, CUDA_R_16BF);
        void* dD = upload(z, 4096, CUDA_R_16BF);
        cublasLtMatmulDesc_t d2;
        cublasLtMatmulDescCreate(&d2, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasLtMatrixLayout_t la, lb, ld;
        cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m);
        cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k);
        cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m);
        cublasLtMatmulPreference_t p2;
        cublasLtMatmulPreferenceCreate(&p2);
        int got = 0;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_lt, d2, la, lb, ld, ld, p2, 1, &heur, &got);
        CHECK(st == CUBLAS_STATUS_SUCCESS && got == 1, "aligned 16x16x16 bf16: heuristic %s", cublasGetStatusName(st));
        float alpha = 1.0f, beta = 0.0f;
        if (got == 1) {
            STATUS_IS(cublasLtMatmul(g_lt, d2, &alpha, dA, la, dB, lb, &beta, dD, ld, dD, ld, &heur.algo, g_workspace,
                                     WORKSPACE_BYTES, 0),
                      CUBLAS_STATUS_SUCCESS);
            const void* shifted = (const char*)dA + 2;
            st = cublasLtMatmul(g_lt, d2, &alpha, shifted, la, dB, lb, &beta, dD, ld, dD, ld, &heur.algo, g_workspace,
                                WORKSPACE_BYTES, 0);
            CHECK(is_refusal(st), "A misaligned by 2 bytes: cublasLtMatmul returned %s", cublasGetStatusName(st));
        }
        CUDA_OK(cudaDeviceSynchronize());
        cublasLtMatmulPreferenceDestroy(p2);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(d2);
        cudaFree(dA), cudaFree(dB), cudaFree(dD);
        free(z);
    }

    // The classic API documents its refusals exactly (cublas<t>gemm, cublasGemmEx):
    // INVALID_VALUE for m, n, k < 0 and for lda < max(1, m) (transa = N), ldb < max(1, k),
    // ldc < max(1, m); NOT_SUPPORTED for an unsupported Atype/Btype/Ctype combination.
    {
        float* z = host_alloc(4096);
        void* d = upload(z, 4096, CUDA_R_32F);
        float alpha = 1.0f, beta = 0.0f;
        STATUS_IS(cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, 17, 5, 33, &alpha, d, CUDA_R_32F, 16, d, CUDA_R_32F,
                               33, &beta, d, CUDA_R_32F, 17, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_INVALID_VALUE);
        STATUS_IS(cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, 17, 5, 33, &alpha, d, CUDA_R_32F, 32, d, CUDA_R_32F,
                               33, &beta, d, CUDA_R_32F, 17, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_INVALID_VALUE);
        STATUS_IS(cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, 17, 5, 33, &alpha, d, CUDA_R_32F, 17, d, CUDA_R_32F,
                               32, &beta, d, CUDA_R_32F, 17, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_INVALID_VALUE);
        STATUS_IS(cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, 17, 5, 33, &alpha, d, CUDA_R_32F, 17, d, CUDA_R_32F,
                               33, &beta, d, CUDA_R_32F, 16, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_INVALID_VALUE);
        STATUS_IS(cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, -1, 5, 33, &alpha, d, CUDA_R_32F, 17, d, CUDA_R_32F,
                               33, &beta, d, CUDA_R_32F, 17, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_INVALID_VALUE);
        STATUS_IS(cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, 17, 5, 33, &alpha, d, CUDA_R_32F, 17, d, CUDA_R_16BF,
                               33, &beta, d, CUDA_R_32F, 17, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_NOT_SUPPORTED);
        STATUS_IS(cublasSgemm(g_blas, CUBLAS_OP_N, CUBLAS_OP_T, 17, 5, 33, &alpha, (float*)d, 17, (float*)d, 4, &beta,
                              (float*)d, 17),
                  CUBLAS_STATUS_INVALID_VALUE);  // transb = T: B is stored n x k, and ldb = 4 < n = 5
        CUDA_OK(cudaDeviceSynchronize());
        cudaFree(d);
        free(z);
    }
}

// ----------------------------------------------------------------------------

int main(void) {
    STATUS_IS(cublasLtCreate(&g_lt), CUBLAS_STATUS_SUCCESS);
    STATUS_IS(cublasCreate(&g_blas), CUBLAS_STATUS_SUCCESS);
    CUDA_OK(cudaMalloc(&g_workspace, WORKSPACE_BYTES));

    // Handle plumbing: streams are stored and given back; workspace and math mode are accepted.
    cudaStream_t stream, got_stream = NULL;
    CUDA_OK(cudaStreamCreate(&stream));
    STATUS_IS(cublasSetStream(g_blas, stream), CUBLAS_STATUS_SUCCESS);
    STATUS_IS(cublasGetStream(g_blas, &got_stream), CUBLAS_STATUS_SUCCESS);
    CHECK(got_stream == stream, "cublasGetStream gave back another stream");
    STATUS_IS(cublasSetWorkspace(g_blas, g_workspace, WORKSPACE_BYTES), CUBLAS_STATUS_SUCCESS);
    STATUS_IS(cublasSetMathMode(g_blas, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
    STATUS_IS(cublasSetStream(g_blas, 0), CUBLAS_STATUS_SUCCESS);
    CUDA_OK(cudaStreamDestroy(stream));

    const cublasOperation_t ops[2] = {CUBLAS_OP_N, CUBLAS_OP_T};
    const cudaDataType types[3][2] = {{CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_16BF, CUDA_R_32F}};

    // cuBLASLt, no epilogue: every transpose x type combination x size, out of place and in place.
    const int sizes[4][3] = {{17, 5, 33}, {1, 1, 1}, {8, 16, 32}, {33, 17, 9}};
    int case_no = 0;
    for (int s = 0; s < 4; s++)
        for (int t = 0; t < 3; t++)
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++) {
                    LtCase c = {ops[a],      ops[b], sizes[s][0],          sizes[s][1],
                                sizes[s][2], 1,      types[t][0],          types[t][1],
                                1.5f,        -0.75f, (case_no++ % 2) == 1, CUBLASLT_EPILOGUE_DEFAULT,
                                -1};
                    run_lt_case(&c);
                }
    {  // alpha = 1, beta = 0: the plain product
        LtCase c = {CUBLAS_OP_T, CUBLAS_OP_N, 17,   5,    33,    1,
                    CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f, false, CUBLASLT_EPILOGUE_DEFAULT,
                    -1};
        run_lt_case(&c);
    }
    // Strided batches.
    for (int t = 0; t < 3; t++)
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                LtCase c = {ops[a],      ops[b],      17,   5,    33,     3,
                            types[t][0], types[t][1], 0.5f, 2.0f, a == b, CUBLASLT_EPILOGUE_DEFAULT,
                            -1};
                run_lt_case(&c);
            }

    // Every epilogue, fp32 and bf16, with TN (transa = T) and NT (transb = T), alpha and beta set.
    const cublasLtEpilogue_t epilogues[] = {
        CUBLASLT_EPILOGUE_DEFAULT,     CUBLASLT_EPILOGUE_RELU,          CUBLASLT_EPILOGUE_BIAS,
        CUBLASLT_EPILOGUE_RELU_BIAS,   CUBLASLT_EPILOGUE_GELU,          CUBLASLT_EPILOGUE_GELU_AUX,
        CUBLASLT_EPILOGUE_GELU_BIAS,   CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU,
        CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA,        CUBLASLT_EPILOGUE_BGRADB};
    for (size_t e = 0; e < sizeof epilogues / sizeof epilogues[0]; e++)
        for (int t = 0; t < 2; t++)
            for (int tn = 0; tn < 2; tn++) {
                LtCase c = {tn ? CUBLAS_OP_T : CUBLAS_OP_N,
                            tn ? CUBLAS_OP_N : CUBLAS_OP_T,
                            17,
                            5,
                            33,
                            1,
                            types[t][0],
                            types[t][1],
                            0.75f,
                            -0.5f,
                            false,
                            epilogues[e],
                            -1};
                run_lt_case(&c);
            }
    {  // epilogues with batches (bias, aux and bias-gradient batch strides), and in place
        LtCase c1 = {CUBLAS_OP_T, CUBLAS_OP_N, 17,   5,    33,    3,
                     CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f, false, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                     -1};
        run_lt_case(&c1);
        LtCase c2 = {CUBLAS_OP_N, CUBLAS_OP_T, 17,   5,    33,   2,
                     CUDA_R_32F,  CUDA_R_32F,  1.0f, 0.5f, true, CUBLASLT_EPILOGUE_DGELU_BGRAD,
                     -1};
        run_lt_case(&c2);
        // bias gradients on the layout of matmul_backward_weight (NT), batched; the other layouts
        // (NN for BGRADB, TT for BGRADA) may be refused
        for (int lay = 0; lay < 2; lay++) {
            LtCase c3 = {
                CUBLAS_OP_N, lay ? CUBLAS_OP_N : CUBLAS_OP_T, 17, 5, 33, 2, CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f,
                false,       CUBLASLT_EPILOGUE_BGRADB,        -1};
            run_lt_case(&c3);
            LtCase c4 = {
                lay ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_T, 17, 5, 33, 2, CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f, false,
                CUBLASLT_EPILOGUE_BGRADA,        -1};
            run_lt_case(&c4);
        }
        // the bias as matmul_forward uses it: bf16 everywhere, beta 0, transa = T
        LtCase c6 = {CUBLAS_OP_T,     CUBLAS_OP_N, 17,   5,    33,    1,
                     CUDA_R_16BF,     CUDA_R_16BF, 1.0f, 0.0f, false, CUBLASLT_EPILOGUE_BIAS,
                     (int)CUDA_R_16BF};
        run_lt_case(&c6);
        // a bias type other than D's (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE): documented as D's type
        // outside IMMA and fp8 kernels; the GPU refuses both (INVALID_VALUE)
        LtCase c5 = {CUBLAS_OP_T,    CUBLAS_OP_N, 17,   5,    33,    1,
                     CUDA_R_16BF,    CUDA_R_16BF, 1.0f, 0.0f, false, CUBLASLT_EPILOGUE_GELU_BIAS,
                     (int)CUDA_R_32F};
        run_lt_case_with(&c5, 0, MUST_REFUSE);
        LtCase c7 = {CUBLAS_OP_N,    CUBLAS_OP_T, 17,   5,    33,    1,
                     CUDA_R_16BF,    CUDA_R_16BF, 1.0f, 1.0f, false, CUBLASLT_EPILOGUE_BGRADB,
                     (int)CUDA_R_32F};
        run_lt_case_with(&c7, 0, MUST_REFUSE);
        LtCase c8 = {CUBLAS_OP_N,     CUBLAS_OP_T, 17,   5,    33,    1,
                     CUDA_R_16BF,     CUDA_R_32F,  1.0f, 1.0f, false, CUBLASLT_EPILOGUE_BGRADA,
                     (int)CUDA_R_16BF};
        run_lt_case_with(&c8, 0, MUST_REFUSE);
        // aux leading dimensions that are not multiples of 8 (see the top of the file): 20 for the
        // GELU input GELU_AUX and GELU_AUX_BIAS write, 17 for the one DGELU and DGELU_BGRAD read
        const cublasLtEpilogue_t aux_epis[4] = {CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                                                CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD};
        for (int e = 0; e < 4; e++) {
            LtCase ca = {CUBLAS_OP_N, CUBLAS_OP_N, 17,   5,     33,          1, CUDA_R_32F,
                         CUDA_R_32F,  1.0f,        0.0f, false, aux_epis[e], -1};
            run_lt_case_with(&ca, e < 2 ? 20 : 17, MAY_REFUSE);
        }
    }
    // Larger products: several row and column blocks, and the threaded path of the CPU build.
    {
        LtCase c = {CUBLAS_OP_T, CUBLAS_OP_N, 203,  301,  700,   1,
                    CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f, false, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                    -1};
        run_lt_case(&c);
        LtCase d = {CUBLAS_OP_N, CUBLAS_OP_T, 203,  301,  700,  1,
                    CUDA_R_32F,  CUDA_R_32F,  1.0f, 1.0f, true, CUBLASLT_EPILOGUE_DEFAULT,
                    -1};
        run_lt_case(&d);
        // a long k (several row blocks in the CPU build) with row sums over several column blocks
        LtCase e = {CUBLAS_OP_N, CUBLAS_OP_T, 203,       9,    16384, 1,
                    CUDA_R_32F,  CUDA_R_32F,  1.0f / 64, 0.5f, false, CUBLASLT_EPILOGUE_DGELU_BGRAD,
                    -1};
        run_lt_case(&e);
    }
    test_gelu_formula();
    test_gelu_epilogues_bf16();
    test_bf16_rounding();

    // The classic API.
    for (int t = 0; t < 3; t++)
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                run_classic_case(GEMM_EX, ops[a], ops[b], 17, 5, 33, 1, types[t][0], types[t][1], 1.5f, -0.75f);
                run_classic_case(GEMM_STRIDED_EX, ops[a], ops[b], 17, 5, 33, 3, types[t][0], types[t][1], 0.5f, 2.0f);
            }
    run_classic_case(GEMM_EX, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, 1, CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f);
    run_classic_case(GEMM_EX, CUBLAS_OP_T, CUBLAS_OP_N, 33, 17, 9, 1, CUDA_R_16BF, CUDA_R_32F, 1.0f, 0.0f);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            run_classic_case(SGEMM, ops[a], ops[b], 17, 5, 33, 1, CUDA_R_32F, CUDA_R_32F, -1.25f, 0.5f);
            run_classic_case(SGEMM_STRIDED, ops[a], ops[b], 17, 5, 33, 2, CUDA_R_32F, CUDA_R_32F, 1.0f, 0.0f);
        }
    run_classic_case(SGEMM, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, 1, CUDA_R_32F, CUDA_R_32F, 2.0f, 1.0f);

    test_refusals();
    test_bias_pointer_refused();
    test_algorithm_offers();

    STATUS_IS(cublasDestroy(g_blas), CUBLAS_STATUS_SUCCESS);
    STATUS_IS(cublasLtDestroy(g_lt), CUBLAS_STATUS_SUCCESS);
    CUDA_OK(cudaFree(g_workspace));
    return test_summary();
}
