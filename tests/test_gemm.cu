// test_gemm.cu: gemm_wgmma (gemm.cuh), our Hopper matmul with the MLP's GELU in its epilogue:
//   - GEMM_PLAIN, B (N, K) and B (K, N), against a double reference, at sizes that leave partial tiles in M, N and
//     K, that take one tile, and that wrap the ring of stages within a tile and across tiles;
//   - GEMM_GELU against what it replaces, bit for bit: the plain product, then gelu_forward;
//   - GEMM_DGELU against what it replaces, bit for bit: the plain product (B (K, N)), then gelu_backward (out and
//     d); its bias gradient against a double sum of its own d, and added to what the gradient held;
//   - the same bits from any grid (1 block, 3 blocks, one per SM), so the results do not depend on the GPU;
//   - the refusals (odd sizes, misaligned matrices, an epilogue with the other B).
// Portable: the CPU runtime (which emulates wgmma, mbarriers and TMA per the PTX ISA), ASan, and a GPU
// (build/gpu/test_gemm, sm_90a). bf16 only: the fp32 build has no wgmma.
#include "kernel_check.h"
#include <string.h>

static std::vector<floatX> raw(const floatX* d, size_t n) {
    std::vector<floatX> v(n);
    CUDA_CHECK(cudaMemcpy(v.data(), d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    return v;
}
static int same_bits(const std::vector<floatX>& a, const std::vector<floatX>& b) {
    return a.size() == b.size() && !memcmp(a.data(), b.data(), a.size() * sizeof(floatX));
}
static int same_floats(const vf& a, const vf& b) {
    return a.size() == b.size() && !memcmp(a.data(), b.data(), a.size() * sizeof(float));
}

static void test_gemm(int M, int N, int K) {
    cudaStream_t s = 0;
    size_t MN = (size_t)M * N;
    vf a, bk, bm, bias, x;
    floatX *d_a = dev_rand(&a, (size_t)M * K, -1, 1), *d_bk = dev_rand(&bk, (size_t)N * K, -1, 1);
    floatX *d_bm = dev_rand(&bm, (size_t)K * N, -1, 1), *d_bias = dev_rand(&bias, N, -0.5f, 0.5f);
    floatX* d_x = dev_rand(&x, MN, -3, 3);  // the forward's fc1, for GELU'
    floatX *d_d = dev_x(MN), *d_d2 = dev_x(MN), *d_r = dev_x(MN), *d_r2 = dev_x(MN);
    float *d_part = dev_f(gemm_part_floats(M, N) + colsum_part_floats(N)), *d_db = dev_f(N), *d_dbr = dev_f(N);
    vf db0(N);
    test_fill(db0.data(), N, -1, 1);
    // plain, both layouts of B, against double sums
    for (int tb = 0; tb < 2; tb++) {
        CUDA_CHECK(cudaMemset(d_d, 0xff, MN * sizeof(floatX)));  // NaN: every element is written
        launch_gemm_wgmma(s, GEMM_PLAIN, tb, d_d, NULL, NULL, NULL, d_a, tb ? d_bm : d_bk, NULL, NULL, M, N, K, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        vd want(MN);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double t = 0;
                for (int k = 0; k < K; k++)
                    t += (double)a[(size_t)m * K + k] * (tb ? bm[(size_t)k * N + n] : bk[(size_t)n * K + k]);
                want[(size_t)m * N + n] = t;
            }
        char w[128];
        snprintf(w, sizeof w, "gemm_wgmma plain, B %s, M %d N %d K %d", tb ? "(K, N)" : "(N, K)", M, N, K);
        vf got = get_x(d_d, MN), wf = tof(want);
        check_close(w, got.data(), wf.data(), MN, 1e-4f, 1.f / 256);  // bf16's rounding of an fp32 sum
    }
    // GELU: the plain product (B (N, K)), then gelu_forward
    launch_gemm_wgmma(s, GEMM_PLAIN, 0, d_r, NULL, NULL, NULL, d_a, d_bk, NULL, NULL, M, N, K, 0);
    launch_gelu_forward(s, d_r2, d_r, d_bias, M, N);
    for (int blocks : {1, 3, 0}) {
        CUDA_CHECK(cudaMemset(d_d2, 0xff, MN * sizeof(floatX)));
        launch_gemm_wgmma(s, GEMM_GELU, 0, d_d, d_d2, NULL, NULL, d_a, d_bk, NULL, d_bias, M, N, K, blocks);
        CUDA_CHECK(cudaDeviceSynchronize());
        CHECK(same_bits(raw(d_d, MN), raw(d_r, MN)) && same_bits(raw(d_d2, MN), raw(d_r2, MN)),
              "gemm_wgmma GELU (%d blocks), M %d N %d K %d: fc1 and GELU(fc1 + b) differ from the plain product and "
              "gelu_forward's, bit for bit",
              blocks, M, N, K);
    }
    // GELU': the plain product (B (K, N)), then gelu_backward
    launch_gemm_wgmma(s, GEMM_PLAIN, 1, d_r, NULL, NULL, NULL, d_a, d_bm, NULL, NULL, M, N, K, 0);
    CUDA_CHECK(cudaMemcpy(d_dbr, db0.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    launch_gelu_backward(s, d_r2, d_r, d_dbr, d_part, d_x, d_bias, M, N);
    std::vector<floatX> first_d, first_d2;
    vf first_db;
    for (int blocks : {0, 1, 3}) {
        CUDA_CHECK(cudaMemset(d_d, 0xff, MN * sizeof(floatX)));
        CUDA_CHECK(cudaMemset(d_d2, 0xff, MN * sizeof(floatX)));
        CUDA_CHECK(cudaMemset(d_part, 0xff, gemm_part_floats(M, N) * sizeof(float)));  // NaN: all written
        CUDA_CHECK(cudaMemcpy(d_db, db0.data(), N * sizeof(float), cudaMemcpyHostToDevice));
        launch_gemm_wgmma(s, GEMM_DGELU, 1, d_d, d_d2, d_db, d_part, d_a, d_bm, d_x, d_bias, M, N, K, blocks);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<floatX> dd = raw(d_d, MN), dd2 = raw(d_d2, MN);
        vf db = get_f(d_db, N);
        if (blocks == 0) {
            first_d = dd, first_d2 = dd2, first_db = db;
            CHECK(same_bits(dd, raw(d_r, MN)) && same_bits(dd2, raw(d_r2, MN)),
                  "gemm_wgmma GELU', M %d N %d K %d: d and GELU(x + b) differ from the plain product and "
                  "gelu_backward's, bit for bit",
                  M, N, K);
            vd want(N);  // db0 + the column sums of the kernel's own d
            double scale = 0;
            for (int n = 0; n < N; n++) {
                double t = db0[n], u = 0;
                for (int m = 0; m < M; m++) t += hf(dd[(size_t)m * N + n]), u += fabs(hf(dd[(size_t)m * N + n]));
                want[n] = t;
                scale = fmax(scale, u);
            }
            vf wf = tof(want);
            char w[128];
            snprintf(w, sizeof w, "gemm_wgmma GELU' bias gradient, M %d N %d K %d", M, N, K);
            check_close(w, db.data(), wf.data(), N, 1e-6f * (float)scale + 1e-6f, 0);
            vf dbr = get_f(d_dbr, N);
            snprintf(w, sizeof w, "gemm_wgmma GELU' bias gradient against gelu_backward's, M %d N %d K %d", M, N, K);
            check_close(w, db.data(), dbr.data(), N, 2e-6f * (float)scale + 1e-6f, 0);
        } else {
            CHECK(same_bits(dd, first_d) && same_bits(dd2, first_d2) && same_floats(db, first_db),
                  "gemm_wgmma GELU' on %d blocks, M %d N %d K %d: not the bits of one block per SM", blocks, M, N, K);
        }
    }
    for (void* p : {(void*)d_a, (void*)d_bk, (void*)d_bm, (void*)d_bias, (void*)d_x, (void*)d_d, (void*)d_d2,
                    (void*)d_r, (void*)d_r2, (void*)d_part, (void*)d_db, (void*)d_dbr})
        cudaFree(p);
}

static void test_refusals(void) {
    char buf[64];
    const void* ok[2] = {buf, buf + 16};
    const void* off[2] = {buf, buf + 8};
    CHECK(!gemm_wgmma_refusal(GEMM_PLAIN, 0, 100, 264, 200, ok, 2), "gemm_wgmma: 100 x 264 x 200 refused");
    CHECK(gemm_wgmma_refusal(GEMM_PLAIN, 0, 100, 264, 100, ok, 2) != NULL, "gemm_wgmma: K 100 accepted");
    CHECK(gemm_wgmma_refusal(GEMM_PLAIN, 1, 100, 260, 200, ok, 2) != NULL, "gemm_wgmma: N 260 accepted");
    CHECK(gemm_wgmma_refusal(GEMM_PLAIN, 0, 0, 264, 200, ok, 2) != NULL, "gemm_wgmma: M 0 accepted");
    CHECK(gemm_wgmma_refusal(GEMM_PLAIN, 0, 100, 264, 200, off, 2) != NULL, "gemm_wgmma: a misaligned matrix");
    CHECK(gemm_wgmma_refusal(GEMM_GELU, 1, 100, 264, 200, ok, 2) != NULL, "gemm_wgmma: GELU with B (K, N)");
    CHECK(gemm_wgmma_refusal(GEMM_DGELU, 0, 100, 264, 200, ok, 2) != NULL, "gemm_wgmma: GELU' with B (N, K)");
}

int main(void) {
    printf("test_gemm (%s storage)\n", FLOATX_NAME);
    if (FP32) {  // (the fp32 build: gemm_wgmma is bf16's; launch_gemm_wgmma refuses)
        CHECK(gemm_wgmma_refusal(GEMM_PLAIN, 0, 128, 128, 64, NULL, 0) != NULL, "gemm_wgmma accepted fp32 storage");
        return test_summary();
    }
    test_refusals();
    test_gemm(300, 264, 200);  // partial tiles in M (300 = 2 x 128 + 44), N (+ 8) and K (200 = 3 x 64 + 8)
    test_gemm(128, 128, 64);   // one tile, one k-step
    test_gemm(136, 128, 520);  // 9 k-steps a tile: the ring (4 or 6 stages) wraps inside a tile
    test_gemm(520, 392, 72);   // 20 tiles: on 1 or 3 blocks both warpgroups take several, the ring wraps across
    return test_summary();
}
