// testing.h: the tiny test harness every test binary uses.
// A check counts as one pass or one failure; test_summary() prints the closing
// line "N passed, N failed" and gives the exit code (non-zero on any failure).
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int tests_passed = 0, tests_failed = 0;

// CHECK(cond, fmt, ...): one check; the message says what was expected when it fails.
#define CHECK(cond, ...)                                \
    do {                                                \
        if (cond) {                                     \
            tests_passed++;                             \
        } else {                                        \
            tests_failed++;                             \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                        \
            printf("\n");                               \
        }                                               \
    } while (0)

// CUDA_OK(call): a CUDA runtime call that must succeed; the test stops if it does not.
#define CUDA_OK(call)                                                                            \
    do {                                                                                         \
        cudaError_t err_ = (call);                                                               \
        if (err_ != cudaSuccess) {                                                               \
            printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            tests_failed++;                                                                      \
            printf("%d passed, %d failed\n", tests_passed, tests_failed);                        \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

// check_close: one check over n values: |got - want| <= atol + rtol * |want| for every i.
// Prints the worst element on failure (and on success when TEST_VERBOSE is set).
static inline int check_close(const char* what, const float* got, const float* want, size_t n, float atol, float rtol) {
    size_t worst = 0, bad = 0;
    double worst_excess = -1e300;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        double tol = atol + rtol * fabs((double)want[i]);
        if (!(err <= tol)) bad++;  // NaN counts as bad
        double excess = isnan(err) ? 1e300 : err - tol;
        if (excess > worst_excess) {
            worst_excess = excess;
            worst = i;
        }
    }
    if (bad) {
        tests_failed++;
        printf("FAIL %s: %zu of %zu values off; worst [%zu] got %.9g want %.9g (atol %g rtol %g)\n", what, bad, n,
               worst, n ? got[worst] : 0.f, n ? want[worst] : 0.f, atol, rtol);
        return 0;
    }
    tests_passed++;
    if (getenv("TEST_VERBOSE") && n)
        printf("ok   %s: %zu values, worst [%zu] got %.9g want %.9g\n", what, n, worst, got[worst], want[worst]);
    return 1;
}

// Deterministic random numbers for test inputs (xorshift64*), uniform in [lo, hi).
static unsigned long long test_rng_state = 0x9E3779B97F4A7C15ull;
static inline float test_uniform(float lo, float hi) {
    test_rng_state ^= test_rng_state >> 12;
    test_rng_state ^= test_rng_state << 25;
    test_rng_state ^= test_rng_state >> 27;
    unsigned long long r = test_rng_state * 0x2545F4914F6CDD1Dull;
    return lo + (hi - lo) * (float)((r >> 40) * (1.0 / 16777216.0));
}
static inline void test_fill(float* x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = test_uniform(lo, hi);
}

static inline int test_summary(void) {
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed ? 1 : 0;
}
