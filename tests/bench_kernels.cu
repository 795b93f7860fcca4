// bench_kernels.cu: how close the memory-bound kernels of a step run to the device's memory bandwidth. For each:
// the bytes it must move (every read and write, counted from the shapes: activations, stats, parameters, partial
// sums), its time per call (CUDA events over `iters` calls after 2 warm-up calls), GB/s, and that as a percentage of
// a cudaMemcpyAsync device-to-device copy that moves the same bytes (half read, half written), timed in the same run.
//   residual_layernorm_forward         (N, C): x and r read, res and out written, stats written (the model's launch)
//   layernorm_backward                 (N, C): dout and inp read, dinp written, stats read, with the bias gradient
//                                      (3C floats of partials a block, written and read back by partials_sum): the
//                                      encoder's 24 calls a step; the launcher, so both kernels are timed
//   layernorm_backward, GELU' (head)   (M, C), M = 1.1 x 0.15 N + 64 (the trainer's cap): gelu_pre read too
//   column_sums                        (N, C): x read (the MLM decoder's bias gradient), with partials_sum
//   column_sums, fc1                   (N, I): dLoss/dpre read (the MLP's first bias gradient; GELU itself runs in
//                                      cuBLASLt's epilogues), with partials_sum
// Sizes default to bert-base at B = 256, T = 512 (N = 131072 rows, C = 768, I = 3072). The last line per kernel,
// `bench-kernels-result kernel=... bytes=... ms=... gbps=... copy_pct=...`, is for scripts. No figure is checked:
// tests/test_kernels.cu checks what these kernels compute.
//
//   build/gpu/bench_kernels [--rows N] [--cols C] [--inter I] [--iters 20]
//   build/bench_kernels --tiny          the CPU build's smoke test (300 rows, C = 768, I = 3072, one iteration)
#include "../kernels.cuh"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static floatX* bench_buf(size_t n, uint64_t seed) {  // n floatX values in [-1, 1)
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
static float* bench_f(size_t n) {  // n floats, zero
    float* d;
    CUDA_CHECK(cudaMalloc((void**)&d, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(d, 0, n * sizeof(float)));
    return d;
}

typedef struct {
    int N, M, C, I;
    floatX *x, *r, *res, *out, *bias, *gamma, *beta, *dout, *dinp, *fc1, *h_pre;
    float *stats, *part, *dgb, *cpart, *db1, *ipart;
    char *copy_src, *copy_dst;  // the reference copy's buffers
} Bench;

enum { RES_LN_FWD, LN_BWD, LN_BWD_HEAD, COLUMN_SUMS, COLUMN_SUMS_FC1, COPY, NKERNELS };
static const char* kernel_names[NKERNELS] = {"residual_layernorm_forward",
                                             "layernorm_backward",
                                             "layernorm_backward_gelu_head",
                                             "column_sums",
                                             "column_sums_fc1",
                                             "copy"};

// bytes_moved: what kernel k must read and write at b's shapes (the copy: its own size, set by the caller)
static double bytes_moved(const Bench* b, int k) {
    double x = sizeof(floatX), N = b->N, M = b->M, C = b->C, I = b->I;
    double G = ln_backward_grid(b->N, b->C), Gh = ln_backward_grid(b->M, b->C);
    int gy = colsum_grid_y(b->C), gi = colsum_grid_y(b->I);
    if (gy > ceil_div(b->N, 8)) gy = ceil_div(b->N, 8);
    if (gi > ceil_div(b->N, 8)) gi = ceil_div(b->N, 8);
    switch (k) {
        case RES_LN_FWD:
            return 4 * N * C * x + 8 * N + 3 * C * x;  // x, r in; res, out, stats out; bias, gamma, beta
        case LN_BWD:  // dout, inp in; dinp out; stats, gamma in; partials out and back in; dgamma, dbeta, dbias += (C)
            return 3 * N * C * x + 8 * N + C * x + 2 * G * 3 * C * 4 + 3 * 2 * C * 4;
        case LN_BWD_HEAD:
            return 4 * M * C * x + 8 * M + C * x + 2 * Gh * 3 * C * 4 + 3 * 2 * C * 4;
        case COLUMN_SUMS:
            return N * C * x + 2 * gy * C * 4.0 + 2 * C * 4;
        case COLUMN_SUMS_FC1:
            return N * I * x + 2 * gi * I * 4.0 + 2 * I * 4;
    }
    return 0;
}

static void run(Bench* b, int k, size_t copy_bytes) {
    cudaStream_t s = 0;
    int N = b->N, C = b->C;
    switch (k) {
        case RES_LN_FWD:
            launch(residual_layernorm_forward, dim3(ceil_div(N, 4)), dim3(128), 0, s, b->res, b->out, b->stats,
                   (const floatX*)b->x, (const floatX*)b->r, (const floatX*)b->bias, (const floatX*)b->gamma,
                   (const floatX*)b->beta, N, C, 1e-12f);
            break;
        case LN_BWD:
            launch_layernorm_backward(s, b->dinp, b->dgb, b->dgb + C, b->dgb + 2 * C, b->part, b->dout, b->res,
                                      b->stats, b->gamma, NULL, N, C);
            break;
        case LN_BWD_HEAD:  // (the first M rows of the same tensors: inp = GELU(pre), here any values)
            launch_layernorm_backward(s, b->dinp, b->dgb, b->dgb + C, b->dgb + 2 * C, b->part, b->dout, b->res,
                                      b->stats, b->gamma, b->h_pre, b->M, C);
            break;
        case COLUMN_SUMS:
            launch_column_sums(s, b->dgb, b->cpart, b->dout, N, C);
            break;
        case COLUMN_SUMS_FC1:
            launch_column_sums(s, b->db1, b->ipart, b->fc1, N, b->I);
            break;
        case COPY:
            CUDA_CHECK(cudaMemcpyAsync(b->copy_dst, b->copy_src, copy_bytes, cudaMemcpyDeviceToDevice, s));
            break;
    }
}

// time_ms: the mean time of one call of kernel k (copy: of copy_bytes), over iters calls after 2 warm-up calls
static float time_ms(Bench* b, int k, size_t copy_bytes, int iters) {
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 2 + iters; i++) {
        if (i == 2) CUDA_CHECK(cudaEventRecord(e0, 0));
        run(b, k, copy_bytes);
    }
    CUDA_CHECK(cudaEventRecord(e1, 0));
    CUDA_CHECK(cudaEventSynchronize(e1));
    CUDA_CHECK(cudaGetLastError());
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    return ms / iters;
}

static int positive(const char* flag, const char* v) {
    char* end;
    long n = strtol(v, &end, 10);
    if (*end || n <= 0 || n > 1 << 30) {
        fprintf(stderr, "bench_kernels: %s %s: expected a positive integer\n", flag, v);
        exit(2);
    }
    return (int)n;
}

int main(int argc, char** argv) {
    Bench b = {};
    int iters = 0, tiny = 0;
    b.N = 131072, b.C = 768, b.I = 3072;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tiny"))
            tiny = 1, b.N = 300;
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            b.N = positive(argv[i], argv[i + 1]), i++;
        else if (!strcmp(argv[i], "--cols") && i + 1 < argc)
            b.C = positive(argv[i], argv[i + 1]), i++;
        else if (!strcmp(argv[i], "--inter") && i + 1 < argc)
            b.I = positive(argv[i], argv[i + 1]), i++;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = positive(argv[i], argv[i + 1]), i++;
        else {
            fprintf(stderr,
                    "bench_kernels: unknown or incomplete option '%s' (expected --rows N, --cols C, --inter I, "
                    "--iters N, --tiny)\n",
                    argv[i]);
            return 2;
        }
    }
    if (b.C % X128 || b.I % X128) {
        fprintf(stderr, "bench_kernels: --cols and --inter must be multiples of %d (128-bit chunks)\n", X128);
        return 2;
    }
    if (!iters) iters = tiny ? 1 : 20;
    b.M = (int)(1.1 * 0.15 * b.N) + 64;  // the trainer's cap on the MLM head's rows (mlm_cap)
    if (b.M > b.N) b.M = b.N;
    size_t NC = (size_t)b.N * b.C, NI = (size_t)b.N * b.I;
    b.x = bench_buf(NC, 1), b.r = bench_buf(NC, 2), b.dout = bench_buf(NC, 3), b.fc1 = bench_buf(NI, 4);
    b.h_pre = bench_buf(NC, 5), b.bias = bench_buf(b.C, 6), b.gamma = bench_buf(b.C, 7), b.beta = bench_buf(b.C, 8);
    b.res = bench_buf(NC, 10), b.out = bench_buf(NC, 11), b.dinp = bench_buf(NC, 12);
    b.stats = bench_f(2 * (size_t)b.N), b.part = bench_f(ln_part_floats(b.C)), b.dgb = bench_f(3 * (size_t)b.C);
    b.cpart = bench_f(colsum_part_floats(b.C)), b.db1 = bench_f(b.I), b.ipart = bench_f(colsum_part_floats(b.I));
    double most = 0;
    for (int k = 0; k < COPY; k++)
        if (bytes_moved(&b, k) > most) most = bytes_moved(&b, k);
    CUDA_CHECK(cudaMalloc((void**)&b.copy_src, (size_t)(most / 2) + 16));
    CUDA_CHECK(cudaMalloc((void**)&b.copy_dst, (size_t)(most / 2) + 16));
    CUDA_CHECK(cudaMemset(b.copy_src, 0, (size_t)(most / 2) + 16));
    run(&b, RES_LN_FWD, 0);  // res and stats for the backward: real LayerNorm statistics
    CUDA_CHECK(cudaDeviceSynchronize());

    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf(
        "bench_kernels: %s, %s storage, N = %d rows, C = %d, I = %d, head M = %d rows; %d timed calls each "
        "(CUDA events)\n",
        prop.name, FLOATX_NAME, b.N, b.C, b.I, b.M, iters);
    printf("layernorm_backward: %d blocks of (%d, %d), %zu bytes of dynamic shared memory (%zu with GELU')\n",
           ln_backward_grid(b.N, b.C), ln_block_x(b.C), ln_rows(b.C), ln_backward_smem(b.C, 3, 0),
           ln_backward_smem(b.C, 3, 1));
    printf("%-30s %12s %10s %10s | %24s %8s\n", "kernel", "bytes (MB)", "ms/call", "GB/s", "copy of the same bytes",
           "% copy");
    for (int k = 0; k < COPY; k++) {
        double bytes = bytes_moved(&b, k);
        size_t copy_bytes = (size_t)(bytes / 2) / 16 * 16;  // moves about `bytes`: half read, half written
        float ms = time_ms(&b, k, 0, iters), ms_copy = time_ms(&b, COPY, copy_bytes, iters);
        double gbps = bytes / ms / 1e6, copy_gbps = 2.0 * copy_bytes / ms_copy / 1e6;
        printf("%-30s %12.1f %10.4f %10.1f | %10.4f ms %8.1f GB/s %7.1f%%\n", kernel_names[k], bytes / 1e6, ms, gbps,
               ms_copy, copy_gbps, 100.0 * gbps / copy_gbps);
        printf("bench-kernels-result kernel=%s bytes=%.0f ms=%.5f gbps=%.1f copy_gbps=%.1f copy_pct=%.1f\n",
               kernel_names[k], bytes, ms, gbps, copy_gbps, 100.0 * gbps / copy_gbps);
    }
    void* bufs[] = {b.x,     b.r,     b.res,  b.out, b.bias,  b.gamma, b.beta,  b.dout,     b.dinp,    b.fc1,
                    b.h_pre, b.stats, b.part, b.dgb, b.cpart, b.db1,   b.ipart, b.copy_src, b.copy_dst};
    for (void* p : bufs) cudaFree(p);
    return 0;
}
