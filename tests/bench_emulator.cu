// bench_emulator.cu: what the CPU runtime costs. Prints figures; asserts nothing (not a test).
//   raw fiber switch, barrier and shuffle cost per thread, thread start cost, and a kernel of
//   realistic shape: residual add + LayerNorm over (256 rows, 768 channels) in bf16.
// Run: ./build.sh cpu && build/bench_emulator   (EMU_THREADS=1 for one OS thread)
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdlib.h>
#include <time.h>
#include "../kernels.cuh"

extern "C" void emu_switch(void** save_sp, void* load_sp);  // cpu/runtime.cpp

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Raw switch: the main context and one fiber bounce control back and forth.
static void* main_sp;
static void* fiber_sp;
static void ping_pong_fiber(void) {
    for (;;) emu_switch(&fiber_sp, main_sp);
}

__global__ void barriers(int n, float* out) {
    float v = threadIdx.x;
    for (int i = 0; i < n; i++) __syncthreads();
    if (v < 0) out[0] = v;
}
__global__ void shuffles(int n, float* out) {
    float v = threadIdx.x;
    for (int i = 0; i < n; i++) v += __shfl_xor_sync(0xffffffffu, v, 1);
    if (v < 0) out[0] = v;
}
__global__ void empty_threads(float* out) {
    if (threadIdx.x > 100000) out[0] = 1.0f;
}

// out = LayerNorm(x + r) per row, with the sum x + r stored too. One warp per row of C channels;
// each lane reads 8 bf16 (16 bytes) at a time; statistics in fp32 by warp shuffles.
__global__ void residual_layernorm(__nv_bfloat16* out, __nv_bfloat16* sum, const __nv_bfloat16* x,
                                   const __nv_bfloat16* r, const float* w, const float* b, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const uint4* x4 = (const uint4*)(x + (size_t)row * C);
    const uint4* r4 = (const uint4*)(r + (size_t)row * C);
    uint4* s4 = (uint4*)(sum + (size_t)row * C);
    float acc = 0.0f, acc2 = 0.0f;
    for (int i = lane; i < C / 8; i += 32) {
        uint4 a = x4[i], c = r4[i], s;
        const __nv_bfloat16 *pa = (const __nv_bfloat16*)&a, *pc = (const __nv_bfloat16*)&c;
        __nv_bfloat16* ps = (__nv_bfloat16*)&s;
        for (int k = 0; k < 8; k++) {
            ps[k] = __float2bfloat16(__bfloat162float(pa[k]) + __bfloat162float(pc[k]));
            float v = __bfloat162float(ps[k]);
            acc += v;
            acc2 += v * v;
        }
        s4[i] = s;
    }
    for (int o = 16; o > 0; o /= 2) {
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
        acc2 += __shfl_xor_sync(0xffffffffu, acc2, o);
    }
    float mean = acc / C, rstd = rsqrtf(acc2 / C - mean * mean + 1e-12f);
    for (int i = lane; i < C / 8; i += 32) {
        uint4 s = s4[i], o;
        const __nv_bfloat16* ps = (const __nv_bfloat16*)&s;
        __nv_bfloat16* po = (__nv_bfloat16*)&o;
        for (int k = 0; k < 8; k++) {
            int c = i * 8 + k;
            po[k] = __float2bfloat16((__bfloat162float(ps[k]) - mean) * rstd * w[c] + b[c]);
        }
        ((uint4*)(out + (size_t)row * C))[i] = o;
    }
}

int main(void) {
    // 1. raw switch
    size_t stack_size = 64 * 1024;
    char* stack = (char*)malloc(stack_size);
    void** sp = (void**)(((uintptr_t)stack + stack_size) & ~(uintptr_t)15);
    *--sp = NULL;
    *--sp = (void*)&ping_pong_fiber;
    for (int i = 0; i < 6; i++) *--sp = NULL;
    fiber_sp = sp;
    const long iters = 20000000;
    double t0 = now();
    for (long i = 0; i < iters; i++) emu_switch(&main_sp, fiber_sp);
    double raw = (now() - t0) / (2.0 * iters);
    printf("raw fiber switch:            %6.1f ns  (%.0f M switches/s)\n", raw * 1e9, 1e-6 / raw);

    float* dout;
    cudaMalloc(&dout, 4);
    // 2. barrier and shuffle cost per thread (one block: one OS thread does all the work)
    int n = 2000;
    t0 = now();
    launch(barriers, dim3(1), dim3(1024), 0, (cudaStream_t)0, n, dout);
    double bar = (now() - t0) / (1024.0 * n);
    printf("__syncthreads, per thread:   %6.1f ns  (1024 threads, %d barriers)\n", bar * 1e9, n);
    t0 = now();
    launch(shuffles, dim3(1), dim3(1024), 0, (cudaStream_t)0, n, dout);
    double shf = (now() - t0) / (1024.0 * n);
    printf("__shfl_xor_sync, per thread: %6.1f ns  (1024 threads, %d shuffles)\n", shf * 1e9, n);
    int blocks = 2000;
    t0 = now();
    launch(empty_threads, dim3(blocks), dim3(1024), 0, (cudaStream_t)0, dout);
    double start = (now() - t0) / (1024.0 * blocks);
    printf("thread start+exit:           %6.1f ns  (%d blocks of 1024, all OS threads)\n", start * 1e9, blocks);

    // 3. residual + LayerNorm, (256, 768) bf16
    const int N = 256, C = 768;
    __nv_bfloat16 *x, *r, *o, *s;
    float *w, *b;
    cudaMalloc(&x, N * C * 2), cudaMalloc(&r, N * C * 2), cudaMalloc(&o, N * C * 2), cudaMalloc(&s, N * C * 2);
    cudaMalloc(&w, C * 4), cudaMalloc(&b, C * 4);
    for (int i = 0; i < N * C; i++) x[i] = __float2bfloat16((i % 13) * 0.1f), r[i] = __float2bfloat16((i % 7) * 0.2f);
    for (int i = 0; i < C; i++) w[i] = 1.0f, b[i] = 0.0f;
    int reps = 20;
    launch(residual_layernorm, dim3(N / 4), dim3(128), 0, (cudaStream_t)0, o, s, (const __nv_bfloat16*)x,
           (const __nv_bfloat16*)r, (const float*)w, (const float*)b, N, C);
    t0 = now();
    for (int i = 0; i < reps; i++)
        launch(residual_layernorm, dim3(N / 4), dim3(128), 0, (cudaStream_t)0, o, s, (const __nv_bfloat16*)x,
               (const __nv_bfloat16*)r, (const float*)w, (const float*)b, N, C);
    double ln = (now() - t0) / reps;
    printf("residual+LayerNorm 256x768:  %6.2f ms  per launch (bf16, one warp per row)\n", ln * 1e3);
    if (cudaGetLastError() != cudaSuccess) printf("(a kernel failed)\n");
    return 0;
}
