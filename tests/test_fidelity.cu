// tests/test_fidelity.cu: CUDA rules the CPU runtime must follow as a GPU does, checked so that the
// same file passes on a real H100 (build.sh also compiles it with nvcc) and on the CPU build.
//   1. Shared memory: without the opt-in a kernel has 48 KB of static plus dynamic shared memory
//      (16 KB static + 40 KB dynamic fails to launch, with cudaErrorInvalidValue); with
//      cudaFuncSetAttribute(MaxDynamicSharedMemorySize) static plus dynamic may reach 227 KB.
//   2. `extern __shared__` declared inside a template kernel.
//   3. __activemask() gives the lanes converged with the caller (never a lane of the other side of
//      a branch); a warp collective whose mask names lanes that have exited completes for the rest
//      (CUDA requires only the non-exited lanes of the mask to take part), and a vote counts only them
//      (the Programming Guide's warp vote functions evaluate the predicate "for all non-exited threads in
//      mask"): __all_sync(full, 1) is 1 and __any_sync(full, 0) is 0 after some lanes returned.
//   4. The fast-math intrinsics within the error bounds of the Programming Guide's intrinsics
//      tables, and their documented special cases; the _rn operations correctly rounded.
// The checks test the documented contract (bounds, subsets), not the CPU runtime's exact values.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "../kernels.cuh"
#include "testing.h"

// ---------------------------------------------------------------------------------------------
// 2. A template kernel with extern __shared__: block b reverses its slice of x through shared memory.
template <typename T>
__global__ void reverse_through_smem(T* out, const T* x) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    T* s = (T*)dyn_smem;
    int n = blockDim.x, t = threadIdx.x;
    s[t] = x[blockIdx.x * n + t];
    __syncthreads();
    out[blockIdx.x * n + t] = s[n - 1 - t];
}

template <typename T>
static void check_template_smem(const char* what) {
    const int blocks = 8, n = 64, total = blocks * n;
    T h[total], got[total];
    for (int i = 0; i < total; i++) h[i] = (T)(i * 3 + 1);
    T *dx, *dout;
    CUDA_OK(cudaMalloc(&dx, sizeof h));
    CUDA_OK(cudaMalloc(&dout, sizeof h));
    CUDA_OK(cudaMemcpy(dx, h, sizeof h, cudaMemcpyHostToDevice));
    launch(reverse_through_smem<T>, dim3(blocks), dim3(n), n * sizeof(T), (cudaStream_t)0, dout, (const T*)dx);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < n; t++) bad += got[b * n + t] != h[b * n + n - 1 - t];
    CHECK(bad == 0, "extern __shared__ in a template kernel (%s): %d of %d values wrong", what, bad, total);
    cudaFree(dx), cudaFree(dout);
}

// ---------------------------------------------------------------------------------------------
// 1. 16 KB of static shared memory (4096 floats) and `dyn` bytes of dynamic: out[i] sums both.
__global__ void static_and_dynamic_smem(float* out, int dyn_floats) {
    __shared__ float fixed[4096];
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    float* dyn = (float*)dyn_smem;
    int t = threadIdx.x;
    for (int i = t; i < 4096; i += blockDim.x) fixed[i] = 1.0f;
    for (int i = t; i < dyn_floats; i += blockDim.x) dyn[i] = 2.0f;
    __syncthreads();
    float s = 0.0f;
    for (int i = t; i < 4096; i += blockDim.x) s += fixed[i];
    for (int i = t; i < dyn_floats; i += blockDim.x) s += dyn[i];
    out[t] = s;
}

static void check_shared_memory_limits(void) {
    const int threads = 128;
    float* dout;
    CUDA_OK(cudaMalloc(&dout, threads * sizeof(float)));
    float got[threads];
    // launch_and_check: launch with `dyn` bytes; returns the launch's error and checks the sums when it ran.
    auto run = [&](size_t dyn, const char* what) -> cudaError_t {
        cudaGetLastError();
        int dyn_floats = (int)(dyn / 4);
        launch(static_and_dynamic_smem, dim3(1), dim3(threads), dyn, (cudaStream_t)0, dout, dyn_floats);
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess) {
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
            double total = 0;
            for (int i = 0; i < threads; i++) total += got[i];
            CHECK(total == 4096.0 + 2.0 * dyn_floats, "%s: shared memory sums to %g, want %g", what, total,
                  4096.0 + 2.0 * dyn_floats);
        }
        return e;
    };
    cudaError_t e = run(32 * 1024, "16 KB static + 32 KB dynamic");
    CHECK(e == cudaSuccess, "16 KB static + 32 KB dynamic (48 KB in all) launches: %s", cudaGetErrorName(e));
    e = run(40 * 1024, "16 KB static + 40 KB dynamic");
    CHECK(e == cudaErrorInvalidValue,
          "16 KB static + 40 KB dynamic without the opt-in must fail with cudaErrorInvalidValue: %s",
          cudaGetErrorName(e));
    CHECK(cudaGetLastError() == cudaSuccess, "the launch error is cleared by cudaGetLastError");
    CUDA_OK(cudaFuncSetAttribute(static_and_dynamic_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 40 * 1024));
    e = run(40 * 1024, "16 KB static + 40 KB dynamic, opted in");
    CHECK(e == cudaSuccess, "16 KB static + 40 KB dynamic after the opt-in launches: %s", cudaGetErrorName(e));
    e = run(40 * 1024 + 16, "above the opted-in size");
    CHECK(e == cudaErrorInvalidValue, "more dynamic shared memory than opted into fails: %s", cudaGetErrorName(e));
    // 227 KB in all: static + the opt-in may reach it, not pass it.
    const int most = 227 * 1024 - 16 * 1024;
    CHECK(cudaFuncSetAttribute(static_and_dynamic_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, most + 16) ==
              cudaErrorInvalidValue,
          "opting into 16 KB static + %d dynamic bytes (past 227 KB) is refused", most + 16);
    cudaGetLastError();
    CUDA_OK(cudaFuncSetAttribute(static_and_dynamic_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
    e = run(most, "16 KB static + 211 KB dynamic");
    CHECK(e == cudaSuccess, "16 KB static + 211 KB dynamic (227 KB) after the opt-in launches: %s",
          cudaGetErrorName(e));
    cudaFree(dout);
}

// ---------------------------------------------------------------------------------------------
// 3. Warp convergence. One warp of 32 threads; lanes >= live return at once.
__global__ void warp_masks(unsigned* out, int live) {
    int lane = threadIdx.x;
    if (lane >= live) return;
    unsigned branch;
    if (lane < 8) {  // two sides of a branch (written unlike, so no compiler merges the calls)
        branch = __activemask();
        out[lane * 4 + 2] = 1;
    } else {
        out[lane * 4 + 2] = 2;
        branch = __activemask();
    }
    __syncwarp(0xffffffffu);  // names the exited lanes too: completes for the others
    unsigned after = __activemask();
    int v = __shfl_xor_sync(0xffffffffu, lane, 1);  // lanes < live read lanes < live (live is even)
    unsigned ballot = __ballot_sync(0xffffffffu, 1);
    int all = __all_sync(0xffffffffu, 1) != 0, any = __any_sync(0xffffffffu, 0) != 0;  // (CUDA: "non-zero")
    out[lane * 6 + 0] = branch;
    out[lane * 6 + 1] = after;
    out[lane * 6 + 2] = (unsigned)v;
    out[lane * 6 + 3] = ballot;
    out[lane * 6 + 4] = (unsigned)all;
    out[lane * 6 + 5] = (unsigned)any;
}

static void check_warp_convergence(void) {
    const int lives[2] = {32, 20};
    unsigned* dout;
    CUDA_OK(cudaMalloc(&dout, 32 * 6 * sizeof(unsigned)));
    for (int k = 0; k < 2; k++) {
        int live = lives[k];
        unsigned live_mask = live == 32 ? 0xffffffffu : (1u << live) - 1, got[32 * 6];
        CUDA_OK(cudaMemset(dout, 0, sizeof got));
        launch(warp_masks, dim3(1), dim3(32), 0, (cudaStream_t)0, dout, live);
        cudaError_t e = cudaGetLastError();
        CHECK(e == cudaSuccess, "warp collectives with %d of 32 lanes live: launch %s", live, cudaGetErrorName(e));
        e = cudaDeviceSynchronize();
        CHECK(e == cudaSuccess, "warp collectives with %d of 32 lanes live: %s", live, cudaGetErrorName(e));
        if (e != cudaSuccess) continue;
        CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
        int bad_branch = 0, bad_after = 0, bad_shfl = 0, bad_ballot = 0, bad_all = 0, bad_any = 0;
        for (int l = 0; l < live; l++) {
            unsigned side = (l < 8 ? 0xffu : ~0xffu) & live_mask, me = 1u << l;
            bad_branch += !(got[l * 6] & me) || (got[l * 6] & ~side);  // own bit, nothing from the other side
            bad_after += !(got[l * 6 + 1] & me) || (got[l * 6 + 1] & ~live_mask);  // never an exited lane
            bad_shfl += got[l * 6 + 2] != (unsigned)(l ^ 1);
            bad_ballot += got[l * 6 + 3] != live_mask;  // exited lanes vote 0
            bad_all += got[l * 6 + 4] != 1;             // ... and are not asked: all of the live lanes' 1
            bad_any += got[l * 6 + 5] != 0;
        }
        CHECK(bad_branch == 0, "%d live lanes: __activemask in a branch names lanes outside it (%d lanes)", live,
              bad_branch);
        CHECK(bad_after == 0, "%d live lanes: __activemask names exited lanes (%d lanes)", live, bad_after);
        CHECK(bad_shfl == 0, "%d live lanes: full-mask __shfl_xor_sync after exits wrong on %d lanes", live, bad_shfl);
        CHECK(bad_ballot == 0, "%d live lanes: full-mask __ballot_sync after exits wrong on %d lanes", live,
              bad_ballot);
        CHECK(bad_all == 0 && bad_any == 0,
              "%d live lanes: __all_sync(full, 1) is not 1 on %d lanes, __any_sync(full, 0) not 0 on %d (exited "
              "lanes take no part)",
              live, bad_all, bad_any);
    }
    cudaFree(dout);
}

// ---------------------------------------------------------------------------------------------
// 4. Intrinsics. Each thread evaluates every intrinsic on its inputs (x[i], y[i]).
enum {
    I_EXP,
    I_EXP10,
    I_LOG,
    I_LOG2,
    I_LOG10,
    I_SIN,
    I_COS,
    I_TAN,
    I_POW,
    I_FDIVIDE,
    I_SINCOS_S,
    I_SINCOS_C,
    I_RCP,
    I_SQRT,
    I_RSQRT,
    I_ADD,
    I_SUB,
    I_MUL,
    I_DIV,
    I_FMA,
    I_SAT,
    N_INTRINSICS
};
static const char* intrinsic_names[N_INTRINSICS] = {
    "__expf",      "__exp10f",  "__logf",     "__log2f",         "__log10f",        "__sinf",    "__cosf",
    "__tanf",      "__powf",    "__fdividef", "__sincosf (sin)", "__sincosf (cos)", "__frcp_rn", "__fsqrt_rn",
    "__frsqrt_rn", "__fadd_rn", "__fsub_rn",  "__fmul_rn",       "__fdiv_rn",       "__fmaf_rn", "__saturatef"};

__global__ void intrinsics(float* out, const float* x, const float* y, const float* z, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = x[i], b = y[i], c = z[i], s, co;
    float* o = out + (size_t)i * N_INTRINSICS;
    o[I_EXP] = __expf(a);
    o[I_EXP10] = __exp10f(a);
    o[I_LOG] = __logf(b);
    o[I_LOG2] = __log2f(b);
    o[I_LOG10] = __log10f(b);
    o[I_SIN] = __sinf(a);
    o[I_COS] = __cosf(a);
    o[I_TAN] = __tanf(a);
    o[I_POW] = __powf(b, a);
    o[I_FDIVIDE] = __fdividef(a, b);
    __sincosf(a, &s, &co);
    o[I_SINCOS_S] = s;
    o[I_SINCOS_C] = co;
    o[I_RCP] = __frcp_rn(b);
    o[I_SQRT] = __fsqrt_rn(b);
    o[I_RSQRT] = __frsqrt_rn(b);
    o[I_ADD] = __fadd_rn(a, c);
    o[I_SUB] = __fsub_rn(a, c);
    o[I_MUL] = __fmul_rn(a, c);
    o[I_DIV] = __fdiv_rn(a, b);
    o[I_FMA] = __fmaf_rn(a, c, b);
    o[I_SAT] = __saturatef(c);
}

// One unit in the last place of the float nearest to v (v finite).
static double ulp_of(double v) {
    float f = fabsf((float)v);
    if (f < 0x1p-126f) return 0x1p-149;
    if (isinf(f)) f = 0x1.fffffep127f;
    return (double)nextafterf(f, INFINITY) - (double)f;
}

// The documented bound of intrinsic k at (a, b, c), and the exact value, in double.
static void intrinsic_bound(int k, double a, double b, double c, double* want, double* tol) {
    const double pi = 3.14159265358979323846;
    double ab = fabs(a);
    switch (k) {
        case I_EXP:  // max ulp error 2 + floor(abs(1.173 * x))
            *want = exp(a), *tol = (2 + floor(fabs(1.173 * a))) * ulp_of(*want);
            break;
        case I_EXP10:  // 2 + floor(abs(2.97 * x)) ulps
            *want = pow(10.0, a), *tol = (2 + floor(fabs(2.97 * a))) * ulp_of(*want);
            break;
        case I_LOG:  // x in [0.5, 2]: absolute error 2^-21.41; otherwise 3 ulps
            *want = log(b), *tol = (b >= 0.5 && b <= 2) ? pow(2, -21.41) : 3 * ulp_of(*want);
            break;
        case I_LOG2:  // x in [0.5, 2]: absolute 2^-22; otherwise 2 ulps
            *want = log2(b), *tol = (b >= 0.5 && b <= 2) ? pow(2, -22) : 2 * ulp_of(*want);
            break;
        case I_LOG10:  // x in [0.5, 2]: absolute 2^-24; otherwise 3 ulps
            *want = log10(b), *tol = (b >= 0.5 && b <= 2) ? pow(2, -24) : 3 * ulp_of(*want);
            break;
        case I_SIN:
        case I_SINCOS_S:  // x in [-pi, pi]: absolute 2^-21.41 (larger outside; not checked there)
            *want = sin(a), *tol = ab <= pi ? pow(2, -21.41) : 2;
            break;
        case I_COS:
        case I_SINCOS_C:  // x in [-pi, pi]: absolute 2^-21.19
            *want = cos(a), *tol = ab <= pi ? pow(2, -21.19) : 2;
            break;
        case I_TAN: {  // derived from __sinf(x) * (1 / __cosf(x)): the two errors, through the quotient
            double s = sin(a), co = cos(a);
            *want = s / co;
            *tol = ab <= pi ? (pow(2, -21.41) + fabs(*want) * pow(2, -21.19)) / (fabs(co) - pow(2, -21.19)) * 1.01 +
                                  3 * ulp_of(*want)
                            : INFINITY;
            break;
        }
        case I_POW: {  // derived from exp2f(y * __log2f(x)): log2's error, scaled by |y|, then exp2's
            double l = log2(b), e_log = (b >= 0.5 && b <= 2) ? pow(2, -22) : 2 * ulp_of(l);
            *want = pow(b, a);
            *tol = fabs(*want) * (exp2(fabs(a) * e_log + ulp_of(a * l)) - 1) * 1.01 + 4 * ulp_of(*want);
            break;
        }
        case I_FDIVIDE:  // |y| in [2^-126, 2^126]: 2 ulps
            *want = a / b, *tol = 2 * ulp_of(*want);
            break;
        case I_RCP:  // the _rn operations: IEEE round to nearest (half an ulp of the exact value)
            *want = 1.0 / b, *tol = 0.5 * ulp_of(*want);
            break;
        case I_SQRT:
            *want = sqrt(b), *tol = 0.5 * ulp_of(*want);
            break;
        case I_RSQRT:
            *want = 1.0 / sqrt(b), *tol = 0.5 * ulp_of(*want);
            break;
        case I_ADD:
            *want = a + c, *tol = 0.5 * ulp_of(*want);
            break;
        case I_SUB:
            *want = a - c, *tol = 0.5 * ulp_of(*want);
            break;
        case I_MUL:
            *want = a * c, *tol = 0.5 * ulp_of(*want);
            break;
        case I_DIV:
            *want = a / b, *tol = 0.5 * ulp_of(*want);
            break;
        case I_FMA:
            *want = a * c + b, *tol = 0.5 * ulp_of(*want);
            break;
        case I_SAT:
            *want = c < 0 ? 0 : (c > 1 ? 1 : c), *tol = 0;
            break;
    }
    *tol *= 1 + 1e-9;  // the double reference's own rounding
}

static float* to_device(const float* h, int n) {
    float* d;
    CUDA_OK(cudaMalloc(&d, n * sizeof(float)));
    CUDA_OK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static void check_intrinsics(void) {
    // Inputs: x (exp, trig, pow exponent, dividend) in [-9, 9] and some in [-pi, pi]; y > 0 spanning
    // [2^-20, 2^20] (log arguments, divisor, pow base); z in [-2, 2] (saturate also sees NaN, 5, -3).
    const int n = 4096;
    static float hx[n], hy[n], hz[n], got[n * N_INTRINSICS];
    for (int i = 0; i < n; i++) {
        hx[i] = i % 2 ? test_uniform(-9.0f, 9.0f) : test_uniform(-3.14159f, 3.14159f);
        hy[i] = exp2f(test_uniform(-20.0f, 20.0f));
        hz[i] = test_uniform(-2.0f, 2.0f);
        if (i % 3 == 0) hy[i] = test_uniform(0.5f, 2.0f);
    }
    hz[0] = NAN, hz[1] = 5.0f, hz[2] = -3.0f, hz[3] = 1.0f, hz[4] = 0.0f;
    float *dx = to_device(hx, n), *dy = to_device(hy, n), *dz = to_device(hz, n), *dout;
    CUDA_OK(cudaMalloc(&dout, sizeof got));
    launch(intrinsics, dim3(n / 128), dim3(128), 0, (cudaStream_t)0, dout, (const float*)dx, (const float*)dy,
           (const float*)dz, n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    for (int k = 0; k < N_INTRINSICS; k++) {
        int bad = 0, first = 0;
        for (int i = 0; i < n; i++) {
            double want, tol;
            intrinsic_bound(k, hx[i], hy[i], hz[i], &want, &tol);
            if (k == I_SAT && isnan(hz[i])) want = 0;  // __saturatef(NaN) = 0 (PTX .sat: NaN becomes +0)
            double g = got[(size_t)i * N_INTRINSICS + k];
            bool ok = (isnan(want) && isnan(g)) || fabs(g - want) <= tol;  // NaN in, NaN out
            if (!ok && bad++ == 0) first = i;
        }
        double want, tol;
        intrinsic_bound(k, hx[first], hy[first], hz[first], &want, &tol);
        CHECK(bad == 0,
              "%s: %d of %d values outside the documented bound; first at x=%.9g y=%.9g z=%.9g: got %.9g want %.9g "
              "(bound %.3g)",
              intrinsic_names[k], bad, n, hx[first], hy[first], hz[first], got[(size_t)first * N_INTRINSICS + k], want,
              tol);
    }
    cudaFree(dx), cudaFree(dy), cudaFree(dz), cudaFree(dout);
}

// The documented special cases, exactly: __fdividef(x, y) is 0 for 2^126 < |y| < 2^128, and NaN
// there when x is infinite; __powf of a negative base is NaN (it is exp2f(y * __log2f(x))).
__global__ void intrinsic_specials(float* out, const float* in) {
    out[0] = __fdividef(in[0], in[1]);  // 3 / 2^127
    out[1] = __fdividef(in[0], in[2]);  // 3 / -1.5 * 2^127
    out[2] = __fdividef(in[3], in[1]);  // inf / 2^127
    out[3] = __fdividef(in[0], in[4]);  // 3 / 2^125: within range, 2 ulps
    out[4] = __powf(in[5], in[6]);      // (-2)^2
    out[5] = __saturatef(in[7]);        // NaN
}

static void check_intrinsic_specials(void) {
    float h[8] = {3.0f, 0x1p127f, -0x1.8p127f, INFINITY, 0x1p125f, -2.0f, 2.0f, NAN}, got[6];
    float *din = to_device(h, 8), *dout;
    CUDA_OK(cudaMalloc(&dout, sizeof got));
    launch(intrinsic_specials, dim3(1), dim3(1), 0, (cudaStream_t)0, dout, (const float*)din);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(got[0] == 0.0f && got[1] == 0.0f, "__fdividef(3, y) for 2^126 < |y| < 2^128: got %g and %g, want 0", got[0],
          got[1]);
    CHECK(isnan(got[2]), "__fdividef(inf, 2^127): got %g, want NaN", got[2]);
    double want = 3.0 / 0x1p125;
    CHECK(fabs(got[3] - want) <= 2 * ulp_of(want), "__fdividef(3, 2^125): got %g, want %g within 2 ulps", got[3], want);
    CHECK(isnan(got[4]), "__powf(-2, 2): got %g, want NaN (exp2f(y * __log2f(x)))", got[4]);
    CHECK(got[5] == 0.0f && !signbit(got[5]), "__saturatef(NaN): got %g, want +0", got[5]);
    cudaFree(din), cudaFree(dout);
}

int main(void) {
    check_template_smem<float>("float");
    check_template_smem<int>("int");
    check_shared_memory_limits();
    check_warp_convergence();
    check_intrinsics();
    check_intrinsic_specials();
    return test_summary();
}
