// cpu/include/cuda_runtime.h: the CPU build's stand-in for the toolkit's <cuda_runtime.h>.
//
// The CPU build puts cpu/include first on the include path, so every `#include <cuda_runtime.h>`
// in the project lands here. The runtime API itself (cudaMalloc, streams, events...) keeps the
// toolkit's real prototypes from <cuda_runtime_api.h> and is implemented in cpu/runtime.cpp.
// This header adds what nvcc would otherwise provide to device code:
//   - the qualifiers (__global__, __device__, __shared__ ...),
//   - the built-in variables threadIdx, blockIdx, blockDim, gridDim, warpSize,
//   - barriers, warp shuffles/votes, atomics, and the device intrinsics the kernels use,
//   - launch(kernel, grid, block, smem, stream, args...), which runs a kernel on the emulator:
//     every CUDA thread is a fiber; a block's fibers run on one OS thread, switching only at
//     barriers and warp collectives; blocks are spread over a few OS threads.
// Environment: EMU_THREADS (OS threads for blocks, default: cores), EMU_SHUFFLE=seed (run the
// threads of a block in a random order between barriers, to expose a missing __syncthreads),
// EMU_DEVICE_BYTES (emulated device memory, default half the host's RAM), EMU_STACK_KB (fiber stack size).
#pragma once
#define __CUDA_RUNTIME_H__  // keep the toolkit's cuda_runtime.h out (cuda_bf16.h would include it)
#include <cuda_runtime_api.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <tuple>

// ----------------------------------------------------------------------------
// Qualifiers. __shared__ variables are thread_local: the fibers of one block all run on one OS
// thread, so they share it, and blocks running on other OS threads get their own copy.
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __managed__
#undef __grid_constant__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ thread_local
#define __constant__
#define __managed__
#define __grid_constant__
#define __launch_bounds__(...)

// The one name under which kernels declare dynamic shared memory:
//     extern __shared__ __align__(16) unsigned char dyn_smem[];
// It is a per-OS-thread buffer of the H100's maximum (227 KB). Each launch fills the requested
// bytes with 0xFF (floats read as NaN if used before written) and, under AddressSanitizer,
// poisons the rest, so reading past the requested size is reported.
#define EMU_MAX_DYNAMIC_SMEM (227 * 1024)
extern thread_local __attribute__((aligned(128))) unsigned char dyn_smem[EMU_MAX_DYNAMIC_SMEM];

// ----------------------------------------------------------------------------
// Built-in variables: set by the scheduler before it switches into a thread's fiber.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
static constexpr int warpSize = 32;

// ----------------------------------------------------------------------------
// Barriers and warp collectives (cpu/runtime.cpp). A thread arriving at one yields to the
// scheduler until its group is complete; the last to arrive computes every member's result.
enum emu_warp_op {
    EMU_WARP_SYNC,
    EMU_SHFL_IDX,
    EMU_SHFL_UP,
    EMU_SHFL_DOWN,
    EMU_SHFL_XOR,
    EMU_VOTE_BALLOT,
    EMU_WARP_GATHER
};
int emu_syncthreads(int op, int predicate);  // op: 0 plain, 1 count, 2 and, 3 or
uint64_t emu_warp_collective(int op, unsigned mask, uint64_t value, int arg, int width, const char* name);
// Every lane of mask posts a pointer; once all have arrived, fn runs once on all 32 (NULL where absent).
void emu_warp_gather(unsigned mask, void* mine, void (*fn)(void* const* all), const char* name);
unsigned emu_activemask(void);
int emu_lane_id(void);
// A misuse inside a kernel (bad alignment, bad mask...): reported once per block, the launch fails.
void emu_kernel_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

static inline void __syncthreads(void) { emu_syncthreads(0, 0); }
static inline int __syncthreads_count(int p) { return emu_syncthreads(1, p); }
static inline int __syncthreads_and(int p) { return emu_syncthreads(2, p); }
static inline int __syncthreads_or(int p) { return emu_syncthreads(3, p); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu_warp_collective(EMU_WARP_SYNC, mask, 0, 0, 32, "__syncwarp");
}
static inline unsigned __activemask(void) { return emu_activemask(); }
static inline unsigned __ballot_sync(unsigned mask, int p) {
    return (unsigned)emu_warp_collective(EMU_VOTE_BALLOT, mask, p != 0, 0, 32, "__ballot_sync");
}
// Votes count "all non-exited threads in mask" (CUDA's warp vote functions): an exited lane is no vote,
// so all is "no live lane voted false", not "every lane of the mask voted true".
static inline int __any_sync(unsigned mask, int p) {
    return emu_warp_collective(EMU_VOTE_BALLOT, mask, p != 0, 0, 32, "__any_sync") != 0;
}
static inline int __all_sync(unsigned mask, int p) {
    return emu_warp_collective(EMU_VOTE_BALLOT, mask, p == 0, 0, 32, "__all_sync") == 0;
}

// Shuffles move up to 8 bytes of any trivially copyable type, as the CUDA templates do.
template <typename T>
static inline T emu_shfl(int op, unsigned mask, T var, int arg, int width, const char* name) {
    static_assert(sizeof(T) <= 8, "shuffle of a type larger than 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &var, sizeof(T));
    bits = emu_warp_collective(op, mask, bits, arg, width, name);
    T out;
    memcpy((void*)&out, &bits, sizeof(T));
    return out;
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
    return emu_shfl(EMU_SHFL_IDX, mask, var, src_lane, width, "__shfl_sync");
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return emu_shfl(EMU_SHFL_UP, mask, var, (int)delta, width, "__shfl_up_sync");
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return emu_shfl(EMU_SHFL_DOWN, mask, var, (int)delta, width, "__shfl_down_sync");
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    return emu_shfl(EMU_SHFL_XOR, mask, var, lane_mask, width, "__shfl_xor_sync");
}

// ----------------------------------------------------------------------------
// Memory fences: blocks on other OS threads see writes through the hardware's ordering.
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __trap(void) { fprintf(stderr, "cpu runtime: __trap() in a kernel\n"), abort(); }
static inline void __nanosleep(unsigned) {}

// Atomics: real hardware atomics, since blocks run concurrently on several OS threads.
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <typename T, typename Op>
static inline T emu_atomic_cas_loop(T* p, Op op) {  // read, compute op(old), swap in if unchanged
    T old, want;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
        want = op(old);
    } while (!__atomic_compare_exchange(p, &old, &want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
static inline float atomicAdd(float* p, float v) {
    uint32_t* u = (uint32_t*)p;
    uint32_t old = emu_atomic_cas_loop(u, [v](uint32_t o) {
        float f;
        memcpy(&f, &o, 4);
        f += v;
        memcpy(&o, &f, 4);
        return o;
    });
    float f;
    memcpy(&f, &old, 4);
    return f;
}
static inline double atomicAdd(double* p, double v) {
    uint64_t* u = (uint64_t*)p;
    uint64_t old = emu_atomic_cas_loop(u, [v](uint64_t o) {
        double f;
        memcpy(&f, &o, 8);
        f += v;
        memcpy(&o, &f, 8);
        return o;
    });
    double f;
    memcpy(&f, &old, 8);
    return f;
}
static inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
    uint16_t* u = (uint16_t*)p;
    uint16_t old = emu_atomic_cas_loop(u, [v](uint16_t o) {
        __nv_bfloat16 b;
        memcpy((void*)&b, &o, 2);
        b = __float2bfloat16(__bfloat162float(b) + __bfloat162float(v));
        memcpy(&o, (void*)&b, 2);
        return o;
    });
    __nv_bfloat16 b;
    memcpy((void*)&b, &old, 2);
    return b;
}
static inline int atomicCAS(int* p, int cmp, int v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
static inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp, unsigned long long v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
static inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
static inline float atomicExch(float* p, float v) {
    uint32_t u, old;
    memcpy(&u, &v, 4);
    old = __atomic_exchange_n((uint32_t*)p, u, __ATOMIC_RELAXED);
    memcpy(&v, &old, 4);
    return v;
}
static inline int atomicMax(int* p, int v) {
    return emu_atomic_cas_loop(p, [v](int o) { return o > v ? o : v; });
}
static inline int atomicMin(int* p, int v) {
    return emu_atomic_cas_loop(p, [v](int o) { return o < v ? o : v; });
}
static inline unsigned atomicMax(unsigned* p, unsigned v) {
    return emu_atomic_cas_loop(p, [v](unsigned o) { return o > v ? o : v; });
}
static inline unsigned atomicMin(unsigned* p, unsigned v) {
    return emu_atomic_cas_loop(p, [v](unsigned o) { return o < v ? o : v; });
}

// ----------------------------------------------------------------------------
// Loads and stores with cache hints are plain loads and stores here.
template <typename T>
static inline T __ldg(const T* p) {
    return *p;
}
template <typename T>
static inline T __ldcg(const T* p) {
    return *p;
}
template <typename T>
static inline T __ldca(const T* p) {
    return *p;
}
template <typename T>
static inline T __ldcs(const T* p) {
    return *p;
}
template <typename T>
static inline T __ldlu(const T* p) {
    return *p;
}
template <typename T>
static inline void __stcg(T* p, T v) {
    *p = v;
}
template <typename T>
static inline void __stcs(T* p, T v) {
    *p = v;
}
template <typename T>
static inline void __stwb(T* p, T v) {
    *p = v;
}

// Math intrinsics (CUDA Programming Guide, "Intrinsic Functions"). The GPU's fast approximations
// (__expf ... __powf) are computed here in double and rounded once: within their documented error
// bounds (a test may rely on those bounds, never on these exact values). Their documented special
// cases are kept: __fdividef(x, y) is 0 (NaN for an infinite x) for 2^126 < |y|, and __powf(x, y)
// is exp2(y * log2(x)), so NaN for x < 0. The _rn operations are IEEE round-to-nearest, as here.
// glibc's <math.h> declares __expf & co. (extern "C", never defined for programs), hence the
// matching extern "C" inline definitions.
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float x, float y) {
    if (fabsf(y) > 0x1p126f) return x * copysignf(0.0f, y);  // 1/y flushes to 0: 0, or NaN for x = inf
    return (float)((double)x / (double)y);
}
extern "C" inline float __expf(float x) noexcept { return (float)exp((double)x); }
extern "C" inline float __exp10f(float x) noexcept { return (float)exp10((double)x); }
extern "C" inline float __logf(float x) noexcept { return (float)log((double)x); }
extern "C" inline float __log2f(float x) noexcept { return (float)log2((double)x); }
extern "C" inline float __log10f(float x) noexcept { return (float)log10((double)x); }
extern "C" inline float __powf(float x, float y) noexcept { return (float)exp2((double)y * log2((double)x)); }
extern "C" inline float __sinf(float x) noexcept { return (float)sin((double)x); }
extern "C" inline float __cosf(float x) noexcept { return (float)cos((double)x); }
extern "C" inline float __tanf(float x) noexcept { return (float)tan((double)x); }
extern "C" inline void __sincosf(float x, float* s, float* c) noexcept {
    *s = (float)sin((double)x);
    *c = (float)cos((double)x);
}
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __frsqrt_rn(float x) { return (float)(1.0 / sqrt((double)x)); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x > 0.f ? (x < 1.f ? x : 1.f) : 0.f; }  // NaN -> 0
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
static inline float __int_as_float(int x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static inline int __float_as_int(float x) {
    int i;
    memcpy(&i, &x, 4);
    return i;
}
static inline float __uint_as_float(unsigned x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static inline unsigned __float_as_uint(float x) {
    unsigned i;
    memcpy(&i, &x, 4);
    return i;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
long long clock64(void);

// bf16 functions that cuda_bf16.h offers only to device code: computed in float, rounded once.
static inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
    return __float2bfloat16(fmaf(__bfloat162float(a), __bfloat162float(b), __bfloat162float(c)));
}
static inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
    return __halves2bfloat162(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}
static inline __nv_bfloat16 hexp(__nv_bfloat16 a) { return __float2bfloat16(expf(__bfloat162float(a))); }
static inline __nv_bfloat16 hsqrt(__nv_bfloat16 a) { return __float2bfloat16(sqrtf(__bfloat162float(a))); }
static inline __nv_bfloat16 hrsqrt(__nv_bfloat16 a) { return __float2bfloat16(1.0f / sqrtf(__bfloat162float(a))); }

// Emulator control, for the CPU runtime's own tests: 0 runs threads in order, any other seed in a
// fresh random order every round between barriers (as EMU_SHUFFLE=seed does).
void emu_set_shuffle(long long seed);

// ----------------------------------------------------------------------------
// Kernel launch. The arguments are converted to the kernel's parameter types once, as the GPU
// copies them into its parameter space, and every thread calls the kernel with that copy. The copy
// lives on the heap: the launch returns before the kernel runs (on its stream's worker), which frees
// it with free_call when the kernel is done.
typedef void (*emu_kernel_body)(void* call);
// Launch counts (a proxy for what a GPU step costs in launches): emu_launch_count(EMU_COUNT_KERNELS) is the
// kernels launched so far by this process (accepted launches; one refused for a bad configuration is not
// counted), emu_launch_count(EMU_COUNT_MATMULS) the cublasLtMatmul calls accepted (cpu/cublas.cpp counts them
// with emu_count_matmul). With EMU_LAUNCH_STATS=1 the process prints both on stderr when it exits:
// "emu: EMU_LAUNCH_STATS: N kernel launches, K cuBLASLt matmuls"; with EMU_LAUNCH_STATS=2 also a line per kernel,
// sorted by name: "emu: kernel NAME: L launches, block (x,y,z), up to G blocks and S bytes of dynamic shared memory
// a launch" (the largest block it was launched with; tools/kernel_report.py --all reads these).
// emu_kernel_launches(kernel, &block, &smem) gives one kernel's launches, largest block and dynamic shared memory.
// Not part of CUDA: tests and tools only.
enum { EMU_COUNT_KERNELS = 0, EMU_COUNT_MATMULS = 1 };
long long emu_launch_count(int what);
long long emu_kernel_launches(const void* kernel, dim3* block, size_t* smem);
void emu_count_matmul(void);
void emu_launch(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, emu_kernel_body body,
                void* call, void (*free_call)(void* call));

template <typename... KArgs>
struct emu_call {
    void (*kernel)(KArgs...);
    std::tuple<KArgs...> args;
};
template <typename... KArgs>
static void emu_call_body(void* p) {
    emu_call<KArgs...>* c = (emu_call<KArgs...>*)p;
    std::apply(c->kernel, c->args);
}
template <typename... KArgs>
static void emu_call_free(void* p) {
    delete (emu_call<KArgs...>*)p;
}
template <typename... KArgs, typename... Args>
static inline void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                          Args... args) {
    emu_call<KArgs...>* call = new emu_call<KArgs...>{kernel, std::tuple<KArgs...>(args...)};
    emu_launch((const void*)kernel, grid, block, smem_bytes, stream, emu_call_body<KArgs...>, call,
               emu_call_free<KArgs...>);
}

// cudaFuncSetAttribute for kernel function pointers (the toolkit's template lives in cuda_runtime.h).
template <typename T>
static inline cudaError_t cudaFuncSetAttribute(T* entry, enum cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void*)entry, attr, value);
}

// The typed allocation helpers the toolkit's cuda_runtime.h declares for C++.
template <typename T>
static inline cudaError_t cudaMalloc(T** ptr, size_t size) {
    return cudaMalloc((void**)ptr, size);
}
template <typename T>
static inline cudaError_t cudaMallocHost(T** ptr, size_t size) {
    return cudaMallocHost((void**)ptr, size);
}
template <typename T>
static inline cudaError_t cudaHostAlloc(T** ptr, size_t size, unsigned int flags) {
    return cudaHostAlloc((void**)ptr, size, flags);
}
