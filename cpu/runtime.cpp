// cpu/runtime.cpp: the CUDA runtime on the CPU, and the emulator that runs kernels.
//
// Memory: device memory is host memory, counted against an emulated device size; copies and
// memsets check that their device ranges lie inside one cudaMalloc'ed buffer, as the GPU would
// fault otherwise. Streams run as on a GPU: a worker thread per stream runs its queue in order, and
// calls return before their work is done (see "Streams" at the end of this file).
//
// Kernels: every CUDA thread is a fiber (its own stack, a 6-register context switch). A block's
// fibers run on one OS thread under a scheduler loop: each runnable fiber runs until it exits or
// waits at a barrier or warp collective, then control returns to the scheduler. A barrier
// completes when every thread of the block has arrived or exited; a warp collective completes when
// every lane named in its mask has arrived at it, and the last to arrive computes everyone's
// result. If no fiber can run while some still wait, the block is deadlocked: the scheduler
// says who waits where and the launch fails, instead of hanging. Blocks are taken in order from a
// shared counter by EMU_THREADS OS threads.
#include <cuda_runtime.h>
#include "emu_stream.h"
#include <ptx.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <math.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

// ----------------------------------------------------------------------------
// The H100 limits the emulator enforces and reports.
enum {
    MAX_THREADS_PER_BLOCK = 1024,
    MAX_BLOCK_X = 1024,
    MAX_BLOCK_Y = 1024,
    MAX_BLOCK_Z = 64,
    MAX_GRID_Y = 65535,
    MAX_GRID_Z = 65535,
    DEFAULT_DYNAMIC_SMEM = 48 * 1024,         // without the kernel's opt-in
    MAX_DYNAMIC_SMEM = EMU_MAX_DYNAMIC_SMEM,  // 227 KB, with cudaFuncSetAttribute
};
static const long long MAX_GRID_X = 2147483647LL;

thread_local __attribute__((aligned(128))) unsigned char dyn_smem[EMU_MAX_DYNAMIC_SMEM];
// The TLS init function of dyn_smem (it has none: it is zero-initialized). g++ 12 calls it without
// checking that it exists from a template kernel that declares `extern __shared__ ... dyn_smem[]`
// (a weak undefined symbol, so the call jumps to address 0); defining it as a no-op makes that work.
extern "C++" void emu_dyn_smem_tls_init(void) __asm__("_ZTH8dyn_smem");
void emu_dyn_smem_tls_init(void) {}
thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
long long clock64(void) { return (long long)(now_seconds() * 1e9); }

// env_ll: the integer variable NAME (dflt when unset or empty), from lo to hi inclusive, in the type it is
// used as: a decimal or exponent form (94e9 as well as 1024) that is a whole number; NaN, infinities, fractions
// and values outside [lo, hi] are refused, naming the variable and the range (unit: what it counts), as is
// anything not a number. Checked in double before the conversion, so that 1e30 or 2^64 cannot wrap.
static long long env_ll(const char* name, long long dflt, long long lo, long long hi, const char* unit) {
    const char* s = getenv(name);
    if (!s || !*s) return dflt;
    char* end;
    double v = strtod(s, &end);
    if (end == s || *end || v < 0) {  // (NaN goes on to the range's message)
        fprintf(stderr, "cpu runtime: %s=%s is not a non-negative number: expected an integer from %lld to %lld (%s)\n",
                name, s, lo, hi, unit);
        exit(1);  // a configuration error (exit code 2 is the trainer's divergence)
    }
    if (!(v >= (double)lo && v <= (double)hi) || v != floor(v)) {
        fprintf(stderr, "cpu runtime: %s=%s is out of range: expected an integer from %lld to %lld (%s)\n", name, s, lo,
                hi, unit);
        exit(1);
    }
    return (long long)v;
}

// ----------------------------------------------------------------------------
// Errors. As on the GPU, the last error is per host thread; kernel failures are reported by the
// next cudaGetLastError/cudaPeekAtLastError and by synchronizing calls.
static thread_local cudaError_t last_error = cudaSuccess;
static cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess && last_error == cudaSuccess) last_error = e;
    return e;
}
// fail(): an API call was misused; say why on stderr (the GPU would only return the code).
static cudaError_t fail(cudaError_t e, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cpu runtime: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return set_error(e);
}
// Errors of work that ran on a stream's worker (a kernel that deadlocked or misused a collective):
// device-wide, returned by every later synchronizing call and by cudaGetLastError, which clears it
// (on the GPU such errors are sticky for good; the emulator's tests go on after one).
static int async_error = cudaSuccess;  // atomic
static void set_async_error(cudaError_t e) {
    int none = cudaSuccess;
    __atomic_compare_exchange_n(&async_error, &none, (int)e, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static cudaError_t pending_error(void) {
    cudaError_t a = (cudaError_t)__atomic_load_n(&async_error, __ATOMIC_SEQ_CST);
    return a != cudaSuccess ? a : last_error;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e = pending_error();
    last_error = cudaSuccess;
    __atomic_store_n(&async_error, (int)cudaSuccess, __ATOMIC_SEQ_CST);
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return pending_error(); }

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess:
            return "cudaSuccess";
        case cudaErrorInvalidValue:
            return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation:
            return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration:
            return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevice:
            return "cudaErrorInvalidDevice";
        case cudaErrorInvalidResourceHandle:
            return "cudaErrorInvalidResourceHandle";
        case cudaErrorInvalidMemcpyDirection:
            return "cudaErrorInvalidMemcpyDirection";
        case cudaErrorLaunchFailure:
            return "cudaErrorLaunchFailure";
        case cudaErrorIllegalInstruction:
            return "cudaErrorIllegalInstruction";
        case cudaErrorNotReady:
            return "cudaErrorNotReady";
        case cudaErrorInvalidDeviceFunction:
            return "cudaErrorInvalidDeviceFunction";
        default:
            return "cudaErrorUnknown";
    }
}
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess:
            return "no error";
        case cudaErrorInvalidValue:
            return "invalid argument";
        case cudaErrorMemoryAllocation:
            return "out of memory";
        case cudaErrorInvalidConfiguration:
            return "invalid configuration argument";
        case cudaErrorInvalidDevice:
            return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle:
            return "invalid resource handle";
        case cudaErrorInvalidMemcpyDirection:
            return "invalid copy direction for memcpy";
        case cudaErrorLaunchFailure:
            return "unspecified launch failure";
        case cudaErrorIllegalInstruction:
            return "an illegal instruction was encountered";
        case cudaErrorNotReady:
            return "device not ready";
        case cudaErrorInvalidDeviceFunction:
            return "invalid device function";
        default:
            return "unknown error";
    }
}

// ----------------------------------------------------------------------------
// Device memory: every allocation is remembered (start -> size) so that copies can be checked.
static std::mutex mem_lock;
// (never destroyed: stream workers may still run while exit() runs the static destructors)
static std::map<uintptr_t, size_t>& device_allocs = *new std::map<uintptr_t, size_t>;
static long long device_used = 0;
// The host's memory: physical memory (sysconf), or the memory cgroup's limit when lower (a container,
// a Slurm job with --mem). 0 when neither can be read.
long long emu_host_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    long long host = pages > 0 && page > 0 ? (long long)pages * page : 0;
    const char* limits[] = {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (const char* path : limits) {
        FILE* f = fopen(path, "r");
        long long v;
        if (!f) continue;
        if (fscanf(f, "%lld", &v) == 1 && v > 0 && (host == 0 || v < host)) host = v;  // "max" reads as no number
        fclose(f);
    }
    return host;
}
// The emulated device's size: EMU_DEVICE_BYTES, or by default half of the host's memory. The trainer
// sizes its micro-batch to what cudaMemGetInfo says is free, and here device memory is host memory:
// half leaves the other half to the shards' page cache, the pinned batch ring, the loader threads
// and the rest of the machine. Physical memory rather than what is free now, so that the automatic
// micro-batch (and so the run) is the same every time on one machine. Several processes on one host
// (SLURM_NTASKS=2 ...) each get this much: set EMU_DEVICE_BYTES for them. (An H100 NVL: 94e9.)
static long long device_bytes(void) {
    static long long total = env_ll("EMU_DEVICE_BYTES", emu_host_memory_bytes() > 0 ? emu_host_memory_bytes() / 2 : 8e9,
                                    1, 1LL << 60, "bytes of emulated device memory, at most 2^60");
    return total;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
    if (!ptr) return fail(cudaErrorInvalidValue, "cudaMalloc: NULL output pointer");
    *ptr = NULL;
    std::lock_guard<std::mutex> g(mem_lock);
    if (device_used + (long long)size > device_bytes()) {
        fprintf(stderr,
                "cpu runtime: cudaMalloc(%zu bytes): out of emulated device memory (%lld of %lld bytes in use)\n", size,
                device_used, device_bytes());
        return set_error(cudaErrorMemoryAllocation);
    }
    void* p = NULL;
    // Exactly `size` bytes (at 256-byte alignment, as cudaMalloc), so AddressSanitizer sees overruns.
    if (posix_memalign(&p, 256, size ? size : 1) != 0) return set_error(cudaErrorMemoryAllocation);
    device_allocs[(uintptr_t)p] = size;
    device_used += size;
    *ptr = p;
    return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    cudaDeviceSynchronize();  // as on the GPU: no queued work may still use it
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = device_allocs.find((uintptr_t)p);
    if (it == device_allocs.end()) return fail(cudaErrorInvalidValue, "cudaFree(%p): not a cudaMalloc'ed pointer", p);
    device_used -= it->second;
    device_allocs.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    std::lock_guard<std::mutex> g(mem_lock);
    *free_bytes = (size_t)(device_bytes() - device_used);
    *total = (size_t)device_bytes();
    return cudaSuccess;
}
// Pinned (page-locked) host memory: cudaMallocHost, cudaHostAlloc and cudaHostRegister'ed ranges are
// remembered, because async copies treat them differently from pageable memory (see cudaMemcpyAsync).
// With unified addressing (the H100's) they are mapped: kernels may use the host pointer.
static std::map<uintptr_t, size_t>& pinned_ranges = *new std::map<uintptr_t, size_t>;  // under mem_lock
cudaError_t cudaMallocHost(void** ptr, size_t size) {
    if (posix_memalign(ptr, 4096, size ? size : 1) != 0) return set_error(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> g(mem_lock);
    pinned_ranges[(uintptr_t)*ptr] = size;
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) { return cudaMallocHost(ptr, size); }
cudaError_t cudaHostRegister(void* p, size_t size, unsigned int flags) {
    if (!p || !size) return fail(cudaErrorInvalidValue, "cudaHostRegister: NULL pointer or 0 bytes");
    std::lock_guard<std::mutex> g(mem_lock);
    pinned_ranges[(uintptr_t)p] = size;
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
    std::lock_guard<std::mutex> g(mem_lock);
    if (!pinned_ranges.erase((uintptr_t)p))
        return fail(cudaErrorInvalidValue, "cudaHostUnregister(%p): not a registered range", p);
    return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned int flags) {
    *dev = host;  // unified addressing: the same address on both sides
    return cudaSuccess;
}
// Is [p, p+n) inside one pinned host range?
static int is_pinned(const void* p, size_t n) {
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = pinned_ranges.upper_bound((uintptr_t)p);
    if (it == pinned_ranges.begin()) return 0;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}
cudaError_t cudaFreeHost(void* p) {
    cudaDeviceSynchronize();  // as on the GPU: freeing pinned memory waits for the device
    {
        std::lock_guard<std::mutex> g(mem_lock);
        pinned_ranges.erase((uintptr_t)p);
    }
    free(p);
    return cudaSuccess;
}

// Is [p, p+n) inside one device allocation? 0 yes; 1 not device memory at all; 2 runs past its end.
static int device_range(const void* p, size_t n, size_t* overrun) {
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = device_allocs.upper_bound((uintptr_t)p);
    if (it == device_allocs.begin()) return 1;
    --it;
    uintptr_t start = it->first, end = start + it->second, q = (uintptr_t)p;
    if (q >= end && !(q == start && it->second == 0)) return 1;
    if (q + n > end) {
        *overrun = q + n - end;
        return 2;
    }
    return 0;
}
static cudaError_t check_device_range(const char* fn, const char* which, const void* p, size_t n) {
    size_t over = 0;
    int r = device_range(p, n, &over);
    if (r == 1) return fail(cudaErrorInvalidValue, "%s: %s %p is not device memory (cudaMalloc'ed)", fn, which, p);
    if (r == 2)
        return fail(cudaErrorInvalidValue,
                    "%s: %s range [%p, +%zu) runs %zu bytes past the end of its cudaMalloc'ed buffer", fn, which, p, n,
                    over);
    return cudaSuccess;
}
static cudaError_t check_host_range(const char* fn, const char* which, const void* p, size_t n) {
    size_t over;
    if (device_range(p, n, &over) != 1)
        return fail(cudaErrorInvalidValue, "%s: %s %p is device memory, but the copy kind says host", fn, which, p);
    return cudaSuccess;
}

static cudaError_t check_copy(const char* fn, void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    cudaError_t e = cudaSuccess;
    if (n == 0) return cudaSuccess;
    switch (kind) {
        case cudaMemcpyHostToDevice:
            if ((e = check_device_range(fn, "destination", dst, n))) return e;
            return check_host_range(fn, "source", src, n);
        case cudaMemcpyDeviceToHost:
            if ((e = check_device_range(fn, "source", src, n))) return e;
            return check_host_range(fn, "destination", dst, n);
        case cudaMemcpyDeviceToDevice:
            if ((e = check_device_range(fn, "destination", dst, n))) return e;
            return check_device_range(fn, "source", src, n);
        case cudaMemcpyHostToHost:
        case cudaMemcpyDefault:
            return cudaSuccess;
        default:
            return fail(cudaErrorInvalidMemcpyDirection, "%s: copy kind %d is not a cudaMemcpyKind", fn, (int)kind);
    }
}
// ----------------------------------------------------------------------------
// Device, streams and events.
static thread_local int current_device = 0;  // per host thread, as in CUDA
cudaError_t cudaGetDeviceCount(int* n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d != 0) return fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): the CPU runtime has one device, 0", d);
    current_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
    *d = current_device;
    return cudaSuccess;
}
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
// emu_compute_capability: the compute capability the device reports, EMU_COMPUTE_CAPABILITY "8.0" (the default) or
// "9.0". Every PTX instruction this runtime emulates runs either way (wgmma and TMA too: tests call those kernels
// directly); what changes is what a program that asks the device chooses: the trainer runs the wgmma attention
// kernels on 9.0 (the fastest on a real H100 and H200) and the mma.sync ones on 8.0, which are the faster emulated.
static void emu_compute_capability(int* major, int* minor) {
    const char* s = getenv("EMU_COMPUTE_CAPABILITY");
    *major = 8, *minor = 0;
    if (!s || !*s || !strcmp(s, "8.0")) return;
    if (!strcmp(s, "9.0")) {
        *major = 9;
        return;
    }
    fprintf(stderr, "cpu runtime: EMU_COMPUTE_CAPABILITY=%s: expected 8.0 or 9.0\n", s);
    exit(1);
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
    if (device != 0) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d): only device 0 exists", device);
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "CPU runtime (H100 NVL memory and limits)");
    p->totalGlobalMem = (size_t)device_bytes();
    p->sharedMemPerBlock = DEFAULT_DYNAMIC_SMEM;
    p->sharedMemPerBlockOptin = MAX_DYNAMIC_SMEM;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = MAX_THREADS_PER_BLOCK;
    p->maxThreadsDim[0] = MAX_BLOCK_X;
    p->maxThreadsDim[1] = MAX_BLOCK_Y;
    p->maxThreadsDim[2] = MAX_BLOCK_Z;
    p->maxGridSize[0] = (int)MAX_GRID_X;
    p->maxGridSize[1] = MAX_GRID_Y;
    p->maxGridSize[2] = MAX_GRID_Z;
    p->totalConstMem = 65536;
    emu_compute_capability(&p->major, &p->minor);
    p->multiProcessorCount = 132;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxBlocksPerMultiProcessor = 32;
    p->l2CacheSize = 50 * 1024 * 1024;
    p->memoryBusWidth = 5120;
    p->concurrentKernels = 1;
    p->unifiedAddressing = 1;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e) return e;
    switch (attr) {
        case cudaDevAttrMaxThreadsPerBlock:
            *value = p.maxThreadsPerBlock;
            break;
        case cudaDevAttrMaxSharedMemoryPerBlock:
            *value = (int)p.sharedMemPerBlock;
            break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin:
            *value = (int)p.sharedMemPerBlockOptin;
            break;
        case cudaDevAttrMultiProcessorCount:
            *value = p.multiProcessorCount;
            break;
        case cudaDevAttrWarpSize:
            *value = 32;
            break;
        case cudaDevAttrComputeCapabilityMajor:
            *value = p.major;
            break;
        case cudaDevAttrComputeCapabilityMinor:
            *value = p.minor;
            break;
        case cudaDevAttrL2CacheSize:
            *value = p.l2CacheSize;
            break;
        case cudaDevAttrMaxThreadsPerMultiProcessor:
            *value = p.maxThreadsPerMultiProcessor;
            break;
        default:
            return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
    }
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// Kernel attributes: the dynamic shared memory a kernel has opted into, per kernel. As on the GPU,
// static and dynamic shared memory count together: without the opt-in a kernel may use 48 KB in all
// (so 48 KB less its static shared memory dynamically), and the opt-in may not take the sum past
// 227 KB ("the sum of this value and the function attribute sharedSizeBytes cannot exceed
// cudaDevAttrMaxSharedMemoryPerBlockOptin").
static size_t static_smem_of(const void* kernel);
static std::mutex attr_lock;
static std::map<const void*, int> max_dynamic_smem;
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        long long static_bytes = (long long)static_smem_of(func);
        if (value < 0 || value + static_bytes > MAX_DYNAMIC_SMEM)
            return fail(cudaErrorInvalidValue,
                        "cudaFuncSetAttribute: %d bytes of dynamic shared memory with %lld of static (the H100 "
                        "allows %d in all)",
                        value, static_bytes, MAX_DYNAMIC_SMEM);
        std::lock_guard<std::mutex> g(attr_lock);
        max_dynamic_smem[func] = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d is not emulated", (int)attr);
}
static int allowed_dynamic_smem(const void* func) {
    int fallback = DEFAULT_DYNAMIC_SMEM - (int)static_smem_of(func);
    std::lock_guard<std::mutex> g(attr_lock);
    auto it = max_dynamic_smem.find(func);
    return it == max_dynamic_smem.end() ? (fallback > 0 ? fallback : 0) : it->second;
}

// ----------------------------------------------------------------------------
// Fibers. emu_switch(save, load) pushes the callee-saved registers on the current stack, stores
// the stack pointer in *save, loads `load` as the stack pointer and pops the registers saved there.
#if defined(__x86_64__)
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch,.-emu_switch\n");
#else
#error "cpu/runtime.cpp: the fiber switch is written for x86-64 only"
#endif

// F_WAIT_ACTIVE: in __activemask; F_WAIT_MBAR: in mbarrier.try_wait.parity
enum fiber_state { F_READY, F_WAIT_BAR, F_WAIT_WARP, F_WAIT_ACTIVE, F_WAIT_MBAR, F_EXITED };

struct EmuFiber {
    void* sp;  // saved stack pointer while switched out
    char* stack_lo;
    size_t stack_size;
    void* asan_fake_stack;
    uint3 tid;
    int linear;  // x + y*bx + z*bx*by: the lane is linear % 32, the warp linear / 32
    int pos;     // where this thread stands in the block's run order (EmuWorker.order)
    int state;
    // the warp collective this thread waits in
    int wop, warg, wwidth;
    unsigned wmask;
    uint64_t wval;
    const char* wname;
    void (*wfn)(void* const* all);  // EMU_WARP_GATHER: run once on every lane's posted pointer
    uint64_t result;                // what the barrier or collective returns to this thread
    struct EmuCopy* copies;         // cp.async: this thread's copies not yet performed (see emu_cp_async)
    int ncopies, cap_copies, committed;
    struct EmuCopy* landed;  // its copies performed since its last fence.proxy.async (see smem_unfenced)
    int nlanded, cap_landed;
};

struct EmuWgmmaOp {  // one wgmma.mma_async of one warp: its 16 rows of the warpgroup's 64
    int group;       // 0 while uncommitted, else the commit number
    int n, trans_b, scale_d;
    uint64_t adesc, bdesc;  // adesc: unused when A comes from registers
    float* d[32];           // each lane's accumulator registers (n / 2 floats)
    const uint32_t* a[32];  // each lane's A registers (4), or NULL: A from shared memory
    uint64_t dhash, ahash;  // the accumulators as the product will find them, and the A registers, at the issue
    uint64_t shash;         // the shared memory it reads, at the issue (see wgmma_mark)
};
struct EmuWarpWgmma {  // a warp's wgmma operations not yet performed (see emu_wgmma_issue)
    EmuWgmmaOp* ops;
    int nops, cap, committed;
    int fenced;        // a wgmma.fence since the last wait_group that completed an operation
    long long issued;  // wgmma.mma_async issued by the warp in this block
};
#define EMU_WGMMA_SEEN 64
struct EmuWgmmaSeen {  // the i-th wgmma.mma_async of a warpgroup, as its first warp to get there issued it
    long long seq;     // i, or -1
    uint64_t adesc, bdesc;
    int n, trans_b, scale_d, ra;
};

#define EMU_MAX_MBARS 64
struct EmuMbar {  // an mbarrier object (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier")
    uint64_t* addr;
    int count;     // the expected arrivals of each phase (mbarrier.init)
    int pending;   // arrivals still to come in the current phase
    long long tx;  // transaction bytes still to come in the current phase (expect_tx adds, complete_tx takes)
    int phase;     // the current phase, counted from 0
};
struct EmuTma {  // a cp.async.bulk.tensor not yet performed: the box at coords of the map, to dst
    unsigned char* dst;
    uint64_t map[16];  // a copy of the tensor map (the kernel's parameter may be gone when the copy lands)
    int coords[5];
    int mbar;  // index in EmuWorker.mbars
};

struct EmuJob {  // one kernel launch
    emu_kernel_body body;
    void* call;
    dim3 grid, block;
    size_t smem;
    const void* kernel;
    char name[256];  // filled on first use (errors only): dladdr is slow
    long long nblocks;
    long long next_block;  // atomic
    int failed;            // atomic: a block deadlocked or misused a collective
};

struct EmuWorker {  // one OS thread's state for running blocks
    EmuFiber* fibers;
    int nfibers;  // allocated
    void* sched_sp;
    EmuJob* job;
    EmuFiber* self;
    int nthreads, exited;
    unsigned warp_waiting[32];                // per warp: lanes waiting in a warp collective
    unsigned warp_gone[32];                   // per warp: lanes that have exited
    EmuWarpWgmma wgmma[32];                   // per warp: wgmma operations issued, not yet waited for
    EmuWgmmaSeen wg_seen[8][EMU_WGMMA_SEEN];  // per warpgroup: its recent wgmma, to check its warps agree
    int wgmma_used;                           // the block issued a wgmma
    int nreg_calls[32], nreg_last[32];        // per warp: setmaxnreg executed, and the last one's (N, + 1000 if inc)
    int nreg_used;                            // the block executed a setmaxnreg
    EmuMbar mbars[EMU_MAX_MBARS];             // the block's mbarriers, in the order initialized
    int nmbars;
    EmuTma* tmas;  // the block's bulk tensor copies not yet performed
    int ntmas, cap_tmas;
    int bar_arrived, bar_true;
    int* order;
    uint64_t rng;
    int error_reported;
    void* asan_main_bottom;  // the OS thread's own stack, for AddressSanitizer's fiber switches
    size_t asan_main_size;
    void* asan_sched_fake;
};
static thread_local EmuWorker* W;

static size_t stack_bytes(void) {
    static size_t s =
        (size_t)env_ll("EMU_STACK_KB", EMU_ASAN ? 512 : 64, 16, 1 << 20, "KiB per kernel thread's stack") * 1024;
    return s;
}

static const char* kernel_name(const void* kernel, char* buf, size_t n);
static const char* job_name(EmuJob* j) {
    static std::mutex m;
    std::lock_guard<std::mutex> g(m);
    if (!j->name[0]) kernel_name(j->kernel, j->name, sizeof j->name);
    return j->name;
}

// Report a misuse inside a kernel once per block, and fail the launch.
void emu_kernel_error(const char* fmt, ...) {
    EmuWorker* w = W;
    __atomic_store_n(&w->job->failed, 1, __ATOMIC_RELAXED);
    if (w->error_reported++) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cpu runtime: kernel %s, block (%u,%u,%u), thread (%u,%u,%u): ", job_name(w->job), blockIdx.x,
            blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

// Leave fiber f (now waiting, or exited) for the next runnable thread in the block's order, switching
// to it directly; when none can run, return to the scheduler (the block is done, or deadlocked).
static int release_activemask(EmuWorker* w);
static EmuFiber* next_ready(EmuWorker* w, int p) {  // the first runnable thread after position p
    int n = w->nthreads;
    for (int k = 1; k < n; k++) {
        if (++p == n) p = 0;
        EmuFiber* g = &w->fibers[w->order[p]];
        if (g->state == F_READY) return g;
    }
    return NULL;
}
static void yield_from(EmuFiber* f, int exiting) {
    EmuWorker* w = W;
    EmuFiber* next = next_ready(w, f->pos);
    if (!next && release_activemask(w)) {  // every thread is blocked: __activemask calls can answer
        if (f->state == F_READY) return;   // f was one of them: it goes on
        next = next_ready(w, f->pos);
    }
    void* to = w->sched_sp;
    w->self = next;
    if (next) {
        threadIdx = next->tid;
        to = next->sp;
    }
#if EMU_ASAN
    __sanitizer_start_switch_fiber(exiting ? NULL : &f->asan_fake_stack, next ? next->stack_lo : w->asan_main_bottom,
                                   next ? next->stack_size : w->asan_main_size);
#endif
    emu_switch(&f->sp, to);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake_stack, NULL, NULL);
#endif
}

static void release_barrier(EmuWorker* w);
static void warp_lane_exited(EmuWorker* w, int warp);
static void emu_cp_async_wait_all(EmuFiber* f);

// Every fiber starts here (the address its fresh stack returns to) and never returns.
static void fiber_main(void) {
    EmuWorker* w = W;
#if EMU_ASAN
    const void* from_bottom;
    size_t from_size;
    __sanitizer_finish_switch_fiber(NULL, &from_bottom, &from_size);
    if (!w->asan_main_bottom) w->asan_main_bottom = (void*)from_bottom, w->asan_main_size = from_size;
#endif
    w->job->body(w->job->call);
    EmuFiber* f = w->self;
    emu_cp_async_wait_all(f);           // asynchronous copies still pending complete, as they do on the GPU
    if (w->wgmma[f->linear >> 5].nops)  // their results would land in registers that no longer exist
        emu_kernel_error("exits with %d wgmma.mma_async of its warp not waited for (wgmma.wait_group)",
                         w->wgmma[f->linear >> 5].nops);
    f->state = F_EXITED;
    w->warp_gone[f->linear >> 5] |= 1u << (f->linear & 31);
    w->exited++;
    warp_lane_exited(w, f->linear >> 5);
    if (w->bar_arrived > 0 && w->bar_arrived + w->exited == w->nthreads) release_barrier(w);
    yield_from(f, 1);
    abort();  // unreachable: an exited fiber is never resumed
}

// Lay out a fresh stack so that the first switch into it "returns" into fiber_main.
static void stack_canary_check(EmuFiber* f);
static void fiber_reset(EmuFiber* f) {
    stack_canary_check(f);
    uintptr_t top = ((uintptr_t)f->stack_lo + f->stack_size) & ~(uintptr_t)15;
#if EMU_ASAN  // fiber_main never returns, so its frame's redzones stay poisoned: clear them
    __asan_unpoison_memory_region((void*)(top - 4096), 4096);
#endif
    void** sp = (void**)top;
    *--sp = NULL;                              // fiber_main's return address (never used); keeps ABI alignment
    *--sp = (void*)&fiber_main;                // popped by `ret` in emu_switch
    for (int i = 0; i < 6; i++) *--sp = NULL;  // rbp rbx r12 r13 r14 r15
    f->sp = sp;
    f->state = F_READY;
    f->asan_fake_stack = NULL;
    f->ncopies = 0;
    f->committed = 0;
    f->nlanded = 0;
}

// worker_reserve: stacks for n fibers. The new fibers' stacks are one mapping, below them one guard page (a
// stack overflow of the lowest faults; the others are caught by a canary, stack_canary_ok): a mapping and a
// guard page per fiber were two of the kernel's memory areas per kernel thread, and 1024 OS threads
// (EMU_THREADS) x 1024-thread blocks ran past vm.max_map_count (65530 by default) as "cannot map a fiber
// stack". This way a worker holds a few areas whatever its block size. (MAP_NORESERVE: the pages are only
// committed as a fiber touches them.)
static const uint64_t STACK_CANARY = 0x5afe57acc0ffee11ULL;
static void worker_reserve(EmuWorker* w, int n) {
    if (n <= w->nfibers) return;
    w->fibers = (EmuFiber*)realloc(w->fibers, n * sizeof(EmuFiber));
    w->order = (int*)realloc(w->order, n * sizeof(int));
    size_t page = 4096, sz = (stack_bytes() + page - 1) & ~(page - 1), count = (size_t)(n - w->nfibers);
    char* m = (char*)mmap(NULL, page + count * sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                          -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "cpu runtime: cannot map %zu fiber stacks (%zu bytes each): %s\n", count, sz, strerror(errno));
        abort();
    }
    mprotect(m, page, PROT_NONE);  // guard page: an overflow of the lowest stack faults instead of corrupting
    for (int i = w->nfibers; i < n; i++) {
        EmuFiber* f = &w->fibers[i];
        memset(f, 0, sizeof(*f));
        f->stack_lo = m + page + (size_t)(i - w->nfibers) * sz;  // (worker_release unmaps each with the page below)
        f->stack_size = sz;
#if !EMU_ASAN
        memcpy(f->stack_lo, &STACK_CANARY, sizeof STACK_CANARY);
#endif
    }
    w->nfibers = n;
}
// stack_canary_ok: whether fiber f's stack kept its lowest word (a thread that ran past its EMU_STACK_KB wrote
// into the stack below it); checked as each fiber is reset for a block. (Not under ASan, which poisons frames.)
static void stack_canary_check(EmuFiber* f) {
#if !EMU_ASAN
    uint64_t c;
    memcpy(&c, f->stack_lo, sizeof c);
    if (c != STACK_CANARY) {
        fprintf(stderr,
                "cpu runtime: a kernel thread overflowed its fiber stack of %zu KiB (the memory below it is "
                "corrupt): set a larger EMU_STACK_KB\n",
                f->stack_size / 1024);
        abort();
    }
#endif
}

// Shuffled mode (EMU_SHUFFLE=seed): the run order is a fresh random permutation at the start of
// every block and after every barrier.
static long long shuffle_seed_value = -1;  // -1: not read from EMU_SHUFFLE yet
static long long shuffle_seed(void) {
    if (shuffle_seed_value < 0) shuffle_seed_value = env_ll("EMU_SHUFFLE", 0, 0, 1LL << 53, "a seed; 0: no shuffle");
    return shuffle_seed_value;
}
void emu_set_shuffle(long long seed) { shuffle_seed_value = seed; }

static uint64_t next_random(uint64_t* s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}
static void shuffle_order(EmuWorker* w) {
    int n = w->nthreads;
    for (int i = n - 1; i > 0; i--) {
        int k = (int)(next_random(&w->rng) % (uint64_t)(i + 1)), t = w->order[i];
        w->order[i] = w->order[k];
        w->order[k] = t;
    }
    for (int i = 0; i < n; i++) w->fibers[w->order[i]].pos = i;
}

// ----------------------------------------------------------------------------
// __syncthreads and its counting variants: op 0 plain, 1 count, 2 and, 3 or.
static void release_barrier(EmuWorker* w) {
    for (int i = 0; i < w->nthreads; i++) {
        EmuFiber* f = &w->fibers[i];
        if (f->state != F_WAIT_BAR) continue;
        int op = f->warg;
        f->result = op == 1 ? w->bar_true : op == 2 ? w->bar_true == w->bar_arrived : w->bar_true > 0;
        f->state = F_READY;
    }
    w->bar_arrived = 0;
    w->bar_true = 0;
    if (shuffle_seed()) shuffle_order(w);
}

int emu_syncthreads(int op, int predicate) {
    EmuWorker* w = W;
    if (!w || !w->job) {
        fprintf(stderr, "cpu runtime: __syncthreads() called outside a kernel\n");
        abort();
    }
    EmuFiber* f = w->self;
    f->state = F_WAIT_BAR;
    f->warg = op;
    f->wname = "__syncthreads";
    w->bar_arrived++;
    w->bar_true += predicate != 0;
    if (w->bar_arrived + w->exited == w->nthreads)
        release_barrier(w);  // last to arrive: everyone goes on
    else
        yield_from(f, 0);
    return (int)f->result;
}

// ----------------------------------------------------------------------------
// Warp collectives. Lanes are numbered by the linear thread index, 32 to a warp.
static uint64_t shuffle_value(EmuWorker* w, EmuFiber* f, int warp_base, unsigned mask) {
    int lane = f->linear & 31, width = f->wwidth, arg = f->warg;
    int seg = lane & ~(width - 1), src = lane;
    switch (f->wop) {
        case EMU_SHFL_IDX:
            src = seg + (arg & (width - 1));
            break;
        case EMU_SHFL_UP:
            src = (lane - seg) >= arg ? lane - arg : lane;
            break;
        case EMU_SHFL_DOWN:
            src = (lane - seg) + arg < width ? lane + arg : lane;
            break;
        case EMU_SHFL_XOR:
            src = lane ^ arg;
            if (src > seg + width - 1) src = lane;
            break;  // later groups: own value
    }
    if (src == lane) return f->wval;
    if (!(mask >> src & 1)) {
        emu_kernel_error("%s reads lane %d, which is not in its mask 0x%08x (undefined on the GPU)", f->wname, src,
                         mask);
        return 0;
    }
    if (warp_base + src >= w->nthreads || w->fibers[warp_base + src].state != F_WAIT_WARP) {
        emu_kernel_error("%s reads lane %d, which has exited or does not exist (undefined on the GPU)", f->wname, src);
        return f->wval;
    }
    return w->fibers[warp_base + src].wval;
}

// The collective that lane f waits in is complete (every lane of its mask waits in it or has exited):
// compute every member's result and let them go. Exited lanes and lanes past the end of the block are
// left out: CUDA requires only the non-exited lanes named in the mask to take part.
static void finish_warp_collective(EmuWorker* w, EmuFiber* f) {
    int lane = f->linear & 31, warp_base = f->linear & ~31, warp = f->linear >> 5, op = f->wop;
    unsigned mask = f->wmask;
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1) || warp_base + l >= w->nthreads) continue;
        EmuFiber* g = &w->fibers[warp_base + l];
        if (g->state == F_WAIT_WARP && (g->wmask != mask || g->wop != op))
            emu_kernel_error("lanes %d and %d meet at different warp operations (%s mask 0x%08x vs %s mask 0x%08x)",
                             lane, l, f->wname, mask, g->wname, g->wmask);
    }
    unsigned ballot = 0;
    if (op == EMU_VOTE_BALLOT)
        for (int l = 0; l < 32; l++)
            if ((mask >> l & 1) && warp_base + l < w->nthreads && w->fibers[warp_base + l].state == F_WAIT_WARP &&
                w->fibers[warp_base + l].wval)
                ballot |= 1u << l;
    if (op == EMU_WARP_GATHER) {  // e.g. mma_sync: one computation over the whole warp's fragments
        void* all[32] = {0};
        for (int l = 0; l < 32; l++)
            if ((mask >> l & 1) && warp_base + l < w->nthreads && w->fibers[warp_base + l].state == F_WAIT_WARP)
                all[l] = (void*)(uintptr_t)w->fibers[warp_base + l].wval;
        f->wfn(all);
    }
    uint64_t results[32];
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1) || warp_base + l >= w->nthreads) continue;
        EmuFiber* g = &w->fibers[warp_base + l];
        if (g->state != F_WAIT_WARP) continue;
        results[l] = op == EMU_VOTE_BALLOT                          ? ballot
                     : op == EMU_WARP_SYNC || op == EMU_WARP_GATHER ? 0
                                                                    : shuffle_value(w, g, warp_base, mask);
    }
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1) || warp_base + l >= w->nthreads) continue;
        EmuFiber* g = &w->fibers[warp_base + l];
        if (g->state != F_WAIT_WARP) continue;
        g->result = results[l];
        g->state = F_READY;
        w->warp_waiting[warp] &= ~(1u << l);
    }
}

// Lanes of warp `warp` that exist in a block of n threads.
static unsigned warp_exists(int n, int warp) {
    int in_warp = n - warp * 32;
    return in_warp >= 32 ? 0xffffffffu : (1u << in_warp) - 1;
}

// A lane of `warp` exited: the collectives that were waiting only for it complete without it.
static void warp_lane_exited(EmuWorker* w, int warp) {
    unsigned exists = warp_exists(w->nthreads, warp);
    for (int l = 0; l < 32 && w->warp_waiting[warp]; l++) {
        EmuFiber* g = &w->fibers[warp * 32 + l];
        if (g->state == F_WAIT_WARP && !(g->wmask & exists & ~(w->warp_waiting[warp] | w->warp_gone[warp])))
            finish_warp_collective(w, g);
    }
}

uint64_t emu_warp_collective(int op, unsigned mask, uint64_t value, int arg, int width, const char* name) {
    EmuWorker* w = W;
    if (!w || !w->job) {
        fprintf(stderr, "cpu runtime: %s called outside a kernel\n", name);
        abort();
    }
    EmuFiber* f = w->self;
    int lane = f->linear & 31;
    if (!(mask >> lane & 1))
        emu_kernel_error("%s with mask 0x%08x, which does not include the calling lane %d", name, mask, lane);
    if (width < 1 || width > 32 || (width & (width - 1)))
        emu_kernel_error("%s with width %d (must be a power of 2 up to 32)", name, width);
    mask |= 1u << lane;
    if (width < 1 || width > 32 || (width & (width - 1))) width = 32;
    f->wop = op;
    f->wmask = mask;
    f->wval = value;
    f->warg = arg;
    f->wwidth = width;
    f->wname = name;
    f->state = F_WAIT_WARP;
    // Complete when every lane of the mask that exists and has not exited waits here with the same mask
    // and operation (a lane that exits later completes it then: warp_lane_exited).
    int warp = f->linear >> 5;
    w->warp_waiting[warp] |= 1u << lane;
    if (mask & warp_exists(w->nthreads, warp) & ~(w->warp_waiting[warp] | w->warp_gone[warp])) {
        yield_from(f, 0);  // someone is still on the way; the last one completes us
        return f->result;
    }
    finish_warp_collective(w, f);  // last to arrive
    return f->result;
}

void emu_warp_gather(unsigned mask, void* mine, void (*fn)(void* const* all), const char* name) {
    W->self->wfn = fn;
    emu_warp_collective(EMU_WARP_GATHER, mask, (uint64_t)(uintptr_t)mine, 0, 32, name);
}

int emu_lane_id(void) { return W->self->linear & 31; }

// __activemask(): the lanes of the caller's warp that are converged with it, i.e. execute this same
// __activemask call (the same call site) at the same time, not every live lane. The caller waits
// until no thread of the block can run (every other lane has come here, or waits elsewhere, or has
// exited); then each group of lanes of one warp waiting at one call site gets its own mask.
unsigned emu_activemask(void) {
    EmuFiber* f = W->self;
    f->wval = (uint64_t)(uintptr_t)__builtin_return_address(0);  // the call site in the kernel
    f->state = F_WAIT_ACTIVE;
    yield_from(f, 0);
    return (unsigned)f->result;
}
// Called when no thread can run: answer every __activemask waiting. Returns how many went on.
static int release_activemask(EmuWorker* w) {
    int released = 0;
    for (int i = 0; i < w->nthreads; i++) {
        EmuFiber* f = &w->fibers[i];
        if (f->state != F_WAIT_ACTIVE) continue;
        int base = f->linear & ~31;
        unsigned m = 0;
        for (int l = 0; l < 32 && base + l < w->nthreads; l++) {
            EmuFiber* g = &w->fibers[base + l];
            if (g->state == F_WAIT_ACTIVE && g->wval == f->wval) m |= 1u << l;
        }
        for (int l = 0; l < 32; l++) {
            if (!(m >> l & 1)) continue;
            w->fibers[base + l].result = m;
            w->fibers[base + l].state = F_READY;
            released++;
        }
    }
    return released;
}

// ----------------------------------------------------------------------------
// cp.async and wgmma on the same shared memory. Both are asynchronous: a copy may land at any time from its
// issue to the cp.async.wait_group that completes it, and a wgmma may read its operands at any time from its
// issue to the wgmma.wait_group that completes it. If the two windows meet on the same bytes, the GPU races.
// The emulator keeps, per 4-byte word of the dynamic shared memory, how many copies not yet performed write it
// and how many wgmma not yet performed read it; a copy performed over a word that a pending wgmma reads, or a
// wgmma performed over a word a pending copy writes, is reported (both windows hold that moment). Races whose
// windows do not meet in the order the emulator ran the threads go unseen (EMU_SHUFFLE tries other orders).
// And the two proxies: cp.async writes through the generic proxy, wgmma reads through the async proxy, and the
// PTX ISA ("Async Proxy") asks for a fence.proxy.async between the two accesses. smem_unfenced marks the words a
// performed copy wrote whose copying thread has not since executed fence.proxy.async; a wgmma issued over one is
// reported. (Ordinary st.shared writes are not seen: for those only a GPU catches a missing fence.)
static thread_local uint16_t smem_copying[EMU_MAX_DYNAMIC_SMEM / 4], smem_reading[EMU_MAX_DYNAMIC_SMEM / 4];
static thread_local uint8_t smem_unfenced[EMU_MAX_DYNAMIC_SMEM / 4];
static thread_local long long smem_marks;  // marks outstanding in the three (a failed block may leave some)
static int smem_word(const void* p) {      // the word of dynamic shared memory at p, or -1
    const unsigned char* c = (const unsigned char*)p;
    return c >= dyn_smem && c < dyn_smem + sizeof dyn_smem ? (int)((c - dyn_smem) / 4) : -1;
}

// ----------------------------------------------------------------------------
// Asynchronous copies, as the PTX ISA defines cp.async: a copy joins the thread's open group;
// cp.async.commit_group closes it; cp.async.wait_group N returns once at most the N most recent
// committed groups are still pending (copies not yet committed are not waited for). The emulator
// performs a group's copies only when a wait requires them, or when the thread exits, so a kernel that
// reads its shared memory before the wait (or before the barrier that follows another thread's wait)
// reads stale bytes instead of passing by luck.
struct EmuCopy {
    void* dst;
    const void* src;
    int bytes, src_bytes;  // the copy's size; bytes past src_bytes are zero-filled
    int group;             // 0 while uncommitted, else the commit number
};
// copying_marks: adds delta (+1 at a copy's issue, -1 when it lands) to smem_copying over the nwords words from
// word w (-1: not dynamic shared memory, nothing to mark). Returns the first byte among them that a pending wgmma
// reads, or -1: a race, when the copy lands.
static int copying_marks(int w, int nwords, int delta) {
    int race = -1;
    for (int i = 0; w >= 0 && i < nwords; i++) {
        smem_copying[w + i] += delta, smem_marks += delta;
        if (smem_reading[w + i] && race < 0) race = 4 * (w + i);
    }
    return race;
}
static void perform_copy(EmuFiber* f, const EmuCopy* c) {
    int w = smem_word(c->dst), race = copying_marks(w, c->bytes / 4, -1);
    for (int i = 0; w >= 0 && i < c->bytes / 4; i++)
        if (!smem_unfenced[w + i]) smem_unfenced[w + i] = 1, smem_marks++;
    if (w >= 0) {  // the copying thread's fence.proxy.async clears its marks
        if (f->nlanded == f->cap_landed) {
            f->cap_landed = f->cap_landed ? 2 * f->cap_landed : 64;
            f->landed = (EmuCopy*)realloc(f->landed, f->cap_landed * sizeof(EmuCopy));
            if (!f->landed) abort();
        }
        f->landed[f->nlanded++] = *c;
    }
    if (race >= 0)
        emu_kernel_error(
            "cp.async writes shared memory at byte %d, which a wgmma.mma_async not yet waited for reads (a race "
            "on the GPU: wgmma.wait_group, and a barrier for the other warps' wgmma, before the copy)",
            race);
    if (c->src_bytes) memcpy(c->dst, c->src, c->src_bytes);
    memset((char*)c->dst + c->src_bytes, 0, c->bytes - c->src_bytes);
}
void emu_cp_async(void* dst, const void* src, int bytes, int src_bytes) {
    EmuFiber* f = W->self;
    if (bytes != 4 && bytes != 8 && bytes != 16)
        return emu_kernel_error("cp.async: cp-size %d is not 4, 8 or 16 bytes", bytes);
    if (src_bytes < 0 || src_bytes > bytes)
        return emu_kernel_error("cp.async: src-size %d is outside [0, cp-size %d]", src_bytes, bytes);
    if ((uintptr_t)dst % bytes || (uintptr_t)src % bytes)
        return emu_kernel_error("cp.async: addresses %p (shared) and %p (global) must be aligned to %d bytes", dst, src,
                                bytes);
    size_t over = 0;
    if (src_bytes && device_range(src, src_bytes, &over))
        return emu_kernel_error("cp.async: source [%p, +%d) is not inside a cudaMalloc'ed buffer", src, src_bytes);
    if (f->ncopies == f->cap_copies) {
        f->cap_copies = f->cap_copies ? 2 * f->cap_copies : 64;
        f->copies = (EmuCopy*)realloc(f->copies, f->cap_copies * sizeof(EmuCopy));
        if (!f->copies) abort();
    }
    f->copies[f->ncopies++] = EmuCopy{dst, src, bytes, src_bytes, 0};
    int w = smem_word(dst);
    copying_marks(w, bytes / 4, +1);
}
void emu_cp_async_commit(void) {
    EmuFiber* f = W->self;
    f->committed++;  // an empty group counts too (it is complete at once)
    for (int i = 0; i < f->ncopies; i++)
        if (!f->copies[i].group) f->copies[i].group = f->committed;
}
void emu_cp_async_wait(int n) {
    EmuFiber* f = W->self;
    int keep = 0;
    for (int i = 0; i < f->ncopies; i++) {  // perform the groups older than the n most recent, in order
        EmuCopy* c = &f->copies[i];
        if (c->group && c->group <= f->committed - n)
            perform_copy(f, c);
        else
            f->copies[keep++] = *c;
    }
    f->ncopies = keep;
}
static void emu_cp_async_wait_all(EmuFiber* f) {
    for (int i = 0; i < f->ncopies; i++) perform_copy(f, &f->copies[i]);
    f->ncopies = 0;
}
// unmark_landed: clears the smem_unfenced marks of f's copies performed since its last fence.proxy.async (at the
// fence, and for every thread at the end of the block).
static void unmark_landed(EmuFiber* f) {
    for (int i = 0; i < f->nlanded; i++) {
        int w = smem_word(f->landed[i].dst);
        for (int k = 0; k < f->landed[i].bytes / 4; k++)
            if (smem_unfenced[w + k]) smem_unfenced[w + k] = 0, smem_marks--;
    }
    f->nlanded = 0;
}
// fence.proxy.async: this thread's shared-memory writes so far are visible to the async proxy (wgmma).
void emu_fence_proxy_async(void) { unmark_landed(W->self); }

// ----------------------------------------------------------------------------
// Warpgroup MMA, as the PTX ISA defines wgmma.mma_async (section "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate Operation using wgmma.mma_async instruction"). A warpgroup is 4 consecutive warps,
// the first a multiple of 4; warp w % 4 of it owns rows 16 (w % 4) .. + 15 of the 64 x N product, so
// the emulator computes each warp's rows from that warp's registers and the shared memory that the
// descriptors name. The operation is asynchronous: the emulator performs it at the wgmma.wait_group
// that requires it (reading shared memory, A's registers and the accumulators then, and writing the
// accumulators), so a kernel that reads its accumulators, or rewrites its operands, before the wait
// gets stale values in the tests, as it may on the GPU.

// Shared memory address (what __cvta_generic_to_shared gives on the GPU): EMU_SMEM_BASE + the offset in the
// launch's dynamic shared memory. wgmma operands must live there. On a GPU where the dynamic window starts depends
// on the kernel's static __shared__ variables and what the system reserves, and nothing promises a multiple of
// 1024, where the 128-byte swizzle's pattern starts; so the emulator's window starts at 528 (16-byte aligned, as
// the GPU's is, and not 1024-aligned), and a kernel that aligns its swizzled tiles by anything but their shared
// address gets wrong operands in the tests.
#define EMU_SMEM_BASE 528
uint32_t emu_smem_addr(const void* p) {
    const char* c = (const char*)p;
    if (c < (const char*)dyn_smem || c >= (const char*)dyn_smem + sizeof dyn_smem) {
        emu_kernel_error("shared address of %p: not in dynamic shared memory (the emulator's only shared window)", p);
        return 0;
    }
    return EMU_SMEM_BASE + (uint32_t)(c - (const char*)dyn_smem);
}

// Element (mn, k) of a 16-bit operand described by `desc`, for an operand of (MN rows) x (K = 16):
// A is M x K, B is N x K. `mn_major` (imm-trans) says which dimension is contiguous. The canonical
// layouts (PTX ISA "Shared Memory Matrix Layout"; CUTLASS's make_gmma_desc writes them as cute layouts)
// in bytes, before the swizzle, with W the swizzle width (16 for none, else 32, 64, 128 bytes):
//   K-major,  no swizzle: (mn % 8) * 16 + (mn / 8) * SBO + (k % 8) * 2 + (k / 8) * LBO
//   K-major,  swizzle W:  (mn % 8) * W  + (mn / 8) * SBO + k * 2                      (LBO unused)
//   MN-major, no swizzle: (mn % 8) * 2  + (mn / 8) * SBO + (k % 8) * 16 + (k / 8) * LBO
//   MN-major, swizzle W:  (mn % (W/2)) * 2 + (mn / (W/2)) * LBO + (k % 8) * W + (k / 8) * SBO
// The swizzle then acts on the shared address a: bits [4, 4 + log2(W / 16)) ^= the same number of bits
// from bit 7 (128B: a ^ ((a >> 7) & 7) << 4; 64B: & 3; 32B: & 1), i.e. the 16-byte chunks of each
// W-byte row are permuted by the row's index within its 8-row (W * 8-byte) pattern.
static int wgmma_desc_check(uint64_t desc, const char* which) {
    if (desc & 0x3FFFC000C000C000ull & ~(7ull << 49)) {  // bits 14-15, 30-31, 46-61 but 49-51
        emu_kernel_error("wgmma: %s descriptor 0x%016llx sets reserved bits", which, (unsigned long long)desc);
        return 0;
    }
    if ((desc >> 49) & 7) {
        emu_kernel_error(
            "wgmma: %s descriptor 0x%016llx has a matrix base offset; the emulator supports 0 only "
            "(start the swizzle pattern at an aligned address)",
            which, (unsigned long long)desc);
        return 0;
    }
    return 1;
}
static float emu_bf16_value(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t wgmma_addr(uint64_t desc, int mn_major, int mn, int k) {
    uint32_t start = (uint32_t)(desc & 0x3FFF) << 4, lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4,
             sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
    int mode = (int)(desc >> 62), w = mode == 0 ? 16 : mode == 1 ? 128 : mode == 2 ? 64 : 32;
    uint32_t off;
    if (!mn_major)
        off = mode == 0 ? (mn % 8) * 16 + (mn / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo
                        : (mn % 8) * w + (mn / 8) * sbo + k * 2;
    else
        off = mode == 0 ? (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo
                        : (mn % (w / 2)) * 2 + (mn / (w / 2)) * lbo + (k % 8) * w + (k / 8) * sbo;
    uint32_t a = start + off;
    if (mode) a ^= ((a >> 7) & (uint32_t)(w / 16 - 1)) << 4;
    return a - EMU_SMEM_BASE;  // the offset in dyn_smem (an address below the window wraps to a huge offset)
}
static float wgmma_operand(uint64_t desc, int mn_major, int mn, int k, size_t smem, int* bad) {
    uint32_t a = wgmma_addr(desc, mn_major, mn, k);
    if ((size_t)a + 2 > smem) {
        *bad = 1;
        return 0.f;
    }
    if (smem_copying[a / 4] && *bad >= 0) *bad = -1 - (int)a;  // a pending cp.async writes it (see smem_copying)
    uint16_t x;
    memcpy(&x, dyn_smem + a, 2);
    return emu_bf16_value(x);
}
// What a wgmma may not see change between its issue and the wait that completes it (undefined on the GPU, where
// the tensor cores read the operands and write the accumulators at any time in between): FNV-1a hashes of its
// registers and of the shared memory it reads, taken at the issue and compared when it is performed.
static uint64_t fnv1a(uint64_t h, const void* p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)p)[i]) * 0x100000001b3ull;
    return h;
}
static uint64_t wgmma_regs_hash(const EmuWgmmaOp* op, int accumulators) {  // else the A registers
    uint64_t h = 0xcbf29ce484222325ull;
    for (int l = 0; l < 32; l++)
        h = accumulators ? fnv1a(h, op->d[l], op->n / 2 * sizeof(float)) : fnv1a(h, op->a[l], 4 * sizeof(uint32_t));
    return h;
}
// wgmma_mark: adds delta to smem_reading at every word a warp's wgmma reads (its 16 rows of A when A is in shared
// memory, and all of B): +1 at the issue, -1 when it is performed. Returns the hash of those bytes; *unfenced
// (when given) = the first byte a copy wrote with no fence.proxy.async since (smem_unfenced), or -1.
static uint64_t wgmma_mark(const EmuWgmmaOp* op, int warp, int delta, int* unfenced) {
    size_t smem = W->job->smem;
    uint64_t h = 0xcbf29ce484222325ull;
    for (int k = 0; k < 16; k++)
        for (int i = op->a[0] ? 16 : 0; i < 16 + op->n; i++) {  // i < 16: row i of A, else row i - 16 of B
            uint32_t a = i < 16 ? wgmma_addr(op->adesc, 0, 16 * (warp % 4) + i, k)
                                : wgmma_addr(op->bdesc, op->trans_b, i - 16, k);
            if ((size_t)a + 2 > smem) continue;  // reported when performed
            smem_reading[a / 4] += delta, smem_marks += delta;
            h = fnv1a(h, dyn_smem + a, 2);
            if (unfenced && smem_unfenced[a / 4] && *unfenced < 0) *unfenced = (int)a;
        }
    return h;
}
static void wgmma_perform(EmuWgmmaOp* op, int warp) {
    size_t smem = W->job->smem;
    int n = op->n, row0 = 16 * (warp % 4), bad = 0;
    if (wgmma_mark(op, warp, -1, NULL) != op->shash)
        return emu_kernel_error(
            "wgmma.mma_async: shared memory it reads changed between its issue and the wgmma.wait_group that "
            "completes it (a race on the GPU, where the product may read it until then: wait, and a barrier for the "
            "other warps' wgmma, before writing it)");
    if (wgmma_regs_hash(op, 1) != op->dhash)
        return emu_kernel_error(
            "wgmma.mma_async: its accumulator registers changed between its issue and the wgmma.wait_group that "
            "completes it (undefined on the GPU, where the tensor cores write them then: change them after the "
            "wait, and wgmma.fence before the next wgmma)");
    if (op->a[0] && wgmma_regs_hash(op, 0) != op->ahash)
        return emu_kernel_error(
            "wgmma.mma_async: its A registers changed between its issue and the wgmma.wait_group that completes it "
            "(undefined on the GPU, where the product may read them until then)");
    static thread_local float A[16][16], B[256][16];  // not on the fiber's small stack
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++)
            if (op->a[0]) {  // the lane holding (r, k): a[i] = rows g (i even) / g + 8 (odd), columns 2t + 8 (i / 2)
                int g = r % 8, t = (k % 8) / 2, i = (r / 8) + 2 * (k / 8);
                uint32_t x = op->a[4 * g + t][i];
                A[r][k] = emu_bf16_value((uint16_t)(k % 2 ? x >> 16 : x & 0xFFFF));
            } else
                A[r][k] = wgmma_operand(op->adesc, 0, row0 + r, k, smem, &bad);
    for (int c = 0; c < n; c++)
        for (int k = 0; k < 16; k++) B[c][k] = wgmma_operand(op->bdesc, op->trans_b, c, k, smem, &bad);
    if (bad > 0) {
        emu_kernel_error(
            "wgmma: an operand reaches outside the launch's %zu bytes of dynamic shared memory "
            "(A 0x%016llx, B 0x%016llx)",
            smem, (unsigned long long)op->adesc, (unsigned long long)op->bdesc);
        return;
    }
    if (bad < 0)
        emu_kernel_error(
            "wgmma.mma_async reads shared memory at byte %d, which a cp.async not yet waited for writes (a race on "
            "the GPU: cp.async.wait_group, and a barrier for the other threads' copies, before the wgmma)",
            -1 - bad);
    // D fragment (PTX ISA, m64nNk16 accumulator layout): lane l (g = l / 4, t = l % 4) holds
    // d[4j + i] = D[row0 + g + 8 (i / 2)][8j + 2t + i % 2] for j < N / 8.
    for (int l = 0; l < 32; l++) {
        int g = l / 4, t = l % 4;
        for (int j = 0; j < n / 8; j++)
            for (int i = 0; i < 4; i++) {
                int r = g + 8 * (i / 2), c = 8 * j + 2 * t + i % 2;
                double s = op->scale_d ? op->d[l][4 * j + i] : 0.0;  // products of bf16 are exact in double
                for (int k = 0; k < 16; k++) s += (double)A[r][k] * B[c][k];
                op->d[l][4 * j + i] = (float)s;
            }
    }
}

static int warp_of_self(void) { return W->self->linear >> 5; }
static void wgmma_fence_all(void* const* all) {
    (void)all;
    W->wgmma[warp_of_self()].fenced = 1;
}
static void wgmma_issue_all(void* const* all) {
    EmuWorker* w = W;
    int warp = warp_of_self();
    for (int l = 0; l < 32; l++)
        if (!all[l]) return emu_kernel_error("wgmma.mma_async: lane %d of warp %d is missing (.aligned)", l, warp);
    if ((warp / 4 + 1) * 128 > w->nthreads)
        return emu_kernel_error("wgmma.mma_async: warp %d's warpgroup (threads %d..%d) is not all in the block of %d",
                                warp, warp / 4 * 128, warp / 4 * 128 + 127, w->nthreads);
    const EmuWgmmaLane* x = (const EmuWgmmaLane*)all[0];
    for (int l = 1; l < 32; l++) {
        const EmuWgmmaLane* y = (const EmuWgmmaLane*)all[l];
        if (y->adesc != x->adesc || y->bdesc != x->bdesc || y->n != x->n || y->trans_b != x->trans_b ||
            y->scale_d != x->scale_d || !y->a != !x->a)
            return emu_kernel_error("wgmma.mma_async: lanes 0 and %d of warp %d give different operands", l, warp);
    }
    EmuWarpWgmma* q = &w->wgmma[warp];
    if (!q->fenced)
        return emu_kernel_error(
            "wgmma.mma_async without a wgmma.fence since the warp's last wgmma.wait_group "
            "(the PTX ISA requires one before the first, and after the registers change)");
    if ((!x->a && !wgmma_desc_check(x->adesc, "A")) || !wgmma_desc_check(x->bdesc, "B")) return;
    if (q->nops == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 16;
        q->ops = (EmuWgmmaOp*)realloc(q->ops, q->cap * sizeof(EmuWgmmaOp));
        if (!q->ops) abort();
    }
    // the warpgroup's 4 warps must issue the same sequence (the instruction is the warpgroup's): the first warp to
    // reach its i-th wgmma records it, the others compare (a warp EMU_WGMMA_SEEN ahead is not checked)
    if (!w->wgmma_used) {
        for (int g = 0; g < 8; g++)
            for (int i = 0; i < EMU_WGMMA_SEEN; i++) w->wg_seen[g][i].seq = -1;
        w->wgmma_used = 1;
    }
    long long i = q->issued++;
    EmuWgmmaSeen* seen = &w->wg_seen[warp / 4][i % EMU_WGMMA_SEEN];
    EmuWgmmaSeen mine = {i, x->a ? 0 : x->adesc, x->bdesc, x->n, x->trans_b, x->scale_d, x->a != NULL};
    if (seen->seq == i) {
        if (seen->adesc != mine.adesc || seen->bdesc != mine.bdesc || seen->n != mine.n ||
            seen->trans_b != mine.trans_b || seen->scale_d != mine.scale_d || seen->ra != mine.ra)
            return emu_kernel_error(
                "wgmma.mma_async: warp %d's wgmma #%lld differs from another warp's of its "
                "warpgroup (the instruction is the warpgroup's: all 4 warps issue it alike)",
                warp, i);
    } else if (seen->seq < i)
        *seen = mine;
    EmuWgmmaOp* op = &q->ops[q->nops++];
    op->group = 0;
    op->n = x->n, op->trans_b = x->trans_b, op->scale_d = x->scale_d;
    op->adesc = x->adesc, op->bdesc = x->bdesc;
    for (int l = 0; l < 32; l++) {
        op->d[l] = ((const EmuWgmmaLane*)all[l])->d;
        op->a[l] = ((const EmuWgmmaLane*)all[l])->a;
    }
    op->dhash = wgmma_regs_hash(op, 1);
    op->ahash = op->a[0] ? wgmma_regs_hash(op, 0) : 0;
    int unfenced = -1;
    op->shash = wgmma_mark(op, warp, +1, &unfenced);
    if (unfenced >= 0)
        emu_kernel_error(
            "wgmma.mma_async reads shared memory at byte %d, which a cp.async wrote with no fence.proxy.async by "
            "the copying thread since (wgmma reads through the async proxy: cp.async.wait_group, "
            "fence.proxy.async, then a barrier, before the wgmma)",
            unfenced);
}
static void wgmma_commit_all(void* const* all) {
    (void)all;
    EmuWarpWgmma* q = &W->wgmma[warp_of_self()];
    q->committed++;  // an empty group counts too (it is complete at once)
    for (int i = 0; i < q->nops; i++)
        if (!q->ops[i].group) q->ops[i].group = q->committed;
}
static void wgmma_wait_all(void* const* all) {
    int warp = warp_of_self(), n = *(const int*)all[0];
    EmuWarpWgmma* q = &W->wgmma[warp];
    int keep = 0, done = 0;
    for (int i = 0; i < q->nops; i++) {  // perform the groups older than the n most recent, in issue order
        EmuWgmmaOp* op = &q->ops[i];
        if (op->group && op->group <= q->committed - n) {
            wgmma_perform(op, warp);
            done++;
            for (int j = i + 1; j < q->nops; j++) {  // later products on these accumulators will find them so
                EmuWgmmaOp* o2 = &q->ops[j];
                if (o2->d[0] < op->d[0] + op->n / 2 && op->d[0] < o2->d[0] + o2->n / 2)
                    o2->dhash = wgmma_regs_hash(o2, 1);
            }
        } else
            q->ops[keep++] = *op;
    }
    q->nops = keep;
    if (done) q->fenced = 0;
}
// At the end of a block that used wgmma: every warpgroup's warps issued and committed as many (a warp that
// skipped one would leave the others waiting on the GPU).
static void wgmma_block_end(EmuWorker* w) {
    for (int g = 0; (g + 1) * 128 <= w->nthreads && g < 8; g++) {  // the whole warpgroups
        EmuWarpWgmma* q = &w->wgmma[4 * g];
        for (int k = 1; k < 4; k++)
            if (q[k].issued != q[0].issued || q[k].committed != q[0].committed)
                return emu_kernel_error(
                    "warpgroup %d: warp %d issued %lld wgmma.mma_async and %d commit_group, warp %d %lld and %d "
                    "(all 4 warps of a warpgroup execute each wgmma instruction)",
                    g, 4 * g, q[0].issued, q[0].committed, 4 * g + k, q[k].issued, q[k].committed);
    }
}
// setmaxnreg: a warp collective (all 32 lanes, the same N); the warps of a warpgroup are compared at the block's end.
static void setmaxnreg_all(void* const* all) {
    int warp = warp_of_self(), v = *(const int*)all[0];
    for (int l = 1; l < 32; l++)
        if (!all[l] || *(const int*)all[l] != v)
            return emu_kernel_error("setmaxnreg: lane %d of warp %d is missing or asks otherwise (.sync.aligned)", l,
                                    warp);
    W->nreg_calls[warp]++;
    W->nreg_last[warp] = v;
    W->nreg_used = 1;
}
void emu_setmaxnreg(int n, int inc) {
    int v = n + (inc ? 1000 : 0);
    emu_warp_gather(0xffffffffu, &v, setmaxnreg_all, inc ? "setmaxnreg.inc" : "setmaxnreg.dec");
}
static void setmaxnreg_block_end(EmuWorker* w) {
    for (int g = 0; (g + 1) * 128 <= w->nthreads && g < 8; g++)
        for (int k = 1; k < 4; k++)
            if (w->nreg_calls[4 * g + k] != w->nreg_calls[4 * g] || w->nreg_last[4 * g + k] != w->nreg_last[4 * g])
                return emu_kernel_error(
                    "warpgroup %d: warp %d executed %d setmaxnreg (the last %s %d), warp %d %d (%s %d): all 4 warps of "
                    "a warpgroup execute the same ones",
                    g, 4 * g, w->nreg_calls[4 * g], w->nreg_last[4 * g] >= 1000 ? "inc" : "dec",
                    w->nreg_last[4 * g] % 1000, 4 * g + k, w->nreg_calls[4 * g + k],
                    w->nreg_last[4 * g + k] >= 1000 ? "inc" : "dec", w->nreg_last[4 * g + k] % 1000);
    if (w->nthreads % 128)
        return emu_kernel_error("setmaxnreg in a block of %d threads, not whole warpgroups", w->nthreads);
    // The registers a block ends with come from what its launch gave it: at most the cap ptxas can give a thread
    // of a block this size (65,536 / threads, at most 255, down to a multiple of 8), times its threads. A .inc past
    // what the pool holds waits for registers no warpgroup will give back: the block hangs on a GPU.
    int cap = (65536 / w->nthreads < 255 ? 65536 / w->nthreads : 255) / 8 * 8, total = 0;
    for (int g = 0; g < w->nthreads / 128; g++) {
        if (!w->nreg_calls[4 * g]) return;  // a warpgroup that keeps its launch count: unknown here
        total += w->nreg_last[4 * g] % 1000 * 128;
    }
    if (total > cap * w->nthreads)
        emu_kernel_error(
            "setmaxnreg: the warpgroups ask for %d registers in all, more than the %d a block of %d threads can have "
            "(%d a thread): a setmaxnreg.inc would wait forever on a GPU",
            total, cap * w->nthreads, w->nthreads, cap);
}
void emu_wgmma_fence(void) { emu_warp_gather(0xffffffffu, (void*)1, wgmma_fence_all, "wgmma.fence"); }
void emu_wgmma_issue(EmuWgmmaLane* mine) { emu_warp_gather(0xffffffffu, mine, wgmma_issue_all, "wgmma.mma_async"); }
void emu_wgmma_commit(void) { emu_warp_gather(0xffffffffu, (void*)1, wgmma_commit_all, "wgmma.commit_group"); }
void emu_wgmma_wait(int n) { emu_warp_gather(0xffffffffu, &n, wgmma_wait_all, "wgmma.wait_group"); }

// ----------------------------------------------------------------------------
// mbarrier and the tensor memory accelerator (TMA), as the PTX ISA defines them ("mbarrier", and
// "cp.async.bulk.tensor"). An mbarrier counts, per phase, the arrivals still to come (mbarrier.init's count)
// and the transaction bytes still to come (mbarrier.arrive.expect_tx adds, a bulk copy's complete_tx takes);
// when both reach 0 the phase completes and the next begins. mbarrier.try_wait.parity p is true once the
// phase of parity p has completed, i.e. while the current phase's parity is not p.
// The emulator keeps a block's barriers by address (EmuWorker.mbars) and performs a bulk copy only when a
// thread waits on its barrier and the phase is not complete without it (or reports it, if the block ends
// first), so a kernel that reads a tile before waiting reads stale bytes in the tests. A thread whose phase
// has not completed blocks (F_WAIT_MBAR) until an arrival or a copy completes it; when no thread can run, the
// block is reported as a deadlock (who waits on which barrier), where a GPU would hang.
static EmuMbar* mbar_lookup(uint64_t* bar) {  // the block's mbarrier at bar, or NULL
    EmuWorker* w = W;
    for (int i = 0; i < w->nmbars; i++)
        if (w->mbars[i].addr == bar) return &w->mbars[i];
    return NULL;
}
static EmuMbar* mbar_find(uint64_t* bar, const char* op) {  // ... or a kernel error
    EmuMbar* m = mbar_lookup(bar);
    if (!m) emu_kernel_error("%s: %p is not an mbarrier that mbarrier.init set up in this block", op, (void*)bar);
    return m;
}
// mbar_wake: the threads waiting on mbarrier i check their parity again (its phase completed, or a copy that may
// complete it was issued)
static void mbar_wake(EmuWorker* w, int i) {
    for (int k = 0; k < w->nthreads; k++)
        if (w->fibers[k].state == F_WAIT_MBAR && w->fibers[k].warg == i) w->fibers[k].state = F_READY;
}
// mbar_complete_if_done: the phase completes when no arrival and no transaction byte is still to come; the
// threads waiting for it go on.
static void mbar_complete_if_done(EmuMbar* m) {
    if (m->pending || m->tx) return;
    m->phase++;
    m->pending = m->count;
    mbar_wake(W, (int)(m - W->mbars));
}
void emu_mbar_init(uint64_t* bar, int count) {
    EmuWorker* w = W;
    if ((uintptr_t)bar % 8) return emu_kernel_error("mbarrier.init: %p is not 8-byte aligned", (void*)bar);
    if (count < 1 || count > (1 << 20) - 1)
        return emu_kernel_error("mbarrier.init: count %d is outside [1, 2^20 - 1]", count);
    EmuMbar* m = mbar_lookup(bar);  // initialized again: a new first phase
    if (!m) {
        if (w->nmbars == EMU_MAX_MBARS)
            return emu_kernel_error("mbarrier.init: more than %d mbarriers in a block", EMU_MAX_MBARS);
        m = &w->mbars[w->nmbars++];
    }
    *m = EmuMbar{bar, count, count, 0, 0};
    *bar = 0;  // the object's bytes: what they hold on a GPU is opaque
}
void emu_mbar_arrive(uint64_t* bar, uint32_t tx) {
    EmuMbar* m = mbar_find(bar, "mbarrier.arrive");
    if (!m) return;
    if (m->pending == 0)
        return emu_kernel_error(
            "mbarrier.arrive: mbarrier %d has had all %d arrivals of its phase %d (it waits for %lld transaction "
            "bytes): an arrival too many",
            (int)(m - W->mbars), m->count, m->phase, m->tx);
    m->tx += tx;  // expect_tx, then the arrival
    m->pending--;
    mbar_complete_if_done(m);
}
static void perform_tma(EmuTma* t);
void emu_mbar_wait(uint64_t* bar, int parity) {
    EmuWorker* w = W;
    EmuMbar* m = mbar_find(bar, "mbarrier.try_wait.parity");
    if (!m) return;
    int i = (int)(m - w->mbars);
    while ((m->phase & 1) == (parity & 1)) {  // the phase of this parity has not completed
        int k = 0;
        while (k < w->ntmas && w->tmas[k].mbar != i) k++;
        if (k < w->ntmas) {  // the oldest copy that completes on this barrier lands now
            EmuTma t = w->tmas[k];
            memmove(&w->tmas[k], &w->tmas[k + 1], (w->ntmas - k - 1) * sizeof(EmuTma));
            w->ntmas--;
            perform_tma(&t);
            continue;
        }
        EmuFiber* f = w->self;
        f->state = F_WAIT_MBAR;
        f->warg = i;
        f->wval = (uint64_t)(parity & 1);
        f->wname = "mbarrier.try_wait.parity";
        yield_from(f, 0);
    }
}

// Tensor maps. The emulator's cuTensorMapEncodeTiled checks the arguments as the driver documents them
// (cuda.h) and keeps them in the 128-byte CUtensorMap; the bulk copy reads them from the kernel's copy.
struct EmuTensorMap {
    uint64_t magic;
    const unsigned char* base;
    uint64_t dim[5], stride[5];  // stride[0] = the element size; bytes
    uint32_t box[5];
    int rank, esize, swizzle;  // swizzle: the span in bytes (16 = none, 32, 64, 128)
};
static_assert(sizeof(EmuTensorMap) <= sizeof(CUtensorMap), "EmuTensorMap must fit in a CUtensorMap");
#define EMU_TMAP_MAGIC 0x4d4c4d2e544d4150ull
static CUresult tmap_fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cpu runtime: cuTensorMapEncodeTiled: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return CUDA_ERROR_INVALID_VALUE;
}
static CUresult emu_cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* addr,
                                           const cuuint64_t* dim, const cuuint64_t* strides, const cuuint32_t* box,
                                           const cuuint32_t* estrides, CUtensorMapInterleave interleave,
                                           CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                           CUtensorMapFloatOOBfill oob) {
    (void)l2;
    int esize = type == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1
                : type == CU_TENSOR_MAP_DATA_TYPE_UINT16 || type == CU_TENSOR_MAP_DATA_TYPE_FLOAT16 ||
                        type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                    ? 2
                : type == CU_TENSOR_MAP_DATA_TYPE_UINT32 || type == CU_TENSOR_MAP_DATA_TYPE_INT32 ||
                        type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                    ? 4
                : type == CU_TENSOR_MAP_DATA_TYPE_UINT64 || type == CU_TENSOR_MAP_DATA_TYPE_INT64 ||
                        type == CU_TENSOR_MAP_DATA_TYPE_FLOAT64
                    ? 8
                    : 0;
    if (!map) return tmap_fail("tensorMap is NULL");
    if (!esize) return tmap_fail("data type %d is not emulated (8, 16, 32 and 64-bit types are)", (int)type);
    if (rank < 1 || rank > 5) return tmap_fail("tensorRank %u is not in [1, 5]", rank);
    if ((uintptr_t)addr % 16) return tmap_fail("globalAddress %p is not 16-byte aligned", addr);
    if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) return tmap_fail("only CU_TENSOR_MAP_INTERLEAVE_NONE is emulated");
    if (oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        return tmap_fail("only CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE is emulated");
    int span = swizzle == CU_TENSOR_MAP_SWIZZLE_NONE   ? 16
               : swizzle == CU_TENSOR_MAP_SWIZZLE_32B  ? 32
               : swizzle == CU_TENSOR_MAP_SWIZZLE_64B  ? 64
               : swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? 128
                                                       : 0;
    if (!span) return tmap_fail("swizzle %d is not emulated (NONE, 32B, 64B and 128B are)", (int)swizzle);
    EmuTensorMap t = {};
    t.magic = EMU_TMAP_MAGIC, t.base = (const unsigned char*)addr, t.rank = (int)rank, t.esize = esize;
    t.swizzle = span;
    for (cuuint32_t d = 0; d < rank; d++) {
        if (dim[d] == 0 || dim[d] > (1ull << 32))
            return tmap_fail("globalDim[%u] = %llu is not in [1, 2^32]", d, (unsigned long long)dim[d]);
        if (box[d] == 0 || box[d] > 256) return tmap_fail("boxDim[%u] = %u is not in [1, 256]", d, box[d]);
        if (estrides[d] != 1) return tmap_fail("elementStrides[%u] = %u: only 1 is emulated", d, estrides[d]);
        t.dim[d] = dim[d], t.box[d] = box[d];
        t.stride[d] = d == 0 ? (uint64_t)esize : strides[d - 1];
        if (d > 0 && (strides[d - 1] % 16 || strides[d - 1] >= (1ull << 40)))
            return tmap_fail("globalStrides[%u] = %llu is not a multiple of 16 below 2^40", d - 1,
                             (unsigned long long)strides[d - 1]);
    }
    if (box[0] * esize % 16)
        return tmap_fail("boxDim[0] x the element size (%u bytes) is not a multiple of 16", box[0] * esize);
    if (span > 16 && box[0] * esize > (cuuint32_t)span)
        return tmap_fail("the box's inner dimension (%u bytes) is wider than the swizzle span (%d bytes)",
                         box[0] * esize, span);
    if (span > 16 && box[0] * esize != (cuuint32_t)span)
        return tmap_fail(
            "the box's inner dimension (%u bytes) is narrower than the swizzle span (%d bytes): not emulated",
            box[0] * esize, span);
    memset(map, 0, sizeof *map);
    memcpy(map, &t, sizeof t);
    return CUDA_SUCCESS;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                             unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
    (void)version, (void)flags;
    int found = symbol && !strcmp(symbol, "cuTensorMapEncodeTiled");
    if (fn) *fn = found ? (void*)&emu_cuTensorMapEncodeTiled : NULL;
    if (status) *status = found ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return found ? cudaSuccess
                 : fail(cudaErrorSymbolNotFound, "cudaGetDriverEntryPointByVersion: %s is not emulated",
                        symbol ? symbol : "(null)");
}

// cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes [dst], [map, {coords}], [bar]:
// the box of the map's boxDim elements from coords (innermost first) to dst, rows of boxDim[0] elements one
// after another, the swizzle applied to the shared address (as wgmma reads it: bits [4, 4 + log2(span / 16))
// ^= the same count of bits from bit 7); elements outside the tensor are zeros; then complete_tx(box bytes)
// on bar. Issued by one thread; the block's threads wait on bar.
static size_t tma_box_bytes(const EmuTensorMap* t) {
    size_t n = (size_t)t->esize;
    for (int d = 0; d < t->rank; d++) n *= t->box[d];
    return n;
}
static void perform_tma(EmuTma* c) {
    const EmuTensorMap* t = (const EmuTensorMap*)c->map;
    size_t bytes = tma_box_bytes(t), rows = bytes / (t->box[0] * t->esize);
    int race = copying_marks(smem_word(c->dst), (int)(bytes / 4), -1);
    if (race >= 0)
        emu_kernel_error(
            "cp.async.bulk.tensor writes shared memory at byte %d, which a wgmma.mma_async not yet waited for "
            "reads (a race on the GPU)",
            race);
    uint32_t base = emu_smem_addr(c->dst);
    for (size_t r = 0; r < rows; r++) {
        long long coord[5] = {0, 0, 0, 0, 0};
        size_t q = r;
        int in = 1;
        for (int d = 1; d < t->rank; d++) {
            coord[d] = c->coords[d] + (long long)(q % t->box[d]);
            q /= t->box[d];
            in &= coord[d] >= 0 && coord[d] < (long long)t->dim[d];
        }
        for (uint32_t e = 0; e < t->box[0]; e++) {
            coord[0] = c->coords[0] + (long long)e;
            uint32_t a = base + (uint32_t)(r * t->box[0] + e) * t->esize;
            if (t->swizzle > 16) a ^= ((a >> 7) & (uint32_t)(t->swizzle / 16 - 1)) << 4;
            unsigned char* out = dyn_smem + (a - EMU_SMEM_BASE);
            if (!in || coord[0] < 0 || coord[0] >= (long long)t->dim[0]) {
                memset(out, 0, t->esize);
                continue;
            }
            const unsigned char* src = t->base;
            for (int d = 0; d < t->rank; d++) src += coord[d] * t->stride[d];
            size_t over = 0;
            if (device_range(src, t->esize, &over)) {
                emu_kernel_error("cp.async.bulk.tensor: element %p of the tensor is not inside a cudaMalloc'ed buffer",
                                 (const void*)src);
                return;
            }
            memcpy(out, src, t->esize);
        }
    }
    EmuMbar* m = &W->mbars[c->mbar];
    m->tx -= (long long)bytes;
    if (m->tx < 0 && m->pending == 0)
        return emu_kernel_error(
            "cp.async.bulk.tensor: %zu bytes complete on mbarrier %d, more than its phase expects (arrive.expect_tx)",
            bytes, c->mbar);
    mbar_complete_if_done(m);
}
void emu_tma_load(void* dst, const CUtensorMap* map, int rank, const int* coords, uint64_t* bar) {
    EmuWorker* w = W;
    const EmuTensorMap* t = (const EmuTensorMap*)map;
    if (t->magic != EMU_TMAP_MAGIC)
        return emu_kernel_error("cp.async.bulk.tensor: the tensor map was not made by cuTensorMapEncodeTiled");
    if (t->rank != rank) return emu_kernel_error("cp.async.bulk.tensor.%dd: the tensor map has rank %d", rank, t->rank);
    uint32_t a = emu_smem_addr(dst);
    size_t bytes = tma_box_bytes(t);
    if (a % 128) return emu_kernel_error("cp.async.bulk.tensor: shared address %u is not 128-byte aligned", a);
    if (a - EMU_SMEM_BASE + bytes > w->job->smem)
        return emu_kernel_error(
            "cp.async.bulk.tensor: the box (%zu bytes at shared address %u) reaches past the "
            "launch's %zu bytes of dynamic shared memory",
            bytes, a, w->job->smem);
    EmuMbar* m = mbar_find(bar, "cp.async.bulk.tensor");
    if (!m) return;
    if (w->ntmas == w->cap_tmas) {
        w->cap_tmas = w->cap_tmas ? 2 * w->cap_tmas : 16;
        w->tmas = (EmuTma*)realloc(w->tmas, w->cap_tmas * sizeof(EmuTma));
        if (!w->tmas) abort();
    }
    EmuTma* c = &w->tmas[w->ntmas++];
    c->dst = (unsigned char*)dst, c->mbar = (int)(m - w->mbars);
    memcpy(c->map, map, sizeof c->map);
    for (int d = 0; d < 5; d++) c->coords[d] = d < rank ? coords[d] : 0;
    copying_marks(smem_word(dst), (int)(bytes / 4), +1);
    mbar_wake(w, c->mbar);
}

// ----------------------------------------------------------------------------
// Static __shared__ variables are block-scope thread_locals, so they would keep the values of the
// block that ran before on the same OS thread, hiding a read of shared memory nobody wrote. On the
// GPU they start as garbage. So the runtime finds them in the executable's symbol table (TLS
// symbols of function-local statics, mangled _ZZ...), locates them relative to dyn_smem, and fills
// them with 0xFF at every launch, and at every block in shuffled mode.
struct SharedVar {
    long long offset;  // from dyn_smem, in this module's TLS block
    size_t size;
    const char* name;  // mangled: _ZZ <the enclosing function's encoding> E <name>
};
static SharedVar* shared_vars;
static int nshared_vars = -1;  // -1: not looked up yet
// The executable's symbol table, kept mapped (read-only) to find kernels' static shared sizes.
static const unsigned char* exe_image;
static const Elf64_Sym* exe_syms;
static const char* exe_names;
static size_t exe_nsyms;

static void find_static_shared(void) {
    nshared_vars = 0;
    int fd = open("/proc/self/exe", O_RDONLY);
    if (fd < 0) return;
    off_t len = lseek(fd, 0, SEEK_END);
    const unsigned char* f = (const unsigned char*)mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f == MAP_FAILED) return;
    exe_image = f;
    const Elf64_Ehdr* eh = (const Elf64_Ehdr*)f;
    const Elf64_Shdr* sh = (const Elf64_Shdr*)(f + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB) continue;
        const Elf64_Sym* sym = (const Elf64_Sym*)(f + sh[i].sh_offset);
        const char* names = (const char*)(f + sh[sh[i].sh_link].sh_offset);
        size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
        long long anchor = -1;
        for (size_t k = 0; k < n; k++)
            if (ELF64_ST_TYPE(sym[k].st_info) == STT_TLS && strcmp(names + sym[k].st_name, "dyn_smem") == 0)
                anchor = (long long)sym[k].st_value;
        if (anchor < 0) break;
        exe_syms = sym, exe_names = names, exe_nsyms = n;
        shared_vars = (SharedVar*)calloc(n, sizeof(SharedVar));
        for (size_t k = 0; k < n; k++)
            if (ELF64_ST_TYPE(sym[k].st_info) == STT_TLS && sym[k].st_size > 0 &&
                strncmp(names + sym[k].st_name, "_ZZ", 3) == 0)
                shared_vars[nshared_vars++] = {(long long)sym[k].st_value - anchor, (size_t)sym[k].st_size,
                                               names + sym[k].st_name};
    }
    if (!exe_syms) munmap((void*)f, (size_t)len), exe_image = NULL;
}

// The static shared memory of a kernel, as the GPU counts it (cudaFuncAttributes.sharedSizeBytes):
// the __shared__ variables the kernel declares. They are block-scope thread_locals here, named in the
// symbol table _ZZ <the kernel's mangled name without _Z> E <name>. (Those of __device__ functions it
// calls are not counted: this would need the call graph.)
static std::once_flag static_shared_once;
static size_t static_smem_of(const void* kernel) {
    static std::mutex m;
    static std::map<const void*, size_t> known;
    std::call_once(static_shared_once, [] {
        if (nshared_vars < 0) find_static_shared();
    });
    std::lock_guard<std::mutex> g(m);
    auto it = known.find(kernel);
    if (it != known.end()) return it->second;
    size_t bytes = 0;
    Dl_info info;
    if (exe_syms && dladdr(kernel, &info)) {
        uintptr_t base = ((const Elf64_Ehdr*)exe_image)->e_type == ET_DYN ? (uintptr_t)info.dli_fbase : 0;
        const char* fn = NULL;
        for (size_t k = 0; k < exe_nsyms && !fn; k++)
            if (ELF64_ST_TYPE(exe_syms[k].st_info) == STT_FUNC && exe_syms[k].st_value + base == (uintptr_t)kernel)
                fn = exe_names + exe_syms[k].st_name;
        if (fn && fn[0]) {
            char prefix[1024];
            if (strncmp(fn, "_Z", 2) == 0)
                snprintf(prefix, sizeof prefix, "_ZZ%sE", fn + 2);
            else
                snprintf(prefix, sizeof prefix, "_ZZ%zu%sE", strlen(fn), fn);
            size_t plen = strlen(prefix);
            for (int i = 0; i < nshared_vars; i++)
                if (strncmp(shared_vars[i].name, prefix, plen) == 0) bytes += shared_vars[i].size;
        }
    }
    known[kernel] = bytes;
    return bytes;
}

static void scramble_static_shared(void) {
    for (int i = 0; i < nshared_vars; i++) memset(dyn_smem + shared_vars[i].offset, 0xFF, shared_vars[i].size);
}

// ----------------------------------------------------------------------------
// The scheduler: run one block to completion, or report its deadlock.

static void report_deadlock(EmuWorker* w) {
    __atomic_store_n(&w->job->failed, 1, __ATOMIC_RELAXED);
    fprintf(stderr, "cpu runtime: kernel %s, block (%u,%u,%u): deadlock: no thread can run (%d of %d exited)\n",
            job_name(w->job), blockIdx.x, blockIdx.y, blockIdx.z, w->exited, w->nthreads);
    int shown = 0;
    for (int i = 0; i < w->nthreads && shown < 8; i++) {
        EmuFiber* f = &w->fibers[i];
        if (f->state == F_WAIT_BAR)
            fprintf(stderr, "    thread (%u,%u,%u) waits in __syncthreads\n", f->tid.x, f->tid.y, f->tid.z), shown++;
        else if (f->state == F_WAIT_MBAR) {
            const EmuMbar* m = &w->mbars[f->warg];
            fprintf(stderr,
                    "    thread (%u,%u,%u) waits on mbarrier %d for the phase of parity %d (its phase %d: %d of %d "
                    "arrivals and %lld transaction bytes still to come)\n",
                    f->tid.x, f->tid.y, f->tid.z, f->warg, (int)f->wval, m->phase, m->pending, m->count, m->tx);
            shown++;
        } else if (f->state == F_WAIT_WARP) {
            unsigned gone = 0;  // lanes of the mask that exited or do not exist: they can never arrive
            for (int l = 0; l < 32; l++) {
                int t = (f->linear & ~31) + l;
                if ((f->wmask >> l & 1) && (t >= w->nthreads || w->fibers[t].state == F_EXITED)) gone |= 1u << l;
            }
            fprintf(stderr, "    thread (%u,%u,%u) waits in %s (mask 0x%08x)", f->tid.x, f->tid.y, f->tid.z, f->wname,
                    f->wmask);
            if (gone) fprintf(stderr, ": lanes 0x%08x of its mask have exited or do not exist", gone);
            fprintf(stderr, "\n");
            shown++;
        }
    }
}

static void run_block(EmuWorker* w, long long b) {
    EmuJob* j = w->job;
    dim3 g = j->grid, bd = j->block;
    blockIdx.x = (unsigned)(b % g.x);
    blockIdx.y = (unsigned)((b / g.x) % g.y);
    blockIdx.z = (unsigned)(b / ((long long)g.x * g.y));
    int n = bd.x * bd.y * bd.z;
    w->nthreads = n;
    w->exited = 0;
    memset(w->warp_waiting, 0, sizeof w->warp_waiting);
    memset(w->warp_gone, 0, sizeof w->warp_gone);
    for (int i = 0; i < 32; i++) w->wgmma[i].nops = w->wgmma[i].committed = w->wgmma[i].fenced = w->wgmma[i].issued = 0;
    if (w->wgmma_used)
        for (int g = 0; g < 8; g++)
            for (int i = 0; i < EMU_WGMMA_SEEN; i++) w->wg_seen[g][i].seq = -1;
    w->wgmma_used = 0;
    memset(w->nreg_calls, 0, sizeof w->nreg_calls);
    memset(w->nreg_last, 0, sizeof w->nreg_last);
    w->nreg_used = 0;
    w->nmbars = 0;
    w->ntmas = 0;
    w->bar_arrived = 0;
    w->bar_true = 0;
    w->error_reported = 0;
    for (int i = 0; i < n; i++) {
        EmuFiber* f = &w->fibers[i];
        fiber_reset(f);
        f->linear = i;
        f->tid.x = i % bd.x;
        f->tid.y = (i / bd.x) % bd.y;
        f->tid.z = i / (bd.x * bd.y);
        f->pos = i;
        w->order[i] = i;
    }
    memset(dyn_smem, 0xFF, j->smem);  // shared memory starts as garbage (NaN for floats), not zeros
    if (smem_marks) {                 // a block that failed left copies or wgmma pending
        memset(smem_copying, 0, sizeof smem_copying);
        memset(smem_reading, 0, sizeof smem_reading);
        memset(smem_unfenced, 0, sizeof smem_unfenced);
        smem_marks = 0;
    }
    uint64_t seed = (uint64_t)shuffle_seed();
    if (seed) {
        scramble_static_shared();
        w->rng = seed * 0x9E3779B97F4A7C15ull + (uint64_t)b + 1;
        shuffle_order(w);
    }
    // Start the first thread; the threads pass control among themselves (yield_from) and come back
    // here when none can run.
    EmuFiber* first = &w->fibers[w->order[0]];
    w->self = first;
    threadIdx = first->tid;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&w->asan_sched_fake, first->stack_lo, first->stack_size);
#endif
    emu_switch(&w->sched_sp, first->sp);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(w->asan_sched_fake, NULL, NULL);
#endif
    if (w->exited == n && w->wgmma_used) wgmma_block_end(w);
    if (w->exited == n && w->nreg_used) setmaxnreg_block_end(w);
    if (w->exited == n && w->ntmas)
        emu_kernel_error(
            "the block exits with %d cp.async.bulk.tensor copies whose mbarrier phase no thread waited for", w->ntmas);
    for (int i = 0; i < n; i++) unmark_landed(&w->fibers[i]);
    if (w->exited != n) {
        report_deadlock(w);
#if EMU_ASAN  // the abandoned fibers' frames leave poisoned bytes behind on their stacks
        for (int i = 0; i < n; i++)
            if (w->fibers[i].state != F_EXITED)
                __asan_unpoison_memory_region(w->fibers[i].stack_lo, w->fibers[i].stack_size);
#endif
    }
    w->self = NULL;
}

static thread_local EmuWorker worker;  // at namespace scope: block-scope thread_locals are __shared__ variables

static void run_blocks(EmuJob* j) {
    EmuWorker* w = &worker;
    W = w;
    w->job = j;
    worker_reserve(w, j->block.x * j->block.y * j->block.z);
    blockDim = j->block;
    gridDim = j->grid;
#if EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(dyn_smem, sizeof(dyn_smem));
    ASAN_POISON_MEMORY_REGION(dyn_smem + j->smem, sizeof(dyn_smem) - j->smem);
#endif
    scramble_static_shared();
    for (;;) {
        if (__atomic_load_n(&j->failed, __ATOMIC_RELAXED)) break;
        long long b = __atomic_fetch_add(&j->next_block, 1, __ATOMIC_RELAXED);
        if (b >= j->nblocks) break;
        run_block(w, b);
    }
#if EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(dyn_smem, sizeof(dyn_smem));
#endif
    w->job = NULL;
}

// ----------------------------------------------------------------------------
// The pool of OS threads that run blocks: helpers wait for a job, the launching thread joins in.
static struct {
    pthread_mutex_t lock;
    pthread_cond_t start, done;
    EmuJob* job;
    long long generation;
    int busy;  // helpers still on the current job
    int nhelpers;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0};

static void* pool_helper(void*) {
    long long seen = 0;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.start, &pool.lock);
        seen = pool.generation;
        EmuJob* j = pool.job;
        pthread_mutex_unlock(&pool.lock);
        run_blocks(j);
        pthread_mutex_lock(&pool.lock);
        if (--pool.busy == 0) pthread_cond_signal(&pool.done);
    }
    return NULL;
}

enum { MAX_EMU_THREADS = 1024 };  // OS threads that run blocks; more is a typo, not a machine

static int pool_threads(void) {
    static int n = 0;
    if (!n) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = (int)env_ll("EMU_THREADS", cores > 0 ? (cores < 8 ? cores : 8) : 1, 1, MAX_EMU_THREADS, "OS threads");
    }
    return n;
}

static void run_job(EmuJob* j) {
    int helpers = pool_threads() - 1;
    if (j->nblocks < 2) helpers = 0;
    pthread_mutex_lock(&pool.lock);
    while (pool.nhelpers < helpers) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setstacksize(&a, 1 << 20);
        int rc = pthread_create(&t, &a, pool_helper, NULL);
        pthread_attr_destroy(&a);
        if (rc != 0) break;  // the threads started so far do the work
        pthread_detach(t);
        pool.nhelpers++;
    }
    if (helpers > 0) {
        pool.job = j;
        pool.busy = pool.nhelpers;
        pool.generation++;
        pthread_cond_broadcast(&pool.start);
    }
    pthread_mutex_unlock(&pool.lock);
    run_blocks(j);
    if (helpers > 0) {
        pthread_mutex_lock(&pool.lock);
        while (pool.busy > 0) pthread_cond_wait(&pool.done, &pool.lock);
        pthread_mutex_unlock(&pool.lock);
    }
}

// ----------------------------------------------------------------------------
// emu_launch: check the launch against the H100's limits, as the driver does, then run it.
static const char* kernel_name(const void* kernel, char* buf, size_t n) {
    Dl_info info;
    if (dladdr(kernel, &info) && info.dli_sname) {
        int status = 0;
        char* d = abi::__cxa_demangle(info.dli_sname, NULL, NULL, &status);
        snprintf(buf, n, "%s", status == 0 && d ? d : info.dli_sname);
        free(d);
    } else {
        snprintf(buf, n, "%p", kernel);
    }
    return buf;
}

// Launch counts (EMU_LAUNCH_STATS, see cuda_runtime.h): atomics, as any host thread may launch, and per kernel a
// record under a lock. With EMU_LAUNCH_STATS=1 or 2 an atexit handler, registered before main, prints them.
static std::atomic<long long> launch_counts[2];
struct KernelStats {
    long long launches, max_blocks;
    dim3 block;  // the largest block (by threads) it was launched with
    size_t max_smem;
};
static std::mutex kernel_stats_lock;
static std::map<const void*, KernelStats>* kernel_stats;  // (never freed: read by the atexit handler)
long long emu_launch_count(int what) {
    return what == EMU_COUNT_MATMULS ? launch_counts[1].load() : launch_counts[0].load();
}
long long emu_kernel_launches(const void* kernel, dim3* block, size_t* smem) {
    std::lock_guard<std::mutex> g(kernel_stats_lock);
    if (!kernel_stats) return 0;
    auto it = kernel_stats->find(kernel);
    if (it == kernel_stats->end()) return 0;
    if (block) *block = it->second.block;
    if (smem) *smem = it->second.max_smem;
    return it->second.launches;
}
void emu_count_matmul(void) { launch_counts[1]++; }
static void count_kernel(const void* kernel, dim3 grid, dim3 block, size_t smem) {
    launch_counts[0]++;
    std::lock_guard<std::mutex> g(kernel_stats_lock);
    if (!kernel_stats) kernel_stats = new std::map<const void*, KernelStats>();
    KernelStats& k = (*kernel_stats)[kernel];
    long long blocks = (long long)grid.x * grid.y * grid.z, threads = (long long)block.x * block.y * block.z;
    if (!k.launches || threads > (long long)k.block.x * k.block.y * k.block.z) k.block = block;
    k.launches++;
    k.max_blocks = blocks > k.max_blocks ? blocks : k.max_blocks;
    k.max_smem = smem > k.max_smem ? smem : k.max_smem;
}
static const char* kernel_name(const void* kernel, char* buf, size_t n);
static void print_launch_counts(void) {
    fprintf(stderr, "emu: EMU_LAUNCH_STATS: %lld kernel launches, %lld cuBLASLt matmuls\n", launch_counts[0].load(),
            launch_counts[1].load());
    const char* s = getenv("EMU_LAUNCH_STATS");
    if (strcmp(s, "2") || !kernel_stats) return;
    std::lock_guard<std::mutex> g(kernel_stats_lock);
    std::map<std::string, const KernelStats*> by_name;  // sorted by name
    char name[512];
    for (auto& e : *kernel_stats) by_name[kernel_name(e.first, name, sizeof name)] = &e.second;
    for (auto& e : by_name)
        fprintf(stderr,
                "emu: kernel %s: %lld launches, block (%u,%u,%u), up to %lld blocks and %zu bytes of dynamic shared "
                "memory a launch\n",
                e.first.c_str(), e.second->launches, e.second->block.x, e.second->block.y, e.second->block.z,
                e.second->max_blocks, e.second->max_smem);
}
static int launch_stats_registered = [] {
    const char* s = getenv("EMU_LAUNCH_STATS");
    if (s && (!strcmp(s, "1") || !strcmp(s, "2"))) atexit(print_launch_counts);
    return 1;
}();

// One piece of device work at a time: a kernel, a copy, a memset or a matmul holds it while it runs
// (taken by the stream workers, see "Streams" below), so kernels of different streams interleave only
// whole, in an order the program's events allow.
static std::mutex launch_lock;

void emu_launch(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, emu_kernel_body body,
                void* call, void (*free_call)(void*)) {
    char name[256];
    long long threads = (long long)block.x * block.y * block.z;
    if (threads < 1 || threads > MAX_THREADS_PER_BLOCK || block.x > MAX_BLOCK_X || block.y > MAX_BLOCK_Y ||
        block.z > MAX_BLOCK_Z) {
        fail(cudaErrorInvalidConfiguration,
             "kernel %s: block (%u,%u,%u) is not a valid block (at most 1024 threads; 1024 x 1024 x 64)",
             kernel_name(kernel, name, sizeof name), block.x, block.y, block.z);
        free_call(call);
        return;
    }
    if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > MAX_GRID_X || grid.y > MAX_GRID_Y || grid.z > MAX_GRID_Z) {
        fail(cudaErrorInvalidConfiguration, "kernel %s: grid (%u,%u,%u) is not a valid grid",
             kernel_name(kernel, name, sizeof name), grid.x, grid.y, grid.z);
        free_call(call);
        return;
    }
    int allowed = allowed_dynamic_smem(kernel);
    if (smem > (size_t)allowed) {
        size_t static_bytes = static_smem_of(kernel);
        fail(cudaErrorInvalidValue,
             "kernel %s: %zu bytes of dynamic shared memory, but only %d allowed (it has %zu bytes of static shared "
             "memory)%s",
             kernel_name(kernel, name, sizeof name), smem, allowed, static_bytes,
             allowed + (int)static_bytes <= DEFAULT_DYNAMIC_SMEM
                 ? "; above 48 KB of static plus dynamic needs cudaFuncSetAttribute(..., "
                   "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) first"
                 : "");
        free_call(call);
        return;
    }
    EmuJob* j = new EmuJob();
    j->body = body;
    j->call = call;
    j->grid = grid;
    j->block = block;
    j->smem = smem;
    j->nblocks = (long long)grid.x * grid.y * grid.z;
    j->kernel = kernel;
    count_kernel(kernel, grid, block, smem);
    emu_stream_enqueue(stream, 1, [j, free_call] {
        std::call_once(static_shared_once, [] {
            if (nshared_vars < 0) find_static_shared();
        });
        run_job(j);
        if (j->failed) set_async_error(cudaErrorLaunchFailure);
        free_call(j->call);
        delete j;
    });
}

// ----------------------------------------------------------------------------
// Streams, as a GPU runs them. Every stream has a worker thread that runs the stream's queue in
// order: kernels, copies, memsets, event records, waits on events, cuBLAS(Lt) products and NCCL
// collectives (cpu/emu_stream.h). A call that enqueues returns at once, before its work is done;
// cudaStreamQuery and cudaEventQuery say cudaErrorNotReady while it is pending; the synchronizing
// calls block. Device work (kernels, copies, memsets, matmuls) holds launch_lock while it runs, so
// it runs one piece at a time, in an order the events allow: a schedule the GPU could also take, and
// the same results every time for a program whose streams are ordered by events. Collectives do not
// hold it (they wait for peers beside the other streams' kernels, as NCCL's kernels do).
//
// The legacy default stream (NULL, 0) synchronizes with every blocking stream (cudaStreamCreate
// without cudaStreamNonBlocking): its work runs in the caller, at the call, once the blocking
// streams have done theirs. That is a legal schedule (the host waits more than CUDA promises), and it
// keeps cudaMemcpy and cudaMemset synchronous.
//
// EMU_STREAM_DELAY_US=N sleeps N microseconds before each piece of work a worker runs, so host code
// that reads a result before synchronizing reads stale data, as it would on the GPU now and then.
struct EmuOp {
    int device;  // holds launch_lock while it runs
    std::function<void()> fn;
};
struct CUstream_st {
    unsigned flags;
    std::deque<EmuOp> queue;      // under streams_lock; the front is the one running
    unsigned long long enqueued;  // pieces of work ever enqueued (under streams_lock)
    unsigned long long done;      // ... and finished (under streams_lock)
    int stop;                     // cudaStreamDestroy: the worker exits when the queue is empty
    pthread_t worker;
};
struct CUevent_st {
    unsigned flags;
    int recorded;            // cudaEventRecord was called
    CUstream_st* stream;     // the stream of the last record (NULL: the legacy stream, done at once)
    unsigned long long seq;  // the record is complete when stream->done >= seq
    double time;             // when the record ran
};
static std::mutex streams_lock;
static std::condition_variable& streams_cv = *new std::condition_variable;  // any stream made progress
static std::set<CUstream_st*>& all_streams = *new std::set<CUstream_st*>;   // live streams
static std::set<CUstream_st*>& dead_streams = *new std::set<CUstream_st*>;  // destroyed (all work done)
static std::set<CUevent_st*>& all_events = *new std::set<CUevent_st*>;      // (so a destroyed stream lets go)

static long long stream_delay_us(void) {
    static long long us = env_ll("EMU_STREAM_DELAY_US", 0, 0, 60000000, "microseconds, at most a minute");
    return us;
}

static void run_op(EmuOp* op) {
    if (op->device) {
        std::lock_guard<std::mutex> g(launch_lock);
        op->fn();
    } else {
        op->fn();
    }
}

// The fibers a stream's worker made to run kernels, freed when the stream is destroyed.
static void worker_release(EmuWorker* w) {
    for (int i = 0; i < w->nfibers; i++) {
        EmuFiber* f = &w->fibers[i];
#if EMU_ASAN
        __asan_unpoison_memory_region(f->stack_lo, f->stack_size);
#endif
        munmap(f->stack_lo - 4096, f->stack_size + 4096);
        free(f->copies);
        free(f->landed);
    }
    for (int i = 0; i < 32; i++) free(w->wgmma[i].ops);
    free(w->fibers);
    free(w->order);
    free(w->tmas);
    memset(w, 0, sizeof *w);
}

static void* stream_worker(void* arg) {
    CUstream_st* s = (CUstream_st*)arg;
    std::unique_lock<std::mutex> g(streams_lock);
    for (;;) {
        while (s->queue.empty() && !s->stop) streams_cv.wait(g);
        if (s->queue.empty()) break;
        EmuOp* op = &s->queue.front();  // deque references stay valid while others are pushed
        g.unlock();
        if (stream_delay_us() > 0) {  // (usleep's useconds_t may be 32 bits: nanosleep takes any delay)
            struct timespec d = {(time_t)(stream_delay_us() / 1000000), (long)(stream_delay_us() % 1000000) * 1000};
            while (nanosleep(&d, &d) != 0 && errno == EINTR) continue;
        }
        run_op(op);
        g.lock();
        s->queue.pop_front();
        s->done++;
        streams_cv.notify_all();
    }
    g.unlock();
    worker_release(&worker);
    return NULL;
}

// Wait (streams_lock held) until stream s has finished the first `upto` pieces of its work.
static void wait_stream(std::unique_lock<std::mutex>& g, CUstream_st* s, unsigned long long upto) {
    while (s->done < upto) streams_cv.wait(g);
}
// Wait until every blocking stream (or every stream) has finished what was enqueued so far.
static void drain_streams(int blocking_only) {
    std::unique_lock<std::mutex> g(streams_lock);
    std::vector<std::pair<CUstream_st*, unsigned long long>> marks;
    for (CUstream_st* s : all_streams)
        if (!blocking_only || !(s->flags & cudaStreamNonBlocking)) marks.push_back({s, s->enqueued});
    for (auto& m : marks) wait_stream(g, m.first, m.second);
}

// Enqueue fn on stream s; returns its sequence number on s (0 on the legacy stream, where it has run).
static unsigned long long enqueue(cudaStream_t s, int device, std::function<void()> fn) {
    if (!s) {
        drain_streams(1);
        EmuOp op = {device, std::move(fn)};
        run_op(&op);
        return 0;
    }
    std::lock_guard<std::mutex> g(streams_lock);
    s->queue.push_back(EmuOp{device, std::move(fn)});
    streams_cv.notify_all();
    return ++s->enqueued;
}
void emu_stream_enqueue(cudaStream_t s, int device, std::function<void()> fn) { enqueue(s, device, std::move(fn)); }

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
    if (!s) return fail(cudaErrorInvalidValue, "cudaStreamCreate: NULL output pointer");
    CUstream_st* st = new CUstream_st();
    st->flags = flags;
    if (pthread_create(&st->worker, NULL, stream_worker, st) != 0) {
        delete st;
        return fail(cudaErrorMemoryAllocation, "cudaStreamCreate: cannot start the stream's worker thread");
    }
    std::lock_guard<std::mutex> g(streams_lock);
    all_streams.insert(st);
    *s = st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int priority) {
    return cudaStreamCreateWithFlags(s, flags);
}
// The stream's work finishes first (CUDA lets it finish after the call returns; waiting is legal).
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: NULL stream");
    {
        std::lock_guard<std::mutex> g(streams_lock);
        if (!all_streams.erase(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: not a live stream");
        s->stop = 1;
        streams_cv.notify_all();
    }
    pthread_join(s->worker, NULL);
    std::lock_guard<std::mutex> g(streams_lock);
    for (CUevent_st* e : all_events)  // their records are complete: they no longer need the stream
        if (e->stream == s) e->stream = NULL;
    dead_streams.insert(s);  // kept: a cudaStreamWaitEvent queued on another stream may still look at it

    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (!s) {
        drain_streams(1);
    } else {
        std::unique_lock<std::mutex> g(streams_lock);
        wait_stream(g, s, s->enqueued);
    }
    return pending_error();
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    if (s) {
        std::lock_guard<std::mutex> g(streams_lock);
        if (s->done < s->enqueued) return cudaErrorNotReady;
    } else {
        std::lock_guard<std::mutex> g(streams_lock);
        for (CUstream_st* t : all_streams)
            if (!(t->flags & cudaStreamNonBlocking) && t->done < t->enqueued) return cudaErrorNotReady;
    }
    return pending_error();
}
cudaError_t cudaDeviceSynchronize(void) {
    drain_streams(0);
    return pending_error();
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
    if (!e) return fail(cudaErrorInvalidValue, "cudaEventCreate: NULL output pointer");
    *e = new CUevent_st();
    (*e)->flags = flags;
    std::lock_guard<std::mutex> g(streams_lock);
    all_events.insert(*e);
    return cudaSuccess;
}
// A pending record still writes the event's time when it runs: destroy waits for it first.
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: NULL event");
    cudaEventSynchronize(e);
    std::lock_guard<std::mutex> g(streams_lock);
    all_events.erase(e);
    delete e;
    return cudaSuccess;
}
// The event is complete when the work enqueued on s before it is (its time: when that happened).
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: NULL event");
    if (!s) {
        drain_streams(1);
        std::lock_guard<std::mutex> g(streams_lock);
        e->recorded = 1, e->stream = NULL, e->seq = 0, e->time = now_seconds();
        return cudaSuccess;
    }
    std::lock_guard<std::mutex> g(streams_lock);
    unsigned long long seq = s->enqueued + 1;
    e->recorded = 1, e->stream = s, e->seq = seq;
    s->queue.push_back(EmuOp{0, [e, s, seq] {
                                 std::lock_guard<std::mutex> g2(streams_lock);
                                 if (e->stream == s && e->seq == seq) e->time = now_seconds();
                             }});
    s->enqueued = seq;
    streams_cv.notify_all();
    return cudaSuccess;
}
static int event_done(cudaEvent_t e) { return !e->recorded || !e->stream || e->stream->done >= e->seq; }
cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!e) return cudaErrorInvalidResourceHandle;
    std::lock_guard<std::mutex> g(streams_lock);
    return event_done(e) ? pending_error() : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return cudaErrorInvalidResourceHandle;
    std::unique_lock<std::mutex> g(streams_lock);
    while (!event_done(e)) streams_cv.wait(g);
    return pending_error();
}
// Stream s waits for the work the event's latest record marks (none if it was never recorded).
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: NULL event");
    CUstream_st* on;
    unsigned long long seq;
    {
        std::lock_guard<std::mutex> g(streams_lock);
        if (!e->recorded || !e->stream) return cudaSuccess;
        on = e->stream, seq = e->seq;
    }
    enqueue(s, 0, [on, seq] {
        std::unique_lock<std::mutex> g(streams_lock);
        wait_stream(g, on, seq);
    });
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start || !end) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: NULL event");
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: event created with cudaEventDisableTiming");
    if (!start->recorded || !end->recorded)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: event never recorded");
    std::lock_guard<std::mutex> g(streams_lock);
    if (!event_done(start) || !event_done(end)) return cudaErrorNotReady;
    *ms = (float)((end->time - start->time) * 1e3);
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// Copies and memsets, with CUDA's "API synchronization behavior" (CUDA Runtime API reference,
// section 2; https://docs.nvidia.com/cuda/cuda-runtime-api/api-sync-behavior.html):
// - cudaMemcpy and cudaMemset run on the legacy stream: here at the call (see above);
// - cudaMemcpyAsync from pageable host memory to the device: "If pageable memory must first be staged
//   to pinned memory, the driver may synchronize with the stream and stage the copy into pinned
//   memory": the source is staged at the call (so the caller may reuse it at once), the device write
//   runs in stream order;
// - cudaMemcpyAsync from the device to pageable host memory: "the function will return only once the
//   copy has completed": it waits for the stream up to and including the copy;
// - to or from pinned memory (cudaMallocHost, cudaHostAlloc, cudaHostRegister) and device to device:
//   "fully asynchronous": it returns at once, the copy runs in stream order (reading or writing the
//   host buffer then, not at the call);
// - host to host: "fully synchronous with respect to the host".
static int pageable(const void* p, size_t n) {
    size_t over;
    return device_range(p, n, &over) == 1 && !is_pinned(p, n);
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    cudaError_t e = check_copy("cudaMemcpy", dst, src, n, kind);
    if (e || !n) return e;
    enqueue(NULL, 1, [=] { memmove(dst, src, n); });
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
    cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, n, kind);
    if (e || !n) return e;
    int from_pageable = pageable(src, n), to_pageable = pageable(dst, n);
    if (from_pageable && to_pageable) {  // host to host
        cudaStreamSynchronize(stream);
        memmove(dst, src, n);
        return cudaSuccess;
    }
    if (from_pageable) {  // staged now
        void* staged = malloc(n);
        if (!staged) return fail(cudaErrorMemoryAllocation, "cudaMemcpyAsync: cannot stage %zu bytes", n);
        memcpy(staged, src, n);
        enqueue(stream, 1, [=] {
            memmove(dst, staged, n);
            free(staged);
        });
        return cudaSuccess;
    }
    unsigned long long seq = enqueue(stream, 1, [=] { memmove(dst, src, n); });
    if (to_pageable && stream) {  // returns once the copy is done
        std::unique_lock<std::mutex> g(streams_lock);
        wait_stream(g, stream, seq);
    }
    return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t n) {
    cudaError_t e = n ? check_device_range("cudaMemset", "destination", dst, n) : cudaSuccess;
    if (e || !n) return e;
    enqueue(NULL, 1, [=] { memset(dst, value, n); });
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t stream) {
    cudaError_t e = n ? check_device_range("cudaMemsetAsync", "destination", dst, n) : cudaSuccess;
    if (e || !n) return e;
    enqueue(stream, 1, [=] { memset(dst, value, n); });
    return cudaSuccess;
}
