// bench_gemm.cu: gemm_wgmma (gemm.cuh, the trainer's --mlp wgmma) against what it replaces, at the MLP's shapes:
//   forward   fc1 = ln1 W1^T by cuBLASLt (matmul_forward), then gelu_forward   vs  gemm_wgmma GEMM_GELU
//   backward  d_fc1 = d_res W2 by cuBLASLt (matmul_backward_input), then
//             gelu_backward (with b1's gradient)                                vs  gemm_wgmma GEMM_DGELU
//   and the two products alone (cuBLASLt against gemm_wgmma GEMM_PLAIN), for how far the matmul itself is from
//   cuBLASLt's.
// N rows (tokens) x C (hidden) x I (intermediate) of the preset; each row is `iters` calls after 2 warm-up calls,
// timed with CUDA events; ms, TFLOP/s (2 N C I per call) and the ratio cuBLASLt path / gemm_wgmma (above 1: ours is
// faster), then the faster way for each pass as the trainer's flag (fastest: --mlp fwd). The last line is
// `bench-gemm-result preset=... forward_x=... backward_x=... best=FLAG` (tools/gpu_session.sh reads best).
//
//   build/gpu/bench_gemm [--preset bert-base] [--rows 300544] [--iters 20]
//   build/bench_gemm --tiny         the CPU build's smoke test (the tiny preset, 512 rows, one iteration)
#include "../model.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static floatX* bench_buf(size_t n, uint64_t seed) {  // n bf16 values in [-1, 1)
    floatX* h = (floatX*)malloc(n * sizeof(floatX));
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (floatX)((float)((seed >> 40) & 0xffff) / 32768.f - 1.f);
    }
    floatX* d;
    CUDA_CHECK(cudaMalloc((void**)&d, n * sizeof(floatX)));
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(floatX), cudaMemcpyHostToDevice));
    free(h);
    return d;
}

typedef struct {
    Blas* bl;
    int N, C, I, which;  // which: the path timed (see run)
    floatX *ln1, *w1, *b1, *fc1, *gelu, *d_res, *w2, *d_fc1;
    float *db1, *part;
} Bench;

enum {
    CUBLAS_FWD,
    CUBLAS_FWD_GELU,
    OURS_FWD_PLAIN,
    OURS_FWD_GELU,
    CUBLAS_BWD,
    CUBLAS_BWD_GELU,
    OURS_BWD_PLAIN,
    OURS_BWD_GELU
};
static const char* names[] = {
    "cuBLASLt fc1",   "cuBLASLt fc1 + gelu_forward",    "gemm_wgmma fc1",   "gemm_wgmma fc1 + GELU",
    "cuBLASLt d_fc1", "cuBLASLt d_fc1 + gelu_backward", "gemm_wgmma d_fc1", "gemm_wgmma d_fc1 + GELU'"};

static void run(Bench* b) {
    cudaStream_t s = 0;
    int N = b->N, C = b->C, I = b->I;
    switch (b->which) {
        case CUBLAS_FWD_GELU:
        case CUBLAS_FWD:
            matmul_forward(b->bl, s, b->fc1, I, b->ln1, b->w1, NULL, N, C, I);
            if (b->which == CUBLAS_FWD_GELU) launch_gelu_forward(s, b->gelu, b->fc1, b->b1, N, I);
            break;
        case OURS_FWD_PLAIN:
            launch_gemm_wgmma(s, GEMM_PLAIN, 0, b->fc1, NULL, NULL, NULL, b->ln1, b->w1, NULL, NULL, N, I, C, 0);
            break;
        case OURS_FWD_GELU:
            launch_gemm_wgmma(s, GEMM_GELU, 0, b->fc1, b->gelu, NULL, NULL, b->ln1, b->w1, NULL, b->b1, N, I, C, 0);
            break;
        case CUBLAS_BWD_GELU:
        case CUBLAS_BWD:
            matmul_backward_input(b->bl, s, b->d_fc1, b->d_res, C, b->w2, NULL, N, I, C);
            if (b->which == CUBLAS_BWD_GELU)
                launch_gelu_backward(s, b->gelu, b->d_fc1, b->db1, b->part, b->fc1, b->b1, N, I);
            break;
        case OURS_BWD_PLAIN:
            launch_gemm_wgmma(s, GEMM_PLAIN, 1, b->d_fc1, NULL, NULL, NULL, b->d_res, b->w2, NULL, NULL, N, I, C, 0);
            break;
        case OURS_BWD_GELU:
            launch_gemm_wgmma(s, GEMM_DGELU, 1, b->d_fc1, b->gelu, b->db1, b->part, b->d_res, b->w2, b->fc1, b->b1, N,
                              I, C, 0);
            break;
    }
}

static float time_it(Bench* b, int which, int iters, cudaEvent_t e0, cudaEvent_t e1) {
    b->which = which;
    for (int i = 0; i < 2 + iters; i++) {
        if (i == 2) CUDA_CHECK(cudaEventRecord(e0, 0));
        run(b);
    }
    CUDA_CHECK(cudaEventRecord(e1, 0));
    CUDA_CHECK(cudaEventSynchronize(e1));
    CUDA_CHECK(cudaGetLastError());
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / iters;
}

int main(int argc, char** argv) {
    const char* preset = "bert-base";
    int N = 300544, iters = 20, tiny = 0;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--tiny"))
            tiny = 1;
        else if (!strcmp(a, "--preset") && has)
            preset = argv[++i];
        else if (!strcmp(a, "--rows") && has && atoi(argv[i + 1]) > 0)
            N = atoi(argv[++i]);
        else if (!strcmp(a, "--iters") && has && atoi(argv[i + 1]) > 0)
            iters = atoi(argv[++i]);
        else {
            fprintf(
                stderr,
                "bench_gemm: unknown or incomplete option '%s' (expected --preset NAME, --rows N >= 1, --iters N >= 1, "
                "--tiny)\n",
                a);
            return 2;
        }
    }
    if (tiny) preset = "tiny", N = 512, iters = 1;
    BertConfig cfg;
    if (!bert_preset(preset, &cfg)) {
        fprintf(stderr, "bench_gemm: --preset %s: no such preset (bert-base, bert-large, tiny, ...)\n", preset);
        return 2;
    }
    int C = cfg.hidden, I = cfg.intermediate;
    const void* none[1] = {NULL};
    const char* why = gemm_wgmma_refusal(GEMM_PLAIN, 0, N, I, C, none, 1);
    if (why) {
        fprintf(stderr, "bench_gemm: %s (N %d, C %d, I %d): %s\n", preset, N, C, I, why);
        return 2;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    Blas bl;
    blas_init(&bl, (size_t)32 << 20);
    Bench b;
    memset(&b, 0, sizeof b);
    b.bl = &bl, b.N = N, b.C = C, b.I = I;
    size_t NC = (size_t)N * C, NI = (size_t)N * I;
    b.ln1 = bench_buf(NC, 1), b.w1 = bench_buf((size_t)I * C, 2), b.b1 = bench_buf(I, 3);
    b.d_res = bench_buf(NC, 4), b.w2 = bench_buf((size_t)C * I, 5), b.fc1 = bench_buf(NI, 6);
    b.gelu = bench_buf(NI, 7), b.d_fc1 = bench_buf(NI, 8);
    CUDA_CHECK(cudaMalloc((void**)&b.db1, I * sizeof(float)));
    CUDA_CHECK(cudaMemset(b.db1, 0, I * sizeof(float)));
    size_t part = gemm_part_floats(N, I) > colsum_part_floats(I) ? gemm_part_floats(N, I) : colsum_part_floats(I);
    CUDA_CHECK(cudaMalloc((void**)&b.part, part * sizeof(float)));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    printf("bench_gemm: %s, %s storage, preset %s: N %d rows, C %d, I %d; %d iterations\n", prop.name, FLOATX_NAME,
           preset, N, C, I, iters);
    double flops = 2.0 * N * C * I;
    float ms[8];
    for (int w = 0; w < 8; w++) {
        ms[w] = time_it(&b, w, iters, e0, e1);
        printf("  %-32s %9.3f ms  %7.1f TFLOP/s\n", names[w], ms[w], flops / ms[w] / 1e9);
    }
    printf("  forward:  cuBLASLt + gelu_forward / gemm_wgmma GELU   = %.3fx (the product alone: %.3fx)\n",
           ms[CUBLAS_FWD_GELU] / ms[OURS_FWD_GELU], ms[CUBLAS_FWD] / ms[OURS_FWD_PLAIN]);
    printf("  backward: cuBLASLt + gelu_backward / gemm_wgmma GELU' = %.3fx (the product alone: %.3fx)\n",
           ms[CUBLAS_BWD_GELU] / ms[OURS_BWD_GELU], ms[CUBLAS_BWD] / ms[OURS_BWD_PLAIN]);
    // the faster of the two ways for each pass, as the trainer's flag (--mlp fwd: gemm_wgmma for the forward only)
    int fwd = ms[OURS_FWD_GELU] < ms[CUBLAS_FWD_GELU], bwd = ms[OURS_BWD_GELU] < ms[CUBLAS_BWD_GELU];
    const char* best = fwd && bwd ? "wgmma" : fwd ? "fwd" : bwd ? "bwd" : "cublaslt";
    float two = ms[fwd ? OURS_FWD_GELU : CUBLAS_FWD_GELU] + ms[bwd ? OURS_BWD_GELU : CUBLAS_BWD_GELU];
    printf("  fastest: --mlp %s (a layer's two passes %.3f ms, %.3fx cuBLASLt's and the GELU kernels' time)\n", best,
           two, two / (ms[CUBLAS_FWD_GELU] + ms[CUBLAS_BWD_GELU]));
    printf(
        "bench-gemm-result preset=%s rows=%d forward_x=%.3f backward_x=%.3f plain_fwd_x=%.3f plain_bwd_x=%.3f "
        "best=%s\n",
        preset, N, ms[CUBLAS_FWD_GELU] / ms[OURS_FWD_GELU], ms[CUBLAS_BWD_GELU] / ms[OURS_BWD_GELU],
        ms[CUBLAS_FWD] / ms[OURS_FWD_PLAIN], ms[CUBLAS_BWD] / ms[OURS_BWD_PLAIN], best);
    blas_free(&bl);
    return 0;
}
