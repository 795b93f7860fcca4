// kernel_check.h: what the kernel tests share: device buffers of random values rounded to floatX,
// copies back to the host, a tolerance relative to the tensor's scale, and packed-row segments.
#pragma once
#include "../kernels.cuh"
#include "testing.h"
#include <vector>
typedef std::vector<float> vf;
typedef std::vector<double> vd;

static const int FP32 = sizeof(floatX) == 4;
static const float TOL = FP32 ? 1e-5f : 1e-2f;  // outputs stored as floatX, computed in fp32

static floatX hx(float f) { return (floatX)f; }
static float hf(floatX x) { return (float)x; }
// random values rounded to floatX (r) and their device copy
static floatX* dev_rand(vf* r, size_t n, float lo, float hi) {
    r->resize(n);
    test_fill(r->data(), n, lo, hi);
    std::vector<floatX> x(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = hx((*r)[i]);
        (*r)[i] = hf(x[i]);
    }
    floatX* d;
    CUDA_CHECK(cudaMalloc((void**)&d, n * sizeof(floatX)));
    CUDA_CHECK(cudaMemcpy(d, x.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    return d;
}
static floatX* dev_x(size_t n) {
    floatX* d;
    CUDA_CHECK(cudaMalloc((void**)&d, n * sizeof(floatX)));
    CUDA_CHECK(cudaMemset(d, 0, n * sizeof(floatX)));
    return d;
}
static float* dev_f(size_t n) {
    float* d;
    CUDA_CHECK(cudaMalloc((void**)&d, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(d, 0, n * sizeof(float)));
    return d;
}
static float* dev_f_fill(size_t n, float v) {  // n floats, each v (a gradient that kernels add to)
    std::vector<float> h(n, v);
    float* d = dev_f(n);
    CUDA_CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}
static int* dev_i(const std::vector<int>& v) {
    int* d;
    CUDA_CHECK(cudaMalloc((void**)&d, v.size() * sizeof(int) + 4));
    CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}
static vf get_x(const floatX* d, size_t n, size_t ld = 0, size_t cols = 0) {  // optional row stride
    if (!ld) {
        ld = n;
        cols = n;
    }
    size_t rows = n / cols;
    std::vector<floatX> x(rows * ld);
    CUDA_CHECK(cudaMemcpy(x.data(), d, x.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
    vf r(n);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) r[i * cols + j] = hf(x[i * ld + j]);
    return r;
}
static vf get_f(const float* d, size_t n) {
    vf r(n);
    CUDA_CHECK(cudaMemcpy(r.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return r;
}
static vf tof(const vd& v) { return vf(v.begin(), v.end()); }
static float maxabs(const vf& v) {
    float m = 0;
    for (float x : v) m = fmaxf(m, fabsf(x));
    return m;
}
// check with a tolerance relative to the tensor's scale (elements near 0 are sums of cancelling terms)
static void close_scaled(const char* what, const vf& got, const vd& want, float tol) {
    vf w = tof(want);
    check_close(what, got.data(), w.data(), w.size(), tol * fmaxf(maxabs(w), 1e-6f), tol);
}

// segments: rows of T with packed samples (lens per row); returns lo, hi (B*T)
static void segments(int B, int T, const std::vector<std::vector<int>>& rows, std::vector<int>* lo,
                     std::vector<int>* hi) {
    lo->assign((size_t)B * T, 0);
    hi->assign((size_t)B * T, 0);
    for (int b = 0; b < B; b++) {
        int s = 0;
        for (int n : rows[b]) {
            for (int t = s; t < s + n; t++) {
                (*lo)[b * T + t] = s;
                (*hi)[b * T + t] = s + n;
            }
            s += n;
        }
    }
}
