// test_attention.cu: the attention kernels (attention.cuh) against a plain-C (double) reference: forward
// output and lse, and the gradients of Q, K and V, at every head size, with odd T (not a multiple of the
// 64-row tiles), samples of length 1, packed rows, all-padding rows, rows where most key tiles are empty
// (many short samples), rows that one sample fills, and a warp whose rows see fewer tiles than its block's.
// Also: the results are bitwise the same when run again (no atomics). Portable: runs on the CPU runtime,
// under ASan, shuffled (tests/test_attention_shuffled.sh) and on a GPU (build/gpu/test_attention).
// tests/test_attention_fp32.cu runs the same checks with fp32 storage (MLM_FP32).
#include "kernel_check.h"
#include <string.h>

// out | dqkv as they are on the device now
static std::vector<floatX> now_last(const floatX* d_out, const floatX* d_dqkv, int N, int C) {
    std::vector<floatX> v((size_t)N * 4 * C);
    CUDA_CHECK(cudaMemcpy(v.data(), d_out, (size_t)N * C * sizeof(floatX), cudaMemcpyDeviceToHost));
    CUDA_CHECK(
        cudaMemcpy(v.data() + (size_t)N * C, d_dqkv, (size_t)N * 3 * C * sizeof(floatX), cudaMemcpyDeviceToHost));
    return v;
}
// the raw elements of n floatX on the device (for bitwise comparisons)
static std::vector<floatX> get_x_raw(const floatX* d, size_t n) {
    std::vector<floatX> v(n);
    CUDA_CHECK(cudaMemcpy(v.data(), d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    return v;
}
// n samples of length len, then padding
static std::vector<int> shorts(int n, int len) { return std::vector<int>(n, len); }

// attention: forward, lse and the three gradients against a double reference
// (mixed: at HD 64 also the backward with one of its two kernels on wgmma, the other on mma.sync)
static void test_attention(int T, int HD, const std::vector<std::vector<int>>& rows, int NH = 2, int mixed = 0) {
    int B = (int)rows.size(), C = NH * HD, N = B * T;
    std::vector<int> lo, hi;
    segments(B, T, rows, &lo, &hi);
    vf qkv, dout;
    floatX *d_qkv = dev_rand(&qkv, (size_t)N * 3 * C, -2, 2), *d_dout = dev_rand(&dout, (size_t)N * C, -1, 1);
    floatX *d_out = dev_x((size_t)N * C), *d_dqkv = dev_x((size_t)N * 3 * C);
    float *d_lse = dev_f((size_t)B * NH * T), *d_delta = dev_f((size_t)B * NH * T);
    float *d_part = dev_f(att_part_floats(B, T, C, HD)), *d_dbias = dev_f((size_t)3 * C);
    std::vector<float> dbias0(3 * C);  // the bias gradient before: the backward adds the column sums of dqkv
    test_fill(dbias0.data(), dbias0.size(), -1.f, 1.f);
    int *d_lo = dev_i(lo), *d_hi = dev_i(hi);
    std::vector<floatX> first;  // the first run's out | dqkv, bit for bit
    vf first_db;                // and its dbias
    for (int rep = 0; rep < 2; rep++) {
        CUDA_CHECK(cudaMemset(d_dqkv, 0xff, (size_t)N * 3 * C * sizeof(floatX)));  // NaN: every element is written
        launch_attention_forward((cudaStream_t)0, d_out, d_lse, d_qkv, d_lo, d_hi, B, T, NH, HD, 0);
        CUDA_CHECK(cudaMemcpy(d_dbias, dbias0.data(), dbias0.size() * sizeof(float), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(d_part, 0xff, att_part_floats(B, T, C, HD) * sizeof(float)));  // NaN: all written
        launch_attention_backward((cudaStream_t)0, d_dqkv, d_dbias, d_delta, d_part, d_dout, d_qkv, d_out, d_lse, d_lo,
                                  d_hi, B, T, NH, HD, 0);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaDeviceSynchronize());
        if (rep == 0) first = now_last(d_out, d_dqkv, N, C), first_db = get_f(d_dbias, (size_t)3 * C);
    }
    CHECK(first_db == get_f(d_dbias, (size_t)3 * C), "attention T=%d HD=%d: a second run's dbias differs bit for bit",
          T, HD);
    CHECK(!memcmp(first.data(), now_last(d_out, d_dqkv, N, C).data(), first.size() * sizeof(floatX)),
          "attention T=%d HD=%d: a second run differs bit for bit from the first", T, HD);
    vf out_k = get_x(d_out, (size_t)N * C);  // the backward uses the kernel's own (rounded) output
    vd out((size_t)N * C, 0), lse((size_t)B * NH * T, 0), dqkv((size_t)N * 3 * C, 0);
    double scale = 1 / sqrt((double)HD);
    vd p(T), dp(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                int n = b * T + i;
                if (hi[n] <= lo[n]) continue;  // padding query: zeros
                const float* q = &qkv[(size_t)n * 3 * C + h * HD];
                double mx = -1e300, s = 0;
                for (int j = lo[n]; j < hi[n]; j++) {
                    const float* k = &qkv[((size_t)b * T + j) * 3 * C + C + h * HD];
                    double d = 0;
                    for (int e = 0; e < HD; e++) d += (double)q[e] * k[e];
                    p[j] = d * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int j = lo[n]; j < hi[n]; j++) {
                    p[j] = exp(p[j] - mx);
                    s += p[j];
                }
                lse[((size_t)b * NH + h) * T + i] = mx + log(s);
                for (int j = lo[n]; j < hi[n]; j++) p[j] /= s;
                for (int e = 0; e < HD; e++) {
                    double o = 0;
                    for (int j = lo[n]; j < hi[n]; j++)
                        o += p[j] * qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * HD + e];
                    out[(size_t)n * C + h * HD + e] = o;
                }
                // backward: dP = dO V^T, dS = P (dP - sum P dP) with sum P dP = dO . O (the kernel's O)
                const float* go = &dout[(size_t)n * C + h * HD];
                double delta = 0;
                for (int e = 0; e < HD; e++) delta += (double)go[e] * out_k[(size_t)n * C + h * HD + e];
                for (int j = lo[n]; j < hi[n]; j++) {
                    const float* v = &qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * HD];
                    double d = 0;
                    for (int e = 0; e < HD; e++) d += (double)go[e] * v[e];
                    double ds = p[j] * (d - delta);
                    for (int e = 0; e < HD; e++) {
                        dqkv[(size_t)n * 3 * C + h * HD + e] +=
                            scale * ds * qkv[((size_t)b * T + j) * 3 * C + C + h * HD + e];
                        dqkv[((size_t)b * T + j) * 3 * C + C + h * HD + e] += scale * ds * q[e];
                        dqkv[((size_t)b * T + j) * 3 * C + 2 * C + h * HD + e] += p[j] * go[e];
                    }
                }
            }
    // delta (B, NH, T) = rowsum(dO * O) for every row, padding rows included (the kernel's O, so no rounding but
    // the fp32 sum's)
    vd delta_ref((size_t)B * NH * T, 0);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++)
                for (int e = 0; e < HD; e++) {
                    size_t k = ((size_t)b * T + i) * C + h * HD + e;
                    delta_ref[((size_t)b * NH + h) * T + i] += (double)dout[k] * out_k[k];
                }
    // bf16: P and dS are rounded to bf16 before their products (2^-8 relative each)
    float tol = FP32 ? 1e-5f : 2e-2f;
    char w[96];
    snprintf(w, sizeof(w), "attention_forward T=%d HD=%d B=%d", T, HD, B);
    close_scaled(w, out_k, out, tol);
    snprintf(w, sizeof(w), "attention_forward lse T=%d HD=%d", T, HD);
    close_scaled(w, get_f(d_lse, (size_t)B * NH * T), lse, 1e-5f);
#ifndef MLM_FP32
    if (HD == 64 || HD == 128) {  // the wgmma candidate: the same checks, and bitwise repeatable
        floatX* d_out2 = dev_x((size_t)N * C);
        float* d_lse2 = dev_f((size_t)B * NH * T);
        std::vector<floatX> o1;
        for (int rep = 0; rep < 2; rep++) {
            launch_attention_forward((cudaStream_t)0, d_out2, d_lse2, d_qkv, d_lo, d_hi, B, T, NH, HD, ATT_WG_FWD);
            CUDA_CHECK(cudaGetLastError());
            CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<floatX> o((size_t)N * C);
            CUDA_CHECK(cudaMemcpy(o.data(), d_out2, o.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
            if (rep == 0) o1 = o;
            if (rep == 1)
                CHECK(!memcmp(o1.data(), o.data(), o.size() * sizeof(floatX)),
                      "attention_forward_wgmma T=%d HD=%d: a second run differs bit for bit", T, HD);
        }
        snprintf(w, sizeof(w), "attention_forward_wgmma T=%d HD=%d B=%d", T, HD, B);
        close_scaled(w, get_x(d_out2, (size_t)N * C), out, tol);
        snprintf(w, sizeof(w), "attention_forward_wgmma lse T=%d HD=%d", T, HD);
        close_scaled(w, get_f(d_lse2, (size_t)B * NH * T), lse, 1e-5f);
        cudaFree(d_out2);
        cudaFree(d_lse2);
    }
#endif
    snprintf(w, sizeof(w), "attention_backward: delta (the dQ kernel's) T=%d HD=%d", T, HD);
    close_scaled(w, get_f(d_delta, (size_t)B * NH * T), delta_ref, 1e-5f);
    snprintf(w, sizeof(w), "attention_backward dqkv T=%d HD=%d", T, HD);
    vf dqkv_k = get_x(d_dqkv, (size_t)N * 3 * C);
    close_scaled(w, dqkv_k, dqkv, FP32 ? 1e-5f : 3e-2f);
    // the qkv bias gradient: dbias0 + the column sums of the kernel's own dqkv (as stored), summed in double
    vd dbias_ref(dbias0.begin(), dbias0.end());
    for (int n = 0; n < N; n++)
        for (int j = 0; j < 3 * C; j++) dbias_ref[j] += dqkv_k[(size_t)n * 3 * C + j];
    snprintf(w, sizeof(w), "attention_backward dbias (dqkv's column sums) T=%d HD=%d", T, HD);
    close_scaled(w, get_f(d_dbias, (size_t)3 * C), dbias_ref, 1e-5f);
#ifndef MLM_FP32
    // the backward with the wgmma dQ and dK dV candidates (and, mixed, each with the other's mma.sync kernel: they
    // share delta and the bias partials' rows): the same checks, and bitwise repeatable
    static const int masks[] = {ATT_WG_DQ | ATT_WG_DKDV, ATT_WG_DQ, ATT_WG_DKDV};
    for (int mi = 0; HD == 64 && mi < (mixed ? 3 : 1); mi++) {
        int wg = masks[mi];
        const char* which = wg == ATT_WG_DQ ? "dq" : wg == ATT_WG_DKDV ? "dkdv" : "dq,dkdv";
        std::vector<floatX> d1;
        vf db1;
        for (int rep = 0; rep < 2; rep++) {
            CUDA_CHECK(cudaMemset(d_dqkv, 0xff, (size_t)N * 3 * C * sizeof(floatX)));
            CUDA_CHECK(cudaMemset(d_delta, 0xff, (size_t)B * NH * T * sizeof(float)));
            CUDA_CHECK(cudaMemcpy(d_dbias, dbias0.data(), dbias0.size() * sizeof(float), cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemset(d_part, 0xff, att_part_floats(B, T, C, HD) * sizeof(float)));
            launch_attention_backward((cudaStream_t)0, d_dqkv, d_dbias, d_delta, d_part, d_dout, d_qkv, d_out, d_lse,
                                      d_lo, d_hi, B, T, NH, HD, wg);
            CUDA_CHECK(cudaGetLastError());
            CUDA_CHECK(cudaDeviceSynchronize());
            if (rep == 0) d1 = get_x_raw(d_dqkv, (size_t)N * 3 * C), db1 = get_f(d_dbias, (size_t)3 * C);
        }
        CHECK(d1 == get_x_raw(d_dqkv, (size_t)N * 3 * C) && db1 == get_f(d_dbias, (size_t)3 * C),
              "attention_backward on wgmma: %s T=%d HD=%d: a second run differs bit for bit", which, T, HD);
        vf dq2 = get_x(d_dqkv, (size_t)N * 3 * C);
        snprintf(w, sizeof(w), "attention_backward on wgmma: %s: delta (the dQ kernel's) T=%d HD=%d", which, T, HD);
        close_scaled(w, get_f(d_delta, (size_t)B * NH * T), delta_ref, 1e-5f);
        snprintf(w, sizeof(w), "attention_backward on wgmma: %s dqkv T=%d HD=%d", which, T, HD);
        close_scaled(w, dq2, dqkv, 3e-2f);
        vd db_ref(dbias0.begin(), dbias0.end());
        for (int n = 0; n < N; n++)
            for (int j = 0; j < 3 * C; j++) db_ref[j] += dq2[(size_t)n * 3 * C + j];
        snprintf(w, sizeof(w), "attention_backward on wgmma: %s dbias T=%d HD=%d", which, T, HD);
        close_scaled(w, get_f(d_dbias, (size_t)3 * C), db_ref, 1e-5f);
    }
#endif
    cudaFree(d_qkv);
    cudaFree(d_dout);
    cudaFree(d_out);
    cudaFree(d_dqkv);
    cudaFree(d_lse);
    cudaFree(d_delta);
    cudaFree(d_part);
    cudaFree(d_dbias);
    cudaFree(d_lo);
    cudaFree(d_hi);
}

int main(void) {
    printf("test_attention (%s storage)\n", FLOATX_NAME);
    // T not a multiple of 64; a sample of length 1; packed rows; an all-padding row; several key tiles
    test_attention(77, 16, {{30, 1, 46}, {50}, {}});
    test_attention(130, 64, {{1, 129}, {64, 3, 40}}, 2, 1);
    test_attention(5, 32, {{5}, {1, 1, 1}});
    // head size 128: one sample fills a row (every tile unmasked); a warp (rows 0-15, one 16-token sample)
    // that sees one tile of the several its block visits; padding at the end of a row. Then rows where most
    // key tiles are empty: samples of 10 and 12 tokens (then padding). The fp32 build (exact fp32 products
    // over warp shuffles, slow on the CPU) runs smaller rows of the same kinds.
    if (!FP32) {
        test_attention(200, 128, {{200}, {16, 184}, {70, 60}}, 1);
        test_attention(300, 64, {shorts(29, 10), shorts(25, 12)}, 1);
        test_attention(256, 32, {{64, 64, 128}, shorts(16, 16)});
        test_attention(192, 64, {{192}, {5, 187}}, 1);  // full query tiles for the wgmma kernels too
    } else {
        test_attention(100, 128, {{100}, {16, 84}}, 1);
        test_attention(150, 64, {shorts(14, 10), shorts(12, 12)}, 1);
        test_attention(128, 32, {{32, 32, 64}, shorts(8, 16)}, 1);
    }
    test_attention(64, 16, {{64}, {63}, {1}});
    return test_summary();
}
